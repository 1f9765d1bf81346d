/* The paramserv client (include/paramserv/client.h): one libuv loop, one
 * connection per shard, every request to every shard in flight at once.
 *
 * Each shard link goes DOWN -> CONNECTING -> HANDSHAKE -> READY.  A call
 * sets the operation each link must complete (a pull, or a push with its
 * sequence number) and runs the loop until all are done.  A link that
 * fails goes back to DOWN, waits out a backoff (common/backoff.h: doubling,
 * each wait drawn from its upper half), connects again and re-sends its
 * operation: the same push with the same sequence, which the shard applies
 * at most once. */
#include "paramserv/client.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/notify.h"
#include "common/timeutil.h"
#include "worker/client_internal.h"

static void set_error(ps_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(ps_client *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->error, sizeof c->error, fmt, ap);
  va_end(ap);
  c->fatal = 1;
  c->fatal_code = code;
}

static void link_connect(link *l);

static void on_retry(uv_timer_t *t) { link_connect(t->data); }

/* The link failed: wait, then connect again (unless the call is over). */
static void link_down(link *l, const char *why) {
  ps_client *c = l->cl;
  l->state = L_DOWN;
  l->conn = NULL;
  if (l->down_since_ns == 0)
    l->down_since_ns = ps_now_ns();
  snprintf(l->last_error, sizeof l->last_error, "%s", why);
  if (c->fatal)
    return;
  unsigned delay = ps_backoff_next(&l->backoff);
  char addr[300];
  ps_addr_format(&c->cfg.ps[l->index], addr, sizeof addr);
  double waited = (double)(ps_now_ns() - l->down_since_ns) * 1e-9;
  ps_log(PS_LOG_WARN, "waiting for shard %d (%s): %s; retry %u in %u ms (down %.1f s)",
         l->index, addr, why, l->backoff.attempts, delay, waited);
  if (c->give_up_ms > 0 && waited * 1e3 > (double)c->give_up_ms) {
    set_error(c, -ETIMEDOUT, "shard %d (%s) unreachable for %.0f s (give up after %.1f s): %s",
              l->index, addr, waited, (double)c->give_up_ms * 1e-3, why);
    return;
  }
  uv_timer_start(&l->retry, on_retry, delay, 0);
}

/* The k-th unacknowledged push of l, oldest first. */
static push_rec *push_at(link *l, int k) { return &l->push[(l->push_first + k) % PUSH_WINDOW]; }

/* Push r's prefix (its request id is the next one).  @return its length. */
static size_t push_prefix(link *l, push_rec *r, uint8_t prefix[PS_PROTO_PREFIX_MAX]) {
  ps_client *c = l->cl;
  r->req = ++c->next_req;
  ps_msg m;
  memset(&m, 0, sizeof m);
  m.type = PS_MSG_PUSH;
  m.u.push.worker = (uint32_t)c->index;
  m.u.push.incarnation = c->incarnation;
  m.u.push.seq = r->seq;
  /* Sync compares the step with the shard's own version; the others use
   * the global step for the learning-rate schedule. */
  m.u.push.step = l->consistency == PS_CONSISTENCY_SYNC ? l->pulled_version : r->step;
  m.u.push.count = c->layout.shard_floats[l->index];
  m.u.push.sparse.bytes = r->part.len;
  return ps_proto_encode_prefix(&m, r->req, prefix);
}

static size_t slice_bytes(const link *l) {
  return l->cl->layout.shard_floats[l->index] * sizeof(float);
}

/* The link's frame tail: push r's sparse blocks (the push's last bytes;
 * none when r is NULL), then, when `pull`, the whole PULL frame of the
 * current operation.  Copied by the write (ps_conn_send_with).  @return
 * its length, or 0 with the connection closed when out of memory (the
 * next call connects again and sends it all). */
