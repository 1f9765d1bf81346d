#!/usr/bin/env bash
# paramserv train's checkpoints (recovery/FORMAT.md, written through the
# same writer as the chief's):
#  - train --checkpoint-dir D writes D/ckpt-<step>; `paramserv eval` of it
#    prints the test accuracy train printed, and PyTorch on its npy export,
#    with the exported normalization, gets it too;
#  - run again with more epochs, it resumes from D's newest: the step count
#    goes on, and the run is the one an uninterrupted run makes (the same
#    epoch loss and test accuracy to the printed digit);
#  - a one-shard cluster (paramserv local --ps 1) restores train's
#    checkpoint, and train resumes from the cluster's;
#  - Ctrl-C writes a checkpoint at the step reached and exits 130; the same
#    command resumes there and its last epoch is the uninterrupted run's;
#  - --checkpoint-every N writes every N steps, --keep K keeps the K newest;
#  - another model in D is refused in one line, exit 2, every checkpoint
#    left as it was; so is a directory that cannot be written;
#  - --init-from CKPT warm-starts the weights (another model's variables:
#    refused in one line, exit 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
DATA=/usr/share/datasets/fashion-mnist
# 100 steps an epoch: 12800 samples of batch 128.
TRAIN=(train --model mlp --hidden 64 --train-limit 12800 --threads 2 --seed 3)

# run NAME ARGS...: paramserv train ARGS with output in $T/NAME.out; its
# last line (done ...) in $last, its test_acc in $acc.
run() {
  local name=$1
  shift
  "$BIN" "$@" >"$T/$name.out" 2>"$T/$name.err" || fail "$name: train $* exited $?: $(cat "$T/$name.err")"
  last=$(tail -n 1 "$T/$name.out")
  acc=${last##* test_acc }
  acc=${acc%% *}
}

expect2() { # expect2 WANT ARGS...: exit 2 and one line on stderr holding WANT
  local want=$1 rc
  shift
  set +e
  "$BIN" "$@" >"$T/out" 2>"$T/err"
  rc=$?
  set -e
  [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qF -- "$want" "$T/err" ||
    fail "$*: exit $rc, '$(cat "$T/err")' (expected exit 2 and one line holding '$want')"
  echo "ok: exit 2: $(cat "$T/err")"
}

# --- one epoch into D: eval and PyTorch give train's accuracy -------------
D=$T/ck
run one "${TRAIN[@]}" --epochs 1 --checkpoint-dir "$D"
case "$last" in "done steps 100 samples 12800 "*) ;; *) fail "one epoch: $last" ;; esac
grep -q "^train: checkpoint ckpt-000000100 in $D " "$T/one.out" || fail "no checkpoint line: $(cat "$T/one.out")"
[ -f "$D/ckpt-000000100/MANIFEST.json" ] || fail "no $D/ckpt-000000100"
"$BIN" ckpt verify "$D/ckpt-000000100" >/dev/null || fail "ckpt verify of train's checkpoint"
train_acc=$acc
ev=$("$BIN" eval "$D/ckpt-000000100" 2>&1 | tail -n 1)
[ "${ev##* test_acc }" = "$train_acc" ] || fail "train printed test_acc $train_acc, eval: $ev"
echo "ok: train --checkpoint-dir: $last; paramserv eval of ckpt-000000100: $ev"
"$BIN" ckpt export "$D/ckpt-000000100" --format npy "$T/npy" >/dev/null || fail "ckpt export"
torch=$(/usr/bin/python3 tests/integration/model_torch_eval.py "$T/npy" "$DATA" 2>&1) ||
  fail "PyTorch on the export: $torch"
[ "${torch##* test_acc }" = "$train_acc" ] || fail "PyTorch: $torch; train printed $train_acc"
echo "ok: $torch (train printed $train_acc)"

# --- resume: the step count goes on, as one uninterrupted run ------------
run two "${TRAIN[@]}" --epochs 2 --checkpoint-dir "$D"
grep -q "^train: resumed from $D/ckpt-000000100: step 100, data at epoch 1 sample 12800 of 12800$" "$T/two.out" ||
  fail "no resume line: $(head -n 5 "$T/two.out")"
