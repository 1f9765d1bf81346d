#!/usr/bin/env bash
# `paramserv train` on a broken data set fails with one stderr line naming the broken file.
#
# Usage: PARAMSERV=build/paramserv tests/integration/bad-data.sh
# Each case builds a small data directory (IDX files written with printf and
# gzip, see src/data/IDX.md), runs
#   $PARAMSERV train --model mlp --epochs 1 --data DIR
# and checks: exit status 2 (what a restart would not change); stderr exactly one line, of the form
# "paramserv: error: <message>"; the message contains the offending path.
set -euo pipefail
export LC_ALL=C

: "${PARAMSERV:?set PARAMSERV to the paramserv binary, e.g. PARAMSERV=build/paramserv}"
[ -x "$PARAMSERV" ] || { echo "bad-data.sh: $PARAMSERV: not an executable file" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/bad-data.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# be32 N: N as 4 big-endian bytes.
be32() {
  printf "\\x$(printf %02x $((($1 >> 24) & 255)))\\x$(printf %02x $((($1 >> 16) & 255)))"
  printf "\\x$(printf %02x $((($1 >> 8) & 255)))\\x$(printf %02x $(($1 & 255)))"
}

# header MAGIC DIM...: an IDX header.
header() {
  local magic=$1 d
  shift
  be32 "$magic"
  for d in "$@"; do be32 "$d"; done
}

# zeros N: N zero bytes (valid pixels, and valid labels: class 0).
zeros() { head -c "$1" /dev/zero; }

# good_split DIR SPLIT N: a valid gzipped split of N 28 x 28 images.
good_split() {
  local dir=$1 split=$2 n=$3
  mkdir -p "$dir"
  { header $((0x803)) "$n" 28 28; zeros $((n * 784)); } | gzip -n >"$dir/$split-images-idx3-ubyte.gz"
  { header $((0x801)) "$n"; zeros "$n"; } | gzip -n >"$dir/$split-labels-idx1-ubyte.gz"
}

# expect_failure NAME DIR PATH...: train on DIR fails with one line naming each PATH.
expect_failure() {
  local name=$1 dir=$2 status=0 path
  shift 2
  timeout 120 "$PARAMSERV" train --model mlp --epochs 1 --data "$dir" \
    </dev/null >"$work/stdout" 2>"$work/stderr" || status=$?
  [ "$status" -ne 124 ] || fail "$name: still running after 120 s, expected a quick failure"
  [ "$status" -eq 2 ] || fail "$name: exit status $status, expected 2 (stderr: $(cat "$work/stderr"))"

  local lines line
  lines=$(wc -l <"$work/stderr")
  line=$(head -n 1 "$work/stderr")
  # Exactly one newline, and it ends the file: one whole line, nothing else.
  if [ "$lines" -ne 1 ] || [ "$(wc -c <"$work/stderr")" -ne $((${#line} + 1)) ]; then
    fail "$name: stderr has $lines lines, expected exactly 1:
$(cat "$work/stderr")"
  fi
  [[ $line == "paramserv: error: "* ]] ||
    fail "$name: stderr line \"$line\" does not start with \"paramserv: error: \""
  for path in "$@"; do
    [[ $line == *"$path"* ]] ||
      fail "$name: stderr line \"$line\" does not name $path"
  done
  echo "ok: $name (exit $status): $line"
}

# Every case breaks the train split only; t10k is valid, so that whichever
# split the command reads first, the error can only be about train.

d=$work/bad-magic
good_split "$d" t10k 2
good_split "$d" train 4
{ header $((0x12345678)) 4 28 28; zeros $((4 * 784)); } | gzip -n >"$d/train-images-idx3-ubyte.gz"
expect_failure "bad magic" "$d" "$d/train-images-idx3-ubyte.gz"

d=$work/count-mismatch
good_split "$d" t10k 2
good_split "$d" train 4
{ header $((0x801)) 3; zeros 3; } | gzip -n >"$d/train-labels-idx1-ubyte.gz"
expect_failure "image/label count mismatch" "$d" \
  "$d/train-images-idx3-ubyte.gz" "$d/train-labels-idx1-ubyte.gz"

# A plain (not gzipped) 2-d images file: 4 x 784 instead of 4 x 28 x 28.
d=$work/wrong-dims
good_split "$d" t10k 2
good_split "$d" train 4
rm "$d/train-images-idx3-ubyte.gz"
{ header $((0x802)) 4 784; zeros $((4 * 784)); } >"$d/train-images-idx3-ubyte"
expect_failure "wrong dimensions" "$d" "$d/train-images-idx3-ubyte"

# A plain images file whose header promises 4 images but holds 1000 bytes.
d=$work/truncated
good_split "$d" t10k 2
good_split "$d" train 4
rm "$d/train-images-idx3-ubyte.gz"
{ header $((0x803)) 4 28 28; zeros 1000; } >"$d/train-images-idx3-ubyte"
expect_failure "truncated images file" "$d" "$d/train-images-idx3-ubyte"

expect_failure "missing directory" "$work/no-such-dir" "$work/no-such-dir"

echo "ok: all bad-data cases"
