#!/usr/bin/env bash
# Processes paused (SIGSTOP) past every timeout, then resumed (DESIGN.md's
# fault model: "the paused process finds itself fenced or catches up; no
# second actor acts with an old identity").  2 shards, 2 workers, log,
# [redis] timeout_ms and [cluster] peer_timeout_ms 1000, heartbeat 300 ms:
#   1. shard 0 stopped for 4 s, resumed: it catches up, training goes on;
#   2. worker 1 stopped for 4 s, resumed: it carries on;
#   3. shard 0 stopped, and a new incarnation of it started meanwhile (as a
#      supervisor that took it for dead would): the new one takes the epoch
#      and the log, then cannot listen (the old one holds the port) and
#      exits; the old one, resumed, finds itself fenced at its next write
#      and exits 1 having acknowledged nothing after; a third one serves.
# The histories (scripts/check-history): nothing acknowledged lost, nothing
# applied twice.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
start_redis
hist="$T/history"
mkdir -p "$hist"
write_config "$T/c.conf" 2 2 "model.name=mlp" "train.last_step=3000" "train.threads=1" \
  "train.log_every=50" "replication.mode=log" "redis.timeout_ms=1000" \
  "cluster.peer_timeout_ms=1000" "worker.heartbeat_ms=300" "cluster.history_dir=$hist" \
  "$(metrics_on 5)"
start_shards ps "$T/c.conf" 2
start w0 "$BIN" worker --config "$T/c.conf" --index 0
start w1 "$BIN" worker --config "$T/c.conf" --index 1

# 1. A shard paused past every timeout catches up.
wait_steps "$T/c.conf" 0 200 60
kill -STOP "$PID_ps0"
# The pause itself lasts 4 s (past every timeout): a duration to inject, not
# a wait for an event.
for ((i = 0; i < 80; i++)); do sleep 0.05; done
kill -CONT "$PID_ps0"
wait_more_steps "$T/c.conf" 0 50 30
kill -0 "$PID_ps0" || fail "shard 0 exited after its pause"
echo "ok: shard 0 stopped 4 s, past timeout_ms, peer_timeout_ms and the heartbeat TTL: training went on after SIGCONT"

# 2. A worker paused past every timeout carries on.
kill -STOP "$PID_w1"
for ((i = 0; i < 80; i++)); do sleep 0.05; done
kill -CONT "$PID_w1"
wait_more_steps "$T/c.conf" 1 50 30
echo "ok: worker 1 stopped and resumed: it carries on ($(metric "$T/c.conf" worker 1 paramserv_worker_steps_total) steps)"

# 3. A shard stopped while a new incarnation of it starts is fenced.
kill -STOP "$PID_ps0"
start ps0b "$BIN" ps --config "$T/c.conf" --index 0
set +e
wait_exit "$PID_ps0b" 30
rc=$?
set -e
grep -q "cannot listen" "$T/ps0b.log" || fail "the second incarnation did not stop at the port ($rc): $(tail -2 "$T/ps0b.log")"
# The new incarnation took the epoch and the log, restoring version R: the
# second "start EPOCH VERSION" line of shard 0's history, the old one's the
# first.
read -r old newer r < <(awk '$1 == "start" { n++; if (n == 1) o = $2; if (n == 2) { e = $2; v = $3 } }
  END { print o, e, v }' "$hist/ps-0.history")
[[ $newer =~ ^[0-9]+$ ]] && [[ $r =~ ^[0-9]+$ ]] ||
  fail "the second incarnation took no epoch: no second start line in $hist/ps-0.history: $(grep '^start' "$hist/ps-0.history")"
kill -CONT "$PID_ps0"
set +e
wait_exit "$PID_ps0" 30
rc=$?
set -e
[ "$rc" = 1 ] || fail "the resumed old shard 0 exited $rc, expected 1 (fenced)"
grep -q "fenced out by Redis" "$T/ps0.log" || fail "no fencing line in the old shard 0's log"
# Whatever the old one acknowledged -- also after SIGCONT, for an append
# Redis had stored before the takeover and whose reply was still in its
# socket -- the newer one holds: no ack above the version it restored.
# Both epochs must be read (an empty one would match no ack, and 0 acks
# above would pass), the old one older, and the old one must have
# acknowledged pushes at all (else the count below says nothing).
[[ $old =~ ^[0-9]+$ ]] || fail "no start line of the old shard 0 in $hist/ps-0.history"
[ "$old" -lt "$newer" ] || fail "the old shard 0's epoch $old is not older than its successor's $newer"
acked=$(cat "$hist"/worker-*.history | awk -v e="$old" '$1 == "ack" && $2 == 0 && $3 == e' | wc -l)
[ "$acked" -gt 0 ] || fail "no ack of shard 0 epoch $old in the workers' histories"
above=$(cat "$hist"/worker-*.history |
        awk -v e="$old" -v r="$r" '$1 == "ack" && $2 == 0 && $3 == e && $6 + 0 > r + 0' | wc -l)
echo "ok: old shard 0 (epoch $old) resumed after incarnation $newer took its epoch and log at version $r: $(grep -o 'fenced out by Redis: .*' "$T/ps0.log" | head -1); exit 1; of its $acked acks, above version $r: $above"
[ "$above" = 0 ] || fail "the fenced shard acknowledged $above pushes above the version its successor restored"
start ps0c "$BIN" ps --config "$T/c.conf" --index 0
wait_up ps0c 20
wait_exit "$PID_w0" 180 || fail "worker 0 exited $?"
wait_exit "$PID_w1" 180 || fail "worker 1 exited $?"
kill -TERM "$PID_ps0c" "$PID_ps1"
wait_exit "$PID_ps0c" 10 || fail "ps 0 exited $?"
wait_exit "$PID_ps1" 10 || fail "ps 1 exited $?"
verdict=$(scripts/check-history "$hist") || fail "$verdict"
echo "$verdict" | sed 's/^/ok: /'
