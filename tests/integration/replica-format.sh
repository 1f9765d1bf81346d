#!/usr/bin/env bash
# The replica's formats in a real Redis (src/replica/REDIS.md): a shard
# killed with log entries after its snapshot is restored the same, bit for
# bit, from the format this release writes (5: raw chunks, `v` gradients,
# a table section and `table_floats` for sparse tables, their rows kept by
# key), from the one before (4: the meta without 5's fields) and from 2
# (LZ4 blocks, `g`), as rewritten by replica_keys.py; a gradient cut short and an unknown format are refused
# with one line naming them, and the shard exits 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
/usr/bin/python3 -c 'import redis, lz4.block' 2>/dev/null ||
  fail "python3-redis and python3-lz4 are needed (make deps installs them)"
start_redis
TAG='{itest:ps:0}'
keys() { tests/integration/replica_keys.py "$REDIS_PORT" "$TAG" "$@"; }
meta() { redis-cli -p "$REDIS_PORT" hget "$TAG:meta" "$1"; }

# One snapshot (at the start, version 0) and then only the log: no timer or
# update count takes another before the kill.
conf="$T/c.conf"
write_config "$conf" 1 1 "model.name=mlp" "train.last_step=60" "train.threads=1" \
  "replication.mode=log" "replication.interval_ms=600000" "replication.every_updates=1000000"
start ps0 "$BIN" ps --config "$conf" --index 0
wait_up ps0 10
start w "$BIN" worker --config "$conf" --index 0
wait_exit "$PID_w" 120 || fail "the worker exited $?"
kill -9 "$PID_ps0"
wait "$PID_ps0" 2>/dev/null || true
[ "$(meta version)" = 0 ] || fail "the snapshot is at version $(meta version), expected 0 (only the start's)"
keys save "$T/saved.pickle"

# restore NAME: start a shard on the saved replica; it must restore version
# 60 from the snapshot and 60 entries, then switch in its own first snapshot
# (format 5); that snapshot's "version sha256" in $IMAGE.  (Not run in a
# $(...) subshell: a shard started there would escape the cleanup.)
restore() {
  local name=$1 i
  start "$name" "$BIN" ps --config "$conf" --index 0
  wait_up "$name" 20
  wait_for "$T/$name.log" "restored from Redis" 5
  grep -q "snapshot at version 0 + 60 log entries = version 60," "$T/$name.log" ||
    fail "$name: $(grep -o 'restored from Redis.*' "$T/$name.log" || echo 'no restore line')"
  for ((i = 0; i < 200; i++)); do
    [ "$(meta version)" = 60 ] && [ "$(meta format)" = 5 ] && break
    sleep 0.05
  done
  [ "$(meta version)" = 60 ] || fail "$name: no snapshot of version 60 within 10 s"
  local v="PID_${name//[^a-zA-Z0-9]/_}"
  kill -9 "${!v}"
  wait "${!v}" 2>/dev/null || true
  IMAGE=$(keys image)
}

restore ps-format5
a=$IMAGE
echo "ok: format 5: snapshot at version 0 + 60 log entries = version 60 (image $a)"
keys load "$T/saved.pickle"
keys to-format-4
[ "$(meta format)" = 4 ] || fail "to-format-4 left format $(meta format)"
restore ps-format4
[ "$IMAGE" = "$a" ] || fail "format 4 restored to $IMAGE, format 5 to $a"
echo "ok: format 4: the same state, bit for bit"
keys load "$T/saved.pickle"
conv=$(keys to-format-2)
[ "$(meta format)" = 2 ] && [[ $conv == *", 60 gradients" ]] ||
  fail "to-format-2 left format $(meta format) and converted $conv"
restore ps-format2
b=$IMAGE
[ "$a" = "$b" ] || fail "format 2 restored to $b, format 5 to $a"
echo "ok: format 2 ($conv as LZ4 blocks): the same state, bit for bit"

# refused NAME PATTERN: a shard on the replica as it is now exits 1 with an
# error line matching PATTERN.
refused() {
  local name=$1 pattern=$2 rc=0
  start "$name" "$BIN" ps --config "$conf" --index 0
  local v="PID_${name//[^a-zA-Z0-9]/_}"
  wait_exit "${!v}" 20 || rc=$?
  [ "$rc" = 1 ] || fail "$name: exit status $rc, expected 1"
  grep -Eq "error: .*$pattern" "$T/$name.log" || fail "$name: no error line matching '$pattern'"
  echo "ok: $name refused: $(grep -o 'error: .*' "$T/$name.log" | head -n 1)"
}

keys load "$T/saved.pickle"
keys cut-entry
refused cut-entry 'entry [0-9]+-60: gradient of [0-9]+ bytes, expected [0-9]+'
keys load "$T/saved.pickle"
keys set-format 9
refused format-9 'replica format 9, this shard reads formats 2 to 5'
