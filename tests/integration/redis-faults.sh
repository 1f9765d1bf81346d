#!/usr/bin/env bash
# The durability contract under Redis faults (REDIS.md §9), one run per
# fault class: 2 shards and 2 workers train with replication = log and
# on_redis_failure = block while Redis refuses writes (each kind of error
# reply, provoked through Redis's own settings), drops the connection, or
# stops answering; the first shard to meet the fault is killed with kill -9
# inside it, the fault ends, that shard comes back.  From the histories every process wrote
# (scripts/check-history): no acknowledged update lost, none applied twice.
# And training goes on within the deadlines once the fault ends.
#
#   redis-faults.sh [CLASS...]   (default: every class)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
# MISCONF needs a save directory that refuses files, set at run time.
REDIS_ARGS="--enable-protected-configs yes"
start_redis
rc() { redis-cli -p "$REDIS_PORT" "$@"; }

# inject CLASS / heal CLASS: the fault through Redis's own settings.
inject() {
  case $1 in
  noreplicas) rc config set min-replicas-to-write 1 >/dev/null ;;
  oom) rc config set maxmemory-policy noeviction >/dev/null; rc config set maxmemory 1 >/dev/null ;;
  readonly) rc replicaof 127.0.0.1 "$(free_ports 1)" >/dev/null ;;
  misconf)
    # A directory even root cannot create files in: the save fails, and
    # with a save point set Redis refuses writes (MISCONF).
    mkdir -p "$T/immutable"
    chattr +i "$T/immutable" || fail "misconf: chattr +i failed (needs root and ext4/xfs)"
    rc config set dir "$T/immutable" | grep -q OK || fail "misconf: CONFIG SET dir refused"
    rc config set save "3600 1" >/dev/null
    rc bgsave >/dev/null || true
    local i
    for ((i = 0; i < 100; i++)); do
      rc info persistence | grep -q 'rdb_last_bgsave_status:err' && return 0
      sleep 0.05
    done
    fail "misconf: BGSAVE did not fail" ;;
  noperm) rc acl setuser default -xadd -set >/dev/null ;;
  dropped)
    # Every connection of the shards is killed, again and again, for 2 s.
    ( for ((i = 0; i < 40; i++)); do rc client kill type normal >/dev/null 2>&1 || true; sleep 0.05; done ) &
    DROPPER=$! ;;
  paused) kill -STOP "$PID_redis" ;;
  esac
}
heal() {
  case $1 in
  noreplicas) rc config set min-replicas-to-write 0 >/dev/null ;;
  oom) rc config set maxmemory 0 >/dev/null ;;
  readonly) rc replicaof no one >/dev/null ;;
  misconf)
    chattr -i "$T/immutable"
    rc config set dir "$T" >/dev/null
    rc bgsave >/dev/null
    local i
    for ((i = 0; i < 200; i++)); do
      rc info persistence | grep -q 'rdb_last_bgsave_status:ok' && break
      sleep 0.05
    done
    rc config set save "" >/dev/null ;;
  noperm) rc acl setuser default +xadd +set >/dev/null ;;
  dropped) wait "$DROPPER" 2>/dev/null || true ;;
  paused) kill -CONT "$PID_redis" ;;
  esac
}

# What the shard logs once it sees the fault.
seen_pattern() {
  case $1 in
  paused) echo "no answer within" ;;
  dropped) echo "serving on and reconnecting" ;;
  *) echo "not stored" ;;
  esac
}

