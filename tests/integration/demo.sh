#!/usr/bin/env bash
# The README's promises about `paramserv local` that no other test runs:
# a. Ctrl-C: local in its own process group (setsid, as a terminal runs a
#    job); once training is under way and a shard killed with kill -9 is
#    back (the chief saw it), SIGINT to the whole group; local exits
#    130 (`paramserv local --help`), every process it recorded in RUNDIR/pids
#    and its redis-server are gone, nothing names the run directory, none of
#    the run's ports (cluster.conf, metrics-targets.json) is listened on, and
#    each process stopped by itself (a shard's last snapshot, Redis's
#    shutdown, the chief's lease released, each worker's final line; no
#    SIGKILL).
# d. `make demo`'s run, shorter: `local --config scripts/demo.conf --chaos`
#    exits 0 and ends with the report the README shows: done and the
#    accuracy at the last step, the faults and their recovery, the longest
#    time without an ack, each role's time to come back, the checkpoints;
#    at least one kill -9 happened and recovered, the kill line's counts per
#    role are the kills the run logged, and report.json says the same.  No
#    time is asserted, only that each is a number.
# b. d's summaries.jsonl (the chief's, in the checkpoint directory) holds
#    what the README lists with the fields chief/summary.h names: progress,
#    evaluations, checkpoints, restores, nodes lost and back (each that the
#    chief's log saw; and in a's summaries, the shard a killed), the chief's
#    lease and the stop; the last evaluation and the stop agree with the
#    report.
# c. `scripts/plot summaries.jsonl -o run.png` on d's run exits 0 and writes
#    a real PNG (signature, IHDR, an image of some size).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

# last_start LOG: a child's log from its latest start on ("local: NAME
# starts (pid ...)", which local writes at each start).
last_start() {
  awk '/^local: .* starts \(pid [0-9]+, start [0-9]+\)$/ { buf = "" } { buf = buf $0 "\n" }
    END { printf "%s", buf }' "$1"
}

# pgid_of PID: its process group, from /proc (empty when it is gone).
pgid_of() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) } # after "pid (comm) ": state ppid pgrp ...
  read -r _ _ pgrp _ <<<"$stat"
  echo "$pgrp"
}

# proc_stat PID: its start time (clock ticks since boot, which tells it
# from a later process given the same pid) and state (R, S, Z, ...); empty
# when there is no such process.
proc_stat() {
  local stat f
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  read -r -a f <<<"${stat##*) }"
  echo "${f[19]} ${f[0]}"
}

