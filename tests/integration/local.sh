#!/usr/bin/env bash
# paramserv local: a whole supervised cluster (its own redis-server, the
# chief, shards, workers).  A short run ends with exit 0, the accuracy in
# report.json and its line, and nothing left running; a shard killed with
# kill -9 (its pid from the run's pids file) comes back (its next
# incarnation ready there: it sent READY=1), report.json has its time back,
# and the run still ends with exit 0; SIGTERM mid-run stops everything
# with status 143; kill -9 of local itself takes its children with it
# (their parent-death signal).  Waits read what a program reads: the
# chief's summaries (progress), RUNDIR/pids (readiness), report.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

# wait_gone RUNDIR SECONDS: until no process names the run directory.
wait_gone() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do
    [ -z "$(left "$1")" ] && return 0
    sleep 0.05
  done
  fail "still running after $2 s: $(left "$1")"
}

# pid_of RUNDIR NAME: a child's pid from RUNDIR/pids ("ps-1 1234 ready").
pid_of() { awk -v n="$2" '$1 == n { print $2 }' "$1/pids"; }

# report RUNDIR EXPR: the Python expression EXPR of r, RUNDIR/report.json
# (what local's last lines say, for a program).
report() {
  /usr/bin/python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"r": r}))' \
    "$1/report.json" "$2"
}

# --- a short run, no faults -----------------------------------------------
run="$T/run1"
set +e
"$BIN" local --dir "$run" --fresh --ps 1 --workers 1 --last-step 600 >"$T/local1.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 0 ] || fail "local (1 ps, 1 worker, 600 steps) exited $rc"
[ "$(report "$run" '(r["status"], r["step"], r.get("accuracy_step"), 0 < r.get("accuracy", 0) < 1)')" = "(0, 600, 600, True)" ] ||
  fail "report.json: no final accuracy at step 600: $(cat "$run/report.json")"
grep -q '^local: done after .*step 600/600, test accuracy 0\.[0-9]* at step 600' "$T/local1.log" ||
  fail "no final accuracy line at step 600"
[ -z "$(left "$run")" ] || fail "left running after exit 0: $(left "$run")"
grep -q 'stopping at version' "$run/logs/ps-0.log" || fail "ps 0 did not stop by itself"
[ -f "$run/checkpoints/ckpt-000000600/MANIFEST.json" ] || fail "no final checkpoint ckpt-000000600"
echo "ok: 1 ps + 1 worker, 600 steps: $(grep -o 'test accuracy [0-9.]*' "$T/local1.log"); exit 0, nothing left running"

# --- kill -9 of a shard --------------------------------------------------
run="$T/run2"
start local2 "$BIN" local --dir "$run" --fresh --ps 2 --workers 2 --last-step 2000
wait_step "$run/checkpoints/summaries.jsonl" 1 60
pid=$(pid_of "$run" ps-1)
[ -n "$pid" ] || fail "no ps-1 in $run/pids"
kill -9 "$pid"
# Back: its next incarnation sent READY=1 (it serves again).
wait_ready "$run" ps-1 30 "$pid"
set +e
wait_exit "$PID_local2" 120
rc=$?
set -e
[ "$rc" -eq 0 ] || fail "local exited $rc after a shard's kill -9"
restarts=$(report "$run" 'r["restarts"]["ps-1"]')
[ "$restarts" -ge 1 ] || fail "report.json: ps-1 restarted $restarts times, expected at least 1"
back=$(report "$run" '" ".join("%.2f" % t for t in r["recovery_s"]["ps"])')
[ -n "$back" ] || fail "report.json: ps-1 restarted but no time back for ps: $(cat "$run/report.json")"
[ "$(report "$run" '(r["step"], r.get("accuracy_step"), 0 < r.get("accuracy", 0) < 1)')" = "(2000, 2000, True)" ] ||
  fail "report.json: no final accuracy at step 2000 after the kill: $(cat "$run/report.json")"
grep -q '^local: done after .*test accuracy 0\.[0-9]* at step 2000' "$T/local2.log" ||
  fail "no final accuracy line after the kill"
[ -z "$(left "$run")" ] || fail "left running: $(left "$run")"
echo "ok: shard 1 (pid $pid) killed: back (READY=1) after $back s; test accuracy $(report "$run" 'r["accuracy"]'); exit 0, nothing left running"

# --- SIGTERM mid-run -------------------------------------------------------
run="$T/run3"
start local3 "$BIN" local --dir "$run" --fresh --last-step 100000
# Step 100 or later: every worker has saved a data position, which a cut needs.
wait_step "$run/checkpoints/summaries.jsonl" 100 120
kill -TERM "$PID_local3"
set +e
wait_exit "$PID_local3" 30
rc=$?
set -e
[ "$rc" -eq 143 ] || fail "local exited $rc after SIGTERM, expected 143"
[ -z "$(left "$run")" ] || fail "left running after SIGTERM: $(left "$run")"
grep -q 'stopping at version' "$run/logs/ps-0.log" || fail "ps 0 was not stopped cleanly"
# The chief's final checkpoint at the step it reached, before the shards
# stopped (every_secs is 600: without it the run would keep nothing).
line=$(grep -o 'SIGTERM: a final checkpoint at global step [0-9]*' "$run/logs/chief.log") ||
  fail "SIGTERM: the chief wrote no final checkpoint: $(tail -5 "$run/logs/chief.log")"
step=${line##* }
name=$(printf 'ckpt-%09d' "$step")
grep -q "checkpoint $name: step $step," "$run/logs/chief.log" ||
  fail "SIGTERM: no 'checkpoint $name' line after '$line': $(tail -5 "$run/logs/chief.log")"
"$BIN" ckpt verify "$run/checkpoints/$name" >"$T/verify.out" 2>&1 ||
  fail "SIGTERM: ckpt verify $name: $(cat "$T/verify.out")"
echo "ok: SIGTERM mid-run: exit 143, the chief's final checkpoint $name verifies, shards stopped cleanly (their last snapshot written), nothing left running"

# --- kill -9 of local itself ------------------------------------------------
run="$T/run4"
start local4 "$BIN" local --dir "$run" --fresh --last-step 100000
wait_step "$run/checkpoints/summaries.jsonl" 1 60
disown "$PID_local4" # no "Killed" notice from bash
kill -9 "$PID_local4"
wait_gone "$run" 10
echo "ok: kill -9 of local: its children died with it"

# --- the cnn, with every other setting at its default ------------------------
run="$T/run5"
printf '[model]\nname = cnn\n' >"$T/cnn.conf"
"$BIN" local --config "$T/cnn.conf" --ps 1 --workers 1 --dir "$run" --fresh --last-step 10 \
  >"$T/local5.log" 2>&1 || fail "cnn run: local exited $?"
grep -q "done after .* step 10/10, test accuracy" "$T/local5.log" || fail "cnn run: $(tail -3 "$T/local5.log")"
echo "ok: cnn with the default settings: $(grep -o 'step 10/10, test accuracy [0-9.]*' "$T/local5.log")"
