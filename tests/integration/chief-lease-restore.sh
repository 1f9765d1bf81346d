#!/usr/bin/env bash
# The chief's lease is renewed whatever the chief is doing: a restore that
# takes three times [chief] lease_ms (PS_TEST_RESTORE_DELAY_MS stands in for
# a large state's read: the restore runs on the chief's main thread) keeps
# the lease, from the seeded initialization and from a checkpoint: the
# chief neither lapses nor loses it, and each run reaches its last step with
# exit 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

start_redis
conf() {  # LAST
  write_config "$T/c.conf" 1 1 "model.name=mlp" "train.last_step=$1" "train.threads=1" \
    "replication.mode=off" "replication.self_init=no" \
    "checkpoint.dir=$T/ckpt" "checkpoint.every_steps=0" "checkpoint.every_secs=0" \
    "chief.lease_ms=1000" "chief.eval_every_steps=0" "chief.log_every_steps=50"
}
# run NAME: a shard, a worker and a chief whose restores take 3 s, to
# last_step; checks the chief's lease held and it exited 0.
run() {
  local log="$T/$1-chief.log" v="PID_${1}_chief" rc=0
  start_shards "$1-ps" "$T/c.conf" 1
  start "$1-w" "$BIN" worker --config "$T/c.conf" --index 0
  PS_TEST_RESTORE_DELAY_MS=3000 start "$1-chief" "$BIN" chief --config "$T/c.conf"
  wait_exit "${!v}" 120 || rc=$?
  # At last_step the chief stops the cluster: the shard and the worker end.
  local ps="PID_${1}_ps0" w="PID_${1}_w"
  wait_exit "${!ps}" 60 || fail "$1: the shard exited $? at the end of the run"
  wait_exit "${!w}" 60 || fail "$1: the worker exited $? at the end of the run"
  if grep -Eq "lapsed|lost the lease|has not confirmed the lease" "$log"; then
    fail "$1: the chief's lease went during the restore: $(grep -Em1 'lapsed|lost the lease|has not confirmed' "$log")"
  fi
  [ "$rc" = 0 ] || fail "$1: the chief exited $rc"
  loaded=$(grep -o '[^ ]*: [0-9]* shard states\? made in [0-9.]* s (side by side), loaded in [0-9.]* s' "$log") ||
    fail "$1: no restore line: $(grep -m3 'restor\|load' "$log")"
  grep -q "reached last_step $2" "$log" || fail "$1: the run did not reach step $2"
}

conf 200
run first 200
[ -f "$T/ckpt/ckpt-000000200/MANIFEST.json" ] || fail "no checkpoint at step 200"
echo "ok: a 3 s restore under a 1 s lease ($loaded): the lease held, the run reached step 200 (exit 0)"

# Redis forgets everything: the second run restores from the checkpoint.
redis-cli -p "$REDIS_PORT" flushall >/dev/null
conf 400
run second 400
case "$loaded" in ckpt-000000200:*) ;; *) fail "the second run did not restore from ckpt-000000200: $loaded" ;; esac
echo "ok: a 3 s restore from a checkpoint under a 1 s lease ($loaded): the lease held, the run reached step 400 (exit 0)"
