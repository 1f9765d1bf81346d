/* A real shard server (ps_server_run, src/ps/server.c) on loopback inside
 * the test process, and peers (workers, the chief, a tool) that talk to it
 * over real TCP connections on the test's own libuv loop.  The server runs
 * on a thread of its own with replication off (no Redis); it reports its
 * phases as it would to systemd, over a NOTIFY_SOCKET datagram socket the
 * test reads (READY=1, STATUS=, STOPPING=1), and the thread's end wakes the
 * test's loop.  Every wait is for an event, with a deadline (a uv timer)
 * that only bounds a hang.  Header-only, for test_server.c,
 * test_consistency.c and test_control.c; include it after cmocka.h (it
 * asserts).  One server at a time: fx_start in a test, fx_teardown as its
 * cmocka teardown. */
#ifndef PS_TESTS_SHARD_FIXTURE_H
#define PS_TESTS_SHARD_FIXTURE_H

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "tmpdir.h"

#include "common/config.h"
#include "common/log.h"
#include "common/notify.h"
#include "layout/layout.h"
#include "net/conn.h"
#include "nn/model.h"
#include "proto/proto.h"
#include "ps/server.h"
#include "ps/shard.h"

#define FX_DEADLINE_MS 10000
#define FX_SECRET "0123456789abcdef0123456789abcdef"

/* A frame a peer received, with its own copy of the payload (m's data
 * pointers point into it). */
typedef struct fx_frame {
  struct fx_frame *next;
  ps_frame_header h;
  ps_msg m;
  uint8_t *payload;
} fx_frame;

typedef struct peer {
  struct peer *next_peer;
  ps_conn *conn;          /* NULL once closed */
  uv_connect_t creq;
  int role;
  uint32_t index;
  uint64_t incarnation;
  int bad_proof;          /* HELLO with a wrong proof */
  int welcomed, closed, close_err;
  ps_msg_welcome welcome;
  fx_frame *head, *tail;  /* received, not yet taken */
  fx_frame *last;         /* the one fx_expect returned last */
} peer;

static struct {
  ps_config cfg;
  ps_model model;
  ps_layout layout;
  size_t slice;           /* floats in shard 0's slice */
  int port;
  uv_loop_t loop;
  uv_timer_t deadline;
  int expired;
  uv_async_t done;        /* the server's thread ended */
  int nfd;                /* the NOTIFY_SOCKET the server reports to */
  uv_poll_t npoll;
  pthread_t thread;
  int started, finished, status;
  int ready, stopping, nstatus;
  char status_text[512];  /* the newest STATUS= */
  peer *peers;
  uint64_t req;
} fx;

static inline void fx_on_deadline(uv_timer_t *t) {
  (void)t;
  fx.expired = 1;
}

/* Run the test's loop until `cond` holds; fail when FX_DEADLINE_MS pass
 * first (a hang, not a timing). */
#define FX_WAIT(cond, what)                                                          \
  do {                                                                               \
    fx.expired = 0;                                                                  \
    uv_timer_start(&fx.deadline, fx_on_deadline, FX_DEADLINE_MS, 0);                 \
    while (!(cond) && !fx.expired)                                                   \
      uv_run(&fx.loop, UV_RUN_ONCE);                                                 \
    uv_timer_stop(&fx.deadline);                                                     \
    if (!(cond))                                                                     \
      fail_msg("%s:%d: no %s within %d ms", __FILE__, __LINE__, what, FX_DEADLINE_MS); \
  } while (0)

/* ------------------------------------------------------------ the server */

static inline void fx_on_notify(uv_poll_t *h, int status, int events) {
  (void)h, (void)status, (void)events;
  ps_notify_msg m;
  while (ps_notify_recv(fx.nfd, &m) == 1) {
    fx.ready |= m.ready;
    fx.stopping |= m.stopping;
    if (m.has_status) {
      fx.nstatus++;
      snprintf(fx.status_text, sizeof fx.status_text, "%s", m.status);
    }
  }
}

static inline void fx_on_done(uv_async_t *a) {
  (void)a;
  fx.finished = 1;
}

static inline void *fx_server_main(void *arg) {
  (void)arg;
  fx.status = ps_server_run(&fx.cfg, 0);
  uv_async_send(&fx.done);
  return NULL;
}

