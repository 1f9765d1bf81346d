#!/usr/bin/env bash
# A chief's checkpoint stands alone (recovery/FORMAT.md 4.5, 8):
#  - `paramserv eval CKPT` (no config) gives the test loss and accuracy the
#    chief logged for that step, for a model file that is neither built-in
#    (models/examples/strided-cnn.json: conv2d with stride and padding,
#    maxpool, dropout);
#  - `paramserv ckpt export --format npy` writes model.json and
#    normalization.json beside the arrays, and PyTorch, given only that
#    directory, gets the same accuracy;
#  - an export into a non-empty directory (or over a file) is refused in
#    one line, exit 2, and --force writes it;
#  - eval of a missing path, a file, a directory of no checkpoint, a damaged
#    checkpoint, an unknown format version or a model without layers: one
#    line, exit 2; a version 1 manifest of a model file needs --model-file.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
MODEL=$PWD/models/examples/strided-cnn.json
DATA=/usr/share/datasets/fashion-mnist

# manifest_edit SRC DST PYTHON: DST/MANIFEST.json = SRC's with m edited.
manifest_edit() {
  /usr/bin/python3 - "$1/MANIFEST.json" "$2/MANIFEST.json" "$3" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(m, open(sys.argv[2], "w"), indent=2)
PY
}

printf '[model]\nfile = %s\n[checkpoint]\nevery_steps = 200\n' "$MODEL" >"$T/c.conf"
set +e
"$BIN" local --config "$T/c.conf" --dir "$T/run" --fresh --ps 2 --workers 1 --last-step 300 \
  >"$T/local.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 0 ] || fail "local (strided-cnn, 2 shards, 300 steps) exited $rc"
ck="$T/run/checkpoints/ckpt-000000300"
[ -f "$ck/MANIFEST.json" ] || fail "no checkpoint ckpt-000000300"
chief=$(sed -n 's/.*evaluation at global step 300: test loss \([0-9.]*\), test accuracy \([0-9.]*\).*/\1 \2/p' \
  "$T/run/logs/chief.log" | tail -n 1)
[ -n "$chief" ] || fail "the chief logged no evaluation at step 300"
read -r chief_loss chief_acc <<<"$chief"

# eval, from the checkpoint alone (run from another directory: no config).
bin=$(readlink -f "$BIN")
out=$(cd "$T" && "$bin" eval "$ck" 2>&1) || fail "eval exited $?: $out"
last=$(tail -n 1 <<<"$out")
read -r w1 w2 step w4 n w6 loss w8 acc <<<"$last"
[ "$w1 $w2 $w4 $w6 $w8" = "eval step samples test_loss test_acc" ] && [ "$step" = 300 ] &&
  [ "$n" = 10000 ] || fail "eval's last line: $last"
[ "$acc" = "$chief_acc" ] || fail "eval's accuracy $acc, the chief's $chief_acc at step 300"
awk -v a="$loss" -v b="$chief_loss" 'BEGIN { d = a - b; exit !(d < 0.00006 && d > -0.00006) }' ||
  fail "eval's loss $loss, the chief's $chief_loss"
echo "ok: paramserv eval of the chief's ckpt-000000300 (strided-cnn, 2 shards): test_loss $loss test_acc $acc (the chief logged $chief_loss, $chief_acc)"
"$BIN" eval --help | grep -c -- '--data DIR' >/dev/null || fail "eval --help lacks --data"
"$BIN" eval "$T/run/checkpoints" | tail -n 1 | grep -qx "eval step 300 .* test_acc $acc" ||
  fail "eval of the directory of checkpoints is not its newest"

# The export, and PyTorch on it with nothing else.
out=$("$BIN" ckpt export "$ck" --format npy "$T/npy") || fail "ckpt export: $out"
grep -q 'the model file model.json and the normalization normalization.json' <<<"$out" ||
  fail "ckpt export: $out"
torch=$(/usr/bin/python3 tests/integration/model_torch_eval.py "$T/npy" "$DATA" 2>&1) ||
  fail "PyTorch on the export: $torch"
t_acc=$(sed -n 's/.* test_acc \([0-9.]*\)$/\1/p' <<<"$torch")
[ "$t_acc" = "$acc" ] || fail "PyTorch's accuracy $t_acc on the export, eval's $acc"
echo "ok: $torch (eval: $acc)"
out=$("$BIN" train --model-file "$T/npy/model.json" --max-steps 1 --no-eval --threads 1) ||
  fail "train --model-file the exported model.json: $out"
want=$(sed -n 's/^  "model": "\(.*\)",$/\1/p' "$ck/MANIFEST.json")
grep -qF "train: model $want, " <<<"$out" ||
  fail "the exported model.json is not the checkpoint's model $want: $(head -n 1 <<<"$out")"
echo "ok: the exported model.json is a model file paramserv train takes, the same model"

