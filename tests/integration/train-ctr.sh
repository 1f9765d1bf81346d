#!/usr/bin/env bash
# paramserv train on Criteo data (--train, --test) with the sparse tables of
# models/ctr.json, in seconds:
#  - one epoch over 20000 samples of scripts/gen-ctr learns: the done line's
#    test_auc is above 0.6 (chance is 0.5), its log loss a number;
#  - the same seed gives the same run, and the gzipped files the same run
#    as the plain ones;
#  - --max-steps stops there; SIGINT stops after the step in progress, one
#    line, exit 130;
#  - bags (gen-ctr --bags 26:4, every field 1 to 4 ids): read as bags
#    (--bag-separator ,) one epoch learns more than the same lines read
#    with each field one value, by 0.02 of AUC at least; paramserv local
#    with [data] bag_separator trains them on 2 shards and 2 workers;
#  - a bad combination of options: one line naming it, exit 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
CTR=(--model-file models/ctr.json --batch 64 --threads 1 --seed 2)

(cd "$T" && "$OLDPWD/scripts/gen-ctr" --train 20000 --test 5000 --scale 0.01 --seed 2 >gen.out &&
 "$OLDPWD/scripts/gen-ctr" --train 20000 --test 5000 --scale 0.01 --seed 2 \
   --train-file train.txt.gz --test-file test.txt.gz >/dev/null) || fail "gen-ctr exited $?"
echo "ok: data: $(head -n 1 "$T/gen.out")"

# run NAME ARGS...: paramserv train into $T/NAME.out; its last line in $last.
run() {
  local name=$1
  shift
  "$BIN" train "${CTR[@]}" "$@" >"$T/$name.out" 2>"$T/$name.err" ||
    fail "train $* exited $?: $(cat "$T/$name.err")"
  last=$(tail -n 1 "$T/$name.out")
}

num='[0-9]+(\.[0-9]+)?'
run plain --train "$T/train.txt" --test "$T/test.txt" --epochs 1
[[ $last =~ ^done\ steps\ 313\ samples\ 20000\ seconds\ $num\ samples/s\ $num\ test_auc\ ($num)\ test_logloss\ ($num)\ ms/step\ $num$ ]] ||
  fail "last line: $last"
auc=${BASH_REMATCH[3]} ll=${BASH_REMATCH[5]}
awk -v a="$auc" 'BEGIN { exit !(a > 0.6) }' || fail "test AUC $auc after one epoch, expected > 0.6"
grep -q '^epoch 1/1 loss [0-9.]* test_auc [0-9.]* test_logloss ' "$T/plain.out" ||
  fail "no epoch line: $(cat "$T/plain.out")"
echo "ok: one epoch, 313 steps: test AUC $auc, log loss $ll"

run again --train "$T/train.txt" --test "$T/test.txt" --epochs 1
run gz --train "$T/train.txt.gz" --test "$T/test.txt.gz" --epochs 1
for r in again gz; do
  diff <(grep '^epoch' "$T/plain.out" | cut -d' ' -f1-8) \
       <(grep '^epoch' "$T/$r.out" | cut -d' ' -f1-8) >/dev/null ||
    fail "$r: another run than the first: $(grep '^epoch' "$T/$r.out")"
done
echo "ok: the same seed twice, and the .gz files: the same loss, AUC and log loss"

run steps --train "$T/train.txt" --max-steps 10
[[ $last =~ ^done\ steps\ 10\ samples\ 640\ .*\ test_auc\ -\ test_logloss\ -\ ms/step ]] ||
  fail "--max-steps 10 without --test: $last"
echo "ok: --max-steps 10, no --test: $last"

# SIGINT once the first epoch is done: the step in progress, then exit 130.
"$BIN" train "${CTR[@]}" --train "$T/train.txt" --epochs 1000 >"$T/int.out" 2>&1 &
pid=$!
PIDS+=("$pid")
for _ in $(seq 200); do grep -q '^epoch 1/' "$T/int.out" && break; sleep 0.1; done
grep -q '^epoch 1/' "$T/int.out" || fail "no epoch line in 20 s: $(cat "$T/int.out")"
kill -INT "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 130 ] && grep -q '^train: stopped by SIGINT at step ' "$T/int.out" ||
  fail "SIGINT: exit $rc, $(tail -n 2 "$T/int.out")"
