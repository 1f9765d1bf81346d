/* Tests of the wire codec: round trips of every message, every rejection PROTOCOL.md lists, and the auth proof. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/endian.h"
#include "proto/proto.h"

#define MAX_PAYLOAD (1u << 20)

/* ------------------------------------------------------------------------ */
/* Sample messages and helpers                                              */
/* ------------------------------------------------------------------------ */

static const float floats[5] = {1.5f, -2.25f, 0.0f, 3.0e38f, -1.0e-30f};

/* A valid message of `type` in which every field has a distinct value, so
 * that a field written at the wrong offset shows up. */
static void sample(int type, ps_msg *m) {
  memset(m, 0, sizeof *m);
  m->type = (ps_msg_type)type;
  switch (type) {
  case PS_MSG_CHALLENGE:
    for (int i = 0; i < PS_PROTO_NONCE_SIZE; i++)
      m->u.challenge.nonce[i] = (uint8_t)(0xa0 + i);
    m->u.challenge.role = PS_ROLE_PS;
    m->u.challenge.index = 0x01020304u;
    m->u.challenge.incarnation = 0x1112131415161718u;
    break;
  case PS_MSG_HELLO:
    m->u.hello.role = PS_ROLE_WORKER;
    m->u.hello.index = 7;
    m->u.hello.incarnation = 0x2122232425262728u;
    m->u.hello.layout_hash = 0xfedcba9876543210u;
    for (int i = 0; i < PS_PROTO_PROOF_SIZE; i++)
      m->u.hello.proof[i] = (uint8_t)(255 - i);
    strcpy(m->u.hello.cluster_id, "prod_A-1.x");
    break;
  case PS_MSG_WELCOME:
    m->u.welcome.index = 3;
    m->u.welcome.consistency = 2;
    m->u.welcome.incarnation = 0x3132333435363738u;
    m->u.welcome.layout_hash = 0x4142434445464748u;
    m->u.welcome.slice_floats = 123456789;
    m->u.welcome.version = 0x5152535455565758u;
    m->u.welcome.global_step = 0x6162636465666768u;
    m->u.welcome.max_payload = 0x71727374u;
    break;
  case PS_MSG_PULL:
    m->u.pull.worker = 0xdeadbeefu;
    m->u.pull.step = 0x8182838485868788u;
    break;
  case PS_MSG_PULL_REPLY:
    m->u.pull_reply.version = 11;
    m->u.pull_reply.global_step = 12;
    m->u.pull_reply.count = 5;
    m->u.pull_reply.data = (const uint8_t *)floats;
    break;
  case PS_MSG_PUSH:
    m->u.push.worker = 4;
    m->u.push.incarnation = 0x9192939495969798u;
    m->u.push.seq = 42;
    m->u.push.step = 41;
    m->u.push.count = 5;
    m->u.push.data = (const uint8_t *)floats;
    break;
  case PS_MSG_PUSH_ACK:
    m->u.push_ack.seq = 42;
    m->u.push_ack.version = 0xa1a2a3a4a5a6a7a8u;
    m->u.push_ack.global_step = 99;
    m->u.push_ack.status = PS_PUSH_DUPLICATE;
    break;
  case PS_MSG_STATS_REPLY: {
    ps_msg_stats_reply *s = &m->u.stats_reply;
    s->version = 1, s->global_step = 2, s->incarnation = 3, s->pushes_applied = 4;
    s->pushes_duplicate = 5, s->pushes_stale = 6, s->pulls = 7, s->bytes_in = 8;
    s->bytes_out = 9, s->clients = UINT64_MAX;
    break;
  }
  case PS_MSG_ERROR:
    m->u.error.code = PS_ELAYOUT;
    m->u.error.flags = PS_ERROR_RETRY;
    strcpy(m->u.error.message, "layout hash 0x12 does not match the shard's 0x34");
    break;
  case PS_MSG_PING:
  case PS_MSG_PONG:
    m->u.ping.token = 0xc1c2c3c4c5c6c7c8u;
    break;
  default: /* STATS */
    break;
  }
}

