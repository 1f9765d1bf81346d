#!/usr/bin/env bash
# The chief in a real cluster (2 shards, 2 workers, Redis, durability log):
#  - two chiefs started at once: one holds the lease and writes checkpoints,
#    the other waits and writes none;
#  - the acting chief killed mid-run: training never stops, the other takes
#    over and the checkpoint schedule goes on;
#  - kill -9 of everything and FLUSHALL: the restart resumes from the
#    checkpoint directory at the saved step with the saved data positions;
#  - last_step: a final checkpoint there, every process exits 0, nothing is
#    left running, and the accuracy meets step 2's bar.
#  - replication off: the chief still checkpoints (the workers record
#    their data positions in Redis).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

start_redis
LAST=4000
write_config "$T/c.conf" 2 2 "model.name=mlp" "train.last_step=$LAST" "train.threads=1" \
  "train.schedule=cosine" "replication.mode=log" "replication.self_init=no" \
  "checkpoint.dir=$T/ckpt" "checkpoint.every_steps=500" "checkpoint.every_secs=0" \
  "chief.lease_ms=1500" "chief.eval_every_steps=0" "chief.log_every_steps=250" \
  "$(metrics_on 5)"
# The chiefs serve no metrics: two of them run at once, on one slot.
sed '/^listen *=/d' "$T/c.conf" >"$T/chief.conf"

start_cluster() {  # SUFFIX
  start_shards "ps$1_" "$T/c.conf" 2
  start "w$1_0" "$BIN" worker --config "$T/c.conf" --index 0
  start "w$1_1" "$BIN" worker --config "$T/c.conf" --index 1
}
pid() { local v="PID_$1"; echo "${!v}"; }
# ckpt_count CHIEF: the checkpoints that chief's log says it wrote.
ckpt_count() { grep -c "checkpoint ckpt-" "$T/$1.log" || true; }
# gstep: the newest global step of the workers (their metrics).
gstep() {
  local a b
  a=$(metric "$T/c.conf" worker 0 paramserv_worker_global_step)
  b=$(metric "$T/c.conf" worker 1 paramserv_worker_global_step)
  [ -n "$a$b" ] && echo $((${a:-0} > ${b:-0} ? ${a:-0} : ${b:-0}))
}
# ckpt_steps FROM TO: the steps of the checkpoints in the summaries' lines
# FROM+1..TO (TO empty: to the end).
ckpt_steps() {
  sed -n "$(($1 + 1)),${2:-\$}p" "$T/ckpt/summaries.jsonl" | summary_field - 0 checkpoint step
}

# --- a worker waiting for shards that are not there stops on SIGTERM
start wlone "$BIN" worker --config "$T/c.conf" --index 0
wait_for "$T/wlone.log" "waiting for shard" 10
kill -TERM "$PID_wlone"
wait_exit "$PID_wlone" 3 || fail "worker waiting for shards: exit $? after SIGTERM"
redis-cli -p "$REDIS_PORT" flushall >/dev/null
echo "ok: a worker waiting for its shards exits 0 on SIGTERM"

# --- two chiefs at once
start_cluster a
start chiefA "$BIN" chief --config "$T/chief.conf"
start chiefB "$BIN" chief --config "$T/chief.conf"
# Which one took the lease: its pid in {itest}:chief.
act=""
for ((i = 0; i < 200; i++)); do
  held=$(redis-cli -p "$REDIS_PORT" get "{itest}:chief") || true
  [[ $held == *" pid $PID_chiefA" ]] && { act=chiefA other=chiefB; break; }
  [[ $held == *" pid $PID_chiefB" ]] && { act=chiefB other=chiefA; break; }
  sleep 0.05
done
[ -n "$act" ] || fail "neither chief took the lease within 10 s (the lease: '$held')"
# What the other says (the operator's view): it waits.
wait_for "$T/$other.log" "waiting for the lease" 10
wait_summary "$T/ckpt" "o.get('event') == 'checkpoint'" 30
[ "$(ckpt_count "$other")" -eq 0 ] || fail "the chief without the lease wrote a checkpoint"
echo "ok: two chiefs at once: $act holds the lease and checkpoints, $other waits ($(grep -o 'waiting for the lease.*' "$T/$other.log" | head -1))"

# --- the acting chief killed: training goes on, the other takes over.
# The other is paused first, so that no chief acts at all after the kill:
# the workers' global step must still pass the one logged at the kill.
kill -STOP "$(pid "$other")"
kill -9 "$(pid "$act")"
wait "$(pid "$act")" 2>/dev/null || true
g0=$(gstep) || true
[ -n "$g0" ] || fail "no global step in the workers' logs at the kill of $act"
g1=$g0
for ((i = 0; i < 600; i++)); do
  g1=$(gstep) || true
  [ "${g1:-0}" -gt "$g0" ] && break
  sleep 0.05
