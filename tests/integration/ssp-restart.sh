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
  "train.last_step=3000" "train.threads=1" "train.log_every=50" "replication.mode=snapshot" \
  "$(metrics_on 5)"
start_shards ps "$conf" 2
start w0 "$BIN" worker --config "$conf" --index 0
start w1a "$BIN" worker --config "$conf" --index 1
wait_steps "$conf" 1 1000 120
# Its steps just before the kill (a few more may finish in between).
killed=$(metric "$conf" worker 1 paramserv_worker_steps_total)
kill -9 "$PID_w1a"
wait "$PID_w1a" 2>/dev/null || true
[[ $killed =~ ^[0-9]+$ ]] || fail "worker 1's paramserv_worker_steps_total before the kill: '$killed'"
start w1b "$BIN" worker --config "$conf" --index 1
wait_for "$T/w1b.log" "resumed data position" 20
line=$(grep -o 'resumed data position .*' "$T/w1b.log")
clock=${line##* clock }
# Saved every 100 ms: within 50 steps of where worker 1 was at the kill.
[ "$clock" -ge $((killed - 50)) ] ||
  fail "worker 1 had trained $killed steps before the kill, restarted at clock $clock: expected its saved clock"
# Worker 0 goes on while worker 1 makes up only the steps it missed.  Under
# ssp worker 0 at step S waits for every live worker's clock to reach
# S - 3; worker 1 resumed at clock C, so for worker 0 to reach step n + 100
# it needs about n + 100 - C steps of worker 1's new incarnation (worker 0
# ran on alone while worker 1 was down: that gap is made up, as it should
# be).  Had worker 1 restarted at clock 0 (or the shards counted it from 0
# again), it would need about n + 100: C (about $killed) more.  Checked as
# an order of events, not a time: when worker 0 has trained step n + 100,
# worker 1 has done less than the gap plus half of C.  Worker 1's steps are
# read after worker 0's, so they bound from above what it had done when
# worker 0 got there.  The deadline only bounds the wait.
n=$(metric "$conf" worker 0 paramserv_worker_steps_total)
[[ $n =~ ^[0-9]+$ ]] || fail "worker 0's paramserv_worker_steps_total: '$n'"
target=$((n + 100))
t0=$(date +%s%N)
wait_steps "$conf" 0 "$target" 120
redo=$(metric "$conf" worker 1 paramserv_worker_steps_total)
[[ $redo =~ ^[0-9]+$ ]] || fail "worker 1's paramserv_worker_steps_total: '$redo'"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
gap=$((target - clock))
[ "$redo" -lt $((gap + clock / 2)) ] ||
  fail "worker 0 reached step $target only after worker 1 had done up to $redo steps since its restart at clock $clock (the gap: $gap): held while worker 1 redid the run"
wait_exit "$PID_w0" 120 || fail "worker 0 exited $?"
wait_exit "$PID_w1b" 120 || fail "worker 1 exited $?"
acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/w0.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.85) }' || fail "test accuracy '$acc', expected at least 0.85"
stop_shards ps 2
echo "ok: ssp, worker 1 killed after step $killed and restarted: $line; worker 0 went from step $n to $target while worker 1 did at most $redo steps (the gap from its clock: $gap; $ms ms, information only); test accuracy $acc"