static void assert_msg_equal(const ps_msg *a, const ps_msg *b) {
  assert_int_equal(a->type, b->type);
  switch (a->type) {
  case PS_MSG_CHALLENGE:
    assert_memory_equal(a->u.challenge.nonce, b->u.challenge.nonce, PS_PROTO_NONCE_SIZE);
    assert_int_equal(a->u.challenge.role, b->u.challenge.role);
    assert_int_equal(a->u.challenge.index, b->u.challenge.index);
    assert_true(a->u.challenge.incarnation == b->u.challenge.incarnation);
    break;
  case PS_MSG_HELLO:
    assert_int_equal(a->u.hello.role, b->u.hello.role);
    assert_int_equal(a->u.hello.index, b->u.hello.index);
    assert_true(a->u.hello.incarnation == b->u.hello.incarnation);
    assert_true(a->u.hello.layout_hash == b->u.hello.layout_hash);
    assert_memory_equal(a->u.hello.proof, b->u.hello.proof, PS_PROTO_PROOF_SIZE);
    assert_string_equal(a->u.hello.cluster_id, b->u.hello.cluster_id);
    break;
  case PS_MSG_WELCOME:
    assert_int_equal(a->u.welcome.index, b->u.welcome.index);
    assert_int_equal(a->u.welcome.consistency, b->u.welcome.consistency);
    assert_true(a->u.welcome.incarnation == b->u.welcome.incarnation);
    assert_true(a->u.welcome.layout_hash == b->u.welcome.layout_hash);
    assert_true(a->u.welcome.slice_floats == b->u.welcome.slice_floats);
    assert_true(a->u.welcome.version == b->u.welcome.version);
    assert_true(a->u.welcome.global_step == b->u.welcome.global_step);
    assert_int_equal(a->u.welcome.max_payload, b->u.welcome.max_payload);
    break;
  case PS_MSG_PULL:
    assert_int_equal(a->u.pull.worker, b->u.pull.worker);
    assert_true(a->u.pull.step == b->u.pull.step);
    break;
  case PS_MSG_PULL_REPLY:
    assert_true(a->u.pull_reply.version == b->u.pull_reply.version);
    assert_true(a->u.pull_reply.global_step == b->u.pull_reply.global_step);
    assert_true(a->u.pull_reply.count == b->u.pull_reply.count);
    if (a->u.pull_reply.count > 0)
      assert_memory_equal(a->u.pull_reply.data, b->u.pull_reply.data, 4 * a->u.pull_reply.count);
    break;
  case PS_MSG_PUSH:
    assert_int_equal(a->u.push.worker, b->u.push.worker);
    assert_true(a->u.push.incarnation == b->u.push.incarnation);
    assert_true(a->u.push.seq == b->u.push.seq);
    assert_true(a->u.push.step == b->u.push.step);
    assert_true(a->u.push.count == b->u.push.count);
    if (a->u.push.count > 0)
      assert_memory_equal(a->u.push.data, b->u.push.data, 4 * a->u.push.count);
    break;
  case PS_MSG_PUSH_ACK:
    assert_true(a->u.push_ack.seq == b->u.push_ack.seq);
    assert_true(a->u.push_ack.version == b->u.push_ack.version);
    assert_true(a->u.push_ack.global_step == b->u.push_ack.global_step);
    assert_int_equal(a->u.push_ack.status, b->u.push_ack.status);
    break;
  case PS_MSG_STATS_REPLY:
    assert_memory_equal(&a->u.stats_reply, &b->u.stats_reply, sizeof a->u.stats_reply);
    break;
  case PS_MSG_ERROR:
    assert_int_equal(a->u.error.code, b->u.error.code);
    assert_int_equal(a->u.error.flags, b->u.error.flags);
    assert_string_equal(a->u.error.message, b->u.error.message);
    break;
  case PS_MSG_PING:
  case PS_MSG_PONG:
    assert_true(a->u.ping.token == b->u.ping.token);
    break;
  default:
    break;
  }
}

static _Alignas(16) uint8_t frame[4096];
static ps_errbuf eb;

/* Encode the sample of `type` into frame; returns the frame's length. */
static size_t encode_sample(int type, ps_msg *m) {
  sample(type, m);
  size_t n = ps_proto_encode(m, 0x0102030405060708u, frame, sizeof frame);
  assert_true(n >= PS_PROTO_HEADER_SIZE);
  return n;
}

/* Set the header's length field and decode frame as a receiver would:
 * header first, then exactly `length` payload bytes.  Returns the code. */
static int decode_frame(uint32_t length, ps_msg *out) {
  ps_frame_header h;
  ps_put_le32(frame + 20, length);
  memset(&eb, 0, sizeof eb);
  int rc = ps_proto_decode_header(frame, MAX_PAYLOAD, &h, &eb);
  if (rc != 0)
    return rc;
  return ps_proto_decode(&h, frame + PS_PROTO_HEADER_SIZE, length, out, &eb);
}