case "$last" in "done steps 200 samples 25600 "*) ;; *) fail "resumed run: $last" ;; esac
[ -f "$D/ckpt-000000200/MANIFEST.json" ] || fail "no ckpt-000000200 after the resumed run"
resumed=$(grep '^epoch 2/2' "$T/two.out" | cut -d' ' -f1-8)
resumed_acc=$acc
run straight "${TRAIN[@]}" --epochs 2
straight=$(grep '^epoch 2/2' "$T/straight.out" | cut -d' ' -f1-8)
[ "$resumed" = "$straight" ] && [ "$resumed_acc" = "$acc" ] ||
  fail "resumed: '$resumed' test_acc $resumed_acc; uninterrupted: '$straight' test_acc $acc"
echo "ok: resumed at step 100 to 200: '$resumed' = the uninterrupted run's, test_acc $acc"
ev=$("$BIN" eval "$D" 2>&1 | tail -n 1)
case "$ev" in "eval step 200 samples 10000 "*" test_acc $resumed_acc") ;;
  *) fail "eval of $D: $ev; train printed test_acc $resumed_acc at step 200" ;; esac
# Nothing left to do: it says so and ends at the same step.
run three "${TRAIN[@]}" --epochs 2 --checkpoint-dir "$D"
case "$last" in "done steps 200 samples 25600 "*) ;; *) fail "a finished run again: $last" ;; esac
echo "ok: the same command again resumes at step 200 and trains nothing: $last"

# --- a one-shard cluster restores train's checkpoint, and train resumes
# from the cluster's: one format, one layout (the cluster's default) ------
cp -a "$D" "$T/both"
printf '[model]\nname = mlp\nhidden = 64\n[checkpoint]\ndir = %s\n' "$T/both" >"$T/both.conf"
"$BIN" local --config "$T/both.conf" --dir "$T/bothrun" --ps 1 --workers 1 --last-step 300 \
  >"$T/bothrun.out" 2>&1 || fail "paramserv local from train's checkpoint: exit $?: $(tail -n 5 "$T/bothrun.out")"
grep -q "shard 0: loaded from ckpt-000000200: version 200, global step 200" "$T/bothrun/logs/chief.log" ||
  fail "the chief did not restore train's ckpt-000000200: $(grep -i 'load\|restor\|error' "$T/bothrun/logs/chief.log")"
[ -f "$T/both/ckpt-000000300/MANIFEST.json" ] || fail "no ckpt-000000300 from the cluster: $(tail -n 5 "$T/bothrun.out")"
# The cluster's worker read the whole training set: so does this run.
run both train --model mlp --hidden 64 --threads 2 --seed 3 --max-steps 400 --checkpoint-dir "$T/both" --no-eval
grep -q "^train: resumed from $T/both/ckpt-000000300: step 300, " "$T/both.out" ||
  fail "train did not resume from the cluster's ckpt-000000300: $(head -n 5 "$T/both.out")"
case "$last" in "done steps 400 samples "*) ;; *) fail "train from the cluster's checkpoint: $last" ;; esac
echo "ok: a one-shard cluster restored train's ckpt-000000200 and trained to 300; train resumed from its ckpt-000000300 to step 400"

# --- Ctrl-C: a final checkpoint at the step reached, exit 130; the same
# command resumes there and ends as the uninterrupted run does ----------
# 10 steps an epoch, 30 epochs: SIGINT once the first epoch line is out.
LONG=("${TRAIN[@]}" --train-limit 1280 --epochs 30 --no-eval)
"$BIN" "${LONG[@]}" --checkpoint-dir "$T/int" >"$T/int.out" 2>"$T/int.err" &
pid=$!
for ((i = 0; i < 600; i++)); do
  grep -q '^epoch 1/30 ' "$T/int.out" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
grep -q '^epoch 1/30 ' "$T/int.out" || fail "no first epoch line in 30 s: $(cat "$T/int.out" "$T/int.err")"
kill -INT "$pid"
set +e
wait "$pid"
rc=$?
set -e
line=$(grep '^train: stopped by SIGINT at step ' "$T/int.out") ||
  fail "SIGINT: exit $rc, no stopped line: $(tail -n 3 "$T/int.out") $(cat "$T/int.err")"
