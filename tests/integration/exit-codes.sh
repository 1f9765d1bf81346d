#!/usr/bin/env bash
# paramserv check's pre-flight, one line per check (exit 1 without Redis,
# 2 for a bad secret, 0 with Redis).  Exit status 2 for what a restart
# would not change: a config that does not load, a secret or Redis password
# file that is missing, too short or readable by others, from every verb
# that reads them (the units' RestartPreventExitStatus and paramserv local
# do not restart a process that exits 2), each in one line naming the file.
# And one paramserv local per directory: a second run there refuses in one
# line naming the first's PID, and --fresh with it deletes nothing of the
# first run.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

# exit2 WHAT PATTERN CMD...: CMD exits 2 with one stderr line matching PATTERN.
exit2() {
  local what=$1 pattern=$2 rc=0
  shift 2
  "$@" >"$T/out" 2>"$T/err" || rc=$?
  [ "$rc" = 2 ] || fail "$what: exit $rc, expected 2 ($(head -c 300 "$T/err"))"
  [ "$(wc -l <"$T/err")" = 1 ] || fail "$what: $(wc -l <"$T/err") lines on stderr, expected 1: $(cat "$T/err")"
  grep -Eq -- "$pattern" "$T/err" || fail "$what: '$(cat "$T/err")' does not match /$pattern/"
  echo "ok: $what: exit 2, $(cat "$T/err")"
}

conf="$T/c.conf"
write_config "$conf" 1 1
verbs=("chief" "ps --index 0" "worker --index 0")

# A typo in the config: every verb, status too.
cp "$conf" "$T/typo.conf"
printf '[train]\nlast_stpe = 5\n' >>"$T/typo.conf"
for v in "${verbs[@]}" status; do
  # shellcheck disable=SC2086  # the verb and its index
  exit2 "$v, a misspelt setting" "typo.conf:[0-9]+: .*last_stpe" "$BIN" $v --config "$T/typo.conf"
done

# The secret: missing, then readable by others.
mv "$T/secret" "$T/secret.kept"
for v in "${verbs[@]}"; do
  # shellcheck disable=SC2086
  exit2 "$v, no secret file" "secret $T/secret: cannot open: No such file" "$BIN" $v --config "$conf"
done
mv "$T/secret.kept" "$T/secret"
chmod 644 "$T/secret"
for v in "${verbs[@]}"; do
  # shellcheck disable=SC2086
  exit2 "$v, a secret others can read" "secret $T/secret has mode 0644" "$BIN" $v --config "$conf"
done
chmod 600 "$T/secret"

# A Redis password file that is missing: status reads it too.
cp "$conf" "$T/pw.conf"
printf '[redis]\npassword_file = %s/no-such-password\n' "$T" >>"$T/pw.conf"
for v in "${verbs[@]}" status; do
  # shellcheck disable=SC2086
  exit2 "$v, no Redis password file" "password_file $T/no-such-password: cannot open" \
    "$BIN" $v --config "$T/pw.conf"
done

# paramserv check: one line per check; Redis not running is exit 1 and
# says that nothing answers there.
rc=0
"$BIN" check --config "$conf" >"$T/check.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "check without Redis: exit $rc, expected 1: $(cat "$T/check.out")"
for want in "^ok: config " "^ok: secret .*mode 600" "^ok: model mlp " "^ok: \[model\] data_dir .*train set, 60000 images" \
  "^ok: \[checkpoint\] dir " "^ok: shard 0, 127.0.0.1:[0-9]*: free on this machine" "^error: redis: nothing answers: "; do
  grep -q -- "$want" "$T/check.out" || fail "check without Redis: no line /$want/: $(cat "$T/check.out")"
done
echo "ok: check without Redis: exit 1; $(grep '^error' "$T/check.out")"
chmod 644 "$T/secret"
rc=0
"$BIN" check --config "$conf" >"$T/check.out" 2>&1 || rc=$?
chmod 600 "$T/secret"
[ "$rc" = 2 ] || fail "check with a 0644 secret: exit $rc, expected 2: $(cat "$T/check.out")"
grep -q "^error: secret .* has mode 0644" "$T/check.out" || fail "check with a 0644 secret: $(cat "$T/check.out")"
echo "ok: check with a 0644 secret: exit 2; $(grep '^error' "$T/check.out" | head -1)"
# With no Redis, a shard says once that nothing answers there, then waits
# (said again every 30 s): in 4 s, at most its 3 start lines.
write_config "$T/nr.conf" 1 1 "replication.mode=log" "replication.self_init=no" \
  "redis.address=127.0.0.1:$(free_ports 1)"
