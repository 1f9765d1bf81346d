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
# and redo the step it interrupted (src/ring/README.md, "The interrupted
# step": the member furthest on left its view with that step's gradient in
# hand; only if one had finished the step and saw the new view before its
# next all-reduce do the others adopt its state instead), counted by the
# members' paramserv_ring_redone_steps_total before the killed one comes
# back; restarted, it fetches the state and rejoins.  Members at the end
# hold the same bytes, so each ends at the same step.
command -v curl >/dev/null || fail "curl: not found (make deps installs it)"
# Metrics at base + 1 + j for member j: 4 consecutive free ports.
mbase=$(free_port_run 4)
[ -n "$mbase" ] || fail "no 4 consecutive free ports for the members' metrics"
# redone J: member J's paramserv_ring_redone_steps_total, "" while it does not answer.
redone() {
  curl -s "http://127.0.0.1:$((mbase + 1 + $1))/metrics" 2>/dev/null |
    awk '$1 == "paramserv_ring_redone_steps_total" || $1 ~ /^paramserv_ring_redone_steps_total\{/ { print $2 }'
}
# wait_members CONF J N SECS: until member J trains in a view of N members.
wait_members() { wait_metric "$1" worker "$2" "m['paramserv_ring_members'] == $3" "$4"; }
redis-cli -p "$REDIS_PORT" flushall >/dev/null  # a new run: no views, no end
conf="$T/kill.conf"
write_config "$conf" 0 3 "cluster.mode=ring" "model.name=mlp" "train.last_step=1200" \
  "train.threads=1" "train.log_every=50" "replication.mode=snapshot" "cluster.peer_timeout_ms=2000" \
  "metrics.listen=127.0.0.1:$mbase"
sed -i '/^ps = *$/d' "$conf"
for i in 0 1 2; do start "kill-w$i" "$BIN" worker --config "$conf" --index "$i"; done
wait_members "$conf" 1 3 30
wait_metric "$conf" worker 1 "m['paramserv_ring_global_step'] >= 200" 60
# The redos so far (the views of the start), member 0 and member 2.
r0=$(redone 0) || true
r2=$(redone 2) || true
[ -n "$r0" ] && [ -n "$r2" ] || fail "kill: no paramserv_ring_redone_steps_total from members 0 and 2 ('$r0', '$r2')"
n0=$(wc -l <"$T/kill-w0.log")
n2=$(wc -l <"$T/kill-w2.log")
kill -9 "$PID_kill_w1"
wait_members "$conf" 0 2 30
wait_members "$conf" 2 2 30
got=""
for ((i = 0; i < 600; i++)); do
  a=$(redone 0) || true
  b=$(redone 2) || true
  if [ -n "$a" ] && [ -n "$b" ]; then
    d0=$((${a%.*} - ${r0%.*}))
    d2=$((${b%.*} - ${r2%.*}))
    if [ $((d0 + d2)) -gt 0 ]; then
      got="redone (member 0 redid $d0 all-reduces, member 2 $d2)"
      break
    fi
  fi
  sleep 0.05
done
if [ -z "$got" ]; then
  # No redo: lawful only where a member had finished the step and left its
  # view for the newer one between two all-reduces.
  adopted=$(tail -n +"$((n0 + 1))" "$T/kill-w0.log" | grep -m1 "ring: leaving view [0-9]*: a newer view" ||
    tail -n +"$((n2 + 1))" "$T/kill-w2.log" | grep -m1 "ring: leaving view [0-9]*: a newer view") ||
    fail "kill: the interrupted step was not redone (redone steps: member 0 $r0 -> ${a:-?}, member 2 $r2 -> ${b:-?}) and no member had finished it"
  got="no redo: a member had finished the step ($adopted)"
fi
mv "$T/kill-w1.log" "$T/kill-w1-first.log"
start kill-w1 "$BIN" worker --config "$conf" --index 1
wait_metric "$conf" worker 1 "m['paramserv_ring_fetched_states_total'] >= 1" 30
wait_members "$conf" 1 3 30
for i in 0 1 2; do
  v="PID_kill_w$i"
  wait_exit "${!v}" 300 || fail "kill: worker $i exited $?"