/* Wait for the server's thread to end and give its exit status. */
static inline int fx_wait_exit(void) {
  FX_WAIT(fx.finished, "exit of the shard");
  if (fx.started) {
    pthread_join(fx.thread, NULL);
    fx.started = 0;
  }
  return fx.status;
}

/* A port that was free a moment ago (the kernel's pick). */
static inline int fx_free_port(void) {
  uv_tcp_t t;
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", 0, &a);
  assert_int_equal(uv_tcp_init(&fx.loop, &t), 0);
  assert_int_equal(uv_tcp_bind(&t, (const struct sockaddr *)&a, 0), 0);
  int len = sizeof a;
  assert_int_equal(uv_tcp_getsockname(&t, (struct sockaddr *)&a, &len), 0);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&fx.loop, UV_RUN_NOWAIT);
  return ntohs(a.sin_port);
}

/* Start shard 0 of a cluster of `nworkers` workers: mlp 784-8-10 on one
 * shard, replication off, plus `extra` (sections of settings: [train]
 * consistency, [replication] self_init, ...).  Returns once the server
 * listens (its first STATUS= or READY=1). */
static inline void fx_start(int nworkers, const char *extra) {
  memset(&fx, 0, sizeof fx);
  ps_log_init("test", PS_LOG_WARN);
  assert_int_equal(tmpdir_create("ps-server"), 0);
  assert_int_equal(uv_loop_init(&fx.loop), 0);
  assert_int_equal(uv_timer_init(&fx.loop, &fx.deadline), 0);
  fx.port = fx_free_port();
  char workers[256] = "", conf[2048];
  for (int j = 0; j < nworkers; j++)
    snprintf(workers + strlen(workers), sizeof workers - strlen(workers), "%s127.0.0.1:%d",
             j ? ", " : "", 1 + j);
  snprintf(conf, sizeof conf,
           "[cluster]\nid = unit\nsecret_file = secret\nps = 127.0.0.1:%d\nworkers = %s\n"
           "log_level = warn\n[model]\nhidden = 8\n[replication]\nmode = off\n%s",
           fx.port, workers, extra);
  tmpdir_put("secret", FX_SECRET, 0600);
  tmpdir_put("cluster.conf", conf, 0644);
  ps_errbuf eb = {0};
  if (ps_config_load(at("cluster.conf"), &fx.cfg, &eb) != 0 ||
      ps_layout_for_cluster(&fx.cfg, &fx.model, &fx.layout, &eb) != 0)
    fail_msg("%s", eb.msg);
  fx.slice = fx.layout.shard_floats[0];

  static int names;
  char name[64];
  snprintf(name, sizeof name, "ps-test-%ld-%d", (long)getpid(), names++);
  fx.nfd = ps_notify_listen(name);
  assert_true(fx.nfd >= 0);
  char env[80];
  snprintf(env, sizeof env, "@%s", name);
  setenv("NOTIFY_SOCKET", env, 1);
  assert_int_equal(uv_poll_init(&fx.loop, &fx.npoll, fx.nfd), 0);
  assert_int_equal(uv_poll_start(&fx.npoll, UV_READABLE, fx_on_notify), 0);
  assert_int_equal(uv_async_init(&fx.loop, &fx.done, fx_on_done), 0);
  assert_int_equal(pthread_create(&fx.thread, NULL, fx_server_main, NULL), 0);
  fx.started = 1;
  FX_WAIT(fx.ready || fx.nstatus > 0 || fx.finished, "start of the shard");
  if (fx.finished)
    fail_msg("the shard exited at start with status %d", fx_wait_exit());
}

/* SIGTERM, as systemd stops it.  Only while it serves (its signal
 * watchers are on): not once it said STOPPING=1. */
static inline void fx_sigterm(void) {
  fx_on_notify(NULL, 0, 0);
  assert_false(fx.stopping);
  assert_int_equal(uv_kill(getpid(), SIGTERM), 0);
}

/* --------------------------------------------------------------- peers */

static inline void fx_frame_free(fx_frame *f) {
  if (f != NULL)
    free(f->payload);
  free(f);
}

