/* The parameter-server shard process (see server.h).
 *
 * One libuv loop serves every connection.  A connection starts with the
 * shard's CHALLENGE (a random nonce); the client proves it knows the
 * cluster secret with an HMAC over the nonce and its identity in HELLO, and
 * the shard answers WELCOME or an ERROR and closes.  Then each request gets
 * its reply with the same request id.  A pull may be held (sync: until the
 * shard reaches the step asked for; ssp: until the slowest live worker is
 * within the staleness bound).  Bad input of any kind gets an ERROR where
 * one can be sent, the connection is closed, one line is logged naming the
 * peer and the reason, and the shard's state is left as it was. */
#include "ps/server.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/notify.h"
#include "common/procmem.h"
#include "common/timeutil.h"
#include "data/criteo.h"
#include "layout/layout.h"
#include "net/conn.h"
#include "nn/model.h"
#include "proto/proto.h"
#include "ps/consistency.h"
#include "ps/durable.h"
#include "ps/shard.h"
#include "replica/registry.h"
#include "ps/server_internal.h"
#include "ps/rowwait.h"

#define TICK_MS 50

/* ------------------------------------------------------------ handlers */

static void set_name(client *cl) {
  snprintf(cl->name, sizeof cl->name, "%s %u (%s)", ps_role_name(cl->role), cl->index,
           ps_conn_peer(cl->conn));
}

/* A worker acts as one incarnation at a time.  A HELLO from a newer one
 * closes the older one's connections, which may still be open (its host
 * died, or it was paused and replaced), so that their clocks and held
 * pulls stop counting at once; the old process, if it runs on, reads an
 * ERROR that tells it to stop.  A HELLO from an incarnation older than one
 * this shard has seen is refused.  @return 1 if cl was refused. */
static int one_incarnation(client *cl) {
  server *s = cl->srv;
  uint64_t newest = ps_shard_worker_incarnation(s->shard, cl->index);
  for (const client *c = s->clients; c != NULL; c = c->next)
    if (c != cl && c->state == C_READY && c->role == PS_ROLE_WORKER && c->index == cl->index &&
        c->incarnation > newest)
      newest = c->incarnation;
  if (cl->incarnation < newest) {
    REFUSE(cl, -ESTALE, 0, "incarnation %" PRIu64 " of worker %u: it has a newer one (%" PRIu64 ")",
           cl->incarnation, cl->index, newest);
    return 1;
  }
  int closed = 0;
  for (client *c = s->clients; c != NULL; c = c->next)
    if (c != cl && c->state == C_READY && c->role == PS_ROLE_WORKER && c->index == cl->index &&
        c->incarnation < cl->incarnation) {
      /* Closing waits for the ERROR to be written, which a dead peer never
       * acknowledges; until then the connection counts for nothing. */
      c->state = C_CLOSING;
      REFUSE(c, -ESTALE, 0, "worker %u connected again as incarnation %" PRIu64 " (from %s): "
             "this connection's incarnation %" PRIu64 " is over", cl->index, cl->incarnation,
             ps_conn_peer(cl->conn), c->incarnation);
      closed = 1;
    }
  if (closed)
    ps_consistency_closed(s);
  return 0;
}

static void on_hello(client *cl, const ps_msg_hello *h) {
  server *s = cl->srv;
  cl->role = h->role;
  cl->index = h->index;
  cl->incarnation = h->incarnation;
  set_name(cl);
  if (strcmp(h->cluster_id, s->cfg->cluster_id) != 0) {
    REFUSE(cl, PS_ECONFIG, 0, "cluster id '%s', this shard belongs to cluster '%s'", h->cluster_id,
           s->cfg->cluster_id);
    return;
  }
  if (!ps_proto_auth_check(s->secret, s->secret_len, cl->nonce, h)) {
    REFUSE(cl, -EACCES, 0, "authentication failed: the HELLO's proof does not match the "
                           "cluster secret");
    return;
  }
  if (h->layout_hash != s->layout.hash) {
    REFUSE(cl, PS_ELAYOUT, 0,
           "layout hash %016" PRIx64 ", this shard's is %016" PRIx64
           " (another model, shard count or placement)",
           h->layout_hash, s->layout.hash);
    return;
  }
  if (h->role == PS_ROLE_WORKER && h->index >= (uint32_t)s->cfg->nworkers) {
    REFUSE(cl, PS_ECONFIG, 0, "worker index %u, the cluster has workers 0..%d", h->index,
           s->cfg->nworkers - 1);
    return;
  }
  if (h->role != PS_ROLE_WORKER && h->role != PS_ROLE_TOOL && h->role != PS_ROLE_CHIEF) {
    REFUSE(cl, PS_EFORMAT, 0, "role %s may not connect to a shard", ps_role_name(h->role));
    return;
  }
  if (h->role == PS_ROLE_WORKER && s->phase == PS_PHASE_WAITING) {
    /* Not an error of the worker's: it waits and tries again. */
    cl->refused = 1;
    ps_conn_fail(cl->conn, -EAGAIN, PS_ERROR_RETRY,
                 "shard %d is waiting for the chief to initialize it", s->index);
    return;
  }
  if (h->role == PS_ROLE_WORKER && one_incarnation(cl))
    return;
  cl->state = C_READY;
  ps_conn_handshake_done(cl->conn, s->max_payload);
  ps_consistency_joined(cl);
  ps_msg m = {.type = PS_MSG_WELCOME};
  m.u.welcome.index = (uint32_t)s->index;
  m.u.welcome.consistency = (uint8_t)s->cfg->consistency;
  m.u.welcome.incarnation = s->incarnation;
  m.u.welcome.layout_hash = s->layout.hash;
  m.u.welcome.slice_floats = ps_shard_options(s->shard)->nfloats;
  m.u.welcome.version = ps_shard_version(s->shard);
  m.u.welcome.global_step = ps_shard_global_step(s->shard);
  m.u.welcome.max_payload = (uint32_t)s->max_payload;
  ps_conn_send_msg(cl->conn, &m, 0);
  ps_log(PS_LOG_INFO, "%s: connected (incarnation %" PRIu64 ")", cl->name, cl->incarnation);
}

