/* A process's metrics registry and its Prometheus endpoint (metrics.h). */
#include "common/metrics.h"

#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common/timeutil.h"
#include "net/conn.h"

#define MAX_METRICS 64
#define MAX_BUCKETS 16

/* Doubles live in uint64_t bit patterns so that the __atomic builtins
 * handle them without a lock (and without libatomic). */
struct ps_metric {
  const ps_metric_def *def;
  /* A family (ps_metrics_register_family): its label's name and its
   * children, each with its label's value, escaped; NULL, 0 otherwise. */
  const char *label;
  struct ps_metric *kids;
  int nkids;
  char value[64];
  uint64_t bits;                     /* counter, gauge: the value */
  uint64_t buckets[MAX_BUCKETS + 1]; /* histogram: not cumulative; summed when formatted */
  uint64_t count, sum_bits;
  double rate_t0, rate_total0;       /* ps_metric_rate's window (its writer's alone) */
};

struct ps_metrics {
  const ps_config *cfg;              /* for messages: its path and listen */
  char who[32];                      /* "ps 1" */
  ps_addr at;
  char labels[96];                   /* role="ps",index="0" */
  int n;
  ps_metric m[MAX_METRICS];
  struct MHD_Daemon *daemon;
  int fd;                            /* the listening socket, handed to MHD */
};

static double from_bits(uint64_t b) {
  double v;
  memcpy(&v, &b, sizeof v);
  return v;
}

static uint64_t to_bits(double v) {
  uint64_t b;
  memcpy(&b, &v, sizeof b);
  return b;
}

