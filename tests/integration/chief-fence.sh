#!/usr/bin/env bash
# Two chiefs, the lease holder paused past its lease (a real cluster: 2
# shards, 2 workers, Redis, durability log):
#  - the shard itself refuses a chief frame of an older fence token (a raw
#    chief connection, tests/integration/chief_wire.c), and a FETCH of a cut
#    it no longer holds; restarted (kill -9), it refuses a token below the
#    newest one Redis holds from its first frame;
#  - chief A holds the lease and checkpoints; SIGSTOP past its lease; chief
#    B waits for the lease to expire (it does not take it at once), takes
#    it and checkpoints; SIGCONT A: A exits 1 ("lost the lease" or "fenced
#    out") without moving the index, writing or deleting a checkpoint;
#    every checkpoint B wrote is on disk unless B's own retention deleted
#    it; the newest verifies; training goes on;
#  - a cut whose replies come later than the shards' hold allows is
#    abandoned (PS_TEST_CUT_DELAY_MS), and a chief that exits cleanly
#    releases its lease: its successor starts at once.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
WIRE=${CHIEF_WIRE:-$(dirname "$BIN")/tests/chief_wire}

start_redis
D="$T/ckpt"
write_config "$T/c.conf" 2 2 "model.name=mlp" "train.threads=1" "replication.mode=log" \
  "replication.self_init=no" "checkpoint.dir=$D" "checkpoint.every_steps=0" \
  "checkpoint.every_secs=1" "checkpoint.max_to_keep=3" "chief.lease_ms=2000" \
  "chief.eval_every_steps=0" "chief.log_every_steps=100"
# From the chief's summaries ($D/summaries.jsonl) after their first $B
# lines (chief B's, once it runs: chief A is paused then, and exits as it
# wakes): ckpts, the checkpoints committed; gstep, the last global step.
ckpts() { summary_field "$D" "$B" checkpoint name; }
gstep() {
  local g
  g=$(summary_field "$D" "$B" progress step | tail -n 1)
  echo "${g:-0}"
}
# deleted LOG: the checkpoints a chief's retention deleted (only its log says).
deleted() { grep -o 'deleted ckpt-[0-9]* (retention)' "$1" | grep -o 'ckpt-[0-9]*' || true; }

# --- the shard's own checks, over a raw chief connection
write_config "$T/w.conf" 1 1 "model.name=mlp" "replication.self_init=yes" \
  "replication.mode=log" "checkpoint.every_steps=100"
start_shards wps "$T/w.conf" 1
"$WIRE" "$T/w.conf" || fail "chief_wire"
grep -q "CUT with fence token 4, but this shard has seen token 5" "$T/wps0.log" ||
  fail "the shard did not log the refused token"
# A restarted shard does not forget: it starts from the newest token issued.
redis-cli -p "$REDIS_PORT" set "{itest}:epoch:chief:0" 9 >/dev/null
kill -9 "$PID_wps0"; wait "$PID_wps0" 2>/dev/null || true
start_shards wps "$T/w.conf" 1
"$WIRE" "$T/w.conf" --restarted 9 || fail "chief_wire --restarted"
stop_shards wps 1
redis-cli -p "$REDIS_PORT" flushall >/dev/null  # the cluster below is another layout

# --- chief A holds the lease, then is paused past it
start_shards ps "$T/c.conf" 2
start w0 "$BIN" worker --config "$T/c.conf" --index 0
start w1 "$BIN" worker --config "$T/c.conf" --index 1
start chiefA "$BIN" chief --config "$T/c.conf"
wait_lease "$PID_chiefA" 20
wait_summary "$D" "o.get('event') == 'checkpoint'" 30
kill -STOP "$PID_chiefA"
held=$(redis-cli -p "$REDIS_PORT" get "{itest}:chief")
tokA=$(sed -n 's/^token \([0-9]*\) .*/\1/p' <<<"$held")
[[ $tokA =~ ^[0-9]+$ ]] && [[ $held == *" pid $PID_chiefA" ]] ||
  fail "the lease in Redis ($held) is not chief A's (pid $PID_chiefA)"
a_before=$(wc -l <"$T/chiefA.log")
B=$(summaries "$D")
start chiefB "$BIN" chief --config "$T/c.conf"
# What B says it waits for (the operator's view) names A's token.
wait_for "$T/chiefB.log" "waiting for the lease {itest}:chief: token $tokA" 10
wait_lease "$PID_chiefB" 15
ttl_note=$(grep -o 'waiting for the lease.*' "$T/chiefB.log" | head -1)
echo "ok: chief A (token $tokA) paused; chief B waited (${ttl_note%% (until*}), then took the lease once it expired"

# B acts: two checkpoints of its own.
for ((i = 0; i < 600; i++)); do
  [ "$(ckpts | wc -l)" -ge 2 ] && break
  sleep 0.05
