#!/usr/bin/env bash
# Bounded Redis memory (REDIS.md §1, §6, §7): a shard killed with -9 ten
# times while a snapshot is being written -- Redis lists a snapshot in
# {C:ps:0}:snaps that the meta does not name -- and started again each
# time, two workers training throughout.  At the end Redis holds exactly
# the live snapshot's chunks and the live log of that shard: chunk keys =
# the meta's `chunks`, all of the meta's snapshot; one log stream, the
# one the log key names; one field in :snaps, the meta's snapshot.  The
# same after a clean stop.  And from the histories: nothing acknowledged
# lost, nothing applied twice.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
start_redis
rc() { redis-cli -p "$REDIS_PORT" "$@"; }

KILLS=10
hist="$T/history"
mkdir -p "$hist"
# mlp 784-1024-512-10 with Adam: 1.3 M floats in shard 0, an image of
# 4 M floats in 16 chunks (16 MB) per snapshot.  Each restart replays the
# log since the last snapshot that switched, 5 MB a push (2048,1024: 15 MB,
# and the test took 3.6 times as long).
write_config "$T/c.conf" 1 2 "model.name=mlp" "model.hidden=1024,512" "train.batch=16" \
  "train.last_step=1000000" "train.threads=1" "train.log_every=10" "replication.mode=log" \
  "replication.interval_ms=100" "cluster.history_dir=$hist" "$(metrics_on 4)"