static inline void fx_send_hello(peer *p, const ps_msg_challenge *ch) {
  ps_msg m = {.type = PS_MSG_HELLO};
  ps_msg_hello *h = &m.u.hello;
  h->role = (uint8_t)p->role;
  h->index = p->index;
  h->incarnation = p->incarnation;
  h->layout_hash = fx.layout.hash;
  snprintf(h->cluster_id, sizeof h->cluster_id, "%s", fx.cfg.cluster_id);
  ps_proto_auth_proof((const uint8_t *)FX_SECRET, strlen(FX_SECRET), ch->nonce, h, h->proof);
  if (p->bad_proof)
    h->proof[0] ^= 1;
  assert_int_equal(ps_conn_send_msg(p->conn, &m, 0), 0);
}

static inline void fx_peer_frame(ps_conn *c, const ps_frame_header *h, const uint8_t *payload) {
  peer *p = ps_conn_data(c);
  fx_frame *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->h = *h;
  f->payload = malloc(h->length + 1);
  assert_non_null(f->payload);
  memcpy(f->payload, payload, h->length);
  ps_errbuf eb = {0};
  if (ps_proto_decode(h, f->payload, h->length, &f->m, &eb) != 0)
    fail_msg("the shard sent a frame that does not decode: %s", eb.msg);
  if (f->m.type == PS_MSG_CHALLENGE) {
    fx_send_hello(p, &f->m.u.challenge);
    fx_frame_free(f);
    return;
  }
  if (f->m.type == PS_MSG_WELCOME && !p->welcomed) {
    p->welcomed = 1;
    p->welcome = f->m.u.welcome;
    ps_conn_handshake_done(c, f->m.u.welcome.max_payload);
    fx_frame_free(f);
    return;
  }
  if (p->tail != NULL)
    p->tail->next = f;
  else
    p->head = f;
  p->tail = f;
}

static inline void fx_peer_close(ps_conn *c, int err, const char *why) {
  (void)why;
  peer *p = ps_conn_data(c);
  p->closed = 1;
  p->close_err = err;
  p->conn = NULL;
}

static const ps_conn_cbs fx_peer_cbs = {.on_frame = fx_peer_frame, .on_close = fx_peer_close};

static inline void fx_on_connect(uv_connect_t *r, int status) {
  peer *p = r->data;
  if (status == UV_ECANCELED)  /* closed before it connected */
    return;
  if (status != 0 || ps_conn_start(p->conn) != 0)
    ps_conn_close(p->conn);
}

/* Dial the shard as `role` number `index`; the HELLO goes when the
 * CHALLENGE comes.  Does not wait. */
static inline peer *fx_dial(int role, uint32_t index, uint64_t incarnation, int bad_proof) {
  peer *p = calloc(1, sizeof *p);
  assert_non_null(p);
  p->role = role;
  p->index = index;
  p->incarnation = incarnation;
  p->bad_proof = bad_proof;
  p->next_peer = fx.peers;
  fx.peers = p;
  p->conn = ps_conn_new(&fx.loop, &fx_peer_cbs, p);
  assert_non_null(p->conn);
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", fx.port, &a);
  p->creq.data = p;
  assert_int_equal(
      uv_tcp_connect(&p->creq, ps_conn_tcp(p->conn), (const struct sockaddr *)&a, fx_on_connect),
      0);
  return p;
}

/* A peer the shard welcomed. */
static inline peer *fx_connect(int role, uint32_t index, uint64_t incarnation) {
  peer *p = fx_dial(role, index, incarnation, 0);
  FX_WAIT(p->welcomed || p->closed, "WELCOME or close");
  if (!p->welcomed)
    fail_msg("%s %u refused: %s", ps_role_name(role), index,
             p->head != NULL && p->head->m.type == PS_MSG_ERROR ? p->head->m.u.error.message
                                                                  : "closed");
  return p;
}

/* The next frame p received (waiting for it), which must be of `type`;
 * valid until the next call for p.  *req (may be NULL) is its request id. */
static inline ps_msg fx_expect_req(peer *p, ps_msg_type type, uint64_t *req) {
  FX_WAIT(p->head != NULL || p->closed, "frame");
  if (p->head == NULL)
    fail_msg("%s %u: closed (%d) while expecting %s", ps_role_name(p->role), p->index,
             p->close_err, ps_proto_type_name(type));
  fx_frame *f = p->head;
  p->head = f->next;
  if (p->head == NULL)
    p->tail = NULL;
  fx_frame_free(p->last);
  p->last = f;
  if (f->m.type != type)
    fail_msg("%s %u: %s while expecting %s%s%s", ps_role_name(p->role), p->index,
             ps_proto_type_name(f->m.type), ps_proto_type_name(type),
             f->m.type == PS_MSG_ERROR ? ": " : "",
             f->m.type == PS_MSG_ERROR ? f->m.u.error.message : "");
  if (req != NULL)
    *req = f->h.request_id;
  return f->m;
}

