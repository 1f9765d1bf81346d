#!/usr/bin/env bash
# Bad input and exactly-once over a real socket against a real shard
# (tests/integration/ps_wire.c does the talking).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
WIRE=${PS_WIRE:-$(dirname "$BIN")/tests/ps_wire}

write_config "$T/wire.conf" 2 2 "model.name=mlp"
start_shards ps "$T/wire.conf" 1
"$WIRE" "$T/wire.conf" || fail "ps_wire"
# One log line per refused peer, naming it and the reason.
n=$(grep -c 'closing$' "$T/ps0.log" || true)
[ "$n" -ge 12 ] || fail "expected a log line per refused connection, found $n"
grep -m1 'closing$' "$T/ps0.log" | sed 's/^/ok: logged: /'
stop_shards ps 1
echo "ok: shard exited 0 on SIGTERM"

# A slice of about 6.5 MB, more than a socket's send buffer (tcp_wmem's
# 4 MB at most): a reply the reader is slow to take is written in parts.
write_config "$T/big.conf" 2 2 "model.name=mlp" "model.hidden=4096"
start_shards big "$T/big.conf" 1
"$WIRE" "$T/big.conf" slow-pull || fail "ps_wire slow-pull"
stop_shards big 1