static size_t build_tail(link *l, const push_rec *r, int pull) {
  ps_msg m;
  size_t push_len = r != NULL ? r->part.len : 0;
  size_t need = push_len + (pull ? PS_PROTO_HEADER_SIZE + PS_PROTO_PREFIX_MAX + l->pull_part.len : 0);
  if (need > l->tail_cap) {
    uint8_t *p = realloc(l->tail, need);
    if (p == NULL) {
      ps_conn_close(l->conn);
      return 0;
    }
    l->tail = p;
    l->tail_cap = need;
  }
  if (push_len > 0)
    memcpy(l->tail, r->part.bytes, push_len);
  if (!pull)
    return push_len;
  l->req_id = ++l->cl->next_req;
  memset(&m, 0, sizeof m);
  m.type = PS_MSG_PULL;
  m.u.pull.worker = (uint32_t)l->cl->index;
  m.u.pull.step = l->pull_step;
  m.u.pull.sparse = (ps_sparse){.bytes = l->pull_part.len, .data = l->pull_part.bytes};
  size_t n = ps_proto_encode(&m, l->req_id, l->tail + push_len, need - push_len);
  if (n == 0) {
    ps_conn_close(l->conn);
    return 0;
  }
  return push_len + n;
}

/* Write push r, and with it the current PULL when `pull`.  Its slice
 * stays untouched until its ack, which comes after the write.  @return 0,
 * or -1 with the connection closed (out of memory). */
static int send_push(link *l, push_rec *r, int pull) {
  uint8_t prefix[PS_PROTO_PREFIX_MAX];
  size_t plen = push_prefix(l, r, prefix);
  size_t tail = build_tail(l, r, pull);
  if (tail == 0 && (pull || r->part.len > 0))
    return -1;
  ps_conn_send_with(l->conn, prefix, plen, r->slice, slice_bytes(l), l->tail, tail, NULL, NULL);
  r->unsent = 0;
  return 0;
}

static void send_op(link *l) {
  ps_client *c = l->cl;
  if (l->op == OP_NONE || l->done || l->state != L_READY)
    return;
  if (l->op == OP_PULL) {
    size_t n = build_tail(l, 0, 1);
    if (n > 0)
      ps_conn_send_with(l->conn, NULL, 0, NULL, 0, l->tail, n, NULL, NULL);
    return;
  }
  l->req_id = ++c->next_req;
  ps_proto_set_fence(&l->req, c->fence);
  if (l->req.type == PS_MSG_LOAD) {
    uint8_t prefix[PS_PROTO_PREFIX_MAX];
    size_t plen = ps_proto_encode_prefix(&l->req, l->req_id, prefix);
    ps_conn_send(l->conn, prefix, plen, l->req.u.load.data, l->req.u.load.count * sizeof(float),
                 NULL, NULL);
  } else {
    ps_conn_send_msg(l->conn, &l->req, l->req_id);
  }
}

/* The pushes not yet written on this connection, oldest first, then the
 * operation (when `op`): the shard applies them before the op reads.  The
 * last push and a pull go in one write: the shard reads the pull with the
 * push's end, and answers it before it logs the push. */
static void send_pushes(link *l, int op) {
  if (l->state != L_READY)
    return;
  int pull = op && l->op == OP_PULL && !l->done;
  for (int k = 0; k < l->npush; k++) {
    push_rec *r = push_at(l, k);
    int with_pull = pull && k == l->npush - 1;
    if (!r->unsent)
      continue;
    if (send_push(l, r, with_pull) != 0 || with_pull)
      return;
  }
  if (op)
    send_op(l);
}

static void send_push_op(link *l) { send_pushes(l, 1); }

/* A push sent and not yet acknowledged by every shard. */
static int push_in_flight(const ps_client *c) {
  for (int i = 0; i < c->nlinks; i++)
    if (c->links[i].npush > 0)
      return 1;
  return 0;
}

/* The oldest push's ack from shard l.  Once every shard acked a push, it
 * is complete. */
