/* The shard's Prometheus series (src/common/METRICS.md): registered and
 * served when it starts, their values copied from the shard, the tables,
 * the durable path and the connections on every tick (server_internal.h). */
#include <string.h>

#include "common/metrics.h"
#include "net/conn.h"
#include "ps/server_internal.h"

/* Bytes in and out over the connections closed and open. */
void ps_server_bytes(const server *s, uint64_t *in, uint64_t *out) {
  *in = s->bytes_in_closed;
  *out = s->bytes_out_closed;
  for (client *c = s->clients; c != NULL; c = c->next) {
    *in += ps_conn_bytes_in(c->conn);
    *out += ps_conn_bytes_out(c->conn);
  }
}

static const double staleness_bounds[] = {0, 1, 2, 4, 8, 16, 32, 64, 128, 256};
static const double ack_bounds[] = {0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01,
                                    0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5};
static const ps_metric_def shard_series[S_N] = {
    [S_APPLIED] = {PS_METRIC_COUNTER, "paramserv_ps_pushes_applied_total",
                   "pushes applied to this shard's slice"},
    [S_DUPLICATES] = {PS_METRIC_COUNTER, "paramserv_ps_duplicates_total",
                      "pushes already applied, acknowledged again"},
    [S_STALE] = {PS_METRIC_COUNTER, "paramserv_ps_stale_pushes_total",
                 "pushes dropped as stale (sync, or past last_step)"},
    [S_STALENESS] = {PS_METRIC_HISTOGRAM, "paramserv_ps_staleness",
                     "global steps between a gradient's computation and its application",
                     staleness_bounds, sizeof staleness_bounds / sizeof staleness_bounds[0]},
    [S_VERSION] = {PS_METRIC_GAUGE, "paramserv_ps_version", "updates applied to the slice"},
    [S_GLOBAL_STEP] = {PS_METRIC_GAUGE, "paramserv_ps_global_step", "the global step as known here"},
    [S_LAG_VERSIONS] = {PS_METRIC_GAUGE, "paramserv_ps_replication_lag_versions",
                        "updates applied since the newest snapshot Redis holds"},
    [S_LAG_SECONDS] = {PS_METRIC_GAUGE, "paramserv_ps_replication_lag_seconds",
                       "age of the newest snapshot Redis holds (0: it covers every update)"},
    [S_NONDURABLE] = {PS_METRIC_COUNTER, "paramserv_ps_nondurable_acks_total",
                      "updates acknowledged without being durable (on_redis_failure = degrade), "
                      "over the run"},
    [S_ACKS_WAITING] = {PS_METRIC_GAUGE, "paramserv_ps_acks_waiting",
                        "acknowledgements held until their entries are durable"},
    [S_RESTORES] = {PS_METRIC_COUNTER, "paramserv_ps_restores_total",
                    "restores of this process's state from Redis (0 or 1)"},
    [S_RESTORE_SECONDS] = {PS_METRIC_GAUGE, "paramserv_ps_restore_seconds",
                           "time the last restore from Redis took, connect to ready"},
    [S_INCARNATION] = {PS_METRIC_GAUGE, "paramserv_ps_incarnation",
                       "this process's epoch (grows with every start)"},
    [S_RECEIVED] = {PS_METRIC_COUNTER, "paramserv_ps_received_bytes_total",
                    "bytes received from peers"},
    [S_SENT] = {PS_METRIC_COUNTER, "paramserv_ps_sent_bytes_total", "bytes sent to peers"},
    [S_CONNECTIONS] = {PS_METRIC_GAUGE, "paramserv_ps_connections", "peer connections open"},
    [S_PUSH_ACK] = {PS_METRIC_HISTOGRAM, "paramserv_ps_push_ack_seconds",
                    "time from taking a push to writing its ack (log mode: its entry durable)",
                    ack_bounds, sizeof ack_bounds / sizeof ack_bounds[0]},
};

