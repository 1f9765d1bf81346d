#!/usr/bin/env bash
# Recovery of the other parts: a killed worker comes back at its data
# position while the others go on; Redis killed and started again during
# training; a shard whose epoch was taken by a newer incarnation is fenced
# out and exits.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
start_redis

conf="$T/rec.conf"
write_config "$conf" 2 2 "model.name=mlp" "train.last_step=4000" "train.threads=1" \
  "train.log_every=100" "replication.mode=log" "replication.interval_ms=200" "$(metrics_on 5)"
start_shards ps "$conf" 2
start w0 "$BIN" worker --config "$conf" --index 0
start w1a "$BIN" worker --config "$conf" --index 1


# --- a worker killed and started again ---------------------------------
wait_steps "$conf" 1 300 60
kill -9 "$PID_w1a"
wait "$PID_w1a" 2>/dev/null || true
# Where it was: the data position it saved in Redis (every 100 ms, of the
# batches already pushed), which nothing writes while it is dead.
saved=$(redis-cli -p "$REDIS_PORT" --raw get "{itest}:pos:worker:1")
read -r pe po pc <<<"$saved"
[[ "$pe $po $pc" =~ ^[0-9]+\ [0-9]+\ [0-9]+$ ]] || fail "worker 1 saved no data position in Redis: '$saved'"
read -r part batch < <(sed -n 's/.*: \([0-9]*\) samples a epoch, batch \([0-9]*\),.*/\1 \2/p' "$T/w1a.log")
[ -n "$part" ] && [ -n "$batch" ] || fail "worker 1 logged no part size and batch"
# 300 steps were logged; its saved position is past at least the first 100.
[ $((pe * part + po)) -ge $((100 * batch)) ] ||
  fail "worker 1's saved position (epoch $pe offset $po) is not past its first 100 steps of $batch"
# The other worker is not held up: it trains 200 more steps while worker 1
# is dead.  (The deadline only bounds the wait; async training does not
# wait for the dead at all.)
wait_more_steps "$conf" 0 200 30
start w1b "$BIN" worker --config "$conf" --index 1
wait_for "$T/w1b.log" "resumed data position" 20
line=$(grep -o 'resumed data position epoch [0-9]* offset [0-9]* .*, clock [0-9]*' "$T/w1b.log" || true)
got=$(sed -n 's/^resumed data position epoch \([0-9]*\) offset \([0-9]*\) .*, clock \([0-9]*\)$/\1 \2 \3/p' <<<"$line")
[ "$got" = "$pe $po $pc" ] ||
  fail "worker 1 resumed at '$got' (epoch offset clock), expected where it was: $pe $po $pc (its position in Redis at the kill)"
echo "ok: worker 1 killed after 300+ steps, worker 0 went on (200 steps more); restarted worker $line: where it was (epoch $pe offset $po clock $pc in Redis at the kill)"

# --- Redis killed and started again -------------------------------------
# With on_redis_failure = block (the default) nothing Redis does not hold is
# acknowledged: the shards hold their acks while Redis is dead, and once an
# empty Redis is back they claim it, write full snapshots, and the held
# acks go out: training goes on from where it was.
kill -9 "$PID_redis"
wait "$PID_redis" 2>/dev/null || true
# A shard with an entry in flight holds its acks; the other may have none
# in flight (the workers wait for the first one's ack): either shard.
wait_for_any "holding acknowledgements" 20 "$T/ps0.log" "$T/ps1.log"
g=$(metric "$conf" worker 0 paramserv_worker_global_step)
[[ $g =~ ^[0-9]+$ ]] || fail "worker 0's paramserv_worker_global_step: '$g'"
back=$(date +%s%N)
start_redis
ok=""
# A deadline (60 s), not a bar: the time it took is printed below.
for ((i = 0; i < 3000; i++)); do
  v0=$(redis-cli -p "$REDIS_PORT" hget "{itest:ps:0}:meta" version 2>/dev/null || true)
  v1=$(redis-cli -p "$REDIS_PORT" hget "{itest:ps:1}:meta" version 2>/dev/null || true)
  if [ -n "$v0" ] && [ -n "$v1" ] && [ "$v0" -ge "$g" ] && [ "$v1" -ge "$g" ]; then ok=1; break; fi
  sleep 0.02
done
[ -n "$ok" ] || fail "Redis back: shard snapshots did not reach the global step $g of before within 60 s"
ms=$(( ($(date +%s%N) - back) / 1000000 ))
wait_more_steps "$conf" 0 200 30
echo "ok: Redis killed: the shards held their acks ($(grep -h -o 'journal entry [0-9]* not stored: [^;]*' "$T/ps0.log" "$T/ps1.log" | head -1)); Redis back empty: both shards' snapshots at versions $v0, $v1 >= $g within $ms ms (interval 200 ms), and training went on"

wait_exit "$PID_w0" 300 || fail "worker 0 exited $?"
wait_exit "$PID_w1b" 300 || fail "worker 1 exited $?"
acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/w0.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.85) }' || fail "test accuracy $acc after the kills"
echo "ok: training reached its step limit: test accuracy $acc"

# --- a stale incarnation is fenced out ------------------------------------
# A second shard 0 starts while the first still runs (say, a node thought
# dead comes back): it takes the epoch and the log.  The first one's next
# write is refused and it exits with status 1: it never writes over the
# newer incarnation's state.  (The second may or may not get the port; it
# serves no metrics: the first holds that port too.)
sed '/^listen *=/d' "$conf" >"$T/fence.conf"
start w2 "$BIN" worker --config "$T/fence.conf" --index 0
start ps0b "$BIN" ps --config "$T/fence.conf" --index 0
set +e
wait_exit "$PID_ps0" 20
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "fenced shard exited $rc, expected 1"
grep -q "fenced out by Redis" "$T/ps0.log" || fail "no fencing line in the shard's log"
kill -TERM "$PID_ps0b" 2>/dev/null || true
echo "ok: stale incarnation: a second shard 0 took the epoch and the log; the first: $(grep -h -o 'epoch [0-9]* fenced out by Redis: .*' "$T/ps0.log" | head -1); exit status 1"

# A write by hand to the epoch (as a newer incarnation would) is noticed
# by an idle shard through its fenced heartbeat.
redis-cli -p "$REDIS_PORT" incr "{itest:ps:1}:epoch" >/dev/null
set +e
wait_exit "$PID_ps1" 20
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "idle fenced shard 1 exited $rc, expected 1"
echo "ok: idle shard 1 fenced by its heartbeat: $(grep -h -o 'fenced out by Redis: .*' "$T/ps1.log" | head -1); exit status 1"
kill -TERM "$PID_w2" 2>/dev/null || true
