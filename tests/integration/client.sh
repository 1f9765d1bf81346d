#!/usr/bin/env bash
# A user's own training loop on the client library (client_example.c): a
# small autoencoder declared by a variables file, a model no built-in is,
# trains through 2 shards, calm (opened from the config file, and again
# from options alone: ps_client_new_opts) and then with each shard killed
# -9 and restarted from Redis in the middle of training; its reconstruction error
# falls, and the histories show nothing acknowledged lost or applied twice.
# With a chief: it initializes and checkpoints the variables; after kill -9
# of every process and FLUSHALL it restores them from the checkpoint
# directory, and the example starts from the trained weights.
# After a shard unreachable past give_up_s and after an interrupted pull,
# a client calls again and trains on (client_retry.c).
# $CLIENT_EXAMPLE: another build of client_example.c to run (install.sh's,
# built out of tree against the installed library); CLIENT_CALM_ONLY=1
# runs the calm part only.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
EXAMPLE=${CLIENT_EXAMPLE:-$(dirname "$BIN")/tests/client_example}
VARS="$PWD/models/examples/autoencoder.vars.json"

# check_example LOG WHAT: the error fell to under a third of where it began.
check_example() {
  local log=$1 what=$2 after before
  after=$(sed -n 's/^example: reconstruction error \([0-9.]*\) .*/\1/p' "$log")
  before=$(sed -n 's/^example: reconstruction error .*(\([0-9.]*\) before)/\1/p' "$log")
  [ -n "$after" ] && [ -n "$before" ] || fail "$what: no error figures in $log"
  awk -v a="$after" -v b="$before" 'BEGIN { exit !(a < b / 3) }' ||
    fail "$what: reconstruction error $after after training, $before before: expected under a third"
  echo "ok: $what: $(tail -n 1 "$log" | sed 's/^example: //')"
}

# Calm: opened from the config file, then from the same settings as
# options (ps_client_new_opts, no config file) against new shards.
write_config "$T/c.conf" 2 1 "model.variables=$VARS" "train.lr=0.01"
start_shards ps "$T/c.conf" 2
"$EXAMPLE" "$T/c.conf" 0 300 >"$T/example.log" 2>&1 || fail "client_example exited $?"
check_example "$T/example.log" "client example, calm"
stop_shards ps 2
start_shards ops "$T/c.conf" 2
shards=$(sed -n 's/^ps = //p' "$T/c.conf" | tr -d ' ')
"$EXAMPLE" --options itest "$T/secret" "$VARS" "$shards" 0 300 >"$T/example-opts.log" 2>&1 ||
  fail "client_example --options exited $?"
grep -q "opened from options" "$T/example-opts.log" || fail "client_example --options: $(head -n 1 "$T/example-opts.log")"
check_example "$T/example-opts.log" "client example from options, calm"
# A setting the cluster does not share is refused in one line naming it.
if out=$("$EXAMPLE" --options other "$T/secret" "$VARS" "$shards" 0 10 2>&1 >/dev/null); then
  fail "client_example --options with another cluster id trained: $out"
fi
[[ $out == *"cluster id 'other'"* ]] || fail "another cluster id: $out"
echo "ok: another cluster id refused: ${out#client_example: }"
stop_shards ops 2
[ -z "${CLIENT_CALM_ONLY:-}" ] || exit 0

# After -ETIMEDOUT and -EINTR a client calls again (client_retry.c): a shard
# unreachable past give_up_s, then started; a sync pull held for the other
# worker, interrupted, then answered once that worker pushes.
write_config "$T/r.conf" 2 2 "model.variables=$VARS" "train.consistency=sync" \
  "train.sync_timeout_ms=60000" "worker.give_up_s=5"
start rps0 "$BIN" ps --config "$T/r.conf" --index 0
wait_up rps0 10
start retry "$(dirname "$EXAMPLE")/client_retry" "$T/r.conf"
wait_for "$T/retry.log" "retry: gave up" 30
start rps1 "$BIN" ps --config "$T/r.conf" --index 1
wait_for "$T/retry.log" "retry: interrupted" 30
"$EXAMPLE" "$T/r.conf" 1 1 >"$T/retry-w1.log" 2>&1 || fail "client_example as worker 1 exited $?"
wait_exit "$PID_retry" 30 || fail "client_retry exited $?"
grep '^retry: ' "$T/retry.log" | sed 's/^retry: /ok: /'
stop_shards rps 2

# Each shard killed -9 in the middle of training and restarted: it comes
# back from Redis, the example reconnects and re-sends.
start_redis
hist="$T/history"
mkdir -p "$hist"
write_config "$T/k.conf" 2 1 "model.variables=$VARS" "train.lr=0.01" "replication.mode=log" \
  "cluster.history_dir=$hist"