static void expect_reject(uint32_t length, int code, const char *needle) {
  ps_msg out;
  int rc = decode_frame(length, &out);
  if (rc != code || strstr(eb.msg, needle) == NULL || strchr(eb.msg, '\n') != NULL)
    fail_msg("expected %d with \"%s\", got %d: %s", code, needle, rc, eb.msg);
  assert_int_equal(eb.code, code);
}

/* ------------------------------------------------------------------------ */
/* Round trips                                                              */
/* ------------------------------------------------------------------------ */

static void test_roundtrip_every_type(void **state) {
  (void)state;
  for (int type = 1; type <= PS_MSG_TYPE_MAX; type++) {
    ps_msg m, out;
    size_t n = encode_sample(type, &m);
    ps_frame_header h;
    assert_int_equal(ps_proto_decode_header(frame, MAX_PAYLOAD, &h, &eb), 0);
    assert_int_equal(h.magic, PS_PROTO_MAGIC);
    assert_int_equal(h.version, PS_PROTO_VERSION);
    assert_int_equal(h.type, type);
    assert_int_equal(h.flags, 0);
    assert_true(h.request_id == 0x0102030405060708u);
    assert_int_equal(h.length, n - PS_PROTO_HEADER_SIZE);
    assert_int_equal(ps_proto_decode(&h, frame + PS_PROTO_HEADER_SIZE, h.length, &out, &eb), 0);
    assert_msg_equal(&m, &out);
    /* The exact sizes of PROTOCOL.md. */
    static const size_t want[PS_MSG_TYPE_MAX + 1] = {0, 48, 58 + 10, 56, 16, 32 + 20, 48 + 20,
                                                     32, 0, 80, 16 + 48, 8, 8};
    assert_int_equal(h.length, want[type]);
  }
}

static void test_header_bytes(void **state) {
  (void)state;
  ps_msg m;
  size_t n = encode_sample(PS_MSG_PING, &m);
  static const uint8_t want[32] = {'P', 'S', 'R', 'V', 1, 0, 11, 0, 0, 0, 0, 0, 8, 7, 6, 5,
                                   4,   3,   2,   1,   8, 0, 0,  0, 0xc8, 0xc7, 0xc6, 0xc5,
                                   0xc4, 0xc3, 0xc2, 0xc1};
  assert_int_equal(n, sizeof want);
  assert_memory_equal(frame, want, sizeof want);
}

static void test_empty_and_max_strings(void **state) {
  (void)state;
  ps_msg m, out;
  sample(PS_MSG_ERROR, &m);
  m.u.error.message[0] = '\0';
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), PS_PROTO_HEADER_SIZE + 16);
  assert_int_equal(decode_frame(16, &out), 0);
  assert_msg_equal(&m, &out);

  memset(m.u.error.message, 'x', PS_PROTO_ERROR_MSG_MAX);
  m.u.error.message[PS_PROTO_ERROR_MSG_MAX] = '\0';
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), PS_PROTO_HEADER_SIZE + 16 + 1024);
  assert_int_equal(decode_frame(16 + 1024, &out), 0);
  assert_msg_equal(&m, &out);

  sample(PS_MSG_HELLO, &m);
  memset(m.u.hello.cluster_id, 'c', PS_PROTO_CLUSTER_ID_MAX);
  m.u.hello.cluster_id[PS_PROTO_CLUSTER_ID_MAX] = '\0';
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), PS_PROTO_HEADER_SIZE + 58 + 63);
  assert_int_equal(decode_frame(58 + 63, &out), 0);
  assert_msg_equal(&m, &out);

  sample(PS_MSG_PUSH, &m);
  m.u.push.count = 0;
  m.u.push.data = NULL;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), PS_PROTO_HEADER_SIZE + 48);
  assert_int_equal(decode_frame(48, &out), 0);
  assert_msg_equal(&m, &out);
}

