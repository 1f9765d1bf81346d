# A NOTIFY_SOCKET read as systemd reads one (sourced by the integration
# tests' lib.bash and by scripts/bench-*), so that a script learns that a
# process is up from the process itself, not from its log:
#
#   notify_start DIR     a socket DIR/notify.sock (give it to a process as
#                        NOTIFY_SOCKET); each datagram a process sends
#                        (READY=1, STATUS=..., STOPPING=1) becomes a line
#                        "PID SECONDS FIELDS" of DIR/notify.log, PID the
#                        sender's from the credentials the kernel attaches
#                        (SO_PASSCRED), SECONDS its arrival ($EPOCHREALTIME's
#                        clock), the fields on one line.  Sets NOTIFY_PID, the
#                        reader's pid (the caller kills it when it cleans up).
#   notify_wait DIR PID ERE SECONDS
#                        until PID sent a datagram matching the extended
#                        regular expression ERE: 0, and NOTIFY_AT is its
#                        arrival; 1 when SECONDS passed; 2 when PID exited
#                        first.
#
# What the processes send: src/common/notify.h.  A shard sends READY=1 once
# it serves (or, waiting for the chief to initialize it, first a STATUS=);
# a worker once it trains; the chief once it leads (on standby, a STATUS=).

notify_start() {
  local dir=$1 i
  /usr/bin/python3 - "$dir/notify.sock" "$dir/notify.log" <<'PY' &
import socket, struct, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
s.bind(sys.argv[1])
out = open(sys.argv[2], "a", buffering=1)
while True:
    data, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(12))
    pid = next((struct.unpack("iII", d[:12])[0] for level, kind, d in anc
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), 0)
    fields = data.decode(errors="replace").strip().replace("\n", " ")
    out.write("%d %.6f %s\n" % (pid, time.time(), fields))
PY
  NOTIFY_PID=$!
  for ((i = 0; i < 500; i++)); do
    [ -S "$dir/notify.sock" ] && return 0
    sleep 0.01
  done
  return 1
}

notify_wait() {
  local dir=$1 pid=$2 ere=$3 secs=$4 i line
  for ((i = 0; i < secs * 100; i++)); do
    line=$(awk -v p="$pid" -v e="$ere" '$1 == p && $0 ~ e { print; exit }' "$dir/notify.log" 2>/dev/null)
    if [ -n "$line" ]; then
      NOTIFY_AT=$(cut -d' ' -f2 <<<"$line")
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || return 2
    sleep 0.01
  done
  return 1
}
