#!/usr/bin/env bash
# 2 ps + 2 workers on 127.0.0.1 train the mlp in each consistency mode, on
# real sockets: async to at least 0.87 test accuracy, sync and ssp to at
# least 0.85 on shorter runs.  Every process must exit 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

run_mode() {
  local mode=$1 last=$2 bar=$3
  shift 3
  local conf="$T/$mode.conf"
  write_config "$conf" 2 2 "model.name=mlp" "train.consistency=$mode" "train.last_step=$last" \
    "train.threads=1" "train.log_every=500" "$@"
  local t0=$SECONDS
  train_2x2 "$mode" "$conf" "$BIN"
  awk -v a="$acc" -v b="$bar" 'BEGIN { exit !(a >= b) }' ||
    fail "$mode: test accuracy $acc, expected at least $bar"
  echo "ok: $mode: $last global steps in $((SECONDS - t0)) s, test accuracy $acc (bar $bar); $(grep -h 'done:' "$T/$mode-w0.log" "$T/$mode-w1.log" | sed 's/.*done: //' | tr '\n' ';')"
}

run_mode async 4000 0.87 "train.schedule=cosine"
run_mode sync 800 0.85
run_mode ssp 2000 0.85 "train.staleness=3"

# Sync with a dead worker: the shards wait one timeout for its gradient,
# then go on with the live worker, which reaches the step limit.
conf="$T/sync-kill.conf"
write_config "$conf" 2 2 "model.name=mlp" "train.consistency=sync" "train.last_step=400" \
  "train.threads=1" "train.log_every=50" "train.sync_timeout_ms=300" "$(metrics_on 5)"
start_shards sk-ps "$conf" 2
start sk-w0 "$BIN" worker --config "$conf" --index 0
start sk-w1 "$BIN" worker --config "$conf" --index 1
wait_steps "$conf" 1 100 60
kill -9 "$PID_sk_w1"
wait_exit "$PID_sk_w0" 120 || fail "sync after a worker's death: worker 0 exited $?"
grep -q "^final test_acc" "$T/sk-w0.log" || fail "sync after a worker's death: no final accuracy"
wait_for "$T/sk-ps0.log" "applied them without the missing workers" 1
stop_shards sk-ps 2
echo "ok: sync, worker 1 killed at step 100: $(grep -h 'without the missing' "$T/sk-ps0.log" | head -1 | sed 's/^ps.0: warn: //'); worker 0 $(sed -n 's/^final //p' "$T/sk-w0.log")"

# DOWNPOUR's communication window with ADAG: 4 local steps per push, the
# pushed gradient divided by 4.
conf="$T/window.conf"
write_config "$conf" 2 2 "model.name=mlp" "train.last_step=600" "train.window=4" "train.adag=yes" \
  "train.threads=1" "train.log_every=100"
start_shards win-ps "$conf" 2
start win-w0 "$BIN" worker --config "$conf" --index 0
start win-w1 "$BIN" worker --config "$conf" --index 1
wait_exit "$PID_win_w0" 120 || fail "window: worker 0 exited $?"
wait_exit "$PID_win_w1" 120 || fail "window: worker 1 exited $?"
acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/win-w0.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.8) }' || fail "window 4 + adag: test accuracy '$acc', expected >= 0.8"
# Each worker pushes once per 4 local steps, to the end (a worker stops
# only after a push): local steps = 4 x pushes, in its done line.
summary=""
for j in 0 1; do
  local_steps="" pushes=""
  read -r local_steps pushes < <(sed -n "s/^worker $j done: \([0-9]*\) local steps.* pushes \([0-9]*\),.*/\1 \2/p" "$T/win-w$j.log") || true
  [ -n "${pushes:-}" ] && [ "$pushes" -gt 0 ] || fail "window: worker $j: no pushes in its done line: $(grep 'done:' "$T/win-w$j.log")"
  [ "$local_steps" -eq $((4 * pushes)) ] ||
    fail "window 4: worker $j took $local_steps local steps for $pushes pushes, expected 4 per push ($((4 * pushes)))"
  summary+="; worker $j: $local_steps local steps, $pushes pushes"
done
stop_shards win-ps 2
echo "ok: window 4 + adag: 4 local steps per push$summary; test accuracy $acc"
