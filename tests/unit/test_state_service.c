/* src/ps/state_service.c over a real loopback TCP connection: a requester
 * (the chief, or a ring peer) sends CUT, FETCH, RESUME and LOAD; the
 * service answers from a shard state.  Checked: a cut is a copy (the
 * bytes fetched are the state at the CUT, whatever the shard did since),
 * each owner has its own cut, the fence refuses an older chief token, and
 * a LOAD in pieces gives the shard exactly the state sent. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/log.h"
#include "net/conn.h"
#include "proto/proto.h"
#include "ps/shard.h"
#include "ps/state_service.h"

#define N 1000          /* floats in the slice */
#define PIECE 700       /* a FETCH or LOAD piece at most */

static uv_loop_t loop;
static uv_tcp_t server;
static ps_conn *svc_side, *req_side;
static ps_state_service *ss;
static ps_shard *shard;
static int holds = 1;
static const void *owner;
static ps_state_answer last;   /* the service's last answer */
static int answers;
/* What the requester received. */
static ps_msg got;
static float got_floats[8 * N];
static int replies;

static void on_svc_frame(ps_conn *c, const ps_frame_header *h, const uint8_t *p) {
  ps_msg m;
  ps_errbuf eb = {0};
  assert_int_equal(ps_proto_decode(h, p, h->length, &m, &eb), 0);
  if (ps_state_service_fence(ss, &m, &last) == 0)
    last = ps_state_service_frame(ss, owner, c, h->request_id, &m, holds);
  answers++;
}

static void on_req_frame(ps_conn *c, const ps_frame_header *h, const uint8_t *p) {
  (void)c;
  ps_errbuf eb = {0};
  assert_int_equal(ps_proto_decode(h, p, h->length, &got, &eb), 0);
  if (got.type == PS_MSG_FETCH_REPLY)
    memcpy(got_floats, got.u.fetch_reply.data, got.u.fetch_reply.count * sizeof(float));
  replies++;
}

static void on_close(ps_conn *c, int err, const char *why) { (void)c, (void)err, (void)why; }

static const ps_conn_cbs svc_cbs = {.on_frame = on_svc_frame, .on_close = on_close};
static const ps_conn_cbs req_cbs = {.on_frame = on_req_frame, .on_close = on_close};

static void on_connection(uv_stream_t *s, int status) {
  assert_int_equal(status, 0);
  svc_side = ps_conn_new(&loop, &svc_cbs, NULL);
  assert_int_equal(uv_accept(s, (uv_stream_t *)ps_conn_tcp(svc_side)), 0);
  assert_int_equal(ps_conn_start(svc_side), 0);
  ps_conn_handshake_done(svc_side, ps_proto_max_payload(8 * N));
}

static int connected;
static void on_connect(uv_connect_t *r, int status) {
  (void)r;
  assert_int_equal(status, 0);
  assert_int_equal(ps_conn_start(req_side), 0);
  ps_conn_handshake_done(req_side, ps_proto_max_payload(8 * N));
  connected = 1;
}

static void run_until(int *counter, int want) {
  for (int i = 0; i < 100000 && *counter < want; i++)
    uv_run(&loop, UV_RUN_ONCE);
  assert_true(*counter >= want);
}

/* Send m (with `floats` after it, for LOAD) and wait for the service's
 * answer and, unless refused, one reply to the requester. */
static void request(ps_msg *m, const float *floats, size_t n) {
  int a0 = answers, r0 = replies;
  if (floats == NULL) {
    assert_int_equal(ps_conn_send_msg(req_side, m, 1), 0);
  } else {
    uint8_t prefix[PS_PROTO_PREFIX_MAX];
    size_t plen = ps_proto_encode_prefix(m, 1, prefix);
    assert_int_equal(ps_conn_send(req_side, prefix, plen, floats, n * sizeof(float), NULL, NULL),
                     0);
  }
  run_until(&answers, a0 + 1);
  if (last.outcome != PS_STATE_REFUSED)
    run_until(&replies, r0 + 1);
}

static ps_shard_opts opts(void) {
  ps_shard_opts o = {.index = 0, .nworkers = 2, .nfloats = N, .consistency = PS_CONSISTENCY_ASYNC};
  o.optim = ps_optim_default(PS_OPTIM_ADAM, 0.01f);
  return o;
}

