#!/usr/bin/env bash
# Redis that survives losing a node (REDIS.md, "Sentinel"): a primary, a
# replica and three Sentinels (Debian's redis-server and redis-sentinel);
# 2 shards and 2 workers find the primary through the Sentinels
# ([redis] sentinels, master_name), replication log, redis_replicas auto
# (= 1: an entry is acknowledged once the replica holds it too, WAIT).
# The primary is killed with -9 mid-training: the Sentinels promote the
# replica; the shards hold their acknowledgements (the new primary has no
# replica for WAIT) until the old primary is back, as a replica now; they
# follow the failover by themselves.  From the histories
# (scripts/check-history): nothing acknowledged lost, nothing applied
# twice; training reaches its step limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
command -v redis-sentinel >/dev/null || fail "redis-sentinel is not installed (make deps)"

read -r PP RP S1 S2 S3 <<<"$(free_ports 5)"
server() {  # server NAME PORT [ARGS...]
  local name=$1 port=$2
  shift 2
  start "$name" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$T" --dbfilename "$name.rdb" --logfile "" --repl-diskless-sync-delay 0 "$@"
}
rc() { redis-cli -p "$1" "${@:2}"; }
up() { for ((i = 0; i < 200; i++)); do rc "$1" ping 2>/dev/null | grep -q PONG && return 0; sleep 0.05; done; fail "redis on $1 did not answer"; }
server primary "$PP"
up "$PP"
server replica "$RP" --replicaof 127.0.0.1 "$PP"
up "$RP"
for s in $S1 $S2 $S3; do
  cat >"$T/sentinel-$s.conf" <<EOF
port $s
bind 127.0.0.1
dir $T
sentinel monitor paramserv 127.0.0.1 $PP 2
sentinel down-after-milliseconds paramserv 1000
sentinel failover-timeout paramserv 4000
sentinel parallel-syncs paramserv 1
EOF
  start "sentinel$s" redis-sentinel "$T/sentinel-$s.conf" --logfile ""
done
primary() { rc "$S1" sentinel get-master-addr-by-name paramserv 2>/dev/null | tail -1; }
for ((i = 0; i < 200; i++)); do
  [ "$(rc "$S1" sentinel replicas paramserv 2>/dev/null | grep -c "^127.0.0.1:$RP$" || true)" -ge 1 ] &&
    [ "$(rc "$S3" sentinel sentinels paramserv 2>/dev/null | grep -c '^name$' || true)" -ge 2 ] && break
  sleep 0.05
done
[ "$(primary)" = "$PP" ] || fail "the Sentinels do not name the primary on $PP"

hist="$T/history"
mkdir -p "$hist"
write_config "$T/c.conf" 2 2 "model.name=mlp" "train.last_step=1500" "train.threads=1" \
  "train.log_every=50" "replication.mode=log" "replication.interval_ms=200" \
  "redis.timeout_ms=1000" "redis.sentinels=127.0.0.1:$S1, 127.0.0.1:$S2, 127.0.0.1:$S3" \
  "redis.master_name=paramserv" "cluster.history_dir=$hist" "$(metrics_on 5)"
start_shards ps "$T/c.conf" 2
start w0 "$BIN" worker --config "$T/c.conf" --index 0
start w1 "$BIN" worker --config "$T/c.conf" --index 1
wait_steps "$T/c.conf" 0 300 60
acks() { cat "$hist"/worker-*.history 2>/dev/null | grep -c '^ack ' || true; }
before=$(acks)

# kill -9 of the primary; the Sentinels fail over to the replica.
kill -9 "$PID_primary"
t0=$(date +%s%N)
for ((i = 0; i < 400; i++)); do [ "$(primary)" = "$RP" ] && break; sleep 0.05; done
[ "$(primary)" = "$RP" ] || fail "no failover to $RP within 20 s"
failover_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
# The new primary has no replica: no entry reaches WAIT's count, so the
# shards hold their acknowledgements.
held=$(acks)
sleep 1
[ "$(acks)" -le $((held + 4)) ] || fail "acknowledged $(($(acks) - held)) pushes with no Redis replica"
# The old primary comes back as a replica of the one the Sentinels name (as
# the runbook's unit starts a Redis node), and acknowledgements go out again.
server primary2 "$PP" --replicaof 127.0.0.1 "$(primary)"
for ((i = 0; i < 400; i++)); do [ "$(acks)" -gt $((held + 20)) ] && break; sleep 0.05; done
[ "$(acks)" -gt $((held + 20)) ] || fail "no acknowledgements 20 s after the old primary came back"
resumed_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
rc "$PP" role | head -1 | grep -q slave || fail "the old primary did not come back as a replica"
grep -q "the Sentinels name 127.0.0.1:$RP as the primary" "$T/ps0.log" ||
  fail "shard 0 did not follow the failover"
st=$("$BIN" status --config "$T/c.conf") || fail "paramserv status failed: $st"
grep -q "^redis: primary 127.0.0.1:$RP, named by the Sentinels" <<<"$st" ||
  fail "paramserv status does not name the new primary: $st"

wait_exit "$PID_w0" 120 || fail "worker 0 exited $?"
wait_exit "$PID_w1" 120 || fail "worker 1 exited $?"
stop_shards ps 2
verdict=$(scripts/check-history "$hist") || fail "sentinel failover: $verdict"
echo "ok: kill -9 of the Redis primary after $before acks: the Sentinels promoted the replica in $failover_ms ms; the shards held their acks (no replica for WAIT) until the old primary was back as a replica, acks again $resumed_ms ms after the kill; both workers reached step 1500"
echo "ok: paramserv status after the failover: $(grep '^redis:' <<<"$st")"
echo "$verdict" | sed 's/^/ok: sentinel: /'