P='{itest:ps:0}'
# meta's snapshot id, and the registered ids that are not it ("a,b", or -).
PROBE='local m = redis.call("HGET", KEYS[1], "snap")
local other = {}
for _, id in ipairs(redis.call("HKEYS", KEYS[2])) do if id ~= m then other[#other + 1] = id end end
table.sort(other)
return {m or "-", #other > 0 and table.concat(other, ",") or "-"}'
probe() { rc eval "$PROBE" 2 "$P:meta" "$P:snaps" | paste -sd' '; }
# new_ids IDS: the ids in IDS (a,b or -) that are not in $left, the ones a
# killed incarnation left registered (a restarted shard deletes them only
# at its first switch).
new_ids() {
  local id out=""
  for id in ${1//,/ }; do
    [ "$id" = - ] && continue
    case ",$left," in *",$id,"*) ;; *) out+="${out:+,}$id" ;; esac
  done
  echo "$out"
}
used_memory() { rc info memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p'; }
shard_keys() { rc --scan --pattern "$P:*" | sort; }

# What Redis holds of shard 0, read in one script (atomic: a snapshot
# being written cannot register, store or switch between two reads):
# "SNAP CHUNKS NCHUNK NFOREIGN NLOG LOGKEY_LISTED SNAPS LOGKEY".
STATE='local p = ARGV[1]
local snap = redis.call("HGET", p .. ":meta", "snap") or "-"
local chunks = redis.call("HGET", p .. ":meta", "chunks") or "-"
local nchunk, nforeign = 0, 0
for _, k in ipairs(redis.call("KEYS", p .. ":snap:*")) do
  nchunk = nchunk + 1
  if string.sub(k, 1, #p + #snap + 7) ~= p .. ":snap:" .. snap .. ":" then nforeign = nforeign + 1 end
end
local logkey = redis.call("GET", p .. ":logkey") or "-"
local nlog, listed = 0, 0
for _, k in ipairs(redis.call("KEYS", p .. ":log:*")) do
  nlog = nlog + 1
  if k == logkey then listed = 1 end
end
local snaps = table.concat(redis.call("HKEYS", p .. ":snaps"), ",")
return table.concat({snap, chunks, nchunk, nforeign, nlog, listed, snaps ~= "" and snaps or "-", logkey}, " ")'

# check_bounded WHEN: the shard's keys are the live snapshot and log only.
# A live shard may be switching a last snapshot in: the state is read
# again until it is bounded or 10 s have passed (what a killed
# incarnation left behind would stay).
check_bounded() {
  local when=$1 snap chunks nchunk nforeign nlog listed snaps logkey i
  for ((i = 0; i < 200; i++)); do
    read -r snap chunks nchunk nforeign nlog listed snaps logkey <<<"$(rc eval "$STATE" 0 "$P")"
    [ "$snap" != - ] && [ "$nchunk" = "$chunks" ] && [ "$nforeign" = 0 ] && [ "$nlog" = 1 ] &&
      [ "$listed" = 1 ] && [ "$snaps" = "$snap" ] && break
    sleep 0.05
  done
  [ "$snap" != - ] && [ "$chunks" != - ] || fail "$when: no meta"
  [ "$nchunk" = "$chunks" ] && [ "$nforeign" = 0 ] ||
    fail "$when: $nchunk snapshot chunk keys ($nforeign of other snapshots), the meta's snapshot $snap has $chunks"
  [ "$nlog" = 1 ] && [ "$listed" = 1 ] ||
    fail "$when: $nlog log streams ($(rc --scan --pattern "$P:log:*" | paste -sd' ')), the log key names $logkey"
  [ "$snaps" = "$snap" ] || fail "$when: :snaps lists $snaps, the meta names $snap"
  echo "ok: $when: $(shard_keys | wc -l) keys of shard 0: $nchunk chunks = meta chunks $chunks, all of snapshot $snap; 1 log stream ($logkey, $(rc xlen "$logkey") entries); :snaps = {$snaps}; used_memory $(used_memory) bytes"
}

start ps0_0 "$BIN" ps --config "$T/c.conf" --index 0
pid=$!
wait_up ps0_0 30
start w0 "$BIN" worker --config "$T/c.conf" --index 0
start w1 "$BIN" worker --config "$T/c.conf" --index 1
wait_steps "$T/c.conf" 0 10 60
before=$(used_memory)
mid=0
left=""
for ((k = 1; k <= KILLS; k++)); do
  # Mid-snapshot: a snapshot this incarnation registered that the meta does
  # not name (not one a killed one left).  Once one is seen the shard is
  # paused (it cannot switch or clean up while stopped) and looked at
  # again; killed only if its snapshot is still being written.
  found=""
  for ((i = 0; i < 2000; i++)); do
    m="" ids=""
    read -r m ids <<<"$(probe)" || true
    if [ -n "$(new_ids "$ids")" ]; then
      kill -STOP "$pid"
      read -r m ids <<<"$(probe)" || true
      if [ -n "$(new_ids "$ids")" ]; then found=1; break; fi
      kill -CONT "$pid"
    fi
    sleep 0.005
  done
  [ -n "$found" ] || fail "kill $k: no snapshot being written within 10 s"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  # Every kill leaves a snapshot of its own that never switched.
  m="" ids=""
  read -r m ids <<<"$(probe)" || true
  fresh=$(new_ids "$ids")
  [ -n "$fresh" ] ||
    fail "kill $k: not mid-snapshot: after the kill :snaps lists ${ids:-nothing} besides the meta's ${m:-?}, none registered by the killed shard (left before it: ${left:-none})"
  mid=$((mid + 1))
  left=$ids
  start "ps0_$k" "$BIN" ps --config "$T/c.conf" --index 0
  pid=$!
  wait_up "ps0_$k" 30
done
[ "$mid" = "$KILLS" ] || fail "$mid of $KILLS kills were mid-snapshot"
echo "ok: $KILLS kills of shard 0, each while a snapshot was written: each left one registered in :snaps that the meta does not name; used_memory $before bytes before the kills"
# Training goes on.
wait_more_steps "$T/c.conf" 0 10 30
# A clean stop while the workers push: the shard writes a last snapshot
# (its version is newer than the meta's) and cleans up after it.
kill -TERM "$pid"
wait_exit "$pid" 30 || fail "ps 0 exited $? after SIGTERM"
grep -q "stopping at version" "$T/ps0_$KILLS.log" || fail "no clean stop in the shard's log"
check_bounded "after a clean stop at version $(rc hget "$P:meta" version)"
start ps0_last "$BIN" ps --config "$T/c.conf" --index 0
pid=$!
wait_up ps0_last 30
wait_more_steps "$T/c.conf" 0 10 30
kill -TERM "$PID_w0" "$PID_w1"
wait_exit "$PID_w0" 60 || fail "worker 0 exited $?"
wait_exit "$PID_w1" 60 || fail "worker 1 exited $?"
# The shard idle: its last snapshot switched and was cleaned up after.
check_bounded "live shard, idle, after $KILLS kills"
kill -TERM "$pid"
wait_exit "$pid" 30 || fail "ps 0 exited $? after SIGTERM"
verdict=$(scripts/check-history "$hist") || fail "$verdict"
echo "$verdict" | sed 's/^/ok: /'
