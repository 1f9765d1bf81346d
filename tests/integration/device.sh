#!/usr/bin/env bash
# Asking for a GPU: `train --device` and `[worker] device`.  Where there is
# no GPU (or no CUDA in the build), asking for one gets exactly one line on
# stderr naming what is missing and exit 2; a device that does not parse is
# refused in one line that names it.  Both builds are checked: $PARAMSERV
# (the default build, without CUDA) and build/cuda/paramserv (make CUDA=1,
# which make test builds in cuda-check whenever nvcc is here).  Where a GPU
# answers, the CUDA build trains on it instead.  Only a machine without a
# GPU may answer "no GPU": where the kernel shows an NVIDIA device (a device
# node, the driver's /proc entry, as tests/gpu/gpu_present.h asks), or with
# PS_REQUIRE_GPU=1 (scripts/gpu-check), the CUDA build's exit 2 for
# --device cuda is a failure, and so is every GPU part skipped.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
CUDA_BIN=${PARAMSERV_CUDA:-build/cuda/paramserv}
required=""
if [ -n "${PS_REQUIRE_GPU:-}" ] && [ "${PS_REQUIRE_GPU}" != 0 ]; then
  required="PS_REQUIRE_GPU=$PS_REQUIRE_GPU"
fi
must_gpu=$required
if [ -e /dev/nvidia0 ] || [ -e /proc/driver/nvidia/version ]; then
  must_gpu="an NVIDIA device is present"
fi
# links_cuda BIN: BIN was built with make CUDA=1 (links the CUDA runtime).
links_cuda() { local l; l=$(ldd "$1" 2>/dev/null) || true; [[ "$l" == *libcudart* ]]; }

# one_line_exit2 WHAT PATTERN CMD...: CMD exits 2 with one stderr line
# matching PATTERN.
one_line_exit2() {
  local what=$1 pattern=$2 rc=0
  shift 2
  "$@" >"$T/out" 2>"$T/err" || rc=$?
  [ "$rc" = 2 ] || fail "$what: exit $rc, expected 2 ($(head -c 300 "$T/err"))"
  [ "$(wc -l <"$T/err")" = 1 ] || fail "$what: $(wc -l <"$T/err") lines on stderr, expected 1: $(cat "$T/err")"
  grep -Eq -- "$pattern" "$T/err" || fail "$what: '$(cat "$T/err")' does not match /$pattern/"
  echo "ok: $what: $(cat "$T/err")"
}

# check_build BIN: --device cuda without a GPU, and bad devices.  Adds BIN
# to $gpu_builds when a GPU answered it.
gpu_builds=" "
check_build() {
  local bin=$1 rc=0
  "$bin" train --device cuda --max-steps 5 --batch 32 --train-limit 640 --no-eval \
    >"$T/out" 2>"$T/err" || rc=$?
  if [ "$rc" = 0 ]; then
    grep -q '^done steps 5 samples 160 ' "$T/out" || fail "$bin --device cuda: $(tail -n 1 "$T/out")"
    echo "ok: $bin train --device cuda: a GPU answered and trained 5 steps"
    gpu_builds+="$bin "
  else
    if [ -n "$must_gpu" ] && links_cuda "$bin"; then
      fail "$bin train --device cuda: exit $rc, but $must_gpu: a GPU must answer ($(head -c 300 "$T/err"))"
    fi
    one_line_exit2 "$bin train --device cuda" '^paramserv: error: cuda(:[0-9]+)?: ' \
      "$bin" train --device cuda --max-steps 5 --no-eval
  fi
  one_line_exit2 "$bin train --device cuda:x" "--device 'cuda:x': expected cpu, cuda or cuda:N" \
    "$bin" train --device cuda:x
  one_line_exit2 "$bin train --device gpu" "--device 'gpu': expected cpu, cuda or cuda:N" \
    "$bin" train --device gpu
}

check_build "$BIN"
"$BIN" train --help | grep -c -- '--device D' >/dev/null || fail "$BIN train --help lacks --device"
# A build without CUDA names what it lacks, whatever device it is asked for.
# Whether $BIN has CUDA is read from the build (make CUDA=1 links the CUDA
# runtime), not from the message under test.
ldd "$BIN" >"$T/ldd" 2>&1 || fail "ldd $BIN: $(cat "$T/ldd")"
if grep -q 'libcudart' "$T/ldd"; then
  echo "ok: $BIN links the CUDA runtime: the no-CUDA message is not its to give"
else
  rc=0
  "$BIN" train --device cuda:1 --no-eval >/dev/null 2>"$T/err" || rc=$?
  want="paramserv: error: cuda: this paramserv was built without CUDA (make CUDA=1)"
  [ "$rc" = 2 ] && [ "$(cat "$T/err")" = "$want" ] ||
    fail "$BIN (no CUDA runtime linked) train --device cuda:1: exit $rc, '$(cat "$T/err")', expected 2 and '$want'"
  echo "ok: $BIN (no CUDA) train --device cuda:1: $want"
fi

if [ -x "$CUDA_BIN" ]; then
  check_build "$CUDA_BIN"
else
  [ -z "$required" ] || fail "$CUDA_BIN not built, and $required (make CUDA=1)"
  echo "skip: $CUDA_BIN not built (make cuda-check builds it where nvcc is)"
fi