# listening: the TCP ports something listens on (IPv4 and IPv6), one a line.
listening() {
  local hex
  for hex in $(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" { sub(/.*:/, "", $2); print $2 }'); do
    echo $((16#$hex))
  done | sort -un
}

# run_ports RUNDIR: every port of the run: its cluster.conf's addresses
# (chief, shards, workers, Redis, metrics) and its metrics targets.
run_ports() {
  grep -ohE '127\.0\.0\.1:[0-9]+' "$1/cluster.conf" "$1/metrics-targets.json" |
    sed 's/.*://' | sort -un
}

# port_of RUNDIR SECTION KEY: the port of an address setting in cluster.conf.
port_of() {
  awk -v s="[$2]" -v k="$3" '/^\[/ { in_s = ($0 == s) }
    in_s && $1 == k { sub(/.*:/, ""); print; exit }' "$1/cluster.conf"
}

# ---------------------------------------------------------------------------
# a. Ctrl-C
# ---------------------------------------------------------------------------
run="$T/ctrl-c"
# setsid: a process group of its own, led by local, as a shell with job
# control starts a foreground job; -w returns local's status if setsid
# had to fork.
start ctrlc setsid -w "$BIN" local --dir "$run" --fresh --last-step 100000
wait_step "$run/checkpoints/summaries.jsonl" 1 60
# A shard killed and back first, which the chief must see (b checks its
# node_lost and node_back summaries: d's chaos cannot promise the chief is
# up when a shard or worker dies).
killed=$(awk '$1 == "ps-1" { print $2 }' "$run/pids")
kill -9 "$killed"
wait_ready "$run" ps-1 30 "$killed" # its next incarnation sent READY=1
wait_json "$run/checkpoints/summaries.jsonl" "o.get('event') == 'node_back' and o.get('node') == 'ps 1'" 30
cp "$run/pids" "$T/pids-before"
while read -r name pid _; do echo "$name $pid $(proc_stat "$pid")"; done <"$T/pids-before" >"$T/procs-before"
[ -z "$(awk 'NF < 4' "$T/procs-before")" ] || fail "Ctrl-C: not running while training: $(awk 'NF < 4' "$T/procs-before")"
for name in local redis chief ps-0 ps-1 worker-0 worker-1; do
  grep -qE "^$name [0-9]+ (ready|starting)$" "$T/pids-before" || fail "Ctrl-C: no $name in $run/pids while training: $(cat "$T/pids-before")"
done
lpid=$(awk '$1 == "local" { print $2 }' "$T/pids-before")
pgid=$(pgid_of "$lpid")
[ "$pgid" = "$lpid" ] || fail "Ctrl-C: local (pid $lpid) is in process group '$pgid', not one it leads"
[ "$pgid" != "$(pgid_of $$)" ] || fail "Ctrl-C: local shares this test's process group $pgid"
mapfile -t ports < <(run_ports "$run")
[ "${#ports[@]}" -ge 6 ] || fail "Ctrl-C: only ${#ports[@]} ports in $run/cluster.conf (chief, 2 shards, 2 workers, Redis at least): ${ports[*]}"
read -r -a ps_ports <<<"$(sed -n 's/^ps = //p' "$run/cluster.conf" | grep -oE ':[0-9]+' | tr -d : | tr '\n' ' ' || true)"
[ "${#ps_ports[@]}" -eq 2 ] || fail "Ctrl-C: $run/cluster.conf's ps line names ${#ps_ports[@]} ports, expected 2"
listen_now=$(listening)
for p in "$(port_of "$run" redis address)" "${ps_ports[@]}"; do
  grep -qx "$p" <<<"$listen_now" || fail "Ctrl-C: port $p (Redis or a shard) not listening while training: the check after the stop would see nothing"
done

kill -INT -- "-$pgid" # what the terminal does on Ctrl-C: SIGINT to the foreground group
set +e
wait_exit "$PID_ctrlc" 30
rc=$?
set -e
[ "$rc" -eq 130 ] || fail "Ctrl-C: local exited $rc after SIGINT to its process group, expected 130 (paramserv local --help)"
while read -r name pid start _; do
  [ "$name" = local ] && continue # reaped above
  read -r start_now state < <(proc_stat "$pid"; echo)
  if [ -n "$start_now" ] && [ "$start_now" = "$start" ]; then
    [ "$state" = Z ] && fail "Ctrl-C: $name (pid $pid) is a zombie after local exited: dead but never reaped by local, so not stopped by it"
    fail "Ctrl-C: $name (pid $pid, state $state) outlived local: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
  fi
done <"$T/procs-before"
[ -z "$(left "$run")" ] || fail "Ctrl-C: left running after local exited: $(left "$run")"
listen_after=$(listening)
for p in "${ports[@]}"; do
  if grep -qx "$p" <<<"$listen_after"; then
    fail "Ctrl-C: port $p of the run still listened on after local exited (run's ports: ${ports[*]})"
  fi
done
grep -q '^local: [^:]*: stopping every process' "$T/ctrlc.log" || fail "Ctrl-C: local did not say it stops every process on SIGINT"
grep -q '^local: stopped after .* step [0-9]*/100000' "$T/ctrlc.log" || fail "Ctrl-C: no 'local: stopped after' report line"
! grep -q 'SIGKILL\|again: killing' "$T/ctrlc.log" || fail "Ctrl-C: a process had to be killed: $(grep 'SIGKILL\|killing' "$T/ctrlc.log")"
for i in 0 1; do # each one's latest start: ps 1 was killed with kill -9 above
  log=$(last_start "$run/logs/ps-$i.log")
  grep -q 'SIGTERM: stopping at version' <<<"$log" ||
    fail "Ctrl-C: ps $i was not stopped by local's SIGTERM (no 'SIGTERM: stopping at version'; did the Ctrl-C reach it?): $(grep -m 1 'stopping' <<<"$log" || tail -n 2 <<<"$log")"
  ! grep -q 'not stored' <<<"$log" || fail "Ctrl-C: ps $i lost Redis before it stopped (Redis stopped before the shards?): $(grep -m 1 'not stored' <<<"$log")"
  log=$(last_start "$run/logs/worker-$i.log")
  grep -q "^worker $i done:" <<<"$log" || fail "Ctrl-C: worker $i did not stop cleanly (no 'worker $i done:'): $(tail -n 3 <<<"$log")"
done
grep -q 'released the lease' "$run/logs/chief.log" || fail "Ctrl-C: the chief did not release its lease: $(tail -n 3 "$run/logs/chief.log")"
grep -q 'Redis is now ready to exit' "$run/logs/redis.log" || fail "Ctrl-C: redis-server did not shut down by itself: $(tail -n 3 "$run/logs/redis.log")"
status=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$run/report.json") ||
  fail "Ctrl-C: no readable $run/report.json"
[ "$status" = 130 ] || fail "Ctrl-C: report.json status $status, expected 130"
echo "ok: Ctrl-C (SIGINT to local's process group $pgid): exit 130, $(($(wc -l <"$T/pids-before") - 1)) children and local gone, none of ${#ports[@]} ports listened on, each process stopped by itself"

# ---------------------------------------------------------------------------
# d. make demo, shorter: local --config scripts/demo.conf --chaos
# ---------------------------------------------------------------------------
run="$T/demo"
last=3000
set +e
"$BIN" local --config scripts/demo.conf --chaos --last-step "$last" --dir "$run" --fresh >"$T/demo.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 0 ] || fail "demo: local --chaos exited $rc"
# The report: the lines from "local: done after" on (\r: a progress line's end).
report=$(tr '\r' '\n' <"$T/demo.log" | sed -n '/^local: done after /,$p')
[ -n "$report" ] || fail "demo: no 'local: done after' line"
num='[0-9]+(\.[0-9]+)?'
need() { # need WHAT REGEX: a report line matching REGEX (extended)
  grep -qE "$2" <<<"$report" || { echo "$report" >&2; fail "demo: the report has no $1 line (/$2/)"; }
}
need "done and accuracy" "^local: done after $num s: step $last/$last, test accuracy 0\.[0-9]+ at step $last\$"
need "faults" "^local: faults: [0-9]+; time to recover \(kill: death to back"
need "kill" "^local:   kill +[0-9]+ \([a-z]+ [0-9]+(, [a-z]+ [0-9]+)*\): recovered [0-9]+, median $num s, max $num s"
need "longest time without an ack" "^local: longest time without an ack: $num s \(from $num s into the run\); outside fault windows: $num s"
need "per-role times" "^local: time from a death \(killed or failed\) to back, per role:\$"
need "a role's time to come back" "^local:   (redis|chief|ps|worker) +[0-9]+ back: median $num s, max $num s\$"
need "checkpoints" "^local: checkpoints: $run/checkpoints \(latest ckpt-0*$last\)\$"
faults=$(sed -nE 's/^local: faults: ([0-9]+);.*/\1/p' <<<"$report")
kills=$(sed -nE 's/^local:   kill +([0-9]+) .*/\1/p' <<<"$report")
roles=$(sed -nE 's/^local:   kill +[0-9]+ \(([^)]*)\).*/\1/p' <<<"$report")
recovered=$(sed -nE 's/^local:   kill .*: recovered ([0-9]+),.*/\1/p' <<<"$report")
[ "$kills" -ge 1 ] || fail "demo: no kill in the run (kill line: $kills)"
[ "$recovered" -ge 1 ] || fail "demo: $kills kills, none recovered"
[ "$recovered" -le "$kills" ] || fail "demo: $recovered recovered of $kills kills"
[ "$faults" -eq "$kills" ] || fail "demo: faults: $faults but kill $kills (--chaos is kill only)"
logged=$(tr '\r' '\n' <"$T/demo.log" | grep -c '^local: killed .* (pid [0-9]*, chaos)$' || true)
[ "$logged" -eq "$kills" ] || fail "demo: the report counts $kills kills, the log has $logged 'local: killed' lines"
for role in chief ps worker redis; do
  n=$(tr '\r' '\n' <"$T/demo.log" | grep -c "^local: killed ${role}[ (]" || true)
  said=$(grep -oE "(^|, )$role [0-9]+" <<<"$roles" | grep -oE '[0-9]+$' || echo 0)
  [ "$n" -eq "$said" ] || fail "demo: the kill line says '$roles' but the log killed $role $n times"
done
tr '\r' '\n' <"$T/demo.log" | grep -qE "^local: (chief|ps [0-9]+|worker [0-9]+) back after $num s\$" ||
  fail "demo: no 'back after' line though $recovered kills recovered"
[ -f "$run/checkpoints/ckpt-$(printf %09d "$last")/MANIFEST.json" ] || fail "demo: the report's latest checkpoint has no MANIFEST.json"
/usr/bin/python3 - "$run/report.json" "$kills" "$recovered" <<'PY' || fail "demo: report.json disagrees with the printed report"
import json, sys
r = json.load(open(sys.argv[1]))
k = r["nemesis"]["kinds"]["kill"]
kills, recovered = int(sys.argv[2]), int(sys.argv[3])
bad = []
if r["status"] != 0: bad.append(f"status {r['status']}")
if k["count"] != kills: bad.append(f"kill count {k['count']}, printed {kills}")
if len(k["recovery_s"]) != recovered: bad.append(f"{len(k['recovery_s'])} recovery times, printed {recovered}")
if k["count"] != len(k["recovery_s"]) + k["not_recovered"]: bad.append(f"count {k['count']} != recovered + not_recovered {k['not_recovered']}")
if sum(r["restarts"].values()) < recovered: bad.append(f"restarts {r['restarts']} fewer than {recovered} recovered kills")
for b in bad: print(f"report.json: {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
grep -E '^local: (done|faults|  kill|longest)' <<<"$report" | sed 's/^local: */ok: /'
echo "ok: demo (--chaos, $last steps): $kills kills ($roles), $recovered recovered; report lines all there, report.json agrees"

# ---------------------------------------------------------------------------
# b. summaries.jsonl of d's run (and a's, for the shard it killed)
# ---------------------------------------------------------------------------
sum="$run/checkpoints/summaries.jsonl"
[ -s "$sum" ] || fail "summaries: no $sum"
acc=$(grep -oE 'test accuracy 0\.[0-9]+' <<<"$report" | grep -oE '0\.[0-9]+')
/usr/bin/python3 - "$sum" "$run/logs/chief.log" "$last" "$acc" "$run/checkpoints" \
  "$T/ctrl-c/checkpoints/summaries.jsonl" "$T/ctrl-c/logs/chief.log" <<'PY' >"$T/summaries-check.out" 2>&1 ||
import json, os, re, sys
path, chief_log, last, acc, ckdir = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
a_path, a_chief_log = sys.argv[6], sys.argv[7]
bad = []
num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)

def read(path):
    """The summary lines of path, (line number, object); each must be a JSON
    object with a numeric time and an integer step."""
    lines = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                o = json.loads(line)
            except ValueError as e:
                bad.append(f"{path}: line {n} is not JSON: {e}: {line!r}")
                continue
            if not isinstance(o, dict):
                bad.append(f"{path}: line {n} is not an object"); continue
            if not num(o.get("time")) or not isinstance(o.get("step"), int):
                bad.append(f"{path}: line {n} lacks a numeric time or an integer step: {o}")
            lines.append((n, o))
    return lines

def nodes(lines, chief_log, must=()):
    """Nodes lost and back: each that the chief's log saw (and each of must,
    which it must have seen) has its node_lost / node_back events."""
    seen = {}
    for line in open(chief_log, errors="replace"):
        m = re.search(r"\b((?:ps|worker) \d+) (restarted \(incarnation|lost|is back)", line)
        if m:
            seen.setdefault(m.group(1), set()).add("back" if m.group(2) == "is back" else
                                                   "lost" if m.group(2) == "lost" else "both")
    for node in must:
        if node not in seen:
            bad.append(f"{chief_log}: the chief never saw {node} lost, back or restarted")
    for node, how in sorted(seen.items()):
        lost = [o for _, o in lines if o.get("event") == "node_lost" and o.get("node") == node]
        back = [o for _, o in lines if o.get("event") == "node_back" and o.get("node") == node]
        if how & {"lost", "both"} and not lost:
            bad.append(f"{chief_log} saw {node} lost or restarted; no node_lost event for it")
        if how & {"back", "both"} and not back:
            bad.append(f"{chief_log} saw {node} back or restarted; no node_back event for it")
    for _, o in lines:
        if o.get("event") in ("node_lost", "node_back") and not (
                isinstance(o.get("node"), str) and re.fullmatch(r"(ps|worker) \d+", o["node"])):
            bad.append(f"a node event without a node: {o}")
    return seen

lines = read(path)
prog = [o for _, o in lines if "event" not in o and "steps_per_s" in o]
evals = [o for _, o in lines if "event" not in o and "accuracy" in o]
ev = lambda name: [o for _, o in lines if o.get("event") == name]
def need(what, rows, fields):
    if not rows:
        bad.append(f"no {what} line")
    for o in rows:
        for k, t in fields.items():
            if not t(o.get(k)):
                bad.append(f"{what} line without a valid {k}: {o}")
isstr = lambda v: isinstance(v, str) and v != ""
need("progress", prog, {"steps_per_s": num})
need("evaluation", evals, {"loss": num, "accuracy": lambda v: num(v) and 0 <= v <= 1})
need("checkpoint event", ev("checkpoint"), {"name": lambda v: isinstance(v, str) and re.fullmatch(r"ckpt-\d+", v),
                                            "stall_ms": num, "write_s": num, "mb": num})
need("restore event", ev("restore"), {"source": lambda v: v in ("init", "redis", "checkpoint")})
need("chief event", ev("chief"), {"token": lambda v: isinstance(v, int)})
need("stop event", ev("stop"), {"checkpoint": isstr})
# The seeded initialization of every shard (more than once for a shard if
# a chief was killed while it loaded them).
first = [o for o in ev("restore") if o.get("source") == "init"]
if {o.get("shard") for o in first} != {0, 1} or any(o.get("from") != "seed" for o in first):
    bad.append(f"no restore 'init' from 'seed' of shards 0 and 1: {first}")
seen = nodes(lines, chief_log)
# a's run killed ps 1 while its chief was up: both events, whatever d did.
a_lines = read(a_path)
nodes(a_lines, a_chief_log, must=("ps 1",))
for kind in ("node_lost", "node_back"):
    if not any(o.get("event") == kind and o.get("node") == "ps 1" for _, o in a_lines):
        bad.append(f"{a_path}: no {kind} event for ps 1, which a's run killed with kill -9")
# The end agrees with the report.
if evals and (evals[-1]["step"] != last or abs(evals[-1]["accuracy"] - acc) > 5e-5):
    bad.append(f"last evaluation {evals[-1]}, the report: accuracy {acc} at step {last}")
stops = ev("stop")
ckpts = ev("checkpoint")
want = "ckpt-%09d" % last
if stops and (stops[-1]["checkpoint"] != want or stops[-1]["step"] != last):
    bad.append(f"stop event {stops[-1]}, expected at step {last} with checkpoint {want}")
if ckpts and ckpts[-1]["name"] != want:
    bad.append(f"last checkpoint event {ckpts[-1]}, expected {want}")
if ckpts and not os.path.isfile(os.path.join(ckdir, ckpts[-1]["name"], "MANIFEST.json")):
    bad.append(f"checkpoint event {ckpts[-1]['name']}: no such checkpoint in {ckdir}")
for b in bad:
    print(b)
counts = {k: len(ev(k)) for k in ("chief", "restore", "checkpoint", "node_lost", "node_back", "stop")}
print(f"{len(prog)} progress, {len(evals)} evaluations, " + ", ".join(f"{v} {k}" for k, v in counts.items())
      + f"; nodes the chief saw lost or back: {', '.join(sorted(seen)) or 'none'}"
      + "; Ctrl-C run: ps 1 lost %d, back %d" % tuple(
          sum(o.get("event") == k and o.get("node") == "ps 1" for _, o in a_lines)
          for k in ("node_lost", "node_back")))
sys.exit(1 if bad else 0)
PY
  fail "summaries: $sum: $(cat "$T/summaries-check.out")"
echo "ok: summaries.jsonl: $(tail -n 1 "$T/summaries-check.out")"

# ---------------------------------------------------------------------------
# c. scripts/plot
# ---------------------------------------------------------------------------
png="$T/run.png"
set +e
scripts/plot "$sum" -o "$png" >"$T/plot.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 0 ] || fail "plot: scripts/plot exited $rc: $(cat "$T/plot.out")"
[ -f "$png" ] || fail "plot: exit 0 but no $png: $(cat "$T/plot.out")"
magic=$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')
[ "$magic" = 89504e470d0a1a0a ] || fail "plot: $png is not a PNG (first bytes $magic)"
size=$(stat -c %s "$png")
[ "$size" -ge 20000 ] || fail "plot: $png is $size bytes: too small for three panels"
ihdr=$(head -c 16 "$png" | tail -c 4) # the first chunk's type
[ "$ihdr" = IHDR ] || fail "plot: $png's first chunk is '$ihdr', not IHDR"
read -r w h < <(head -c 24 "$png" | tail -c 8 | od -An -tu1 | awk '{ print $1*16777216 + $2*65536 + $3*256 + $4, $5*16777216 + $6*65536 + $7*256 + $8 }')
[ "$w" -ge 200 ] && [ "$h" -ge 200 ] || fail "plot: $png is ${w}x$h pixels"
echo "ok: scripts/plot: ${w}x$h PNG, $size bytes"