done
[ "${g1:-0}" -gt "$g0" ] ||
  fail "training stopped with no chief: the workers' global step is $g1 30 s after $act was killed at $g0 ($other paused)"
before=$(summaries "$T/ckpt")
kill -CONT "$(pid "$other")"
wait_lease "$(pid "$other")" 10
# It found every shard holding its state (no load), then checkpoints.
wait_summary "$T/ckpt" "o.get('event') == 'restore' and o.get('source') == 'redis'" 10 "$before"
wait_summary "$T/ckpt" "o.get('event') == 'checkpoint'" 30 "$before"
last_a=$(ckpt_steps 0 "$before" | tail -1)
first_b=$(ckpt_steps "$before" | head -1)
[ -n "$last_a" ] || fail "no checkpoint before the kill"
[ "$first_b" -gt "$last_a" ] || fail "schedule went back: $first_b after $last_a"
echo "ok: chief $act killed at global step ~$g0: training went on with no chief acting (step $g1 while $other was paused), then $other took the lease; $other's first checkpoint at step $first_b after $last_a"

# --- whole cluster killed, Redis flushed: resume from the checkpoint directory
wait_summary "$T/ckpt" "'steps_per_s' in o and o['step'] >= 2000" 60
for p in psa_0 psa_1 wa_0 wa_1 "$other"; do kill -9 "$(pid "$p")" 2>/dev/null || true; done
for p in psa_0 psa_1 wa_0 wa_1 "$other"; do wait "$(pid "$p")" 2>/dev/null || true; done
redis-cli -p "$REDIS_PORT" flushall >/dev/null
# The newest checkpoint directory, not the index's latest: a chief killed
# between a checkpoint's rename and the index's update leaves a newer one,
# which the restore takes (the directories are the truth, FORMAT.md §7).
saved=$(ls -d "$T"/ckpt/ckpt-* | sed -n 's/.*ckpt-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1)
[ -n "$saved" ] || fail "no checkpoint directory in $T/ckpt: $(ls "$T/ckpt")"
# The data positions the checkpoint saved, worker by worker ("epoch offset").
read -r -a pos < <(/usr/bin/python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
print(" ".join("%d:%d" % (int(p[0]), int(p[1])) for p in m["data_positions"]))' \
  "$T/ckpt/ckpt-$(printf %09d "$saved")/MANIFEST.json")
start_cluster b
before=$(summaries "$T/ckpt")
start chiefC "$BIN" chief --config "$T/chief.conf"
name="ckpt-$(printf %09d "$saved")"
for i in 0 1; do
  wait_summary "$T/ckpt" "o.get('event') == 'restore' and o.get('shard') == $i" 20 "$before"
done
restored=$(summary_field "$T/ckpt" "$before" restore shard source from step)
# Each shard from that checkpoint; shard 0 (whose step is the cluster's) at
# the saved step.
[ "$(cut -d' ' -f1-3 <<<"$restored")" = "0 checkpoint $name"$'\n'"1 checkpoint $name" ] &&
  [ "$(head -1 <<<"$restored" | cut -d' ' -f4)" = "$saved" ] ||
  fail "not both shards restored from $name, shard 0 at step $saved: $restored"
for j in 0 1; do
  wait_for "$T/wb_$j.log" "resumed data position" 20
  want="epoch ${pos[j]%%:*} offset ${pos[j]##*:}"
  grep -q "resumed data position $want " "$T/wb_$j.log" ||
    fail "worker $j: $(grep 'resumed data position' "$T/wb_$j.log"), expected $want"
done
echo "ok: kill -9 of every process + FLUSHALL: restored from ckpt at step $saved, data positions ${pos[*]} (epoch:offset)"

# --- the run ends at last_step: final checkpoint, every process exits 0
wait_exit "$(pid chiefC)" 120 || fail "chief exited $?"
for p in psb_0 psb_1 wb_0 wb_1; do
  wait_exit "$(pid "$p")" 15 || fail "$p exited $?"
done
wait_summary "$T/ckpt" "o.get('event') == 'stop' and o.get('checkpoint') == 'ckpt-$(printf %09d $LAST)'" 1 "$before"
[ -f "$T/ckpt/ckpt-$(printf %09d $LAST)/MANIFEST.json" ] || fail "ckpt-$LAST missing"
acc=$(sed -n 's/^final test_acc \([0-9.]*\) .*/\1/p' "$T/chiefC.log")
/usr/bin/python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.87 else 1)" ||
  fail "final test accuracy $acc < 0.87"
# pgrep exits 1 when nothing matches; 0 is a process left, anything else
# (127: no pgrep, procps missing) is no answer, not a pass.
prc=0
left=$(pgrep -f "paramserv .*--config $T/c(hief)?\.conf") || prc=$?
[ "$prc" = 1 ] || fail "processes left after the run: pgrep exited $prc (0: still running: $left; 127: no pgrep)"
# A worker or shard restarted after the end (a crash, a supervisor) exits 0.
"$BIN" worker --config "$T/c.conf" --index 1 >"$T/late.log" 2>&1 || fail "late worker exited $?"
"$BIN" ps --config "$T/c.conf" --index 1 >>"$T/late.log" 2>&1 || fail "late ps exited $?"
[ "$(grep -c "the run already ended at global step $LAST" "$T/late.log")" -eq 2 ] ||
  fail "late start: $(cat "$T/late.log")"
echo "ok: last_step $LAST: final checkpoint ckpt-$LAST, chief + 2 ps + 2 workers exited 0, none left; test accuracy $acc (bar 0.87)"

# --- the NaN guard: a worker's gradients turn NaN after 300 steps
redis-cli -p "$REDIS_PORT" flushall >/dev/null
write_config "$T/n.conf" 1 1 "model.name=mlp" "train.threads=1" "replication.mode=log" \
  "replication.self_init=no" "checkpoint.dir=$T/nan" "checkpoint.every_steps=50" \
  "checkpoint.every_secs=0" "chief.eval_every_steps=50" "chief.log_every_steps=100"
start_shards nps "$T/n.conf" 1
PS_TEST_NAN_AFTER_STEP=300 start nw0 "$BIN" worker --config "$T/n.conf" --index 0
start nchief "$BIN" chief --config "$T/n.conf"
set +e
wait_exit "$PID_nchief" 60
rc=$?
set -e
[ "$rc" -eq 3 ] || fail "NaN guard: chief exited $rc, expected 3"
line=$(grep "non-finite weights" "$T/nchief.log") || fail "NaN guard: no reason logged"
good=$(sed -n 's/^latest: \(ckpt-[0-9]*\)$/\1/p' "$T/nan/checkpoint")
[ -n "$good" ] && grep -q "last good checkpoint is $good" <<<"$line" ||
  fail "NaN guard: the index's latest '$good' is not the last good one: $line"
"$BIN" ckpt export "$T/nan/$good" --format npy "$T/nan-npy" >/dev/null
/usr/bin/python3 -c '
import glob, sys, numpy
bad = [f for f in glob.glob(sys.argv[1] + "/*.npy") if not numpy.isfinite(numpy.load(f)).all()]
sys.exit(1 if bad else 0)' "$T/nan-npy" || fail "NaN guard: $good holds non-finite values"
wait_exit "$PID_nps0" 15 || fail "NaN guard: ps exited $?"
wait_exit "$PID_nw0" 15 || fail "NaN guard: worker exited $?"
echo "ok: NaN guard: ${line#chief: error: }; exit status 3; $good holds only finite values; ps and worker told to stop"

# --- a chief started over a directory of checkpoints keeps the every_secs
# schedule (the checkpoints' times are wall-clock, the schedule's monotonic)
redis-cli -p "$REDIS_PORT" flushall >/dev/null
write_config "$T/s.conf" 1 1 "model.name=mlp" "train.threads=1" "replication.mode=log" \
  "replication.self_init=no" "checkpoint.dir=$T/secs" "checkpoint.every_steps=0" \
  "checkpoint.every_secs=1" "chief.eval_every_steps=0"
# small_cluster P CONF: 1 shard (Pps0), 1 worker (Pw0) and a chief (Pchief1).
small_cluster() {
  start_shards "$1ps" "$2" 1
  start "$1w0" "$BIN" worker --config "$2" --index 0
  start "$1chief1" "$BIN" chief --config "$2"
}
small_cluster s "$T/s.conf"
wait_summary "$T/secs" "o.get('event') == 'checkpoint'" 20
kill -9 "$PID_schief1"
before=$(summaries "$T/secs")
start schief2 "$BIN" chief --config "$T/s.conf"
wait_summary "$T/secs" "o.get('event') == 'restore' and o.get('source') == 'redis'" 15 "$before"
wait_summary "$T/secs" "o.get('event') == 'checkpoint'" 10 "$before"
echo "ok: every_secs after a chief restart: $(grep -o 'checkpoint ckpt-[0-9]*: step [0-9]*' "$T/schief2.log" | head -1) by the new chief"

# --- checkpoints without replication: the shards keep nothing in Redis,
# the workers still record their data positions there for the chief
redis-cli -p "$REDIS_PORT" flushall >/dev/null
write_config "$T/o.conf" 1 1 "model.name=mlp" "train.threads=1" "replication.mode=off" \
  "replication.self_init=no" "checkpoint.dir=$T/off" "checkpoint.every_steps=50" \
  "checkpoint.every_secs=0" "chief.eval_every_steps=0"
small_cluster o "$T/o.conf"
wait_summary "$T/off" "o.get('event') == 'checkpoint'" 20
compgen -G "$T/off/ckpt-*" >/dev/null || fail "replication off: the chief logged a checkpoint, none is in $T/off"
echo "ok: replication off: $(grep -o 'checkpoint ckpt-[0-9]*: step [0-9]*' "$T/ochief1.log" | head -1)"
