#!/usr/bin/env bash
# Checkpoints under fire, with real processes and real kill -9:
#  1. the chief killed at each stage of a checkpoint's commit (shards,
#     manifest, rename, index, retain): the index never names a missing
#     directory, every checkpoint on disk verifies, and a whole-cluster
#     restart loads the newest complete one (never a .tmp- leftover);
#  2. the newest checkpoint damaged (truncated, a flipped byte, a deleted
#     shard file, another model's checkpoint in its place): the restart
#     names it and the reason and falls back to the previous one;
#  3. `lz4 -d` of a shard file gives the bytes whose XXH64 the manifest names;
#  4. `paramserv ckpt export` (npy, safetensors) holds exactly the shard
#     files' values.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash
start_redis
T0=$(date +%s%N)
CHECK=tests/integration/ckpt_npy_check.py

elapsed() { echo "$(( ($(date +%s%N) - T0) / 1000000 )) ms"; }

# reap PID...: kill -9 and wait for each.
reap() {
  local p
  for p in "$@"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
}

# wait_dead PID SECONDS: until PID has exited (quietly: no "Killed" line
# from the shell); returns its exit status.
wait_dead() {
  local pid=$1 secs=$2 i rc=-1
  {
    for ((i = 0; i < secs * 20; i++)); do
      if ! kill -0 "$pid"; then
        rc=0
        wait "$pid" || rc=$?
        break
      fi
      sleep 0.05
    done
  } 2>/dev/null
  [ "$rc" -ge 0 ] || fail "process $pid still running after $secs s"
  return "$rc"
}

# kill_chief PID: kill -9 a chief, and let its lease run out at once (the
# next chief would otherwise wait up to [chief] lease_ms for it).
kill_chief() {
  reap "$1"
  redis-cli -p "$REDIS_PORT" del "{itest}:chief" >/dev/null
}

# index_tmp DIR: the index temporary a crash left (checkpoint.tmp-<token>-<pid>), or "".
index_tmp() { (cd "$1" && ls -d checkpoint.tmp-* 2>/dev/null | head -n 1) || true; }

# loaded_from: "NAME STEP" of shard 0's restore in the chief's summaries
# ($D/summaries.jsonl) since restart_cluster: the checkpoint it loaded
# ("seed" when none) and the global step.  wait_loaded: until there is one.
loaded_from() { summary_field "$D" "$SKIP" restore shard from step | awk '$1 == 0 { print $2, $3; exit }'; }
wait_loaded() { wait_summary "$D" "o.get('event') == 'restore' and o.get('shard') == 0" 30 "$SKIP"; }

