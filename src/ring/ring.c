/* The ring's transport (see ring.h; README.md in this directory).
 *
 * The all-reduce of n floats over P members splits the vector into P
 * regions and each region into pieces of at most PIECE_FLOATS.  Hop 0
 * sends this member's own region; a piece received at hop t is added in
 * (scatter-reduce, t < P - 1) or copied (all-gather), and sent on at hop
 * t + 1 at once, until hop 2P - 3.  So a region's pieces stream around the
 * ring one behind the other, and each member sends and receives 2(P - 1)/P
 * of the vector whatever P is.  Every region is summed once, in ring
 * order, and then copied: all members end with the same bytes. */
#include "ring/ring_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "net/conn.h"
#include "proto/proto.h"

/* The all-reduce (or the fetch) cannot finish in this view. */
void ring_fail(ps_ring *r, int suspect, const char *fmt, ...) {
  if (!r->active && r->fetching != 1)
    return;
  if (r->active && r->broken)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, sizeof r->why, fmt, ap);
  va_end(ap);
  if (r->active) {
    r->broken = 1;
    r->suspect = suspect;
  }
  if (r->fetching == 1)
    r->fetching = -1;
}

static int pred_rank(const ps_ring *r) { return r->members[(r->pos + r->n - 1) % r->n]; }
static int succ_rank(const ps_ring *r) { return r->members[(r->pos + 1) % r->n]; }

/* ------------------------------------------------------------ links */

static void on_frame(ps_conn *conn, const ps_frame_header *h, const uint8_t *payload);
static void on_close(ps_conn *conn, int err, const char *why);
static const ps_conn_cbs link_cbs = {.on_frame = on_frame, .on_close = on_close};

static link *link_new(ps_ring *r, int kind, int rank) {
  link *l = calloc(1, sizeof *l);
  ps_conn *conn = l ? ps_conn_new(&r->loop, &link_cbs, l) : NULL;
  if (conn == NULL) {
    free(l);
    return NULL;
  }
  l->r = r;
  l->conn = conn;
  l->kind = kind;
  l->rank = rank;
  l->next = r->links;
  if (r->links)
    r->links->prev = l;
  r->links = l;
  return l;
}

static void on_connected(uv_connect_t *req, int status) {
  link *l = req->data;
  if (status != 0) {
    ring_fail(l->r, l->rank, "cannot connect to member %d: %s", l->rank, uv_strerror(status));
    ps_conn_close(l->conn);
    return;
  }
  l->state = L_HANDSHAKE;
  (void)ps_conn_set_peer_timeout(l->conn, (unsigned)l->r->cfg->peer_timeout_ms);
  if (ps_conn_start(l->conn) != 0)
    ps_conn_close(l->conn);
}

link *ring_dial(ps_ring *r, int kind, int rank) {
  struct sockaddr_storage ss;
  int rc = ps_net_resolve(&r->loop, &r->cfg->workers[rank], &ss);
  if (rc != 0) {
    ring_fail(r, rank, "cannot resolve member %d's host %s: %s", rank, r->cfg->workers[rank].host,
              uv_strerror(rc));
    return NULL;
  }
  link *l = link_new(r, kind, rank);
  if (l == NULL) {
    ring_fail(r, -1, "out of memory");
    return NULL;
  }
  l->creq.data = l;
  rc = uv_tcp_connect(&l->creq, ps_conn_tcp(l->conn), (struct sockaddr *)&ss, on_connected);
  if (rc != 0) {
    ring_fail(r, rank, "cannot connect to member %d: %s", rank, uv_strerror(rc));
    ps_conn_close(l->conn);
    return NULL;
  }
  return l;
}

