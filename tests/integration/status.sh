#!/usr/bin/env bash
# `paramserv status` against a real cluster (Redis, chief, 2 shards, 2 workers):
#  - every node up, the lease holder is the chief's pid, a checkpoint shown;
#    --json says the same;
#  - a worker killed with -9 shows down because its heartbeat key expired:
#    the key was written by that process with a TTL of at most 3 x
#    heartbeat_ms, nothing renews it after the kill, and status says down
#    only once the key is gone (the time it took is printed, not asserted);
#  - Redis stopped: exit status 1 and one error line naming the address.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

start_redis
HB=300   # heartbeat_ms: the heartbeat keys live 3 x 300 ms
write_config "$T/c.conf" 2 2 "model.name=mlp" "train.threads=1" "replication.mode=log" \
  "replication.self_init=no" "checkpoint.dir=$T/ckpt" "checkpoint.every_steps=100" \
  "checkpoint.every_secs=0" "chief.lease_ms=1500" "chief.eval_every_steps=0" \
  "chief.log_every_steps=100" "worker.heartbeat_ms=$HB"

status() { "$BIN" status --config "$T/c.conf" "$@"; }
# row ROLE INDEX: that node's line of the table.
row() { status | awk -v r="$1" -v i="$2" '$1 == r && $2 == i'; }

# Before anything ran: every node "never seen", no lease.
out=$(status) || fail "status exited $? on an empty Redis"
[ "$(grep -c 'never seen' <<<"$out")" -eq 5 ] || fail "expected 5 nodes never seen: $out"
grep -q '^chief lease: none$' <<<"$out" || fail "expected no lease: $out"
grep -q "^latest checkpoint: $T/ckpt: not readable here" <<<"$out" ||
  fail "missing checkpoint dir not reported: $out"
echo "ok: empty Redis: 5 nodes never seen, no lease, checkpoint dir not readable here"

start_shards ps "$T/c.conf" 2
start w0 "$BIN" worker --config "$T/c.conf" --index 0
start w1 "$BIN" worker --config "$T/c.conf" --index 1
start chief "$BIN" chief --config "$T/c.conf"
wait_summary "$T/ckpt" "o.get('event') == 'checkpoint'" 20
# Every worker heart-beats after its first step.
# (A status that fails is retried until the deadline, not the end of the
# script: set -e would end it at the first failing $(...).)
for ((i = 0; i < 100; i++)); do
  out=$(status) || out=""
  [ "$(awk '($1 == "ps" || $1 == "worker") && $3 == "up"' <<<"$out" | wc -l)" -eq 4 ] && break
  sleep 0.1
done
echo "$out"
[ "$(awk '$1 == "ps" && $3 == "up"' <<<"$out" | wc -l)" -eq 2 ] || fail "2 shards not up: $out"
[ "$(awk '$1 == "worker" && $3 == "up"' <<<"$out" | wc -l)" -eq 2 ] || fail "2 workers not up: $out"
awk '$1 == "chief" && $3 == "up"' <<<"$out" | grep -q . || fail "chief not up: $out"
grep -q "^chief lease: token [0-9]*, host [^ ]*, pid $PID_chief, " <<<"$out" ||
  fail "lease holder is not the chief (pid $PID_chief): $(grep 'chief lease' <<<"$out")"
grep -q "^latest checkpoint: $T/ckpt/ckpt-[0-9]*, step [1-9][0-9]*, " <<<"$out" ||
  fail "no checkpoint shown: $(grep 'latest checkpoint' <<<"$out")"
for i in 0 1; do  # ROLE IDX STATE HOST PID INCARNATION AGE STEP STEPS/S VERSION LAG SNAPSHOT
  awk -v i=$i '$1 == "ps" && $2 == i && $10 ~ /^[0-9]+$/ && $11 ~ /^[0-9]+$/ && $12 ~ /^[0-9]+$/' \
    <<<"$out" | grep -q . || fail "shard $i: no version, lag or snapshot version: $out"
done
echo "ok: 2 shards and 2 workers up, lease held by the chief's pid $PID_chief, a checkpoint shown"