static void test_encode_prefix(void **state) {
  (void)state;
  static const int types[] = {PS_MSG_PULL_REPLY, PS_MSG_PUSH};
  for (size_t i = 0; i < 2; i++) {
    ps_msg m, out;
    size_t n = encode_sample(types[i], &m);
    uint8_t whole[512];
    memcpy(whole, frame, n);
    /* The prefix does not read the floats: a NULL pointer must do. */
    ps_msg bare = m;
    if (types[i] == PS_MSG_PUSH)
      bare.u.push.data = NULL;
    else
      bare.u.pull_reply.data = NULL;
    memset(frame, 0xee, sizeof frame);
    size_t np = ps_proto_encode_prefix(&bare, 0x0102030405060708u, frame);
    assert_int_equal(np, types[i] == PS_MSG_PUSH ? 72 : 56);
    assert_true(np <= PS_PROTO_PREFIX_MAX);
    memcpy(frame + np, floats, sizeof floats);
    assert_int_equal(np + sizeof floats, n);
    assert_memory_equal(frame, whole, n);
    assert_int_equal(decode_frame((uint32_t)(n - PS_PROTO_HEADER_SIZE), &out), 0);
    assert_msg_equal(&m, &out);
  }
  ps_msg m;
  sample(PS_MSG_PULL, &m);
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 0);
  sample(PS_MSG_PUSH, &m);
  m.u.push.count = UINT64_C(1) << 30;  /* 48 + 2^32 bytes: no 32-bit length */
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 0);
  m.u.push.count = (UINT32_MAX - 48) / 4;
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 72);
}

static void test_encode_too_small(void **state) {
  (void)state;
  for (int type = 1; type <= PS_MSG_TYPE_MAX; type++) {
    ps_msg m;
    size_t n = encode_sample(type, &m);
    assert_int_equal(ps_proto_encode(&m, 1, frame, n - 1), 0);
    assert_int_equal(ps_proto_encode(&m, 1, frame, 0), 0);
    assert_int_equal(ps_proto_encode(&m, 1, frame, n), n);
  }
}

static void test_encode_refuses_invalid(void **state) {
  (void)state;
  ps_msg m;
  sample(PS_MSG_HELLO, &m);
  m.u.hello.cluster_id[0] = '\0';
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  sample(PS_MSG_HELLO, &m);
  m.u.hello.cluster_id[2] = '/';
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  sample(PS_MSG_HELLO, &m);
  memset(m.u.hello.cluster_id, 'a', sizeof m.u.hello.cluster_id);  /* no NUL */
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  sample(PS_MSG_HELLO, &m);
  m.u.hello.role = 9;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  sample(PS_MSG_PUSH_ACK, &m);
  m.u.push_ack.status = 3;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  sample(PS_MSG_ERROR, &m);
  m.u.error.code = 0;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  sample(PS_MSG_PUSH, &m);
  m.u.push.data = NULL;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  m.type = (ps_msg_type)13;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
}

static void test_encode_sanitizes_error_message(void **state) {
  (void)state;
  ps_msg m, out;
  sample(PS_MSG_ERROR, &m);
  strcpy(m.u.error.message, "bad\nline\t\x7f\xc3\xa9");
  size_t n = ps_proto_encode(&m, 1, frame, sizeof frame);
  assert_int_equal(n, PS_PROTO_HEADER_SIZE + 16 + 12);
  assert_int_equal(decode_frame(16 + 12, &out), 0);
  assert_string_equal(out.u.error.message, "bad?line????");
  /* Longer than the cap: cut, not refused. */
  memset(m.u.error.message, 'y', sizeof m.u.error.message);
  n = ps_proto_encode(&m, 1, frame, sizeof frame);
  assert_int_equal(n, PS_PROTO_HEADER_SIZE + 16 + PS_PROTO_ERROR_MSG_MAX);
}

/* ------------------------------------------------------------------------ */
/* Header rejections                                                        */
/* ------------------------------------------------------------------------ */

static void test_bad_magic(void **state) {
  (void)state;
  ps_msg m;
  size_t n = encode_sample(PS_MSG_PULL, &m);
  memcpy(frame, "GET ", 4);
  expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EFORMAT,
                "bad magic 0x20544547, expected 0x56525350");
}

static void test_other_version(void **state) {
  (void)state;
  ps_msg m;
  size_t n = encode_sample(PS_MSG_PULL, &m);
  ps_put_le16(frame + 4, 2);
  expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EVERSION,
                "protocol version 2, expected version 1");
  ps_put_le16(frame + 4, 0);
  expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EVERSION, "version 0");
}

