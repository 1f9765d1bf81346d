#!/usr/bin/env bash
# ssp: a worker killed (kill -9) well into the run and started again
# resumes at the clock it had saved in Redis with its data position, not at
# 0: the other worker is held only while the restarted one makes up the
# steps it missed while it was down, not while it redoes the whole run.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
start_redis

conf="$T/ssp-restart.conf"
write_config "$conf" 2 2 "model.name=mlp" "train.consistency=ssp" "train.staleness=3" \
  "train.last_step=3000" "train.threads=1" "train.log_every=50" "replication.mode=snapshot"
start_shards ps "$conf" 2
start w0 "$BIN" worker --config "$conf" --index 0
start w1a "$BIN" worker --config "$conf" --index 1
wait_for "$T/w1a.log" "step 1000 global" 120
kill -9 "$PID_w1a"
wait "$PID_w1a" 2>/dev/null || true
killed=$(grep -o ' step [0-9]* global' "$T/w1a.log" | tail -n 1 | awk '{print $2}')
start w1b "$BIN" worker --config "$conf" --index 1
wait_for "$T/w1b.log" "resumed data position" 20
line=$(grep -o 'resumed data position .*' "$T/w1b.log")
clock=${line##* clock }
# Saved at most 100 ms before the kill: within one log interval (50 steps)
# of the last step line worker 1 wrote.
[ "$clock" -ge $((killed - 50)) ] ||
  fail "worker 1 logged step $killed before the kill, restarted at clock $clock: expected its saved clock"
# Worker 0 goes on: 100 more of its steps within 5 s of the restart.  Had
# worker 1 restarted at clock 0, worker 0 would wait (staleness 3) until it
# redid about $killed steps.
n=$(grep -o ' step [0-9]* global' "$T/w0.log" | tail -n 1 | awk '{print $2}')
t0=$(date +%s%N)
wait_for "$T/w0.log" " step $((n + 100)) global" 5
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
wait_exit "$PID_w0" 120 || fail "worker 0 exited $?"
wait_exit "$PID_w1b" 120 || fail "worker 1 exited $?"
acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/w0.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.85) }' || fail "test accuracy '$acc', expected at least 0.85"
stop_shards ps 2
echo "ok: ssp, worker 1 killed after step $killed and restarted: $line; worker 0 went from step $n to $((n + 100)) in $ms ms (deadline 5 s); test accuracy $acc"