done
[ "$(ckpts | wc -l)" -ge 2 ] || fail "chief B wrote fewer than 2 checkpoints in 30 s"
index_before=$(cat "$D/checkpoint")
latest_before=$(sed -n 's/^latest: //p' "$D/checkpoint")
ckpts | grep -qx "$latest_before" ||
  fail "the index's latest $latest_before is not one chief B wrote"

# --- A wakes up: it must step down and touch nothing
kill -CONT "$PID_chiefA"
set +e
wait_exit "$PID_chiefA" 20
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "chief A exited $rc after SIGCONT, expected 1 (lost its lease)"
after=$(tail -n +"$((a_before + 1))" "$T/chiefA.log")
why=$(grep -o 'lost the lease.*\|fenced out.*' <<<"$after" | head -1) ||
  fail "chief A gave no reason for stepping down: $after"
if grep -q 'checkpoint ckpt-[0-9]*: step\|deleted ckpt-\|released the lease' <<<"$after"; then
  fail "chief A acted after losing its lease: $after"
fi
grep -q "was not released (no longer ours)" <<<"$after" ||
  fail "chief A did not leave the lease alone: $after"
echo "ok: chief A woke up and exited 1: ${why%%;*}"

# Training goes on under B, which checkpoints again.
n_b=$(ckpts | wc -l)
g0=$(gstep) || g0=0   # none logged yet: any step is progress
for ((i = 0; i < 600; i++)); do
  [ "$(ckpts | wc -l)" -gt "$n_b" ] && break
  sleep 0.05
done
[ "$(ckpts | wc -l)" -gt "$n_b" ] || fail "chief B wrote no checkpoint after A woke"
for ((i = 0; i < 400; i++)); do
  g1=$(gstep) || g1=0   # retried to the deadline, not the end under set -e
  [ "$g1" -gt "$g0" ] && break
  sleep 0.05
done
[ "$g1" -gt "$g0" ] || fail "training did not go on: global step $g0 -> $g1 in 20 s"

# Every checkpoint B wrote is there unless B's own retention deleted it;
# the index's latest is B's and verifies; no leftover of B's is missing.
for c in $(ckpts); do
  [ -d "$D/$c" ] || deleted "$T/chiefB.log" | grep -qx "$c" ||
    fail "$c (written by B) is gone, and B did not delete it"
done
latest=$(sed -n 's/^latest: //p' "$D/checkpoint")
ckpts | grep -qx "$latest" || fail "the index's latest $latest is not B's"
"$BIN" ckpt verify "$D/$latest" >"$T/verify.log" 2>&1 || fail "ckpt verify $latest: $(cat "$T/verify.log")"
for l in $(awk '{print $2}' <<<"$index_before"); do
  [ -d "$D/$l" ] || deleted "$T/chiefB.log" | grep -qx "$l" || fail "$l, indexed before A woke, is gone"
done
echo "ok: B's checkpoints intact ($(ckpts | wc -l) written, $(deleted "$T/chiefB.log" | wc -l) deleted by B's own retention), latest $latest verifies; training went on (global step $g0 -> $g1)"

# --- a late cut is abandoned; a clean exit releases the lease at once
kill -TERM "$PID_chiefB"
wait_exit "$PID_chiefB" 20 || fail "chief B exited $? after SIGTERM"
grep -q "released the lease {itest}:chief" "$T/chiefB.log" || fail "chief B did not release its lease"
[ -z "$(redis-cli -p "$REDIS_PORT" get "{itest}:chief")" ] || fail "the lease is still in Redis"
# (A lease long enough to outlast the held cut, which renews nothing.)
sed 's/^lease_ms=.*/lease_ms=6000/' "$T/c.conf" >"$T/c6.conf"
PS_TEST_CUT_DELAY_MS=1600 start chiefC "$BIN" chief --config "$T/c6.conf"
wait_lease "$PID_chiefC" 30   # a deadline; "at once" is the next line
grep -q "waiting for the lease" "$T/chiefC.log" && fail "chief C waited for a released lease"
wait_for "$T/chiefC.log" "cut [0-9]* abandoned: the CUT replies came" 20
if grep -q "checkpoint ckpt-[0-9]*: step" "$T/chiefC.log"; then
  fail "chief C wrote a checkpoint from a late cut"
fi
echo "ok: chief B's SIGTERM released the lease; chief C took it at once; a cut held 1600 ms (deadline $((2000 - 500)) ms) was abandoned: $(grep -o 'cut [0-9]* abandoned: [^,]*' "$T/chiefC.log" | head -1)"
kill -TERM "$PID_chiefC"
wait_exit "$PID_chiefC" 20 || fail "chief C exited $? after SIGTERM"
