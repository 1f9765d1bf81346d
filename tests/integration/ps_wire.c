/* Talks to a running shard (shard 0 of the config given) over a real
 * socket: every kind of bad input gets an ERROR frame and a closed
 * connection while the shard keeps serving others with its state
 * unchanged, and a push re-sent with the same (worker, incarnation,
 * sequence) is acknowledged again but applied once. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/config.h"
#include "layout/layout.h"
#include "nn/model.h"
#include "proto/proto.h"

static ps_config cfg;
static ps_layout layout;
static uint8_t secret[4096];
static size_t secret_len;
static size_t slice;  /* floats in shard 0's slice */

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static int dial(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(cfg.ps[0].port)};
  inet_pton(AF_INET, cfg.ps[0].host, &a.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
    die("connect to shard 0: %s", strerror(errno));
  struct timeval tv = {.tv_sec = 10};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void send_all(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n <= 0)
      die("send: %s", strerror(errno));
    p += n;
    len -= (size_t)n;
  }
}

/* Read exactly len bytes; 0 at a clean EOF before any byte, 1 when read. */
static int recv_all(int fd, void *buf, size_t len) {
  uint8_t *p = buf;
  size_t got = 0;
  while (got < len) {
    ssize_t n = recv(fd, p + got, len - got, 0);
    if (n == 0 && got == 0)
      return 0;
    if (n <= 0)
      die("recv: %s", n == 0 ? "EOF inside a frame" : strerror(errno));
    got += (size_t)n;
  }
  return 1;
}

static uint8_t payload[64 << 20];

/* Read one frame into m (payload kept in the static buffer).  0 at EOF. */
static int read_msg(int fd, ps_msg *m, ps_frame_header *h) {
  uint8_t hb[PS_PROTO_HEADER_SIZE];
  if (!recv_all(fd, hb, sizeof hb))
    return 0;
  ps_errbuf eb = {0};
  if (ps_proto_decode_header(hb, sizeof payload, h, &eb) != 0)
    die("shard sent a bad header: %s", eb.msg);
  if (h->length && !recv_all(fd, payload, h->length))
    die("EOF inside a payload");
  if (ps_proto_decode(h, payload, h->length, m, &eb) != 0)
    die("shard sent a bad %s: %s", ps_proto_type_name(h->type), eb.msg);
  return 1;
}

static void send_msg(int fd, const ps_msg *m, uint64_t req) {
  static uint8_t buf[64 << 20];
  size_t n = ps_proto_encode(m, req, buf, sizeof buf);
  if (n == 0)
    die("encode %s", ps_proto_type_name(m->type));
  send_all(fd, buf, n);
}

static ps_msg_challenge expect_challenge(int fd) {
  ps_msg m;
  ps_frame_header h;
  if (!read_msg(fd, &m, &h) || m.type != PS_MSG_CHALLENGE)
    die("expected CHALLENGE first");
  return m.u.challenge;
}

static ps_msg_hello make_hello(const ps_msg_challenge *ch, uint32_t worker, uint64_t inc) {
  ps_msg_hello hello = {.role = PS_ROLE_WORKER, .index = worker, .incarnation = inc,
                        .layout_hash = layout.hash};
  snprintf(hello.cluster_id, sizeof hello.cluster_id, "%s", cfg.cluster_id);
  ps_proto_auth_proof(secret, secret_len, ch->nonce, &hello, hello.proof);
  return hello;
}

static void send_hello(int fd, const ps_msg_hello *hello) {
  ps_msg m = {.type = PS_MSG_HELLO};
  m.u.hello = *hello;
  send_msg(fd, &m, 0);
}

