#!/usr/bin/env bash
# scripts/gen-ctr writes Criteo-format data from a planted model:
#  - the same seed and options give byte-identical files (plain and gzip),
#    another seed other files, and the test set does not depend on --train;
#  - every line is label<TAB>13 integers<TAB>26 categoricals: 40 fields, the
#    label 0/1, integers or empty, 8 lowercase hex digits or empty;
#  - a .gz name writes gzip whose zcat is the plain file;
#  - the planted model's test AUC is well above chance (> 0.7) and the
#    mean CTR of each set within 0.15-0.25, as printed and in the sidecar;
#  - --help exits 0; a bad option or value: one line naming it, exit 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
G=$PWD/scripts/gen-ctr
SMALL=(--train 4000 --test 4000 --scale 0.01)

# gen DIR [OPTIONS...]: the small set into DIR (train.txt, test.txt,
# test.meta.json), its output in DIR/out.
gen() {
  local dir=$1
  shift
  mkdir -p "$dir"
  (cd "$dir" && "$G" "${SMALL[@]}" "$@" >out) || fail "gen-ctr ${SMALL[*]} $* exited $?"
}

gen "$T/a" --seed 7
gen "$T/b" --seed 7
gen "$T/c" --seed 8
gen "$T/d" --seed 7 --train 1000
for f in train.txt test.txt; do
  cmp -s "$T/a/$f" "$T/b/$f" || fail "seed 7 twice: $f differs"
  ! cmp -s "$T/a/$f" "$T/c/$f" || fail "seeds 7 and 8: the same $f"
done
cmp -s "$T/a/test.txt" "$T/d/test.txt" || fail "--train 1000: another test.txt"
echo "ok: seed 7 twice: identical files; seed 8: other files; --train 1000: the same test.txt"

# The format, line by line.
tab=$'\t'
line="^[01](${tab}(-?[0-9]+)?){13}(${tab}([0-9a-f]{8})?){26}\$"
for f in train.txt test.txt; do
  n=$(wc -l <"$T/a/$f")
  [ "$n" = 4000 ] || fail "$f has $n lines, expected 4000"
  bad=$(grep -cvE "$line" "$T/a/$f" || true)
  [ "$bad" = 0 ] || fail "$f: $bad lines not label, 13 integers, 26 hex ids: $(grep -vE -m1 "$line" "$T/a/$f")"
  awk -F'\t' 'NF != 40 { exit 1 }' "$T/a/$f" || fail "$f: a line without 40 fields"
done
# Not vacuous: present and missing values of both kinds, and both labels.
read -r ints_empty ints_set cats_empty cats_set labels <<<"$(awk -F'\t' '
  { l[$1] = 1
    for (i = 2; i <= 14; i++) if ($i == "") ie++; else is++
    for (i = 15; i <= 40; i++) if ($i == "") ce++; else cs++ }
  END { print ie + 0, is + 0, ce + 0, cs + 0, length(l) }' "$T/a/train.txt")"
[ "$ints_empty" -gt 0 ] && [ "$ints_set" -gt 0 ] && [ "$cats_empty" -gt 0 ] &&
  [ "$cats_set" -gt 0 ] && [ "$labels" = 2 ] ||
  fail "train.txt: integers $ints_set set $ints_empty empty, categoricals $cats_set set $cats_empty empty, $labels labels"
echo "ok: 8000 lines of 40 fields (label, 13 integers, 26 hex ids; $ints_empty integers and $cats_empty ids empty in train.txt)"

# gzip: the same bytes, and itself reproducible.
gen "$T/z1" --seed 7 --train-file train.txt.gz --test-file test.txt.gz
gen "$T/z2" --seed 7 --train-file train.txt.gz --test-file test.txt.gz
for f in train.txt test.txt; do
  zcat "$T/z1/$f.gz" | cmp -s - "$T/a/$f" || fail "zcat $f.gz is not the plain $f"
  cmp -s "$T/z1/$f.gz" "$T/z2/$f.gz" || fail "seed 7 twice: $f.gz differs"
done
echo "ok: zcat of the .gz files equals the plain files; the .gz files twice identical"

# The planted model's figures: printed, in the sidecar, and the CTRs the files hold.
/usr/bin/python3 - "$T/a" <<'PY' || fail "the planted figures (above)"
import json, sys
d = sys.argv[1]
m = json.load(open(d + "/test.meta.json"))
out = open(d + "/out").read().splitlines()
auc, ll = m["planted_test_auc"], m["planted_test_logloss"]
want = ["planted test auc %.4f logloss %.4f" % (auc, ll),
        "mean ctr train %.4f test %.4f" % (m["mean_ctr_train"], m["mean_ctr_test"])]
assert out[:2] == want, (out, want)
assert m["seed"] == 7 and m["train_file"] == "train.txt" and m["test_file"] == "test.txt", m
assert auc > 0.7 and 0 < ll < 0.5, (auc, ll)
for s in ("train", "test"):
    labels = [l[0] for l in open("%s/%s.txt" % (d, s))]
    ctr = labels.count("1") / len(labels)
    assert abs(ctr - m["mean_ctr_" + s]) < 1e-9, (s, ctr, m)
    assert 0.15 <= ctr <= 0.25, (s, ctr)
print("ok: " + out[0] + "; " + out[1] + " (the sidecar's and the files')")
PY

# --help, and bad input.
"$G" --help | grep -c 'planted test auc' >/dev/null || fail "gen-ctr --help exited $? or lacks the output lines"
bad() { # bad WANT ARGS...: exit 2 and one stderr line holding WANT
  local want=$1 rc
  shift
  set +e
  (cd "$T" && "$G" "$@" >/dev/null 2>"$T/err")
  rc=$?
  set -e
  [ "$rc" = 2 ] && [ "$(wc -l <"$T/err")" = 1 ] && grep -qF -- "$want" "$T/err" ||
    fail "gen-ctr $*: exit $rc, '$(cat "$T/err")' (expected exit 2 and '$want')"
  echo "ok: gen-ctr $* -> exit 2: $(cat "$T/err")"
}
bad "'--bogus': not an option" --bogus
bad "--alpha: 'x': expected a number" --alpha x
bad "--train: '0': expected a whole number >= 1" --train 0
bad "--ids: '1,2': expected 26 comma-separated counts" --ids 1,2
bad "--test-file: '$T/none/t.txt': no directory" --test-file "$T/none/t.txt"
