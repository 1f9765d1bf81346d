#!/usr/bin/env bash
# Your own dense data as numpy files (src/data/NPY.md): a separable problem
# of 3 classes and 20 features written with numpy, trained through
# `paramserv local` (1 shard, 2 workers, [data] format = npy, paths beside
# the config) with a model file of input [20]: the final test accuracy is
# above 0.9 where chance is 0.33, the checkpoint records no normalization
# and `paramserv eval --npy` gets its accuracy back; `paramserv train
# --npy` learns it too; `paramserv check` reads the files.  A float64
# X.npy is refused at start with one line naming the file and exit status
# 2, before any process starts, by `paramserv local` and `paramserv train`.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

/usr/bin/python3 -c 'import numpy' 2>/dev/null ||
  fail "no numpy for /usr/bin/python3: scripts/deps installs it (python3-numpy)"

# 3 Gaussian clusters in 20 dimensions, 2000 training and 500 test samples.
mkdir -p "$T/data"
/usr/bin/python3 - "$T/data" <<'PY'
import os, sys
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(5)
centers = rng.normal(0, 1.0, size=(3, 20))
def split(name, n):
    y = rng.integers(0, 3, size=n)
    X = centers[y] + rng.normal(0, 1.0, size=(n, 20))
    os.makedirs(f"{d}/{name}", exist_ok=True)
    np.save(f"{d}/{name}/X.npy", X.astype(np.float32))
    np.save(f"{d}/{name}/y.npy", y.astype(np.int64))
split("train", 2000)
split("test", 500)
# The same training set with X as float64: what np.save writes unless told.
os.makedirs(f"{d}/f8", exist_ok=True)
np.save(f"{d}/f8/X.npy", np.load(f"{d}/train/X.npy").astype(np.float64))
np.save(f"{d}/f8/y.npy", np.load(f"{d}/train/y.npy"))
PY
cat >"$T/data/model.json" <<'EOF'
{"input": [20], "layers": [
  {"type": "dense", "name": "hidden", "out": 32}, {"type": "relu"},
  {"type": "dense", "name": "out", "out": 3}, {"type": "log_softmax"}]}
EOF
# Relative paths: beside the config.
cat >"$T/data/npy.conf" <<'EOF'
[model]
file = model.json
[data]
format = npy
train = train
test = test
[train]
batch = 32
last_step = 400
[replication]
mode = off
EOF
sed 's/^train = train$/train = f8/' "$T/data/npy.conf" >"$T/data/bad.conf"

# --- paramserv local -------------------------------------------------------
run="$T/run"
"$BIN" local --config "$T/data/npy.conf" --dir "$run" --fresh --ps 1 --workers 2 \
  >"$T/local.log" 2>&1 || fail "paramserv local exited $?: $(tail -3 "$T/local.log")"
acc=$(/usr/bin/python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r.get("accuracy", 0))' \
  "$run/report.json")
awk -v a="$acc" 'BEGIN { exit !(a > 0.9) }' ||
  fail "final test accuracy $acc: expected > 0.9 (chance is 0.33): $(cat "$run/report.json")"
w0=$(sed -n 's/^final test_acc \([0-9.]*\) .*/\1/p' "$run/logs/worker-0.log")
awk -v a="$w0" 'BEGIN { exit !(a > 0.9) }' || fail "worker 0's final test_acc '$w0': expected > 0.9"
grep -q "^train = $T/data/train\$" "$run/cluster.conf" || fail "the run's config lacks the absolute [data] train"
echo "ok: paramserv local on npy data: test accuracy $acc (the chief's), worker 0's final test_acc $w0"

ckpt=$(ls -d "$run/checkpoints"/ckpt-* | tail -n 1)
/usr/bin/python3 - "$ckpt/MANIFEST.json" <<'PY' || fail "$ckpt: not the normalization of npy data"
import json, sys
n = json.load(open(sys.argv[1]))["normalization"]
if n != {"divide": 1.0, "mean": 0.0, "std": 1.0}:
    sys.exit(f"normalization {n}")
PY
line=$("$BIN" eval "$ckpt" --npy "$T/data/test" | tail -n 1) || fail "paramserv eval --npy: $line"
ev=$(sed -n 's/^eval step .* test_acc \([0-9.]*\)$/\1/p' <<<"$line")
awk -v a="$ev" 'BEGIN { exit !(a > 0.9) }' || fail "paramserv eval --npy: '$line'"
echo "ok: $(basename "$ckpt") records no normalization; paramserv eval --npy: $line"

# The run's config: the user's has no cluster of its own.
out=$("$BIN" check --config "$run/cluster.conf" 2>&1 || true)
grep -q "^ok: \[data\] train $T/data/train: npy, 2000 samples of 20 floats, labels 0..2\$" <<<"$out" ||
  fail "paramserv check: no ok line for [data] train: $out"
echo "ok: paramserv check: $(grep '^ok: \[data\] test' <<<"$out")"

# --- paramserv train --npy -------------------------------------------------
"$BIN" train --model-file "$T/data/model.json" --npy "$T/data/train" --npy-test "$T/data/test" \
  --epochs 3 --batch 32 --threads 1 >"$T/train.log" 2>&1 ||
  fail "paramserv train --npy exited $?: $(tail -3 "$T/train.log")"
tacc=$(sed -n 's/^done .* test_acc \([0-9.]*\) .*/\1/p' "$T/train.log")
awk -v a="$tacc" 'BEGIN { exit !(a > 0.9) }' || fail "paramserv train --npy: test_acc '$tacc'"
echo "ok: paramserv train --npy: test_acc $tacc after 3 epochs"

# --- a float64 X.npy, refused at start -------------------------------------
# expect_refusal NAME CMD...: exit status 2, stderr one line that names
# f8/X.npy and its dtype, and no process left of it.
expect_refusal() {
  local name=$1 rc=0
  shift
  "$@" >"$T/refused.out" 2>"$T/refused.err" </dev/null || rc=$?
  [ "$rc" -eq 2 ] || fail "$name: exit status $rc, expected 2: $(cat "$T/refused.err")"
  [ "$(wc -l <"$T/refused.err")" -eq 1 ] ||
    fail "$name: stderr has $(wc -l <"$T/refused.err") lines, expected 1: $(cat "$T/refused.err")"
  grep -q "^paramserv: error: .*$T/data/f8/X.npy: descr '<f8': expected '<f4'" "$T/refused.err" ||
    fail "$name: stderr does not name f8/X.npy and its dtype: $(cat "$T/refused.err")"
  echo "ok: $name: exit 2: $(cat "$T/refused.err")"
}
expect_refusal "paramserv local on a float64 X.npy" \
  "$BIN" local --config "$T/data/bad.conf" --dir "$T/bad" --fresh --ps 1 --workers 1
[ -z "$(left "$T/bad")" ] || fail "processes left of the refused run: $(left "$T/bad")"
[ ! -e "$T/bad/logs/worker-0.log" ] || fail "the refused run started a worker"
expect_refusal "paramserv train --npy on a float64 X.npy" \
  "$BIN" train --model-file "$T/data/model.json" --npy "$T/data/f8" --epochs 1
