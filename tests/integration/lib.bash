# Helpers for the integration tests: free ports, a cluster config, waiting
# with a deadline (for a log line, a JSON line of the chief's summaries, a
# process of paramserv local being ready), and cleanup of every process
# started.
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

# wait_json FILE EXPR SECONDS: until FILE (JSON lines, as the chief's
# summaries: chief/summary.h) has a complete line whose object o makes the
# Python expression EXPR true.  One python3 reads the file as it grows.
wait_json() {
  /usr/bin/python3 - "$@" <<'PY' || fail "no line of $1 with $2 within $3 s"
import json, sys, time
path, expr, secs = sys.argv[1], compile(sys.argv[2], "EXPR", "eval"), float(sys.argv[3])
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

# fault_gap S: a chaos test's --fault-gap, S times $PS_TEST_FAULT_GAP_SCALE
# (1 by default; `make SAN=1` sets 3: a sanitized build trains about 3
# times slower, and its faults are then as many per step as a plain
# build's, rather than 3 times as many).
fault_gap() {
  awk -v s="$1" -v k="${PS_TEST_FAULT_GAP_SCALE:-1}" 'BEGIN { printf "%g\n", s * k }'
}

# start NAME CMD...: run CMD in the background, output to $T/NAME.log.
start() {
  local name=$1
  shift
  "$@" >"$T/$name.log" 2>&1 &
  PIDS+=($!)
  eval "PID_${name//[^a-zA-Z0-9]/_}=$!"
}

# wait_listening CONF INDEX SECONDS: until shard INDEX of CONF (a loopback
# address of [cluster] ps) accepts a connection -- which it does once it is
# restored and listening -- polled every 10 ms.
wait_listening() {
  local port i
  port=$(sed -n 's/^ps = //p' "$1" | tr -d ' ' | cut -d, -f$(($2 + 1)) | sed 's/.*://')
  [[ $port =~ ^[0-9]+$ ]] || fail "wait_listening: no shard $2 in $1's [cluster] ps"
  for ((i = 0; i < $3 * 100; i++)); do
    (: <>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.01
  done
  fail "shard $2 of $1 not accepting connections on port $port within $3 s"
}

# start_shards PREFIX CONF N: shards 0..N-1 as PREFIX0, PREFIX1, ...
# (logs $T/PREFIXi.log, pids $PID_PREFIXi), each up and listening.
start_shards() {
  local prefix=$1 conf=$2 n=$3 i
  for ((i = 0; i < n; i++)); do start "$prefix$i" "$BIN" ps --config "$conf" --index "$i"; done
  for ((i = 0; i < n; i++)); do wait_listening "$conf" "$i" 10; done
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