static void on_push_ack(link *l, const ps_msg_push_ack *a) {
  ps_client *c = l->cl;
  push_rec *r = push_at(l, 0);
  /* A pull answered after the push was sent carries newer numbers. */
  if (!r->pulled_since) {
    l->version = a->version;
    l->global_step = a->global_step;
  }
  l->ack_status = a->status;
  if (l->ack_status == PS_PUSH_DUPLICATE)
    c->duplicates++;
  if (l->ack_status == PS_PUSH_STALE)
    c->stale++;
  static const char *const statuses[] = {"applied", "duplicate", "stale"};
  ps_history_line(c->history, "ack %d %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %s",
                  l->index, l->shard_incarnation, c->incarnation, r->seq, a->version,
                  l->ack_status < 3 ? statuses[l->ack_status] : "?");
  l->push_first = (l->push_first + 1) % PUSH_WINDOW;
  l->npush--;
  l->acked++;
  uint64_t done = l->acked;
  for (int i = 0; i < c->nlinks; i++)
    if (c->links[i].acked < done)
      done = c->links[i].acked;
  c->pushes = done;
}

/* The reply each control request gets. */
static int reply_type(int type) {
  switch (type) {
  case PS_MSG_STATS: return PS_MSG_STATS_REPLY;
  case PS_MSG_CUT: return PS_MSG_CUT_REPLY;
  case PS_MSG_FETCH: return PS_MSG_FETCH_REPLY;
  default: return PS_MSG_PONG;  /* PING, RESUME, LOAD, STOP */
  }
}