/* Sparse blocks that name a table this shard does not hold, or another
 * dim: refused (ERROR, close).  @return 1 if so. */
static int sparse_refused(client *cl, const char *type, int kind, const ps_sparse *sp) {
  char why[256];
  if (sp->bytes == 0 ||
      ps_shard_sparse_check(cl->srv->shard, kind, sp->data, sp->bytes, why, sizeof why) == 0)
    return 0;
  REFUSE(cl, PS_ELAYOUT, 0, "%s: %s", type, why);
  return 1;
}

static void on_pull(client *cl, uint64_t req, const ps_msg_pull *p) {
  if (cl->pull.held) {
    REFUSE(cl, PS_EFORMAT, 0, "a second PULL before the first was answered");
    return;
  }
  /* The keys wait with the pull (held in sync and ssp); the rows are read
   * when it is answered. */
  server *s = cl->srv;
  if (sparse_refused(cl, "PULL", PS_SPARSE_K, &p->sparse))
    return;
  if (p->sparse.bytes > cl->pull_keys_cap) {
    uint8_t *k = realloc(cl->pull_keys, p->sparse.bytes);
    if (k == NULL) {
      ps_conn_fail(cl->conn, -ENOMEM, PS_ERROR_RETRY, "shard %d: out of memory for a pull's keys",
                   s->index);
      return;
    }
    cl->pull_keys = k;
    cl->pull_keys_cap = p->sparse.bytes;
  }
  if (p->sparse.bytes > 0)
    memcpy(cl->pull_keys, p->sparse.data, p->sparse.bytes);
  cl->pull_keys_bytes = p->sparse.bytes;
  ps_consistency_pull(cl, req, p->step);
}

/* taken_ns: when ps_server_push took the push (its ack's latency). */
static void send_ack(client *cl, uint64_t req, uint64_t seq, uint64_t version, uint64_t gstep,
                     uint32_t status, uint64_t taken_ns) {
  double secs = (double)(ps_now_ns() - taken_ns) * 1e-9;
  ps_lathist_add(&cl->srv->acks, secs);
  ps_metric_observe(cl->srv->series[S_PUSH_ACK], secs);
  ps_msg m = {.type = PS_MSG_PUSH_ACK};
  m.u.push_ack.seq = seq;
  m.u.push_ack.version = version;
  m.u.push_ack.global_step = gstep;
  m.u.push_ack.status = status;
  ps_conn_send_msg(cl->conn, &m, req);
}

typedef struct pending_ack {
  client *cl;
  uint64_t req, seq, version, global_step, taken_ns;
  uint32_t status;
} pending_ack;

/* An ack kept by ps_durable_submit comes back: sent when its entry is
 * durable (or, in degrade, failed), dropped when fenced or closing. */
static void ack_durable(void *arg, int acked) {
  pending_ack *a = arg;
  client *cl = a->cl;
  if (acked && !cl->closed)
    send_ack(cl, a->req, a->seq, a->version, a->global_step, a->status, a->taken_ns);
  client_unref(cl);
}

