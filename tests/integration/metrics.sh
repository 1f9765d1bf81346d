#!/usr/bin/env bash
# Metrics a monitoring system reads: Debian's prometheus scrapes a running
# `paramserv local` (2 shards, 2 workers) through the run's file_sd targets
# file, and its HTTP API shows every process up with its series, the
# workers' steps rising, the chief's checkpoint age starting again at each
# cut (a state change, not a bound on the age: the ages are printed), and
# after a shard's kill -9 that shard's restore (restores, restore time, a
# new incarnation) and the workers' reconnects.
# Every poll retries a command that fails (a process not listening yet, a
# sanitizer build starting slowly) until its deadline: under set -e a
# failing $(...) would end the script at once.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

PROM=${PROMETHEUS:-/usr/bin/prometheus}
[ -x "$PROM" ] || fail "$PROM: not found: expected Debian's prometheus (make deps installs it)"
command -v curl >/dev/null || fail "curl: not found (make deps installs it)"

run="$T/run"
# targets_base FILE: the base port of a run's Prometheus targets FILE (the
# chief's target), once paramserv local wrote it (whole, then renamed).
targets_base() {
  local i
  for ((i = 0; i < 600; i++)); do
    [ -f "$1" ] && break
    sleep 0.05
  done
  /usr/bin/python3 -c 'import json, sys
print(next(t["targets"][0] for t in json.load(open(sys.argv[1]))
           if t["labels"]["role"] == "chief").rsplit(":", 1)[1])' "$1" ||
    fail "no Prometheus targets file $1 within 30 s"
}
# Checkpoints every 1000 steps, so that the chief's series move too.
printf '[checkpoint]\nevery_steps = 1000\nevery_secs = 0\n' >"$T/local.conf"
start local "$BIN" local --config "$T/local.conf" --dir "$run" --fresh --ps 2 --workers 2 \
  --last-step 100000000
targets="$run/metrics-targets.json"
base=$(targets_base "$targets")
# What local tells its user: the URL and the targets file.
wait_for "$T/local.log" "^local: metrics: http://127.0.0.1:$base/metrics .*Prometheus targets: $targets$" 5

# The endpoint itself (the chief's, the first port): Prometheus's text
# format at /metrics, 404 elsewhere.
wait_ready "$run" chief 60 # it leads: READY=1
ctype=""
for ((i = 0; i < 120; i++)); do
  ctype=$(curl -s -o /dev/null -w '%{content_type}' "http://127.0.0.1:$base/metrics") && break
  sleep 0.25
done
case "$ctype" in "text/plain; version=0.0.4"*) ;; *) fail "content type '$ctype' (or no answer within 30 s)" ;; esac
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$base/nothing") || code="no answer"
[ "$code" = 404 ] || fail "GET /nothing answered $code, expected 404"

read -r pport < <(free_ports 1)
cat >"$T/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: paramserv
    honor_labels: true
    file_sd_configs:
      - files: ['$targets']
        refresh_interval: 1s
EOF
start prometheus "$PROM" --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/prom" \
  --web.listen-address="127.0.0.1:$pport"
for ((i = 0; i < 600; i++)); do
  curl -sf -o /dev/null "http://127.0.0.1:$pport/-/ready" && break
  sleep 0.05
done
curl -sf -o /dev/null "http://127.0.0.1:$pport/-/ready" || fail "prometheus not ready within 30 s: $(tail -3 "$T/prometheus.log")"