done
acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/kill-w0.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.87) }' || fail "kill: test accuracy $acc, expected at least 0.87"
for i in 0 1 2; do
  grep -q "done: .*global step 1200," "$T/kill-w$i.log" || fail "kill: worker $i did not end at step 1200"
done
echo "ok: kill -9 of a member and its return: the interrupted step: $got; test accuracy $acc; $(sed -n 's/.*done: //p' "$T/kill-w0.log")"

# pause_member NAME LAST_STEP PEER_TIMEOUT_MS: a new run of 3 members
# (NAME-wJ, config $T/NAME.conf in $conf) to LAST_STEP; member 1 paused
# with SIGSTOP once it passed step 200.
pause_member() {
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  conf="$T/$1.conf"
  write_config "$conf" 0 3 "cluster.mode=ring" "model.name=mlp" "train.last_step=$2" \
    "train.threads=1" "train.log_every=50" "replication.mode=snapshot" \
    "cluster.peer_timeout_ms=$3" "worker.heartbeat_ms=300" "$(metrics_on 4)"
  sed -i '/^ps = *$/d' "$conf"
  for i in 0 1 2; do start "$1-w$i" "$BIN" worker --config "$conf" --index "$i"; done
  wait_members "$conf" 1 3 30
  wait_metric "$conf" worker 1 "m['paramserv_ring_global_step'] >= 200" 60
  local v="PID_${1//-/_}_w1"
  kill -STOP "${!v}"
}

# A member paused (SIGSTOP) past the peer timeout: the others time out,
# leave it out (its heartbeat expired; theirs did not while they waited)
# and go on; resumed, it finds its view over and rejoins with their state.
pause_member pause 1200 2000
wait_members "$conf" 0 2 30
wait_members "$conf" 2 2 30
kill -CONT "$PID_pause_w1"
wait_metric "$conf" worker 1 "m['paramserv_ring_fetched_states_total'] >= 1" 30
for i in 0 1 2; do
  v="PID_pause_w$i"
  wait_exit "${!v}" 300 || fail "pause: worker $i exited $?"
done
# Neither of the two that went on was ever alone in a view.
! grep -h "in view [0-9]*: [0-9] at" "$T/pause-w0.log" "$T/pause-w2.log" | grep -v "view [0-9]*: [0-9] at step 0$" ||
  fail "pause: a live member was left alone in a view"
for i in 0 1 2; do
  grep -q "done: .*global step 1200," "$T/pause-w$i.log" || fail "pause: worker $i did not end at step 1200"
done
acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/pause-w0.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.87) }' || fail "pause: test accuracy $acc, expected at least 0.87"
echo "ok: a member paused past the timeout and resumed: test accuracy $acc"

# A member paused (SIGSTOP) through the end of the run: the others finish
# without it and record the end in Redis; resumed, it finds the run ended
# and exits 0 rather than forming a view alone and training on by itself.
pause_member pause-end 700 1000
for i in 0 2; do
  v="PID_pause_end_w$i"
  wait_exit "${!v}" 300 || fail "pause through the end: worker $i exited $?"
  grep -q "done: .*global step 700," "$T/pause-end-w$i.log" || fail "pause through the end: worker $i did not end at step 700"
done
kill -CONT "$PID_pause_end_w1"
wait_exit "$PID_pause_end_w1" 60 || fail "pause through the end: the resumed worker 1 exited $?"
grep -q "the run already ended at global step 700 " "$T/pause-end-w1.log" ||
  fail "pause through the end: worker 1 did not find the run ended: $(tail -3 "$T/pause-end-w1.log")"
! grep -q "done: \|in view [0-9]*: 1 at" "$T/pause-end-w1.log" ||
  fail "pause through the end: worker 1 trained on alone after the run ended: $(grep "done: \|in view" "$T/pause-end-w1.log" | tail -2)"
echo "ok: a member paused through the run's end: $(grep -o "this member was at global step [0-9]*" "$T/pause-end-w1.log") when it resumed; it found the run ended and exited 0"