# A chief's checkpoint (2 shards) warm-starts paramserv train of the model.
out=$("$BIN" train --model-file "$MODEL" --init-from "$ck" --max-steps 5 --train-limit 640 \
  --no-eval --threads 1) || fail "train --init-from the chief's checkpoint: $out"
grep -q "^train: weights from $ck (step 300, model model 1x28x28-10 #" <<<"$out" ||
  fail "train --init-from: $(head -n 1 <<<"$out")"
loss=$(awk '/^epoch 1\/1/ { print $4 }' <<<"$out")
awk -v l="$loss" 'BEGIN { exit !(l < 1.0) }' || fail "train --init-from the chief's step 300: loss $loss"
echo "ok: train --init-from the chief's ckpt-000000300: 5 steps at loss $loss"

# Exports never mix: a target that is not new is refused unless --force.
expect2() { # expect2 WANT CMD...: exit 2 and one line holding WANT
  local want=$1 rc
  shift
  set +e
  "$@" >/dev/null 2>"$T/err"
  rc=$?
  set -e
  [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qF -- "$want" "$T/err" ||
    fail "$*: exit $rc, '$(cat "$T/err")' (expected exit 2 and '$want')"
  echo "ok: ${*#"$BIN" } -> exit 2: $(cat "$T/err")"
}
older=$(ls -d "$T/run/checkpoints"/ckpt-* | head -n 1)
[ "$older" != "$ck" ] || fail "no checkpoint before ckpt-000000300"
before=$(ls -l --time-style=+%s.%N "$T/npy")
expect2 "npy: not empty (" "$BIN" ckpt export "$older" --format npy "$T/npy"
[ "$(ls -l --time-style=+%s.%N "$T/npy")" = "$before" ] || fail "a refused export changed $T/npy"
"$BIN" ckpt export "$older" --format npy --force "$T/npy" >/dev/null ||
  fail "ckpt export --force into $T/npy"
grep -q "checkpoint $(basename "$older") " "$T/npy/model.json" ||
  fail "--force did not write $(basename "$older")'s model.json"
echo "ok: ckpt export --force into it wrote $(basename "$older")'s arrays and model.json"
"$BIN" ckpt export "$ck" --format safetensors "$T/m.safetensors" >/dev/null || fail "export safetensors"
/usr/bin/python3 - "$T/m.safetensors" <<'PY' || fail "the safetensors metadata lacks the model"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
meta = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]
assert len(json.loads(meta["paramserv.network"])["layers"]) == 9, meta
assert json.loads(meta["paramserv.normalization"])["divide"] == 255, meta
PY
expect2 "m.safetensors: exists: expected a new file (--force replaces it)" \
  "$BIN" ckpt export "$ck" --format safetensors "$T/m.safetensors"
"$BIN" ckpt export "$ck" --format safetensors --force "$T/m.safetensors" >/dev/null || fail "--force safetensors"

# eval's refusals.
expect2 "$T/none: No such file or directory" "$BIN" eval "$T/none"
expect2 "not a directory: expected a checkpoint directory" "$BIN" eval "$T/c.conf"
mkdir "$T/empty"
expect2 "$T/empty: not a checkpoint (no MANIFEST.json)" "$BIN" eval "$T/empty"
cp -r "$ck" "$T/damaged"
printf '\xff' | dd of="$T/damaged/shard-1.lz4" bs=1 seek=400 conv=notrunc status=none
expect2 "$T/damaged/shard-1.lz4: " "$BIN" eval "$T/damaged"
cp -r "$ck" "$T/v9"
sed -i 's/"format_version": 2,/"format_version": 9,/' "$T/v9/MANIFEST.json"
expect2 "format_version 9 is not supported: this build reads versions 1 to 3" "$BIN" eval "$T/v9"
cp -r "$ck" "$T/vars"
manifest_edit "$ck" "$T/vars" 'm["network"] = m["builtin"] = m["normalization"] = None'
expect2 "has no layers (network: null, a model of variables only)" "$BIN" eval "$T/vars"
# A version 1 checkpoint names a model file's model by a hash only.
cp -r "$ck" "$T/v1"
manifest_edit "$ck" "$T/v1" 'm["format_version"] = 1; [m.pop(k) for k in ("network", "builtin", "normalization")]'
expect2 "a format version 1 checkpoint names its model only as" "$BIN" eval "$T/v1"
"$BIN" eval "$T/v1" --model-file "$MODEL" | tail -n 1 | grep -qx "eval step 300 .* test_acc $acc" ||
  fail "eval of the version 1 checkpoint with --model-file"
expect2 "models/cnn.json: the model file is the model 'model 1x28x28-10 #" "$BIN" eval "$T/v1" --model-file models/cnn.json
echo "ok: a version 1 checkpoint of a model file evaluates with --model-file: test_acc $acc"
expect2 "--batch '0'" "$BIN" eval "$ck" --batch 0
expect2 "expected a checkpoint CKPT" "$BIN" eval