static void on_close(ps_conn *conn, int err, const char *why) {
  link *l = ps_conn_data(conn);
  ps_ring *r = l->r;
  r->bytes_in_closed += ps_conn_bytes_in(conn);
  r->bytes_out_closed += ps_conn_bytes_out(conn);
  if (l == r->succ) {
    r->succ = NULL;
    if (r->active && r->recv_left > 0)
      ring_fail(r, l->rank, "member %d (successor) closed: %s", l->rank, err ? why : "closed");
  }
  if (l == r->fetch) {
    r->fetch = NULL;
    ring_fail(r, l->rank, "member %d closed the state fetch: %s", l->rank, err ? why : "closed");
  }
  if (l->kind == K_ACCEPTED && l->joined && l->epoch == r->epoch && r->n > 1 &&
      l->rank == pred_rank(r)) {
    if (r->active)
      ring_fail(r, l->rank, "member %d (predecessor) closed: %s", l->rank, err ? why : "closed");
    else
      r->pred_lost = 1; /* the next all-reduce cannot get its pieces */
  }
  if (l->prev)
    l->prev->next = l->next;
  else
    r->links = l->next;
  if (l->next)
    l->next->prev = l->prev;
  ps_state_service_forget(r->svc, l);
  free(l);
}

void ring_refuse(link *l, int code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ps_listener_may_log(l->conn))
    ps_log(PS_LOG_WARN, "ring: %s: %s", ps_conn_peer(l->conn), msg);
  ps_conn_fail(l->conn, code, 0, "%s", msg);
}

/* ------------------------------------------------------- all-reduce */

/* Floats [lo, hi) of region c. */
static void region(const ps_ring *r, int c, uint64_t *lo, uint64_t *hi) {
  *lo = (uint64_t)c * r->nfl / (uint64_t)r->n;
  *hi = (uint64_t)(c + 1) * r->nfl / (uint64_t)r->n;
}

/* The region this member receives at hop t (its predecessor sends it). */
static int hop_region(const ps_ring *r, uint32_t t) {
  int p = r->n;
  int back = t < (uint32_t)(p - 1) ? (int)t + 1 : (int)t - (p - 1);
  return ((r->pos - back) % p + p) % p;
}

static void on_sent(void *arg, int status) {
  link *l = arg;
  l->writes--;
  (void)status; /* a failed write closes the link: on_close says so */
}

static void send_piece(ps_ring *r, uint32_t phase, uint64_t off, uint64_t count) {
  if (r->succ == NULL || r->succ->state != L_READY) {
    if (r->nsendq == r->capsendq) {
      size_t cap = r->capsendq ? 2 * r->capsendq : 64;
      send_item *q = realloc(r->sendq, cap * sizeof *q);
      if (q == NULL) {
        ring_fail(r, -1, "out of memory");
        return;
      }
      r->sendq = q;
      r->capsendq = cap;
    }
    r->sendq[r->nsendq++] = (send_item){phase, off, count};
    return;
  }
  ps_msg m = {.type = PS_MSG_RING_CHUNK};
  m.u.ring_chunk = (ps_msg_ring_chunk){
      .epoch = r->epoch, .step = r->step, .phase = phase, .offset = off, .count = count};
  uint8_t prefix[PS_PROTO_PREFIX_MAX];
  size_t plen = ps_proto_encode_prefix(&m, 0, prefix);
  link *l = r->succ;
  if (ps_conn_send(l->conn, prefix, plen, r->buf + off, count * sizeof(float), on_sent, l) != 0) {
    ring_fail(r, l->rank, "member %d: cannot send", l->rank);
    return;
  }
  l->writes++;
}

/* A piece of the current step from the predecessor. */
static void apply(ps_ring *r, uint32_t phase, uint64_t off, uint64_t count, const uint8_t *data) {
  uint32_t hops = 2 * (uint32_t)(r->n - 1);
  uint64_t lo = 0, hi = 0;
  if (phase < hops)
    region(r, hop_region(r, phase), &lo, &hi);
  uint64_t want = hi - off < PIECE_FLOATS ? hi - off : PIECE_FLOATS;
  if (phase >= hops || off < lo || off >= hi || (off - lo) % PIECE_FLOATS != 0 || count != want ||
      r->recv[phase] + count > hi - lo) {
    ring_fail(r, pred_rank(r),
              "member %d sent floats %" PRIu64 "..+%" PRIu64 " at hop %" PRIu32
              ": expected a piece of floats %" PRIu64 "..%" PRIu64 " at hop < %" PRIu32,
              pred_rank(r), off, count, phase, lo, hi, hops);
    return;
  }
  float *dst = r->buf + off;
  if (phase < (uint32_t)(r->n - 1)) {
    for (uint64_t i = 0; i < count; i++) {
      float v;
      memcpy(&v, data + 4 * i, 4);
      dst[i] += v;
    }
  } else {
    memcpy(dst, data, count * sizeof(float));
  }
  r->recv[phase] += count;
  r->recv_left -= count;
  r->progress_ns = ps_now_ns();
  if (phase + 1 < hops)
    send_piece(r, phase + 1, off, count);
}

