#!/usr/bin/env bash
# scripts/chaos, short: 1000 steps (3000 under SAN, whose gaps are 3 times
# as long) of `paramserv local --nemesis
# kill,pause,redis-errors` (kill -9, SIGSTOP/SIGCONT, Redis refusing writes)
# and the same run without faults, a fault every 0.7-1.75 s (times fault_gap's scale; each round has
# every kind once, so the first three faults are one of each; a run that
# ended before them is run again with twice the steps, up to 3 times:
# scripts/chaos --steps).  The report
# must end with `result: ok`:
# no acknowledged update lost or applied twice (scripts/check-history over
# the histories), accuracy within 0.01 of the calm run.  The stalls outside
# the fault windows are printed, not asserted (wall-clock times: no
# --stall-bar).  Each fault kind was injected, and nothing is
# left running or stopped afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

# left DIR: the processes whose command line names DIR, with their state.
left() {
  local f args
  for f in /proc/[0-9]*/cmdline; do
    mapfile -d '' -t args 2>/dev/null <"$f" || continue
    case " ${args[*]} " in
    *"$1/"*) echo "${f//[^0-9]/} ($(awk '{ print $3 }' "${f%cmdline}stat" 2>/dev/null)): ${args[*]}" ;;
    esac
  done
}

set +e
steps=$(awk -v k="${PS_TEST_FAULT_GAP_SCALE:-1}" 'BEGIN { print (k > 1 ? 3000 : 1000) }')
scripts/chaos --steps "$steps" --nemesis kill,pause,redis-errors --fault-gap "$(fault_gap 0.7)" --seed 1 --dir "$T/chaos" \
  --binary "$BIN" >"$T/chaos.log" 2>&1
rc=$?
set -e
report=$(sed -n '/^== chaos report/,$p' "$T/chaos.log")
[ -n "$report" ] || fail "scripts/chaos exited $rc without a report"
grep -q '^result: ok$' <<<"$report" || { echo "$report" >&2; fail "scripts/chaos: $(tail -n 1 <<<"$report")"; }
[ "$rc" -eq 0 ] || fail "scripts/chaos said result: ok but exited $rc"
for kind in kill pause redis-errors; do
  grep -q "\"kind\":\"$kind\"" "$T/chaos/chaos/nemesis.jsonl" || fail "no $kind fault was injected"
done
[ -z "$(left "$T/chaos")" ] || fail "left after the runs: $(left "$T/chaos")"
grep -E '^(faults|  (kill|pause|redis-errors) |  acknowledged|  applied|longest|final)' <<<"$report" |
  sed 's/^ */ok: /'
echo "ok: result: ok"