/* A connected, authenticated worker. */
static int good_client(uint32_t worker, uint64_t inc) {
  int fd = dial();
  ps_msg_challenge ch = expect_challenge(fd);
  ps_msg_hello hello = make_hello(&ch, worker, inc);
  send_hello(fd, &hello);
  ps_msg m;
  ps_frame_header h;
  if (!read_msg(fd, &m, &h) || m.type != PS_MSG_WELCOME)
    die("expected WELCOME, got %s", m.type == PS_MSG_ERROR ? m.u.error.message : "something else");
  if (m.u.welcome.slice_floats != slice)
    die("WELCOME says %" PRIu64 " floats, layout says %zu", m.u.welcome.slice_floats, slice);
  return fd;
}

/* The shard answers ERROR mentioning `want`, then closes. */
static void expect_refusal(int fd, const char *what, const char *want) {
  ps_msg m;
  ps_frame_header h;
  if (!read_msg(fd, &m, &h))
    die("%s: connection closed without an ERROR", what);
  if (m.type != PS_MSG_ERROR)
    die("%s: expected ERROR, got %s", what, ps_proto_type_name(m.type));
  if (strstr(m.u.error.message, want) == NULL)
    die("%s: ERROR '%s' does not mention '%s'", what, m.u.error.message, want);
  uint8_t b;
  ssize_t n = recv(fd, &b, 1, 0);
  if (n != 0)
    die("%s: connection still open after the ERROR", what);
  close(fd);
  printf("ok: %s -> ERROR \"%s\", closed\n", what, m.u.error.message);
}

static uint64_t req_id = 100;

static ps_msg_stats_reply stats(int fd) {
  ps_msg m = {.type = PS_MSG_STATS};
  send_msg(fd, &m, ++req_id);
  ps_frame_header h;
  if (!read_msg(fd, &m, &h) || m.type != PS_MSG_STATS_REPLY || h.request_id != req_id)
    die("expected STATS_REPLY");
  return m.u.stats_reply;
}

static uint64_t pull(int fd, float *out) {
  ps_msg m = {.type = PS_MSG_PULL};
  send_msg(fd, &m, ++req_id);
  ps_frame_header h;
  if (!read_msg(fd, &m, &h) || m.type != PS_MSG_PULL_REPLY || h.request_id != req_id)
    die("expected PULL_REPLY");
  if (m.u.pull_reply.count != slice)
    die("PULL_REPLY of %" PRIu64 " floats, expected %zu", m.u.pull_reply.count, slice);
  memcpy(out, m.u.pull_reply.data, slice * sizeof(float));
  return m.u.pull_reply.version;
}

static ps_msg_push_ack push(int fd, uint32_t worker, uint64_t inc, uint64_t seq, const float *g) {
  ps_msg m = {.type = PS_MSG_PUSH};
  m.u.push = (ps_msg_push){.worker = worker, .incarnation = inc, .seq = seq, .step = 0,
                           .count = slice, .data = (const uint8_t *)g};
  send_msg(fd, &m, ++req_id);
  ps_frame_header h;
  if (!read_msg(fd, &m, &h) || m.type != PS_MSG_PUSH_ACK || h.request_id != req_id)
    die("expected PUSH_ACK, got %s", m.type == PS_MSG_ERROR ? m.u.error.message : "another frame");
  return m.u.push_ack;
}

static void raw_header(uint8_t *b, uint32_t magic, uint16_t version, uint16_t type,
                       uint32_t length) {
  memset(b, 0, PS_PROTO_HEADER_SIZE);
  memcpy(b, &magic, 4);
  memcpy(b + 4, &version, 2);
  memcpy(b + 6, &type, 2);
  memcpy(b + 20, &length, 4);
}

