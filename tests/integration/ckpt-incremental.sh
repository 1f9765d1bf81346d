#!/usr/bin/env bash
# Incremental checkpoints (recovery/FORMAT.md 2.4) in a running cluster:
# the CTR model (26 sparse tables) on gen-ctr data through `paramserv
# local`, 2 shards, 1 worker, a checkpoint every 50 steps to step 400,
# [checkpoint] full_every 1000 (the first one full, then a chain of
# incremental ones: test_ckpt_tables checks the turn to a full one) and
# max_to_keep 2:
#  - the chief writes a full one, then incremental ones (its log says
#    which, with the table entries changed); each incremental one's delta
#    sections are at most 1.2 times the bytes of the entries it changed;
#  - retention keeps every checkpoint a kept one builds on: each one left
#    verifies (`paramserv ckpt verify` reads its chain);
#  - a cluster restored from the directory (the newest is incremental)
#    checkpoints step 400 again without training: its export is byte for
#    byte the original's (every variable, every table's keys, values and
#    slots);
#  - `paramserv ckpt compact` rewrites the incremental ckpt-400 as a full
#    one: it verifies, exports the same, and `ckpt show` no longer names a
#    base; compacting a full one is refused (exit 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

ctr_local "$T/ctr.conf" 7 "every_steps = 50
every_secs = 0
full_every = 1000
max_to_keep = 2"

"$BIN" local --config "$T/ctr.conf" --ps 2 --workers 1 --last-step 400 --dir "$T/a" --fresh \
  >"$T/a.log" 2>&1 || fail "paramserv local exited $?: $(tail -3 "$T/a.log")"
D="$T/a/checkpoints"
log="$T/a/logs/chief.log"
inc=$(grep -c 'checkpoint ckpt-[0-9]*: .*incremental on ckpt-' "$log" || true)
full=$(grep 'checkpoint ckpt-[0-9]*: step' "$log" | grep -vc 'incremental on' || true)
[ "$inc" -ge 2 ] && [ "$full" = 1 ] ||
  fail "the chief wrote $full full and $inc incremental checkpoints, expected both kinds: $(grep 'checkpoint ckpt-' "$log")"
# Each incremental one: its delta sections (the tables' part of the
# files) against the bytes of the entries it changed, at most 1.2 times;
# and its whole raw size (the dense variables and slots too).
grep 'incremental on ckpt-' "$log" | /usr/bin/python3 -c '
import re, sys
worst = 0
for line in sys.stdin:
    m = re.search(r"checkpoint (ckpt-\d+): .*write [0-9.]+ s \(([0-9.]+) MB, ratio [0-9.]+; "
                  r"incremental on (ckpt-\d+): (\d+) of (\d+) table entries changed \(([0-9.]+) MB\), "
                  r"(\d+) deleted, delta sections ([0-9.]+) MB", line)
    if not m:
        sys.exit("not a checkpoint line: " + line)
    name, raw, base, ch, ent, chmb, dele, dmb = m.groups()
    r = float(dmb) / float(chmb)
    worst = max(worst, r)
    print(f"ok: {name} on {base}: {ch} of {ent} entries changed ({chmb} MB), {dele} deleted; "
          f"delta sections {dmb} MB ({r:.3f} times), the whole checkpoint {raw} MB raw")
    if r > 1.2:
        sys.exit(f"{name}: its delta sections are {r:.3f} times the changed entries, expected at most 1.2")
print(f"ok: the largest ratio of delta bytes to changed entries: {worst:.3f} (bar 1.2)")
' || fail "the incremental checkpoints' bytes"

# Retention: every checkpoint left reads, chain and all.
out=$("$BIN" ckpt verify "$D" 2>&1) || fail "ckpt verify of the directory: $out"
n=$(grep -c ': ok (' <<<"$out")
newest=$(ls -d "$D"/ckpt-* | tail -1)
[ "$(basename "$newest")" = ckpt-000000400 ] || fail "the newest checkpoint is $newest"
"$BIN" ckpt show "$newest" | grep -q '^base *ckpt-' ||
  fail "ckpt-000000400 is not incremental ($(grep -c . <<<"$out") checkpoints): $("$BIN" ckpt ls "$D")"
[ "$n" = $((inc + full)) ] || fail "retention left $n of the $((inc + full)) checkpoints, expected all: the newest two build on every one"
echo "ok: retention left all $n checkpoints (max_to_keep 2, and the chain the newest two build on), each verifies:"
sed 's/^/ok:   /' <<<"$out"

"$BIN" ckpt export "$newest" --format npy "$T/orig.npy" >/dev/null || fail "ckpt export $newest"

# A restore from the chain, checkpointed again at the same step.
mkdir -p "$T/b" && cp -r "$D" "$T/b/"
"$BIN" local --config "$T/ctr.conf" --ps 2 --workers 1 --last-step 400 --dir "$T/b" \
  >"$T/b.log" 2>&1 || fail "paramserv local (restore) exited $?: $(tail -3 "$T/b.log")"
grep -q "restored from checkpoint\|loaded from ckpt-000000400" "$T/b.log" "$T/b/logs/chief.log" ||
  fail "the second run did not restore ckpt-000000400: $(grep -i restor "$T/b/logs/chief.log" | head -3)"
"$BIN" ckpt export "$T/b/checkpoints/ckpt-000000400" --format npy "$T/restored.npy" >/dev/null ||
  fail "ckpt export of the restored run's ckpt-000000400"
diff -r "$T/orig.npy" "$T/restored.npy" >"$T/diff.txt" || fail "the restored state differs: $(head -3 "$T/diff.txt")"
echo "ok: restored from the incremental ckpt-000000400 and checkpointed again: $(ls "$T/orig.npy" | wc -l) exported files byte for byte the same"

# compact
out=$("$BIN" ckpt compact "$newest") || fail "ckpt compact: $out"
echo "ok: $out"
"$BIN" ckpt show "$newest" | grep -q '^base' && fail "ckpt show still names a base after compact"
out=$("$BIN" ckpt verify "$newest" 2>&1) || fail "ckpt verify after compact: $out"
rm -rf "$T/orig2.npy"
"$BIN" ckpt export "$newest" --format npy "$T/orig2.npy" >/dev/null || fail "export after compact"
diff -r "$T/orig.npy" "$T/orig2.npy" >/dev/null || fail "the compacted checkpoint exports another state"
set +e
"$BIN" ckpt compact "$newest" >"$T/again.out" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "compacting a full checkpoint: exit $rc, expected 2: $(cat "$T/again.out")"
grep -q "a full checkpoint already: nothing to compact" "$T/again.out" ||
  fail "compacting a full checkpoint said: $(cat "$T/again.out")"
echo "ok: compacted ckpt-000000400 verifies and exports the same state; compacting it again: exit 2, $(cat "$T/again.out")"