start_shards kps "$T/k.conf" 2
start ex "$EXAMPLE" "$T/k.conf" 0 1500
kills=0
for at in 200 500 800 1100; do
  i=$((kills % 2))
  wait_for "$T/ex.log" "example: step $at " 120
  v="PID_kps$i"
  kill -9 "${!v}"
  wait "${!v}" 2>/dev/null || true
  start "kps${i}_$kills" "$BIN" ps --config "$T/k.conf" --index "$i"
  eval "PID_kps$i=\$PID_kps${i}_$kills"
  wait_up "kps${i}_$kills" 30
  kills=$((kills + 1))
done
wait_exit "$PID_ex" 300 || fail "client_example exited $? under kills"
check_example "$T/ex.log" "client example, $kills shard kills"
stop_shards kps 2
verdict=$(scripts/check-history "$hist") || fail "$verdict"
echo "$verdict" | sed 's/^/ok: /'

# A chief initializes the variables, checkpoints them, and restores them
# from the checkpoint directory after every process died and Redis lost
# everything.
redis-cli -p "$REDIS_PORT" flushall >/dev/null
write_config "$T/ch.conf" 2 1 "model.variables=$VARS" "train.lr=0.01" "replication.mode=log" \
  "replication.self_init=no" "checkpoint.dir=$T/ckpt" "checkpoint.every_steps=100" \
  "checkpoint.every_secs=0" "chief.log_every_steps=100"
start_shards cps "$T/ch.conf" 2
start chief "$BIN" chief --config "$T/ch.conf"
"$EXAMPLE" "$T/ch.conf" 0 400 >"$T/ex1.log" 2>&1 || fail "client_example with a chief exited $?"
check_example "$T/ex1.log" "client example with a chief"
wait_summary "$T/ckpt" "o.get('event') == 'checkpoint' and o['step'] > 0" 30
grep -q "evaluations off: model 'variables 4 #" "$T/chief.log" || fail "the chief evaluated a model without layers"
for p in $PID_cps0 $PID_cps1 $PID_chief; do kill -9 "$p"; done
for p in $PID_cps0 $PID_cps1 $PID_chief; do wait "$p" 2>/dev/null || true; done
redis-cli -p "$REDIS_PORT" flushall >/dev/null
saved=$(sed -n 's/^latest: \(ckpt-[0-9]*\)$/\1/p' "$T/ckpt/checkpoint")
[ -n "$saved" ] || fail "no latest checkpoint in the index: $(cat "$T/ckpt/checkpoint")"
start_shards rps "$T/ch.conf" 2
skip=$(summaries "$T/ckpt")
start chief2 "$BIN" chief --config "$T/ch.conf"
# The newest valid checkpoint: the index's latest, or one written after it
# that the index did not name yet when the chief died.
for i in 0 1; do
  wait_summary "$T/ckpt" "o.get('event') == 'restore' and o.get('shard') == $i" 30 "$skip"
done
loaded=$(summary_field "$T/ckpt" "$skip" restore from | sort -u)
[ "$(wc -l <<<"$loaded")" -eq 1 ] && [ "${loaded#ckpt-}" -ge "${saved#ckpt-}" ] ||
  fail "shards loaded from $(paste -sd' ' <<<"$loaded"), the index's latest is $saved"
saved=$loaded
"$EXAMPLE" "$T/ch.conf" 0 20 >"$T/ex2.log" 2>&1 || fail "client_example after the restore exited $?"
before=$(sed -n 's/^example: reconstruction error .*(\([0-9.]*\) before)/\1/p' "$T/ex2.log")
first=$(sed -n 's/^example: reconstruction error .*(\([0-9.]*\) before)/\1/p' "$T/ex1.log")
awk -v a="$before" -v b="$first" 'BEGIN { exit !(a < b / 3) }' ||
  fail "after the restore the example began at error $before, a fresh start at $first"
out=$("$BIN" ckpt export "$T/ckpt/$saved" --format npy "$T/npy") || fail "ckpt export: $out"
names=$(cd "$T/npy" && ls | paste -sd' ')
[ "$names" = "decoder.bias.npy decoder.weight.npy encoder.bias.npy encoder.weight.npy" ] ||
  fail "export of the variables: $names"
kill -TERM "$PID_chief2" "$PID_rps0" "$PID_rps1"
echo "ok: variables restored by the chief from $saved after kill -9 of all and FLUSHALL: the example began at error $before (a fresh start: $first); exported $names"
