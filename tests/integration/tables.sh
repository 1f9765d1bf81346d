#!/usr/bin/env bash
# Sparse tables in a running cluster (Redis, chief, 2 shards, 1 worker) of
# the CTR model (models/ctr.json: 26 tables of dim 16, adagrad) on
# scripts/gen-ctr data:
#  - each shard serves paramserv_ps_table_* with a `table` label, one series
#    per table and family, and its rows grow as pushes come;
#  - `paramserv status` shows each table's rows and memory on each shard,
#    and --json the same per shard;
#  - `paramserv ckpt verify` of a checkpoint checks its table sections and
#    counts their rows, and `paramserv ckpt export --format npy` writes per
#    table keys (uint64, ascending), values (rows x 16) and slots (rows x 1
#    x 16), as many rows as verify counted.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

(cd "$T" && "$OLDPWD/scripts/gen-ctr" --train 4000 --test 1000 --scale 0.01 --seed 3 >/dev/null) ||
  fail "scripts/gen-ctr exited $?"
start_redis
metrics=$(metrics_on 4)
write_config "$T/c.conf" 2 1 "model.file=$PWD/models/ctr.json" "data.format=criteo" \
  "data.train=$T/train.txt" "data.test=$T/test.txt" "train.threads=1" "train.batch=64" \
  "replication.mode=log" "replication.self_init=no" "checkpoint.dir=$T/ckpt" \
  "checkpoint.every_steps=200" "checkpoint.every_secs=0" "chief.eval_every_steps=0" \
  "worker.heartbeat_ms=300" "$metrics"

start_shards ps "$T/c.conf" 2
start chief "$BIN" chief --config "$T/c.conf"

# The series before any push: 26 per family on each shard (every table of
# the model), no rows; then the worker's pushes make rows on both shards.
for i in 0 1; do
  wait_metric "$T/c.conf" ps $i "m.get('paramserv_ps_table_rows', -1) == 0 and \
m.get('paramserv_ps_table_bytes', 0) > 0" 30
  text=$(curl -s --max-time 2 "$(metrics_url "$T/c.conf" ps $i)") || fail "no metrics from ps $i"
  for f in rows pending_keys admitted_total expired_total evicted_total bytes; do
    n=$(grep -c "^paramserv_ps_table_${f}{role=\"ps\",index=\"$i\",table=\"C[0-9]*\"} [0-9]" \
      <<<"$text") || true
    [ "$n" = 26 ] || fail "ps $i: $n series paramserv_ps_table_$f{...,table=\"C..\"}, expected 26"
  done
done
echo "ok: before any push, each shard serves 26 series of each paramserv_ps_table_* family, 0 rows"
start w0 "$BIN" worker --config "$T/c.conf" --index 0
for i in 0 1; do
  wait_metric "$T/c.conf" ps $i "m.get('paramserv_ps_table_rows', 0) > 100 and \
m.get('paramserv_ps_table_admitted_total', 0) == m['paramserv_ps_table_rows']" 60
done
text=$(curl -s --max-time 2 "$(metrics_url "$T/c.conf" ps 0)") || fail "no metrics from ps 0"
grep -q '^paramserv_ps_table_rows{role="ps",index="0",table="C26"} [1-9]' <<<"$text" ||
  fail "ps 0: no rows in table C26: $(grep 'table_rows.*C26' <<<"$text")"
echo "ok: after pushes, rows on both shards (admitted as many: no eviction configured)"

# status: a line per table, rows and memory on each shard and in all.  It
# reads the shards' heartbeats in Redis (every heartbeat_ms), which may
# still be from before the rows: wait until C1 has rows on both shards.
out=""
for ((i = 0; i < 100; i++)); do
  out=$("$BIN" status --config "$T/c.conf") || out=""
  grep -qE '^C1 +[1-9][0-9]* / [0-9.]+ [KMG]?i?B +[1-9][0-9]* / ' <<<"$out" && break
  sleep 0.1
done
grep -q '^sparse tables (rows / memory' <<<"$out" || fail "status shows no sparse tables: $out"
grep -qE '^TABLE +ps 0 +ps 1 +ALL$' <<<"$out" || fail "status: no table header: $out"
n=$(grep -cE '^C[0-9]+ +[0-9]+ / [0-9.]+ [KMG]?i?B +[0-9]+ / [0-9.]+ [KMG]?i?B +[0-9]+ / ' \
  <<<"$out") || true
[ "$n" = 26 ] || fail "status: $n table lines with both shards' figures, expected 26: $out"
awk '$1 == "C1"' <<<"$out"
"$BIN" status --config "$T/c.conf" --json >"$T/st.json" || fail "status --json exited $?"
/usr/bin/python3 - "$T/st.json" <<'PY' || fail "status --json: tables (above)"
import json, sys
j = json.load(open(sys.argv[1]))
ps = [n for n in j["nodes"] if n["role"] == "ps"]
assert len(ps) == 2, ps
for n in ps:
    t = n["tables"]
    assert [x["name"] for x in t] == ["C%d" % k for k in range(1, 27)], t
    assert all(x["rows"] > 0 and x["bytes"] > 0 for x in t), t
assert all("tables" not in n for n in j["nodes"] if n["role"] != "ps")
print("ok: status --json: 26 tables on each shard, rows %d and %d" %
      tuple(sum(x["rows"] for x in n["tables"]) for n in ps))
PY
echo "ok: status shows 26 tables' rows and memory on both shards and in all"

# A checkpoint: verify counts its tables' rows, the npy export holds them.
wait_summary "$T/ckpt" "o.get('event') == 'checkpoint'" 60
ck=$(ls -d "$T"/ckpt/ckpt-* | tail -1)
v=$("$BIN" ckpt verify "$ck") || fail "ckpt verify $ck exited $?: $v"
echo "$v"
rows=$(sed -n 's/.*, 26 sparse tables: \([0-9]*\) rows, [0-9]* pending keys)$/\1/p' <<<"$v")
[ -n "$rows" ] && [ "$rows" -gt 0 ] || fail "ckpt verify: no count of 26 tables' rows: $v"
e=$("$BIN" ckpt export "$ck" --format npy "$T/npy") || fail "ckpt export exited $?: $e"
echo "$e"
grep -q "; 26 sparse tables, $rows rows: <table>.keys.npy and <table>.values.npy, <table>.slots.npy$" \
  <<<"$e" || fail "ckpt export: no note of 26 tables and $rows rows: $e"
/usr/bin/python3 - "$T/npy" "$rows" <<'PY' || fail "the export's tables (above)"
import sys
import numpy as np
d, want = sys.argv[1], int(sys.argv[2])
total = 0
for k in range(1, 27):
    keys = np.load("%s/C%d.keys.npy" % (d, k))
    vals = np.load("%s/C%d.values.npy" % (d, k))
    slots = np.load("%s/C%d.slots.npy" % (d, k))
    n = len(keys)
    assert keys.dtype == np.uint64 and np.all(keys[1:] > keys[:-1]), ("C%d" % k, keys[:5])
    assert vals.dtype == np.float32 and vals.shape == (n, 16), vals.shape
    assert slots.dtype == np.float32 and slots.shape == (n, 1, 16), slots.shape
    assert np.isfinite(vals).all() and (slots > 0).all(), "C%d" % k  # adagrad's acc > 0
    total += n
assert total == want, (total, want)
print("ok: numpy: 26 tables, %d rows in all, keys ascending, values 16 wide, adagrad slots" % total)
PY
