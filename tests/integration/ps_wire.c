/* Talks to a running shard (shard 0 of the config given) over a real
 * socket: every kind of bad input gets an ERROR frame and a closed
 * connection while the shard keeps serving others with its state
 * unchanged, and a push re-sent with the same (worker, incarnation,
 * sequence) is acknowledged again but applied once. */
#include <sys/ioctl.h>

#include "common/endian.h"
#include "tests/integration/wire_peer.h"

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

/* A pull reply the reader does not take at once (a small receive window;
 * a slice larger than the shard's socket buffer) is written partly later,
 * while pushes change the slice: it is still the one version it names. */
static void slow_pull(float *before, float *now, const float *g) {
  int keep = good_client(1, 1);
  uint64_t vp = pull(keep, before);
  dial_rcvbuf = 4096;
  int slow = good_client(0, 8);
  dial_rcvbuf = 0;
  ps_msg pm = {.type = PS_MSG_PULL};
  send_msg(slow, &pm, ++req_id);
  uint64_t slow_req = req_id;
  /* The shard has started the reply once its first bytes arrive. */
  int queued = 0;
  for (int i = 0; i < 1000 && queued == 0; i++) {
    if (ioctl(slow, FIONREAD, &queued) != 0)
      die("FIONREAD: %s", strerror(errno));
    if (queued == 0)
      usleep(10000);
  }
  if (queued == 0)
    die("no byte of the pull reply arrived in 10 s");
  if ((size_t)queued >= slice * sizeof(float))
    die("the whole pull reply (%d bytes) arrived at once: the window is not small", queued);
  for (uint64_t seq = 1; seq <= 3; seq++)
    if (push(keep, 1, 1, seq, g).status != PS_PUSH_APPLIED)
      die("push %" PRIu64 " during the slow pull was not applied", seq);
  if (pull(keep, now) != vp + 3 || memcmp(now, before, slice * sizeof(float)) == 0)
    die("the pushes during the slow pull did not change the values");
  ps_msg sm;
  ps_frame_header sh;
  if (!read_msg(slow, &sm, &sh) || sm.type != PS_MSG_PULL_REPLY || sh.request_id != slow_req)
    die("expected the slow PULL_REPLY");
  if (sm.u.pull_reply.version != vp ||
      memcmp(sm.u.pull_reply.data, before, slice * sizeof(float)) != 0)
    die("the slow pull reply names version %" PRIu64 " (expected %" PRIu64 ") and its values %s",
        sm.u.pull_reply.version, vp,
        memcmp(sm.u.pull_reply.data, before, slice * sizeof(float)) ? "differ from that version's"
                                                                   : "are that version's");
  printf("ok: a pull reply read slowly (%d of %zu bytes at first) while 3 pushes were applied is "
         "version %" PRIu64 ", its values whole\n", queued, slice * sizeof(float), vp);
  close(slow);
  close(keep);
}

int main(int argc, char **argv) {
  if (argc != 2 && !(argc == 3 && strcmp(argv[2], "slow-pull") == 0))
    die("usage: ps_wire CONFIG [slow-pull]  (shard 0 of CONFIG running)");
  peer_setup(argv[1]);
  float *before = malloc(slice * sizeof(float)), *now = malloc(slice * sizeof(float));
  float *after1 = malloc(slice * sizeof(float)), *g = malloc(slice * sizeof(float));
  for (size_t i = 0; i < slice; i++)
    g[i] = (float)((i % 7) + 1) * 1e-3f;
  if (argc == 3) {
    slow_pull(before, now, g);
    goto out;
  }

  /* A good worker stays connected through every bad case below. */
  int keep = good_client(1, 1);
  ps_msg_stats_reply s0 = stats(keep);
  uint64_t v0 = pull(keep, before);

  uint8_t hb[PS_PROTO_HEADER_SIZE];
  int fd = dial();
  expect_challenge(fd);
  raw_header(hb, 0x12345678, PS_PROTO_VERSION, PS_MSG_PULL, 32);
  send_all(fd, hb, sizeof hb);
  expect_refusal(fd, "bad magic", "magic");

  fd = dial();
  expect_challenge(fd);
  raw_header(hb, PS_PROTO_MAGIC, 7, PS_MSG_PULL, 32);
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

  /* A PULL may carry keys and so be larger than 2048 bytes, but not before
   * the handshake: refused from its header. */
  fd = dial();
  expect_challenge(fd);
  raw_header(hb, PS_PROTO_MAGIC, PS_PROTO_VERSION, PS_MSG_PULL, 4000);
  send_all(fd, hb, sizeof hb);
  expect_refusal(fd, "a 4000-byte PULL before HELLO", "more than the cap of 2048");

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
  uint8_t shortpull[PS_PROTO_HEADER_SIZE + 31] = {0};
  raw_header(shortpull, PS_PROTO_MAGIC, PS_PROTO_VERSION, PS_MSG_PULL, 31);
  send_all(fd, shortpull, sizeof shortpull);
  expect_refusal(fd, "PULL with a 31-byte payload", "PULL");

  /* A sparse section the decoder refuses (a key twice), written by hand:
   * the encoder would not write it. */
  fd = good_client(0, 5);
  {
    uint8_t f[PS_PROTO_HEADER_SIZE + 32 + 32] = {0};
    raw_header(f, PS_PROTO_MAGIC, PS_PROTO_VERSION, PS_MSG_PULL, 32 + 32);
    uint8_t *p = f + PS_PROTO_HEADER_SIZE;
    ps_put_le64(p + 16, 32);      /* sparse: one block of 2 keys */
    ps_put_le32(p + 32 + 4, 4);   /* table 0, dim 4 */
    ps_put_le64(p + 32 + 8, 2);   /* n */
    ps_put_le64(p + 48, 7);
    ps_put_le64(p + 56, 7);
    send_all(fd, f, sizeof f);
  }
  expect_refusal(fd, "PULL asking for key 7 twice", "key 7 (row 1) not above key 7");

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

out:
  free(before);
  free(now);
  free(after1);
  free(g);
  peer_close();
  return 0;
}
