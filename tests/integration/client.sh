#!/usr/bin/env bash
# A user's own training loop on the client API (client_example.c) trains
# through 2 shards to a high accuracy on its synthetic data.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
EXAMPLE=$(dirname "$BIN")/tests/client_example

write_config "$T/c.conf" 2 1 "model.name=mlp" "model.hidden=32" "train.lr=0.01"
start ps0 "$BIN" ps --config "$T/c.conf" --index 0
start ps1 "$BIN" ps --config "$T/c.conf" --index 1
wait_for "$T/ps0.log" "listening on" 10
wait_for "$T/ps1.log" "listening on" 10
"$EXAMPLE" "$T/c.conf" 0 200 >"$T/example.log" 2>&1 || fail "client_example exited $?"
acc=$(sed -n 's/^example: test accuracy \([0-9.]*\).*/\1/p' "$T/example.log")
before=$(sed -n 's/^example: test accuracy .*(\([0-9.]*\) before)/\1/p' "$T/example.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || fail "client_example: accuracy '$acc', expected >= 0.9"
awk -v a="$before" 'BEGIN { exit !(a < 0.5) }' || fail "client_example: accuracy '$before' before training"
kill -TERM "$PID_ps0" "$PID_ps1"
wait_exit "$PID_ps0" 10 || fail "ps 0 exited $?"
wait_exit "$PID_ps1" 10 || fail "ps 1 exited $?"
echo "ok: client example: $(tail -n 1 "$T/example.log" | sed 's/^example: //')"