# step_of NAME: the step in a checkpoint's name, without the zero padding.
step_of() { echo $((10#${1#ckpt-})); }

# check_dir DIR: the index names no missing directory; `ckpt ls` lists
# exactly the ckpt-<step> directories on disk, none of them a .tmp- or
# .old- leftover, and every one verifies.  Sets CK_ONDISK (their names,
# oldest first), CK_NEWEST (the newest, all of them verifying) and
# CK_LS (the ls output).
check_dir() {
  local dir=$1 name rest listed
  if [ -f "$dir/checkpoint" ]; then
    for name in $(awk '$1 == "latest:" || $1 == "kept:" { print $2 }' "$dir/checkpoint"); do
      [ -d "$dir/$name" ] || fail "the index $dir/checkpoint names $name, which has no directory"
    done
  fi
  CK_LS=$("$BIN" ckpt ls "$dir") || fail "paramserv ckpt ls $dir failed"
  if grep -q -e '\.tmp-' -e '\.old-' <<<"$CK_LS"; then fail "ckpt ls lists a leftover: $CK_LS"; fi
  CK_ONDISK=()
  CK_NEWEST=""
  while read -r name rest; do
    case "$rest" in
      *"missing (listed in the index)"*) fail "ckpt ls: $name is listed in the index but missing" ;;
      *unreadable*) fail "ckpt ls: $name $rest" ;;
    esac
    "$BIN" ckpt verify "$dir/$name" >/dev/null 2>"$T/verify.err" ||
      fail "ckpt verify $dir/$name: $(cat "$T/verify.err")"
    CK_ONDISK+=("$name")
    CK_NEWEST=$name
  done < <(tail -n +2 <<<"$CK_LS")
  listed=$(printf '%s\n' "${CK_ONDISK[@]}")
  [ "$listed" = "$(cd "$dir" && ls -d ckpt-[0-9]* | sort)" ] ||
    fail "ckpt ls lists [$listed], the directory holds [$(ls -A "$dir" | tr '\n' ' ')]"
  [ -n "$CK_NEWEST" ] || fail "no checkpoint on disk in $dir"
}

# ls_state NAME: the STATE column ckpt ls gave NAME in CK_LS.
ls_state() { awk -v n="$1" '$1 == n { print $NF }' <<<"$CK_LS"; }

# restart_cluster CONF TAG [worker]: a whole-cluster restart: every process
# of the previous incarnation is dead already; Redis emptied; shard 0, the
# chief (log $T/chief-TAG.log) and, with "worker", worker 0 started again.
restart_cluster() {
  local conf=$1 tag=$2 with=${3:-}
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  SKIP=$(summaries "$D")
  start_shards "ps-$tag-" "$conf" 1
  [ -n "$with" ] && start "w-$tag" "$BIN" worker --config "$conf" --index 0
  start "chief-$tag" "$BIN" chief --config "$conf"
}

# ======================================================================
# 1. Crash safety: the chief killed inside each stage of the commit.
# ======================================================================
conf="$T/crash.conf"
D="$T/ckpt"
write_config "$conf" 1 1 "model.name=mlp" "train.threads=1" "replication.mode=log" \
  "replication.self_init=no" "checkpoint.dir=$D" "checkpoint.every_steps=100" \
  "checkpoint.every_secs=0" "checkpoint.max_to_keep=3" "chief.eval_every_steps=0"
# The crashing chief of the index and retain stages keeps 1 checkpoint
# instead of 3, so that its retention has something to drop.
sed 's/^max_to_keep=3$/max_to_keep=1/' "$conf" >"$T/crash-keep1.conf"
# A directory with no checkpoint yet: the only way to crash at 'index'
# inside a checkpoint's commit (with checkpoints on disk, the retention a
# chief runs when it starts reaches that crash point first).
sed "s#^dir=$D\$#dir=$T/ckpt-first#" "$conf" >"$T/crash-first.conf"
start_shards ps-a- "$conf" 1
start w-a "$BIN" worker --config "$conf" --index 0
start chief-a "$BIN" chief --config "$conf"
wait_summary "$D" "o.get('event') == 'checkpoint'" 30
kill_chief "$PID_chief_a"
first=$(summary_field "$D" 0 checkpoint name step | awk 'NR == 1 { print "checkpoint " $1 ": step " $2 }')
echo "ok: a committed checkpoint to start from: chief A wrote $first, then kill -9 ($(elapsed))"
ps_pid=$PID_ps_a_0
w_pid=$PID_w_a

for case in shards manifest rename index retain index-first; do
  stage=${case%-first}
  case $case in
    index | retain) bconf="$T/crash-keep1.conf" ;;
    index-first) bconf="$T/crash-first.conf" conf="$T/crash-first.conf" D="$T/ckpt-first" ;;
    *) bconf=$conf ;;
  esac
  before=()
  if [ -d "$D" ]; then
    check_dir "$D"
    before=("${CK_ONDISK[@]}")
  fi
  index_before=$(cat "$D/checkpoint" 2>/dev/null || true)
  # Chief B takes the lease, finds every shard running, and dies at the
  # crash point.
  start "crash-$case" env PS_CKPT_CRASH_AT="$stage" "$BIN" chief --config "$bconf"
  v="PID_crash_${case//-/_}"
  cpid=${!v}
  rc=0
  wait_dead "$cpid" 30 || rc=$?
  [ "$rc" -eq 137 ] || fail "chief with PS_CKPT_CRASH_AT=$stage exited $rc, expected 137 (SIGKILL)"
  grep -q "test crash point '$stage'" "$T/crash-$case.log" ||
    fail "chief exited 137 but logged no crash point '$stage'"
  if grep -q "checkpoint ckpt-[0-9]*: step" "$T/crash-$case.log"; then
    fail "chief B completed a checkpoint before its crash point '$stage'"
  fi
  tmpdir=$(cd "$D" && ls -d .tmp-ckpt-*-"$cpid" 2>/dev/null || true)
  check_dir "$D"
  after=("${CK_ONDISK[@]}")
  # A checkpoint newer than any before the crash, if one appeared.
  new=""
  last_before=""
  [ "${#before[@]}" -eq 0 ] || last_before=${before[-1]}
  [ "$CK_NEWEST" = "$last_before" ] || new=$CK_NEWEST
  case $case in
    shards | manifest)
      [ -n "$tmpdir" ] || fail "crash at '$stage': no .tmp-ckpt-*-$cpid left in $D: $(ls -A "$D")"
      [ -f "$D/$tmpdir/shard-0.lz4" ] || fail "crash at '$stage': $tmpdir has no shard-0.lz4"
      if [ "$stage" = shards ] && [ -e "$D/$tmpdir/MANIFEST.json" ]; then
        fail "crash at 'shards': $tmpdir already has its manifest"
      fi
      [ "$stage" = shards ] || [ -f "$D/$tmpdir/MANIFEST.json" ] ||
        fail "crash at 'manifest': $tmpdir has no manifest"
      [ "${after[*]}" = "${before[*]}" ] ||
        fail "crash at '$stage' changed the checkpoints: [${before[*]}] -> [${after[*]}]"
      what="left $tmpdir ($(cd "$D/$tmpdir" && ls | tr '\n' ' ' | sed 's/ $//')), checkpoints unchanged"
      ;;
    rename)
      [ -z "$tmpdir" ] || fail "crash after the rename: $tmpdir is still there"
      [ -n "$new" ] || fail "crash after the rename: no new checkpoint (newest still $CK_NEWEST)"
      [ "$(ls_state "$new")" = unlisted ] ||
        fail "crash after the rename: $new is '$(ls_state "$new")' in ckpt ls, expected unlisted"
      what="new $new complete, unlisted by the index"
      ;;
    index)
      # (Where the crash lands depends on the build: with checkpoints on
      # disk the retention a chief runs when it starts reaches this crash
      # point before any commit does.)
      itmp=$(index_tmp "$D")
      [ -n "$itmp" ] || fail "crash at 'index': no checkpoint.tmp-* in $D"
      if [ -z "$new" ]; then
        [ "$(cat "$D/checkpoint")" = "$index_before" ] || fail "crash at 'index': the index changed"
        [ "${after[*]}" = "${before[*]}" ] ||
          fail "crash at 'index' changed the checkpoints: [${before[*]}] -> [${after[*]}]"
        what="$itmp ($(grep -c '^kept:' "$D/$itmp") kept) left, the index unchanged"
      else
        [ "$(ls_state "$new")" = unlisted ] || fail "$new is '$(ls_state "$new")', expected unlisted"
        what="new $new committed, unlisted; $itmp left"
      fi
      ;;
    retain)
      [ -z "$(index_tmp "$D")" ] || fail "crash at 'retain': $(index_tmp "$D") left after the rename"
      kept=$(awk '$1 == "kept:" { print $2 }' "$D/checkpoint" | tr '\n' ' ' | sed 's/ $//')
      [ "$kept" = "$CK_NEWEST" ] || fail "crash at 'retain' (max_to_keep 1): the index keeps '$kept'"
      [ "${#after[@]}" -ge 2 ] || fail "crash at 'retain': nothing was left to delete (${after[*]})"
      for name in "${after[@]}"; do
        [ "$name" = "$kept" ] || [ "$(ls_state "$name")" = unlisted ] ||
          fail "crash at 'retain': $name is '$(ls_state "$name")', expected unlisted"
      done
      [ -n "$new" ] || [ "${after[*]}" = "${before[*]}" ] ||
        fail "crash at 'retain': a checkpoint was deleted before the crash: [${before[*]}] -> [${after[*]}]"
      what="the index rewritten to keep $kept only, the $((${#after[@]} - 1)) dropped directories still there"
      ;;
    index-first)
      [ -n "$new" ] || fail "crash at 'index' in the first commit: no checkpoint in $D"
      [ ! -e "$D/checkpoint" ] || fail "crash at 'index' in the first commit: an index exists"
      itmp=$(index_tmp "$D")
      [ -n "$itmp" ] || fail "crash at 'index' in the first commit: no checkpoint.tmp-*"
      [ "$(ls_state "$new")" = unlisted ] || fail "$new is '$(ls_state "$new")', expected unlisted"
      what="first checkpoint $new committed, no index ($itmp left)"
      ;;
  esac
  if [ -n "$tmpdir" ] || [ -n "$new" ]; then
    where="in its first checkpoint's commit"
  else
    where="in the retention a chief runs when it starts, before any checkpoint"
  fi
  expect=$CK_NEWEST
  echo "ok: crash at '$stage' ($where): exit 137; $what; the index names no missing directory;" \
    "${#after[@]} on disk, all verify (${after[*]})"

  # The whole cluster killed and started again from the directory alone.
  reap "$ps_pid" "$w_pid"
  restart_cluster "$conf" "$case" worker
  log="$T/chief-$case.log"
  wait_loaded
  read -r got g <<<"$(loaded_from)"
  [ "$got" = "$expect" ] ||
    fail "restart after the crash at '$stage': loaded from '$got', expected $expect: $(grep 'loaded from\|skipped' "$log")"
  [ "$g" = "$(step_of "$expect")" ] || fail "loaded $expect at global step $g"
  # The worker goes on from the data position the checkpoint recorded.
  pos=$("$BIN" ckpt show "$D/$expect" | sed -n 's/^  worker 0: epoch \([0-9]*\), offset \([0-9]*\)$/epoch \1 offset \2/p')
  wait_for "$T/w-$case.log" "resumed data position" 20
  resumed=$(grep -o 'resumed data position epoch [0-9]* offset [0-9]*' "$T/w-$case.log")
  [ "${resumed#resumed data position }" = "$pos" ] ||
    fail "worker resumed at '$resumed', the checkpoint $expect says '$pos'"
  # Training goes on, and the next checkpoint commits.
  wait_summary "$D" "o.get('event') == 'checkpoint'" 30 "$SKIP"
  next=$(summary_field "$D" "$SKIP" checkpoint name step | awk 'NR == 1 { print "checkpoint " $1 ": step " $2 }')
  [ -z "$tmpdir" ] || [ ! -e "$D/$tmpdir" ] || fail "$tmpdir still there after the restart's retention"
  [ -z "$(index_tmp "$D")" ] || fail "$(index_tmp "$D") still there after the restart's retention"
  echo "ok: whole-cluster restart after the crash at '$stage': shard 0 loaded from $expect" \
    "(global step $g), the worker resumed at its $pos; then $next ($(elapsed))"
  # Killed just after a checkpoint's line, 100 steps before the next write:
  # a kill inside a write is what the crash points above are for.
  v="PID_chief_${case//-/_}"
  kill_chief "${!v}"
  v="PID_ps_${case//-/_}_0"
  ps_pid=${!v}
  v="PID_w_${case//-/_}"
  w_pid=${!v}
