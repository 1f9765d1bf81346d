#!/usr/bin/env bash
# Bad input and exactly-once over a real socket against a real shard
# (tests/integration/ps_wire.c does the talking).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
WIRE=${PS_WIRE:-$(dirname "$BIN")/tests/ps_wire}

write_config "$T/wire.conf" 2 2 "model.name=mlp"
start_shards ps "$T/wire.conf" 1
out=$("$WIRE" "$T/wire.conf") || { echo "$out"; fail "ps_wire"; }
echo "$out"
# One log line per refused peer, naming it and the reason: each refusal
# ps_wire sends (one expect_refusal each, every one reported as
# `ok: WHAT -> ERROR "REASON", closed`) is logged exactly once as
# `PEER: REASON; closing`, and no other connection is logged as refused (the
# only other `closing` lines are the good clients' own closes).
want=$(grep -c '^ *expect_refusal(' tests/integration/ps_wire.c)
mapfile -t errs < <(sed -n 's/^ok: .* -> ERROR "\(.*\)", closed$/\1/p' <<<"$out")
[ "${#errs[@]}" = "$want" ] || fail "ps_wire reported ${#errs[@]} refusals; it sends $want"
for e in "${errs[@]}"; do
  c=$(grep -cF -- ": $e; closing" "$T/ps0.log" || true)
  [ "$c" = 1 ] || fail "the shard logged the refusal '$e' $c times, expected once"
done
n=$(grep 'closing$' "$T/ps0.log" | grep -vc ': peer closed the connection; closing$' || true)
[ "$n" = "$want" ] || fail "the shard logged $n refused connections, ps_wire refused $want"
echo "ok: the shard logged each of the $want refused connections once, with its reason"
grep -m1 'closing$' "$T/ps0.log" | sed 's/^/ok: logged: /'
stop_shards ps 1
echo "ok: shard exited 0 on SIGTERM"

# A slice of about 6.5 MB, more than a socket's send buffer (tcp_wmem's
# 4 MB at most): a reply the reader is slow to take is written in parts.
write_config "$T/big.conf" 2 2 "model.name=mlp" "model.hidden=4096"
start_shards big "$T/big.conf" 1
"$WIRE" "$T/big.conf" slow-pull || fail "ps_wire slow-pull"
stop_shards big 1
