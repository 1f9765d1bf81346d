# Helpers for the integration tests: free ports, a cluster config, waiting
# with a deadline for what the processes say in machine form (READY=1 and
# STATUS= on the test's NOTIFY_SOCKET, Prometheus series, the chief's
# summaries, the lease, history files; a log
# line only where the message itself is checked), and cleanup of every
# process started.
# Source it; it sets BIN and a work directory $T removed on exit.

BIN=${PARAMSERV:-build/paramserv}
T=$(mktemp -d)
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  chattr -R -i "$T" 2>/dev/null || true  # a fault test's immutable directory
  if [ -n "${KEEP:-}" ]; then echo "kept $T" >&2; else rm -rf "$T"; fi
}
trap cleanup EXIT

# skip REASON: this test cannot run here.  One line `skip: NAME: REASON`
# and exit 77, which tests/run counts as skipped (not passed); .ci/run
# refuses any skip it does not expect.
skip() {
  echo "skip: $(basename "$0" .sh): $*"
  exit 77
}

fail() {
  echo "FAIL: $*" >&2
  for f in "$T"/*.log; do
    [ -f "$f" ] || continue
    echo "--- $f (last 15 lines)" >&2
    tail -n 15 "$f" >&2
  done
  exit 1
}

# free_ports N: N TCP ports on 127.0.0.1 that nothing listens on now.
free_ports() {
  /usr/bin/python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# free_port_run N: the first of N consecutive TCP ports on 127.0.0.1 that
# nothing listens on now (for [metrics] listen: each process takes the base
# port plus its slot); nothing when there are none.
free_port_run() {
  /usr/bin/python3 - "$1" <<'PY'
import socket, sys
n = int(sys.argv[1])
for base in range(20000, 60000, 7):
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    break
PY
}

# write_config FILE NPS NWORKERS [key=value in section form "section.key=value"]...
write_config() {
  local file=$1 nps=$2 nw=$3
  shift 3
  local ports
  read -r -a ports <<<"$(free_ports $((nps + nw + 1)))"
  local ps_list="" w_list="" i
  for ((i = 0; i < nps; i++)); do ps_list+="${ps_list:+, }127.0.0.1:${ports[i]}"; done
  for ((i = 0; i < nw; i++)); do w_list+="${w_list:+, }127.0.0.1:${ports[nps + i]}"; done
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/secret"
  chmod 600 "$T/secret"
  declare -A sections=()
  local kv sec key
  # Tests that do not start Redis run without replication.
  case " $* " in *" replication.mode="*) ;; *) set -- "$@" "replication.mode=off" ;; esac
  # Tests without a chief let the shards initialize themselves.
  case " $* " in *" replication.self_init="*) ;; *) set -- "$@" "replication.self_init=yes" ;; esac
  [ -n "${REDIS_PORT:-}" ] && set -- "$@" "redis.address=127.0.0.1:$REDIS_PORT"
  for kv in "$@"; do
    sec=${kv%%.*}
    key=${kv#*.}
    sections[$sec]+="$key"$'\n'
  done
  {
    echo "[cluster]"
    echo "id = itest"
    echo "secret_file = secret"
    echo "chief = 127.0.0.1:${ports[nps + nw]}"
    echo "ps = $ps_list"
    echo "workers = $w_list"
    echo "log_level = info"
    printf '%s' "${sections[cluster]:-}"
    for sec in "${!sections[@]}"; do
      [ "$sec" = cluster ] && continue
      echo "[$sec]"
      printf '%s' "${sections[$sec]}"
    done
  } >"$file"
}

# left RUNDIR: the processes whose command line names the run directory
# (paramserv local's), read from /proc.
left() {
  local f cmd args
  for f in /proc/[0-9]*/cmdline; do
    mapfile -d '' -t args 2>/dev/null <"$f" || continue
    cmd="${args[*]}"
    case " $cmd " in *" $1/"* | *" $1 "*) echo "${f//[^0-9]/}: $cmd" ;; esac
  done
}

# wait_for FILE PATTERN SECONDS: until FILE has a line matching PATTERN.
wait_for() {
  local file=$1 pattern=$2 secs=$3 i
  for ((i = 0; i < secs * 20; i++)); do
    grep -q -- "$pattern" "$file" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "no '$pattern' in $file within $secs s"
}