void ps_server_push(client *cl, uint64_t req, const ps_msg_push *p) {
  server *s = cl->srv;
  uint64_t taken_ns = ps_now_ns();
  if (cl->role != PS_ROLE_WORKER) {
    REFUSE(cl, PS_EFORMAT, 0, "PUSH from a %s: only workers push", ps_role_name(cl->role));
    return;
  }
  if (p->worker != cl->index) {
    REFUSE(cl, PS_EFORMAT, 0, "PUSH names worker %u on the connection of worker %u", p->worker,
           cl->index);
    return;
  }
  if (p->count != ps_shard_options(s->shard)->nfloats) {
    REFUSE(cl, PS_ELAYOUT, 0,
           "PUSH of %" PRIu64 " floats: not this shard's slice, which holds %zu floats",
           p->count, ps_shard_options(s->shard)->nfloats);
    return;
  }
  if (sparse_refused(cl, "PUSH", PS_SPARSE_KV, &p->sparse))
    return;
  /* Bags pooled here (PROTOCOL.md, "Bags") become the rows' gradients they
   * amount to, before anything holds, applies or journals the push. */
  ps_msg_push rows;
  if (ps_sparse_has_bags(PS_SPARSE_KV, p->sparse.data, p->sparse.bytes)) {
    /* A journal entry kept from an earlier frame may borrow the buffer
     * (ps_durable_journal): it goes out first. */
    ps_durable_flush(s->durable);
    rows = *p;
    if (ps_sparse_unbag(p->sparse.data, p->sparse.bytes, &s->unbag, &s->unbag_cap,
                        &rows.sparse.bytes) != 0) {
      ps_conn_fail(cl->conn, -ENOMEM, PS_ERROR_RETRY, "shard %d: out of memory for a push's bags",
                   s->index);
      return;
    }
    rows.sparse.data = s->unbag;
    p = &rows;
  }
  if (ps_control_hold_push(cl, req, p))
    return;
  uint64_t before = ps_shard_version(s->shard);
  ps_journal j;
  uint64_t global_before = ps_shard_global_step(s->shard);
  ps_push_result r =
      ps_shard_push(s->shard, p->worker, p->incarnation, p->seq, p->step, p->data,
                    p->sparse.data, p->sparse.bytes, &j);
  if (r == PS_SHARD_APPLIED)
    ps_metric_observe(s->series[S_STALENESS],
                      global_before > p->step ? (double)(global_before - p->step) : 0.0);
  /* The shard's own account of each push it took, before any ack: the
   * checker counts a double application from these, whatever the worker saw. */
  if (r == PS_SHARD_APPLIED)
    ps_history_line(s->history, "apply %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %" PRIu64 " %" PRIu64,
                    s->incarnation, ps_shard_journal(s->shard), ps_shard_version(s->shard), p->worker,
                    p->incarnation, p->seq);
  else if (r == PS_SHARD_STALE)
    ps_history_line(s->history, "stale %" PRIu64 " %u %" PRIu64 " %" PRIu64, s->incarnation,
                    p->worker, p->incarnation, p->seq);
  if (r == PS_SHARD_OLD_INCARNATION) {
    REFUSE(cl, PS_EFORMAT, 0, "PUSH from incarnation %" PRIu64 " of worker %u, which has a newer one",
           p->incarnation, p->worker);
    return;
  }
  uint32_t status = r == PS_SHARD_APPLIED     ? PS_PUSH_APPLIED
                    : r == PS_SHARD_DUPLICATE ? PS_PUSH_DUPLICATE
                                              : PS_PUSH_STALE;
  if (r == PS_SHARD_DUPLICATE)
    ps_log(PS_LOG_INFO, "%s: push seq %" PRIu64 " already applied; acknowledged again", cl->name,
           p->seq);
  /* The ack waits for the entry to be durable (durable.h); a duplicate's
   * for everything the shard holds now, which covers its original; a stale
   * one's too, so that a connection's acks go out in the order of its
   * pushes (a worker may have two unacknowledged: PROTOCOL.md). */
  if (r == PS_SHARD_APPLIED)
    ps_durable_journal(s->durable, &j);
  pending_ack a = {cl, req, p->seq, ps_shard_version(s->shard), ps_shard_global_step(s->shard),
                   taken_ns, status};
  int durable = ps_durable_submit(s->durable, ps_shard_journal(s->shard), &a, sizeof a,
                                  ack_durable);
  if (durable == 0)
    cl->refs++;
  /* No ack: the worker re-sends on a new connection, a duplicate then. */
  if (durable == -ENOMEM)
    ps_conn_fail(cl->conn, -ENOMEM, PS_ERROR_RETRY, "shard %d: out of memory holding an ack",
                 s->index);
  if (durable == 1)
    send_ack(cl, req, p->seq, ps_shard_version(s->shard), ps_shard_global_step(s->shard), status,
             taken_ns);
  if (ps_shard_version(s->shard) != before)
    ps_durable_updated(s->durable);
  ps_consistency_pushed(cl, r, before);
}

static void on_stats(client *cl, uint64_t req) {
  server *s = cl->srv;
  ps_msg m = {.type = PS_MSG_STATS_REPLY};
  ps_msg_stats_reply *r = &m.u.stats_reply;
  r->version = ps_shard_version(s->shard);
  r->global_step = ps_shard_global_step(s->shard);
  r->incarnation = s->incarnation;
  r->pushes_applied = ps_shard_get_counts(s->shard).applied;
  r->pushes_duplicate = ps_shard_get_counts(s->shard).duplicate;
  r->pushes_stale = ps_shard_get_counts(s->shard).stale;
  r->pulls = s->pulls;
  ps_server_bytes(s, &r->bytes_in, &r->bytes_out);
  r->clients = (uint64_t)s->nclients;
  r->flags = (s->phase != PS_PHASE_WAITING ? PS_STATS_INITIALIZED : 0) |
             (s->phase == PS_PHASE_HELD ? PS_STATS_PAUSED : 0);
  ps_conn_send_msg(cl->conn, &m, req);
}

