#!/usr/bin/env bash
# Checkpoints a run cannot use are never started over nor deleted:
#  - a run of another model (hidden 32 -> 48) in the same paramserv local
#    directory exits 2 with one line naming the newest checkpoint and why,
#    and every earlier checkpoint is still there, byte for byte;
#  - the same with every checkpoint damaged (a flipped byte in each
#    shard-0.lz4);
#  - with [checkpoint] unusable = set_aside the new model's run starts from
#    the seed and ends with exit 0, the earlier checkpoints moved, whole,
#    into checkpoints/unusable/;
#  - a newer damaged checkpoint beside valid older ones: the run restores
#    the newest valid one and sets the damaged one aside (it would
#    otherwise overwrite it on reaching its step); retention keeps
#    max_to_keep by step (test_checkpoint.c checks that it never counts nor
#    deletes another model's).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

conf() { # conf FILE HIDDEN [more lines]
  local f=$1 h=$2
  shift 2
  printf '[model]\nname = mlp\nhidden = %s\n[checkpoint]\nevery_steps = 200\n%s\n' "$h" "$*" >"$f"
}
conf "$T/a.conf" 32
conf "$T/b.conf" 48
conf "$T/b-aside.conf" 48 "unusable = set_aside"
run="$T/run"
ck="$run/checkpoints"

# local CONF NAME LAST [ARGS]: run paramserv local in $run; sets rc, and
# $T/NAME.chief to the lines the chief logged in this run.
local_run() {
  local c=$1 name=$2 last=$3 from=0
  shift 3
  [ -f "$run/logs/chief.log" ] && from=$(wc -l <"$run/logs/chief.log")
  set +e
  timeout 180 "$BIN" local --config "$c" --dir "$run" --ps 1 --workers 1 --last-step "$last" "$@" \
    >"$T/$name.log" 2>&1
  rc=$?
  set -e
  [ "$rc" -ne 124 ] || fail "$name: paramserv local did not end within 180 s"
  tail -n +"$((from + 1))" "$run/logs/chief.log" >"$T/$name.chief"
}
# flip FILE OFFSET: invert one byte.
flip() {
  /usr/bin/python3 -c 'import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0xff]))' "$1" "$2"
}
# sums DIR: every file under DIR with its sha256, sorted (the checkpoints' bytes).
sums() { (cd "$1" && find . -type f -path './ckpt-*' -print0 | sort -z | xargs -0 sha256sum); }

local_run "$T/a.conf" a 600 --fresh
[ "$rc" -eq 0 ] || fail "model A's run exited $rc"
(cd "$ck" && ls -d ckpt-*) >"$T/a.list"
na=$(wc -l <"$T/a.list")
[ "$na" -ge 2 ] && [ "$(tail -1 "$T/a.list")" = ckpt-000000600 ] ||
  fail "model A: expected 2 or more checkpoints, the last ckpt-000000600, found: $(echo $(cat "$T/a.list"))"
sums "$ck" >"$T/a.sums"

# --- another model, same directory --------------------------------------
local_run "$T/b.conf" b 600
[ "$rc" -eq 2 ] || fail "model B over model A's checkpoints exited $rc, expected 2"
line=$(grep -c 'none fits this cluster' "$T/b.chief" || true)
[ "$line" -eq 1 ] || fail "model B: the chief said 'none fits this cluster' $line times, expected once"
grep -q "holds $na checkpoints and none fits this cluster (the newest, ckpt-000000600: .*layout mismatch" \
  "$T/b.chief" || fail "model B: the refusal does not name ckpt-000000600 and the mismatch: $(grep 'none fits' "$T/b.chief")"
grep -q '^local: .*chief.*which a restart would not change' "$T/b.log" ||
  fail "model B: local did not stop on the chief's refusal: $(tail -3 "$T/b.log")"
sums "$ck" | cmp -s - "$T/a.sums" || fail "model B: model A's checkpoints changed: $(sums "$ck" | diff - "$T/a.sums")"
echo "ok: another model in the same directory: exit 2, one line ($(grep -o 'holds [0-9]* checkpoints.*layout mismatch' "$T/b.chief" | cut -c1-90)...); the $na checkpoints untouched"