static void keep_early(ps_ring *r, link *l, const ps_msg_ring_chunk *m) {
  uint64_t cap = EARLY_MAX_MODELS * (uint64_t)ps_shard_options(r->state)->nfloats;
  if (m->count > cap - r->early_floats || m->count > cap) {
    ring_refuse(l, PS_EFORMAT, "RING_CHUNK of view %" PRIu64 " step %" PRIu64 " ahead of this "
                "member's (view %" PRIu64 " step %" PRIu64 ") past %d models' worth of pieces",
                m->epoch, m->step, r->epoch, r->step, EARLY_MAX_MODELS);
    return;
  }
  early *e = malloc(sizeof *e + m->count * sizeof(float));
  if (e == NULL) {
    ring_fail(r, -1, "out of memory");
    return;
  }
  *e = (early){.epoch = m->epoch,
               .step = m->step,
               .off = m->offset,
               .count = m->count,
               .phase = m->phase,
               .from = l->rank};
  memcpy(e->data, m->data, m->count * sizeof(float));
  r->early_floats += m->count;
  early **p = &r->early;
  while (*p)
    p = &(*p)->next;
  *p = e;
}

static void on_chunk(link *l, const ps_msg_ring_chunk *m) {
  ps_ring *r = l->r;
  if (l->role != PS_ROLE_WORKER || !l->joined || m->epoch != l->epoch) {
    ring_refuse(l, PS_EFORMAT, "RING_CHUNK of view %" PRIu64 " on a link %s", m->epoch,
                l->joined ? "joined for another view" : "that sent no RING_JOIN");
    return;
  }
  if (m->epoch < r->epoch)
    return; /* an older view's: set_view closes such links */
  if (m->epoch == r->epoch && r->active && m->step == r->step) {
    if (l->rank != pred_rank(r)) {
      ring_refuse(l, PS_EFORMAT,
                  "RING_CHUNK from member %d, whose successor is not %d in view %" PRIu64, l->rank,
                  r->rank, r->epoch);
      return;
    }
    apply(r, m->phase, m->offset, m->count, m->data);
    return;
  }
  if (m->epoch == r->epoch && m->step < r->step)
    return;
  keep_early(r, l, m);
}

/* -------------------------------------------------------- handshake */

static void on_hello(link *l, const ps_msg_hello *h) {
  ps_ring *r = l->r;
  if (strcmp(h->cluster_id, r->cfg->cluster_id) != 0) {
    ring_refuse(l, PS_ECONFIG, "cluster id '%s', this member belongs to cluster '%s'",
                h->cluster_id, r->cfg->cluster_id);
    return;
  }
  if (!ps_proto_auth_check(r->secret, r->secret_len, l->nonce, h)) {
    ring_refuse(l, -EACCES,
                "authentication failed: the HELLO's proof does not match the cluster secret");
    return;
  }
  if (h->layout_hash != r->layout_hash) {
    ring_refuse(l, PS_ELAYOUT,
                "layout hash %016" PRIx64 ", this member's is %016" PRIx64 " (another model)",
                h->layout_hash, r->layout_hash);
    return;
  }
  if (h->role == PS_ROLE_WORKER && h->index >= (uint32_t)r->cfg->nworkers) {
    ring_refuse(l, PS_ECONFIG, "worker index %u, the cluster has workers 0..%d", h->index,
                r->cfg->nworkers - 1);
    return;
  }
  if (h->role == PS_ROLE_PS) {
    ring_refuse(l, PS_EFORMAT, "role ps may not connect to a ring member");
    return;
  }
  l->role = h->role;
  l->rank = h->role == PS_ROLE_WORKER ? (int)h->index : -1;
  l->state = L_READY;
  ps_msg m = {.type = PS_MSG_WELCOME};
  m.u.welcome.index = (uint32_t)r->rank;
  m.u.welcome.consistency = PS_CONSISTENCY_SYNC;
  m.u.welcome.incarnation = r->incarnation;
  m.u.welcome.layout_hash = r->layout_hash;
  m.u.welcome.slice_floats = ps_shard_options(r->state)->nfloats;
  m.u.welcome.version = ps_shard_version(r->state);
  m.u.welcome.global_step = ps_shard_global_step(r->state);
  m.u.welcome.max_payload = (uint32_t)ps_proto_max_payload(FETCH_FLOATS);
  ps_conn_send_msg(l->conn, &m, 0);
}