status --json >"$T/st.json" || fail "status --json exited $?"
/usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[2]))
up = {(n["role"], n["index"]) for n in j["nodes"] if n["state"] == "up"}
assert up == {("chief", 0), ("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)}, up
assert j["chief_lease"]["pid"] == int(sys.argv[1]), j["chief_lease"]
assert j["checkpoint"]["readable"] and j["checkpoint"]["latest"]["step"] > 0, j["checkpoint"]
assert all(isinstance(n["snapshot_version"], int) for n in j["nodes"] if n["role"] == "ps")
' "$PID_chief" "$T/st.json" || fail "status --json disagrees: $(cat "$T/st.json")"
echo "ok: --json: the same nodes up, lease pid, checkpoint"

# --- a worker killed: down because its heartbeat key expired.  REDIS.md
# §1: a node is up while its heartbeat key lives; the key is written with
# PX 3 x heartbeat_ms by the node itself.  Checked as causes, not as a time:
# before the kill the key is worker 1's (its pid) with a TTL of at most
# 3 x HB; after the kill nothing renews it (its TTL only counts down, the
# pid stays the killed one); status says down only once the key is gone,
# and worker 0 stays up.  The deadline only bounds the wait.
key="{itest}:node:worker:1"
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }
hb=$(rcli get "$key")
ttl=$(rcli pttl "$key")
[[ $hb == "pid $PID_w1 "* ]] || fail "worker 1's heartbeat key $key holds '$hb', expected pid $PID_w1's"
[ "$ttl" -gt 0 ] && [ "$ttl" -le $((3 * HB)) ] ||
  fail "worker 1's heartbeat key has a TTL of $ttl ms, expected 1..$((3 * HB)) ms (PX 3 x heartbeat_ms)"
t0=$(date +%s%N)
{ kill -9 "$PID_w1" && wait "$PID_w1"; } 2>/dev/null || true
prev=$(rcli pttl "$key") || prev=-2
state=""
for ((i = 0; i < 600; i++)); do
  r=$(row worker 1) || r=""
  state=$(awk '{print $3}' <<<"$r")
  if [ "$state" = down ]; then
    [ "$(rcli exists "$key")" = 0 ] || fail "worker 1 shown down while its heartbeat key lives: $(rcli get "$key")"
    break
  fi
  # Still up: the key must be the killed process's, counting down.  The
  # value is read before the TTL: the key may expire between the two reads,
  # and an empty value is then the expiry, not a rewrite.
  v=$(rcli get "$key") || v=""
  [ -z "$v" ] || [[ $v == "pid $PID_w1 "* ]] || fail "worker 1's heartbeat key rewritten after the kill: $v"
  now_ttl=$(rcli pttl "$key") || now_ttl=-2
  if [ "$now_ttl" -gt 0 ]; then
    [ "$prev" -gt 0 ] && [ "$now_ttl" -gt "$prev" ] &&
      fail "worker 1's heartbeat key was renewed after the kill: TTL $prev -> $now_ttl ms, $(rcli get "$key")"
    prev=$now_ttl
  fi
  sleep 0.05
done
[ "$state" = down ] || fail "worker 1 still '$state' 30 s after its kill (heartbeat key TTL $(rcli pttl "$key") ms): $(row worker 1)"
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$(row worker 0 | awk '{print $3}')" = up ] || fail "worker 0 not up: $(row worker 0)"
echo "ok: worker 1 killed with -9: its heartbeat key (TTL $ttl ms of $((3 * HB)) at the kill) not renewed;" \
  "down once the key expired ($ms ms after the kill, information only): $(row worker 1)"

# --- Redis stopped: exit 1, one line naming the address
kill -TERM "$PID_redis"
wait_exit "$PID_redis" 10 || true
set +e
status >"$T/st.out" 2>"$T/st.err"
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "status exited $rc with Redis stopped, expected 1"
if [ "$(wc -l <"$T/st.err")" -ne 1 ] || [ -s "$T/st.out" ]; then
  fail "expected one error line: $(cat "$T/st.out" "$T/st.err")"
fi
grep -q "redis 127.0.0.1:$REDIS_PORT .*unreachable" "$T/st.err" || fail "$(cat "$T/st.err")"
echo "ok: Redis stopped: exit 1, $(cat "$T/st.err")"
