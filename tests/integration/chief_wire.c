/* Talks to a running shard (shard 0 of the config given) as the chief, over
 * a real socket: the shard refuses a chief frame with a fence token lower
 * than the highest it has seen (ERROR naming both, connection closed), and
 * serves a FETCH only from the image of its newest CUT, named by cut id and
 * token. */
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
  ps_msg_hello hello = {.role = PS_ROLE_CHIEF, .index = worker, .incarnation = inc,
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

/* A connected, authenticated chief. */
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

/* Send m and read its reply (or an ERROR). */
static ps_msg ask(int fd, ps_msg m) {
  send_msg(fd, &m, ++req_id);
  ps_frame_header h;
  if (!read_msg(fd, &m, &h))
    die("%s: connection closed without a reply", ps_proto_type_name(m.type));
  return m;
}

static void cut(int fd, uint64_t fence, uint64_t id) {
  ps_msg m = {.type = PS_MSG_CUT};
  m.u.cut = (ps_msg_cut){.fence = fence, .cut_id = id, .hold_ms = 2000};
  ps_msg r = ask(fd, m);
  if (r.type != PS_MSG_CUT_REPLY || r.u.cut_reply.cut_id != id)
    die("CUT %" PRIu64 " (token %" PRIu64 "): %s", id, fence,
        r.type == PS_MSG_ERROR ? r.u.error.message : ps_proto_type_name(r.type));
}

static void resume(int fd, uint64_t fence, uint64_t id) {
  ps_msg m = {.type = PS_MSG_RESUME};
  m.u.resume = (ps_msg_resume){.fence = fence, .cut_id = id};
  ps_msg r = ask(fd, m);
  if (r.type != PS_MSG_PONG || r.u.ping.token != id)
    die("RESUME %" PRIu64 ": %s", id, r.type == PS_MSG_ERROR ? r.u.error.message : "no PONG");
}

static ps_msg fetch_msg(uint64_t fence, uint64_t id) {
  ps_msg m = {.type = PS_MSG_FETCH};
  m.u.fetch = (ps_msg_fetch){.fence = fence, .cut_id = id, .offset = 0, .count = 1};
  return m;
}

static void fetch_ok(int fd, uint64_t fence, uint64_t id) {
  ps_msg r = ask(fd, fetch_msg(fence, id));
  if (r.type != PS_MSG_FETCH_REPLY || r.u.fetch_reply.cut_id != id || r.u.fetch_reply.count != 1)
    die("FETCH of cut %" PRIu64 " (token %" PRIu64 "): %s", id, fence,
        r.type == PS_MSG_ERROR ? r.u.error.message : ps_proto_type_name(r.type));
}

int main(int argc, char **argv) {
  if (argc != 2)
    die("usage: chief_wire CONFIG (shard 0 of CONFIG running, initialized)");
  ps_errbuf eb = {0};
  ps_model model;
  if (ps_config_load(argv[1], &cfg, &eb) != 0 ||
      ps_config_read_secret(&cfg, secret, sizeof secret, &eb) < 0)
    die("%s", eb.msg);
  secret_len = (size_t)ps_config_read_secret(&cfg, secret, sizeof secret, &eb);
  if (ps_layout_for_cluster(&cfg, &model, &layout, &eb) != 0)
    die("%s", eb.msg);
  slice = layout.shard_floats[0];

  /* Chief token 5 cuts, fetches and resumes. */
  int a = good_client(0, 5);
  cut(a, 5, 1);
  fetch_ok(a, 5, 1);
  resume(a, 5, 1);
  printf("ok: token 5: CUT, FETCH, RESUME of cut 1 served\n");

  /* An older token is refused, whatever the frame, and changes nothing. */
  static const int types[] = {PS_MSG_CUT, PS_MSG_RESUME, PS_MSG_FETCH, PS_MSG_STOP};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    int old = good_client(0, 4);
    ps_msg m = {.type = (ps_msg_type)types[i]};
    m.u.cut = (ps_msg_cut){.fence = 4, .cut_id = 1, .hold_ms = 2000};
    if (types[i] == PS_MSG_RESUME)
      m.u.resume = (ps_msg_resume){.fence = 4, .cut_id = 1};
    if (types[i] == PS_MSG_FETCH)
      m = fetch_msg(4, 1);
    if (types[i] == PS_MSG_STOP)
      m.u.stop = (ps_msg_stop){.fence = 4, .step = 1};
    send_msg(old, &m, ++req_id);
    char what[64], want[96];
    snprintf(what, sizeof what, "%s with token 4 after token 5", ps_proto_type_name(types[i]));
    snprintf(want, sizeof want, "%s with fence token 4, but this shard has seen token 5",
             ps_proto_type_name(types[i]));
    expect_refusal(old, what, want);
  }
  /* Token 5 is still served: the refusals changed nothing (no STOP). */
  fetch_ok(a, 5, 1);

  /* A FETCH of a cut the shard does not hold is refused. */
  send_msg(a, &(ps_msg){.type = PS_MSG_FETCH, .u.fetch = {.fence = 5, .cut_id = 2, .count = 1}},
           ++req_id);
  expect_refusal(a, "FETCH of cut 2, never cut", "holds cut 1 of token 5 only");

  /* A newer chief (token 6) numbers its cuts from 1 too: its FETCH of cut
   * 1 is not served from token 5's image, and once it has cut, token 5's
   * fetches are refused. */
  int b = good_client(0, 6);
  send_msg(b, &(ps_msg){.type = PS_MSG_FETCH, .u.fetch = {.fence = 6, .cut_id = 1, .count = 1}},
           ++req_id);
  expect_refusal(b, "FETCH of cut 1 by token 6, cut by token 5", "holds cut 1 of token 5 only");
  b = good_client(0, 6);
  cut(b, 6, 1);
  fetch_ok(b, 6, 1);
  resume(b, 6, 1);
  a = good_client(0, 5);
  send_msg(a, &(ps_msg){.type = PS_MSG_FETCH, .u.fetch = {.fence = 5, .cut_id = 1, .count = 1}},
           ++req_id);
  expect_refusal(a, "FETCH by token 5 after token 6 cut", "fence token 5, but this shard has seen token 6");
  close(b);
  ps_layout_close(&layout);
  ps_model_close(&model);
  return 0;
}
