#!/usr/bin/env bash
# [cluster] mode = ring (src/ring/README.md): workers with no shards
# all-reduce their gradients around a ring and train the mlp to at least
# 0.87 test accuracy; a member killed with -9 mid-run is left out of the
# next view and the others redo the interrupted step and go on; restarted,
# it fetches the state from a peer and rejoins; every member ends with the
# same global step; the settings that do not go together are refused.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

start_redis

# 3 members, calm: each finishes at the step limit, worker 0 reaches 0.87.
conf="$T/ring.conf"
write_config "$conf" 0 3 "cluster.mode=ring" "model.name=mlp" "train.last_step=900" \
  "train.threads=1" "train.log_every=100" "replication.mode=snapshot"
sed -i '/^ps = *$/d' "$conf"
for i in 0 1 2; do start "calm-w$i" "$BIN" worker --config "$conf" --index "$i"; done
for i in 0 1 2; do
  v="PID_calm_w$i"
  wait_exit "${!v}" 300 || fail "calm: worker $i exited $?"
done
acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/calm-w0.log")
[ -n "$acc" ] || fail "calm: worker 0 printed no final accuracy"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.87) }' || fail "calm: test accuracy $acc, expected at least 0.87"
for i in 0 1 2; do
  grep -q "done: .*global step 900," "$T/calm-w$i.log" || fail "calm: worker $i did not end at step 900"
done
echo "ok: calm ring of 3: test accuracy $acc; $(sed -n 's/.*done: //p' "$T/calm-w1.log")"

# A member killed with -9 mid-run: the others leave it out of the next view
# and go on; restarted, it fetches the state and rejoins.  Members at the
# end hold the same bytes, so each ends at the same step.
redis-cli -p "$REDIS_PORT" flushall >/dev/null  # a new run: no views, no end
conf="$T/kill.conf"
write_config "$conf" 0 3 "cluster.mode=ring" "model.name=mlp" "train.last_step=1500" \
  "train.threads=1" "train.log_every=50" "replication.mode=snapshot" "cluster.peer_timeout_ms=2000"
sed -i '/^ps = *$/d' "$conf"
for i in 0 1 2; do start "kill-w$i" "$BIN" worker --config "$conf" --index "$i"; done
wait_for "$T/kill-w1.log" "in view [0-9]*: 0,1,2 " 30
wait_for "$T/kill-w1.log" "global [2-9][0-9][0-9] " 60
kill -9 "$PID_kill_w1"
wait_for "$T/kill-w0.log" "in view [0-9]*: 0,2 " 30
wait_for "$T/kill-w2.log" "in view [0-9]*: 0,2 " 30
mv "$T/kill-w1.log" "$T/kill-w1-first.log"
start kill-w1 "$BIN" worker --config "$conf" --index 1
wait_for "$T/kill-w1.log" "fetched member [02]'s state" 30
wait_for "$T/kill-w1.log" "in view [0-9]*: 0,1,2 " 30
for i in 0 1 2; do
  v="PID_kill_w$i"
  wait_exit "${!v}" 300 || fail "kill: worker $i exited $?"
done
acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/kill-w0.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.87) }' || fail "kill: test accuracy $acc, expected at least 0.87"
for i in 0 1 2; do
  grep -q "done: .*global step 1500," "$T/kill-w$i.log" || fail "kill: worker $i did not end at step 1500"
done
grep -q "redone [1-9]" "$T/kill-w0.log" "$T/kill-w2.log" || echo "note: the kill fell between two steps (nothing to redo)"
echo "ok: kill -9 of a member and its return: test accuracy $acc; $(sed -n 's/.*done: //p' "$T/kill-w0.log")"

# A member paused (SIGSTOP) past the peer timeout: the others time out,
# leave it out (its heartbeat expired; theirs did not while they waited)
# and go on; resumed, it finds its view over and rejoins with their state.
redis-cli -p "$REDIS_PORT" flushall >/dev/null
conf="$T/pause.conf"
write_config "$conf" 0 3 "cluster.mode=ring" "model.name=mlp" "train.last_step=1500" \
  "train.threads=1" "train.log_every=50" "replication.mode=snapshot" \
  "cluster.peer_timeout_ms=2000" "worker.heartbeat_ms=300"
sed -i '/^ps = *$/d' "$conf"
for i in 0 1 2; do start "pause-w$i" "$BIN" worker --config "$conf" --index "$i"; done
wait_for "$T/pause-w1.log" "in view [0-9]*: 0,1,2 " 30
wait_for "$T/pause-w1.log" "global [2-9][0-9][0-9] " 60
kill -STOP "$PID_pause_w1"
wait_for "$T/pause-w0.log" "in view [0-9]*: 0,2 " 30
wait_for "$T/pause-w2.log" "in view [0-9]*: 0,2 " 30
kill -CONT "$PID_pause_w1"
wait_for "$T/pause-w1.log" "fetched member [02]'s state" 30
for i in 0 1 2; do
  v="PID_pause_w$i"
  wait_exit "${!v}" 300 || fail "pause: worker $i exited $?"
done
# Neither of the two that went on was ever alone in a view.
! grep -h "in view [0-9]*: [0-9] at" "$T/pause-w0.log" "$T/pause-w2.log" | grep -v "view [0-9]*: [0-9] at step 0$" ||
  fail "pause: a live member was left alone in a view"
for i in 0 1 2; do
  grep -q "done: .*global step 1500," "$T/pause-w$i.log" || fail "pause: worker $i did not end at step 1500"
done
acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/pause-w0.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.87) }' || fail "pause: test accuracy $acc, expected at least 0.87"
echo "ok: a member paused past the timeout and resumed: test accuracy $acc"

# Settings that do not go together, each one line and exit 1.
conf="$T/bad.conf"
write_config "$conf" 0 2 "cluster.mode=ring" "train.algorithm=averaging" "train.consistency=sync"
sed -i '/^ps = *$/d' "$conf"
set +e
out=$("$BIN" worker --config "$conf" --index 0 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] &&
  [[ $out == *"[cluster] mode = ring with algorithm = averaging: expected algorithm = gradients"* ]] ||
  fail "ring with averaging: exit $rc, '$out'"
echo "ok: refused: $out"