# wait_for_any PATTERN SECS FILE...: until one of the FILEs has PATTERN;
# sets WHICH to its place in the list (0, 1, ...), the first in order.
wait_for_any() {
  local pattern=$1 secs=$2 i k
  shift 2
  for ((i = 0; i < secs * 20; i++)); do
    for ((k = 1; k <= $#; k++)); do
      grep -q -- "$pattern" "${!k}" 2>/dev/null && { WHICH=$((k - 1)); return 0; }
    done
    sleep 0.05
  done
  fail "no '$pattern' in any of $* within $secs s"
}

# wait_json FILE EXPR SECONDS [SKIP]: until FILE (JSON lines, as the chief's
# summaries: chief/summary.h) has a complete line, after its first SKIP
# lines, whose object o makes the Python expression EXPR true.  One python3
# reads the file as it grows.
wait_json() {
  /usr/bin/python3 - "$@" <<'PY' || fail "no line of $1 with $2 within $3 s"
import json, sys, time
path, expr, secs = sys.argv[1], compile(sys.argv[2], "EXPR", "eval"), float(sys.argv[3])
skip = int(sys.argv[4]) if len(sys.argv) > 4 else 0
end, off = time.monotonic() + secs, 0
while True:
    try:
        with open(path, "rb") as f:
            f.seek(off)
            data = f.read()
    except FileNotFoundError:
        data = b""
    cut = data.rfind(b"\n") + 1  # complete lines only
    off += cut
    for line in data[:cut].splitlines():
        if skip > 0:
            skip -= 1
            continue
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if isinstance(o, dict) and eval(expr, {}, {"o": o}):
            sys.exit(0)
    if time.monotonic() >= end:
        sys.exit(1)
    time.sleep(0.05)
PY
}

# wait_step SUMMARIES STEP SECONDS: until the chief's summaries file has a
# progress line ({"time", "step", "steps_per_s"}) at global step STEP or later.
wait_step() {
  wait_json "$1" "'steps_per_s' in o and o['step'] >= $2" "$3"
}

# summaries DIR: the lines of checkpoint directory DIR's summaries.jsonl so
# far (0 when none), for wait_summary's SKIP.
summaries() { cat "$1/summaries.jsonl" 2>/dev/null | wc -l; }

# summary_field DIR SKIP EVENT FIELD...: for each line of checkpoint
# directory DIR's summaries.jsonl after its first SKIP lines (DIR "-": the
# lines on standard input) that is a whole JSON object of EVENT ("progress":
# a progress line), its FIELDs, space-separated, a line each.
summary_field() {
  local src=$1 skip=$2
  shift 2
  { if [ "$src" = - ]; then cat; else cat "$src/summaries.jsonl" 2>/dev/null; fi; } |
    tail -n +"$((skip + 1))" | /usr/bin/python3 -c 'import json, sys
event, fields = sys.argv[1], sys.argv[2:]
for line in sys.stdin:
    try:
        o = json.loads(line)
    except ValueError:
        continue
    if isinstance(o, dict) and (o.get("event") == event or event == "progress" and "steps_per_s" in o):
        print(" ".join(str(o.get(f)) for f in fields))' "$@"
}

# wait_summary DIR EXPR SECONDS [SKIP]: wait_json on the chief's summaries
# in checkpoint directory DIR: e.g. o.get('event') == 'checkpoint' (a
# checkpoint committed), 'restore' (with source and shard), 'chief' (a chief
# took the lease: token).
wait_summary() { wait_json "$1/summaries.jsonl" "$2" "$3" "${4:-0}"; }

# wait_lease PID SECONDS: until the chief with process id PID holds the
# lease ({itest}:chief in the test's Redis: "token T host H pid P").
wait_lease() {
  local i v=""
  for ((i = 0; i < $2 * 20; i++)); do
    v=$(redis-cli -p "$REDIS_PORT" get "{itest}:chief" 2>/dev/null) || true
    [[ $v == *" pid $1" ]] && return 0
    sleep 0.05
  done
  fail "chief pid $1 does not hold the lease within $2 s (the lease: '${v:-none}')"
}

# wait_ready RUNDIR NAME SECONDS [NOT_PID]: until paramserv local's
# RUNDIR/pids ("ps-1 1234 ready") says NAME is ready (it sent READY=1), as
# a pid other than NOT_PID (the incarnation killed before).
wait_ready() {
  local i
  for ((i = 0; i < $3 * 20; i++)); do
    awk -v n="$2" -v old="${4:-}" '$1 == n && $3 == "ready" && $2 != old { f = 1 } END { exit !f }' \
      "$1/pids" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "$2 not ready in $1/pids within $3 s: $(tr '\n' ';' <"$1/pids" 2>/dev/null)"
}

# metrics_on NPROCS: write_config's [metrics] listen on NPROCS consecutive
# free ports (each process serves at the base port plus its slot: the chief
# 0, shard i 1 + i, worker j 1 + nps + j; src/common/metrics.h).
metrics_on() {
  local base
  base=$(free_port_run "$1")
  [ -n "$base" ] || fail "no $1 consecutive free ports for [metrics] listen"
  echo "metrics.listen=127.0.0.1:$base"
}

# wait_metric CONF ROLE INDEX EXPR SECONDS: until process ROLE (chief, ps,
# worker: a ring member is a worker) INDEX of CONF serves, at its [metrics]
# listen address plus its slot, series that make the Python expression EXPR
# true; m maps each series name to its value (summed over labels), m0 is m
# at the first answer (for "N more than when the wait began").  A
# process not answering yet (starting, restarting) is asked again, every
# 50 ms, until the deadline.
wait_metric() {
  local conf=$1 role=$2 index=$3 expr=$4 secs=$5 url last
  url=$(metrics_url "$conf" "$role" "$index")
  last=$(/usr/bin/python3 - "$url" "$expr" "$secs" 2>&1 <<'PY'
import sys, time, urllib.request
url, expr, secs = sys.argv[1], compile(sys.argv[2], "EXPR", "eval"), float(sys.argv[3])
end, m, m0 = time.monotonic() + secs, {}, None
while True:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            m = {}
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    name, value = line.rsplit(" ", 1)
                    name = name.split("{", 1)[0]
                    m[name] = m.get(name, 0.0) + float(value)
        m0 = m0 or m
        if eval(expr, {}, {"m": m, "m0": m0}):
            sys.exit(0)
    except (OSError, ValueError, KeyError):
        pass
    if time.monotonic() >= end:
        print(" ".join(f"{k}={v:g}" for k, v in sorted(m.items()) if k.endswith(("steps_total", "global_step", "version", "members")))
              or "no answer", file=sys.stderr)
        sys.exit(1)
    time.sleep(0.05)
PY
  ) || fail "$role $index of $conf: no metrics at $url with $expr within $secs s (last: $last)"
}

# metrics_url CONF ROLE INDEX: where process ROLE INDEX of CONF serves its
# metrics.  metric CONF ROLE INDEX NAME: that series' value now (summed over
# labels), or nothing when the process does not answer.
metrics_url() {
  local listen nps
  listen=$(awk '/^\[/ { s = $0; next } s == "[metrics]" && sub(/^listen *= */, "") { print }' "$1")
  [ -n "$listen" ] || fail "metrics_url: $1 has no [metrics] listen"
  nps=$(sed -n 's/^ps = //p' "$1" | tr ',' '\n' | grep -c :) || true
  case $2 in
  chief) echo "http://$listen/metrics" ;;
  ps) echo "http://${listen%:*}:$((${listen##*:} + 1 + $3))/metrics" ;;
  worker) echo "http://${listen%:*}:$((${listen##*:} + 1 + nps + $3))/metrics" ;;
  *) fail "metrics_url: role $2, expected chief, ps or worker" ;;
  esac
}
metric() {
  curl -s --max-time 2 "$(metrics_url "$1" "$2" "$3")" 2>/dev/null |
    awk -v n="$4" '$1 == n || index($1, n "{") == 1 { v += $2; f = 1 } END { if (f) print v }'
}