static inline ps_msg fx_expect(peer *p, ps_msg_type type) { return fx_expect_req(p, type, NULL); }

/* The shard answered p with ERROR `code` and closed the connection. */
static inline ps_msg_error fx_expect_refusal(peer *p, int code) {
  int was_welcomed = p->welcomed;
  FX_WAIT(p->head != NULL || p->closed || p->welcomed > was_welcomed, "ERROR");
  if (p->welcomed > was_welcomed && p->head == NULL)
    fail_msg("%s %u: welcomed, expected ERROR %d", ps_role_name(p->role), p->index, code);
  ps_msg m = fx_expect(p, PS_MSG_ERROR);
  assert_int_equal(m.u.error.code, code);
  FX_WAIT(p->closed, "close after the ERROR");
  return m.u.error;
}

static inline uint64_t fx_send(peer *p, const ps_msg *m) {
  uint64_t req = ++fx.req;
  assert_non_null(p->conn);
  assert_int_equal(ps_conn_send_msg(p->conn, m, req), 0);
  return req;
}

static inline void fx_free_copy(void *arg, int status) {
  (void)status;
  free(arg);
}

/* A frame that carries floats (PUSH, LOAD): the prefix, then a copy of
 * `n` floats. */
static inline uint64_t fx_send_floats(peer *p, const ps_msg *m, const float *floats, size_t n) {
  uint64_t req = ++fx.req;
  uint8_t prefix[PS_PROTO_PREFIX_MAX];
  size_t plen = ps_proto_encode_prefix(m, req, prefix);
  assert_true(plen > 0);
  float *copy = malloc(n * sizeof(float) + 1);
  assert_non_null(copy);
  memcpy(copy, floats, n * sizeof(float));
  assert_non_null(p->conn);
  assert_int_equal(ps_conn_send(p->conn, prefix, plen, copy, n * sizeof(float), fx_free_copy, copy),
                   0);
  return req;
}

/* No frame for p is on its way: a PING's PONG is the next frame (the
 * shard answers a connection's frames in order, so a reply it had made
 * before the PING would come first). */
static inline void fx_nothing_pending(peer *p) {
  ps_msg m = {.type = PS_MSG_PING, .u.ping.token = 0x5eed};
  fx_send(p, &m);
  ps_msg r = fx_expect(p, PS_MSG_PONG);
  assert_int_equal(r.u.ping.token, 0x5eed);
}

/* ------------------------------------------------------------ requests */

/* A worker's gradient of the whole slice: every float `value`. */
static inline float *fx_gradient(float value) {
  float *g = malloc(fx.slice * sizeof(float) + 1);
  assert_non_null(g);
  for (size_t k = 0; k < fx.slice; k++)
    g[k] = value;
  return g;
}

static inline uint64_t fx_push(peer *w, uint64_t seq, uint64_t step, const float *g) {
  ps_msg m = {.type = PS_MSG_PUSH};
  m.u.push = (ps_msg_push){.worker = w->index, .incarnation = w->incarnation, .seq = seq,
                           .step = step, .count = fx.slice};
  return fx_send_floats(w, &m, g, fx.slice);
}

/* The next frame is the ack of seq: its status and version. */
static inline ps_msg_push_ack fx_expect_ack(peer *w, uint64_t seq, uint32_t status) {
  ps_msg a = fx_expect(w, PS_MSG_PUSH_ACK);
  assert_int_equal(a.u.push_ack.seq, seq);
  assert_int_equal(a.u.push_ack.status, status);
  return a.u.push_ack;
}

static inline uint64_t fx_pull(peer *w, uint64_t step) {
  ps_msg m = {.type = PS_MSG_PULL, .u.pull = {.worker = w->index, .step = step}};
  return fx_send(w, &m);
}

/* The next frame is the reply to PULL `req`: its version; the values into
 * out (fx.slice floats) unless NULL. */