static void on_frame(ps_conn *conn, const ps_frame_header *h, const uint8_t *payload) {
  link *l = ps_conn_data(conn);
  ps_client *c = l->cl;
  ps_msg m;
  ps_errbuf eb = {0};
  if (ps_proto_decode(h, payload, h->length, &m, &eb) != 0) {
    ps_log(PS_LOG_WARN, "shard %d: %s; reconnecting", l->index, eb.msg);
    ps_conn_close(conn);
    return;
  }
  if (m.type == PS_MSG_STOP) {
    set_error(c, PS_ESTOPPED, "shard %d: the chief ended the run at global step %" PRIu64,
              l->index, m.u.stop.step);
    return;
  }
  if (m.type == PS_MSG_ERROR) {
    if (m.u.error.flags & PS_ERROR_RETRY) {
      ps_log(PS_LOG_WARN, "shard %d: %s; reconnecting", l->index, m.u.error.message);
      ps_conn_close(conn);
    } else {
      set_error(c, m.u.error.code, "shard %d refused %s %d: %s", l->index, ps_role_name(c->role),
                c->index, m.u.error.message);
      ps_conn_close(conn);
    }
    return;
  }
  switch (l->state) {
  case L_HANDSHAKE:
    if (m.type == PS_MSG_CHALLENGE) {
      ps_msg hello = {.type = PS_MSG_HELLO};
      hello.u.hello.role = (uint8_t)c->role;
      hello.u.hello.index = (uint32_t)c->index;
      hello.u.hello.incarnation = c->incarnation;
      hello.u.hello.layout_hash = c->layout.hash;
      snprintf(hello.u.hello.cluster_id, sizeof hello.u.hello.cluster_id, "%s",
               c->cfg.cluster_id);
      ps_proto_auth_proof(c->secret, c->secret_len, m.u.challenge.nonce, &hello.u.hello,
                          hello.u.hello.proof);
      ps_conn_send_msg(conn, &hello, 0);
      return;
    }
    if (m.type == PS_MSG_WELCOME) {
      if (m.u.welcome.slice_floats != c->layout.shard_floats[l->index]) {
        set_error(c, PS_ELAYOUT, "shard %d holds %" PRIu64 " floats, this worker's layout says %zu",
                  l->index, m.u.welcome.slice_floats, c->layout.shard_floats[l->index]);
        ps_conn_close(conn);
        return;
      }
      /* Replies with rows are bounded by the cap the shard announces (its
       * pushes' cap, which holds as many rows with their keys). */
      uint64_t cap = ps_proto_max_payload(c->layout.shard_floats[l->index]);
      ps_conn_handshake_done(conn, m.u.welcome.max_payload > cap ? m.u.welcome.max_payload : cap);
      l->state = L_READY;
      l->version = m.u.welcome.version;
      l->global_step = m.u.welcome.global_step;
      /* An unacknowledged push goes again first: its ack then says where
       * the shard is after it, newer than this WELCOME (a shard restored
       * before it) and than a pull the previous connection answered.  The
       * next push's step comes from those numbers, as without the
       * reconnect: the same gradient, the same stamps on its rows. */
      for (int k = 0; k < l->npush; k++) {
        push_at(l, k)->pulled_since = 0;
        push_at(l, k)->unsent = 1;
      }
      l->consistency = m.u.welcome.consistency;
      l->shard_incarnation = m.u.welcome.incarnation;
      if (l->down_since_ns != 0 && l->backoff.attempts > 0)
        ps_log(PS_LOG_INFO, "shard %d: connected again after %.1f s", l->index,
               (double)(ps_now_ns() - l->down_since_ns) * 1e-9);
      l->down_since_ns = 0;
      ps_backoff_reset(&l->backoff);
      c->connects++;
      send_push_op(l);
      return;
    }
    break;
  case L_READY:
    if (m.type == PS_MSG_PUSH_ACK && l->npush > 0 && h->request_id == push_at(l, 0)->req &&
        m.u.push_ack.seq == push_at(l, 0)->seq) {
      on_push_ack(l, &m.u.push_ack);
      return;
    }
    /* A later push's ack before the oldest's: a shard keeps them in order
     * (PROTOCOL.md); one that does not is not waited for forever. */
    for (int k = 1; m.type == PS_MSG_PUSH_ACK && k < l->npush; k++)
      if (h->request_id == push_at(l, k)->req && m.u.push_ack.seq == push_at(l, k)->seq) {
        ps_log(PS_LOG_WARN, "shard %d: the ack of push %" PRIu64 " came before push %" PRIu64
               "'s; reconnecting", l->index, m.u.push_ack.seq, push_at(l, 0)->seq);
        ps_conn_close(conn);
        return;
      }
    if (h->request_id < l->req_id)
      return;  /* the reply to a call that timed out */
    if (h->request_id != l->req_id)
      break;
    if (l->op == OP_REQ && !l->done && (int)m.type == reply_type(l->req.type)) {
      if (c->reply_fn != NULL)
        c->reply_fn(c->reply_arg, l->index, &m);
      l->done = 1;
      return;
    }
    if (m.type == PS_MSG_PULL_REPLY && l->op == OP_PULL && !l->done) {
      if (m.u.pull_reply.count != c->layout.shard_floats[l->index])
        break;
      /* The payload is 16-byte aligned (net/conn.c), its floats at +32. */
      char why[256];
      if (ps_sparse_scatter(&l->pull_part, &m.u.pull_reply.sparse, &c->want, why,
                            sizeof why) != 0) {
        set_error(c, PS_EFORMAT, "shard %d's PULL_REPLY: %s", l->index, why);
        ps_conn_close(conn);
        return;
      }
      ps_layout_scatter(&c->layout, &c->model.vars, l->index, (const float *)m.u.pull_reply.data,
                        c->params);
      l->version = l->pulled_version = m.u.pull_reply.version;
      l->global_step = m.u.pull_reply.global_step;
      for (int k = 0; k < l->npush; k++)
        push_at(l, k)->pulled_since = 1;
      l->done = 1;
      return;
    }
    break;
  default:
    break;
  }
  ps_log(PS_LOG_WARN, "shard %d: unexpected %s; reconnecting", l->index,
         ps_proto_type_name(m.type));
  ps_conn_close(conn);
}

static void on_close(ps_conn *conn, int err, const char *why) {
  link *l = ps_conn_data(conn);
  (void)err;
  l->cl->bytes_in_closed += ps_conn_bytes_in(conn);
  l->cl->bytes_out_closed += ps_conn_bytes_out(conn);
  if (l->conn == conn)
    link_down(l, why);
}

