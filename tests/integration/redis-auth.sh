#!/usr/bin/env bash
# Redis AUTH from the config: an ACL user with a password file works end to
# end; a wrong password is one clear line and exit status 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

REDIS_PORT=$(free_ports 1)
start redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$T" --requirepass "default-pw-9f2" --user paramserv on ">ps-pw-3c1" "~*" "&*" "+@all"
for ((i = 0; i < 200; i++)); do
  redis-cli -p "$REDIS_PORT" -a default-pw-9f2 --no-auth-warning ping 2>/dev/null | grep -q PONG && break
  sleep 0.05
done

printf 'ps-pw-3c1\n' >"$T/redis-pw"
chmod 600 "$T/redis-pw"
write_config "$T/a.conf" 1 1 "model.name=mlp" "train.last_step=50" "train.threads=1" \
  "replication.mode=log" "redis.user=paramserv" "redis.password_file=redis-pw"
start_shards ps "$T/a.conf" 1
"$BIN" worker --config "$T/a.conf" --index 0 >"$T/w0.log" 2>&1 || fail "worker exited $?"
rc() { redis-cli -p "$REDIS_PORT" --user paramserv --pass ps-pw-3c1 --no-auth-warning "$@"; }
# The snapshot plus the log entries after it hold every one of the 50 updates.
# One script reads both: the shard's last snapshot may switch between two reads.
read -r v n < <(rc eval "local v = redis.call('HGET', KEYS[1], 'version')
  local n = redis.call('XLEN', redis.call('GET', KEYS[2]))
  return v .. ' ' .. n" 2 '{itest:ps:0}:meta' '{itest:ps:0}:logkey')
[ "$((v + n))" -eq 50 ] || fail "as user paramserv: snapshot version $v + $n log entries, expected 50 updates"
stop_shards ps 1
echo "ok: ACL user paramserv with a password file: 50 updates in Redis (snapshot at version $v + $n log entries)"

printf 'wrong\n' >"$T/redis-pw"
set +e
"$BIN" ps --config "$T/a.conf" --index 0 >"$T/bad.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "wrong Redis password: exit $rc, expected 1"
grep -q "AUTH as paramserv failed" "$T/bad.log" || fail "wrong Redis password: $(cat "$T/bad.log")"
echo "ok: wrong Redis password: $(grep -o 'redis .*AUTH.*' "$T/bad.log" | head -1)"
