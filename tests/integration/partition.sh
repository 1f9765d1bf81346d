#!/usr/bin/env bash
# A shard partitioned from Redis but reachable by its workers, and its
# replacement on another host (scripts/hosts: 5 hosts on a bridge).
#   h1 redis-server; h2 shard 0 (A) on the shard's service address X;
#   h3 the spare host; h4, h5 workers 0 and 1 (replication log, block).
# The timeline:
#   1. cut h2 from h1: A keeps its workers but loses Redis; it must
#      acknowledge nothing that is not durable (the workers' acks of shard
#      0 stop while they keep pushing);
#   2. B starts on h3 for shard 0 (bound to X, not yet its own): it restores
#      the durable state from Redis and takes the shard's epoch: from now on
#      Redis fences A;
#   3. X moves from h2 to h3 (as a floating address would); the workers
#      reconnect to B at X and re-send their unacknowledged pushes;
#   4. the cut heals: A reaches Redis, is fenced out and exits 1; started
#      again on h2 (as systemd would), it finds X gone and stops before it
#      touches Redis: it cannot fence B.
# From the histories (scripts/check-history): nothing acknowledged lost,
# nothing applied twice; the workers reach their step limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

hosts_up pt 5
BIN=$(realpath "$BIN")
net=$($H ip 1)
net=${net%.*}
X="$net.100"                    # shard 0's service address, on h2 then h3
$H exec 2 ip addr add "$X/24" dev eth0
$H exec 3 sysctl -qw net.ipv4.ip_nonlocal_bind=1   # B binds X before X is its own

start redis $H exec 1 redis-server --port 6379 --bind 0.0.0.0 --protected-mode no --save "" \
  --appendonly no --dir "$T" --logfile ""
for ((i = 0; i < 200; i++)); do redis-cli -h "$($H ip 1)" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done

hist="$T/history"
mkdir -p "$hist"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/secret"
chmod 600 "$T/secret"
cat >"$T/c.conf" <<EOF
[cluster]
id = ptest
secret_file = secret
chief = $($H ip 3):7070
ps = $X:7000
workers = $($H ip 4):7100, $($H ip 5):7101
history_dir = $hist
peer_timeout_ms = 2000
[redis]
address = $($H ip 1):6379
timeout_ms = 1000
[model]
name = mlp
[train]
last_step = 2500
threads = 1
log_every = 50
[replication]
mode = log
interval_ms = 200
self_init = yes
EOF
acks0() { cat "$hist"/worker-*.history 2>/dev/null | grep -c '^ack 0 ' || true; }
now() { date +%s.%N | cut -c1-14; }
t_start=$(now)
at() { awk -v a="$1" -v b="$t_start" 'BEGIN { printf "%.1f s", a - b }'; }

start psA $H exec 2 "$BIN" ps --config "$T/c.conf" --index 0
wait_tcp "$X" 7000 10
start w0 $H exec 4 "$BIN" worker --config "$T/c.conf" --index 0
start w1 $H exec 5 "$BIN" worker --config "$T/c.conf" --index 1
wait_count "$hist/worker-0.history" '^ack 0 ' 300 60

# 1. A loses Redis, keeps its workers.
$H cut 2 1
t_cut=$(now)
wait_for "$T/psA.log" "no answer within\|serving on and reconnecting" 10
t_noticed=$(now)
a1=$(acks0)
sleep 2
a2=$(acks0)
[ "$a2" -le $((a1 + 2)) ] || fail "A acknowledged $((a2 - a1)) pushes while cut from Redis"
grep -q "holding acknowledgements" "$T/psA.log" || fail "A did not say it holds acknowledgements"

# 2. B takes the shard's epoch in Redis.
epoch=$(redis-cli -h "$($H ip 1)" get "{ptest:ps:0}:epoch")
start psB $H exec 3 "$BIN" ps --config "$T/c.conf" --index 0
# B listens, then takes the shard's epoch in Redis as it restores.
for ((i = 0; i < 400; i++)); do
  [ "$(redis-cli -h "$($H ip 1)" get "{ptest:ps:0}:epoch")" != "$epoch" ] && break
  sleep 0.05
done
[ "$(redis-cli -h "$($H ip 1)" get "{ptest:ps:0}:epoch")" != "$epoch" ] ||
  fail "B took no epoch within 20 s: $(tail -2 "$T/psB.log")"
t_b=$(now)
# Restored, B serves (its READY=1), though no worker reaches it until X moves.
wait_serving psB 20
restored=$(grep -o "restored from Redis[^(]*" "$T/psB.log" | head -1) || true
[ "$(acks0)" -le $((a1 + 2)) ] || fail "A acknowledged pushes after B took the epoch"

# 3. X moves to h3; the workers find B there.
$H exec 2 ip addr del "$X/24" dev eth0
$H exec 3 ip addr add "$X/24" dev eth0
for h in 4 5; do $H exec "$h" ip neigh flush all; done
t_moved=$(now)
for ((i = 0; i < 600; i++)); do [ "$(acks0)" -gt $((a2 + 20)) ] && break; sleep 0.05; done
[ "$(acks0)" -gt $((a2 + 20)) ] || fail "no acknowledgements from B 30 s after the address moved"
t_acks=$(now)

# 4. The cut heals: Redis fences A.
$H heal
wait_exit "$PID_psA" 30 && fail "A exited 0 after the heal, expected 1 (fenced)" || st=$?
[ "${st:-0}" = 1 ] || fail "A exited ${st:-?} after the heal, expected 1 (fenced)"
t_fenced=$(now)
grep -q "fenced out" "$T/psA.log" || fail "A did not say it was fenced out"

# A started again on h2, which no longer holds X: it stops before it
# touches Redis, so it cannot fence B (as systemd restarting it would).
epoch=$(redis-cli -h "$($H ip 1)" get "{ptest:ps:0}:epoch")
start psA2 $H exec 2 "$BIN" ps --config "$T/c.conf" --index 0
wait_exit "$PID_psA2" 20 && fail "A started again on h2 exited 0, expected 1" || st=$?
[ "$st" = 1 ] || fail "A started again on h2 exited $st, expected 1"
grep -q "does not hold the address" "$T/psA2.log" || fail "A started again: $(tail -1 "$T/psA2.log")"
[ "$(redis-cli -h "$($H ip 1)" get "{ptest:ps:0}:epoch")" = "$epoch" ] ||
  fail "A started again on h2 took the epoch from B"

wait_exit "$PID_w0" 120 || fail "worker 0 exited $?"
wait_exit "$PID_w1" 120 || fail "worker 1 exited $?"
kill -TERM "$PID_psB"
wait_exit "$PID_psB" 10 || fail "B exited $?"
verdict=$(scripts/check-history "$hist") || fail "partition: $verdict"
echo "ok: $(at "$t_cut") cut h2 (A) from h1 (Redis); A noticed at $(at "$t_noticed") and acknowledged nothing more ($a1 acks of shard 0, $a2 two seconds later)"
echo "ok: $(at "$t_b") B on h3 took shard 0's epoch: ${restored% }"
echo "ok: $(at "$t_moved") $X moved to h3; acks from B again at $(at "$t_acks")"
echo "ok: $(at "$t_fenced") healed: A fenced out by Redis, exit status 1: $(grep -o 'fenced out by Redis: [^;]*' "$T/psA.log" | head -1 | cut -c1-70)"
echo "ok: A started again on h2 (no longer holding $X): exit 1 before touching Redis, B's epoch kept"
echo "$verdict" | sed 's/^/ok: partition: /'