at=${line#train: stopped by SIGINT at step }
at=${at%%;*}
[ "$rc" -eq 130 ] || fail "SIGINT: exit $rc, expected 130: $line"
[ "$at" -ge 10 ] && [ "$at" -lt 300 ] || fail "SIGINT: stopped at step $at, expected 10..299: $line"
name=$(printf 'ckpt-%09d' "$at")
grep -q "^train: checkpoint $name in $T/int " "$T/int.out" || fail "no checkpoint at step $at: $(cat "$T/int.out")"
"$BIN" ckpt verify "$T/int/$name" >/dev/null || fail "ckpt verify $T/int/$name"
run int2 "${LONG[@]}" --checkpoint-dir "$T/int"
grep -q "^train: resumed from $T/int/$name: step $at," "$T/int2.out" || fail "no resume from $name: $(head -n 5 "$T/int2.out")"
run intstraight "${LONG[@]}"
a=$(grep '^epoch 30/30' "$T/int2.out" | cut -d' ' -f1-6)
b=$(grep '^epoch 30/30' "$T/intstraight.out" | cut -d' ' -f1-6)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "${last%% seconds*}" = "$(tail -n 1 "$T/int2.out" | sed 's/ seconds.*//')" ] ||
  fail "interrupted at $at and resumed: '$a'; uninterrupted: '$b'"
echo "ok: SIGINT at step $at: exit 130, $name written and verified; resumed, the last epoch as the uninterrupted run's: '$a'"

# --- every N steps, the K newest kept -------------------------------------
run every "${TRAIN[@]}" --epochs 1 --checkpoint-dir "$T/every" --checkpoint-every 30 --keep 2 --no-eval
kept=$(cd "$T/every" && ls -d ckpt-* | paste -sd' ')
[ "$kept" = "ckpt-000000090 ckpt-000000100" ] || fail "--checkpoint-every 30 --keep 2 kept: $kept"
[ "$(grep -c '^train: checkpoint ckpt-' "$T/every.out")" -eq 4 ] || fail "expected 4 checkpoint lines: $(cat "$T/every.out")"
echo "ok: --checkpoint-every 30 --keep 2: 4 written (30, 60, 90, 100), kept $kept"

# --- another model in D: one line, exit 2, nothing touched ---------------
before=$(cd "$D" && find . -type f -printf '%p %s %T@\n' | sort | md5sum)
expect2 "$D holds checkpoints of another model (the newest, ckpt-000000200: 'mlp 784-64-10'" \
  train --model mlp --hidden 32 --train-limit 12800 --epochs 1 --checkpoint-dir "$D"
expect2 "$D holds checkpoints of another model" \
  train --model-file models/examples/strided-cnn.json --max-steps 1 --checkpoint-dir "$D"
expect2 "$D holds checkpoints of another optimizer (the newest, ckpt-000000200: adam on 1 shard; this run trains with sgd on one shard)" \
  "${TRAIN[@]}" --epochs 3 --optimizer sgd --checkpoint-dir "$D"
after=$(cd "$D" && find . -type f -printf '%p %s %T@\n' | sort | md5sum)
[ "$before" = "$after" ] || fail "a refused run changed $D"
echo "ok: every checkpoint in $D as it was"
touch "$T/file"
expect2 "$T/file" "${TRAIN[@]}" --epochs 1 --checkpoint-dir "$T/file/ck"

# --- warm start -----------------------------------------------------------
run cold "${TRAIN[@]}" --epochs 1 --train-limit 1280 --no-eval
run warm "${TRAIN[@]}" --epochs 1 --train-limit 1280 --no-eval --init-from "$D"
grep -q "^train: weights from $D/ckpt-000000200 (step 200, model mlp 784-64-10)$" "$T/warm.out" || fail "no warm-start line: $(cat "$T/warm.out")"
cold=$(awk '/^epoch 1\/1/ { print $4 }' "$T/cold.out")
warm=$(awk '/^epoch 1\/1/ { print $4 }' "$T/warm.out")
awk -v w="$warm" -v c="$cold" 'BEGIN { exit !(w < c / 2) }' ||
  fail "--init-from: first-epoch loss $warm, from scratch $cold"
echo "ok: --init-from $D: 10 steps' mean loss $warm, from scratch $cold"
expect2 "the model has 4 variables of" \
  train --model mlp --hidden 32 --train-limit 1280 --epochs 1 --init-from "$D/ckpt-000000200"
expect2 "$T/none: No such file or directory" "${TRAIN[@]}" --epochs 1 --init-from "$T/none"
expect2 "--checkpoint-every without --checkpoint-dir" "${TRAIN[@]}" --checkpoint-every 10
"$BIN" train --help | grep -c -- '--checkpoint-every N' >/dev/null || fail "train --help lacks --checkpoint-every"
