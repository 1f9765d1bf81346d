#!/usr/bin/env bash
# A Redis Cluster as the store (REDIS.md, "Redis Cluster"): 3 primaries and
# 3 replicas from Debian's redis-server (--cluster-enabled yes, joined by
# redis-cli --cluster create); 4 shards and 2 workers name three of its
# nodes ([redis] cluster), replication log, redis_replicas auto (= 1: an
# entry is acknowledged once the primary's replica holds it too, WAIT).
# Each shard's keys share its hash tag, so one slot: the shards spread over
# the primaries, and `paramserv status` names each shard's node.
# The primary serving shard 0 is killed with -9 mid-training: the cluster
# promotes its replica; the shards on it follow the failover by themselves
# and hold their acknowledgements (the new primary has no replica for WAIT)
# until the old node is back, as its replica now.  Then shard 1's slot is
# moved to another primary (resharding): the shard waits out ASK and
# TRYAGAIN and follows MOVED; killed with -9, it restores from that node.
# From the histories
# (scripts/check-history): nothing acknowledged lost, nothing applied
# twice; training reaches its step limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
command -v redis-cli >/dev/null || fail "redis-cli is not installed (make deps)"

read -r -a P <<<"$(free_ports 12)"   # 6 nodes' ports, then their cluster bus ports
declare -A BUS=()
for k in 0 1 2 3 4 5; do BUS[${P[k]}]=${P[k + 6]}; done
P=("${P[@]:0:6}")
node() {  # node NAME PORT: one cluster node, its nodes.conf in $T
  start "$1" redis-server --port "$2" --cluster-port "${BUS[$2]}" --bind 127.0.0.1 --save "" \
    --appendonly no --dir "$T" --dbfilename "$1.rdb" --logfile "" --cluster-enabled yes \
    --cluster-config-file "nodes-$2.conf" --cluster-node-timeout 1000 \
    --repl-diskless-sync-delay 0
}
rc() { redis-cli -p "$1" "${@:2}"; }
up() { for ((i = 0; i < 200; i++)); do rc "$1" ping 2>/dev/null | grep -q PONG && return 0; sleep 0.05; done; fail "redis on $1 did not answer"; }
for k in 0 1 2 3 4 5; do node "n${P[k]}" "${P[k]}"; done
for k in 0 1 2 3 4 5; do up "${P[k]}"; done
addrs=()
for k in 0 1 2 3 4 5; do addrs+=("127.0.0.1:${P[k]}"); done
redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$T/create.log" 2>&1 ||
  fail "redis-cli --cluster create failed: $(tail -5 "$T/create.log")"
ok_everywhere() {
  for k in "$@"; do rc "$k" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1; done
}
for ((i = 0; i < 400; i++)); do ok_everywhere "${P[@]}" && break; sleep 0.05; done
ok_everywhere "${P[@]}" || fail "the cluster is not ok within 20 s"
# The primary serving a key's slot, as a node that answers names it.
owner() {  # owner KEY [PORT]
  local slot
  slot=$(rc "${2:-${P[1]}}" cluster keyslot "$1")
  rc "${2:-${P[1]}}" cluster slots | /usr/bin/python3 -c '
import sys
slot, lines = int(sys.argv[1]), sys.stdin.read().split("\n")
# redis-cli prints CLUSTER SLOTS flat: start, end, then host, port, id per node.
i = 0
while i + 4 < len(lines):
    if lines[i].isdigit() and lines[i + 1].isdigit() and int(lines[i]) <= slot <= int(lines[i + 1]):
        print(lines[i + 2] + ":" + lines[i + 3]); break
    i += 1' "$slot"
}
# Every replica has synced before training starts.
for ((i = 0; i < 400; i++)); do
  n=0
  for k in "${P[@]}"; do rc "$k" role | head -1 | grep -q slave && rc "$k" info replication | grep -q 'master_link_status:up' && n=$((n + 1)); done
  [ "$n" -eq 3 ] && break
  sleep 0.05
done
[ "$n" -eq 3 ] || fail "the 3 replicas did not sync within 20 s"

hist="$T/history"
mkdir -p "$hist"
write_config "$T/c.conf" 4 2 "model.name=mlp" "train.last_step=3000" "train.threads=1" \
  "train.log_every=50" "replication.mode=log" "replication.interval_ms=200" \
  "redis.timeout_ms=1000" "redis.cluster=${addrs[0]}, ${addrs[2]}, ${addrs[4]}" \
  "cluster.history_dir=$hist" "$(metrics_on 7)"