int main(int argc, char **argv) {
  if (argc != 2)
    die("usage: ps_wire CONFIG (shard 0 of CONFIG running)");
  ps_errbuf eb = {0};
  ps_model model;
  if (ps_config_load(argv[1], &cfg, &eb) != 0 ||
      ps_config_read_secret(&cfg, secret, sizeof secret, &eb) < 0)
    die("%s", eb.msg);
  secret_len = (size_t)ps_config_read_secret(&cfg, secret, sizeof secret, &eb);
  if (ps_layout_for_cluster(&cfg, &model, &layout, &eb) != 0)
    die("%s", eb.msg);
  slice = layout.shard_floats[0];
  float *before = malloc(slice * sizeof(float)), *now = malloc(slice * sizeof(float));
  float *after1 = malloc(slice * sizeof(float)), *g = malloc(slice * sizeof(float));
  for (size_t i = 0; i < slice; i++)
    g[i] = (float)((i % 7) + 1) * 1e-3f;

  /* A good worker stays connected through every bad case below. */
  int keep = good_client(1, 1);
  ps_msg_stats_reply s0 = stats(keep);
  uint64_t v0 = pull(keep, before);

  uint8_t hb[PS_PROTO_HEADER_SIZE];
  int fd = dial();
  expect_challenge(fd);
  raw_header(hb, 0x12345678, PS_PROTO_VERSION, PS_MSG_PULL, 16);
  send_all(fd, hb, sizeof hb);
  expect_refusal(fd, "bad magic", "magic");

  fd = dial();
  expect_challenge(fd);
  raw_header(hb, PS_PROTO_MAGIC, 7, PS_MSG_PULL, 16);
  send_all(fd, hb, sizeof hb);
  expect_refusal(fd, "protocol version 7", "version");

  fd = dial();
  expect_challenge(fd);
  raw_header(hb, PS_PROTO_MAGIC, PS_PROTO_VERSION, 99, 0);
  send_all(fd, hb, sizeof hb);
  expect_refusal(fd, "unknown frame type", "type");

  fd = dial();
  expect_challenge(fd);
  ps_msg pullm = {.type = PS_MSG_PULL};
  send_msg(fd, &pullm, 1);
  expect_refusal(fd, "PULL before HELLO", "before HELLO");

  fd = dial();
  ps_msg_challenge ch = expect_challenge(fd);
  ps_msg_hello hello = make_hello(&ch, 0, 5);
  hello.layout_hash ^= 1;
  ps_proto_auth_proof(secret, secret_len, ch.nonce, &hello, hello.proof);
  send_hello(fd, &hello);
  expect_refusal(fd, "wrong layout hash", "layout hash");

  fd = dial();
  ch = expect_challenge(fd);
  hello = make_hello(&ch, 0, 5);
  snprintf(hello.cluster_id, sizeof hello.cluster_id, "other-cluster");
  ps_proto_auth_proof(secret, secret_len, ch.nonce, &hello, hello.proof);
  send_hello(fd, &hello);
  expect_refusal(fd, "wrong cluster id", "cluster id");

  fd = dial();
  ch = expect_challenge(fd);
  hello = make_hello(&ch, 0, 5);
  ps_proto_auth_proof((const uint8_t *)"not-the-cluster-secret", 22, ch.nonce, &hello, hello.proof);
  send_hello(fd, &hello);
  expect_refusal(fd, "failed authentication", "authentication");

  fd = dial();
  ch = expect_challenge(fd);
  hello = make_hello(&ch, (uint32_t)cfg.nworkers, 5);
  send_hello(fd, &hello);
  expect_refusal(fd, "worker index out of range", "worker index");

  fd = good_client(0, 5);
  uint8_t shortpull[PS_PROTO_HEADER_SIZE + 15] = {0};
  raw_header(shortpull, PS_PROTO_MAGIC, PS_PROTO_VERSION, PS_MSG_PULL, 15);
  send_all(fd, shortpull, sizeof shortpull);
  expect_refusal(fd, "PULL with a 15-byte payload", "PULL");

  fd = good_client(0, 5);
  raw_header(hb, PS_PROTO_MAGIC, PS_PROTO_VERSION, PS_MSG_PUSH,
             (uint32_t)ps_proto_max_payload(slice) + 4);
  send_all(fd, hb, sizeof hb);
  expect_refusal(fd, "frame over the payload cap", "");

  fd = good_client(0, 5);
  {
    ps_msg m = {.type = PS_MSG_PUSH};
    float *big = calloc(slice / 2, sizeof(float));
    m.u.push = (ps_msg_push){.worker = 0, .incarnation = 5, .seq = 1, .count = slice / 2,
                             .data = (const uint8_t *)big};
    send_msg(fd, &m, 1);
    free(big);
  }
  expect_refusal(fd, "PUSH of another slice's size", "slice");

  fd = good_client(0, 5);
  {
    ps_msg m = {.type = PS_MSG_PUSH};
    m.u.push = (ps_msg_push){.worker = 1, .incarnation = 5, .seq = 1, .count = slice,
                             .data = (const uint8_t *)g};
    send_msg(fd, &m, 1);
  }
  expect_refusal(fd, "PUSH naming another worker", "worker");

  /* Nothing above changed the shard, and it still serves the good worker. */
  ps_msg_stats_reply s1 = stats(keep);
  if (s1.version != s0.version || s1.pushes_applied != s0.pushes_applied)
    die("state changed by bad input: version %" PRIu64 " -> %" PRIu64, s0.version, s1.version);
  if (pull(keep, now) != v0 || memcmp(now, before, slice * sizeof(float)) != 0)
    die("values changed by bad input");
  printf("ok: after the bad input: version %" PRIu64 ", values unchanged, the good connection "
         "still served\n", s1.version);

  /* Exactly once. */
  ps_msg_push_ack a = push(keep, 1, 1, 1, g);
  if (a.status != PS_PUSH_APPLIED || a.version != v0 + 1)
    die("first push: status %u version %" PRIu64 ", expected applied at %" PRIu64, a.status,
        a.version, v0 + 1);
  pull(keep, after1);
  if (memcmp(after1, before, slice * sizeof(float)) == 0)
    die("the first push did not change the values");
  a = push(keep, 1, 1, 1, g);
  if (a.status != PS_PUSH_DUPLICATE || a.version != v0 + 1)
    die("re-sent push: status %u version %" PRIu64 ", expected duplicate at %" PRIu64, a.status,
        a.version, v0 + 1);
  close(keep);
  /* As after a reconnect: a new connection re-sends the same push. */
  keep = good_client(1, 1);
  a = push(keep, 1, 1, 1, g);
  if (a.status != PS_PUSH_DUPLICATE || a.version != v0 + 1)
    die("push re-sent on a new connection: status %u version %" PRIu64, a.status, a.version);
  if (pull(keep, now) != v0 + 1 || memcmp(now, after1, slice * sizeof(float)) != 0)
    die("a re-sent push changed the values");
  printf("ok: a push re-sent twice (same connection, new connection) was acknowledged as a "
         "duplicate; version %" PRIu64 " and values unchanged\n", v0 + 1);
  a = push(keep, 1, 1, 2, g);
  if (a.status != PS_PUSH_APPLIED || a.version != v0 + 2)
    die("next push: status %u version %" PRIu64, a.status, a.version);
  printf("ok: the next sequence number applies (version %" PRIu64 ")\n", a.version);
  close(keep);

  /* One incarnation per worker: a newer one's HELLO closes the older one's
   * connection (still open, as a worker whose host died leaves it), and an
   * older one's HELLO is refused.  The newer one is served. */
  int older = good_client(0, 6);
  pull(older, now);
  int newer = good_client(0, 7);
  expect_refusal(older, "the connection of incarnation 6 after incarnation 7's HELLO",
                 "connected again as incarnation 7");
  fd = dial();
  ch = expect_challenge(fd);
  hello = make_hello(&ch, 0, 6);
  send_hello(fd, &hello);
  expect_refusal(fd, "HELLO of incarnation 6 after incarnation 7's", "newer one");
  pull(newer, now);
  printf("ok: incarnation 7 still served\n");
  close(newer);
  free(before);
  free(now);
  free(after1);
  free(g);
  ps_layout_close(&layout);
  ps_model_close(&model);
  return 0;
}