static void send_hello(link *l, const uint8_t nonce[PS_PROTO_NONCE_SIZE]) {
  ps_ring *r = l->r;
  ps_msg m = {.type = PS_MSG_HELLO};
  m.u.hello.role = PS_ROLE_WORKER;
  m.u.hello.index = (uint32_t)r->rank;
  m.u.hello.incarnation = r->incarnation;
  m.u.hello.layout_hash = r->layout_hash;
  snprintf(m.u.hello.cluster_id, sizeof m.u.hello.cluster_id, "%s", r->cfg->cluster_id);
  ps_proto_auth_proof(r->secret, r->secret_len, nonce, &m.u.hello, m.u.hello.proof);
  ps_conn_send_msg(l->conn, &m, 0);
  if (l->kind == K_SUCC) {
    ps_msg j = {.type = PS_MSG_RING_JOIN};
    j.u.ring_join =
        (ps_msg_ring_join){.epoch = r->epoch, .step = r->step, .rank = (uint32_t)r->rank};
    ps_conn_send_msg(l->conn, &j, 0);
  }
  l->epoch = r->epoch;
  l->state = L_WELCOME;
}

/* A dialed link's frames: the handshake, then the fetch's replies. */
static void on_dialed_frame(link *l, const ps_msg *m) {
  ps_ring *r = l->r;
  if (l->state == L_HANDSHAKE && m->type == PS_MSG_CHALLENGE) {
    send_hello(l, m->u.challenge.nonce);
    return;
  }
  if (l->state == L_WELCOME && m->type == PS_MSG_WELCOME) {
    if (m->u.welcome.index != (uint32_t)l->rank) {
      ring_fail(r, l->rank, "member %d's address answered as member %u", l->rank,
                m->u.welcome.index);
      ps_conn_close(l->conn);
      return;
    }
    l->state = L_READY;
    ps_conn_handshake_done(l->conn, ps_proto_max_payload(FETCH_FLOATS));
    if (l->kind == K_SUCC) {
      for (size_t i = 0; i < r->nsendq && l == r->succ; i++)
        send_piece(r, r->sendq[i].phase, r->sendq[i].off, r->sendq[i].count);
      r->nsendq = 0;
    } else if (l->fetch_ready != NULL) {
      l->fetch_ready(l);
    }
    return;
  }
  if (l->kind == K_FETCH && l->state == L_READY && r->fetching == 1 && l->fetch_reply != NULL &&
      l->fetch_reply(l, m))
    return;
  ring_fail(r, l->rank, "member %d sent %s, unexpected here", l->rank, ps_proto_type_name(m->type));
  ps_conn_close(l->conn);
}

static void free_copy(void *arg, int status) {
  (void)status;
  free(arg);
}

/* The chief's evaluation reads the weights with a PULL: a copy of the
 * replica's values, written whenever the socket takes it. */
