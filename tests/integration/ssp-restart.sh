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
# Worker 0 goes on while worker 1 makes up only the steps it missed.  Under
# ssp worker 0 at step S waits for every live worker's clock to reach
# S - 3; worker 1 resumed at clock C, so for worker 0 to log step n + 100 it
# needs about n + 100 - C steps of worker 1's new incarnation (worker 0 ran
# on alone while worker 1 was down: that gap is made up, as it should be).
# Had worker 1 restarted at clock 0 (or the shards counted it from 0
# again), it would need about n + 100: C (about $killed) more.  Checked as
# an order of events, not a time: when worker 0 has logged step n + 100,
# worker 1 has done less than the gap plus half of C.  Worker 1's log is
# read after worker 0's, so its last step line plus one log interval (50)
# bounds from above what it had done when worker 0 got there.  The deadline
# only bounds the wait.
# last_step LOG: the last "step S global" a worker logged (0 if none yet).
last_step() { awk '$3 == "step" && $5 == "global" { s = $4 } END { print s + 0 }' "$1"; }
n=$(last_step "$T/w0.log")
target=$((n + 100))
t0=$(date +%s%N)
for ((i = 0; i < 2400; i++)); do
  [ "$(last_step "$T/w0.log")" -ge "$target" ] && break
  kill -0 "$PID_w0" 2>/dev/null || break
  sleep 0.05
done
[ "$(last_step "$T/w0.log")" -ge "$target" ] ||
  fail "worker 0 logged no step $target after worker 1's restart (at $(last_step "$T/w0.log");" \
    "$(kill -0 "$PID_w0" 2>/dev/null && echo "still running after 120 s" || echo "it exited")); worker 1 at $(last_step "$T/w1b.log")"
redo=$(($(last_step "$T/w1b.log") + 50))
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
