#!/usr/bin/env bash
# A model file (src/nn/MODELFILE.md) that is neither built-in model,
# models/examples/strided-cnn.json, trains in `paramserv local` under
# kills (scripts/chaos: nothing acknowledged lost, accuracy within 0.01 of
# the calm run); its checkpoint's npy export loads into numpy by the file's
# layer names, and numpy running the file's layers on those arrays gets
# the chief's accuracy.  Bad model files and a variables-only model for a
# worker are refused in one line that names the file and the layer.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
MODEL=models/examples/strided-cnn.json

set +e
scripts/chaos --steps 2000 --nemesis kill --fault-gap "$(fault_gap 0.7)" --seed 4 --dir "$T/chaos" \
  --binary "$BIN" --model-file "$MODEL" >"$T/chaos.log" 2>&1
rc=$?
set -e
report=$(sed -n '/^== chaos report/,$p' "$T/chaos.log")
[ -n "$report" ] || fail "scripts/chaos exited $rc without a report: $(tail -5 "$T/chaos.log")"
grep -q '^result: ok$' <<<"$report" || { echo "$report" >&2; fail "scripts/chaos: $(tail -n 1 <<<"$report")"; }
grep -q "^file = $PWD/$MODEL\$" "$T/chaos/chaos/cluster.conf" || fail "the run's config lacks [model] file"
# Under kills: the nemesis's own events (nemesis.jsonl) show at least one
# process killed with kill -9 and back (a run in which no fault fired would
# say `result: ok` too).
counts=$(/usr/bin/python3 - "$T/chaos/chaos/nemesis.jsonl" <<'PY'
import json, sys
f = {}
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e["kind"] == "kill":
        f.setdefault(e["fault"], {})[e["event"]] = e["target"]
killed = [d["killed"] for d in f.values() if "killed" in d]
back = [d for d in f.values() if "killed" in d and "recovered" in d]
print(len(killed), len(back), ",".join(sorted(set(killed))) or "-")
PY
) || fail "cannot read the chaos run's nemesis.jsonl"
read -r kills back targets <<<"$counts"
[ "$kills" -ge 1 ] || fail "no process was killed during the chaos run (nemesis.jsonl: $kills kills)"
[ "$back" -ge 1 ] || fail "none of the $kills killed processes came back during the chaos run"
echo "ok: model file under kills: $kills processes killed with kill -9 ($targets), $back back before the run ended"
acc=$(sed -n 's/^final test accuracy: under faults \([0-9.]*\),.*/\1/p' <<<"$report")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.85) }' || fail "accuracy $acc under kills: expected >= 0.85"
grep -E '^(faults|  acknowledged|  applied|final)' <<<"$report" | sed 's/^ */ok: model file under kills: /'

# The last checkpoint, exported as npy, evaluated by numpy.
ckpt=$(ls -d "$T/chaos/chaos/checkpoints"/ckpt-* | tail -n 1)
out=$("$BIN" ckpt export "$ckpt" --format npy "$T/npy") || fail "ckpt export: $out"
line=$(/usr/bin/python3 tests/integration/model_npy_eval.py "$MODEL" "$T/npy" \
  /usr/share/datasets/fashion-mnist) || fail "numpy evaluation: $line"
step=$((10#$(basename "$ckpt" | sed 's/ckpt-//')))
chief=$(sed -n "s/.*evaluation at global step $step: .*test accuracy \([0-9.]*\).*/\1/p" \
  "$T/chaos/chaos/logs/chief.log" | tail -n 1)
[ -n "$chief" ] || fail "the chief logged no evaluation at step $step"
np_acc=$(sed -n 's/.*test accuracy \([0-9.]*\)$/\1/p' <<<"$line")
awk -v a="$np_acc" -v b="$chief" 'BEGIN { d = a - b; exit !(d < 0.002 && d > -0.002) }' ||
  fail "numpy's accuracy $np_acc on the export of $(basename "$ckpt"), the chief's $chief"
echo "ok: $(basename "$ckpt") exported: $line (the chief's: $chief)"

# Bad files: one line naming the file and the layer; nothing starts.
write_config "$T/bad.conf" 1 1 "model.file=bad.json"
printf '{"input": [1, 28, 28], "layers": [\n  {"type": "conv2d", "name": "c", "out": 8, "kernel": 40},\n  {"type": "log_softmax"}]}\n' >"$T/bad.json"
set +e
msg=$("$BIN" ps --config "$T/bad.conf" --index 0 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] && [ "$(wc -l <<<"$msg")" -eq 1 ] &&
  grep -q "$T/bad.json: layer 1 (conv2d c): kernel 40 over an input of side 28" <<<"$msg" ||
  fail "a bad model file: exit $rc, '$msg'"
echo "ok: a bad model file: $msg"
printf '{"variables": [{"name": "w", "shape": [3], "init": "zeros"}]}\n' >"$T/v.json"
write_config "$T/v.conf" 1 1 "model.variables=v.json"
set +e
msg=$("$BIN" worker --config "$T/v.conf" --index 0 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -qF "[model] variables = v.json: a model of variables and no layers" <<<"$msg" ||
  fail "a worker of a variables-only model: exit $rc, '$msg'"
echo "ok: a worker of a variables-only model: exit 2: $(tail -n 1 <<<"$msg")"