static void serve_pull(link *l, uint64_t req) {
  ps_ring *r = l->r;
  size_t n = ps_shard_options(r->state)->nfloats;
  float *copy = malloc((n ? n : 1) * sizeof *copy);
  if (copy == NULL) {
    ring_refuse(l, -ENOMEM, "out of memory for a copy of %zu floats", n);
    return;
  }
  memcpy(copy, ps_shard_values(r->state), n * sizeof *copy);
  ps_msg rep = {.type = PS_MSG_PULL_REPLY};
  rep.u.pull_reply = (ps_msg_pull_reply){.version = ps_shard_version(r->state),
                                         .global_step = ps_shard_global_step(r->state),
                                         .count = n};
  uint8_t prefix[PS_PROTO_PREFIX_MAX];
  size_t plen = ps_proto_encode_prefix(&rep, req, prefix);
  if (ps_conn_send(l->conn, prefix, plen, copy, n * sizeof *copy, free_copy, copy) != 0)
    free(copy);
}

/* A chief's frame carries its fencing token: the state service's one
 * check.  @return 1 when it may go on (a peer's frames carry none). */
static int chief_fence_ok(link *l, const ps_msg *m) {
  ps_state_answer a;
  if (l->role != PS_ROLE_CHIEF || ps_state_service_fence(l->r->svc, m, &a) == 0)
    return 1;
  ring_refuse(l, a.code, "%s", a.why);
  return 0;
}

/* CUT, FETCH, RESUME and LOAD, answered by the state service from the
 * replica, one cut per link.  Nothing is held: a member does not pause
 * training for a cut (its copy serves the FETCHes that follow). */
static void serve_state(link *l, uint64_t req, const ps_msg *m) {
  ps_ring *r = l->r;
  if (m->type == PS_MSG_LOAD && l->role != PS_ROLE_CHIEF) {
    ring_refuse(l, PS_EFORMAT, "LOAD from %s %d: only the chief loads a state",
                ps_role_name(l->role), l->rank);
    return;
  }
  if (!chief_fence_ok(l, m))
    return;
  ps_state_answer a = ps_state_service_frame(r->svc, l, l->conn, req, m, r->holds);
  if (a.outcome == PS_STATE_REFUSED) {
    ring_refuse(l, a.code, "%s", a.why);
  } else if (a.outcome == PS_STATE_LOADED) {
    /* The chief starts a ring none of whose members holds a state (a new
     * cluster, or every member restarted) from its checkpoint or the
     * seeded initialization, as it starts a shard. */
    r->holds = r->loaded = 1;
    r->waiting = 0;
    ps_log(PS_LOG_INFO, "ring: loaded by the chief: step %" PRIu64, ps_shard_version(r->state));
  }
}