# wait_steps CONF WORKER STEPS SECONDS: until worker WORKER of CONF has
# trained STEPS steps (paramserv_worker_steps_total; CONF needs metrics_on).
# wait_more_steps: STEPS more than when the wait began.
wait_steps() {
  wait_metric "$1" worker "$2" "m['paramserv_worker_steps_total'] >= $3" "$4"
}
wait_more_steps() {
  wait_metric "$1" worker "$2" \
    "m['paramserv_worker_steps_total'] >= m0['paramserv_worker_steps_total'] + $3" "$4"
}

# fault_gap S: a chaos test's --fault-gap, S times $PS_TEST_FAULT_GAP_SCALE
# (1 by default; `make SAN=1` sets 3: a sanitized build trains about 3
# times slower, and its faults are then as many per step as a plain
# build's, rather than 3 times as many).
fault_gap() {
  awk -v s="$1" -v k="${PS_TEST_FAULT_GAP_SCALE:-1}" 'BEGIN { printf "%g\n", s * k }'
}

# ctr_local FILE SEED CHECKPOINT: gen-ctr data of SEED ($T/train.txt, 20,000
# samples; $T/test.txt, 2,000) and a `paramserv local` config FILE of the
# CTR model (models/ctr.json) on it: batch 128, one thread, no chief
# evaluations, replication off, and the lines CHECKPOINT under [checkpoint].
ctr_local() {
  scripts/gen-ctr --train 20000 --test 2000 --seed "$2" --train-file "$T/train.txt" \
    --test-file "$T/test.txt" >"$T/gen.log" 2>&1 || fail "gen-ctr: $(tail -2 "$T/gen.log")"
  cat >"$1" <<EOF
[model]
file = $PWD/models/ctr.json
[data]
format = criteo
train = $T/train.txt
test = $T/test.txt
[train]
batch = 128
threads = 1
[checkpoint]
$3
[chief]
eval_every_steps = 0
[replication]
mode = off
EOF
}

. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/notify.bash"

# test_notify: the test's NOTIFY_SOCKET, $T/notify.sock (scripts/lib/notify.bash;
# its datagrams in $T/notify.log), started once; start gives it to every
# process it starts.
test_notify() {
  [ -S "$T/notify.sock" ] && return 0
  notify_start "$T" || fail "the test's notify socket $T/notify.sock did not appear"
  PIDS+=("$NOTIFY_PID")
}

# wait_notify NAME ERE SECONDS: until process NAME (started by start) sent a
# notification matching the extended regular expression ERE.
# wait_up NAME SECONDS: until its start-up is over: READY=1 (a shard
# serving, a worker training, the chief leading) or, before that, a STATUS=
# (a shard waiting for the chief to initialize it, a chief on standby).
# wait_serving NAME SECONDS: until it sent READY=1.
wait_notify() {
  local v="PID_${1//[^a-zA-Z0-9]/_}" rc=0
  local pid=${!v:-}
  [ -n "$pid" ] || fail "wait_notify: no process $1 was started"
  notify_wait "$T" "$pid" "$2" "$3" || rc=$?
  case $rc in
  0) ;;
  2) fail "$1 (pid $pid) exited before it notified '$2': $(tail -n 3 "$T/$1.log")" ;;
  *) fail "$1 (pid $pid) notified no '$2' within $3 s (it sent: $(awk -v p="$pid" '$1 == p' "$T/notify.log" 2>/dev/null | cut -d' ' -f3- | paste -sd'|'))" ;;
  esac
}
wait_up() { wait_notify "$1" 'READY=1|STATUS=' "$2"; }
wait_serving() { wait_notify "$1" 'READY=1' "$2"; }

# start NAME CMD...: run CMD in the background, output to $T/NAME.log, with
# the test's NOTIFY_SOCKET.
start() {
  local name=$1
  shift
  test_notify
  NOTIFY_SOCKET="$T/notify.sock" "$@" >"$T/$name.log" 2>&1 &
  PIDS+=($!)
  eval "PID_${name//[^a-zA-Z0-9]/_}=$!"
}

# wait_listening CONF INDEX SECONDS: until shard INDEX of CONF (a loopback
# address of [cluster] ps) accepts a connection, polled every 10 ms: the
# earliest sign of a shard, which listens from its start, before it
# restores (a connection waits in the backlog until it serves; wait_up
# waits for that).
wait_listening() {
  local port
  port=$(sed -n 's/^ps = //p' "$1" | tr -d ' ' | cut -d, -f$(($2 + 1)) | sed 's/.*://')
  [[ $port =~ ^[0-9]+$ ]] || fail "wait_listening: no shard $2 in $1's [cluster] ps"
  wait_tcp 127.0.0.1 "$port" "$3"
}

# wait_tcp HOST PORT SECONDS: until HOST:PORT accepts a connection (e.g. a
# shard on a namespaced host), polled every 10 ms.
wait_tcp() {
  local i
  for ((i = 0; i < $3 * 100; i++)); do
    (: <>"/dev/tcp/$1/$2") 2>/dev/null && return 0
    sleep 0.01
  done
  fail "$1:$2 not accepting connections within $3 s"
}

