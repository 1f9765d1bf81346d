#!/usr/bin/env bash
# Checkpoints the run can rely on:
#  - a checkpoint directory the chief cannot write (a read-only bind mount)
#    is found at its start: exit 2, one line naming the directory and why;
#  - a final checkpoint that fails (the directory made read-only during the
#    run) is retried, then the run ends non-zero and is not done: no
#    "reached last_step", paramserv local exits with the chief's failure;
#  - a FIFO named like a shard file or the index is refused in one line by
#    ckpt verify and ckpt ls, never waited on.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

[ "$(id -u)" = 0 ] || skip "not root (a read-only bind mount needs CAP_SYS_ADMIN)"
MOUNTS=()
trap 'for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || true; done; cleanup' EXIT
# ro DIR: DIR becomes a read-only bind mount of itself.
ro() {
  mount --bind "$1" "$1" || fail "mount --bind $1"
  MOUNTS+=("$1")
  mount -o remount,ro,bind "$1" || fail "mount -o remount,ro,bind $1"
  ! touch "$1/.x" 2>/dev/null || fail "$1 is still writable after the read-only remount"
}

# --- unwritable at start ------------------------------------------------
mkdir -p "$T/ro"
ro "$T/ro"
write_config "$T/c.conf" 1 1 "checkpoint.dir=$T/ro/ckpt" "replication.self_init=no"
set +e
timeout 30 "$BIN" chief --config "$T/c.conf" >"$T/chief-ro.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "chief with a read-only checkpoint directory exited $rc, expected 2: $(tail -n 3 "$T/chief-ro.log")"
[ "$(grep -c 'error' "$T/chief-ro.log")" -eq 1 ] || fail "expected one error line: $(cat "$T/chief-ro.log")"
grep -q "error: \[checkpoint\] dir: $T/ro/ckpt: cannot create: Read-only file system" "$T/chief-ro.log" ||
  fail "the line does not name the directory and the reason: $(grep error "$T/chief-ro.log")"
echo "ok: read-only checkpoint directory at start: exit 2: $(grep -o 'error: .*file system' "$T/chief-ro.log")"

# --- the final checkpoint fails ---------------------------------------------
run="$T/run"
printf '[checkpoint]\nevery_secs = 0\nevery_steps = 0\n' >"$T/final.conf"
start local "$BIN" local --config "$T/final.conf" --dir "$run" --fresh --ps 1 --workers 1 --last-step 1000
wait_step "$run/checkpoints/summaries.jsonl" 1 60
ro "$run/checkpoints"
set +e
wait_exit "$PID_local" 180
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "local exited 0 although its final checkpoint could not be written"
grep -q 'the final checkpoint at global step 1000 failed 5 times' "$run/logs/chief.log" ||
  fail "no line about the failed final checkpoint: $(grep -i 'checkpoint' "$run/logs/chief.log" | tail -n 3)"
! grep -q 'reached last_step' "$run/logs/chief.log" || fail "the run was marked done without its final checkpoint"
[ -z "$(ls -d "$run"/checkpoints/ckpt-* 2>/dev/null)" ] || fail "a checkpoint was written into a read-only directory?"
echo "ok: final checkpoint failed: local exited $rc, $(grep -o 'the final checkpoint at global step 1000 failed 5 times' "$run/logs/chief.log"), not marked done"

# --- FIFOs in a checkpoint directory: refused in one line, never waited on.
"$BIN" local --dir "$T/fiforun" --fresh --ps 1 --workers 1 --last-step 100 >"$T/fiforun.log" 2>&1 ||
  fail "a run of 100 steps: $(tail -3 "$T/fiforun.log")"
cp -r "$T/fiforun/checkpoints" "$T/fifo"
latest=$(ls -d "$T"/fifo/ckpt-* | sort | tail -1)
rm "$latest/shard-0.lz4"
mkfifo "$latest/shard-0.lz4"
rc=0
timeout 20 "$BIN" ckpt verify "$latest" >"$T/verify.out" 2>&1 || rc=$?
[ "$rc" != 124 ] || fail "ckpt verify waited on a FIFO named shard-0.lz4"
[ "$rc" != 0 ] || fail "ckpt verify accepted a FIFO as shard-0.lz4: $(cat "$T/verify.out")"
grep -q "shard-0.lz4: not a regular file" "$T/verify.out" || fail "ckpt verify: $(cat "$T/verify.out")"
echo "ok: a FIFO named shard-0.lz4: ckpt verify exits $rc: $(grep -o '[^ ]*shard-0.lz4: not a regular file[^\"]*' "$T/verify.out" | head -1)"
rm "$T/fifo/checkpoint"
mkfifo "$T/fifo/checkpoint"
rc=0
timeout 20 "$BIN" ckpt ls "$T/fifo" >"$T/ls.out" 2>&1 || rc=$?
[ "$rc" != 124 ] || fail "ckpt ls waited on a FIFO named checkpoint (the index)"
grep -q "checkpoint: not a regular file" "$T/ls.out" || fail "ckpt ls, a FIFO index: exit $rc: $(cat "$T/ls.out")"
echo "ok: a FIFO as the checkpoint index: ckpt ls exits $rc in one line: $(grep -o 'checkpoint: not a regular file.*' "$T/ls.out")"