echo "ok: SIGINT: exit 130, $(grep '^train: stopped' "$T/int.out")"

# Bags: every field a bag of 1 to 4 ids, pooled by their mean.
(cd "$T" && "$OLDPWD/scripts/gen-ctr" --train 20000 --test 5000 --scale 0.01 --seed 2 --bags 26:4 \
   --train-file bags.txt --test-file bags-test.txt --meta bags.json >/dev/null) ||
  fail "gen-ctr --bags exited $?"
grep -q $'\t[0-9a-f]*,[0-9a-f]' "$T/bags.txt" || fail "gen-ctr --bags 26:4 wrote no bag of two ids"
aucs=()
for sep in , ""; do
  run "bags$sep" --model-file models/examples/ctr-bags.json --train "$T/bags.txt" \
    --test "$T/bags-test.txt" --epochs 1 ${sep:+--bag-separator "$sep"}
  [[ $last =~ test_auc\ ($num) ]] || fail "bags: last line: $last"
  aucs+=("${BASH_REMATCH[1]}")
done
awk -v b="${aucs[0]}" -v o="${aucs[1]}" 'BEGIN { exit !(b > 0.65 && b > o + 0.02) }' ||
  fail "test AUC ${aucs[0]} with bags, ${aucs[1]} with each field one value: expected > 0.65 and 0.02 more"
echo "ok: bags: test AUC ${aucs[0]} read as bags, ${aucs[1]} read as one value a field"

cat >"$T/bags.conf" <<EOF
[model]
file = $PWD/models/examples/ctr-bags.json
seed = 2
[data]
format = criteo
train = $T/bags.txt
test = $T/bags-test.txt
bag_separator = ,
[train]
batch = 64
last_step = 400
threads = 1
EOF
"$BIN" local --config "$T/bags.conf" --ps 2 --workers 2 --dir "$T/bags-local" --fresh \
  >"$T/bags-local.out" 2>&1 || fail "local with bags exited $?: $(tail -n 5 "$T/bags-local.out")"
lauc=$(sed -n 's/^final test_auc \([0-9.]*\) .*/\1/p' "$T/bags-local/logs/chief.log")
awk -v a="$lauc" 'BEGIN { exit !(a > 0.6) }' ||
  fail "local with bags: the chief's final test AUC '$lauc', expected > 0.6"
echo "ok: bags through paramserv local (2 shards, 2 workers, 400 steps): test AUC $lauc"

# Bad usage: one line naming the option and what was expected, exit 2.
expect_usage() {
  local want=$1 rc
  shift
  set +e
  "$BIN" train "$@" >/dev/null 2>"$T/err"
  rc=$?
  set -e
  [ "$rc" = 2 ] && [ "$(wc -l <"$T/err")" = 1 ] && grep -qF -- "$want" "$T/err" ||
    fail "train $*: exit $rc, '$(cat "$T/err")' (expected exit 2 and '$want')"
  echo "ok: train $* -> exit 2: $(cat "$T/err")"
}
expect_usage "--train (Criteo data) with model mlp 784-256-128-10" --train "$T/train.txt"
expect_usage "--test without --train" --model-file models/ctr.json --test "$T/test.txt"
expect_usage "--data with --train" --model-file models/ctr.json --train "$T/train.txt" --data "$T"
expect_usage "--checkpoint-dir with sparse tables: not yet" --model-file models/ctr.json \
  --train "$T/train.txt" --checkpoint-dir "$T/ck"
expect_usage "--model-file models/ctr.json has sparse tables: expected --train FILE" \
  --model-file models/ctr.json
expect_usage "--train $T/none.txt: cannot open" --model-file models/ctr.json --train "$T/none.txt"
printf '1\t2\n' >"$T/bad.txt"
expect_usage "--test $T/bad.txt: line 1: found 2 fields" --model-file models/ctr.json \
  --train "$T/train.txt" --test "$T/bad.txt"
expect_usage "--bag-separator ',,': expected one byte other than a tab" --model-file models/ctr.json \
  --train "$T/train.txt" --bag-separator ,,
expect_usage "--bag-separator without --train" --bag-separator ,
