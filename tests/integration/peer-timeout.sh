#!/usr/bin/env bash
# Deadlines on peer connections: a link that goes silent (no reset, no
# error: as a dead host or a dropped link) is noticed by both the shard and
# the worker within [cluster] peer_timeout_ms (TCP keepalive and
# TCP_USER_TIMEOUT), not after TCP's retransmissions give up (about 15
# minutes).  The whole test runs in a private network namespace, whose
# loopback is taken down to silence the link.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${PS_IN_NETNS:-}" ]; then
  # lib.bash (its skip and fail) is sourced inside the namespace only: its
  # work directory and cleanup belong to the process that runs the test.
  # unshare and ip are util-linux's and iproute2's, which scripts/deps
  # installs: missing, the test fails; a kernel or a user without network
  # namespaces is a skip (exit 77), counted as one.
  for c in unshare ip ss; do
    command -v "$c" >/dev/null || { echo "FAIL: no $c (make deps installs it)" >&2; exit 1; }
  done
  if ! why=$(unshare -n true 2>&1 | head -n 1); then
    echo "skip: peer-timeout: needs a private network namespace (unshare -n: root or user namespaces): $why"
    exit 77
  fi
  PS_IN_NETNS=1 exec unshare -n "$0" "$@"
fi
ip link set lo up
. tests/integration/lib.bash

conf="$T/pt.conf"
write_config "$conf" 1 1 "model.name=mlp" "cluster.peer_timeout_ms=2000" "train.threads=1" \
  "train.log_every=50" "$(metrics_on 3)"
start_shards ps "$conf" 1
start w0 "$BIN" worker --config "$conf" --index 0
wait_steps "$conf" 0 100 60
ss -tno state established | grep -q 'timer:(keepalive' ||
  fail "no keepalive timer on the peer sockets: $(ss -tno state established)"
ip link set lo down
t0=$(date +%s%N)
# 2 s of silence, then the cut.  The deadline only tells the keepalive and
# TCP_USER_TIMEOUT's cut from TCP's own give-up after its retransmissions
# (about 15 minutes): it is no bar on how soon (the time is printed).
wait_for "$T/ps0.log" "worker 0 .*: connection lost" 120
wait_for "$T/w0.log" "waiting for shard 0 .*: " 120
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
ip link set lo up
wait_metric "$conf" worker 0 "m['paramserv_worker_reconnects_total'] >= 1" 20
wait_more_steps "$conf" 0 100 30
kill -TERM "$PID_w0"
wait_exit "$PID_w0" 10 || fail "worker 0 exited $? after SIGTERM"
stop_shards ps 1
echo "ok: link silenced: both ends closed within $ms ms (peer_timeout_ms 2000): $(grep -h -o 'worker 0 .*: connection lost.*' "$T/ps0.log" | head -1); $(grep -h -o 'waiting for shard 0 .*' "$T/w0.log" | head -1 | cut -c1-100); after the link came back the worker reconnected and trained on"
