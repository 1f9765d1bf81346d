#!/usr/bin/env bash
# sync: a worker paused (SIGSTOP) past sync_timeout_ms keeps its connection
# and never says HELLO again.  The shards apply the steps it misses without
# it; once it pushes again (or heart-beats again) they wait for both
# workers' gradients again, so after the pause almost no push is refused as
# stale, and the run reaches its last step at the accuracy cluster.sh asks
# of sync.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
start_redis

last=1200
conf="$T/sync-pause.conf"
write_config "$conf" 2 2 "model.name=mlp" "train.consistency=sync" "train.sync_timeout_ms=500" \
  "train.last_step=$last" "train.threads=1" "train.log_every=50" "replication.mode=log" \
  "$(metrics_on 5)"
start_shards ps "$conf" 2
start w0 "$BIN" worker --config "$conf" --index 0
start w1 "$BIN" worker --config "$conf" --index 1
wait_steps "$conf" 1 200 60
kill -STOP "$PID_w1"
# The fault: worker 1 stays stopped for 1.5 s, three sync timeouts.
wait_for "$T/ps0.log" "applied them without the missing workers" 10
wait_for "$T/ps1.log" "applied them without the missing workers" 10
sleep 1.5
kill -CONT "$PID_w1"
for i in 0 1; do
  wait_for "$T/ps$i.log" "sync: worker 1 .*; steps wait for 2 gradients again" 10
done
wait_exit "$PID_w0" 120 || fail "worker 0 exited $?"
wait_exit "$PID_w1" 120 || fail "worker 1 exited $?"

acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/w0.log")
[ -n "$acc" ] || fail "worker 0 printed no final accuracy"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.85) }' || fail "test accuracy $acc, expected at least 0.85"
gstep=$(sed -n 's/^final test_acc [0-9.]* global_step \([0-9]*\).*/\1/p' "$T/w0.log")
[ "$gstep" -ge "$last" ] || fail "worker 0 ended at global step $gstep, before last_step $last"
# pushes P and stale S of both workers ("pushes N, duplicates D, stale S"):
# without the return to 2 gradients per step about a third of the pushes
# after the pause were refused as stale.
read -r pushes stale < <(sed -n 's/.*pushes \([0-9]*\), duplicates [0-9]*, stale \([0-9]*\)$/\1 \2/p' \
  "$T/w0.log" "$T/w1.log" | awk '{ p += $1; s += $2 } END { print p, s }')
[ "$pushes" -gt 0 ] || fail "no worker summary lines"
awk -v p="$pushes" -v s="$stale" 'BEGIN { exit !(s * 100 <= p * 2) }' ||
  fail "$stale of $pushes pushes refused as stale (more than 2%): the shards did not go back to 2 gradients per step"
stop_shards ps 2
echo "ok: sync, worker 1 stopped for 1.5 s (sync_timeout_ms 500): $(grep -h 'without the missing' "$T/ps0.log" | head -1 | sed 's/^.*warn: //')"
echo "ok: then $(grep -h -o 'sync: worker 1 .*again' "$T/ps0.log" | head -1); $stale of $pushes pushes stale; global step $gstep, test accuracy $acc"