/* ------------------------------------------------- the chief's frames */

static void on_stop_timer(uv_timer_t *t) {
  server *s = t->data;
  s->status = 0;
  ps_server_stop(s, "the chief ended the run");
}

static int start_durable(server *s);

/* What control.c left for the server to do. */
static void control_outcome(server *s, ps_control_outcome o) {
  switch (o) {
  case PS_CONTROL_RESUMED:
    ps_control_drain(s, ps_server_push);
    break;
  case PS_CONTROL_LOADED:
    ps_server_state_began(s, "chief");
    if (start_durable(s) != 0) {
      s->status = 1;
      ps_server_stop(s, "cannot replicate the loaded state");
    }
    break;
  case PS_CONTROL_STOP:
    ps_control_drain(s, ps_server_push);
    /* Exit once the frames are out. */
    uv_timer_start(&s->stop_timer, on_stop_timer, 200, 0);
    break;
  default:
    break;
  }
}

/* A PULL or PUSH that waited for its rows (rowwait.h), its payload a copy. */
static void on_waited(client *cl, const ps_frame_header *h, const uint8_t *payload,
                      const ps_msg *m) {
  (void)payload;
  if (m->type == PS_MSG_PULL) {
    on_pull(cl, h->request_id, &m->u.pull);
    return;
  }
  /* No journal entry borrows the copy: it is freed after this. */
  ps_durable_frame(cl->srv->durable, NULL, NULL);
  ps_server_push(cl, h->request_id, &m->u.push);
}

static void on_frame(ps_conn *conn, const ps_frame_header *h, const uint8_t *payload) {
  client *cl = ps_conn_data(conn);
  ps_msg m;
  ps_errbuf eb = {0};
  if (ps_proto_decode(h, payload, h->length, &m, &eb) != 0) {
    REFUSE(cl, eb.code, 0, "%s", eb.msg);
    return;
  }
  if (cl->state == C_HANDSHAKE) {
    if (m.type != PS_MSG_HELLO) {
      REFUSE(cl, PS_EFORMAT, 0, "%s before HELLO: expected HELLO first", ps_proto_type_name(m.type));
      return;
    }
    on_hello(cl, &m.u.hello);
    return;
  }
  int waits = ps_rowwait_frame(cl, h, payload, &m, on_waited);
  if (waits < 0) {
    ps_conn_fail(conn, -ENOMEM, PS_ERROR_RETRY, "shard %d: out of memory holding a request "
                 "for its rows", cl->srv->index);
    return;
  }
  if (waits == 1)
    return;
  switch (m.type) {
  case PS_MSG_PULL:
    on_pull(cl, h->request_id, &m.u.pull);
    break;
  case PS_MSG_PUSH:
    ps_durable_frame(cl->srv->durable, m.u.push.data, conn);
    ps_server_push(cl, h->request_id, &m.u.push);
    ps_durable_frame(cl->srv->durable, NULL, NULL);
    break;
  case PS_MSG_CUT:
  case PS_MSG_RESUME:
  case PS_MSG_FETCH:
  case PS_MSG_LOAD:
  case PS_MSG_STOP:
    control_outcome(cl->srv, ps_control_frame(cl, h->request_id, &m));
    break;
  case PS_MSG_STATS:
    on_stats(cl, h->request_id);
    break;
  case PS_MSG_PING:
    ps_conn_send_pong(conn, h->request_id, m.u.ping.token);
    break;
  default:
    REFUSE(cl, PS_EFORMAT, 0, "unexpected %s from a client", ps_proto_type_name(m.type));
  }
}

static void on_conn_close(ps_conn *conn, int err, const char *why) {
  client *cl = ps_conn_data(conn);
  server *s = cl->srv;
  /* The frame header was refused by the connection itself (UV_EOF, -4095,
   * is in the range of the project's codes, and is no refusal). */
  int refused = err <= PS_EFORMAT && err > -5000 && err != UV_EOF;
  int lost = err != 0 && err != UV_EOF, left = cl->state == C_READY && err == UV_EOF;
  if (cl->refused || s->phase == PS_PHASE_STOPPING || !(refused || lost || left) || !ps_listener_may_log(conn))
    ;
  else if (refused)
    ps_log(PS_LOG_WARN, "%s: %s; closing", cl->name, why);
  else if (left)
    ps_log(PS_LOG_INFO, "%s: disconnected", cl->name);
  else
    ps_log(PS_LOG_INFO, "%s: connection lost: %s", cl->name, why);
  s->bytes_in_closed += ps_conn_bytes_in(conn);
  s->bytes_out_closed += ps_conn_bytes_out(conn);
  if (cl->prev != NULL)
    cl->prev->next = cl->next;
  else
    s->clients = cl->next;
  if (cl->next != NULL)
    cl->next->prev = cl->prev;
  s->nclients--;
  cl->closed = 1;
  cl->conn = NULL;
  ps_rowwait_closed(cl);
  cl->refs++;
  client_unref(cl);
  if (s->phase != PS_PHASE_STOPPING)
    ps_consistency_closed(s);
}