static void add_double(uint64_t *p, double v) {
  uint64_t old = __atomic_load_n(p, __ATOMIC_RELAXED), nv;
  do
    nv = to_bits(from_bits(old) + v);
  while (!__atomic_compare_exchange_n(p, &old, nv, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

/* ------------------------------------------------------------ registry */

int ps_metrics_addr(const ps_config *c, const char *role, int index, ps_addr *out) {
  if (c->metrics_listen.port == 0)
    return 1;
  int slot = strcmp(role, "chief") == 0 ? 0
             : strcmp(role, "ps") == 0  ? 1 + index
                                        : 1 + c->nps + index;
  *out = c->metrics_listen;
  out->port = (uint16_t)(c->metrics_listen.port + slot);
  return 0;
}

ps_metrics *ps_metrics_new(const ps_config *c, const char *role, int index) {
  ps_addr at;
  if (ps_metrics_addr(c, role, index, &at) != 0)
    return NULL;
  ps_metrics *m = calloc(1, sizeof *m);
  if (m == NULL)
    return NULL;
  m->cfg = c;
  snprintf(m->who, sizeof m->who, "%s %d", role, index);
  m->at = at;
  m->fd = -1;
  if (index >= 0)
    snprintf(m->labels, sizeof m->labels, "role=\"%s\",index=\"%d\"", role, index);
  else
    snprintf(m->labels, sizeof m->labels, "role=\"%s\"", role);
  return m;
}

void ps_metrics_register(ps_metrics *m, const ps_metric_def *defs, int n, ps_metric **out) {
  for (int i = 0; i < n; i++) {
    out[i] = NULL;
    if (m == NULL || m->n >= MAX_METRICS || m->daemon != NULL || defs[i].nbounds < 0 ||
        defs[i].nbounds > MAX_BUCKETS)
      continue;
    out[i] = &m->m[m->n++];
    out[i]->def = &defs[i];
    out[i]->rate_t0 = ps_now_s();
  }
}

/* A label value as the text format wants it: a backslash, a double quote
 * and a newline written as \\, \" and \n.
 * @return 0, or -1 when it does not fit in cap bytes. */
static int escape_label(const char *v, char *out, size_t cap) {
  size_t w = 0;
  for (; *v != '\0'; v++) {
    const char *e = *v == '\\' ? "\\\\" : *v == '"' ? "\\\"" : *v == '\n' ? "\\n" : NULL;
    size_t len = e != NULL ? 2 : 1;
    if (w + len >= cap)
      return -1;
    if (e != NULL)
      memcpy(out + w, e, 2);
    else
      out[w] = *v;
    w += len;
  }
  out[w] = '\0';
  return 0;
}

void ps_metrics_register_family(ps_metrics *m, const ps_metric_def *def, const char *label,
                                const char *const *values, int n, ps_metric **out) {
  for (int i = 0; i < n; i++)
    out[i] = NULL;
  if (m == NULL || m->n >= MAX_METRICS || m->daemon != NULL || n < 1 ||
      n > PS_METRICS_MAX_CHILDREN || def->kind == PS_METRIC_HISTOGRAM)
    return;
  ps_metric *kids = calloc((size_t)n, sizeof *kids);
  if (kids == NULL)
    return;
  for (int i = 0; i < n; i++) {
    kids[i].def = def;
    if (escape_label(values[i], kids[i].value, sizeof kids[i].value) != 0) {
      free(kids);
      return;
    }
  }
  ps_metric *f = &m->m[m->n++];
  f->def = def;
  f->label = label;
  f->kids = kids;
  f->nkids = n;
  for (int i = 0; i < n; i++)
    out[i] = &kids[i];
}

void ps_metric_set(ps_metric *x, double v) {
  if (x != NULL)
    __atomic_store_n(&x->bits, to_bits(v), __ATOMIC_RELAXED);
}

void ps_metric_add(ps_metric *x, double v) {
  if (x != NULL)
    add_double(&x->bits, v);
}

void ps_metric_rate(ps_metric *x, double total) {
  if (x == NULL)
    return;
  double now = ps_now_s();
  if (now - x->rate_t0 < 1.0)
    return;
  ps_metric_set(x, (total - x->rate_total0) / (now - x->rate_t0));
  x->rate_t0 = now;
  x->rate_total0 = total;
}

void ps_metric_observe(ps_metric *x, double v) {
  if (x == NULL)
    return;
  int b = 0, nb = x->def->nbounds;
  while (b < nb && v > x->def->bounds[b])
    b++;
  __atomic_add_fetch(&x->buckets[b], 1, __ATOMIC_RELAXED);
  add_double(&x->sum_bits, v);
  __atomic_add_fetch(&x->count, 1, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------ the text */

/* A value as Prometheus reads it: integers without a fraction. */
static void value(FILE *f, double v) {
  if (v > -9e15 && v < 9e15 && v == (double)(int64_t)v)  /* the range first: NaN, inf */
    fprintf(f, "%lld", (long long)v);
  else if (isnan(v) || isinf(v))
    fputs(isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf", f);  /* Prometheus's spelling */
  else
    fprintf(f, "%.17g", v);
}

char *ps_metrics_format(ps_metrics *m) {
  if (m == NULL)
    return NULL;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL)
    return NULL;
  static const char *const types[] = {"counter", "gauge", "histogram"};
  for (int i = 0; i < m->n; i++) {
    ps_metric *x = &m->m[i];
    const ps_metric_def *d = x->def;
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", d->name, d->help, d->name, types[d->kind]);
    for (int k = 0; k < x->nkids; k++) {
      fprintf(f, "%s{%s,%s=\"%s\"} ", d->name, m->labels, x->label, x->kids[k].value);
      value(f, from_bits(__atomic_load_n(&x->kids[k].bits, __ATOMIC_RELAXED)));
      fputc('\n', f);
    }
    if (x->kids != NULL)
      continue;
    if (d->kind != PS_METRIC_HISTOGRAM) {
      fprintf(f, "%s{%s} ", d->name, m->labels);
      value(f, from_bits(__atomic_load_n(&x->bits, __ATOMIC_RELAXED)));
      fputc('\n', f);
      continue;
    }
    /* The buckets are read one by one while observations go on: the count
     * printed is their sum, so that the +Inf bucket equals _count. */
    uint64_t cum = 0;
    for (int b = 0; b <= d->nbounds; b++) {
      cum += __atomic_load_n(&x->buckets[b], __ATOMIC_RELAXED);
      fprintf(f, "%s_bucket{%s,le=\"", d->name, m->labels);
      if (b < d->nbounds)
        value(f, d->bounds[b]);
      else
        fputs("+Inf", f);
      fprintf(f, "\"} %llu\n", (unsigned long long)cum);
    }
    fprintf(f, "%s_sum{%s} ", d->name, m->labels);
    value(f, from_bits(__atomic_load_n(&x->sum_bits, __ATOMIC_RELAXED)));
    fprintf(f, "\n%s_count{%s} %llu\n", d->name, m->labels, (unsigned long long)cum);
  }
  if (fclose(f) != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* ------------------------------------------------------------ HTTP */

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **state) {
  (void)version;
  (void)upload;
  (void)upload_size;
  (void)state;
  ps_metrics *m = cls;
  int get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  int found = get && strcmp(url, "/metrics") == 0;
  char *text = found ? ps_metrics_format(m) : NULL;
  static char not_found[] = "not found: GET /metrics\n";
  struct MHD_Response *r =
      text != NULL ? MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE)
                   : MHD_create_response_from_buffer(strlen(not_found), not_found,
                                                     MHD_RESPMEM_PERSISTENT);
  if (r == NULL) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          text != NULL ? "text/plain; version=0.0.4; charset=utf-8"
                                       : "text/plain; charset=utf-8");
  unsigned status = text != NULL ? MHD_HTTP_OK
                    : !get       ? MHD_HTTP_METHOD_NOT_ALLOWED
                    : found      ? MHD_HTTP_INTERNAL_SERVER_ERROR
                                 : MHD_HTTP_NOT_FOUND;
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

int ps_metrics_serve(ps_metrics *m, ps_errbuf *eb) {
  if (m == NULL)
    return 0;
  char a[300], base[300];
  ps_addr_format(&m->at, a, sizeof a);
  ps_addr_format(&m->cfg->metrics_listen, base, sizeof base);
  /* The socket is ours, so that a port in use or an address this host
   * lacks is an error that names it (MHD would only say it failed). */
  uv_loop_t loop;
  struct sockaddr_storage ss;
  int rc = uv_loop_init(&loop);
  if (rc == 0) {
    rc = ps_net_resolve(&loop, &m->at, &ss);
    uv_loop_close(&loop);
  }
  if (rc != 0)
    return ps_err_set(eb, -EINVAL, "%s: [metrics] listen = %s: cannot resolve %s: %s (expected "
                      "an address of this host)", m->cfg->path, base, a, uv_strerror(rc));
  int one = 1;
  m->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (m->fd < 0 || setsockopt(m->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(m->fd, (struct sockaddr *)&ss,
           ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in)) !=
          0 ||
      listen(m->fd, 16) != 0) {
    int e = errno;
    if (m->fd >= 0)
      close(m->fd);
    m->fd = -1;
    return ps_err_set(eb, -e, "%s: [metrics] listen = %s: %s cannot listen on %s: %s (expected "
                      "a free port: each process takes the port plus its slot)", m->cfg->path,
                      base, m->who, a, strerror(e));
  }
  m->daemon = MHD_start_daemon(
      MHD_USE_AUTO_INTERNAL_THREAD, 0, NULL, NULL, answer, m, MHD_OPTION_LISTEN_SOCKET, m->fd,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)PS_METRICS_MAX_CONNECTIONS,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)PS_METRICS_MAX_PER_IP,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)PS_METRICS_TIMEOUT_S, MHD_OPTION_END);
  if (m->daemon == NULL) {
    close(m->fd);
    m->fd = -1;
    return ps_err_set(eb, -EIO, "%s: [metrics] listen = %s: %s: libmicrohttpd could not serve on "
                      "%s", m->cfg->path, base, m->who, a);
  }
  m->fd = -1;  /* MHD_stop_daemon closes it */
  return 0;
}

int ps_metrics_start(const ps_config *c, const char *role, int index, const ps_metric_def *defs,
                     int n, ps_metric **series, ps_metrics **out, ps_errbuf *eb) {
  *out = ps_metrics_new(c, role, index);
  ps_metrics_register(*out, defs, n, series);
  int rc = ps_metrics_serve(*out, eb);
  if (rc != 0) {
    ps_metrics_free(*out);
    *out = NULL;
    ps_metrics_register(NULL, defs, n, series);
  }
  return rc;
}

void ps_metrics_free(ps_metrics *m) {
  if (m == NULL)
    return;
  if (m->daemon != NULL)
    MHD_stop_daemon(m->daemon);  /* joins its thread, closes the socket */
  if (m->fd >= 0)
    close(m->fd);
  for (int i = 0; i < m->n; i++)
    free(m->m[i].kids);
  free(m);
}