# q EXPR: the sum of the instant vector EXPR's values, or "none".  A query
# that gets no answer or an error is asked again, for up to 10 s; then it
# fails (FAIL on stderr, status 1).
q() {
  local i out
  for ((i = 0; i < 40; i++)); do
    out=$({ curl -s --get --data-urlencode "query=$1" "http://127.0.0.1:$pport/api/v1/query" || true; } |
      /usr/bin/python3 -c '
import json, sys
try:
    r = json.load(sys.stdin)
except ValueError:
    sys.exit(1)
if r.get("status") != "success":
    sys.exit("query failed: %s" % r)
v = r["data"]["result"]
print("%.15g" % sum(float(x["value"][1]) for x in v) if v else "none")') && { echo "$out"; return 0; }
    sleep 0.25
  done
  echo "FAIL: prometheus: no answer to '$1' within 10 s" >&2
  return 1
}

# wait_q EXPR SECONDS: until EXPR (a comparison, e.g. "x > 3") is true for
# some series; prints nothing, fails with the last value otherwise.
wait_q() {
  local i v
  for ((i = 0; i < $2 * 4; i++)); do
    v=$(q "$1") || v="no answer"
    [ "$v" != none ] && [ "$v" != "no answer" ] && return 0
    sleep 0.25
  done
  fail "prometheus: '$1' not true within $2 s ($v)"
}

# --- every process scraped, with its series ----------------------------
wait_q 'count(up{job="paramserv"} == 1) == 5' 20
for role_count in chief:1 ps:2 worker:2; do
  role=${role_count%:*} n=${role_count#*:}
  [ "$(q "count(up{role=\"$role\"} == 1)")" = "$n" ] || fail "up: $(q "count(up{role=\"$role\"})") targets of role $role, expected $n"
done
for s in paramserv_worker_steps_total paramserv_worker_samples_per_second \
  paramserv_worker_pushes_total paramserv_worker_duplicates_total \
  paramserv_worker_stale_pushes_total paramserv_worker_reconnects_total \
  paramserv_worker_stall_seconds_total paramserv_worker_sent_bytes_total \
  paramserv_ps_pushes_applied_total paramserv_ps_duplicates_total paramserv_ps_stale_pushes_total \
  paramserv_ps_staleness_count paramserv_ps_replication_lag_versions \
  paramserv_ps_replication_lag_seconds paramserv_ps_nondurable_acks_total \
  paramserv_ps_restores_total paramserv_ps_restore_seconds paramserv_ps_received_bytes_total; do
  [ "$(q "count($s)")" = 2 ] || fail "$s: $(q "count($s)") series, expected 2 (one a process)"
done
for s in paramserv_chief_checkpoint_age_seconds paramserv_chief_checkpoints_total \
  paramserv_chief_lease_token; do
  [ "$(q "count($s)")" = 1 ] || fail "$s: $(q "count($s)") series, expected 1"
done
[ "$(q 'paramserv_chief_lease_held')" = 1 ] || fail "the chief does not hold the lease"
[ "$(q 'paramserv_chief_lease_token > 0')" != none ] || fail "the chief's fencing token is 0"
echo "ok: prometheus scrapes 5 targets (chief, 2 shards, 2 workers), each up, with their series"

# --- the series move ------------------------------------------------------
steps=$(q 'sum(paramserv_worker_steps_total)')
wait_q "sum(paramserv_worker_steps_total) > $steps" 10
wait_q 'min(paramserv_ps_staleness_count) > 0' 10
echo "ok: the workers' steps rise ($steps, then $(q 'sum(paramserv_worker_steps_total)'))"
# Training loss and the chief's evaluations are series as well as log lines.
wait_q 'count(paramserv_worker_loss > 0) == 2' 30
wait_q 'paramserv_chief_eval_step > 0 and paramserv_chief_eval_accuracy > 0 and paramserv_chief_eval_loss > 0' 60
echo "ok: the workers' loss ($(q 'paramserv_worker_loss' | tr '\n' ' ')) and the chief's evaluation (accuracy $(q 'paramserv_chief_eval_accuracy') at step $(q 'paramserv_chief_eval_step')) are series"
wait_q 'paramserv_chief_checkpoints_total >= 2' 30
wait_q 'paramserv_chief_checkpoint_bytes > 0 and paramserv_chief_checkpoint_stored_bytes > 0' 10
wait_q 'paramserv_chief_checkpoint_stall_seconds > 0' 10
# The checkpoint age counts from the newest cut (METRICS.md): never
# negative, it only grows between cuts and starts again at each one; every
# checkpoint written (or failed) comes from such a cut.  Read from the
# chief's endpoint, one scrape giving the age and both counters together,
# until 2 more checkpoints were written (the deadline bounds the wait, not
# the age).  The write that completes first may belong to a cut from before
# the first scrape, and the last cut may still be writing: so the drops D
# and the checkpoints written or failed K must have K - 1 <= D <= K + 1.
# chief_ckpt: "WRITTEN FAILED AGE" from one scrape of the chief ("" if none).
chief_ckpt() {
  { curl -s "http://127.0.0.1:$base/metrics" || true; } | awk '
    { n = $1; sub(/\{.*/, "", n) }
    n == "paramserv_chief_checkpoints_total" { w = $2 }
    n == "paramserv_chief_checkpoint_failures_total" { f = $2 }
    n == "paramserv_chief_checkpoint_age_seconds" { a = $2 }
    END { if (w != "" && f != "" && a != "") print w, f, a }'
}
s0="" drops=0 ages=""
for ((i = 0; i < 1200; i++)); do
  read -r w f a <<<"$(chief_ckpt)" || true
  if [ -n "${a:-}" ]; then
    awk -v a="$a" 'BEGIN { exit !(a >= 0) }' || fail "the chief's checkpoint age is $a s"
    if [ -z "$s0" ]; then
      s0="$w $f" w0=$w f0=$f
    elif awk -v a="$a" -v p="$prev" 'BEGIN { exit !(a < p) }'; then
      drops=$((drops + 1))
      ages+="${ages:+, }$(awk -v p="$prev" -v a="$a" 'BEGIN { printf "%.2f -> %.2f", p, a }')"
    fi
    prev=$a
    [ "$(((${w%.*} - ${w0%.*}) + (${f%.*} - ${f0%.*})))" -ge 2 ] && break
  fi
  sleep 0.25
done
[ -n "$s0" ] || fail "the chief's endpoint (port $base) served no checkpoint series"
k=$(((${w%.*} - ${w0%.*}) + (${f%.*} - ${f0%.*})))
[ "$k" -ge 2 ] || fail "the chief wrote $k checkpoints in 300 s (checkpoints every 1000 steps)"
[ "$drops" -ge $((k - 1)) ] && [ "$drops" -le $((k + 1)) ] ||
  fail "the checkpoint age started again $drops times ($ages) while $k checkpoints were written or failed"
age=$(q 'paramserv_chief_checkpoint_age_seconds')
echo "ok: the chief's checkpoints: $(q 'paramserv_chief_checkpoints_total') written, the last" \
  "$(q 'paramserv_chief_checkpoint_bytes') bytes ($(q 'paramserv_chief_checkpoint_stored_bytes') stored)," \
  "a stall of $(q 'paramserv_chief_checkpoint_stall_seconds') s; the age started again at each of the" \
  "$k cuts ($ages s), now $(awk -v a="$age" 'BEGIN { printf "%.2f", a }') s (information only)"

# --- kill -9 of shard 1: its restore and the workers' reconnects ----------
inc=$(q 'paramserv_ps_incarnation{index="1"}')
reconnects=$(q 'sum(paramserv_worker_reconnects_total)')
[ "$(q 'paramserv_ps_restores_total{index="1"}')" = 0 ] || fail "shard 1 restored before its kill"
pid=$(awk '$1 == "ps-1" { print $2 }' "$run/pids")
[ -n "$pid" ] || fail "no ps-1 in $run/pids"
kill -9 "$pid"
wait_q "paramserv_ps_incarnation{index=\"1\"} > $inc" 30
wait_q 'paramserv_ps_restores_total{index="1"} == 1' 10
wait_q 'paramserv_ps_restore_seconds{index="1"} > 0' 10
wait_q "sum(paramserv_worker_reconnects_total) > $reconnects" 30
steps=$(q 'sum(paramserv_worker_steps_total)')
wait_q "sum(paramserv_worker_steps_total) > $steps" 20
echo "ok: shard 1 killed: restored in $(q 'paramserv_ps_restore_seconds{index="1"}') s" \
  "(restores_total 0 -> 1, a new incarnation), workers' reconnects $reconnects -> $(q 'sum(paramserv_worker_reconnects_total)'), steps rise again"

kill -TERM "$PID_local"
set +e
wait_exit "$PID_local" 30
rc=$?
set -e
[ "$rc" -eq 143 ] || fail "local exited $rc after SIGTERM, expected 143"
echo "ok: local stopped by SIGTERM"

# --- a ring: each member serves its steps and view ------------------------
printf '[cluster]\nmode = ring\n[model]\nfile = %s\n' "$PWD/models/examples/strided-cnn.json" >"$T/ring.conf"
start ring "$BIN" local --config "$T/ring.conf" --dir "$T/ringrun" --fresh --workers 2 \
  --last-step 100000000
base=$(targets_base "$T/ringrun/metrics-targets.json")
# ring_metric SLOT NAME: the value of NAME at port base + SLOT, or "" (also
# while the member does not answer yet: a refused connection is retried by
# the poll below, not the end of the script).
ring_metric() {
  { curl -s "http://127.0.0.1:$(($base + $1))/metrics" || true; } |
    awk -v n="$2" '$1 ~ "^"n"([{ ]|$)" { print $2 }'
}
for j in 0 1; do
  for ((i = 0; i < 120; i++)); do
    v=$(ring_metric $((1 + j)) paramserv_ring_steps_total)
    [ -n "$v" ] && [ "${v%.*}" -gt 5 ] && break
    sleep 0.25
  done
  [ -n "$v" ] && [ "${v%.*}" -gt 5 ] || fail "ring member $j: paramserv_ring_steps_total '$v', expected it past 5 within 30 s"
  [ "$(ring_metric $((1 + j)) paramserv_ring_members)" = 2 ] ||
    fail "ring member $j: paramserv_ring_members '$(ring_metric $((1 + j)) paramserv_ring_members)', expected 2"
done
echo "ok: ring mode (a model file): each member serves its steps ($v) and a view of 2 members"
kill -TERM "$PID_ring"
wait_exit "$PID_ring" 30 || [ $? -eq 143 ] || fail "local (ring) exited $? after SIGTERM"
