/* A raw peer of a running shard for the wire tests (ps_wire.c,
 * chief_wire.c): reads the cluster config, dials shard 0 over a real socket,
 * and speaks frames by hand, so that a test can send what no well-behaved
 * client would.  Header-only: each test is its own program. */
#ifndef PS_TESTS_WIRE_PEER_H
#define PS_TESTS_WIRE_PEER_H

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

/* The role the HELLO claims: set by the test before it connects. */
static int peer_role = PS_ROLE_WORKER;

static ps_config cfg;
static ps_layout layout;
static uint8_t secret[4096];
static size_t secret_len;
static size_t slice;  /* floats in shard 0's slice */

static inline void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

/* SO_RCVBUF of the next connections, set before connecting so that the
 * window is small from the start (0: the kernel's default). */
static int dial_rcvbuf;

static inline int dial(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(cfg.ps[0].port)};
  inet_pton(AF_INET, cfg.ps[0].host, &a.sin_addr);
  if (fd >= 0 && dial_rcvbuf > 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &dial_rcvbuf, sizeof dial_rcvbuf);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
    die("connect to shard 0: %s", strerror(errno));
  struct timeval tv = {.tv_sec = 10};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static inline void send_all(int fd, const void *buf, size_t len) {
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
static inline int recv_all(int fd, void *buf, size_t len) {
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
static inline int read_msg(int fd, ps_msg *m, ps_frame_header *h) {
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

static inline void send_msg(int fd, const ps_msg *m, uint64_t req) {
  static uint8_t buf[64 << 20];
  size_t n = ps_proto_encode(m, req, buf, sizeof buf);
  if (n == 0)
    die("encode %s", ps_proto_type_name(m->type));
  send_all(fd, buf, n);
}

static inline ps_msg_challenge expect_challenge(int fd) {
  ps_msg m;
  ps_frame_header h;
  if (!read_msg(fd, &m, &h) || m.type != PS_MSG_CHALLENGE)
    die("expected CHALLENGE first");
  return m.u.challenge;
}

static inline ps_msg_hello make_hello(const ps_msg_challenge *ch, uint32_t worker, uint64_t inc) {
  ps_msg_hello hello = {.role = peer_role, .index = worker, .incarnation = inc,
                        .layout_hash = layout.hash};
  snprintf(hello.cluster_id, sizeof hello.cluster_id, "%s", cfg.cluster_id);
  ps_proto_auth_proof(secret, secret_len, ch->nonce, &hello, hello.proof);
  return hello;
}

static inline void send_hello(int fd, const ps_msg_hello *hello) {
  ps_msg m = {.type = PS_MSG_HELLO};
  m.u.hello = *hello;
  send_msg(fd, &m, 0);
}

/* A connected, authenticated peer of role peer_role. */
static inline int good_client(uint32_t worker, uint64_t inc) {
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
static inline void expect_refusal(int fd, const char *what, const char *want) {
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

/* Read the config, the secret and the layout: shard 0's slice. */
static ps_model model;

static inline void peer_setup(const char *config) {
  ps_errbuf eb = {0};
  if (ps_config_load(config, &cfg, &eb) != 0)
    die("%s", eb.msg);
  int n = ps_config_read_secret(&cfg, secret, sizeof secret, &eb);
  if (n < 0)
    die("%s", eb.msg);
  secret_len = (size_t)n;
  if (ps_layout_for_cluster(&cfg, &model, &layout, &eb) != 0)
    die("%s", eb.msg);
  slice = layout.shard_floats[0];
}

static inline void peer_close(void) {
  ps_layout_close(&layout);
  ps_model_close(&model);
}

#endif