static const ps_conn_cbs link_cbs = {.on_frame = on_frame, .on_close = on_close};

static void on_connected(uv_connect_t *req, int status) {
  link *l = req->data;
  if (status != 0) {
    /* The handle is closed by on_close through ps_conn_close. */
    ps_conn *conn = l->conn;
    snprintf(l->last_error, sizeof l->last_error, "connect: %s", uv_strerror(status));
    ps_conn_close(conn);
    return;
  }
  l->state = L_HANDSHAKE;
  int rc = ps_conn_set_peer_timeout(l->conn, (unsigned)l->cl->cfg.peer_timeout_ms);
  if (rc != 0)
    ps_log(PS_LOG_WARN, "shard %d: no keepalive (%s): a silent drop of this shard goes unnoticed",
           l->index, uv_strerror(rc));
  if (ps_conn_start(l->conn) != 0)
    ps_conn_close(l->conn);
}

static void link_connect(link *l) {
  ps_client *c = l->cl;
  if (c->fatal || l->state != L_DOWN)
    return;
  const ps_addr *a = &c->cfg.ps[l->index];
  struct sockaddr_storage ss;
  int rc = ps_net_resolve(&c->loop, a, &ss);
  if (rc != 0) {
    char why[300];
    snprintf(why, sizeof why, "cannot resolve %s: %s", a->host, uv_strerror(rc));
    link_down(l, why);
    return;
  }
  l->conn = ps_conn_new(&c->loop, &link_cbs, l);
  if (l->conn == NULL) {
    link_down(l, "out of memory");
    return;
  }
  l->state = L_CONNECTING;
  l->connect_req.data = l;
  rc = uv_tcp_connect(&l->connect_req, ps_conn_tcp(l->conn), (struct sockaddr *)&ss,
                          on_connected);
  if (rc != 0) {
    snprintf(l->last_error, sizeof l->last_error, "connect: %s", uv_strerror(rc));
    ps_conn_close(l->conn);
  }
}

static void on_wake(uv_timer_t *t) { (void)t; }

static void on_deadline(uv_timer_t *t) {
  ps_client *c = t->data;
  c->timed_out = 1;
}

/* When the call flushes: link l has too many pushes unacknowledged
 * (flush_window or more), or a push whose ack is the freshest word on the
 * shard's step, which the next push is stamped with (no pull reply came
 * after it: a push_async not followed by a pull, or every push re-sent on
 * a new connection, whose WELCOME may say a step from before them). */
static int flush_owes(const ps_client *c, link *l) {
  return c->flushing && l->npush > 0 &&
         (l->npush >= c->flush_window || !push_at(l, l->npush - 1)->pulled_since);
}

/* Link l still owes this call something: its operation's reply, or, when
 * the call flushes, acks (flush_owes). */
static int link_owes(const ps_client *c, link *l) { return !l->done || flush_owes(c, l); }

/* Start the operation set on the links: send it where connected. */
static void op_start(ps_client *c) {
  c->fatal = 0;
  c->timed_out = 0;
  /* The loop runs only inside calls: its clock is as old as the last one. */
  uv_update_time(&c->loop);
  if (c->deadline_ms > 0)
    uv_timer_start(&c->deadline, on_deadline, (uint64_t)c->deadline_ms, 0);
  if (c->stop_flag != NULL)
    uv_timer_start(&c->wake, on_wake, 200, 200);
  for (int i = 0; i < c->nlinks; i++) {
    link *l = &c->links[i];
    l->done = l->op == OP_NONE;
    if (l->state == L_DOWN && !uv_is_active((uv_handle_t *)&l->retry)) {
      /* Not waiting to retry: new, dropped, or given up on by an earlier
       * call; this call waits the give-up time anew. */
      l->down_since_ns = 0;
      link_connect(l);
    } else {
      send_push_op(l);
    }
  }
}

/* The call failed before shard l answered its pull: a shard holds one pull
 * per connection until it can answer (sync, ssp) and refuses a second, so
 * the connection goes; the next call connects again and re-sends what is
 * unacknowledged. */