# --- every checkpoint damaged ---------------------------------------------
cp -a "$ck" "$T/a-ckpts"
for f in "$ck"/ckpt-*/shard-0.lz4; do flip "$f" $(($(stat -c %s "$f") / 2)); done
sums "$ck" >"$T/damaged.sums"
local_run "$T/a.conf" damaged 600
[ "$rc" -eq 2 ] || fail "model A over its damaged checkpoints exited $rc, expected 2"
grep -q "holds $na checkpoints and none fits this cluster (the newest, ckpt-000000600: " "$T/damaged.chief" ||
  fail "damaged: no refusal naming ckpt-000000600: $(grep -i 'skipped\|none fits' "$T/damaged.chief")"
sums "$ck" | cmp -s - "$T/damaged.sums" || fail "damaged: the checkpoints changed"
echo "ok: every checkpoint damaged: exit 2, $(grep -o 'the newest, ckpt-000000600: [^)]*' "$T/damaged.chief" | cut -c1-100); untouched"
rm -rf "$ck" && cp -a "$T/a-ckpts" "$ck"

# --- unusable = set_aside ---------------------------------------------------
local_run "$T/b-aside.conf" aside 400
[ "$rc" -eq 0 ] || fail "model B with unusable = set_aside exited $rc"
[ "$(grep -c 'set aside into' "$T/aside.chief")" -eq "$na" ] ||
  fail "set_aside: expected $na 'set aside' lines: $(grep 'set aside' "$T/aside.chief")"
(cd "$ck/unusable" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$T/aside.sums"
cmp -s "$T/a.sums" "$T/aside.sums" ||
  fail "set_aside: checkpoints/unusable/ does not hold model A's checkpoints byte for byte"
[ -f "$ck/ckpt-000000400/MANIFEST.json" ] || fail "set_aside: no ckpt-000000400 of model B"
grep -q 'mlp 784-48-10' "$ck/ckpt-000000400/MANIFEST.json" ||
  fail "set_aside: ckpt-000000400 is not model B's: $(grep -o '"model": "[^"]*"' "$ck/ckpt-000000400/MANIFEST.json")"
echo "ok: unusable = set_aside: model A's $na checkpoints moved whole into checkpoints/unusable/, model B trained to 400 from the seed"

# --- a newer damaged checkpoint beside valid ones -------------------------
# Model B on to 800 (its final ckpt-800 beside ckpt-400 and any between),
# then ckpt-800 damaged: the next run restores the newest valid one below
# it, sets ckpt-800 aside (it would overwrite it at step 800), and goes on
# to 1200 with max_to_keep 2.
local_run "$T/b.conf" b800 800
[ "$rc" -eq 0 ] || fail "model B to 800 exited $rc"
prev=$(cd "$ck" && ls -d ckpt-* | tail -2 | head -1)
[ "$prev" != ckpt-000000800 ] || fail "model B to 800: no checkpoint below ckpt-000000800"
flip "$ck/ckpt-000000800/shard-0.lz4" 100
printf 'max_to_keep = 2\n' >>"$T/b.conf"
local_run "$T/b.conf" newer 1200
[ "$rc" -eq 0 ] || fail "model B, newest damaged, exited $rc"
grep -q 'checkpoint ckpt-000000800 skipped: .*shard-0.lz4' "$T/newer.chief" ||
  fail "newer: the damaged ckpt-800 not skipped"
grep -q "loaded from $prev" "$T/newer.chief" || fail "newer: did not restore $prev"
grep -q 'checkpoint ckpt-000000800 set aside into' "$T/newer.chief" && [ -d "$ck/unusable/ckpt-000000800" ] ||
  fail "newer: the damaged ckpt-800 was not set aside: $(ls "$ck" "$ck/unusable")"
got=$(cd "$ck" && ls -d ckpt-* | tr '\n' ' ')
set -- $got
[ $# -eq 2 ] && [ "$2" = ckpt-000001200 ] ||
  fail "newer: max_to_keep 2 left '$got', expected 2 ending with ckpt-000001200"
echo "ok: newest damaged: restored $prev, set ckpt-800 aside, kept $got"