done
reap "$ps_pid" "$w_pid"

# ======================================================================
# 2. Damage: the newest of two checkpoints damaged in four ways.
# ======================================================================
# The main run, to its last step, with two checkpoints kept; and a run of
# another model (hidden 64, filter none) whose final checkpoint has the
# same step: a real checkpoint of another layout.
redis-cli -p "$REDIS_PORT" flushall >/dev/null
D="$T/ckpt-main"
O="$T/ckpt-other"
conf="$T/main.conf"
oconf="$T/other.conf"
common=("model.name=mlp" "train.threads=1" "replication.mode=log" "replication.self_init=no"
  "checkpoint.every_secs=0" "chief.eval_every_steps=0" "train.last_step=200")
write_config "$conf" 1 1 "${common[@]}" "checkpoint.dir=$D" "checkpoint.every_steps=50" \
  "checkpoint.max_to_keep=2"
# (write_config rewrites the secret: both configs are written before any
# process of either starts.)
cp "$T/secret" "$T/secret.main"
write_config "$oconf" 1 1 "${common[@]}" "checkpoint.dir=$O" "checkpoint.every_steps=0" \
  "checkpoint.filter=none" "model.hidden=64"
sed -i 's/^secret_file = secret$/secret_file = secret.main/' "$conf"

