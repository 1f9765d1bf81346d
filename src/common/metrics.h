/* A process's metrics for a monitoring system: a small registry of
 * counters, gauges and histograms whose values are atomics, served in
 * Prometheus's text format (version 0.0.4) at GET /metrics by
 * libmicrohttpd's own thread.  The series and their meaning: METRICS.md.
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

/* Register a series; `name` is the full Prometheus name (paramserv_...,
 * counters ending _total), `help` one line.  Both must be string literals
 * or otherwise outlive the registry.  @return the metric, owned by the
 * registry, or NULL (m is NULL, or out of memory: the series is then
 * left out). */
ps_metric *ps_metrics_counter(ps_metrics *m, const char *name, const char *help);
ps_metric *ps_metrics_gauge(ps_metrics *m, const char *name, const char *help);
/* bounds: n upper bounds in increasing order (the +Inf bucket is added),
 * copied. */
ps_metric *ps_metrics_histogram(ps_metrics *m, const char *name, const char *help,
                                const double *bounds, int n);

/* Start serving on ps_metrics_addr's address (an internal thread of
 * libmicrohttpd).  @return 0, or a negative errno with a one-line message
 * in eb naming the setting and the address (e.g. the port is in use). */
int ps_metrics_serve(ps_metrics *m, ps_errbuf *eb);

/* Stop serving (joins the HTTP thread) and free everything. */
void ps_metrics_free(ps_metrics *m);

/* A gauge's value, or a counter's (from a count kept elsewhere, which only
 * grows).  Lock-free; callable from any thread. */
void ps_metric_set(ps_metric *x, double v);
void ps_metric_add(ps_metric *x, double v);
/* Count one observation into a histogram. */
void ps_metric_observe(ps_metric *x, double v);

/* The text ps_metrics_serve answers with, NUL-terminated, malloc'ed (the
 * caller frees); NULL when m is NULL or memory ran out.  For tests. */
char *ps_metrics_format(ps_metrics *m);

#endif