static void drop_unanswered_pull(link *l) {
  if (l->op != OP_PULL || l->done || l->state != L_READY)
    return;
  ps_conn *conn = l->conn;
  l->state = L_DOWN;
  l->conn = NULL;  /* on_close leaves the link alone */
  ps_conn_close(conn);
}

/* Run the loop until no link owes anything (link_owes), a fatal error, or
 * the deadline: the operation op_start began is finished. */
static int op_finish(ps_client *c) {
  for (;;) {
    int pending = 0;
    for (int i = 0; i < c->nlinks; i++)
      pending += link_owes(c, &c->links[i]);
    if (pending == 0 || c->fatal || c->timed_out)
      break;
    if (c->stop_flag != NULL && *c->stop_flag) {
      set_error(c, -EINTR, "stopped while waiting for the shards");
      break;
    }
    uv_run(&c->loop, UV_RUN_ONCE);
    /* Waiting for a shard is alive too: systemd's watchdog is fed. */
    ps_notify_watchdog();
  }
  uv_timer_stop(&c->deadline);
  uv_timer_stop(&c->wake);
  int timed_out = 0;
  for (int i = 0; i < c->nlinks; i++) {
    link *l = &c->links[i];
    if (link_owes(c, l) && !c->fatal && c->timed_out && !timed_out) {
      timed_out = 1;
      snprintf(c->error, sizeof c->error, "shard %d: no reply within %d ms (%s)", l->index,
               c->deadline_ms, l->state == L_READY ? "connected"
                                       : l->last_error[0] ? l->last_error : "connecting");
    }
    drop_unanswered_pull(l);
    l->op = OP_NONE;
  }
  c->flushing = 0;
  if (c->fatal)
    return c->fatal_code ? c->fatal_code : -EIO;
  return timed_out ? -ETIMEDOUT : 0;
}

static int run_op(ps_client *c) {
  op_start(c);
  return op_finish(c);
}

/* Set every link's operation to a pull into params, and of the rows of
 * `want` (NULL: none) into its rows.  @return 0, or -ENOMEM / -EINVAL from
 * the split (nothing then asked). */
static int pull_prepare(ps_client *c, float *params, const ps_sparse_batch *want) {
  c->params = params;
  int rc = 0;
  for (int i = 0; i < c->nlinks; i++)
    ps_sparse_part_clear(&c->links[i].pull_part);
  c->want.ntables = 0;
  if (want != NULL && want->ntables > 0) {
    ps_sparse_part *parts[PS_CONFIG_MAX_NODES];
    for (int i = 0; i < c->nlinks; i++)
      parts[i] = &c->links[i].pull_part;
    c->want = *want;
    rc = ps_sparse_split(&c->ring, want, PS_SPARSE_K, parts);
  }
  /* ssp: the push in flight counts, the shards applied it before this pull. */
  uint64_t clock = c->clock_base + c->pushes + (uint64_t)push_in_flight(c);
  for (int i = 0; i < c->nlinks; i++) {
    link *l = &c->links[i];
    l->op = OP_PULL;
    switch (l->consistency) {
    case PS_CONSISTENCY_SYNC:
      /* The step after the one our last push counted in, or the shard's
       * current step when it dropped that push as stale. */
      l->pull_step = c->pushes == 0 || l->ack_status == PS_PUSH_STALE ? l->version
                                                                      : l->pulled_version + 1;
      break;
    case PS_CONSISTENCY_SSP:
      l->pull_step = clock;
      break;
    default:
      l->pull_step = 0;
    }
  }
  if (rc != 0)
    set_error(c, rc, "sparse rows to pull: %s", rc == -ENOMEM ? "out of memory"
                                                              : "keys not in ascending order");
  return rc;
}

int ps_client_pull_sparse(ps_client *c, float *params, const ps_sparse_batch *want) {
  /* Sync's pull asks for the step its push was counted in: its ack says. */
  if (c->links[0].consistency == PS_CONSISTENCY_SYNC) {
    int rc = ps_client_flush(c);
    if (rc != 0)
      return rc;
  }
  int rc = pull_prepare(c, params, want);
  return rc != 0 ? rc : run_op(c);
}

