#!/usr/bin/env bash
# Ring mode under `paramserv local --nemesis kill,pause,redis-errors` (a
# fault every 1.5-3.75 s, times fault_gap's scale: workers killed and restarted, workers, the chief and
# Redis paused, Redis refusing writes), then the same run calm: both
# exit 0, every member ends at the step limit, and the accuracies are
# within 0.01.  (A ring has no acknowledged pushes to count: its steps are
# all-or-nothing, README.md in src/ring.)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

cat >"$T/ring.conf" <<'CONF'
[cluster]
mode = ring
peer_timeout_ms = 2000
[train]
last_step = 4000
threads = 1
[worker]
heartbeat_ms = 300
CONF
run() {
  local name=$1
  shift
  set +e
  "$BIN" local --config "$T/ring.conf" --workers 3 --seed 5 --dir "$T/$name" "$@" >"$T/$name.out" 2>&1
  local rc=$?
  set -e
  [ "$rc" -eq 0 ] || fail "$name: paramserv local exited $rc: $(tail -3 "$T/$name.out")"
  # Each worker's last incarnation ended at the step limit, or started
  # after the end and found it in Redis, or was killed so near the end
  # that it was still coming back when the chief ended the run (local
  # then stops it, and says so).
  for i in 0 1 2; do
    if grep -q "worker $i was still coming back when the run ended" "$T/$name.out"; then
      continue
    fi
    awk -v i="$i" '$0 ~ "^local: worker " i " starts" { last = "" } /done: |the run already ended/ { last = $0 }
      END { print last }' "$T/$name/logs/worker-$i.log" |
      grep -q "global step 4000[ ,]" ||
      fail "$name: worker $i's last run did not end at step 4000; its log ends: $(tail -4 "$T/$name/logs/worker-$i.log" | tr '\n' '|')"
  done
}
run chaos --nemesis kill,pause,redis-errors --fault-gap "$(fault_gap 1.5)"
run calm
read -r a_chaos a_calm faults kills <<<"$(/usr/bin/python3 - "$T" <<'PY'
import json, sys
c = json.load(open(sys.argv[1] + "/chaos/report.json"))
m = json.load(open(sys.argv[1] + "/calm/report.json"))
k = c["nemesis"]["kinds"]
print(c["accuracy"], m["accuracy"], c["nemesis"]["faults"], k["kill"]["by_role"]["worker"])
PY
)"
[ "$faults" -ge 5 ] || fail "only $faults faults were injected"
[ "$kills" -ge 1 ] || fail "no worker was killed"
awk -v a="$a_chaos" -v b="$a_calm" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }' ||
  fail "accuracy under chaos $a_chaos, calm $a_calm: more than 0.01 apart"
echo "ok: ring under chaos: $faults faults ($kills workers killed), accuracy $a_chaos against $a_calm calm"