static void test_unknown_type(void **state) {
  (void)state;
  ps_msg m;
  encode_sample(PS_MSG_STATS, &m);
  ps_put_le16(frame + 6, 13);
  expect_reject(0, PS_EFORMAT, "unknown message type 13");
  ps_put_le16(frame + 6, 0);
  expect_reject(0, PS_EFORMAT, "unknown message type 0");
  /* decode refuses a header it did not accept, too. */
  ps_frame_header h = {.type = 99, .length = 0};
  ps_msg out;
  assert_int_equal(ps_proto_decode(&h, frame, 0, &out, &eb), PS_EFORMAT);
}

static void test_header_flags(void **state) {
  (void)state;
  ps_msg m;
  size_t n = encode_sample(PS_MSG_PUSH, &m);
  ps_put_le32(frame + 8, 0x80);
  expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EFORMAT,
                "PUSH: header flags are 0x80, expected 0");
}

static void test_payload_cap(void **state) {
  (void)state;
  ps_msg m;
  ps_frame_header h;
  encode_sample(PS_MSG_PING, &m);
  ps_put_le32(frame + 20, PS_PROTO_SMALL_PAYLOAD_MAX);
  assert_int_equal(ps_proto_decode_header(frame, MAX_PAYLOAD, &h, &eb), 0);
  expect_reject(PS_PROTO_SMALL_PAYLOAD_MAX + 1, PS_EFORMAT,
                "PING: payload is 2049 bytes, more than the cap of 2048");

  /* A float-carrying frame is held to the caller's cap instead. */
  encode_sample(PS_MSG_PUSH, &m);
  uint64_t cap = ps_proto_max_payload(5);
  assert_int_equal(cap, 48 + 20);
  ps_put_le32(frame + 20, 48 + 20);
  assert_int_equal(ps_proto_decode_header(frame, cap, &h, &eb), 0);
  ps_put_le32(frame + 20, 48 + 24);
  assert_int_equal(ps_proto_decode_header(frame, cap, &h, &eb), PS_EFORMAT);
  assert_non_null(strstr(eb.msg, "PUSH: payload is 72 bytes, more than the cap of 68"));
  encode_sample(PS_MSG_PULL_REPLY, &m);
  ps_put_le32(frame + 20, 4000);
  assert_int_equal(ps_proto_decode_header(frame, ps_proto_max_payload(5), &h, &eb), PS_EFORMAT);
  assert_non_null(strstr(eb.msg, "PULL_REPLY"));
  /* The small cap does not apply to floats. */
  assert_int_equal(ps_proto_decode_header(frame, ps_proto_max_payload(1000), &h, &eb), 0);
  assert_true(ps_proto_max_payload(UINT64_MAX / 2) == UINT64_MAX);
}

/* ------------------------------------------------------------------------ */
/* Payload rejections                                                       */
/* ------------------------------------------------------------------------ */

static void test_length_one_off(void **state) {
  (void)state;
  for (int type = 1; type <= PS_MSG_TYPE_MAX; type++) {
    for (int delta = -1; delta <= 1; delta += 2) {
      ps_msg m;
      size_t n = encode_sample(type, &m);
      uint32_t len = (uint32_t)(n - PS_PROTO_HEADER_SIZE);
      if (len == 0 && delta < 0)
        continue;
      frame[n] = 0;  /* the extra byte of the long case */
      char needle[64];
      snprintf(needle, sizeof needle, "%s: payload is %u bytes", ps_proto_type_name(type),
               len + delta);
      expect_reject(len + delta, PS_EFORMAT, needle);
    }
  }
}

static void test_length_mismatch_with_header(void **state) {
  (void)state;
  ps_msg m, out;
  size_t n = encode_sample(PS_MSG_PULL, &m);
  ps_frame_header h;
  assert_int_equal(ps_proto_decode_header(frame, MAX_PAYLOAD, &h, &eb), 0);
  assert_int_equal(ps_proto_decode(&h, frame + 24, n - 24 - 1, &out, &eb), PS_EFORMAT);
  assert_non_null(strstr(eb.msg, "header says 16"));
}

static void test_count_mismatch(void **state) {
  (void)state;
  ps_msg m;
  encode_sample(PS_MSG_PUSH, &m);
  ps_put_le64(frame + 24 + 32, 1);
  expect_reject(51, PS_EFORMAT, "PUSH: payload is 51 bytes, expected 48 + 4 * count (count 1) = 52");
  ps_put_le64(frame + 24 + 32, 6);
  expect_reject(48 + 20, PS_EFORMAT, "expected 48 + 4 * count (count 6) = 72");
  encode_sample(PS_MSG_PULL_REPLY, &m);
  ps_put_le64(frame + 24 + 16, 4);
  expect_reject(32 + 20, PS_EFORMAT,
                "PULL_REPLY: payload is 52 bytes, expected 32 + 4 * count (count 4) = 48");
}