int ps_client_pull(ps_client *c, float *params) { return ps_client_pull_sparse(c, params, NULL); }

/* Wait until every link has fewer than `window` pushes unacknowledged
 * (flush_owes).  @return 0 or a negative code. */
static int flush_to(ps_client *c, int window) {
  c->flushing = 1;
  c->flush_window = window;
  int owed = 0;
  for (int i = 0; i < c->nlinks; i++)
    owed |= flush_owes(c, &c->links[i]);
  if (!owed) {
    c->flushing = 0;
    return 0;
  }
  for (int i = 0; i < c->nlinks; i++)
    c->links[i].op = OP_NONE;
  return run_op(c);
}

int ps_client_flush(ps_client *c) { return flush_to(c, 1); }

/* Pushes a link may keep unacknowledged: PUSH_WINDOW once every shard said
 * (WELCOME) that it is async, else 1 (sync counts a push into a step its
 * pull then asks for; ssp's clock counts one push in flight). */
static int push_window(const ps_client *c) {
  for (int i = 0; i < c->nlinks; i++)
    if (c->links[i].shard_incarnation == 0 || c->links[i].consistency != PS_CONSISTENCY_ASYNC)
      return 1;
  return PUSH_WINDOW;
}

/* The next push of `grad` and the rows of `sp` (NULL: none), once there
 * is room for it (push_window); sent now unless `later` (then with the
 * operation op_start begins).  @return 0 or a negative code (of the
 * earlier pushes' acks, or the split's). */
static int push_begin(ps_client *c, const float *grad, const ps_sparse_batch *sp, int later) {
  int rc = flush_to(c, push_window(c));
  if (rc != 0)
    return rc;
  ps_sparse_part *parts[PS_CONFIG_MAX_NODES];
  for (int i = 0; i < c->nlinks; i++) {
    link *l = &c->links[i];
    parts[i] = &push_at(l, l->npush)->part;
    ps_sparse_part_clear(parts[i]);
  }
  if (sp != NULL && sp->ntables > 0 && (rc = ps_sparse_split(&c->ring, sp, PS_SPARSE_KV, parts))) {
    set_error(c, rc, "sparse rows to push: %s", rc == -ENOMEM ? "out of memory"
                                                               : "keys not in ascending order");
    return rc;
  }
  for (int i = 0; i < c->nlinks; i++) {
    link *l = &c->links[i];
    push_rec *r = push_at(l, l->npush);
    ps_layout_gather(&c->layout, &c->model.vars, i, grad, r->slice);
    r->seq = ++l->seq;
    r->step = c->links[0].global_step;
    r->unsent = 1;
    r->pulled_since = 0;
    l->npush++;
    /* Written now if the link is up (libuv writes at once what the socket
     * takes); else on its next connection, in the next call. */
    if (!later)
      send_pushes(l, 0);
  }
  return 0;
}

int ps_client_push_async(ps_client *c, const float *grad) {
  return push_begin(c, grad, NULL, 0);
}

int ps_client_push_pull_start_sparse(ps_client *c, const float *grad,
                                     const ps_sparse_batch *pushed, float *params,
                                     const ps_sparse_batch *want) {
  /* Sync's pull waits for the push's acks first: nothing to send together. */
  int sync = c->links[0].consistency == PS_CONSISTENCY_SYNC;
  int rc = push_begin(c, grad, pushed, !sync);
  if (rc != 0)
    return rc;
  c->pull_pending = params;
  c->want_pending = want;
  if (!sync) {
    if ((rc = pull_prepare(c, params, want)) != 0)
      return rc;
    op_start(c);
    c->pull_started = 1;
  }
  return 0;
}

int ps_client_push_pull_start(ps_client *c, const float *grad, float *params) {
  return ps_client_push_pull_start_sparse(c, grad, NULL, params, NULL);
}

