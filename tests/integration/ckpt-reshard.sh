#!/usr/bin/env bash
# A checkpoint restored into another number of shards (recovery/relayout.h,
# FORMAT.md section 8): the CTR model (26 sparse tables, dense layers) on
# gen-ctr data through `paramserv local`, 2 shards and 1 worker, to step
# 200; then the same checkpoint directory restored into 3 shards and into
# 1, each of whose chiefs checkpoints again at step 200 without training:
#  - each chief says it laid the checkpoint out again, with the rows that
#    moved to another shard (printed: about |N - M| / max(N, M) of them);
#  - `paramserv ckpt export --format npy` of the new checkpoint is byte for
#    byte the 2-shard one's: every dense variable, and every table's keys,
#    values and optimizer slots (tests/unit/test_ckpt_tables.c checks the
#    dense slots, counts, stamps and order);
#  - `paramserv ckpt verify` accepts both (each key on its shard by the
#    ring of the new count);
#  - restored into 3 shards, training goes on to step 300.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

ctr_local "$T/ctr.conf" 5 "every_steps = 100
every_secs = 0"

"$BIN" local --config "$T/ctr.conf" --ps 2 --workers 1 --last-step 200 --dir "$T/a" --fresh \
  >"$T/a.log" 2>&1 || fail "paramserv local (2 shards) exited $?: $(tail -3 "$T/a.log")"
ckpt=ckpt-000000200
[ -f "$T/a/checkpoints/$ckpt/MANIFEST.json" ] || fail "the 2-shard run wrote no $ckpt"
"$BIN" ckpt export "$T/a/checkpoints/$ckpt" --format npy "$T/a.npy" >/dev/null ||
  fail "ckpt export of the 2-shard $ckpt"

# restore_into M LAST_STEP: a fresh cluster of M shards from a copy of the
# 2-shard run's checkpoints, trained to LAST_STEP.
restore_into() {
  local m=$1 last=$2 d="$T/into$1-$2"
  mkdir -p "$d" && cp -r "$T/a/checkpoints" "$d/"
  "$BIN" local --config "$T/ctr.conf" --ps "$m" --workers 1 --last-step "$last" --dir "$d" \
    >"$d.log" 2>&1 || fail "paramserv local ($m shards, from $ckpt) exited $?: $(tail -3 "$d.log")"
  grep -q "$ckpt was taken with 2 shards: laid out again for $m" "$d/logs/chief.log" ||
    fail "the $m-shard chief did not lay $ckpt out again: $(grep -i 'restor\|loaded\|skipped' "$d/logs/chief.log" | head -5)"
}

for m in 3 1; do
  restore_into "$m" 200
  d="$T/into$m-200"
  n=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nshards"])' \
    "$d/checkpoints/$ckpt/MANIFEST.json")
  [ "$n" = "$m" ] || fail "the $m-shard run's $ckpt has $n shards"
  out=$("$BIN" ckpt verify "$d/checkpoints/$ckpt" 2>&1) || fail "ckpt verify ($m shards): $out"
  "$BIN" ckpt export "$d/checkpoints/$ckpt" --format npy "$d.npy" >/dev/null ||
    fail "ckpt export of the $m-shard $ckpt"
  files=$(ls "$T/a.npy" | wc -l)
  [ "$files" -gt 26 ] || fail "the export holds $files files, expected the 26 tables' and more"
  diff -r "$T/a.npy" "$d.npy" >"$T/diff.txt" 2>&1 ||
    fail "2 shards -> $m: the exports differ: $(head -3 "$T/diff.txt")"
  moved=$(grep -o 'sparse rows moved to another shard: [0-9]* of [0-9]* ([0-9.]*%)' \
    "$d/logs/chief.log" | head -1)
  echo "ok: 2 shards -> $m: $files exported files byte for byte the same (every variable, every table's keys, values and slots); verify: $out; $moved"
done

restore_into 3 300
d="$T/into3-300"
[ -f "$d/checkpoints/ckpt-000000300/MANIFEST.json" ] ||
  fail "restored into 3 shards, the run wrote no ckpt-000000300: $(tail -3 "$d.log")"
out=$("$BIN" ckpt verify "$d/checkpoints/ckpt-000000300" 2>&1) || fail "ckpt verify: $out"
echo "ok: restored into 3 shards, training went on to step 300: $out"