timeout 4 "$BIN" ps --config "$T/nr.conf" --index 0 >"$T/nr.log" 2>&1 || true
grep -q "waiting for Redis to restore shard 0: .*nothing answers there, and no redis-server runs on this machine" "$T/nr.log" ||
  grep -q "waiting for Redis to restore shard 0: .*nothing answers there, though a redis-server runs on this machine" "$T/nr.log" ||
  fail "no Redis: the shard did not say that nothing answers: $(cat "$T/nr.log")"
n=$(grep -c "warn" "$T/nr.log")
[ "$n" -le 3 ] || fail "no Redis: $n warnings in 4 s, expected at most 3: $(cat "$T/nr.log")"
echo "ok: no Redis: the shard said it $n times in 4 s: $(grep -o 'nothing answers there[^;]*' "$T/nr.log")"

start_redis
write_config "$T/r.conf" 1 1
rc=0
"$BIN" check --config "$T/r.conf" >"$T/check.out" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "check with Redis: exit $rc: $(cat "$T/check.out")"
grep -q "^ok: redis 127.0.0.1:$REDIS_PORT answers" "$T/check.out" || fail "check with Redis: $(cat "$T/check.out")"
grep -q "^warn: redis .* keeps its data in memory only" "$T/check.out" ||
  fail "check: Redis without persistence not said: $(cat "$T/check.out")"
echo "ok: check with Redis (no persistence): exit 0, $(grep -c '^ok' "$T/check.out") ok lines, $(grep '^warn' "$T/check.out" | cut -c1-80)..."

# paramserv local runs check's file checks first: a secret too short.
head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n' | head -c 11 >"$T/short"
chmod 600 "$T/short"
printf '[cluster]\nsecret_file = %s/short\n' "$T" >"$T/short.conf"
exit2 "local, a secret too short" "secret $T/short is 11 bytes: expected at least 16" \
  "$BIN" local --config "$T/short.conf" --dir "$T/short-run" --ps 1 --workers 1 --last-step 10

# paramserv local with a config that does not load.
exit2 "local, a misspelt setting" "last_stpe" "$BIN" local --config "$T/typo.conf" --dir "$T/typo-run"

# One paramserv local per directory.
run="$T/run"
start first "$BIN" local --dir "$run" --fresh --ps 1 --workers 1 --last-step 100000
wait_step "$run/checkpoints/summaries.jsonl" 1 60
exit2 "a second local in the same directory" \
  "--dir $run: another paramserv local \\(PID $PID_first\\) is running there" \
  "$BIN" local --dir "$run" --ps 1 --workers 1 --last-step 100
exit2 "a second local with --fresh in the same directory" \
  "another paramserv local \\(PID $PID_first\\)" \
  "$BIN" local --dir "$run" --fresh --ps 1 --workers 1 --last-step 100
[ -f "$run/cluster.conf" ] && [ -s "$run/logs/chief.log" ] ||
  fail "the refused --fresh run deleted the first run's files"
kill -0 "$PID_first" 2>/dev/null || fail "the first run did not survive the second's start"
kill -TERM "$PID_first"
rc=0
wait_exit "$PID_first" 30 || rc=$?
[ "$rc" = 143 ] || fail "the first run exited $rc after SIGTERM, expected 143"
# Once it is gone, the directory is free again.
"$BIN" local --dir "$run" --fresh --ps 1 --workers 1 --last-step 100 >"$T/again.log" 2>&1 ||
  fail "local in the freed directory: exit $?: $(tail -3 "$T/again.log")"
echo "ok: the first run stopped: the directory takes a new run (exit 0)"

# A worker whose data set is missing exits 2 (a restart would not change
# it), in one error line naming the directory.
write_config "$T/nodata.conf" 1 1 "model.data_dir=$T/no-such-data"
rc=0
timeout 30 "$BIN" worker --config "$T/nodata.conf" --index 0 >"$T/nodata.out" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "worker without its data set: exit $rc, expected 2: $(cat "$T/nodata.out")"
grep -q "error: \[model\] data_dir: $T/no-such-data: cannot open data set directory" "$T/nodata.out" ||
  fail "worker without its data set: $(cat "$T/nodata.out")"
echo "ok: worker without its data set: exit 2, $(grep -o 'error: .*' "$T/nodata.out")"