static void push(ps_shard *s, uint64_t seq) {
  float g[N];
  for (int i = 0; i < N; i++)
    g[i] = 0.01f * (float)((i + (int)seq) % 5);
  assert_int_equal(ps_shard_push(s, 0, 1, seq, 0, g, NULL, 0, NULL), PS_SHARD_APPLIED);
}

static int setup(void **state) {
  (void)state;
  ps_log_init("test", PS_LOG_ERROR);
  ps_shard_opts o = opts();
  shard = ps_shard_new(&o, NULL);
  ss = ps_state_service_new(shard, "shard 0", PIECE);
  if (shard == NULL || ss == NULL || uv_loop_init(&loop) != 0)
    return -1;
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", 0, &a);
  uv_tcp_init(&loop, &server);
  if (uv_tcp_bind(&server, (const struct sockaddr *)&a, 0) != 0 ||
      uv_listen((uv_stream_t *)&server, 4, on_connection) != 0)
    return -1;
  int len = sizeof a;
  uv_tcp_getsockname(&server, (struct sockaddr *)&a, &len);
  req_side = ps_conn_new(&loop, &req_cbs, NULL);
  static uv_connect_t cr;
  if (uv_tcp_connect(&cr, ps_conn_tcp(req_side), (const struct sockaddr *)&a, on_connect) != 0)
    return -1;
  for (int i = 0; i < 10000 && (!connected || svc_side == NULL); i++)
    uv_run(&loop, UV_RUN_ONCE);
  return connected && svc_side != NULL ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  ps_conn_close(req_side);
  ps_conn_close(svc_side);
  uv_close((uv_handle_t *)&server, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  ps_state_service_free(ss);
  ps_shard_free(shard);
  return 0;
}

static ps_msg cut(uint64_t fence, uint64_t id) {
  return (ps_msg){.type = PS_MSG_CUT, .u.cut = {.fence = fence, .cut_id = id, .hold_ms = 500}};
}

static ps_msg fetch(uint64_t fence, uint64_t id, uint64_t off, uint64_t count) {
  return (ps_msg){.type = PS_MSG_FETCH,
                  .u.fetch = {.fence = fence, .cut_id = id, .offset = off, .count = count}};
}

/* Fetch the whole image of cut (fence, id) into out, piece by piece. */
static void fetch_all(uint64_t fence, uint64_t id, float *out, uint64_t total) {
  for (uint64_t off = 0; off < total; off += PIECE) {
    uint64_t n = total - off < PIECE ? total - off : PIECE;
    ps_msg f = fetch(fence, id, off, n);
    request(&f, NULL, 0);
    assert_int_equal(last.outcome, PS_STATE_ANSWERED);
    assert_int_equal(got.type, PS_MSG_FETCH_REPLY);
    assert_int_equal(got.u.fetch_reply.offset, off);
    memcpy(out + off, got_floats, n * sizeof(float));
  }
}

/* A CUT is a copy: what is fetched is the state at the CUT, though the
 * shard moved on; a RESUME of that cut says RESUME, another's does not. */
static void test_cut_is_a_copy(void **state) {
  (void)state;
  push(shard, 1);
  ps_state_info in = ps_shard_state_info(shard);
  float *want = malloc(in.image_floats * sizeof(float)), *have = malloc(in.image_floats * 4);
  assert_non_null(want);
  assert_non_null(have);
  ps_shard_state_write(shard, want);
  ps_msg c = cut(5, 1);
  request(&c, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_HOLD);
  assert_int_equal(last.hold_ms, 500);
  assert_int_equal(got.type, PS_MSG_CUT_REPLY);
  assert_int_equal(got.u.cut_reply.state.version, 1);
  push(shard, 2);  /* after the cut */
  fetch_all(5, 1, have, in.image_floats);
  assert_memory_equal(have, want, in.image_floats * sizeof(float));
  /* Fetched to its end but not resumed (a ring peer resumes last), the
   * copy stays. */
  ps_msg f = fetch(5, 1, 0, 10);
  request(&f, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_ANSWERED);
  /* A FETCH of another cut id, or of a piece past the copy, is refused. */
  f = fetch(5, 7, 0, 10);
  request(&f, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_REFUSED);
  assert_non_null(strstr(last.why, "holds cut 1 of token 5 only"));
  f = fetch(5, 1, in.image_floats - 5, 10);
  request(&f, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_REFUSED);
  ps_msg r = {.type = PS_MSG_RESUME, .u.resume = {.fence = 5, .cut_id = 2}};
  request(&r, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_ANSWERED);  /* not the newest cut */
  assert_int_equal(got.type, PS_MSG_PONG);
  r.u.resume.cut_id = 1;
  request(&r, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_RESUME);
  /* Fetched to its end and resumed, the copy is gone: the shard holds no
   * second copy of its state between cuts. */
  f = fetch(5, 1, 0, 10);
  request(&f, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_REFUSED);
  assert_non_null(strstr(last.why, "holds no cut"));
  free(want);
  free(have);
}

/* Each owner its own cut: a second owner's CUT leaves the first's. */
static void test_owners(void **state) {
  (void)state;
  int a, b;
  const void *first = &a, *second = &b;
  owner = first;
  ps_msg c = cut(5, 10);
  request(&c, NULL, 0);
  uint64_t v10 = got.u.cut_reply.state.version;
  push(shard, 3);
  owner = second;
  c = cut(5, 11);
  request(&c, NULL, 0);
  assert_int_equal(got.u.cut_reply.state.version, v10 + 1);
  owner = first;
  ps_msg f = fetch(5, 10, 0, 10);
  request(&f, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_ANSWERED);
  f = fetch(5, 11, 0, 10);
  request(&f, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_REFUSED);  /* the second owner's */
  ps_state_service_forget(ss, first);
  f = fetch(5, 10, 0, 10);
  request(&f, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_REFUSED);
  assert_non_null(strstr(last.why, "holds no cut"));
  owner = NULL;
}

/* The fence: a newer token becomes the floor; an older one is PS_EFENCED. */
static void test_fence(void **state) {
  (void)state;
  ps_msg c = cut(9, 20);
  request(&c, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_HOLD);
  c = cut(8, 21);
  request(&c, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_REFUSED);
  assert_int_equal(last.code, PS_EFENCED);
  assert_non_null(strstr(last.why, "CUT with fence token 8, but this shard has seen token 9"));
  ps_state_service_set_fence(ss, 3);  /* never lowers it */
  request(&c, NULL, 0);
  assert_int_equal(last.code, PS_EFENCED);
}

/* No state: a CUT is refused, to be tried again. */
static void test_cut_without_state(void **state) {
  (void)state;
  holds = 0;
  ps_msg c = cut(9, 30);
  request(&c, NULL, 0);
  assert_int_equal(last.outcome, PS_STATE_REFUSED);
  assert_true(last.flags & PS_ERROR_RETRY);
  holds = 1;
}

/* A LOAD in pieces, in order, gives the shard exactly that state; onto a
 * state, or out of order, it is refused. */
static void test_load(void **state) {
  (void)state;
  ps_shard_opts o = opts();
  ps_shard *src = ps_shard_new(&o, NULL);
  assert_non_null(src);
  for (uint64_t k = 1; k <= 4; k++)
    push(src, k);
  ps_state_info in = ps_shard_state_info(src);
  float *img = malloc(in.image_floats * sizeof(float));
  assert_non_null(img);
  ps_shard_state_write(src, img);
  ps_msg l = {.type = PS_MSG_LOAD, .u.load = {.fence = 9, .state = in, .offset = 0, .count = 10}};
  request(&l, img, 10);
  assert_int_equal(last.outcome, PS_STATE_REFUSED);  /* the shard holds a state */
  holds = 0;
  l.u.load.offset = 10;
  request(&l, img + 10, 10);
  assert_int_equal(last.outcome, PS_STATE_REFUSED);  /* not the first piece */
  for (uint64_t off = 0; off < in.image_floats; off += PIECE) {
    uint64_t n = in.image_floats - off < PIECE ? in.image_floats - off : PIECE;
    l.u.load.offset = off;
    l.u.load.count = n;
    request(&l, img + off, n);
    assert_int_equal(last.outcome,
                     off + n == in.image_floats ? PS_STATE_LOADED : PS_STATE_ANSWERED);
    assert_int_equal(got.type, PS_MSG_PONG);
  }
  holds = 1;
  float *now = malloc(in.image_floats * sizeof(float));
  assert_non_null(now);
  ps_shard_state_write(shard, now);
  assert_memory_equal(now, img, in.image_floats * sizeof(float));
  assert_int_equal(ps_shard_version(shard), 4);
  free(now);
  free(img);
  ps_shard_free(src);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cut_is_a_copy),
      cmocka_unit_test(test_owners),
      cmocka_unit_test(test_fence),
      cmocka_unit_test(test_cut_without_state),
      cmocka_unit_test(test_load),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