# Redis silent (SIGSTOP) past the ring's timeout: a member that cannot see
# the current view stops training until Redis answers (a partition from
# Redis leaves no branch training on), then the ring goes on to the end.
redis-cli -p "$REDIS_PORT" flushall >/dev/null
conf="$T/silent.conf"
write_config "$conf" 0 2 "cluster.mode=ring" "model.name=mlp" "train.last_step=700" \
  "train.threads=1" "train.log_every=50" "replication.mode=snapshot" \
  "cluster.peer_timeout_ms=1000" "redis.timeout_ms=500" "worker.heartbeat_ms=300" \
  "$(metrics_on 3)"
sed -i '/^ps = *$/d' "$conf"
for i in 0 1; do start "silent-w$i" "$BIN" worker --config "$conf" --index "$i"; done
wait_members "$conf" 0 2 30
wait_metric "$conf" worker 0 "m['paramserv_ring_global_step'] >= 200" 60
kill -STOP "$PID_redis"
# Between steps it waits out the ring's timeout (1500 ms); a member whose
# step broke meanwhile waits in its view change: training waits either way.
wait_for "$T/silent-w0.log" "ring: Redis .*: training waits" 30
kill -CONT "$PID_redis"
wait_for "$T/silent-w0.log" "ring: Redis answers again" 30
for i in 0 1; do
  v="PID_silent_w$i"
  wait_exit "${!v}" 300 || fail "silent: worker $i exited $?"
  grep -q "done: .*global step 700," "$T/silent-w$i.log" || fail "silent: worker $i did not end at step 700"
done
echo "ok: Redis silent past the ring's timeout: training waited and went on to the end"

# Settings that do not go together, each one line and exit 2.
conf="$T/bad.conf"
write_config "$conf" 0 2 "cluster.mode=ring" "train.algorithm=averaging" "train.consistency=sync"
sed -i '/^ps = *$/d' "$conf"
set +e
out=$("$BIN" worker --config "$conf" --index 0 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] &&
  [[ $out == *"[cluster] mode = ring with algorithm = averaging: expected algorithm = gradients"* ]] ||
  fail "ring with averaging: exit $rc, '$out'"
echo "ok: refused: $out"

# Restore: a ring run by `paramserv local` (with its chief) to step 700,
# then again to 1200 in the same directory: no member holds a state, the
# chief loads its latest checkpoint into one, the others fetch it, and each
# goes on from the data position that checkpoint saved.
cat >"$T/restore.conf" <<'CONF'
[cluster]
mode = ring
[train]
threads = 1
[checkpoint]
every_steps = 300
CONF
"$BIN" local --config "$T/restore.conf" --workers 3 --dir "$T/restore" --last-step 700 \
  >"$T/restore-1.out" 2>&1 || fail "restore: the first run exited $?: $(tail -3 "$T/restore-1.out")"
ck=$(ls "$T/restore/checkpoints" | grep '^ckpt-' | tail -n 1)
[ "$ck" = ckpt-000000700 ] || fail "restore: the first run's latest checkpoint is $ck, expected ckpt-000000700"
"$BIN" local --config "$T/restore.conf" --workers 3 --dir "$T/restore" --last-step 1200 \
  >"$T/restore-2.out" 2>&1 || fail "restore: the second run exited $?: $(tail -3 "$T/restore-2.out")"
grep -q "loaded from $ck: version 700" "$T/restore/logs/chief.log" ||
  fail "restore: the chief did not load $ck"
for i in 0 1 2; do
  want=$("$BIN" ckpt show "$T/restore/checkpoints/$ck" | sed -n "s/^  worker $i: epoch \([0-9]*\), offset \([0-9]*\)$/epoch \1 offset \2/p")
  [ -n "$want" ] || fail "restore: $ck has no data position for worker $i"
  grep -q "ring: loaded by the chief: step 700\|fetched member [0-9]'s state at step 700" \
    "$T/restore/logs/worker-$i.log" || fail "restore: worker $i did not start from step 700"
  grep -q "data position $want from Redis" "$T/restore/logs/worker-$i.log" ||
    fail "restore: worker $i did not go on from $ck's data position ($want)"
done
grep -q "done after .*step 1200/1200" "$T/restore-2.out" || fail "restore: the second run did not end at 1200"
echo "ok: restore: the second run started from $ck (step 700) and its data positions; $(grep -o 'test accuracy [0-9.]*' "$T/restore-2.out")"
