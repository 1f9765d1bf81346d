#!/usr/bin/env bash
# ssp: a worker that hangs with its connection open (SIGSTOP) stops
# heart-beating; the shards stop waiting for it, so the other worker goes
# past the staleness bound; when it resumes (SIGCONT) both finish.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
start_redis

conf="$T/ssp.conf"
write_config "$conf" 2 2 "model.name=mlp" "train.consistency=ssp" "train.staleness=3" \
  "train.last_step=1500" "train.threads=1" "train.log_every=50" "replication.mode=snapshot" \
  "worker.heartbeat_ms=200" "$(metrics_on 5)"
start_shards ps "$conf" 2
start w0 "$BIN" worker --config "$conf" --index 0
start w1 "$BIN" worker --config "$conf" --index 1
wait_steps "$conf" 1 100 60
# Its steps just before the stop (a few more may finish in between).
stopped=$(metric "$conf" worker 1 paramserv_worker_steps_total)
kill -STOP "$PID_w1"
[[ $stopped =~ ^[0-9]+$ ]] || fail "worker 1's paramserv_worker_steps_total: '$stopped'"
# Without the heartbeat, worker 0 could not get more than staleness (3)
# steps ahead of the hung worker; with it, it goes 200 steps past.
wait_steps "$conf" 0 $((stopped + 200)) 30
wait_for "$T/ps0.log" "heartbeat lapsed" 1
kill -CONT "$PID_w1"
wait_exit "$PID_w0" 120 || fail "worker 0 exited $?"
wait_exit "$PID_w1" 120 || fail "worker 1 exited $?"
stop_shards ps 2
echo "ok: ssp, worker 1 stopped (SIGSTOP) at local step $stopped: $(grep -h -o 'worker 1 .*heartbeat lapsed.*' "$T/ps0.log" | head -1); worker 0 went 200 steps past it; after SIGCONT both finished"
