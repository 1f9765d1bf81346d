#!/usr/bin/env bash
# [train] algorithm = averaging and easgd (src/ps/README.md, "Algorithms"):
# 2 ps + 2 workers on real sockets train the mlp to at least 0.87 test
# accuracy with model averaging (sync), EASGD async and EASGD sync; under
# averaging a worker killed mid-run leaves the rounds to the live one, which
# finishes; and the settings that do not go together are refused in one line.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

# run NAME LAST BAR SETTINGS...: 2 ps + 2 workers; worker 0's final accuracy
# must reach BAR.
run() {
  local name=$1 last=$2 bar=$3
  shift 3
  local conf="$T/$name.conf"
  write_config "$conf" 2 2 "model.name=mlp" "train.last_step=$last" "train.threads=1" \
    "train.log_every=200" "$@"
  local t0=$SECONDS
  train_2x2 "$name" "$conf" "$BIN"
  awk -v a="$acc" -v b="$bar" 'BEGIN { exit !(a >= b) }' ||
    fail "$name: test accuracy $acc, expected at least $bar"
  echo "ok: $name: $last global steps in $((SECONDS - t0)) s, test accuracy $acc (bar $bar); $(grep -h 'done:' "$T/$name-w0.log" "$T/$name-w1.log" | sed 's/.*done: //; s/, samples\/s.*//' | tr '\n' ';')"
}

run averaging 600 0.87 "train.algorithm=averaging" "train.consistency=sync" "train.window=4"
run easgd-async 1200 0.87 "train.algorithm=easgd" "train.consistency=async" "train.window=4"
run easgd-sync 600 0.87 "train.algorithm=easgd" "train.consistency=sync" "train.window=4"

# Averaging with a dead worker: the round waits one sync timeout for its
# replica, then averages the live one's alone, and the run finishes.
conf="$T/avg-kill.conf"
write_config "$conf" 2 2 "model.name=mlp" "train.algorithm=averaging" "train.consistency=sync" \
  "train.window=4" "train.last_step=300" "train.threads=1" "train.log_every=40" \
  "train.sync_timeout_ms=300" "$(metrics_on 5)"
start_shards ak-ps "$conf" 2
start ak-w0 "$BIN" worker --config "$conf" --index 0
start ak-w1 "$BIN" worker --config "$conf" --index 1
# Round 50 or later.
wait_metric "$conf" worker 1 "m['paramserv_worker_global_step'] >= 50" 60
before=$(wc -c <"$T/ak-ps0.log")
kill -9 "$PID_ak_w1"
wait_exit "$PID_ak_w0" 120 || fail "averaging after a worker's death: worker 0 exited $?"
grep -q "^final test_acc" "$T/ak-w0.log" || fail "averaging after a worker's death: no final accuracy"
# The round after the kill went on without worker 1 (a line written since).
tail -c +$((before + 1)) "$T/ak-ps0.log" | grep -q "applied them without the missing workers" ||
  fail "averaging: no round applied without worker 1 after its kill"
stop_shards ak-ps 2
echo "ok: averaging, worker 1 killed at round 50: worker 0 $(sed -n 's/^final //p' "$T/ak-w0.log")"

# Settings that do not go together: one line naming them, exit 2 (a restart would not change it).
refused() {
  local what=$1 pattern=$2 rc=0
  shift 2
  write_config "$T/bad.conf" 1 1 "$@"
  "$BIN" worker --config "$T/bad.conf" --index 0 >"$T/out" 2>"$T/err" || rc=$?
  [ "$rc" = 2 ] || fail "$what: exit $rc, expected 2 ($(cat "$T/err"))"
  [ "$(wc -l <"$T/err")" = 1 ] || fail "$what: $(wc -l <"$T/err") lines: $(cat "$T/err")"
  grep -q -- "$pattern" "$T/err" || fail "$what: '$(cat "$T/err")' lacks '$pattern'"
  echo "ok: $what: $(cat "$T/err")"
}
refused "averaging with async" "algorithm = averaging with consistency = async: expected consistency = sync" \
  "train.algorithm=averaging" "train.consistency=async"
refused "adag with easgd" "adag = yes with algorithm = easgd" "train.algorithm=easgd" "train.adag=yes"
refused "an unknown algorithm" "algorithm = ring" "train.algorithm=ring"
refused "alpha above 1" "easgd_alpha" "train.algorithm=easgd" "train.easgd_alpha=1.5"
