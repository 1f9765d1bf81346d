#!/usr/bin/env bash
# The CTR model (models/ctr.json: 26 sparse tables on the shards) on
# gen-ctr data through `paramserv local`, 2 shards and 2 workers:
#  1. under kill -9, SIGSTOP and Redis refusing writes (scripts/chaos
#     --nemesis kill,pause,redis-errors): no acknowledged update lost and
#     none applied twice, counted exactly by scripts/check-history from the
#     histories; each fault kind was injected.  The test AUC of both runs is
#     printed (the 0.005 bar is the full chaos run's, whose figures the
#     issue's note gives: a run this short moves it by noise);
#  2. a checkpoint restored into a fresh cluster, which the chief then
#     checkpoints again at the same step without training: every shard file
#     is byte for byte the same (the manifests' XXH64 of values, slots and
#     every table's rows, optimizer slots, counts and stamps), and
#     `paramserv ckpt verify` accepts both;
#  3. bags pooled on the shards (gen-ctr --bags, "pooling": "server"), one
#     worker, its shards killed 6 times and restored from Redis: the final
#     state is byte for byte a calm run's.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

# same_state CKPT_A CKPT_B LABEL WHAT_A WHAT_B: the two checkpoints hold the
# same state, byte for byte: each shard file's XXH64 (of its values, slots
# and every table's rows, slots, counts and stamps), its table section's
# size and its version; B was written by its own run (another wall time).
same_state() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
pa, pb, label, wa, wb = sys.argv[1:6]
a, b = (json.load(open(p + "/MANIFEST.json")) for p in (pa, pb))
if a["wall_time"] == b["wall_time"]:
    sys.exit(f"{label}: {pb} is {pa}'s copy, not a checkpoint of its own")
for sa, sb in zip(a["shards"], b["shards"]):
    if int(sa.get("table_floats", "0")) == 0:
        sys.exit(f"{label}: shard {sa['index']}: no table section")
    for k in ("xxh64", "table_floats", "uncompressed_size", "version"):
        if sa.get(k) != sb.get(k):
            sys.exit(f"{label}: shard {sa['index']}: {k} {sa.get(k)} {wa}, {sb.get(k)} {wb}")
    print(f"ok: {label}: shard {sa['index']}: {int(sa['table_floats'])} floats of tables, "
          f"version {sa['version']}, xxh64 {sa['xxh64']} {wa} and {wb}")
PY
}

# ctr_conf FILE LAST_STEP REPLICATION [MODEL DATA BAGS]: a config of the
# CTR model (or MODEL) on the test's data (or DATA.txt, DATA-test.txt, with
# [data] bag_separator = BAGS), training to LAST_STEP, with REPLICATION's
# lines (and any sections after them) under [replication].
ctr_conf() {
  cat >"$1" <<EOF
[model]
file = ${4:-$PWD/models/ctr.json}
[data]
format = criteo
train = ${5:-$T/train}.txt
test = ${5:-$T/test}${5:+-test}.txt
bag_separator = ${6:-}
[train]
batch = 128
last_step = $2
[replication]
$3
EOF
}

scripts/gen-ctr --train 40000 --test 5000 --seed 3 --train-file "$T/train.txt" \
  --test-file "$T/test.txt" >"$T/gen.log" 2>&1 || fail "gen-ctr: $(tail -2 "$T/gen.log")"

# --- 1. under faults ---------------------------------------------------------
set +e
scripts/chaos --steps 1200 --nemesis kill,pause,redis-errors --fault-gap "$(fault_gap 0.7)" \
  --seed 1 --dir "$T/chaos" --binary "$BIN" --model-file models/ctr.json \
  --data format=criteo --data "train=$T/train.txt" --data "test=$T/test.txt" \
  --train batch=128 >"$T/chaos.log" 2>&1
rc=$?
set -e
report=$(sed -n '/^== chaos report/,$p' "$T/chaos.log")
[ -n "$report" ] || fail "scripts/chaos exited $rc without a report: $(tail -3 "$T/chaos.log")"
for run in chaos calm; do
  grep -q "^  $run *: history: ok (0 acknowledged updates lost, none applied twice)$" <<<"$report" ||
    { echo "$report" >&2; fail "the $run run: not 0 lost and 0 applied twice"; }
done
grep -q '^exit statuses: chaos 0, calm 0;' <<<"$report" ||
  { echo "$report" >&2; fail "a run did not end with status 0"; }
grep -q '^final test AUC: under faults ' <<<"$report" || fail "no test AUC in the report"
for kind in kill pause redis-errors; do
  grep -q "\"kind\":\"$kind\"" "$T/chaos/chaos/nemesis.jsonl" || fail "no $kind fault was injected"
done
grep -E '^(faults|  (kill|pause|redis-errors) |  acknowledged|  applied|final)' <<<"$report" |
  sed 's/^ */ok: ctr under faults: /'

# --- 2. a restore compared row by row ----------------------------------------
ctr_conf "$T/ctr.conf" 300 "mode = off"
"$BIN" local --config "$T/ctr.conf" --dir "$T/a" --fresh >"$T/a.log" 2>&1 ||
  fail "paramserv local (run A) exited $?: $(tail -3 "$T/a.log")"
ckpt=ckpt-000000300
[ -f "$T/a/checkpoints/$ckpt/MANIFEST.json" ] || fail "run A wrote no $ckpt: $(tail -3 "$T/a.log")"
mkdir -p "$T/b"
cp -r "$T/a/checkpoints" "$T/b/"
"$BIN" local --config "$T/ctr.conf" --dir "$T/b" >"$T/b.log" 2>&1 ||
  fail "paramserv local (run B) exited $?: $(tail -3 "$T/b.log")"