static void test_count_overflow(void **state) {
  (void)state;
  ps_msg m;
  /* 4 * 2^62 wraps to 0 in 64 bits, so a careless check would accept an
   * empty tail and hand the server a count of 2^62. */
  encode_sample(PS_MSG_PUSH, &m);
  ps_put_le64(frame + 24 + 32, UINT64_C(1) << 62);
  expect_reject(48, PS_EFORMAT, "PUSH: payload is 48 bytes, expected 48 + 4 * count (count 4611686018427387904)");
  ps_put_le64(frame + 24 + 32, UINT64_MAX);
  expect_reject(48 + 20, PS_EFORMAT, "overflows");
  encode_sample(PS_MSG_PULL_REPLY, &m);
  ps_put_le64(frame + 24 + 16, UINT64_C(1) << 62);
  expect_reject(32, PS_EFORMAT, "PULL_REPLY: payload is 32 bytes");
}

static void test_nonzero_padding(void **state) {
  (void)state;
  static const struct {
    int type;
    int from, to;  /* inclusive payload offsets */
  } pads[] = {
      {PS_MSG_CHALLENGE, 33, 35}, {PS_MSG_HELLO, 1, 3},       {PS_MSG_WELCOME, 5, 7},
      {PS_MSG_WELCOME, 52, 55},   {PS_MSG_PULL, 4, 7},        {PS_MSG_PULL_REPLY, 24, 31},
      {PS_MSG_PUSH, 4, 7},        {PS_MSG_PUSH, 40, 47},      {PS_MSG_PUSH_ACK, 28, 31},
      {PS_MSG_ERROR, 10, 15},
  };
  for (size_t i = 0; i < sizeof pads / sizeof pads[0]; i++) {
    for (int off = pads[i].from; off <= pads[i].to; off++) {
      ps_msg m;
      size_t n = encode_sample(pads[i].type, &m);
      frame[PS_PROTO_HEADER_SIZE + off] = 0x01;
      char needle[64];
      snprintf(needle, sizeof needle, "%s: padding bytes %d..%d are not zero",
               ps_proto_type_name(pads[i].type), pads[i].from, pads[i].to);
      expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EFORMAT, needle);
    }
  }
}

static void test_bad_fields(void **state) {
  (void)state;
  ps_msg m;
  size_t n = encode_sample(PS_MSG_HELLO, &m);
  frame[24] = 0;
  expect_reject((uint32_t)(n - 24), PS_EFORMAT, "HELLO: role is 0, expected 1..4");
  n = encode_sample(PS_MSG_CHALLENGE, &m);
  frame[24 + 32] = 5;
  expect_reject((uint32_t)(n - 24), PS_EFORMAT, "CHALLENGE: role is 5");
  n = encode_sample(PS_MSG_PUSH_ACK, &m);
  ps_put_le32(frame + 24 + 24, 3);
  expect_reject((uint32_t)(n - 24), PS_EFORMAT, "PUSH_ACK: status is 3, expected 0..2");
  n = encode_sample(PS_MSG_ERROR, &m);
  ps_put_le32(frame + 24, 0);
  expect_reject((uint32_t)(n - 24), PS_EFORMAT, "ERROR: code is 0");
  n = encode_sample(PS_MSG_ERROR, &m);
  ps_put_le32(frame + 24 + 4, 2);
  expect_reject((uint32_t)(n - 24), PS_EFORMAT, "ERROR: flags are 0x2");
}

static void test_bad_cluster_id(void **state) {
  (void)state;
  static const char *const bad[] = {"ab!c", "a b", "x/y", "a\nb", "\xc3\xa9t\xc3\xa9", "ab:cd"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ps_msg m;
    encode_sample(PS_MSG_HELLO, &m);
    size_t len = strlen(bad[i]);
    ps_put_le16(frame + 24 + 56, (uint16_t)len);
    memcpy(frame + 24 + 58, bad[i], len);
    expect_reject((uint32_t)(58 + len), PS_EFORMAT, "HELLO: cluster id byte");
  }
  /* A NUL inside the id would cut it short on the receiver's side. */
  ps_msg m;
  encode_sample(PS_MSG_HELLO, &m);
  frame[24 + 58 + 3] = '\0';
  expect_reject(58 + 10, PS_EFORMAT, "HELLO: cluster id byte 3 is 0x00");
}