run_to_end() {  # run_to_end CONF TAG: a fresh cluster until the chief stops it at last_step
  local conf=$1 tag=$2 rc p
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  start_shards "ps-$tag-" "$conf" 1
  start "w-$tag" "$BIN" worker --config "$conf" --index 0
  start "chief-$tag" "$BIN" chief --config "$conf"
  for p in "chief_$tag" "w_$tag" "ps_${tag}_0"; do
    local v="PID_$p"
    rc=0
    wait_exit "${!v}" 60 || rc=$?
    [ "$rc" -eq 0 ] || fail "$p exited $rc at the end of the run"
  done
  wait_summary "$(sed -n 's/^dir=//p' "$conf")" \
    "o.get('event') == 'stop' and o.get('checkpoint') == 'ckpt-000000200'" 1
}
run_to_end "$conf" main
check_dir "$D"
[ "${#CK_ONDISK[@]}" -eq 2 ] || fail "main run: ${#CK_ONDISK[@]} checkpoints on disk (${CK_ONDISK[*]}), expected 2 (max_to_keep 2)"
prev=${CK_ONDISK[0]}
newest=${CK_ONDISK[1]}
[ "$newest" = ckpt-000000200 ] || fail "main run: newest checkpoint $newest, expected ckpt-000000200"
run_to_end "$oconf" other
[ -d "$O/ckpt-000000200" ] || fail "other run: no $O/ckpt-000000200: $(ls -A "$O")"
omodel=$("$BIN" ckpt show "$O/ckpt-000000200" | sed -n 's/^model *//p')
mmodel=$("$BIN" ckpt show "$D/$newest" | sed -n 's/^model *//p')
echo "ok: main run ($mmodel) to last_step 200: chief, ps and worker exit 0; on disk $prev, $newest;" \
  "other run ($omodel, filter none): $(basename "$O")/ckpt-000000200 ($(elapsed))"