# wait_count FILE PATTERN N SECONDS: until FILE (a history: machine lines,
# src/common/history.h) has N lines matching PATTERN.
wait_count() {
  local i n=0
  for ((i = 0; i < $4 * 20; i++)); do
    n=$(grep -c -- "$2" "$1" 2>/dev/null) || true
    [ "${n:-0}" -ge "$3" ] && return 0
    sleep 0.05
  done
  fail "fewer than $3 lines '$2' in $1 within $4 s (${n:-0})"
}

# start_shards PREFIX CONF N: shards 0..N-1 as PREFIX0, PREFIX1, ...
# (logs $T/PREFIXi.log, pids $PID_PREFIXi), each started up (wait_up:
# serving, or waiting for the chief to initialize it).
start_shards() {
  local prefix=$1 conf=$2 n=$3 i
  for ((i = 0; i < n; i++)); do start "$prefix$i" "$BIN" ps --config "$conf" --index "$i"; done
  for ((i = 0; i < n; i++)); do wait_up "$prefix$i" 10; done
}

# stop_shards PREFIX N: SIGTERM each, and each must exit 0.
stop_shards() {
  local prefix=$1 n=$2 i v
  for ((i = 0; i < n; i++)); do
    v="PID_${prefix//[^a-zA-Z0-9]/_}$i"
    kill -TERM "${!v}"
  done
  for ((i = 0; i < n; i++)); do
    v="PID_${prefix//[^a-zA-Z0-9]/_}$i"
    wait_exit "${!v}" 10 || fail "$prefix$i exited $? after SIGTERM"
  done
}

# train_2x2 NAME CONF BIN1 [ARGS1...]: shards NAME-ps0/1 and workers NAME-w0
# ($BIN) and NAME-w1 (BIN1 with ARGS1) of CONF (2 shards, 2 workers) until
# the workers exit 0 (300 s each), then the shards (exit 0 on SIGTERM).
# Sets $acc to worker 0's final test accuracy.
train_2x2() {
  local name=$1 conf=$2 bin1=$3 v
  shift 3
  start_shards "$name-ps" "$conf" 2
  start "$name-w0" "$BIN" worker --config "$conf" --index 0
  start "$name-w1" "$bin1" worker --config "$conf" --index 1 "$@"
  for v in 0 1; do
    v="PID_${name//[^a-zA-Z0-9]/_}_w$v"
    wait_exit "${!v}" 300 || fail "$name: ${v##*_} exited $?"
  done
  stop_shards "$name-ps" 2
  acc=$(sed -n 's/^final test_acc \([0-9.]*\).*/\1/p' "$T/$name-w0.log")
  [ -n "$acc" ] || fail "$name: worker 0 printed no final accuracy"
}

# wait_exit PID SECONDS: wait for the process to exit; prints its status.
wait_exit() {
  local pid=$1 secs=$2 i
  for ((i = 0; i < secs * 20; i++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      return $?
    fi
    sleep 0.05
  done
  fail "process $pid still running after $secs s"
}

# start_redis: a private redis-server on a free port, without persistence,
# its files in $T; sets REDIS_PORT and PID_redis.  $REDIS_ARGS: more options.
start_redis() {
  REDIS_PORT=${REDIS_PORT:-$(free_ports 1)}
  start redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$T" --logfile "" --daemonize no ${REDIS_ARGS:-}
  local i
  for ((i = 0; i < 200; i++)); do
    redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.05
  done
  fail "redis-server on port $REDIS_PORT did not answer PING within 10 s"
}

# hosts_up PREFIX N: N hosts of scripts/hosts, named PREFIX + a number ($NAME),
# driven with $H; taken down on exit.  Skips the test (skip, exit 77)
# where it cannot run: not root, or no network namespaces.
hosts_up() {
  [ "$(id -u)" = 0 ] || skip "not root (ip netns needs CAP_SYS_ADMIN)"
  NAME="$1$(($$ % 10000))"
  H="scripts/hosts --name $NAME"
  trap 'cleanup; $H down 2>/dev/null || true' EXIT
  local out
  out=$($H up "$2" 2>&1) || {
    case $out in *"cannot make a network namespace"*) skip "$out" ;; esac
    fail "scripts/hosts up $2: $out"
  }
}
