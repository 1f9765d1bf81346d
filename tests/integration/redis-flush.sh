#!/usr/bin/env bash
# Redis losing a shard's data under a live connection (REDIS.md §9): 2
# shards and 2 workers train with replication = log while Redis loses,
# one at a time, everything (FLUSHALL, FLUSHDB) or one of shard 0's keys
# (DEL of its epoch, log key, log stream, meta, a snapshot chunk, the
# snapshot list).  Each time the shard must say in one line that Redis lost
# its keys (not that it was fenced), claim them back and write a full
# snapshot from memory; then it is killed with kill -9 and restarted, and
# restores from Redis.  From the histories every process wrote
# (scripts/check-history): no acknowledged update lost, none applied twice.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

start_redis
rc() { redis-cli -p "$REDIS_PORT" "$@"; }
hist="$T/history"
mkdir -p "$hist"
write_config "$T/c.conf" 2 2 "model.name=mlp" "train.last_step=0" "train.threads=1" \
  "train.log_every=50" "replication.mode=log" "replication.interval_ms=200" \
  "redis.timeout_ms=1000" "worker.heartbeat_ms=200" "cluster.history_dir=$hist" "$(metrics_on 5)"
P="{itest:ps:0}"
start_shards ps "$T/c.conf" 2
start w0 "$BIN" worker --config "$T/c.conf" --index 0
start w1 "$BIN" worker --config "$T/c.conf" --index 1
wait_steps "$T/c.conf" 0 100 60

acks() { cat "$hist"/worker-*.history | grep -c '^ack 0 ' || true; }
lost_lines() { cat "$T"/ps0*.log | grep -c "Redis lost this shard's keys (" || true; }
# wait_acks N SECS: until the workers saw more than N acks from shard 0.
wait_acks() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do
    [ "$(acks)" -gt "$1" ] && return 0
    sleep 0.05
  done
  fail "no ack from shard 0 within $2 s (still $(acks))"
}
# snap_whole: shard 0's meta names a snapshot of the running incarnation
# whose chunks are all there (the full snapshot switched).
snap_whole() {
  rc eval "local m = redis.call('HMGET', KEYS[1], 'snap', 'chunks', 'epoch')
    if not m[1] or m[3] ~= ARGV[1] then return 0 end
    for k = 0, tonumber(m[2]) - 1 do
      if redis.call('EXISTS', KEYS[2] .. m[1] .. ':' .. k) == 0 then return 0 end end
    return 1" 2 "$P:meta" "$P:snap:" "$1" 2>/dev/null || echo 0
}
epoch_of_ps0() { rc get "$P:epoch" 2>/dev/null || true; }
# settled: with the workers paused, shard 0's last application (its
# history), its heartbeat and its meta all hold one version: no snapshot is
# in flight or will start (a snapshot that switched after a DEL would repair
# the loss before it is noticed).
settled() {
  local mv hv av
  mv=$(rc hget "$P:meta" version 2>/dev/null) || mv=""
  hv=$(rc get "$P:node" 2>/dev/null | sed -n 's/.* version \([0-9]*\) .*/\1/p') || hv=""
  av=$(grep '^apply ' "$hist/ps-0.history" | tail -n 1 | awk '{print $4}')
  [ -n "$mv" ] && [ "$mv" = "$hv" ] && [ "$mv" = "$av" ]
}

n=0
for fault in flushall flushdb epoch logkey stream meta chunk snaps; do
  n=$((n + 1))
  before=$(acks) lines=$(lost_lines)
  epoch=$(epoch_of_ps0)
  [ -n "$epoch" ] || fail "$fault: no epoch of shard 0 in Redis before the fault"
  # The workers paused: no new update makes the shard write a snapshot of
  # its own, so only its noticing the loss can repair it.
  kill -STOP "$PID_w0" "$PID_w1"
  for ((i = 0; i < 400; i++)); do settled && break; sleep 0.05; done
  settled || fail "$fault: shard 0 did not settle within 20 s: meta version $(rc hget "$P:meta" version), last applied $(grep '^apply ' "$hist/ps-0.history" | tail -n 1), heartbeat $(rc get "$P:node") (pttl $(rc pttl "$P:node"))"
  case $fault in
  flushall) rc flushall >/dev/null ;;
  flushdb) rc flushdb >/dev/null ;;
  epoch) rc del "$P:epoch" >/dev/null ;;
  logkey) rc del "$P:logkey" >/dev/null ;;
  stream) rc del "$(rc get "$P:logkey")" >/dev/null ;;
  meta) rc del "$P:meta" >/dev/null ;;
  chunk) rc del "$P:snap:$(rc hget "$P:meta" snap):0" >/dev/null ;;
  snaps) rc del "$P:snaps" >/dev/null ;;
  esac
  if [ "$fault" = snaps ]; then
    # The snapshot list only lets a switch find old chunks to delete:
    # nothing of the state is lost, and nothing is claimed.
    kill -CONT "$PID_w0" "$PID_w1"
    wait_acks "$((before + 20))" 20
    echo "ok: snaps: nothing of the state lost, acks go on"
  else
    for ((i = 0; i < 400; i++)); do
      [ "$(lost_lines)" -gt "$lines" ] && break
      sleep 0.05
    done
    [ "$(lost_lines)" -gt "$lines" ] ||
      fail "$fault: shard 0 did not say that Redis lost its keys within 20 s: $(cat "$T"/ps0*.log | tail -n 3 | cut -c1-200)"
    line=$(cat "$T"/ps0*.log | grep "Redis lost this shard's keys (" | tail -n 1)
    # Not taken for a fence, and it goes on.
    ! grep -q 'fenced out' "$T"/ps0*.log || fail "$fault: shard 0 took the loss for a fence"
    for ((i = 0; i < 400; i++)); do
      [ "$(snap_whole "$epoch")" = 1 ] && break
      sleep 0.05
    done
    [ "$(snap_whole "$epoch")" = 1 ] || fail "$fault: no full snapshot of shard 0 within 20 s"
    kill -CONT "$PID_w0" "$PID_w1"
    wait_acks "$before" 20
    echo "ok: $fault: ${line#*redis } -> a full snapshot, acks again"
  fi
  # Now the kill: what was acknowledged must come back from Redis.
  v="PID_ps0"
  [ "$n" -gt 1 ] && v="PID_ps0_$((n - 1))"
  kill -9 "${!v}"
  wait "${!v}" 2>/dev/null || true
  start "ps0_$n" "$BIN" ps --config "$T/c.conf" --index 0
  wait_up "ps0_$n" 20
  # Its incarnation is set once its state is restored (or seeded).
  wait_metric "$T/c.conf" ps 0 "m['paramserv_ps_incarnation'] >= 1" 5
  [ "$(metric "$T/c.conf" ps 0 paramserv_ps_restores_total)" = 1 ] ||
    fail "$fault: the restarted shard 0 did not restore from Redis: $(grep -i 'restor\|seed' "$T/ps0_$n.log" | head -3)"
  wait_acks "$(acks)" 30
done

kill -TERM "$PID_w0" "$PID_w1"
wait_exit "$PID_w0" 30 || fail "worker 0 exited $? on SIGTERM"
wait_exit "$PID_w1" 30 || fail "worker 1 exited $? on SIGTERM"
v="PID_ps0_$n"
kill -TERM "${!v}" "$PID_ps1"
wait_exit "${!v}" 10 || fail "ps 0 exited $?"
wait_exit "$PID_ps1" 10 || fail "ps 1 exited $?"
verdict=$(scripts/check-history "$hist") || fail "$verdict"
echo "$verdict" | sed 's/^/ok: /'
