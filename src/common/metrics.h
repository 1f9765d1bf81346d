/* A process's metrics for a monitoring system: a small registry of
 * counters, gauges and histograms whose values are atomics, served in
 * Prometheus's text format (version 0.0.4) at GET /metrics by
 * libmicrohttpd's own thread.  Every series carries the process's labels
 * (role, index); a family's series one more (ps_metrics_register_family).
 * The series and their meaning: METRICS.md.
 *
 * Threads: the process's threads only store into the atomics
 * (ps_metric_set, _add, _observe); the HTTP thread reads and formats them.
 * Metrics are registered before ps_metrics_serve, and none after. */
#ifndef PS_COMMON_METRICS_H
#define PS_COMMON_METRICS_H

#include <stdint.h>

#include "common/config.h"
#include "paramserv/error.h"

typedef struct ps_metrics ps_metrics;
typedef struct ps_metric ps_metric;

/* Where process (role, index) serves its metrics: [metrics] listen's port
 * plus its slot (chief 0, shard i 1 + i, worker or ring member j
 * 1 + nps + j), on listen's host.  @return 0 and *out, or 1 when metrics
 * are off (listen empty). */
int ps_metrics_addr(const ps_config *c, const char *role, int index, ps_addr *out);

/* A registry for process (role, index), whose series carry the labels
 * role="<role>",index="<index>" (index < 0: no index label).  Returns NULL
 * when [metrics] listen is empty (metrics off) or memory ran out; every
 * function below accepts NULL and does nothing, so callers need not test.
 * Free with ps_metrics_free. */
ps_metrics *ps_metrics_new(const ps_config *c, const char *role, int index);

typedef enum ps_metric_kind {
  PS_METRIC_COUNTER = 0,
  PS_METRIC_GAUGE,
  PS_METRIC_HISTOGRAM,
} ps_metric_kind;

/* One series: its full Prometheus name (paramserv_..., counters ending
 * _total, units _seconds or _bytes) and a one-line help.  A histogram's
 * bounds: nbounds upper bounds in increasing order (+Inf is added; at most
 * 16).  Each process declares its series in one table of these. */
typedef struct ps_metric_def {
  ps_metric_kind kind;
  const char *name, *help;
  const double *bounds;
  int nbounds;
} ps_metric_def;

/* Register the n series of defs, in order, their metrics into out[0..n):
 * owned by the registry, NULL when m is NULL (or the registry is full, 64
 * series: the series is then left out).  defs (and the strings and bounds
 * it points to) must outlive the registry: a static table. */
void ps_metrics_register(ps_metrics *m, const ps_metric_def *defs, int n, ps_metric **out);

/* A family: series of one name and kind (a counter or a gauge) that differ
 * in one more label, `label`="<value>", one per value:
 * paramserv_ps_table_rows{role="ps",index="0",table="C7"}.  Register the
 * children of values[0..n) (each copied, escaped as the text format wants,
 * at most 63 bytes so; at most PS_METRICS_MAX_CHILDREN) into out[0..n),
 * each then set as any series.  The family takes one of the registry's 64
 * places, its children none.  out[i] is NULL when m is NULL, the registry is
 * full, def is a histogram or memory ran out.  def and label must outlive
 * the registry (a static table); values need not. */
#define PS_METRICS_MAX_CHILDREN 4096
void ps_metrics_register_family(ps_metrics *m, const ps_metric_def *def, const char *label,
                                const char *const *values, int n, ps_metric **out);

/* What the endpoint gives its clients, so that no client (a slow one, or
 * a thousand) takes more: connections open at once, from any one address,
 * and the seconds a connection may stay idle (a request sent byte by byte
 * holds one of the connections of its address, not the process's
 * descriptors).  Over a limit a connection is closed at once. */
#define PS_METRICS_MAX_CONNECTIONS 64
#define PS_METRICS_MAX_PER_IP 8
#define PS_METRICS_TIMEOUT_S 10

/* Start serving on ps_metrics_addr's address (an internal thread of
 * libmicrohttpd, polling with epoll: no descriptor is too high for it).
 * @return 0, or a negative errno with a one-line message in eb naming the
 * config file, the setting, the process and the address (e.g. the port is
 * in use).  The config given to ps_metrics_new must outlive the registry. */
int ps_metrics_serve(ps_metrics *m, ps_errbuf *eb);

/* A process's metrics in one call: ps_metrics_new, ps_metrics_register
 * of defs[0..n) into series[0..n), and ps_metrics_serve.  *out is NULL
 * (and every series NULL) when metrics are off or serving failed.
 * @return 0, or ps_metrics_serve's error with its message in eb. */
int ps_metrics_start(const ps_config *c, const char *role, int index, const ps_metric_def *defs,
                     int n, ps_metric **series, ps_metrics **out, ps_errbuf *eb);

/* Stop serving (joins the HTTP thread) and free everything. */
void ps_metrics_free(ps_metrics *m);

/* A gauge's value, or a counter's (from a count kept elsewhere, which only
 * grows).  Lock-free; callable from any thread. */
void ps_metric_set(ps_metric *x, double v);
void ps_metric_add(ps_metric *x, double v);
/* Count one observation into a histogram. */
void ps_metric_observe(ps_metric *x, double v);
/* A gauge set to the rate of `total` (a count that only grows) per second
 * since the last time it was set, at most once a second; its one writer
 * is the thread that calls this. */
void ps_metric_rate(ps_metric *x, double total);

/* The text ps_metrics_serve answers with, NUL-terminated, malloc'ed (the
 * caller frees); NULL when m is NULL or memory ran out.  For tests. */
char *ps_metrics_format(ps_metrics *m);

#endif