/* A push's log entry kept by ps_durable_journal goes out now. */
static void on_conn_release(ps_conn *conn) {
  client *cl = ps_conn_data(conn);
  ps_durable_flush(cl->srv->durable);
}

static const ps_conn_cbs conn_cbs = {.on_frame = on_frame, .on_release = on_conn_release,
                                     .on_close = on_conn_close};

/* The listener's (net/listener.h): a client for the next connection.  If
 * the accept fails it is closed: on_conn_close unlinks and frees it. */
static ps_conn *new_client(ps_listener *l) {
  server *s = l->data;
  client *cl = calloc(1, sizeof *cl);
  ps_conn *conn = cl ? ps_conn_new(&s->loop, &conn_cbs, cl) : NULL;
  if (conn == NULL) {
    free(cl);
    return NULL;
  }
  cl->srv = s;
  cl->conn = conn;
  snprintf(cl->name, sizeof cl->name, "peer ?");
  cl->next = s->clients;
  if (s->clients)
    s->clients->prev = cl;
  s->clients = cl;
  s->nclients++;
  return conn;
}

static void on_accepted(ps_listener *l, ps_conn *conn) {
  server *s = l->data;
  client *cl = ps_conn_data(conn);
  snprintf(cl->name, sizeof cl->name, "peer %s", ps_conn_peer(conn));
  if (ps_conn_send_challenge(conn, cl->nonce, PS_ROLE_PS, (uint32_t)s->index, s->incarnation) != 0)
    ps_conn_close(conn);
}

static const ps_listener_cbs listener_cbs = {.make = new_client, .accepted = on_accepted};

/* ---------------------------------------------------------------- loop */

/* How often the shard gives its heap's free memory back (ps_procmem_trim). */
#define TRIM_NS (1000 * 1000000ULL)