start_shards ps "$T/c.conf" 4
start w0 "$BIN" worker --config "$T/c.conf" --index 0
start w1 "$BIN" worker --config "$T/c.conf" --index 1
wait_steps "$T/c.conf" 0 300 60

# Each shard on the primary serving its tag's slot, as status says.
st=$("$BIN" status --config "$T/c.conf") || fail "paramserv status failed: $st"
line=$(grep '^redis cluster' <<<"$st") || fail "paramserv status names no shard's node: $st"
declare -A on=()
for i in 0 1 2 3; do
  want=$(owner "{itest:ps:$i}")
  grep -q "ps $i on $want" <<<"$line" || fail "status does not put ps $i on $want: $line"
  on[$want]=1
done
[ "${#on[@]}" -ge 2 ] || fail "the 4 shards are all on one primary: $line"
acks() { cat "$hist"/worker-*.history 2>/dev/null | grep -c '^ack ' || true; }
before=$(acks)

# kill -9 of the primary serving shard 0; the cluster promotes its replica.
victim=$(owner "{itest:ps:0}")
vport=${victim##*:}
other=${P[0]}
[ "$other" = "$vport" ] && other=${P[2]}
kill -9 "$(eval echo "\$PID_n$vport")"
t0=$(date +%s%N)
for ((i = 0; i < 400; i++)); do
  now=$(owner "{itest:ps:0}" "$other")
  [ -n "$now" ] && [ "$now" != "$victim" ] && break
  sleep 0.05
done
[ -n "$now" ] && [ "$now" != "$victim" ] || fail "no failover of $victim within 20 s"
failover_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
# The new primary has no replica: no entry reaches WAIT's count, so the
# shards on it hold their acknowledgements.
acks0() { cat "$hist"/worker-*.history 2>/dev/null | grep -c '^ack 0 ' || true; }
held=$(acks0)
sleep 1
[ "$(acks0)" -le $((held + 4)) ] || fail "shard 0 acknowledged $(($(acks0) - held)) pushes with no Redis replica"
# The old node comes back with its nodes.conf: the cluster makes it the
# new primary's replica, and acknowledgements go out again.
node "n${vport}b" "$vport"
for ((i = 0; i < 600; i++)); do [ "$(acks0)" -gt $((held + 20)) ] && break; sleep 0.05; done
[ "$(acks0)" -gt $((held + 20)) ] || fail "no acknowledgements 30 s after the old primary came back"
resumed_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
rc "$vport" role | head -1 | grep -q slave || fail "the old primary did not come back as a replica"
grep -q "the cluster names $now as the primary of {itest:ps:0}'s slot" "$T/ps0.log" ||
  fail "shard 0 did not follow the failover to $now"
st=$("$BIN" status --config "$T/c.conf") || fail "paramserv status failed: $st"
grep -q "ps 0 on $now" <<<"$st" || fail "paramserv status does not name ps 0's new node: $st"

# Resharding: shard 1's slot moves to another primary, its keys MIGRATEd
# one by one (redis-cli --cluster reshard's steps, for that one slot).
# Meanwhile the shard's commands meet ASK and TRYAGAIN (refused writes: a
# hole, acks held); once the slot is the new node's, MOVED sends the shard
# there.
src=$(owner "{itest:ps:1}")
dst=$(rc "$other" cluster nodes | awk '$3 ~ /master/ && $3 !~ /fail/ {sub(/@.*/, "", $2); print $2}' |
  grep -vx "$src" | head -1)
[ -n "$dst" ] || fail "no other primary to move ps 1's slot to"
slot=$(rc "$other" cluster keyslot "{itest:ps:1}")
sid=$(rc "${src##*:}" cluster myid)
did=$(rc "${dst##*:}" cluster myid)
acks1() { cat "$hist"/worker-*.history 2>/dev/null | grep -c '^ack 1 ' || true; }
moved_at=$(acks1)
rc "${dst##*:}" cluster setslot "$slot" importing "$sid" >/dev/null
rc "${src##*:}" cluster setslot "$slot" migrating "$did" >/dev/null
nkeys=0
while :; do
  mapfile -t keys < <(rc "${src##*:}" cluster getkeysinslot "$slot" 100)
  [ "${#keys[@]}" -gt 0 ] && [ -n "${keys[0]}" ] || break
  out=$(rc "${src##*:}" migrate 127.0.0.1 "${dst##*:}" "" 0 5000 keys "${keys[@]}")
  [ "$out" = OK ] || [ "$out" = NOKEY ] || fail "MIGRATE of ps 1's keys: $out"
  nkeys=$((nkeys + ${#keys[@]}))
done
for k in "${P[@]}"; do rc "$k" cluster setslot "$slot" node "$did" >/dev/null 2>&1 || true; done
wait_for "$T/ps1.log" "the cluster moved {itest:ps:1}'s slot to $dst (MOVED)" 20
for ((i = 0; i < 600; i++)); do [ "$(acks1)" -gt $((moved_at + 40)) ] && break; sleep 0.05; done
[ "$(acks1)" -gt $((moved_at + 40)) ] || fail "shard 1 acknowledged nothing within 30 s after its slot moved to $dst"
[ "$(owner "{itest:ps:1}" "$other")" = "$dst" ] || fail "ps 1's slot is not on $dst"

# kill -9 of shard 1: it comes back from its replica, on the node its slot
# moved to.
kill -9 "$PID_ps1"
wait "$PID_ps1" 2>/dev/null || true
mv "$T/ps1.log" "$T/ps1-first.log"
start ps1 "$BIN" ps --config "$T/c.conf" --index 1
wait_up ps1 20
wait_for "$T/ps1.log" "restored from Redis in" 20
restored=$(grep -o "restored from Redis in .*" "$T/ps1.log" | head -1)

wait_exit "$PID_w0" 120 || fail "worker 0 exited $?"
wait_exit "$PID_w1" 120 || fail "worker 1 exited $?"
stop_shards ps 4
verdict=$(scripts/check-history "$hist") || fail "redis cluster failover: $verdict"
# paramserv check names each shard's primary.
"$BIN" check --config "$T/c.conf" >"$T/check.out" 2>&1 || true
for i in 0 1 2 3; do
  grep -q "redis cluster: shard $i's keys ({itest:ps:$i}) on the primary $(owner "{itest:ps:$i}")" "$T/check.out" ||
    fail "paramserv check does not name shard $i's primary: $(grep -i redis "$T/check.out")"
done

# paramserv local on the same Redis Cluster (the config's [redis] cluster):
# no redis-server of its own; its shards' keys land on the cluster.
cat >"$T/local.conf" <<EOF
[cluster]
id = itest-local
[model]
name = mlp
[redis]
cluster = ${addrs[1]}
EOF
"$BIN" local --config "$T/local.conf" --dir "$T/local" --ps 2 --workers 1 --last-step 200 \
  >"$T/local.out" 2>&1 || fail "paramserv local on the Redis Cluster exited $?: $(tail -5 "$T/local.out")"
grep -q "the Redis Cluster of $T/local.conf" "$T/local.out" || fail "local does not name the cluster: $(head -3 "$T/local.out")"
# Faults aimed at a Redis of the run's own are refused, one line each.
for opt in "--chaos --chaos-redis" "--nemesis redis-errors"; do
  set +e
  out=$("$BIN" local --config "$T/local.conf" --dir "$T/local-refused" $opt 2>&1)
  st=$?
  set -e
  [ "$st" -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "with \[redis\] cluster in" <<<"$out" ||
    fail "local $opt with a Redis Cluster: exit $st, '$out' (expected exit 2 and one line)"
done
[ "$(rc "${P[1]}" -c get "{itest-local}:done")" = 200 ] || fail "local's run left no {itest-local}:done on the cluster"
echo "ok: 4 shards on a Redis Cluster of 3 primaries and 3 replicas: $(grep '^redis cluster' <<<"$st")"
echo "ok: kill -9 of $victim (ps 0's primary) after $before acks: the cluster promoted $now in $failover_ms ms; acks again $resumed_ms ms after the kill; both workers reached step 3000"
echo "ok: ps 1's slot $slot moved from $src to $dst ($nkeys keys MIGRATEd) mid-training: the shard followed MOVED there"
echo "ok: then kill -9 of ps 1: $restored"
echo "ok: paramserv local --config (with [redis] cluster) trained 200 steps on the same Redis Cluster, no redis-server of its own"
echo "$verdict" | sed 's/^/ok: redis cluster: /'