static void on_frame(ps_conn *conn, const ps_frame_header *h, const uint8_t *payload) {
  link *l = ps_conn_data(conn);
  ps_ring *r = l->r;
  ps_msg m;
  ps_errbuf eb = {0};
  if (ps_proto_decode(h, payload, h->length, &m, &eb) != 0) {
    if (l->kind == K_ACCEPTED) {
      ring_refuse(l, PS_EFORMAT, "%s", eb.msg);
    } else {
      ring_fail(r, l->rank, "member %d: %s", l->rank, eb.msg);
      ps_conn_close(conn);
    }
    return;
  }
  if (m.type == PS_MSG_ERROR) {
    ring_fail(r, -1, "member %d refused: %s", l->rank, m.u.error.message);
    ps_conn_close(conn);
    return;
  }
  if (l->kind != K_ACCEPTED) {
    on_dialed_frame(l, &m);
    return;
  }
  if (l->state != L_READY) {
    if (m.type != PS_MSG_HELLO) {
      ring_refuse(l, PS_EFORMAT, "%s before HELLO", ps_proto_type_name(m.type));
      return;
    }
    on_hello(l, &m.u.hello);
    /* Members send pieces; the chief LOADs pieces of at most a slice. */
    if (l->state == L_READY)
      ps_conn_handshake_done(
          conn,
          ps_proto_max_payload(l->role == PS_ROLE_WORKER ? PIECE_FLOATS
                                                         : ps_shard_options(r->state)->nfloats));
    return;
  }
  switch (m.type) {
    case PS_MSG_RING_JOIN:
      if (l->role != PS_ROLE_WORKER || m.u.ring_join.rank != (uint32_t)l->rank) {
        ring_refuse(l, PS_EFORMAT, "RING_JOIN for member %u on member %d's link",
                    m.u.ring_join.rank, l->rank);
        return;
      }
      if (m.u.ring_join.epoch < r->epoch) {
        ring_refuse(l, -ESTALE, "view %" PRIu64 " is over: member %d is in view %" PRIu64,
                    m.u.ring_join.epoch, r->rank, r->epoch);
        return;
      }
      l->joined = 1;
      l->epoch = m.u.ring_join.epoch;
      if (l->epoch > r->epoch) {
        if (l->epoch > r->newer)
          r->newer = l->epoch;
        ring_fail(r, -1, "member %d dials for view %" PRIu64 ", this member is in view %" PRIu64,
                  l->rank, l->epoch, r->epoch);
      }
      break;
    case PS_MSG_RING_CHUNK:
      on_chunk(l, &m.u.ring_chunk);
      break;
    case PS_MSG_CUT:
    case PS_MSG_FETCH:
    case PS_MSG_RESUME:
    case PS_MSG_LOAD:
      serve_state(l, h->request_id, &m);
      break;
    case PS_MSG_PULL:
      if (l->role == PS_ROLE_WORKER) {
        ring_refuse(l, PS_EFORMAT, "PULL from worker %d: ring members do not pull from each other",
                    l->rank);
        return;
      }
      serve_pull(l, h->request_id);
      break;
    case PS_MSG_PING:
      ps_conn_send_pong(conn, h->request_id, m.u.ping.token);
      break;
    case PS_MSG_STATS: {
      ps_msg p = {.type = PS_MSG_STATS_REPLY};
      p.u.stats_reply.version = ps_shard_version(r->state);
      p.u.stats_reply.global_step = ps_shard_global_step(r->state);
      p.u.stats_reply.incarnation = r->incarnation;
      p.u.stats_reply.flags = r->waiting ? 0 : PS_STATS_INITIALIZED;
      ps_conn_send_msg(conn, &p, h->request_id);
      break;
    }
    case PS_MSG_STOP:
      if (l->role != PS_ROLE_CHIEF) {
        ring_refuse(l, PS_EFORMAT, "STOP from %s %d: only the chief ends a run",
                    ps_role_name(l->role), l->rank);
        return;
      }
      if (!chief_fence_ok(l, &m))
        break;
      if (r->stop_step == 0)
        r->stop_step = m.u.stop.step ? m.u.stop.step : 1;
      /* Answered as a shard answers it, so that the chief's call ends. */
      ps_conn_send_pong(conn, h->request_id, m.u.stop.step);
      break;
    default:
      ring_refuse(l, PS_EFORMAT, "%s is not a request a ring member answers",
                  ps_proto_type_name(m.type));
      break;
  }
}

/* The listener's (net/listener.h): a link for the next connection, closed
 * (and freed by on_close) if the accept fails. */
static ps_conn *new_link(ps_listener *listener) {
  link *l = link_new(listener->data, K_ACCEPTED, -1);
  return l != NULL ? l->conn : NULL;
}

static void on_accepted(ps_listener *listener, ps_conn *conn) {
  ps_ring *r = listener->data;
  link *l = ps_conn_data(conn);
  l->state = L_HANDSHAKE;
  if (ps_conn_send_challenge(conn, l->nonce, PS_ROLE_WORKER, (uint32_t)r->rank, r->incarnation) != 0)
    ps_conn_close(conn);
}

static const ps_listener_cbs listener_cbs = {.make = new_link, .accepted = on_accepted};

/* --------------------------------------------------------------- API */

static void on_tick(uv_timer_t *t) {
  ps_ring *r = t->data;
  uint64_t now = ps_now_ns();
  if (r->idle != NULL && now - r->idle_ns > 100000000ULL) {
    r->idle_ns = now;
    r->idle(r->idle_arg);
  }
  uint64_t quiet = ps_now_ns() - r->progress_ns;
  if ((r->active || r->fetching == 1) && quiet > (uint64_t)ps_ring_timeout_ms(r->cfg) * 1000000ULL)
    ring_fail(r, -1, "no progress for %" PRId64 " ms (%s)", ps_ring_timeout_ms(r->cfg),
              r->active ? "all-reduce" : "state fetch");
}