# [worker] device: a value that does not parse is a config error naming it
# (exit 2, as every config error); cuda where there is none is exit 2.
write_config "$T/gpu.conf" 1 1 "worker.device=gpu"
rc=0
"$BIN" worker --config "$T/gpu.conf" --index 0 >"$T/out" 2>"$T/err" || rc=$?
[ "$rc" = 2 ] || fail "[worker] device = gpu: exit $rc, expected 2 ($(cat "$T/err"))"
[ "$(wc -l <"$T/err")" = 1 ] || fail "[worker] device = gpu: $(wc -l <"$T/err") lines: $(cat "$T/err")"
grep -q '\[worker\] device = gpu: expected cpu, cuda or cuda:N' "$T/err" ||
  fail "[worker] device = gpu: $(cat "$T/err")"
echo "ok: [worker] device = gpu: $(cat "$T/err")"

for bin in "$BIN" "$CUDA_BIN"; do
  [ -x "$bin" ] || continue
  write_config "$T/cuda.conf" 1 1 "worker.device=cuda:0" "worker.give_up_s=1"
  rc=0
  timeout 30 "$bin" worker --config "$T/cuda.conf" --index 0 >"$T/out" 2>"$T/err" || rc=$?
  case "$gpu_builds" in
    *" $bin "*)
      # A GPU answered: the worker then looks for shards that this test does
      # not start, and gives up after give_up_s.
      [ "$rc" = 1 ] || fail "$bin worker on a GPU without shards: exit $rc, expected 1"
      echo "ok: $bin worker, [worker] device = cuda:0: a GPU answered (exit 1 without shards)" ;;
    *)
      [ "$rc" = 2 ] || fail "$bin worker, [worker] device = cuda:0, no GPU: exit $rc, expected 2 ($(cat "$T/err"))"
      [ "$(wc -l <"$T/err")" = 1 ] || fail "$bin worker on cuda: $(wc -l <"$T/err") lines: $(cat "$T/err")"
      grep -Eq '\[worker\] device: cuda(:[0-9]+)?: ' "$T/err" || fail "$bin worker on cuda: $(cat "$T/err")"
      echo "ok: $bin worker, [worker] device = cuda:0: $(cat "$T/err")" ;;
  esac
done

# paramserv worker --device: a device for this worker only (one GPU host
# among CPU hosts, with the same config).
write_config "$T/cpu.conf" 1 1
one_line_exit2 "$BIN worker --device gpu" "--device 'gpu': expected cpu, cuda or cuda:N" \
  "$BIN" worker --config "$T/cpu.conf" --index 0 --device gpu
one_line_exit2 "$BIN ps --device cuda" "a shard does not compute gradients" \
  "$BIN" ps --config "$T/cpu.conf" --index 0 --device cuda
case "$gpu_builds" in
  *" $BIN "*) ;;
  *) one_line_exit2 "$BIN worker --device cuda (no GPU)" '\[worker\] device: cuda(:[0-9]+)?: ' \
       "$BIN" worker --config "$T/cpu.conf" --index 0 --device cuda ;;
esac

# paramserv local with a worker that cannot have its device: exit 2 is not
# restarted (as the units' RestartPreventExitStatus=2); the run stops at
# once with that worker's line and exits 2 itself, and nothing is left
# running.
if [ -z "${gpu_builds// /}" ]; then
  printf '[worker]\ndevice = cuda\n' >"$T/local-cuda.conf"
  rc=0
  timeout 60 "$BIN" local --config "$T/local-cuda.conf" --dir "$T/local-cuda" --fresh --ps 1 \
    --workers 1 --last-step 100 >"$T/local-cuda.log" 2>&1 || rc=$?
  [ "$rc" = 2 ] || fail "paramserv local, device = cuda, no GPU: exit $rc, expected 2 ($(tail -3 "$T/local-cuda.log"))"
  line=$(grep -m1 'exited with status 2, which a restart would not change' "$T/local-cuda.log") ||
    fail "paramserv local, device = cuda, no GPU: no stop line: $(cat "$T/local-cuda.log")"
  grep -q 'restarts: 0' "$T/local-cuda.log" || fail "paramserv local restarted the worker: $(cat "$T/local-cuda.log")"
  echo "ok: paramserv local, [worker] device = cuda, no GPU: $line"
fi

# Where a GPU answers: 2 shards, one CPU worker and one GPU worker reach the
# accuracy of two CPU workers (within 0.01; mixed_run runs either).
mixed_run() {
  local name=$1 dev1=$2 bin1=$3 conf="$T/$1.conf"
  write_config "$conf" 2 2 "model.name=mlp" "train.last_step=4000" "train.threads=1" \
    "train.log_every=500" "train.schedule=cosine"
  train_2x2 "$name" "$conf" "$bin1" --device "$dev1"
}
for bin in $gpu_builds; do
  mixed_run cpu2 cpu "$BIN"
  cpu_acc=$acc
  mixed_run mixed cuda "$bin"
  awk -v a="$acc" -v b="$cpu_acc" 'BEGIN { exit !(a >= b - 0.01) }' ||
    fail "one CPU + one GPU worker: test accuracy $acc, two CPU workers $cpu_acc (bar: within 0.01)"
  echo "ok: one CPU + one GPU worker: test accuracy $acc; two CPU workers: $cpu_acc"
done
if [ -z "${gpu_builds// /}" ]; then
  [ -z "$required" ] || fail "no GPU answered, and $required"
  echo "skip: no GPU (the mixed CPU + GPU cluster needs one)"
fi