grep -q "restored from checkpoint" "$T/b.log" || fail "run B did not restore: $(tail -3 "$T/b.log")"
same_state "$T/a/checkpoints/$ckpt" "$T/b/checkpoints/$ckpt" restore "in run A" "after the restore" ||
  fail "the restored cluster's checkpoint differs from the one it restored"
for d in a b; do
  "$BIN" ckpt verify "$T/$d/checkpoints" >"$T/verify-$d.log" 2>&1 ||
    fail "ckpt verify (run $d): $(cat "$T/verify-$d.log")"
done
echo "ok: restore: $(cat "$T/verify-b.log")"

# --- 3. a shard killed and restored from Redis, again and again --------------
# Bags pooled on the shards: every field 1 to 4 ids, a model whose tables
# say "pooling": "server", so that each push's bags are turned into rows'
# gradients on the shard, journaled as such, and replayed.
# One worker makes training deterministic: the same pushes in the same
# order, each applied once.  A run whose shards are killed with kill -9
# (each restarted from its Redis snapshot and the replay of its log, the
# rows' gradients with it) must end in the very state of a calm run: the
# final checkpoints' shard files byte for byte the same.
scripts/gen-ctr --train 40000 --test 5000 --seed 3 --bags 26:4 --train-file "$T/bags.txt" \
  --test-file "$T/bags-test.txt" --meta "$T/bags.json" >"$T/gen-bags.log" 2>&1 ||
  fail "gen-ctr --bags: $(tail -2 "$T/gen-bags.log")"
sed 's/"combiner": "mean",/"combiner": "mean", "pooling": "server",/' \
  models/examples/ctr-bags.json >"$T/ctr-server.json"
grep -q '"pooling": "server"' "$T/ctr-server.json" || fail "no server pooling in $T/ctr-server.json"
ctr_conf "$T/log.conf" 1200 "mode = log
every_updates = 100
[chief]
log_every_steps = 20" "$T/ctr-server.json" "$T/bags" ,
"$BIN" local --config "$T/log.conf" --workers 1 --dir "$T/calm3" --fresh >"$T/calm3.log" 2>&1 ||
  fail "paramserv local (calm) exited $?: $(tail -3 "$T/calm3.log")"

# kills ROWS: the run with kills, the tables kept in Redis as ROWS
# (src/replica/REDIS.md §3: image, or keyed: by key, each snapshot writing
# the rows changed, and each restart serving while its rows come back).
kills() {
  local rows=$1 dir="$T/kill3-$1"
  sed "s/^mode = log\$/mode = log\nsparse_rows = $rows/" "$T/log.conf" >"$T/log-$rows.conf"
  grep -q "^sparse_rows = $rows" "$T/log-$rows.conf" || fail "no sparse_rows in $T/log-$rows.conf"
  "$BIN" local --config "$T/log-$rows.conf" --workers 1 --dir "$dir" --fresh >"$dir.log" 2>&1 &
  lpid=$!
  for k in 1 2 3 4 5 6; do
    shard=ps-$((k % 2))
    # Deadlines for a sanitized build beside other work: 150 steps take 2 s in a plain one.
    # The chief's progress lines come every 0.5 s, up to 180 steps apart on
    # an idle machine: the last kill, at 900, leaves 300 steps to the end.
    wait_summary "$dir/checkpoints" "o.get('steps_per_s') is not None and o.get('step', 0) >= $((k * 150))" 180
    pid=$(awk -v n="$shard" '$1 == n { print $2 }' "$dir/pids")
    [ -n "$pid" ] || fail "no pid of $shard in $dir/pids"
    kill -9 "$pid"
    wait_ready "$dir" "$shard" 90 "$pid"
  done
  wait "$lpid" || fail "paramserv local (kills, $rows) exited $?: $(tail -3 "$dir.log")"
  # Each kill is restored from Redis; a kill just after a snapshot replays no
  # log entry, so the replays are counted apart, and at least one must be.
  restores=$(cat "$dir"/logs/ps-*.log | grep -c 'restored from Redis in ' || true)
  replays=$(cat "$dir"/logs/ps-*.log | grep -c 'restored from Redis in .* + [1-9][0-9]* log entries' || true)
  lazy=$(cat "$dir"/logs/ps-*.log | grep -c "rows come in from Redis while the shard serves" || true)
  [ "$restores" -ge 6 ] || fail "$rows: $restores restores from Redis, expected one per kill (6)"
  [ "$replays" -ge 1 ] || fail "$rows: none of the $restores restores from Redis replayed a log entry"
  if [ "$rows" = keyed ]; then
    [ "$lazy" -ge 1 ] || fail "keyed: none of the $restores restores served before its rows were back"
  else
    [ "$lazy" = 0 ] || fail "image: $lazy restores were lazy"
  fi
  same_state "$T/calm3/checkpoints/ckpt-000001200" "$dir/checkpoints/ckpt-000001200" "kills, $rows" \
    "without kills" "with them" ||
    fail "$rows: the state after kills and restores from Redis differs from the calm run's"
  echo "ok: kills, bags pooled on the shards, sparse rows $rows: $restores restores from Redis ($replays with a log replay, $lazy serving before their rows were back), the same state as without"
}
kills image
kills keyed
