#!/usr/bin/env bash
# FLUSHALL under a running chief: its lease key is gone before its time to
# live ran out, which the chief's lease keeper tells from a lapse ("Redis
# lost it"), gives back the lease it took again and exits 1; restarted (as
# its unit or paramserv local restarts it), it takes the lease at once,
# finds the shards holding their states and runs to last_step, with its
# records written again.  The shard repairs its own keys (redis-flush.sh).
# From the histories: no acknowledged update lost, none applied twice.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

start_redis
rc() { redis-cli -p "$REDIS_PORT" "$@"; }
hist="$T/history"
mkdir -p "$hist"
LAST=3000
write_config "$T/c.conf" 1 1 "model.name=mlp" "train.last_step=$LAST" "train.threads=1" \
  "train.log_every=100" "replication.mode=log" "replication.self_init=no" \
  "replication.interval_ms=200" "chief.lease_ms=3000" "chief.log_every_steps=100" \
  "chief.eval_every_steps=0" "checkpoint.dir=$T/ckpt" "checkpoint.every_steps=1000" \
  "checkpoint.every_secs=0" "cluster.history_dir=$hist"
start_shards ps "$T/c.conf" 1
start w0 "$BIN" worker --config "$T/c.conf" --index 0
# The chief as its unit runs it: restarted after a failure, not after exit 0.
cat >"$T/chief-loop.sh" <<LOOP
#!/usr/bin/env bash
for i in 1 2 3 4 5; do
  "$BIN" chief --config "$T/c.conf" >>"$T/chief.log" 2>&1 && exit 0
  echo "\$?" >>"$T/chief-exits"
done
exit 1
LOOP
chmod +x "$T/chief-loop.sh"
start chief "$T/chief-loop.sh"
wait_summary "$T/ckpt" "'steps_per_s' in o" 60
token=$(rc get "{itest}:chief" | awk '{print $2}')
rc flushall >/dev/null
wait_for "$T/chief.log" "was gone from Redis .* Redis lost it" 30
line=$(grep -o "the lease .* was gone from Redis [^;]*" "$T/chief.log" | head -1)
# The chief exits 1 and its loop restarts it (the exit statuses: $T/chief-exits).
for ((i = 0; i < 600; i++)); do
  [ -s "$T/chief-exits" ] && break
  sleep 0.05
done
[ "$(cat "$T/chief-exits" 2>/dev/null)" = 1 ] || fail "the chief did not exit 1 within 30 s of the FLUSHALL (exits: $(cat "$T/chief-exits" 2>/dev/null))"
# The restart takes the lease at once (the keeper gave back what it took).
wait_exit "$PID_chief" 300 || fail "the chief (restarted) did not end the run: exit $?: $(tail -5 "$T/chief.log")"
wait_summary "$T/ckpt" "o.get('event') == 'stop' and o['step'] == $LAST" 1
[ "$(wc -l <"$T/chief-exits")" = 1 ] || fail "the chief restarted more than once: exits $(paste -sd' ' "$T/chief-exits"): $(grep 'error' "$T/chief.log")"
# The restarted chief's token: the last "chief" event of the summaries.
new=$(summary_field "$T/ckpt" 0 chief token | tail -n 1)
[ -n "$new" ] && [ "$new" -gt "$token" ] || fail "the restarted chief's token ($new) is not above the first's ($token)"
wait_exit "$PID_w0" 60 || fail "worker 0 exited $? at the end of the run"
wait_exit "$PID_ps0" 60 || fail "shard 0 exited $? at the end of the run"
verdict=$(scripts/check-history "$hist") || fail "$verdict"
echo "ok: FLUSHALL under the chief: '$line'; restarted once, token $token -> $new, reached step $LAST; $(tail -n 1 <<<"$verdict")"
