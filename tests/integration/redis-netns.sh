#!/usr/bin/env bash
# Redis unreachable without an error (DESIGN.md's fault model: a silent
# network drop).  redis-server runs in its own network namespace behind a
# veth pair on a private /24; 2 shards and 2 workers in the root namespace
# reach it through the link (replication = log, on_redis_failure = block,
# [redis] timeout_ms = 1000).  Then every packet on the link is dropped
# both ways (a blackhole qdisc on each end: no RST, no ICMP).  Shard 0
# must notice it through its [redis] timeout_ms deadlines (the line it
# logs after the drop names one: no RST, no error, only a timer can tell)
# and hold its acknowledgements; it is killed with -9 inside the drop;
# the link heals; shard 0 comes back.  The time to notice is printed, not
# asserted.
# From the histories (scripts/check-history): nothing acknowledged lost,
# nothing applied twice; training goes on to its step limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

[ "$(id -u)" = 0 ] || skip "not root (ip netns needs CAP_SYS_ADMIN)"
NS="pst$$"
VA="psa$$"
VB="psb$$"
netns_cleanup() {
  ip link del "$VA" 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
}
trap 'cleanup; netns_cleanup' EXIT
ip netns add "$NS" 2>/dev/null || skip "ip netns add failed (no network namespace support)"
# A /24 that no interface here uses.
for ((i = 0; i < 50; i++)); do
  NET="10.$((200 + RANDOM % 50)).$((RANDOM % 250))"
  ip -4 addr | grep -q " $NET\." || break
done
ip link add "$VA" type veth peer name "$VB"
ip link set "$VB" netns "$NS"
ip addr add "$NET.1/24" dev "$VA"
ip link set "$VA" up
ip netns exec "$NS" ip addr add "$NET.2/24" dev "$VB"
ip netns exec "$NS" ip link set "$VB" up
ip netns exec "$NS" ip link set lo up
tc qdisc add dev "$VA" root blackhole 2>/dev/null && tc qdisc del dev "$VA" root ||
  skip "tc has no blackhole qdisc here"

RPORT=$(free_ports 1)
start redis ip netns exec "$NS" redis-server --port "$RPORT" --bind "$NET.2" --protected-mode no --save "" \
  --appendonly no --dir "$T" --logfile "" --daemonize no
rc() { redis-cli -h "$NET.2" -p "$RPORT" "$@"; }
for ((i = 0; i < 200; i++)); do rc ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
rc ping | grep -q PONG || fail "redis-server in namespace $NS did not answer at $NET.2:$RPORT"

hist="$T/history"
mkdir -p "$hist"
TIMEOUT_MS=1000
write_config "$T/c.conf" 2 2 "model.name=mlp" "train.last_step=2400" "train.threads=1" \
  "train.log_every=50" "replication.mode=log" "replication.interval_ms=200" \
  "redis.timeout_ms=$TIMEOUT_MS" "redis.address=$NET.2:$RPORT" "cluster.history_dir=$hist" \
  "$(metrics_on 5)"
start ps0 "$BIN" ps --config "$T/c.conf" --index 0
start ps1 "$BIN" ps --config "$T/c.conf" --index 1
wait_up ps0 10
wait_up ps1 10
start w0 "$BIN" worker --config "$T/c.conf" --index 0
start w1 "$BIN" worker --config "$T/c.conf" --index 1
wait_steps "$T/c.conf" 0 300 60
acks0() { cat "$hist"/worker-*.history | grep -c '^ack 0 ' || true; }

# The drop: every packet on the link, both ways, silently.  Only the lines
# shard 0 writes after it count.
n0=$(wc -l <"$T/ps0.log")
tc qdisc add dev "$VA" root blackhole
ip netns exec "$NS" tc qdisc add dev "$VB" root blackhole
t0=$(date +%s%N)
# first_notice: shard 0's first "...; serving on and reconnecting" line
# written after the drop began ("" while none).
first_notice() {
  awk -v n="$n0" 'NR > n && match($0, /redis [^ ]*: [^;]*; serving on and reconnecting/) {
    print substr($0, RSTART, RLENGTH); exit }' "$T/ps0.log"
}
seen=""
for ((i = 0; i < 1200; i++)); do
  seen=$(first_notice)
  [ -n "$seen" ] && break
  sleep 0.025
done
[ -n "$seen" ] || fail "shard 0 did not notice the drop within 30 s"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
# The cause: one of the two deadlines of [redis] timeout_ms fired
# (REDIS.md §8): the shard's own ("no answer within TIMEOUT_MS ms"), or the
# socket's TCP_USER_TIMEOUT of the same length (the kernel's ETIMEDOUT,
# "Connection timed out"); not a reset, an error or a closed connection,
# which a silent drop never sends, and no other timer.
case $seen in
  "redis $NET.2:$RPORT: no answer within $TIMEOUT_MS ms ([redis] timeout_ms); serving on and reconnecting") ;;
  "redis $NET.2:$RPORT: Connection timed out; serving on and reconnecting") ;;
  *) fail "shard 0 noticed the drop by something else than its $TIMEOUT_MS ms deadlines: \"$seen\"" ;;
esac
# Held: no acknowledgement of shard 0 for the next second.
a1=$(acks0)
sleep 1
a2=$(acks0)
[ "$a2" -eq "$a1" ] || fail "shard 0 acknowledged $((a2 - a1)) pushes during the drop"
echo "ok: drop: shard 0 noticed it by its deadline: \"$seen\" ($ms ms after the drop, information only); acks of shard 0 held: $a1 before, $a2 a second later"
kill -9 "$PID_ps0"
wait "$PID_ps0" 2>/dev/null || true
tc qdisc del dev "$VA" root
ip netns exec "$NS" tc qdisc del dev "$VB" root
start ps0b "$BIN" ps --config "$T/c.conf" --index 0
wait_metric "$T/c.conf" ps 0 "m['paramserv_ps_restores_total'] == 1" 20
restored=$(grep -h -o 'restored from Redis in .*' "$T/ps0b.log" | sed 's/ (epoch.*//')
echo "ok: shard 0 killed inside the drop; link healed; $restored"
wait_exit "$PID_w0" 120 || fail "worker 0 exited $?"
wait_exit "$PID_w1" 120 || fail "worker 1 exited $?"
kill -TERM "$PID_ps0b" "$PID_ps1"
wait_exit "$PID_ps0b" 10 || fail "ps 0 exited $?"
wait_exit "$PID_ps1" 10 || fail "ps 1 exited $?"
verdict=$(scripts/check-history "$hist") || fail "$verdict"
echo "ok: training reached step limit 2400: $(grep -o 'final test_acc [0-9.]*' "$T/w0.log")"
echo "$verdict" | sed 's/^/ok: /'
