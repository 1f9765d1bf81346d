#!/usr/bin/env bash
# A user's own training loop on the client library (client_example.c): a
# small autoencoder declared by a variables file, a model no built-in is,
# trains through 2 shards, calm and then with each shard killed -9 and
# restarted from Redis in the middle of training; its reconstruction error
# falls, and the histories show nothing acknowledged lost or applied twice.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
EXAMPLE=${EXAMPLE:-$(dirname "$BIN")/tests/client_example}
VARS="$PWD/models/examples/autoencoder.vars.json"

# check_example LOG WHAT: the error fell to under a third of where it began.
check_example() {
  local log=$1 what=$2 after before
  after=$(sed -n 's/^example: reconstruction error \([0-9.]*\) .*/\1/p' "$log")
  before=$(sed -n 's/^example: reconstruction error .*(\([0-9.]*\) before)/\1/p' "$log")
  [ -n "$after" ] && [ -n "$before" ] || fail "$what: no error figures in $log"
  awk -v a="$after" -v b="$before" 'BEGIN { exit !(a < b / 3) }' ||
    fail "$what: reconstruction error $after after training, $before before: expected under a third"
  echo "ok: $what: $(tail -n 1 "$log" | sed 's/^example: //')"
}

# Calm.
write_config "$T/c.conf" 2 1 "model.variables=$VARS" "train.lr=0.01"
start_shards ps "$T/c.conf" 2
"$EXAMPLE" "$T/c.conf" 0 300 >"$T/example.log" 2>&1 || fail "client_example exited $?"
check_example "$T/example.log" "client example, calm"
stop_shards ps 2

# Each shard killed -9 in the middle of training and restarted: it comes
# back from Redis, the example reconnects and re-sends.
start_redis
hist="$T/history"
mkdir -p "$hist"
write_config "$T/k.conf" 2 1 "model.variables=$VARS" "train.lr=0.01" "replication.mode=log" \
  "cluster.history_dir=$hist"
start_shards kps "$T/k.conf" 2
start ex "$EXAMPLE" "$T/k.conf" 0 1500
kills=0
for at in 200 500 800 1100; do
  i=$((kills % 2))
  wait_for "$T/ex.log" "example: step $at " 120
  v="PID_kps$i"
  kill -9 "${!v}"
  wait "${!v}" 2>/dev/null || true
  start "kps${i}_$kills" "$BIN" ps --config "$T/k.conf" --index "$i"
  eval "PID_kps$i=\$PID_kps${i}_$kills"
  wait_for "$T/kps${i}_$kills.log" "listening on" 30
  kills=$((kills + 1))
done
wait_exit "$PID_ex" 300 || fail "client_example exited $? under kills"
check_example "$T/ex.log" "client example, $kills shard kills"
stop_shards kps 2
verdict=$(scripts/check-history "$hist") || fail "$verdict"
echo "$verdict" | sed 's/^/ok: /'
