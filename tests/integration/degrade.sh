#!/usr/bin/env bash
# on_redis_failure = degrade (REDIS.md §9): while Redis refuses writes the
# shard trains on and acknowledges, counting every update acknowledged
# without being durable; the count shows in `paramserv status`, in the
# next snapshot's meta, and is carried on by the next incarnation.  Once a
# snapshot after the fault switched, a kill -9 loses nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
start_redis
rc() { redis-cli -p "$REDIS_PORT" "$@"; }
hist="$T/history"
mkdir -p "$hist"
write_config "$T/c.conf" 1 1 "model.name=mlp" "train.last_step=2500" "train.threads=1" \
  "train.log_every=50" "replication.mode=log" "replication.on_redis_failure=degrade" \
  "redis.timeout_ms=1000" "cluster.history_dir=$hist" "$(metrics_on 3)"
acks() { cat "$hist"/worker-*.history 2>/dev/null | grep -c '^ack ' || true; }
start ps0 "$BIN" ps --config "$T/c.conf" --index 0
wait_up ps0 10
start w0 "$BIN" worker --config "$T/c.conf" --index 0
wait_steps "$T/c.conf" 0 300 60

rc config set min-replicas-to-write 1 >/dev/null
wait_for "$T/ps0.log" "not stored: NOREPLICAS.*acknowledging without it" 20
a=$(acks)
# Training goes on inside the fault: 100 more acks while Redis refuses.
for ((i = 0; i < 600; i++)); do [ "$(acks)" -ge $((a + 100)) ] && break; sleep 0.05; done
b=$(acks)
[ "$b" -ge $((a + 100)) ] || fail "degrade: $((b - a)) acks in 30 s while Redis refused writes: training stalled"
rc config set min-replicas-to-write 0 >/dev/null
echo "ok: degrade: $((b - a))+ pushes acknowledged while Redis refused writes (NOREPLICAS): training did not stall"

# Once Redis takes writes again: the count in a switched snapshot's meta and
# in paramserv status.
for ((i = 0; i < 200; i++)); do
  m=$(rc hget '{itest:ps:0}:meta' nondurable || true)
  [ -n "$m" ] && [ "$m" -gt 0 ] && break
  sleep 0.05
done
[ -n "$m" ] && [ "$m" -gt 0 ] || fail "degrade: the meta's nondurable is '$m' after the fault"
for ((i = 0; i < 100; i++)); do
  s=$("$BIN" status --config "$T/c.conf" --json | /usr/bin/python3 -c \
      'import json,sys; n=[x for x in json.load(sys.stdin)["nodes"] if x["role"]=="ps"][0]; print(n.get("nondurable") or 0)' ||
      echo 0)
  [ "$s" -gt 0 ] && break
  sleep 0.1
done
[ "$s" -gt 0 ] || fail "degrade: paramserv status shows nondurable $s"
echo "ok: degrade: the snapshot's meta says nondurable $m, paramserv status --json says $s"

# A kill after the fault loses nothing; the next incarnation carries the
# count: it reports exactly the count of the meta it restored from (the dead
# shard's last switched snapshot, read while nothing writes it), which is
# at least the one seen above, and its own snapshots keep it.
kill -9 "$PID_ps0"
wait "$PID_ps0" 2>/dev/null || true
mk=$(rc hget '{itest:ps:0}:meta' nondurable)
[[ $mk =~ ^[0-9]+$ ]] && [ "$mk" -ge "$m" ] || fail "degrade: the meta's nondurable after the kill is '$mk', was $m"
start ps0b "$BIN" ps --config "$T/c.conf" --index 0
wait_up ps0b 20
wait_for "$T/ps0b.log" "updates of this run were acknowledged without being durable" 5
carried=$(sed -n 's/.*restore: \([0-9]*\) updates of this run were acknowledged without being durable.*/\1/p' \
  "$T/ps0b.log")
[ "$carried" = "$mk" ] || fail "degrade: the next incarnation carried '$carried' nondurable updates, its meta said $mk"
e=$(sed -n 's/^.*restored from Redis.*(epoch \([0-9]*\)).*$/\1/p' "$T/ps0b.log" | head -1)
[[ $e =~ ^[0-9]+$ ]] || fail "degrade: no epoch in the next incarnation's restore line"
for ((i = 0; i < 200; i++)); do
  [ "$(rc hget '{itest:ps:0}:meta' epoch || true)" = "$e" ] && break
  sleep 0.05
done
[ "$(rc hget '{itest:ps:0}:meta' epoch)" = "$e" ] || fail "degrade: the next incarnation (epoch $e) switched no snapshot"
m2=$(rc hget '{itest:ps:0}:meta' nondurable)
[[ $m2 =~ ^[0-9]+$ ]] && [ "$m2" -ge "$carried" ] ||
  fail "degrade: the next incarnation's snapshot says nondurable '$m2', it restored $carried"
echo "ok: degrade: the next incarnation carried nondurable $carried (its meta's at the kill, >= $m); its own snapshot says $m2"
wait_exit "$PID_w0" 120 || fail "worker 0 exited $?"
kill -TERM "$PID_ps0b"
wait_exit "$PID_ps0b" 10 || fail "ps 0 exited $?"
verdict=$(scripts/check-history "$hist") || fail "degrade, kill after the fault: $verdict"
echo "ok: degrade: killed after the fault: $(grep -o 'restore: [0-9]* updates of this run.*' "$T/ps0b.log" | cut -c1-90)"
echo "$verdict" | sed 's/^/ok: degrade: /'