int ps_client_pull_finish(ps_client *c) {
  float *params = c->pull_pending;
  const ps_sparse_batch *want = c->want_pending;
  c->pull_pending = NULL;
  c->want_pending = NULL;
  if (!c->pull_started)
    return params != NULL ? ps_client_pull_sparse(c, params, want) : 0;
  c->pull_started = 0;
  return op_finish(c);
}

int ps_client_push(ps_client *c, const float *grad) {
  int rc = ps_client_push_async(c, grad);
  return rc != 0 ? rc : ps_client_flush(c);
}

const ps_vartable *ps_client_vars(const ps_client *c) { return &c->model.vars; }

float *ps_client_arena_new(const ps_client *c) {
  return calloc(c->model.vars.total ? c->model.vars.total : 1, sizeof(float));
}

float *ps_client_view(const ps_client *c, float *arena, const char *name, const ps_var **var) {
  int i = ps_vartable_find(&c->model.vars, name);
  if (var != NULL)
    *var = i < 0 ? NULL : &c->model.vars.vars[i];
  return i < 0 ? NULL : arena + c->model.vars.vars[i].offset;
}
uint64_t ps_client_global_step(const ps_client *c) { return c->links[0].global_step; }
uint64_t ps_client_last_step(const ps_client *c) { return (uint64_t)c->cfg.last_step; }
uint64_t ps_client_pushes(const ps_client *c) { return c->pushes; }

uint64_t ps_client_bytes(const ps_client *c, uint64_t *in) {
  uint64_t out = c->bytes_out_closed, got = c->bytes_in_closed;
  for (int i = 0; i < c->nlinks; i++)
    if (c->links[i].conn != NULL) {
      out += ps_conn_bytes_out(c->links[i].conn);
      got += ps_conn_bytes_in(c->links[i].conn);
    }
  if (in != NULL)
    *in = got;
  return out;
}
void ps_client_set_clock(ps_client *c, uint64_t clock) { c->clock_base = clock - c->pushes; }
uint64_t ps_client_clock(const ps_client *c) { return c->clock_base + c->pushes; }
void ps_client_set_incarnation(ps_client *c, uint64_t incarnation) { c->incarnation = incarnation; }

void ps_client_set_stop_flag(ps_client *c, volatile sig_atomic_t *flag) { c->stop_flag = flag; }

/* worker/control.h */
void ps_client_set_deadline(ps_client *c, int ms) { c->deadline_ms = ms; }
int ps_client_deadline(const ps_client *c) { return c->deadline_ms; }
void ps_client_set_fence(ps_client *c, uint64_t fence) { c->fence = fence; }
uint64_t ps_client_connects(const ps_client *c) { return c->connects; }
const ps_layout *ps_client_layout(const ps_client *c) { return &c->layout; }
const ps_model *ps_client_model(const ps_client *c) { return &c->model; }
const ps_config *ps_client_config(const ps_client *c) { return &c->cfg; }

int ps_client_request(ps_client *c, const ps_msg *reqs, ps_client_reply_fn fn, void *arg) {
  c->reply_fn = fn;
  c->reply_arg = arg;
  int any = 0;
  for (int i = 0; i < c->nlinks; i++) {
    link *l = &c->links[i];
    l->op = reqs[i].type != 0 ? OP_REQ : OP_NONE;
    l->req = reqs[i];
    any |= l->op != OP_NONE;
  }
  if (!any)
    return 0;
  int rc = run_op(c);
  c->reply_fn = NULL;
  return rc;
}
void ps_client_retarget(ps_client *c, int shard, const ps_addr *a) {
  link *l = &c->links[shard];
  c->cfg.ps[shard] = *a;
  if (l->conn != NULL)
    ps_conn_close(l->conn); /* it reconnects to the new address */
}

uint64_t ps_client_duplicates(const ps_client *c) { return c->duplicates; }
uint64_t ps_client_stale(const ps_client *c) { return c->stale; }
const char *ps_client_error(const ps_client *c) { return c->error; }