static void test_cluster_id_length(void **state) {
  (void)state;
  ps_msg m;
  encode_sample(PS_MSG_HELLO, &m);
  ps_put_le16(frame + 24 + 56, 0);
  expect_reject(58, PS_EFORMAT, "HELLO: cluster id length is 0, expected 1..63");
  encode_sample(PS_MSG_HELLO, &m);
  ps_put_le16(frame + 24 + 56, 64);
  memset(frame + 24 + 58, 'a', 64);
  expect_reject(58 + 64, PS_EFORMAT, "HELLO: cluster id length is 64, expected 1..63");
  encode_sample(PS_MSG_HELLO, &m);
  ps_put_le16(frame + 24 + 56, 9);
  expect_reject(58 + 10, PS_EFORMAT, "HELLO: payload is 68 bytes, expected 58 + cluster id length 9 = 67");
}

static void test_error_message(void **state) {
  (void)state;
  ps_msg m;
  size_t n = encode_sample(PS_MSG_ERROR, &m);
  frame[24 + 16 + 5] = '\n';
  expect_reject((uint32_t)(n - 24), PS_EFORMAT, "ERROR: message byte 5 is 0x0a");
  n = encode_sample(PS_MSG_ERROR, &m);
  frame[24 + 16] = '\0';
  expect_reject((uint32_t)(n - 24), PS_EFORMAT, "ERROR: message byte 0 is 0x00");
  encode_sample(PS_MSG_ERROR, &m);
  ps_put_le16(frame + 24 + 8, 1025);
  memset(frame + 24 + 16, 'z', 1025);
  expect_reject(16 + 1025, PS_EFORMAT, "ERROR: message length is 1025, expected at most 1024");
}

/* ------------------------------------------------------------------------ */
/* Authentication                                                           */
/* ------------------------------------------------------------------------ */

static const uint8_t key[] = "secret-key";  /* 10 bytes, hex 7365637265742d6b6579 */

static void vector_hello(uint8_t nonce[PS_PROTO_NONCE_SIZE], ps_msg_hello *h) {
  for (int i = 0; i < PS_PROTO_NONCE_SIZE; i++)
    nonce[i] = (uint8_t)i;
  memset(h, 0, sizeof *h);
  h->role = PS_ROLE_WORKER;
  h->index = 3;
  h->incarnation = 0x0102030405060708u;
  h->layout_hash = 0x1122334455667788u;
  strcpy(h->cluster_id, "test-cluster");
}

/* Computed independently, once, with OpenSSL's command line:
 *   printf '%s' 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
 *     01 03000000 0807060504030201 8877665544332211 746573742d636c7573746572
 *     | xxd -r -p | openssl dgst -sha256 -mac HMAC -macopt hexkey:7365637265742d6b6579
 * (one command line) * (nonce 00..1f, role 1, index 3, incarnation and layout hash little-endian,
 * cluster id "test-cluster", key "secret-key"). */
static void test_hmac_vector(void **state) {
  (void)state;
  static const uint8_t want[PS_PROTO_PROOF_SIZE] = {
      0x61, 0xd2, 0xed, 0x86, 0xec, 0xfc, 0xa3, 0xef, 0x5a, 0x30, 0x34,
      0xa8, 0xe6, 0x03, 0x19, 0xea, 0x1f, 0xef, 0xca, 0x5c, 0xdf, 0xce,
      0x5f, 0x75, 0xdb, 0x51, 0xbf, 0x61, 0x5f, 0x23, 0x0a, 0xb2};
  uint8_t nonce[PS_PROTO_NONCE_SIZE];
  ps_msg_hello h;
  vector_hello(nonce, &h);
  uint8_t proof[PS_PROTO_PROOF_SIZE];
  ps_proto_auth_proof(key, sizeof key - 1, nonce, &h, proof);
  assert_memory_equal(proof, want, sizeof want);
}

