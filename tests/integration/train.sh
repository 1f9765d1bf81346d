#!/usr/bin/env bash
# paramserv train end to end on the real data set: it learns, its help
# works, and bad usage gets one line and exit status 2.
set -euo pipefail
BIN=${PARAMSERV:-build/paramserv}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# A short run learns: one epoch over 12800 samples of the mlp reaches well
# above chance (0.10) on the 10000 test images.
"$BIN" train --model mlp --epochs 1 --train-limit 12800 --threads 2 --seed 3 >"$tmp/out" 2>"$tmp/err" \
  || fail "train exited $?: $(cat "$tmp/err")"
last=$(tail -n 1 "$tmp/out")
case "$last" in done\ steps\ 100\ samples\ 12800\ *) ;; *) fail "last line: $last" ;; esac
acc=${last##* test_acc }
awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || fail "test accuracy $acc after one short epoch, expected >= 0.75"
echo "ok: mlp, 100 steps: test accuracy $acc"

# The cnn runs its forward and backward passes end to end.
"$BIN" train --model cnn --max-steps 3 --batch 16 --no-eval >"$tmp/out" 2>"$tmp/err" \
  || fail "cnn train exited $?: $(cat "$tmp/err")"
grep -q '^done steps 3 samples 48 ' "$tmp/out" || fail "cnn: $(tail -n 1 "$tmp/out")"
echo "ok: cnn, 3 steps"

# The same seed gives the same run, to the last digit of the loss.
for i in 1 2; do
  "$BIN" train --model mlp --epochs 1 --train-limit 2560 --threads 2 --no-eval --seed 9 \
    | grep '^epoch' | awk '{print $4}' >"$tmp/loss$i"
done
cmp -s "$tmp/loss1" "$tmp/loss2" || fail "same seed, different loss: $(cat "$tmp/loss1") vs $(cat "$tmp/loss2")"
echo "ok: same seed, same loss $(cat "$tmp/loss1")"

# Help for the binary and the verb.
"$BIN" --help | grep -c '^  train ' >/dev/null || fail "paramserv --help does not list train"
"$BIN" train --help | grep -c -- '--optimizer' >/dev/null || fail "paramserv train --help lacks --optimizer"
echo "ok: help"

# Bad usage: one line naming the thing and what was expected, exit 2.
expect_usage() {
  local want=$1; shift
  set +e
  "$BIN" "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "$*: exit $rc, expected 2"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "$*: stderr is not one line: $(cat "$tmp/err")"
  grep -q -- "$want" "$tmp/err" || fail "$*: '$(cat "$tmp/err")' does not mention '$want'"
  echo "ok: $* -> $(cat "$tmp/err")"
}
expect_usage "--lr 'abc'" train --lr abc
expect_usage "--batch '0'" train --batch 0
expect_usage "--optimizer 'rmsprop'" train --optimizer rmsprop
expect_usage "model 'resnet'" train --model resnet
expect_usage "hidden sizes '12,,3'" train --hidden 12,,3
expect_usage "--model-file with --hidden" train --model-file models/mlp.json --hidden 64
expect_usage "unable to open $tmp/none.json" train --model-file "$tmp/none.json"
printf '{"input": [1, 28, 28], "layers": [{"type": "dense", "name": "a", "out": 10}]}' >"$tmp/m.json"
expect_usage "$tmp/m.json: the last layer must be log_softmax" train --model-file "$tmp/m.json"
expect_usage "--schedule 'linear'" train --schedule linear
expect_usage "unknown option '--bogus'" train --bogus
expect_usage "unexpected argument 'extra'" train extra
expect_usage "--epochs: expected a value" train --epochs
expect_usage "unknown verb 'trian'" trian