cp -a "$D" "$T/pristine"

# damage KIND: damage $D/$newest in that way.
damage() {
  local f="$D/$newest/shard-0.lz4" size
  case $1 in
    truncated) size=$(stat -c %s "$f"); truncate -s $((size / 2)) "$f" ;;
    flipped)
      size=$(stat -c %s "$f")
      /usr/bin/python3 - "$f" $((size / 2)) <<'PY'
import sys
path, off = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(off)
    b = f.read(1)
    f.seek(off)
    f.write(bytes([b[0] ^ 0x20]))
PY
      ;;
    deleted) rm "$f" ;;
    layout) rm -rf "${D:?}/$newest" && cp -a "$O/ckpt-000000200" "$D/$newest" ;;
  esac
}

# reason_of: the reason in a damage message, the text after its last
# ".../shard-N.lz4: " or ".../ckpt-N: " (the file or checkpoint it names).
reason_of() { awk 'sub(/.*(shard-[0-9]+\.lz4|ckpt-[0-9]+): /, "") { print; exit }'; }

for kind in truncated flipped deleted layout; do
  rm -rf "${D:?}" && cp -a "$T/pristine" "$D"
  damage "$kind"
  # The reason's own words, at the start of the text after the file's path
  # (every message names .../shard-0.lz4, so "lz4" anywhere would match any
  # reason): a half-size file is a size mismatch (or a cut frame), a flipped
  # byte a bad lz4 frame or checksum, a deleted file one that cannot be
  # opened, another model's checkpoint a layout mismatch.
  case $kind in
    truncated) words='size mismatch (file \|truncated lz4 frame' ;;
    flipped) words='lz4 frame\|truncated lz4 frame\|xxh64 mismatch' ;;
    deleted) words='cannot open: No such file' ;;
    layout) words='layout mismatch (checkpoint: ' ;;
  esac
  # ckpt verify sees it too (not for another layout: that one is whole).
  if [ "$kind" != layout ]; then
    if "$BIN" ckpt verify "$D/$newest" >/dev/null 2>"$T/verify.err"; then
      fail "ckpt verify passes on the $kind $newest"
    fi
    why=$(reason_of <"$T/verify.err")
    grep -q "^\($words\)" <<<"$why" ||
      fail "ckpt verify on the $kind $newest: the reason '$why' does not start with '$words': $(cat "$T/verify.err")"
  else
    "$BIN" ckpt verify "$D/$newest" >/dev/null 2>"$T/verify.err" ||
      fail "the other model's checkpoint does not verify: $(cat "$T/verify.err")"
  fi
  restart_cluster "$conf" "$kind"
  log="$T/chief-$kind.log"
  wait_loaded
  skip=$(grep "checkpoint $newest skipped: " "$log" || true)
  [ -n "$skip" ] || fail "$kind: the chief did not name $newest as skipped: $(grep -i 'skipped\|loaded' "$log")"
  why=$(reason_of <<<"$skip")
  grep -q "^\($words\)" <<<"$why" || fail "$kind: the reason '$why' does not start with '$words': $skip"
  grep -q "falling back to $prev" <<<"$skip" || fail "$kind: no 'falling back to $prev': $skip"
  read -r got _ <<<"$(loaded_from)"
  [ "$got" = "$prev" ] || fail "$kind: loaded from '$got', expected $prev"
  reason=${skip#*skipped: }
  reason=${reason//$D\//}
  echo "ok: newest $kind: restart skipped $newest (${reason%%; falling back*}) and loaded shard 0 from $prev"
  v="PID_chief_${kind}"
  w="PID_ps_${kind}_0"
  reap "${!v}" "${!w}"
done
rm -rf "${D:?}" && cp -a "$T/pristine" "$D"
echo "ok: damage cases done ($(elapsed))"

# ======================================================================
# 3. lz4 -d of a shard file: the bytes whose XXH64 the manifest names.
# ======================================================================
for c in "$D/$newest" "$D/$prev" "$O/ckpt-000000200"; do
  line=$(/usr/bin/python3 "$CHECK" xxh "$c") || fail "xxh64 check of $c"
  echo "ok: $line"
done

# ======================================================================
# 4. Exports: npy and safetensors hold exactly the shard files' values.
# ======================================================================
for c in "$D/$newest" "$O/ckpt-000000200"; do
  tag=$(basename "$(dirname "$c")")
  out=$("$BIN" ckpt export "$c" --format npy "$T/$tag.npy") || fail "ckpt export npy $c: $out"
  out=$("$BIN" ckpt export "$c" --format safetensors "$T/$tag.safetensors") ||
    fail "ckpt export safetensors $c: $out"
  line=$(/usr/bin/python3 "$CHECK" export "$c" "$T/$tag.npy" "$T/$tag.safetensors") ||
    fail "export check of $c"
  echo "ok: export of $tag/$(basename "$c") (npy, safetensors): $line"
done
# A directory of checkpoints exports its newest valid one.
"$BIN" ckpt export "$D" --format safetensors "$T/dir.safetensors" >/dev/null ||
  fail "ckpt export of the directory $D"
cmp -s "$T/dir.safetensors" "$T/ckpt-main.safetensors" ||
  fail "ckpt export DIR differs from ckpt export DIR/$newest"
echo "ok: ckpt export DIR = ckpt export DIR/$newest, byte for byte; all in $(elapsed)"