static void test_auth_check(void **state) {
  (void)state;
  uint8_t nonce[PS_PROTO_NONCE_SIZE];
  ps_msg_hello h;
  vector_hello(nonce, &h);
  ps_proto_auth_proof(key, sizeof key - 1, nonce, &h, h.proof);
  assert_int_equal(ps_proto_auth_check(key, sizeof key - 1, nonce, &h), 1);

  for (int bit = 0; bit < 8 * PS_PROTO_PROOF_SIZE; bit += 37) {
    ps_msg_hello f = h;
    f.proof[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    assert_int_equal(ps_proto_auth_check(key, sizeof key - 1, nonce, &f), 0);
  }
  uint8_t other_nonce[PS_PROTO_NONCE_SIZE];
  memcpy(other_nonce, nonce, sizeof other_nonce);
  other_nonce[31] ^= 1;
  assert_int_equal(ps_proto_auth_check(key, sizeof key - 1, other_nonce, &h), 0);
  static const uint8_t other_key[] = "secret-kez";
  assert_int_equal(ps_proto_auth_check(other_key, sizeof other_key - 1, nonce, &h), 0);
  assert_int_equal(ps_proto_auth_check(key, sizeof key - 2, nonce, &h), 0);

  ps_msg_hello o = h;
  o.index = 4;
  assert_int_equal(ps_proto_auth_check(key, sizeof key - 1, nonce, &o), 0);
  o = h;
  o.role = PS_ROLE_CHIEF;
  assert_int_equal(ps_proto_auth_check(key, sizeof key - 1, nonce, &o), 0);
  o = h;
  o.incarnation++;
  assert_int_equal(ps_proto_auth_check(key, sizeof key - 1, nonce, &o), 0);
  o = h;
  o.layout_hash ^= UINT64_C(1) << 63;
  assert_int_equal(ps_proto_auth_check(key, sizeof key - 1, nonce, &o), 0);
  o = h;
  strcpy(o.cluster_id, "test-clustex");
  assert_int_equal(ps_proto_auth_check(key, sizeof key - 1, nonce, &o), 0);

  /* An empty secret is a key like any other, not a crash. */
  ps_proto_auth_proof(NULL, 0, nonce, &h, h.proof);
  assert_int_equal(ps_proto_auth_check(NULL, 0, nonce, &h), 1);
  assert_int_equal(ps_proto_auth_check(key, sizeof key - 1, nonce, &h), 0);
}

static void test_names(void **state) {
  (void)state;
  assert_string_equal(ps_proto_type_name(PS_MSG_PUSH), "PUSH");
  assert_string_equal(ps_proto_type_name(PS_MSG_STATS_REPLY), "STATS_REPLY");
  assert_string_equal(ps_proto_type_name(PS_MSG_CHALLENGE), "CHALLENGE");
  assert_string_equal(ps_proto_type_name(PS_MSG_PONG), "PONG");
  assert_string_equal(ps_proto_type_name(0), "unknown");
  assert_string_equal(ps_proto_type_name(17), "unknown");
  assert_string_equal(ps_proto_type_name(-1), "unknown");
  assert_string_equal(ps_role_name(PS_ROLE_WORKER), "worker");
  assert_string_equal(ps_role_name(PS_ROLE_CHIEF), "chief");
  assert_string_equal(ps_role_name(PS_ROLE_PS), "ps");
  assert_string_equal(ps_role_name(PS_ROLE_TOOL), "tool");
  assert_string_equal(ps_role_name(0), "unknown");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_every_type),
      cmocka_unit_test(test_header_bytes),
      cmocka_unit_test(test_empty_and_max_strings),
      cmocka_unit_test(test_encode_prefix),
      cmocka_unit_test(test_encode_too_small),
      cmocka_unit_test(test_encode_refuses_invalid),
      cmocka_unit_test(test_encode_sanitizes_error_message),
      cmocka_unit_test(test_bad_magic),
      cmocka_unit_test(test_other_version),
      cmocka_unit_test(test_unknown_type),
      cmocka_unit_test(test_header_flags),
      cmocka_unit_test(test_payload_cap),
      cmocka_unit_test(test_length_one_off),
      cmocka_unit_test(test_length_mismatch_with_header),
      cmocka_unit_test(test_count_mismatch),
      cmocka_unit_test(test_count_overflow),
      cmocka_unit_test(test_nonzero_padding),
      cmocka_unit_test(test_bad_fields),
      cmocka_unit_test(test_bad_cluster_id),
      cmocka_unit_test(test_cluster_id_length),
      cmocka_unit_test(test_error_message),
      cmocka_unit_test(test_hmac_vector),
      cmocka_unit_test(test_auth_check),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