static inline uint64_t fx_expect_pull(peer *w, uint64_t req, float *out) {
  uint64_t got;
  ps_msg r = fx_expect_req(w, PS_MSG_PULL_REPLY, &got);
  assert_int_equal(got, req);
  assert_int_equal(r.u.pull_reply.count, fx.slice);
  if (out != NULL)
    memcpy(out, r.u.pull_reply.data, fx.slice * sizeof(float));
  return r.u.pull_reply.version;
}

static inline ps_msg_stats_reply fx_stats(peer *p) {
  ps_msg m = {.type = PS_MSG_STATS};
  fx_send(p, &m);
  return fx_expect(p, PS_MSG_STATS_REPLY).u.stats_reply;
}

/* The chief's LOAD of `sh`'s state (a shard of this cluster's shape), in
 * pieces of one slice at most (the shard's cap), each answered by PONG. */
static inline void fx_load(peer *chief, uint64_t fence, const ps_shard *sh) {
  ps_state_info in = ps_shard_state_info(sh);
  float *img = malloc(in.image_floats * sizeof(float));
  assert_non_null(img);
  ps_shard_state_write(sh, img);
  for (uint64_t off = 0; off < in.image_floats; off += fx.slice) {
    uint64_t n = in.image_floats - off < fx.slice ? in.image_floats - off : fx.slice;
    ps_msg l = {.type = PS_MSG_LOAD,
                .u.load = {.fence = fence, .state = in, .offset = off, .count = n}};
    fx_send_floats(chief, &l, img + off, n);
    fx_expect(chief, PS_MSG_PONG);
  }
  free(img);
}

static inline ps_state_info fx_cut(peer *chief, uint64_t fence, uint64_t id, uint32_t hold_ms) {
  ps_msg m = {.type = PS_MSG_CUT, .u.cut = {.fence = fence, .cut_id = id, .hold_ms = hold_ms}};
  fx_send(chief, &m);
  ps_msg r = fx_expect(chief, PS_MSG_CUT_REPLY);
  assert_int_equal(r.u.cut_reply.cut_id, id);
  return r.u.cut_reply.state;
}

static inline uint64_t fx_resume_send(peer *chief, uint64_t fence, uint64_t id) {
  ps_msg m = {.type = PS_MSG_RESUME, .u.resume = {.fence = fence, .cut_id = id}};
  return fx_send(chief, &m);
}

static inline void fx_resume(peer *chief, uint64_t fence, uint64_t id) {
  fx_resume_send(chief, fence, id);
  assert_int_equal(fx_expect(chief, PS_MSG_PONG).u.ping.token, id);
}

static inline uint64_t fx_stop_send(peer *chief, uint64_t fence, uint64_t step) {
  ps_msg m = {.type = PS_MSG_STOP, .u.stop = {.fence = fence, .step = step}};
  return fx_send(chief, &m);
}

/* ------------------------------------------------------------ teardown */

static inline int fx_teardown(void **state) {
  (void)state;
  for (peer *p = fx.peers; p != NULL; p = p->next_peer)
    if (p->conn != NULL)
      ps_conn_close(p->conn);
  int open = 1;
  for (int i = 0; i < 100000 && open; i++) {
    open = 0;
    for (peer *p = fx.peers; p != NULL; p = p->next_peer)
      open |= !p->closed;
    if (open)
      uv_run(&fx.loop, UV_RUN_ONCE);
  }
  if (fx.started && !fx.finished) {
    fx_on_notify(NULL, 0, 0);
    if (!fx.stopping)
      uv_kill(getpid(), SIGTERM);
    fx_wait_exit();
  }
  while (fx.peers != NULL) {
    peer *p = fx.peers;
    fx.peers = p->next_peer;
    while (p->head != NULL) {
      fx_frame *f = p->head;
      p->head = f->next;
      fx_frame_free(f);
    }
    fx_frame_free(p->last);
    free(p);
  }
  uv_close((uv_handle_t *)&fx.deadline, NULL);
  uv_close((uv_handle_t *)&fx.done, NULL);
  uv_close((uv_handle_t *)&fx.npoll, NULL);
  uv_run(&fx.loop, UV_RUN_DEFAULT);
  int loop_rc = uv_loop_close(&fx.loop);
  close(fx.nfd);
  unsetenv("NOTIFY_SOCKET");
  ps_layout_close(&fx.layout);
  ps_model_close(&fx.model);
  tmpdir_remove();
  return loop_rc == 0 ? 0 : -1;
}

#endif