ps_ring *ps_ring_new(const ps_config *cfg, int rank, uint64_t incarnation, uint64_t layout_hash,
                     ps_shard *state, ps_errbuf *eb) {
  ps_ring *r = calloc(1, sizeof *r);
  if (r == NULL) {
    ps_err_set(eb, -ENOMEM, "out of memory");
    return NULL;
  }
  r->cfg = cfg;
  r->rank = rank;
  r->incarnation = incarnation;
  r->layout_hash = layout_hash;
  r->state = state;
  r->suspect = -1;
  char name[32];
  snprintf(name, sizeof name, "member %d", rank);
  /* A piece is at most what a frame holds (the fetch asks FETCH_FLOATS). */
  r->svc = ps_state_service_new(state, name, (UINT32_MAX - 64) / 4);
  if (r->svc == NULL) {
    free(r);
    ps_err_set(eb, -ENOMEM, "out of memory");
    return NULL;
  }
  int n = ps_config_read_secret(cfg, r->secret, sizeof r->secret, eb);
  if (n < 0) {
    ps_state_service_free(r->svc);
    free(r);
    return NULL;
  }
  r->secret_len = (size_t)n;
  if (uv_loop_init(&r->loop) != 0) {
    ps_state_service_free(r->svc);
    free(r);
    ps_err_set(eb, -ENOMEM, "cannot start an event loop");
    return NULL;
  }
  uv_timer_init(&r->loop, &r->tick);
  r->tick.data = r;
  int rc = ps_listener_start(&r->listener, &r->loop, &cfg->workers[rank],
                             (int)cfg->max_connections, (unsigned)cfg->peer_timeout_ms,
                             &listener_cbs, r);
  if (rc != 0) {
    char a[300];
    ps_addr_format(&cfg->workers[rank], a, sizeof a);
    ps_err_set(eb, PS_ECONFIG,
               "%s: [cluster] workers entry %d: cannot listen on %s: %s (ring members listen "
               "on their address)", cfg->path, rank, a, uv_strerror(rc));
    ps_ring_free(r);
    return NULL;
  }
  uv_timer_start(&r->tick, on_tick, TICK_MS, TICK_MS);
  return r;
}

void ps_ring_free(ps_ring *r) {
  if (r == NULL)
    return;
  for (link *l = r->links; l != NULL; l = l->next)
    ps_conn_close(l->conn);
  r->succ = r->fetch = NULL;
  ps_listener_close(&r->listener);
  uv_close((uv_handle_t *)&r->tick, NULL);
  uv_run(&r->loop, UV_RUN_DEFAULT);
  uv_loop_close(&r->loop);
  while (r->early) {
    early *e = r->early;
    r->early = e->next;
    free(e);
  }
  free(r->sendq);
  free(r->fetch_img);
  ps_state_service_free(r->svc);
  free(r);
}

void ps_ring_set_stop_flag(ps_ring *r, volatile sig_atomic_t *flag) { r->stop = flag; }

void ps_ring_set_idle(ps_ring *r, void (*fn)(void *arg), void *arg) {
  r->idle = fn;
  r->idle_arg = arg;
}

void ps_ring_set_view(ps_ring *r, uint64_t epoch, const int *members, int n) {
  r->epoch = epoch;
  r->n = n;
  r->pos = 0;
  for (int i = 0; i < n; i++) {
    r->members[i] = members[i];
    if (members[i] == r->rank)
      r->pos = i;
  }
  if (r->newer <= epoch)
    r->newer = 0;
  for (link *l = r->links; l != NULL; l = l->next)
    if (l == r->succ || (l->kind == K_ACCEPTED && l->joined && l->epoch < epoch))
      ps_conn_close(l->conn);
  r->succ = NULL;
  r->nsendq = 0;
  r->pred_lost = 0;
  for (early **p = &r->early; *p;) {
    early *e = *p;
    if (e->epoch < epoch) {
      *p = e->next;
      r->early_floats -= e->count;
      free(e);
    } else {
      p = &e->next;
    }
  }
}