/* Per sparse table: families labelled table="C7" (METRICS.md). */
static const ps_metric_def table_series[T_N] = {
    [T_ROWS] = {PS_METRIC_GAUGE, "paramserv_ps_table_rows", "rows this shard holds of the table"},
    [T_PENDING] = {PS_METRIC_GAUGE, "paramserv_ps_table_pending_keys",
                   "keys counted toward admission, not rows yet"},
    [T_ADMITTED] = {PS_METRIC_COUNTER, "paramserv_ps_table_admitted_total",
                    "rows created by pushes since the table was last loaded"},
    [T_EXPIRED] = {PS_METRIC_COUNTER, "paramserv_ps_table_expired_total",
                   "rows evicted for idleness (idle_steps) since the table was last loaded"},
    [T_EVICTED] = {PS_METRIC_COUNTER, "paramserv_ps_table_evicted_total",
                   "rows evicted for room (max_rows) since the table was last loaded"},
    [T_BYTES] = {PS_METRIC_GAUGE, "paramserv_ps_table_bytes", "memory the table holds"},
};

/* The shard's registry: its series, and a family of each table series
 * when the model has sparse tables; then served (metrics.h).  On failure
 * every series is NULL. */
int ps_server_metrics_start(server *s, ps_errbuf *eb) {
  s->metrics = ps_metrics_new(s->cfg, "ps", s->index);
  ps_metrics_register(s->metrics, shard_series, S_N, s->series);
  int nt = ps_shard_ntables(s->shard);
  const char *names[PS_SHARD_MAX_TABLES];
  for (int t = 0; t < nt; t++)
    names[t] = ps_shard_table_name(s->shard, t);
  for (int k = 0; k < T_N && nt > 0; k++)
    ps_metrics_register_family(s->metrics, &table_series[k], "table", names, nt,
                               s->table_series[k]);
  int rc = ps_metrics_serve(s->metrics, eb);
  if (rc != 0) {
    ps_metrics_free(s->metrics);
    s->metrics = NULL;
    memset(s->series, 0, sizeof s->series);
    memset(s->table_series, 0, sizeof s->table_series);
  }
  return rc;
}

/* Copies the counts that live in the shard and the replica. */
void ps_server_metrics_update(server *s) {
  ps_metric **x = s->series;
  if (s->metrics == NULL)
    return;
  uint64_t in, out;
  ps_server_bytes(s, &in, &out);
  ps_metric_set(x[S_APPLIED], (double)ps_shard_get_counts(s->shard).applied);
  ps_metric_set(x[S_DUPLICATES], (double)ps_shard_get_counts(s->shard).duplicate);
  ps_metric_set(x[S_STALE], (double)ps_shard_get_counts(s->shard).stale);
  ps_metric_set(x[S_VERSION], (double)ps_shard_version(s->shard));
  ps_metric_set(x[S_GLOBAL_STEP], (double)ps_shard_global_step(s->shard));
  ps_metric_set(x[S_RECEIVED], (double)in);
  ps_metric_set(x[S_SENT], (double)out);
  ps_metric_set(x[S_CONNECTIONS], (double)s->nclients);
  for (int t = 0; t < ps_shard_ntables(s->shard); t++) {
    ps_table_stats st = ps_shard_table_stats(s->shard, t);
    ps_metric_set(s->table_series[T_ROWS][t], (double)st.rows);
    ps_metric_set(s->table_series[T_PENDING][t], (double)st.pending);
    ps_metric_set(s->table_series[T_ADMITTED][t], (double)st.admitted);
    ps_metric_set(s->table_series[T_EXPIRED][t], (double)st.expired);
    ps_metric_set(s->table_series[T_EVICTED][t], (double)st.evicted);
    ps_metric_set(s->table_series[T_BYTES][t], (double)st.bytes);
  }
  {
    ps_durable_stats d;
    ps_durable_stats_get(s->durable, &d);
    if (d.started) {
      ps_metric_set(x[S_LAG_VERSIONS], (double)d.lag);
      ps_metric_set(x[S_LAG_SECONDS], d.lag_seconds);
      ps_metric_set(x[S_NONDURABLE], (double)d.nondurable);
      ps_metric_set(x[S_ACKS_WAITING], (double)d.acks_waiting);
    }
  }
}