static void on_tick(uv_timer_t *t) {
  server *s = t->data;
  uint64_t now = ps_now_ns();
  ps_server_metrics_update(s);
  control_outcome(s, ps_control_tick(s, now));
  ps_consistency_tick(s, now);
  if (now - s->trimmed_ns >= TRIM_NS) {
    s->trimmed_ns = now;
    ps_procmem_trim();
  }
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

/* At the end, for benchmarks and operators: the acks' latency, and with
 * sparse tables what they hold against the process's memory (the words
 * are read by scripts/bench-sparse). */
static void log_summary(const server *s) {
  const ps_lathist *a = &s->acks;
  ps_log(PS_LOG_INFO, "push acks %" PRIu64 ": p50 %.3f ms p99 %.3f ms max %.3f ms mean %.3f ms",
         a->n, ps_lathist_quantile(a, 0.5) * 1e3, ps_lathist_quantile(a, 0.99) * 1e3,
         a->max_s * 1e3, a->n ? a->sum_s / (double)a->n * 1e3 : 0.0);
  int nt = ps_shard_ntables(s->shard);
  if (nt == 0)
    return;
  uint64_t rows = 0, pending = 0, bytes = 0;
  for (int t = 0; t < nt; t++) {
    ps_table_stats st = ps_shard_table_stats(s->shard, t);
    rows += st.rows;
    pending += st.pending;
    bytes += st.bytes;
  }
  long rss = 0, hwm = 0, heap_used = 0, heap_free = 0;
  /* What the last snapshot or cut freed goes back first, as the next tick
   * would give it. */
  ps_procmem_trim();
  ps_procmem_kb(&rss, &hwm);
  ps_procmem_heap_kb(&heap_used, &heap_free);
  ps_log(PS_LOG_INFO, "sparse tables %d: rows %" PRIu64 " pending %" PRIu64 " table_bytes %" PRIu64
         "; memory rss_kb %ld hwm_kb %ld start_rss_kb %ld heap_used_kb %ld heap_free_kb %ld", nt,
         rows, pending, bytes, rss, hwm, s->rss_start_kb, heap_used, heap_free);
}

void ps_server_stop(server *s, const char *why) {
  if (s->phase == PS_PHASE_STOPPING)
    return;
  s->phase = PS_PHASE_STOPPING;
  ps_notify_stopping();
  ps_log(PS_LOG_INFO, "%s: stopping at version %" PRIu64 ", global step %" PRIu64, why,
         ps_shard_version(s->shard), ps_shard_global_step(s->shard));
  log_summary(s);
  for (client *c = s->clients; c != NULL; c = c->next)
    ps_conn_close(c->conn);
  ps_durable_stop(s->durable);
  ps_listener_close(&s->listener);
  uv_close((uv_handle_t *)&s->tick, NULL);
  uv_close((uv_handle_t *)&s->sigterm, NULL);
  uv_close((uv_handle_t *)&s->sigint, NULL);
  uv_close((uv_handle_t *)&s->stop_timer, NULL);
  if (s->watchdog_on)
    uv_close((uv_handle_t *)&s->watchdog, NULL);
}

void ps_server_state_began(server *s, const char *source) {
  ps_history_line(s->history, "start %" PRIu64 " %" PRIu64 " %" PRIu64 " %s", s->incarnation,
                  ps_shard_version(s->shard), ps_shard_journal(s->shard), source);
}

/* Fenced out by a newer incarnation, or (why says so) a lazy restore's
 * rows that could not be loaded: nothing more is acknowledged. */
static void on_fenced(void *arg, const char *why) {
  server *s = arg;
  s->status = 1;
  ps_server_stop(s, why != NULL && strncmp(why, "rows:", 5) == 0
                        ? why
                        : "fenced out by a newer incarnation");
}

static void on_signal(uv_signal_t *h, int signum) {
  ps_server_stop(h->data, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* The shard holds a state: replicate it from now on. */
static int start_durable(server *s) {
  if (ps_durable_start(s->durable, &s->ri) != 0) {
    ps_log(PS_LOG_ERROR, "out of memory for replication");
    return -ENOMEM;
  }
  ps_consistency_watch(s);
  return 0;
}

static int listen_on(server *s, const ps_addr *a) {
  return ps_listener_start(&s->listener, &s->loop, a, (int)s->cfg->max_connections,
                           (unsigned)s->cfg->peer_timeout_ms, &listener_cbs, s);
}

/* A shard started after the chief ended the run has nothing to serve.
 * One that goes on refuses the chiefs its predecessor would have refused:
 * it starts from the newest fencing token issued (*fence). */
static int run_ended(const ps_config *cfg, uint64_t *fence) {
  ps_registry *r = ps_registry_new(cfg, "ps", 0);
  int found = 0;
  int ended = r != NULL && ps_registry_run_ended_token(r, fence, &found);
  if (r != NULL && !ended && found < 0)
    ps_log(PS_LOG_WARN, "redis: could not read the chief's fencing token; the first chief "
           "frame sets it");
  ps_registry_free(r);
  return ended;
}

static volatile int startup_stop;
static void on_startup_signal(int sig) {
  (void)sig;
  startup_stop = 1;
}

int ps_server_run(const ps_config *cfg, int index) {
  uint64_t started_ns = ps_now_ns();
  char tag[32];
  snprintf(tag, sizeof tag, "ps.%d", index);
  ps_log_init(tag, ps_log_level_parse(cfg->log_level) < 0 ? PS_LOG_INFO
                                                           : ps_log_level_parse(cfg->log_level));
  server *s = calloc(1, sizeof *s);
  if (s == NULL)
    return 1;
  s->cfg = cfg;
  s->index = index;
  s->started_ns = started_ns;
  int status = 1, loop_open = 0;
  ps_errbuf eb = {0};
  char desc[128];
  int n = ps_config_read_secret(cfg, s->secret, sizeof s->secret, &eb);
  if (n < 0) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    goto out;
  }
  s->secret_len = (size_t)n;
  if (ps_layout_for_cluster(cfg, &s->model, &s->layout, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    goto out;
  }
  ps_model_spec_format(&s->model.spec, desc, sizeof desc);
  ps_shard_opts so = ps_shard_opts_for(cfg, &s->layout, index);
  ps_shard_opts_tables(&so, cfg, &s->model);
  if ((s->shard = ps_shard_new(&so, NULL)) == NULL) {
    ps_log(PS_LOG_ERROR, "out of memory for a slice of %zu floats", so.nfloats);
    goto out;
  }
  /* A batch's distinct keys a table: one a sample, or with bags up to the
   * most a field holds (src/data/CRITEO.md); a table pooled here sends a
   * bag's head (8 bytes, as a key) beside its keys (PROTOCOL.md, "Bags"). */
  uint64_t per_sample = cfg->bag_separator >= 0 ? PS_CRITEO_MAX_BAG : 1;
  for (int t = 0; t < s->model.ntables; t++)
    if (s->model.tables[t].server_pool) {
      per_sample++;
      break;
    }
  s->max_payload = ps_proto_max_payload_sparse(
      so.nfloats,
      ps_shard_sparse_max(&so, (uint64_t)cfg->batch * (uint64_t)cfg->window * per_sample));
  /* The address first: a machine that does not hold it (its replacement
   * took it) must fail before it takes the shard's epoch in Redis, which
   * would fence the replacement out.  An address in use here is another
   * matter: its holder may be a stale incarnation of this shard (stopped,
   * hung), which the epoch taken below fences; this one then exits and is
   * restarted.  Connections wait in the backlog until the loop runs. */
  if (uv_loop_init(&s->loop) != 0)
    goto out;
  loop_open = 1;
  int rc = listen_on(s, &cfg->ps[index]);
  char addr[300];
  ps_addr_format(&cfg->ps[index], addr, sizeof addr);
  if (rc != 0 && rc != UV_EADDRINUSE) {
    ps_log(PS_LOG_ERROR, "%s: [cluster] ps entry %d: cannot listen on %s: %s (this machine does "
           "not hold the address)", cfg->path, index, addr, uv_strerror(rc));
    goto out;
  }
  int listen_rc = rc;
  ps_restore_info ri = {0};
  /* A shard that cannot listen serves no metrics either (its series
   * stay NULL): it restores, says why it cannot serve, and exits. */
  if (listen_rc == 0 && ps_server_metrics_start(s, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    goto out;
  }
  char name[32];
  snprintf(name, sizeof name, "shard %d", index);
  if ((s->state = ps_state_service_new(s->shard, name, so.nfloats)) == NULL) {
    ps_log(PS_LOG_ERROR, "out of memory");
    goto out;
  }
  uint64_t fence = 0, restore_ns = 0;
  if (cfg->replication != PS_REPLICATION_OFF && run_ended(cfg, &fence)) {
    ps_notify_done("shard %d: the run has ended", index);
    status = 0;
    goto out;
  }
  ps_state_service_set_fence(s->state, fence);
  if (cfg->replication != PS_REPLICATION_OFF) {
    /* SIGTERM while waiting for Redis ends the wait; libuv takes the
     * signals over once the loop runs. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_startup_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    restore_ns = ps_now_ns();
    if (ps_replica_restore(cfg, index, s->layout.hash, s->shard, &startup_stop, &ri, &eb) != 0) {
      if (startup_stop) {
        ps_log(PS_LOG_INFO, "stopped while waiting for Redis");
        status = 0;
      } else {
        ps_log(PS_LOG_ERROR, "%s", eb.msg);
      }
      goto out;
    }
    s->incarnation = ri.epoch;
  } else {
    /* Without Redis an incarnation is the start time in nanoseconds: it
     * still grows with every start. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->incarnation = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
  }
  if (ri.loaded) {
    ps_log(PS_LOG_INFO,
           "restored from Redis in %.3f s: snapshot at version %" PRIu64 " + %" PRIu64
           " log entries = version %" PRIu64 ", global step %" PRIu64 " (epoch %" PRIu64
           "); begun %.3f s after start: connect and claim %.3f s, %" PRIu64 " delta chunks "
           "merged %.3f s, snapshot read %.3f s, its tables' %" PRIu64 " entries read %.3f s, "
           "log replayed %.3f s (%" PRIu64 " keys fetched first, %.3f s), old keys deleted %.3f s",
           ri.seconds, ri.snap_version, ri.replayed, ps_shard_version(s->shard),
           ps_shard_global_step(s->shard), ri.epoch, (double)(restore_ns - started_ns) * 1e-9,
           ri.claim_s, ri.merged, ri.merge_s, ri.read_s, ri.rows, ri.decode_s, ri.replay_s,
           ri.fetched, ri.fetch_s, ri.gc_s);
    if (ri.lazy)
      ps_log(PS_LOG_INFO, "restore: the tables' rows come in from Redis while the shard serves "
             "(a request waits for the rows it names that are not in yet)");
    if (ri.skipped > 0)
      ps_log(PS_LOG_WARN, "restore: the log held %" PRIu64 " entries after a missing one: "
             "updates that were never acknowledged%s; not replayed", ri.skipped,
             ri.nondurable > 0 ? " (or acknowledged without Redis: on_redis_failure = degrade)"
                               : "");
    if (ri.nondurable > 0)
      ps_log(PS_LOG_WARN, "restore: %" PRIu64 " updates of this run were acknowledged without "
             "being durable (on_redis_failure = degrade)", ri.nondurable);
    s->phase = PS_PHASE_SERVING;
  } else if (cfg->ps_self_init) {
    /* Without a chief a shard initializes its own slice from the model's
     * seeded initializers, the same values the whole model gets in
     * `paramserv train` with the same seed. */
    float *seeded = malloc(so.nfloats * sizeof *seeded + 1);
    if (seeded == NULL) {
      ps_log(PS_LOG_ERROR, "out of memory for the seeded slice of %zu floats", so.nfloats);
      goto out;
    }
    ps_layout_init_slice(&s->layout, &s->model.vars, index, (uint64_t)cfg->seed, seeded);
    ps_shard_set_values(s->shard, seeded);
    free(seeded);
    if (cfg->replication != PS_REPLICATION_OFF)
      ps_log(PS_LOG_INFO, "no replica in Redis: initialized from seed %" PRId64 " (epoch %" PRIu64
             ")", cfg->seed, ri.epoch);
    s->phase = PS_PHASE_SERVING;
  }
  s->history = ps_history_open(cfg, "ps", index);
  if (s->phase == PS_PHASE_SERVING)
    ps_server_state_began(s, ri.loaded ? "redis" : "seed");
  if (ri.gc_snapshots > 0 || ri.gc_streams > 0)
    ps_log(PS_LOG_INFO, "restore: deleted %" PRIu64 " snapshots that never switched and %" PRIu64
           " logs of dead incarnations", ri.gc_snapshots, ri.gc_streams);
  s->ri = ri;
  ps_metric_set(s->series[S_INCARNATION], (double)s->incarnation);
  ps_metric_set(s->series[S_NONDURABLE], (double)ri.nondurable);
  if (ri.loaded) {
    ps_metric_set(s->series[S_RESTORES], 1);
    ps_metric_set(s->series[S_RESTORE_SECONDS], ri.seconds);
  }
  if (listen_rc != 0) {
    char fenced[160] = "";
    if (cfg->replication != PS_REPLICATION_OFF)
      snprintf(fenced, sizeof fenced, "; this start took epoch %" PRIu64 ", so a stale shard "
               "holding the port is fenced out of Redis", ri.epoch);
    ps_log(PS_LOG_ERROR, "%s: [cluster] ps entry %d: cannot listen on %s: %s%s", cfg->path, index,
           addr, listen_rc == UV_EADDRINUSE ? "port in use: another process listens there (a "
                                              "shard still running, or another program)"
                                            : uv_strerror(listen_rc),
           fenced);
    goto out;
  }

  uv_timer_init(&s->loop, &s->tick);
  s->tick.data = s;
  uv_timer_start(&s->tick, on_tick, TICK_MS, TICK_MS);
  uv_signal_init(&s->loop, &s->sigterm);
  uv_signal_init(&s->loop, &s->sigint);
  s->sigterm.data = s->sigint.data = s;
  uv_signal_start(&s->sigterm, on_signal, SIGTERM);
  uv_signal_start(&s->sigint, on_signal, SIGINT);
  uv_timer_init(&s->loop, &s->stop_timer);
  s->stop_timer.data = s;
  /* A shard without a state replicates nothing until the chief loads one:
   * a snapshot of zeros must never become the replica a restart trusts. */
  s->durable = ps_durable_new(&s->loop, cfg, index, s->layout.hash, s->shard, on_fenced, s);
  if (s->durable == NULL) {
    ps_log(PS_LOG_ERROR, "out of memory");
    goto out;
  }
  if (s->phase == PS_PHASE_SERVING && start_durable(s) != 0) {
    ps_server_stop(s, "start-up failed");
    s->status = 1;
  }
  s->watchdog_on = ps_notify_watchdog_start(&s->loop, &s->watchdog);
  if (s->phase == PS_PHASE_SERVING)
    ps_control_prepare(s);
  if (s->phase == PS_PHASE_SERVING)
    ps_notify_ready("shard %d serving at version %" PRIu64, index, ps_shard_version(s->shard));
  else
    ps_notify_status("shard %d waiting for the chief to initialize it", index);
  ps_procmem_kb(&s->rss_start_kb, NULL);
  static const char *const modes[] = {"async", "sync", "ssp"};
  static const char *const durability[] = {"off", "snapshot", "log"};
  ps_log(PS_LOG_INFO,
         "listening on %s: shard %d of %d, %zu floats (%s), %s, replication %s, version %" PRIu64
         ", layout %016" PRIx64 ", ready %.3f s after start%s",
         addr, index, cfg->nps, so.nfloats, desc, modes[cfg->consistency],
         durability[cfg->replication], ps_shard_version(s->shard), s->layout.hash,
         (double)(ps_now_ns() - started_ns) * 1e-9,
         s->phase == PS_PHASE_SERVING ? "" : "; waiting for the chief to initialize this shard");
  uv_run(&s->loop, UV_RUN_DEFAULT);
  status = s->status;
out:
  if (loop_open) {  /* the listener, when the start-up ended early */
    ps_listener_close(&s->listener);
    uv_walk(&s->loop, close_walk, NULL);
    uv_run(&s->loop, UV_RUN_DEFAULT);
  }
  if (loop_open && uv_loop_close(&s->loop) != 0)
    ps_log(PS_LOG_WARN, "event loop closed with handles still open");
  ps_durable_free(s->durable);
  free(s->unbag);
  free(s->miss);
  ps_metrics_free(s->metrics);
  ps_server_pull_bufs_free(s);
  ps_control_free(s);
  ps_state_service_free(s->state);
  ps_history_close(s->history);
  ps_shard_free(s->shard);
  ps_layout_close(&s->layout);
  ps_model_close(&s->model);
  free(s);
  return status;
}
