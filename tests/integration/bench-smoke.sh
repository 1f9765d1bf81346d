#!/usr/bin/env bash
# Every benchmark in its --smoke mode (tiny sizes, seconds), so that a
# change that breaks one fails here rather than on the day it is run: each
# must exit 0 and end with its target lines, every one of the form
# `target NAME: FIGURE (bar OP BAR): ok|MISSED`.  The figures of a smoke say
# nothing about speed and are not judged; a benchmark that installs its
# reference (iperf3, python3-torch) does so here too.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

# bench-gpu runs the CUDA build (build/cuda, its default), not $BIN.
run_bench() {
  local b=$1 rc=0 args=(--smoke --binary "$BIN")
  [ "$b" != bench-gpu ] || args=(--smoke)
  scripts/$b "${args[@]}" >"$T/$b.log" 2>&1 || rc=$?
  echo "$rc" >"$T/$b.rc"
}
# Two lanes side by side (each bench picks free ports and its own
# directories; the smokes' figures are not judged, so the other lane's load
# changes nothing checked here); the installs, bench-engine's and
# bench-ps's, one after the other in lane A.  bench-sparse's PyTorch
# reference needs the python3-torch that bench-engine installs where it is
# missing: there it runs after both lanes.  Then every outcome, in order.
lane_a=(bench-engine bench-recovery bench-ps)
lane_b=(bench-ckpt bench-ring bench-algorithms bench-gpu bench-pooling)
after=()
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then lane_b+=(bench-sparse); else after=(bench-sparse); fi
(for b in "${lane_a[@]}"; do run_bench "$b"; done) &
lane_pid=$!
for b in "${lane_b[@]}"; do run_bench "$b"; done
wait "$lane_pid"
for b in "${after[@]}"; do run_bench "$b"; done

for b in "${lane_a[@]}" "${lane_b[@]}" "${after[@]}"; do
  rc=$(cat "$T/$b.rc" 2>/dev/null || echo "none")
  # bench-gpu alone may not run here, and only for the reasons of a machine
  # without a GPU: with no nvcc or no GPU it says `skip: no nvcc (...)` or
  # `skip: no GPU (...)` and exits 0, with no targets.  Any other bench that
  # says skip (bench-ring where it cannot make network namespaces, which
  # scripts/deps and root provide), or bench-gpu for another reason, fails:
  # its checks would be waived.
  [ "$rc" = 0 ] || fail "scripts/$b --smoke exited $rc"
  skips=$(grep '^skip: ' "$T/$b.log" || true)
  # bench-sparse's PyTorch reference is scripts/ctr-reference with
  # python3-torch: where either is missing, one line says so and every run
  # and target of paramserv's is still there; no other skip of its is waived.
  if [ $b = bench-sparse ]; then
    skips=$(grep -vxE 'skip: pytorch reference: (scripts/ctr-reference not found|python3 cannot import torch \(Debian package python3-torch\))' <<<"$skips" || true)
  fi
  if [ -n "$skips" ]; then
    [ $b = bench-gpu ] || fail "scripts/$b --smoke did not run: $skips (only bench-gpu may skip, for no GPU or no nvcc)"
    [ "$(wc -l <<<"$skips")" = 1 ] && grep -qE '^skip: no (GPU|nvcc) \(' <<<"$skips" ||
      fail "scripts/$b --smoke skipped for a reason other than no GPU or no nvcc: $skips"
    ! grep -q '^target ' "$T/$b.log" || fail "scripts/$b --smoke said '$skips' and printed target lines"
    echo "skip: bench-gpu: ${skips#skip: }"
    continue
  fi
  lines=$(grep '^target ' "$T/$b.log" || true)
  [ -n "$lines" ] || fail "scripts/$b --smoke printed no target line"
  bad=$(grep -Ev '^target [^ :]+: -?[0-9.eE+-]+[^ ]* \(bar (<=|>=) [0-9.eE+-]+[^ )]*\): (ok|MISSED)$' <<<"$lines" || true)
  [ -z "$bad" ] || fail "scripts/$b --smoke: malformed target line: $(head -n 1 <<<"$bad")"
  echo "ok: $b --smoke: $(wc -l <<<"$lines") targets ($(tr '\n' ';' <<<"$lines" | sed 's/;$//; s/;/; /g'))"
done