run_class() {
  local class=$1 conf="$T/$1.conf" hist="$T/$1-history"
  mkdir -p "$hist"
  rc flushall >/dev/null
  write_config "$conf" 2 2 "model.name=mlp" "train.last_step=800" "train.threads=1" \
    "train.log_every=50" "replication.mode=log" "replication.interval_ms=200" \
    "redis.timeout_ms=1000" "cluster.history_dir=$hist" "$(metrics_on 5)"
  start_shards "$class-ps" "$conf" 2
  local v0="PID_${class}_ps0" v1="PID_${class}_ps1"
  local ps0=${!v0} ps1=${!v1}
  start "$class-w0" "$BIN" worker --config "$conf" --index 0
  local w0=$!
  start "$class-w1" "$BIN" worker --config "$conf" --index 1
  local w1=$!
  wait_steps "$conf" 0 150 60
  inject "$class"
  # The first shard to meet the fault: a fault that begins between the two
  # shards' entries of one step leaves the other with nothing to write (the
  # workers wait for the first one's ack).
  wait_for_any "$(seen_pattern "$class")" 20 "$T/$class-ps0.log" "$T/$class-ps1.log"
  local k=$WHICH
  # Inside the fault: the shard holds what Redis does not have.  Kill it.
  local acked_before victim
  acked_before=$(cat "$hist"/worker-*.history | grep -c "^ack $k " || true)
  victim=$([ "$k" = 0 ] && echo "$ps0" || echo "$ps1")
  kill -9 "$victim"
  wait "$victim" 2>/dev/null || true
  heal "$class"
  start "$class-psb" "$BIN" ps --config "$conf" --index "$k"
  if [ "$k" = 0 ]; then ps0=$!; else ps1=$!; fi
  wait_up "$class-psb" 20
  # Training goes on: worker 0 steps on within the deadline (or it ended).
  local steps now i
  steps=$(metric "$conf" worker 0 paramserv_worker_steps_total)
  for ((i = 0; i < 400; i++)); do
    now=$(metric "$conf" worker 0 paramserv_worker_steps_total)
    [ -n "$now" ] && [ "$now" -gt "${steps:-0}" ] && break
    kill -0 "$w0" 2>/dev/null || break
    sleep 0.05
  done
  [ -n "$now" ] && [ "$now" -gt "${steps:-0}" ] || ! kill -0 "$w0" 2>/dev/null ||
    fail "$class: worker 0 made no step within 20 s after the fault ended (steps: ${steps:-none} -> ${now:-none})"
  wait_exit "$w0" 120 || fail "$class: worker 0 exited $?"
  wait_exit "$w1" 120 || fail "$class: worker 1 exited $?"
  kill -TERM "$ps0" "$ps1"
  wait_exit "$ps0" 10 || fail "$class: ps 0 exited $?"
  wait_exit "$ps1" 10 || fail "$class: ps 1 exited $?"
  local verdict
  verdict=$(scripts/check-history "$hist") || fail "$class: $verdict"
  local restored
  restored=$(grep -h -o 'restored from Redis in .*' "$T/$class-psb.log" | sed 's/ (epoch.*//')
  echo "ok: $class: shard $k killed inside the fault with $acked_before acks seen; $restored"
  echo "$verdict" | sed "s/^/ok: $class: /"
}

# Start-up while Redis refuses writes: a shard and a worker wait it out
# (as they wait for an unreachable Redis) instead of exiting.
run_startup() {
  local conf="$T/startup.conf"
  rc flushall >/dev/null
  write_config "$conf" 1 1 "replication.mode=log" "train.last_step=200" "train.threads=1"
  inject noreplicas
  start startup-ps0 "$BIN" ps --config "$conf" --index 0
  local ps0=$!
  wait_for "$T/startup-ps0.log" "waiting for Redis to restore shard 0: .*NOREPLICAS" 10
  start startup-w0 "$BIN" worker --config "$conf" --index 0
  local w0=$!
  wait_for "$T/startup-w0.log" "waiting for Redis .*NOREPLICAS" 10
  kill -0 "$ps0" && kill -0 "$w0" || fail "startup: a process exited while Redis refused writes"
  heal noreplicas
  wait_up startup-ps0 10
  wait_exit "$w0" 60 || fail "startup: worker exited $?"
  kill -TERM "$ps0"
  wait_exit "$ps0" 10 || fail "startup: ps exited $?"
  echo "ok: startup: shard and worker waited while Redis refused writes, then trained to the step limit"
}

CLASSES=("$@")
[ ${#CLASSES[@]} -gt 0 ] || CLASSES=(noreplicas oom readonly misconf noperm dropped paused startup)
for c in "${CLASSES[@]}"; do
  if [ "$c" = startup ]; then run_startup; else run_class "$c"; fi
done