int ring_run_until(ps_ring *r, int (*done)(const ps_ring *)) {
  while (!done(r)) {
    if (r->stop && *r->stop)
      return -EINTR;
    uv_run(&r->loop, UV_RUN_ONCE);
  }
  return 0;
}

static int reduce_done(const ps_ring *r) {
  return r->broken || r->stop_step != 0 ||
         (r->recv_left == 0 && (r->succ == NULL || r->succ->writes == 0));
}

int ps_ring_allreduce(ps_ring *r, float *buf, size_t n, uint64_t step) {
  if (r->stop && *r->stop)
    return -EINTR;
  if (r->stop_step)
    return PS_ESTOPPED;
  r->step = step;
  r->buf = buf;
  r->nfl = n;
  if (r->n <= 1)
    return 0;
  r->active = 1;
  r->broken = 0;
  r->suspect = -1;
  if (r->pred_lost || r->newer > r->epoch) {
    if (r->pred_lost)
      ring_fail(r, pred_rank(r), "member %d (predecessor) closed between two steps", pred_rank(r));
    else
      ring_fail(r, -1, "a member dialed for view %" PRIu64 " between two steps", r->newer);
    r->active = 0;
    return -EPIPE;
  }
  r->progress_ns = ps_now_ns();
  memset(r->recv, 0, sizeof r->recv);
  uint32_t hops = 2 * (uint32_t)(r->n - 1);
  r->recv_left = 0;
  for (uint32_t t = 0; t < hops; t++) {
    uint64_t lo, hi;
    region(r, hop_region(r, t), &lo, &hi);
    r->recv_left += hi - lo;
  }
  if (r->succ == NULL)
    r->succ = ring_dial(r, K_SUCC, succ_rank(r));
  uint64_t lo, hi;
  region(r, r->pos, &lo, &hi);
  for (uint64_t off = lo; off < hi && !r->broken; off += PIECE_FLOATS)
    send_piece(r, 0, off, hi - off < PIECE_FLOATS ? hi - off : PIECE_FLOATS);
  /* Pieces that came before this step began. */
  for (early **p = &r->early; *p && !r->broken;) {
    early *e = *p;
    if (e->epoch == r->epoch && e->step == step) {
      if (e->from == pred_rank(r))
        apply(r, e->phase, e->off, e->count, (const uint8_t *)e->data);
    } else if (!(e->epoch == r->epoch && e->step < step)) {
      p = &e->next;
      continue;
    }
    *p = e->next;
    r->early_floats -= e->count;
    free(e);
  }
  int rc = ring_run_until(r, reduce_done);
  r->active = 0;
  if (rc != 0)
    return rc;
  if (r->broken)
    return -EPIPE;
  return r->stop_step && r->recv_left > 0 ? PS_ESTOPPED : 0;
}

void ps_ring_serve(ps_ring *r, int ms) {
  uint64_t until = ps_now_ns() + (uint64_t)ms * 1000000ULL;
  while (ps_now_ns() < until && !(r->stop && *r->stop))
    uv_run(&r->loop, UV_RUN_ONCE);
}

int ps_ring_suspect(const ps_ring *r) { return r->suspect; }
int ps_ring_size(const ps_ring *r) { return r->n; }
uint64_t ps_ring_newer_epoch(const ps_ring *r) { return r->newer; }
const char *ps_ring_error(const ps_ring *r) { return r->why; }
uint64_t ps_ring_stop_step(const ps_ring *r) { return r->stop_step; }

uint64_t ps_ring_bytes(const ps_ring *r, uint64_t *in) {
  uint64_t i = r->bytes_in_closed, o = r->bytes_out_closed;
  for (const link *l = r->links; l != NULL; l = l->next) {
    i += ps_conn_bytes_in(l->conn);
    o += ps_conn_bytes_out(l->conn);
  }
  if (in)
    *in = i;
  return o;
}
