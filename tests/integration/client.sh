#!/usr/bin/env bash
# A user's own training loop on the client API (client_example.c) trains
# through 2 shards to a high accuracy on its synthetic data.  $CLIENT_EXAMPLE:
# another build of client_example.c to run (install.sh's, built out of tree
# against the installed library).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
EXAMPLE=${CLIENT_EXAMPLE:-$(dirname "$BIN")/tests/client_example}

write_config "$T/c.conf" 2 1 "model.name=mlp" "model.hidden=32" "train.lr=0.01"
start_shards ps "$T/c.conf" 2
"$EXAMPLE" "$T/c.conf" 0 200 >"$T/example.log" 2>&1 || fail "client_example exited $?"
acc=$(sed -n 's/^example: test accuracy \([0-9.]*\).*/\1/p' "$T/example.log")
before=$(sed -n 's/^example: test accuracy .*(\([0-9.]*\) before)/\1/p' "$T/example.log")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || fail "client_example: accuracy '$acc', expected >= 0.9"
awk -v a="$before" 'BEGIN { exit !(a < 0.5) }' || fail "client_example: accuracy '$before' before training"
stop_shards ps 2
echo "ok: client example: $(tail -n 1 "$T/example.log" | sed 's/^example: //')"
