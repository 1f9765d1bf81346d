/* Tests of the wire codec: round trips of every message, every rejection PROTOCOL.md lists, and the auth proof. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/endian.h"
#include "proto/proto.h"
#include "state_assert.h"

#define MAX_PAYLOAD (1u << 20)
/* The fence token of the sample chief -> shard frames. */
#define FENCE 0x9192939495969798u

/* ------------------------------------------------------------------------ */
/* Sample messages and helpers                                              */
/* ------------------------------------------------------------------------ */

static const float floats[5] = {1.5f, -2.25f, 0.0f, 3.0e38f, -1.0e-30f};

/* The state block of CUT_REPLY and LOAD, every field distinct. */
static void sample_state(ps_state_info *st) {
  st->version = 0x2122232425262728u;
  st->global_step = 0x3132333435363738u;
  st->image_floats = 0x0000414243444546u;
  st->nslots = 2;
  st->has_accum = 1;
  st->accum_count = 0x51525354u;
  st->target = 0x61626364u;
  st->nonce = 0x71727374u;
  st->table_floats = 0x0000818283848586u;
}

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
    s->flags = PS_STATS_INITIALIZED | PS_STATS_PAUSED;
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
  case PS_MSG_CUT:
    m->u.cut.fence = FENCE;
    m->u.cut.cut_id = 0xd1d2d3d4d5d6d7d8u;
    m->u.cut.hold_ms = 0xe1e2e3e4u;
    break;
  case PS_MSG_CUT_REPLY:
    m->u.cut_reply.cut_id = 0xd1d2d3d4d5d6d7d8u;
    sample_state(&m->u.cut_reply.state);
    break;
  case PS_MSG_RESUME:
    m->u.resume.fence = FENCE;
    m->u.resume.cut_id = 0xd1d2d3d4d5d6d7d8u;
    break;
  case PS_MSG_FETCH:
    m->u.fetch.fence = FENCE;
    m->u.fetch.cut_id = 0xd1d2d3d4d5d6d7d8u;
    m->u.fetch.offset = 0x0102030405060708u;
    m->u.fetch.count = 0x1112131415161718u;
    break;
  case PS_MSG_FETCH_REPLY:
    m->u.fetch_reply.cut_id = 0xd1d2d3d4d5d6d7d8u;
    m->u.fetch_reply.offset = 0x0102030405060708u;
    m->u.fetch_reply.count = 5;
    m->u.fetch_reply.data = (const uint8_t *)floats;
    break;
  case PS_MSG_LOAD:
    m->u.load.fence = FENCE;
    sample_state(&m->u.load.state);
    /* The last piece: it ends exactly at the end of the image. */
    m->u.load.offset = m->u.load.state.image_floats - 5;
    m->u.load.count = 5;
    m->u.load.data = (const uint8_t *)floats;
    break;
  case PS_MSG_STOP:
    m->u.stop.fence = FENCE;
    m->u.stop.step = 0xf1f2f3f4f5f6f7f8u;
    break;
  case PS_MSG_RING_JOIN:
    m->u.ring_join.epoch = 0xa1a2a3a4a5a6a7a8u;
    m->u.ring_join.step = 0xb1b2b3b4b5b6b7b8u;
    m->u.ring_join.rank = 0xc1c2c3c4u;
    break;
  case PS_MSG_RING_CHUNK:
    m->u.ring_chunk.epoch = 0xa1a2a3a4a5a6a7a8u;
    m->u.ring_chunk.step = 0xb1b2b3b4b5b6b7b8u;
    m->u.ring_chunk.phase = 0xc1c2c3c4u;
    m->u.ring_chunk.offset = 0x0102030405060708u;
    m->u.ring_chunk.count = 5;
    m->u.ring_chunk.data = (const uint8_t *)floats;
    break;
  default: /* STATS */
    break;
  }
}

/* Point a float-carrying message at data. */
static void set_float_data(ps_msg *m, const uint8_t *data) {
  switch (m->type) {
  case PS_MSG_PULL_REPLY: m->u.pull_reply.data = data; break;
  case PS_MSG_PUSH: m->u.push.data = data; break;
  case PS_MSG_FETCH_REPLY: m->u.fetch_reply.data = data; break;
  case PS_MSG_LOAD: m->u.load.data = data; break;
  case PS_MSG_RING_CHUNK: m->u.ring_chunk.data = data; break;
  default: fail_msg("%s carries no floats", ps_proto_type_name(m->type));
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
  case PS_MSG_RING_JOIN:
    assert_true(a->u.ring_join.epoch == b->u.ring_join.epoch);
    assert_true(a->u.ring_join.step == b->u.ring_join.step);
    assert_int_equal(a->u.ring_join.rank, b->u.ring_join.rank);
    break;
  case PS_MSG_RING_CHUNK:
    assert_true(a->u.ring_chunk.epoch == b->u.ring_chunk.epoch);
    assert_true(a->u.ring_chunk.step == b->u.ring_chunk.step);
    assert_int_equal(a->u.ring_chunk.phase, b->u.ring_chunk.phase);
    assert_true(a->u.ring_chunk.offset == b->u.ring_chunk.offset);
    assert_true(a->u.ring_chunk.count == b->u.ring_chunk.count);
    assert_memory_equal(a->u.ring_chunk.data, b->u.ring_chunk.data, 4 * a->u.ring_chunk.count);
    break;
  case PS_MSG_PULL:
    assert_int_equal(a->u.pull.worker, b->u.pull.worker);
    assert_true(a->u.pull.step == b->u.pull.step);
    assert_true(a->u.pull.sparse.bytes == b->u.pull.sparse.bytes);
    if (a->u.pull.sparse.bytes > 0)
      assert_memory_equal(a->u.pull.sparse.data, b->u.pull.sparse.data, a->u.pull.sparse.bytes);
    break;
  case PS_MSG_PULL_REPLY:
    assert_true(a->u.pull_reply.version == b->u.pull_reply.version);
    assert_true(a->u.pull_reply.global_step == b->u.pull_reply.global_step);
    assert_true(a->u.pull_reply.count == b->u.pull_reply.count);
    if (a->u.pull_reply.count > 0)
      assert_memory_equal(a->u.pull_reply.data, b->u.pull_reply.data, 4 * a->u.pull_reply.count);
    assert_true(a->u.pull_reply.sparse.bytes == b->u.pull_reply.sparse.bytes);
    if (a->u.pull_reply.sparse.bytes > 0)
      assert_memory_equal(a->u.pull_reply.sparse.data, b->u.pull_reply.sparse.data,
                          a->u.pull_reply.sparse.bytes);
    break;
  case PS_MSG_PUSH:
    assert_int_equal(a->u.push.worker, b->u.push.worker);
    assert_true(a->u.push.incarnation == b->u.push.incarnation);
    assert_true(a->u.push.seq == b->u.push.seq);
    assert_true(a->u.push.step == b->u.push.step);
    assert_true(a->u.push.count == b->u.push.count);
    if (a->u.push.count > 0)
      assert_memory_equal(a->u.push.data, b->u.push.data, 4 * a->u.push.count);
    assert_true(a->u.push.sparse.bytes == b->u.push.sparse.bytes);
    if (a->u.push.sparse.bytes > 0)
      assert_memory_equal(a->u.push.sparse.data, b->u.push.sparse.data, a->u.push.sparse.bytes);
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
  case PS_MSG_RESUME:
    assert_true(a->u.resume.fence == b->u.resume.fence);
    assert_true(a->u.resume.cut_id == b->u.resume.cut_id);
    break;
  case PS_MSG_CUT:
    assert_true(a->u.cut.fence == b->u.cut.fence);
    assert_true(a->u.cut.cut_id == b->u.cut.cut_id);
    assert_int_equal(a->u.cut.hold_ms, b->u.cut.hold_ms);
    break;
  case PS_MSG_CUT_REPLY:
    assert_true(a->u.cut_reply.cut_id == b->u.cut_reply.cut_id);
    assert_state_equal(&a->u.cut_reply.state, &b->u.cut_reply.state);
    break;
  case PS_MSG_FETCH:
    assert_true(a->u.fetch.fence == b->u.fetch.fence);
    assert_true(a->u.fetch.cut_id == b->u.fetch.cut_id);
    assert_true(a->u.fetch.offset == b->u.fetch.offset);
    assert_true(a->u.fetch.count == b->u.fetch.count);
    break;
  case PS_MSG_FETCH_REPLY:
    assert_true(a->u.fetch_reply.cut_id == b->u.fetch_reply.cut_id);
    assert_true(a->u.fetch_reply.offset == b->u.fetch_reply.offset);
    assert_true(a->u.fetch_reply.count == b->u.fetch_reply.count);
    if (a->u.fetch_reply.count > 0)
      assert_memory_equal(a->u.fetch_reply.data, b->u.fetch_reply.data,
                          4 * a->u.fetch_reply.count);
    break;
  case PS_MSG_LOAD:
    assert_true(a->u.load.fence == b->u.load.fence);
    assert_state_equal(&a->u.load.state, &b->u.load.state);
    assert_true(a->u.load.offset == b->u.load.offset);
    assert_true(a->u.load.count == b->u.load.count);
    if (a->u.load.count > 0)
      assert_memory_equal(a->u.load.data, b->u.load.data, 4 * a->u.load.count);
    break;
  case PS_MSG_STOP:
    assert_true(a->u.stop.fence == b->u.stop.fence);
    assert_true(a->u.stop.step == b->u.stop.step);
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
    static const size_t want[PS_MSG_TYPE_MAX + 1] = {
        0,       48,      58 + 10, 56, 32,      32 + 20, 48 + 20, 32, 0, 88, 16 + 48, 8, 8,
        /* CUT */ 24, 72, 16,      32, 32 + 20, 96 + 20, 16,
        /* RING_JOIN */ 24, 48 + 20};
    assert_int_equal(h.length, want[type]);
  }
}

/* The offsets of PROTOCOL.md's tables for the chief's messages (version 4), read back
 * from the encoded bytes rather than through the decoder, so that a field
 * that the encoder and the decoder both put at the same wrong offset shows
 * up. */
static void test_v3_payload_bytes(void **state) {
  (void)state;
  ps_msg m;
  const uint8_t *p = frame + PS_PROTO_HEADER_SIZE;

  encode_sample(PS_MSG_STATS_REPLY, &m);
  for (int i = 0; i < 9; i++)
    assert_true(ps_get_le64(p + 8 * i) == (uint64_t)(i + 1));
  assert_true(ps_get_le64(p + 72) == UINT64_MAX);
  assert_true(ps_get_le64(p + 80) == 3);

  encode_sample(PS_MSG_CUT, &m);
  assert_true(ps_get_le64(p) == FENCE);
  assert_true(ps_get_le64(p + 8) == 0xd1d2d3d4d5d6d7d8u);
  assert_int_equal(ps_get_le32(p + 16), 0xe1e2e3e4u);
  assert_int_equal(ps_get_le32(p + 20), 0);

  /* The state block: at 8 in CUT_REPLY, at 16 in LOAD. */
  static const struct {
    int type;
    size_t at;
  } blocks[] = {{PS_MSG_CUT_REPLY, 8}, {PS_MSG_LOAD, 16}};
  for (size_t i = 0; i < 2; i++) {
    encode_sample(blocks[i].type, &m);
    const uint8_t *b = p + blocks[i].at;
    assert_true(ps_get_le64(b) == 0x2122232425262728u);
    assert_true(ps_get_le64(b + 8) == 0x3132333435363738u);
    assert_true(ps_get_le64(b + 16) == 0x0000414243444546u);
    assert_int_equal(ps_get_le32(b + 24), 2);
    assert_int_equal(ps_get_le32(b + 28), 1);
    assert_int_equal(ps_get_le32(b + 32), 0x51525354u);
    assert_int_equal(ps_get_le32(b + 36), 0x61626364u);
    assert_int_equal(ps_get_le32(b + 40), 0x71727374u);
    assert_true(ps_get_le64(b + 44) == 0x0000818283848586u);
    for (int z = 52; z < 64; z++)
      assert_int_equal(b[z], 0);
  }
  encode_sample(PS_MSG_CUT_REPLY, &m);
  assert_true(ps_get_le64(p) == 0xd1d2d3d4d5d6d7d8u);

  encode_sample(PS_MSG_RESUME, &m);
  assert_true(ps_get_le64(p) == FENCE);
  assert_true(ps_get_le64(p + 8) == 0xd1d2d3d4d5d6d7d8u);

  encode_sample(PS_MSG_FETCH, &m);
  assert_true(ps_get_le64(p) == FENCE);
  assert_true(ps_get_le64(p + 8) == 0xd1d2d3d4d5d6d7d8u);
  assert_true(ps_get_le64(p + 16) == 0x0102030405060708u);
  assert_true(ps_get_le64(p + 24) == 0x1112131415161718u);

  encode_sample(PS_MSG_FETCH_REPLY, &m);
  assert_true(ps_get_le64(p) == 0xd1d2d3d4d5d6d7d8u);
  assert_true(ps_get_le64(p + 8) == 0x0102030405060708u);
  assert_true(ps_get_le64(p + 16) == 5);
  assert_true(ps_get_le64(p + 24) == 0);
  assert_memory_equal(p + 32, floats, sizeof floats);

  encode_sample(PS_MSG_LOAD, &m);
  assert_true(ps_get_le64(p) == FENCE);
  assert_true(ps_get_le64(p + 8) == 0);
  assert_true(ps_get_le64(p + 80) == 0x0000414243444546u - 5);
  assert_true(ps_get_le64(p + 88) == 5);
  assert_memory_equal(p + 96, floats, sizeof floats);

  encode_sample(PS_MSG_STOP, &m);
  assert_true(ps_get_le64(p) == FENCE);
  assert_true(ps_get_le64(p + 8) == 0xf1f2f3f4f5f6f7f8u);
}

/* PROTOCOL.md's test vector of a fenced frame: CUT, fence token 7, cut 3,
 * hold_ms 1500, request id 1. */
static void test_fence_vector(void **state) {
  (void)state;
  ps_msg m = {.type = PS_MSG_CUT};
  m.u.cut = (ps_msg_cut){.fence = 7, .cut_id = 3, .hold_ms = 1500};
  static const uint8_t want[48] = {
      'P', 'S', 'R', 'V', 4, 0, 13, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 24, 0, 0, 0,
      7,   0,   0,   0,   0, 0, 0,  0, 3, 0, 0, 0, 0, 0, 0, 0, 0xdc, 0x05, 0, 0, 0, 0, 0, 0};
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), sizeof want);
  assert_memory_equal(frame, want, sizeof want);
  ps_msg out;
  assert_int_equal(decode_frame(24, &out), 0);
  assert_true(out.u.cut.fence == 7 && out.u.cut.cut_id == 3 && out.u.cut.hold_ms == 1500);
  assert_true(ps_proto_fence(&out) == 7);
  assert_int_equal(ps_proto_set_fence(&out, 9), 0);
  assert_true(out.u.cut.fence == 9);
  out.type = PS_MSG_PUSH;
  assert_int_equal(ps_proto_set_fence(&out, 9), -1);
  assert_true(ps_proto_fence(&out) == 0);
}

static void test_header_bytes(void **state) {
  (void)state;
  ps_msg m;
  size_t n = encode_sample(PS_MSG_PING, &m);
  static const uint8_t want[32] = {'P', 'S', 'R', 'V', 4, 0, 11, 0, 0, 0, 0, 0, 8, 7, 6, 5,
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
  /* Prefix = header + fixed part. */
  static const struct {
    int type;
    size_t prefix;
  } types[] = {{PS_MSG_PULL_REPLY, 24 + 32},
               {PS_MSG_PUSH, 24 + 48},
               {PS_MSG_FETCH_REPLY, 24 + 32},
               {PS_MSG_LOAD, 24 + 96}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    ps_msg m, out;
    size_t n = encode_sample(types[i].type, &m);
    uint8_t whole[512];
    memcpy(whole, frame, n);
    /* The prefix does not read the floats: a NULL pointer must do. */
    ps_msg bare = m;
    set_float_data(&bare, NULL);
    memset(frame, 0xee, sizeof frame);
    size_t np = ps_proto_encode_prefix(&bare, 0x0102030405060708u, frame);
    assert_int_equal(np, types[i].prefix);
    assert_true(np <= PS_PROTO_PREFIX_MAX);
    assert_int_equal((np - PS_PROTO_HEADER_SIZE) % 16, 0);  /* floats 16-byte aligned */
    memcpy(frame + np, floats, sizeof floats);
    assert_int_equal(np + sizeof floats, n);
    assert_memory_equal(frame, whole, n);
    assert_int_equal(decode_frame((uint32_t)(n - PS_PROTO_HEADER_SIZE), &out), 0);
    assert_msg_equal(&m, &out);
  }
  ps_msg m;
  static const int not_float[] = {PS_MSG_PULL, PS_MSG_CUT, PS_MSG_CUT_REPLY, PS_MSG_FETCH,
                                  PS_MSG_STATS_REPLY, PS_MSG_RESUME, PS_MSG_STOP};
  for (size_t i = 0; i < sizeof not_float / sizeof not_float[0]; i++) {
    sample(not_float[i], &m);
    assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 0);
  }
  sample(PS_MSG_PUSH, &m);
  m.u.push.count = UINT64_C(1) << 30;  /* 48 + 2^32 bytes: no 32-bit length */
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 0);
  m.u.push.count = (UINT32_MAX - 48) / 4;
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 72);
  sample(PS_MSG_FETCH_REPLY, &m);
  m.u.fetch_reply.count = (UINT32_MAX - 32) / 4 + 1;
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 0);
  m.u.fetch_reply.count = (UINT32_MAX - 32) / 4;
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 56);
  sample(PS_MSG_LOAD, &m);  /* an image of ~2^46 floats: the bound is the length */
  m.u.load.offset = 0;
  m.u.load.count = (UINT32_MAX - 96) / 4 + 1;
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 0);
  m.u.load.count = (UINT32_MAX - 96) / 4;
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 120);
  /* The prefix is held to LOAD's rules, too. */
  m.u.load.offset = m.u.load.state.image_floats - m.u.load.count + 1;
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 0);
  m.u.load.offset = 0;
  m.u.load.state.nslots = 3;
  assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 0);
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
  sample(PS_MSG_STATS_REPLY, &m);
  m.u.stats_reply.flags = 0x4;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  m.u.stats_reply.flags = UINT64_C(1) << 63;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  sample(PS_MSG_FETCH_REPLY, &m);
  m.u.fetch_reply.data = NULL;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  sample(PS_MSG_LOAD, &m);
  m.u.load.data = NULL;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  m.type = (ps_msg_type)(PS_MSG_TYPE_MAX + 1);
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  m.type = (ps_msg_type)0;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);

  /* The state block of CUT_REPLY and LOAD: at most 2 slots, has_accum 0 or 1. */
  static const int with_state[] = {PS_MSG_CUT_REPLY, PS_MSG_LOAD};
  for (size_t i = 0; i < 2; i++) {
    sample(with_state[i], &m);
    ps_state_info *st = with_state[i] == PS_MSG_LOAD ? &m.u.load.state : &m.u.cut_reply.state;
    st->nslots = 3;
    assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
    st->nslots = UINT32_MAX;
    assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
    st->nslots = 0;
    st->has_accum = 2;
    assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
    st->has_accum = 0;
    assert_true(ps_proto_encode(&m, 1, frame, sizeof frame) > 0);
  }

  /* A LOAD piece must lie within its image: offset + count <= image_floats. */
  sample(PS_MSG_LOAD, &m);
  m.u.load.offset++;  /* one float past the end */
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  m.u.load.offset = m.u.load.state.image_floats + 1;
  m.u.load.count = 0;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  m.u.load.offset = UINT64_MAX;  /* offset + count wraps to 4 */
  m.u.load.count = 5;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  m.u.load.offset = 0;
  m.u.load.state.image_floats = 4;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
  m.u.load.state.image_floats = 5;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), PS_PROTO_HEADER_SIZE + 96 + 20);
  /* An empty piece at the very end is within the image. */
  m.u.load.offset = 5;
  m.u.load.count = 0;
  m.u.load.data = NULL;
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), PS_PROTO_HEADER_SIZE + 96);

  /* Every chief -> shard frame needs a fence token: 0 is refused. */
  static const int fenced[] = {PS_MSG_CUT, PS_MSG_RESUME, PS_MSG_FETCH, PS_MSG_LOAD, PS_MSG_STOP};
  for (size_t i = 0; i < sizeof fenced / sizeof fenced[0]; i++) {
    sample(fenced[i], &m);
    assert_true(ps_proto_encode(&m, 1, frame, sizeof frame) > 0);
    /* The fence is the first u64 of each of them. */
    uint64_t *fence = fenced[i] == PS_MSG_CUT      ? &m.u.cut.fence
                      : fenced[i] == PS_MSG_RESUME ? &m.u.resume.fence
                      : fenced[i] == PS_MSG_FETCH  ? &m.u.fetch.fence
                      : fenced[i] == PS_MSG_LOAD   ? &m.u.load.fence
                                                   : &m.u.stop.fence;
    *fence = 0;
    assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
    if (fenced[i] == PS_MSG_LOAD)
      assert_int_equal(ps_proto_encode_prefix(&m, 1, frame), 0);
  }
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
  /* A version-1 peer is refused, with both versions named. */
  ps_put_le16(frame + 4, 1);
  expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EVERSION,
                "protocol version 1, expected version 4");
  /* So is version 2, whose chief frames carried no fence token. */
  ps_put_le16(frame + 4, 2);
  expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EVERSION,
                "protocol version 2, expected version 4");
  /* And version 3, whose PULL had no keys and whose state block had no tables. */
  ps_put_le16(frame + 4, 3);
  expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EVERSION,
                "protocol version 3, expected version 4");
  ps_put_le16(frame + 4, 5);
  expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EVERSION,
                "protocol version 5, expected version 4");
  ps_put_le16(frame + 4, 0);
  expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EVERSION, "version 0");
  /* Version 1's 80-byte STATS_REPLY, should one get past the header. */
  n = encode_sample(PS_MSG_STATS_REPLY, &m);
  assert_int_equal(n, PS_PROTO_HEADER_SIZE + 88);
  expect_reject(80, PS_EFORMAT, "STATS_REPLY: payload is 80 bytes, expected 88");
}

static void test_unknown_type(void **state) {
  (void)state;
  ps_msg m;
  encode_sample(PS_MSG_STATS, &m);
  ps_put_le16(frame + 6, 22);
  expect_reject(0, PS_EFORMAT, "unknown message type 22, expected 1..21");
  ps_put_le16(frame + 6, 0xffff);
  expect_reject(0, PS_EFORMAT, "unknown message type 65535");
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

  /* The version-2 control messages carry no floats: the small cap. */
  static const int small[] = {PS_MSG_CUT, PS_MSG_CUT_REPLY, PS_MSG_RESUME, PS_MSG_FETCH,
                              PS_MSG_STOP, PS_MSG_STATS_REPLY};
  for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
    encode_sample(small[i], &m);
    ps_put_le32(frame + 20, PS_PROTO_SMALL_PAYLOAD_MAX + 1);
    assert_int_equal(ps_proto_decode_header(frame, MAX_PAYLOAD, &h, &eb), PS_EFORMAT);
    char needle[96];
    snprintf(needle, sizeof needle, "%s: payload is 2049 bytes, more than the cap of 2048",
             ps_proto_type_name(small[i]));
    assert_non_null(strstr(eb.msg, needle));
  }

  /* A float-carrying frame (and a PULL, whose keys may be many) is held to
   * the caller's cap instead: 96 (LOAD's fixed part, the largest) + 4 *
   * floats. */
  uint64_t cap = ps_proto_max_payload(5);
  assert_int_equal(cap, 96 + 20);
  assert_int_equal(ps_proto_max_payload(0), 96);
  assert_int_equal(ps_proto_max_payload_sparse(5, 1000), 96 + 20 + 1000);
  assert_true(ps_proto_max_payload_sparse(5, UINT64_MAX - 10) == UINT64_MAX);
  static const int with_floats[] = {PS_MSG_PULL_REPLY, PS_MSG_PUSH, PS_MSG_FETCH_REPLY,
                                    PS_MSG_LOAD, PS_MSG_PULL};
  for (size_t i = 0; i < sizeof with_floats / sizeof with_floats[0]; i++) {
    encode_sample(with_floats[i], &m);
    ps_put_le32(frame + 20, 96 + 20);
    assert_int_equal(ps_proto_decode_header(frame, cap, &h, &eb), 0);
    ps_put_le32(frame + 20, 96 + 21);
    assert_int_equal(ps_proto_decode_header(frame, cap, &h, &eb), PS_EFORMAT);
    char needle[96];
    snprintf(needle, sizeof needle, "%s: payload is 117 bytes, more than the cap of 116",
             ps_proto_type_name(with_floats[i]));
    assert_non_null(strstr(eb.msg, needle));
    /* The small cap does not apply to floats. */
    ps_put_le32(frame + 20, 4000);
    assert_int_equal(ps_proto_decode_header(frame, ps_proto_max_payload(5), &h, &eb),
                     PS_EFORMAT);
    assert_int_equal(ps_proto_decode_header(frame, ps_proto_max_payload(1000), &h, &eb), 0);
  }
  /* A whole LOAD piece of a slice fits the slice's cap. */
  ps_msg load;
  sample(PS_MSG_LOAD, &load);
  load.u.load.offset = 0;
  load.u.load.count = 5;
  assert_int_equal(ps_proto_encode(&load, 1, frame, sizeof frame), 24 + ps_proto_max_payload(5));
  assert_true(ps_proto_max_payload((UINT64_MAX - 96) / 4) == UINT64_MAX - 3);
  assert_true(ps_proto_max_payload((UINT64_MAX - 96) / 4 + 1) == UINT64_MAX);
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
  assert_non_null(strstr(eb.msg, "header says 32"));
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
  encode_sample(PS_MSG_FETCH_REPLY, &m);
  ps_put_le64(frame + 24 + 16, 6);
  expect_reject(32 + 20, PS_EFORMAT,
                "FETCH_REPLY: payload is 52 bytes, expected 32 + 4 * count (count 6) = 56");
  expect_reject(32 + 22, PS_EFORMAT,
                "FETCH_REPLY: payload is 54 bytes, expected 32 + 4 * count (count 6) = 56");
  encode_sample(PS_MSG_LOAD, &m);
  ps_put_le64(frame + 24 + 88, 4);
  expect_reject(96 + 20, PS_EFORMAT,
                "LOAD: payload is 116 bytes, expected 96 + 4 * count (count 4) = 112");
  expect_reject(96 + 17, PS_EFORMAT, "LOAD: payload is 113 bytes, expected 96 + 4 * count");
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
  encode_sample(PS_MSG_FETCH_REPLY, &m);
  ps_put_le64(frame + 24 + 16, UINT64_C(1) << 62);
  expect_reject(32, PS_EFORMAT,
                "FETCH_REPLY: payload is 32 bytes, expected 32 + 4 * count "
                "(count 4611686018427387904)");
  ps_put_le64(frame + 24 + 16, UINT64_MAX);
  expect_reject(32 + 20, PS_EFORMAT, "overflows");
  /* LOAD's count is checked against the bytes before the image bounds. */
  encode_sample(PS_MSG_LOAD, &m);
  ps_put_le64(frame + 24 + 32, UINT64_MAX);  /* image_floats */
  ps_put_le64(frame + 24 + 88, UINT64_C(1) << 62);
  expect_reject(96, PS_EFORMAT,
                "LOAD: payload is 96 bytes, expected 96 + 4 * count (count 4611686018427387904)");
  ps_put_le64(frame + 24 + 88, UINT64_MAX);
  expect_reject(96 + 20, PS_EFORMAT,
                "LOAD: payload is 116 bytes, expected 96 + 4 * count (count 18446744073709551615), "
                "which overflows");
}

static void test_nonzero_padding(void **state) {
  (void)state;
  static const struct {
    int type;
    int from, to;  /* inclusive payload offsets */
  } pads[] = {
      {PS_MSG_CHALLENGE, 33, 35}, {PS_MSG_HELLO, 1, 3},       {PS_MSG_WELCOME, 5, 7},
      {PS_MSG_WELCOME, 52, 55},   {PS_MSG_PULL, 4, 7},        {PS_MSG_PULL, 24, 31},
      {PS_MSG_PUSH, 4, 7},        {PS_MSG_PUSH_ACK, 28, 31},
      {PS_MSG_ERROR, 10, 15},     {PS_MSG_CUT, 20, 23},       {PS_MSG_CUT_REPLY, 60, 71},
      {PS_MSG_FETCH_REPLY, 24, 31}, {PS_MSG_LOAD, 8, 15},     {PS_MSG_LOAD, 68, 79},
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
  /* Every chief -> shard frame starts with a fence token, never 0. */
  static const int fenced[] = {PS_MSG_CUT, PS_MSG_RESUME, PS_MSG_FETCH, PS_MSG_LOAD, PS_MSG_STOP};
  for (size_t i = 0; i < sizeof fenced / sizeof fenced[0]; i++) {
    n = encode_sample(fenced[i], &m);
    ps_put_le64(frame + 24, 0);
    char needle[128];
    snprintf(needle, sizeof needle, "%s: fence token is 0, expected the chief's lease token",
             ps_proto_type_name(fenced[i]));
    expect_reject((uint32_t)(n - 24), PS_EFORMAT, needle);
    /* Any other value is a token (the shard, not the decoder, compares it). */
    n = encode_sample(fenced[i], &m);
    ps_put_le64(frame + 24, 1);
    ps_msg out;
    assert_int_equal(decode_frame((uint32_t)(n - 24), &out), 0);
  }
}

/* nslots and has_accum of the state block of CUT_REPLY (at 8) and LOAD (at 16). */
static void test_bad_state(void **state) {
  (void)state;
  static const struct {
    int type;
    size_t at;
  } blocks[] = {{PS_MSG_CUT_REPLY, 8}, {PS_MSG_LOAD, 16}};
  for (size_t i = 0; i < 2; i++) {
    const char *name = ps_proto_type_name(blocks[i].type);
    uint8_t *b = frame + PS_PROTO_HEADER_SIZE + blocks[i].at;
    char needle[128];
    ps_msg m, out;
    uint32_t len = (uint32_t)(encode_sample(blocks[i].type, &m) - PS_PROTO_HEADER_SIZE);
    ps_put_le32(b + 24, 3);
    snprintf(needle, sizeof needle,
             "%s: state field nslots is 3, expected at most 2", name);
    expect_reject(len, PS_EFORMAT, needle);
    ps_put_le32(b + 24, UINT32_MAX);
    snprintf(needle, sizeof needle, "%s: state field nslots is 4294967295,", name);
    expect_reject(len, PS_EFORMAT, needle);
    ps_put_le32(b + 24, 2);
    ps_put_le32(b + 28, 2);
    snprintf(needle, sizeof needle, "%s: state field has_accum is 2, expected at most 1", name);
    expect_reject(len, PS_EFORMAT, needle);
    /* Every valid combination, and the fields with no rule at their extremes. */
    for (uint32_t slots = 0; slots <= 2; slots++)
      for (uint32_t accum = 0; accum <= 1; accum++) {
        encode_sample(blocks[i].type, &m);
        ps_put_le32(b + 24, slots);
        ps_put_le32(b + 28, accum);
        ps_put_le32(b + 32, UINT32_MAX);  /* accum_count */
        ps_put_le32(b + 36, 0);           /* target */
        ps_put_le32(b + 40, UINT32_MAX);  /* nonce */
        assert_int_equal(decode_frame(len, &out), 0);
        const ps_state_info *st =
            blocks[i].type == PS_MSG_LOAD ? &out.u.load.state : &out.u.cut_reply.state;
        assert_int_equal(st->nslots, slots);
        assert_int_equal(st->has_accum, accum);
        assert_int_equal(st->accum_count, UINT32_MAX);
        assert_int_equal(st->target, 0);
        assert_int_equal(st->nonce, UINT32_MAX);
      }
  }
}

/* A LOAD piece must lie within its image: offset + count <= image_floats,
 * checked without overflow. */
static void test_load_bounds(void **state) {
  (void)state;
  ps_msg m, out;
  uint8_t *p = frame + PS_PROTO_HEADER_SIZE;
  encode_sample(PS_MSG_LOAD, &m);
  ps_put_le64(p + 32, 100);  /* image_floats */
  ps_put_le64(p + 80, 95);   /* offset: the last 5 floats */
  assert_int_equal(decode_frame(96 + 20, &out), 0);
  assert_true(out.u.load.offset == 95 && out.u.load.count == 5);
  assert_true(out.u.load.state.image_floats == 100);
  assert_ptr_equal(out.u.load.data, p + 96);
  ps_put_le64(p + 80, 0);
  assert_int_equal(decode_frame(96 + 20, &out), 0);

  ps_put_le64(p + 80, 96);
  expect_reject(96 + 20, PS_EFORMAT, "LOAD: floats 96..+5 lie outside the image of 100");
  ps_put_le64(p + 80, 101);
  expect_reject(96 + 20, PS_EFORMAT, "LOAD: floats 101..+5 lie outside the image of 100");
  /* offset + count wraps to 4, which a careless check would take for in bounds. */
  ps_put_le64(p + 80, UINT64_MAX);
  expect_reject(96 + 20, PS_EFORMAT,
                "LOAD: floats 18446744073709551615..+5 lie outside the image of 100");
  ps_put_le64(p + 80, 0);
  ps_put_le64(p + 32, 4);
  expect_reject(96 + 20, PS_EFORMAT, "LOAD: floats 0..+5 lie outside the image of 4");
  ps_put_le64(p + 32, 0);
  expect_reject(96 + 20, PS_EFORMAT, "outside the image of 0");

  /* Empty pieces: within the image up to its end, not past it. */
  ps_put_le64(p + 88, 0);
  ps_put_le64(p + 32, 100);
  ps_put_le64(p + 80, 100);
  assert_int_equal(decode_frame(96, &out), 0);
  assert_true(out.u.load.count == 0);
  ps_put_le64(p + 80, 101);
  expect_reject(96, PS_EFORMAT, "LOAD: floats 101..+0 lie outside the image of 100");
}

static void test_stats_reply_flags(void **state) {
  (void)state;
  ps_msg m, out;
  for (uint64_t flags = 0; flags <= 3; flags++) {
    sample(PS_MSG_STATS_REPLY, &m);
    m.u.stats_reply.flags = flags;
    assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), PS_PROTO_HEADER_SIZE + 88);
    assert_true(ps_get_le64(frame + PS_PROTO_HEADER_SIZE + 80) == flags);
    assert_int_equal(decode_frame(88, &out), 0);
    assert_true(out.u.stats_reply.flags == flags);
    assert_msg_equal(&m, &out);
  }
  assert_int_equal(PS_STATS_INITIALIZED, 0x1);
  assert_int_equal(PS_STATS_PAUSED, 0x2);
  static const uint64_t bad[] = {0x4, 0x7, UINT64_C(1) << 32, UINT64_C(1) << 63, UINT64_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    encode_sample(PS_MSG_STATS_REPLY, &m);
    ps_put_le64(frame + PS_PROTO_HEADER_SIZE + 80, bad[i]);
    char needle[96];
    snprintf(needle, sizeof needle, "STATS_REPLY: flags are 0x%llx, expected only 0x3",
             (unsigned long long)bad[i]);
    expect_reject(88, PS_EFORMAT, needle);
  }
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

/* ------------------------------------------------------------------------ */
/* Sparse blocks (version 4)                                                */
/* ------------------------------------------------------------------------ */

static const uint64_t skeys[3] = {5, 0x8000000000000001u, UINT64_MAX};
static const float svals[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 7.0f};

/* Two blocks of kind k: table 2 (dim 2, 3 rows), table 9 (dim 1, 2 rows). */
static size_t sample_blocks(ps_sparse_kind k, uint8_t *out, size_t cap) {
  size_t a = ps_sparse_put(out, cap, k, 2, 2, 3, skeys, svals);
  size_t b = ps_sparse_put(out + a, cap - a, k, 9, 1, 2, skeys + 1, svals);
  assert_true(a > 0 && b > 0);
  return a + b;
}

/* PULL with keys, PUSH with keys and gradients, PULL_REPLY with rows: each
 * round trips, at PROTOCOL.md's offsets, and the iterator gives the blocks
 * back. */
static void test_sparse_roundtrip(void **state) {
  (void)state;
  static const struct {
    int type;
    ps_sparse_kind kind;
    size_t at_sparse, fixed;  /* where `sparse` sits; the fixed part */
  } cases[] = {{PS_MSG_PULL, PS_SPARSE_K, 16, 32},
               {PS_MSG_PUSH, PS_SPARSE_KV, 40, 48},
               {PS_MSG_PULL_REPLY, PS_SPARSE_V, 24, 32}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t blocks[512];
    size_t nb = sample_blocks(cases[i].kind, blocks, sizeof blocks);
    ps_msg m, out;
    sample(cases[i].type, &m);
    ps_sparse sp = {.bytes = nb, .data = blocks};
    if (cases[i].type == PS_MSG_PULL)
      m.u.pull.sparse = sp;
    else if (cases[i].type == PS_MSG_PUSH)
      m.u.push.sparse = sp;
    else
      m.u.pull_reply.sparse = sp;
    size_t n = ps_proto_encode(&m, 7, frame, sizeof frame);
    size_t floats_bytes = cases[i].type == PS_MSG_PULL ? 0 : sizeof floats;
    assert_int_equal(n, PS_PROTO_HEADER_SIZE + cases[i].fixed + floats_bytes + nb);
    const uint8_t *p = frame + PS_PROTO_HEADER_SIZE;
    assert_true(ps_get_le64(p + cases[i].at_sparse) == nb);
    assert_memory_equal(p + cases[i].fixed + floats_bytes, blocks, nb);
    /* The first block's head: table, dim, n. */
    const uint8_t *b = p + cases[i].fixed + floats_bytes;
    assert_int_equal(ps_get_le32(b), 2);
    assert_int_equal(ps_get_le32(b + 4), 2);
    assert_true(ps_get_le64(b + 8) == 3);
    assert_int_equal(decode_frame((uint32_t)(n - PS_PROTO_HEADER_SIZE), &out), 0);
    assert_msg_equal(&m, &out);
    ps_sparse_kind kind;
    const ps_sparse *got = cases[i].type == PS_MSG_PULL   ? &out.u.pull.sparse
                           : cases[i].type == PS_MSG_PUSH ? &out.u.push.sparse
                                                          : &out.u.pull_reply.sparse;
    kind = cases[i].kind;
    ps_sparse_iter it;
    ps_sparse_block blk;
    ps_sparse_iter_init(got, &it);
    assert_true(ps_sparse_iter_next(&it, kind, &blk));
    assert_int_equal(blk.table, 2);
    assert_true(blk.n == 3 && blk.dim == 2);
    if (kind != PS_SPARSE_V)
      assert_true(ps_get_le64(blk.keys + 16) == UINT64_MAX);
    if (kind != PS_SPARSE_K)
      assert_memory_equal(blk.values, svals, sizeof svals);
    assert_true(ps_sparse_iter_next(&it, kind, &blk));
    assert_true(blk.table == 9 && blk.n == 2 && blk.dim == 1);
    assert_false(ps_sparse_iter_next(&it, kind, &blk));
  }
}

/* Blocks the decoder refuses, each with a line naming the block, and the
 * encoder refusing to write them. */
static void test_sparse_refused(void **state) {
  (void)state;
  uint8_t blocks[512], bad[512];
  size_t nb = sample_blocks(PS_SPARSE_KV, blocks, sizeof blocks);
  static const struct {
    size_t at;       /* a byte of the section to change */
    int width;       /* 4 or 8 */
    uint64_t value;
    const char *want;
  } cases[] = {
      {4, 4, 0, "sparse block 0 (table 2): dim 0, expected 1..65536"},
      {4, 4, 65537, "dim 65537"},
      {8, 8, 0, "sparse block 0 (table 2): 0 rows"},
      {8, 8, UINT64_C(1) << 61, "more than 2^64"},
      {8, 8, 7, "7 rows of dim 2 need more bytes"},
      {16 + 8, 8, 5, "key 5 (row 1) not above key 5"},
      {16 + 16, 8, 1, "key 1 (row 2) not above key 9223372036854775809"},
      {0, 4, 9, "sparse block 1: table 9 after table 9"},
      {0, 4, 10, "table 9 after table 10"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    memcpy(bad, blocks, nb);
    if (cases[i].width == 4)
      ps_put_le32(bad + cases[i].at, (uint32_t)cases[i].value);
    else
      ps_put_le64(bad + cases[i].at, cases[i].value);
    ps_msg m;
    sample(PS_MSG_PUSH, &m);
    m.u.push.sparse = (ps_sparse){.bytes = nb, .data = bad};
    assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), 0);
    /* The same bytes on the wire. */
    m.u.push.sparse = (ps_sparse){.bytes = nb, .data = blocks};
    size_t n = ps_proto_encode(&m, 1, frame, sizeof frame);
    memcpy(frame + n - nb, bad, nb);
    expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EFORMAT, cases[i].want);
    assert_non_null(strstr(eb.msg, "PUSH: "));
  }
  /* A section cut short, one with a byte past its blocks, and a `sparse`
   * longer than the payload. */
  ps_msg m;
  sample(PS_MSG_PUSH, &m);
  m.u.push.sparse = (ps_sparse){.bytes = nb, .data = blocks};
  size_t n = ps_proto_encode(&m, 1, frame, sizeof frame);
  uint32_t len = (uint32_t)(n - PS_PROTO_HEADER_SIZE);
  ps_put_le64(frame + PS_PROTO_HEADER_SIZE + 40, nb - 4);
  expect_reject(len - 4, PS_EFORMAT, "PUSH: sparse block 1 (table 9): 2 rows of dim 1 need more");
  ps_put_le64(frame + PS_PROTO_HEADER_SIZE + 40, nb - 30);
  expect_reject(len - 30, PS_EFORMAT, "sparse block 1: 10 bytes left, a block head needs 16");
  ps_put_le64(frame + PS_PROTO_HEADER_SIZE + 40, len);
  expect_reject(len, PS_EFORMAT, "fewer than its 48-byte fixed part and");
  /* A PULL whose `sparse` does not match its length. */
  sample(PS_MSG_PULL, &m);
  n = ps_proto_encode(&m, 1, frame, sizeof frame);
  ps_put_le64(frame + PS_PROTO_HEADER_SIZE + 16, 16);
  expect_reject((uint32_t)(n - PS_PROTO_HEADER_SIZE), PS_EFORMAT, "PULL: payload is 32 bytes");
  /* The writer's own checks. */
  uint64_t down[2] = {9, 3};
  assert_int_equal(ps_sparse_put(bad, sizeof bad, PS_SPARSE_K, 0, 1, 2, down, NULL), 0);
  assert_int_equal(ps_sparse_put(bad, sizeof bad, PS_SPARSE_K, 0, 1, 0, skeys, NULL), 0);
  assert_int_equal(ps_sparse_put(bad, sizeof bad, PS_SPARSE_KV, 0, 0, 1, skeys, svals), 0);
  assert_int_equal(ps_sparse_put(bad, sizeof bad, PS_SPARSE_KV, 0, 1, 1, skeys, NULL), 0);
  assert_int_equal(ps_sparse_put(bad, 20, PS_SPARSE_KV, 0, 2, 1, skeys, svals), 0);
  assert_int_equal(ps_sparse_put(bad, 32, PS_SPARSE_KV, 0, 2, 1, skeys, svals), 32);
  assert_true(ps_sparse_block_bytes(PS_SPARSE_V, 65536, UINT64_MAX / 1000) == UINT64_MAX);
}

/* A bag block written by hand: table t | PS_SPARSE_BAGS, dim, the bags'
 * (sample, count) heads, their keys, then (grads != NULL) a row a bag. */
static size_t bag_block(uint8_t *out, uint32_t t, uint32_t dim, int nbags, const uint32_t *samples,
                        const uint32_t *counts, const uint64_t *keys, const float *grads) {
  ps_put_le32(out, t | PS_SPARSE_BAGS);
  ps_put_le32(out + 4, dim);
  ps_put_le64(out + 8, (uint64_t)nbags);
  size_t at = 16, nkeys = 0;
  for (int i = 0; i < nbags; i++, at += 8) {
    ps_put_le32(out + at, samples[i]);
    ps_put_le32(out + at + 4, counts[i]);
    nkeys += counts[i];
  }
  for (size_t k = 0; k < nkeys; k++, at += 8)
    ps_put_le64(out + at, keys[k]);
  if (grads != NULL) {
    memcpy(out + at, grads, (size_t)nbags * dim * sizeof(float));
    at += (size_t)nbags * dim * sizeof(float);
  }
  return at;
}

/* Bags (PROTOCOL.md, "Bags"): a PUSH's BG block beside a KV block round
 * trips; its sizes are the documented ones; unbag turns it into the KV
 * block of its distinct keys, each the sum of its bags' gradients (a key
 * twice in a bag, twice); bag blocks are refused where rows are expected
 * (without PS_SPARSE_BAGS_OK) and when their heads are wrong. */
static void test_sparse_bags(void **state) {
  (void)state;
  uint8_t sec[512];
  /* table 1 (KV, dim 2, one row), then table 4 as bags: sample 0 holds
   * keys 7 and 3, sample 5 holds 7, 7 and 9. */
  size_t len = ps_sparse_put(sec, sizeof sec, PS_SPARSE_KV, 1, 2, 1, skeys, svals);
  static const uint32_t samples[2] = {0, 5}, counts[2] = {2, 3};
  static const uint64_t keys[5] = {7, 3, 7, 7, 9};
  static const float g[4] = {1, 2, 10, 20};
  size_t bag = bag_block(sec + len, 4, 2, 2, samples, counts, keys, g);
  assert_int_equal(bag, 16 + 2 * 8 + 5 * 8 + 2 * 2 * 4);
  assert_true(ps_sparse_bag_bytes(PS_SPARSE_KV, 2, 2, 5) == bag);
  assert_true(ps_sparse_bag_bytes(PS_SPARSE_K, 2, 2, 5) == bag - 16);
  assert_true(ps_sparse_bag_bytes(PS_SPARSE_V, 2, 2, 0) == 16 + 16);
  assert_true(ps_sparse_bag_bytes(PS_SPARSE_KV, 1, 1, UINT64_MAX / 4) == UINT64_MAX);
  len += bag;
  uint32_t nb = 0;
  assert_int_equal(ps_sparse_check(PS_SPARSE_KV | PS_SPARSE_BAGS_OK, sec, len, &nb, &eb), 0);
  assert_int_equal(nb, 2);
  assert_int_equal(ps_sparse_check(PS_SPARSE_KV, sec, len, NULL, &eb), PS_EFORMAT);
  assert_non_null(strstr(eb.msg, "sparse block 1 (table 4): a bag block, expected rows"));
  assert_true(ps_sparse_has_bags(PS_SPARSE_KV, sec, len));
  assert_false(ps_sparse_has_bags(PS_SPARSE_KV, sec, len - bag));

  /* In a PUSH, through the codec, and back through the iterator. */
  ps_msg m, out;
  sample(PS_MSG_PUSH, &m);
  m.u.push.sparse = (ps_sparse){.bytes = len, .data = sec};
  size_t n = ps_proto_encode(&m, 1, frame, sizeof frame);
  assert_true(n > 0);
  assert_int_equal(decode_frame((uint32_t)(n - PS_PROTO_HEADER_SIZE), &out), 0);
  ps_sparse_iter it;
  ps_sparse_block b;
  ps_sparse_iter_init(&out.u.push.sparse, &it);
  assert_true(ps_sparse_iter_next(&it, PS_SPARSE_KV, &b) && !b.bags && b.table == 1);
  assert_true(ps_sparse_iter_next(&it, PS_SPARSE_KV, &b));
  assert_true(b.bags && b.table == 4 && b.dim == 2 && b.n == 2 && b.nkeys == 5);
  assert_int_equal(ps_get_le32(b.heads + 8), 5);
  assert_true(ps_get_le64(b.keys + 8 * 4) == 9);
  float v;
  memcpy(&v, b.values + 3 * sizeof(float), sizeof v);
  assert_true(v == 20);
  assert_false(ps_sparse_iter_next(&it, PS_SPARSE_KV, &b));

  /* unbag: key 3: sample 0's; key 7: sample 0's + twice sample 5's; key 9:
   * sample 5's.  The KV block before it is copied as it is. */
  uint8_t *rows = NULL;
  size_t cap = 0;
  uint64_t rlen = 0;
  assert_int_equal(ps_sparse_unbag(sec, len, &rows, &cap, &rlen), 0);
  assert_int_equal(ps_sparse_check(PS_SPARSE_KV, rows, rlen, &nb, &eb), 0);
  assert_memory_equal(rows, sec, len - bag);
  ps_sparse sp = {.bytes = rlen, .data = rows};
  ps_sparse_iter_init(&sp, &it);
  assert_true(ps_sparse_iter_next(&it, PS_SPARSE_KV, &b));
  assert_true(ps_sparse_iter_next(&it, PS_SPARSE_KV, &b));
  assert_true(!b.bags && b.table == 4 && b.n == 3);
  static const uint64_t want_keys[3] = {3, 7, 9};
  static const float want[6] = {1, 2, 1 + 10 + 10, 2 + 20 + 20, 10, 20};
  for (int i = 0; i < 3; i++)
    assert_true(ps_get_le64(b.keys + 8 * i) == want_keys[i]);
  float got[6];
  memcpy(got, b.values, sizeof got);
  assert_memory_equal(got, want, sizeof want);
  free(rows);

  /* Wrong heads: samples not ascending, an empty bag, heads past the end. */
  static const uint32_t down[2] = {5, 5}, zero[2] = {2, 0};
  size_t l = bag_block(sec, 4, 2, 2, down, counts, keys, g);
  assert_int_equal(ps_sparse_check(PS_SPARSE_KV | PS_SPARSE_BAGS_OK, sec, l, NULL, &eb),
                   PS_EFORMAT);
  assert_non_null(strstr(eb.msg, "bag 1 of sample 5 not above sample 5"));
  l = bag_block(sec, 4, 2, 2, samples, zero, keys, g);
  assert_int_equal(ps_sparse_check(PS_SPARSE_KV | PS_SPARSE_BAGS_OK, sec, l, NULL, &eb),
                   PS_EFORMAT);
  assert_non_null(strstr(eb.msg, "bag 1 (sample 5) of 0 keys"));
  l = bag_block(sec, 4, 2, 2, samples, counts, keys, NULL);
  assert_int_equal(ps_sparse_check(PS_SPARSE_K | PS_SPARSE_BAGS_OK, sec, l, NULL, &eb), 0);
  assert_int_equal(ps_sparse_check(PS_SPARSE_K | PS_SPARSE_BAGS_OK, sec, 20, NULL, &eb),
                   PS_EFORMAT);
  assert_non_null(strstr(eb.msg, "2 bags need more bytes of heads, 4 left"));
  assert_int_equal(ps_sparse_check(PS_SPARSE_KV | PS_SPARSE_BAGS_OK, sec, l, NULL, &eb),
                   PS_EFORMAT);
  assert_non_null(strstr(eb.msg, "need more bytes"));
}

/* PROTOCOL.md's test vector of a PULL with keys: worker 2, step 10,
 * request id 1, table 3 (dim 4), keys 5 and 9. */
static void test_sparse_vector(void **state) {
  (void)state;
  static const uint8_t want[88] = {
      0x50, 0x53, 0x52, 0x56, 0x04, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00,
      0x04, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  uint64_t keys[2] = {5, 9};
  uint8_t blocks[64];
  size_t nb = ps_sparse_put(blocks, sizeof blocks, PS_SPARSE_K, 3, 4, 2, keys, NULL);
  assert_int_equal(nb, 32);
  ps_msg m = {.type = PS_MSG_PULL};
  m.u.pull = (ps_msg_pull){.worker = 2, .step = 10, .sparse = {.bytes = nb, .data = blocks}};
  assert_int_equal(ps_proto_encode(&m, 1, frame, sizeof frame), sizeof want);
  assert_memory_equal(frame, want, sizeof want);
}

static void test_names(void **state) {
  (void)state;
  assert_string_equal(ps_proto_type_name(PS_MSG_PUSH), "PUSH");
  assert_string_equal(ps_proto_type_name(PS_MSG_STATS_REPLY), "STATS_REPLY");
  assert_string_equal(ps_proto_type_name(PS_MSG_CHALLENGE), "CHALLENGE");
  assert_string_equal(ps_proto_type_name(PS_MSG_PONG), "PONG");
  assert_string_equal(ps_proto_type_name(13), "CUT");
  assert_string_equal(ps_proto_type_name(14), "CUT_REPLY");
  assert_string_equal(ps_proto_type_name(15), "RESUME");
  assert_string_equal(ps_proto_type_name(16), "FETCH");
  assert_string_equal(ps_proto_type_name(17), "FETCH_REPLY");
  assert_string_equal(ps_proto_type_name(18), "LOAD");
  assert_string_equal(ps_proto_type_name(19), "STOP");
  assert_string_equal(ps_proto_type_name(20), "RING_JOIN");
  assert_string_equal(ps_proto_type_name(21), "RING_CHUNK");
  assert_int_equal(PS_MSG_TYPE_MAX, 21);
  assert_int_equal(PS_PROTO_VERSION, 4);
  assert_string_equal(ps_proto_type_name(0), "unknown");
  assert_string_equal(ps_proto_type_name(22), "unknown");
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
      cmocka_unit_test(test_v3_payload_bytes),
      cmocka_unit_test(test_fence_vector),
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
      cmocka_unit_test(test_bad_state),
      cmocka_unit_test(test_load_bounds),
      cmocka_unit_test(test_stats_reply_flags),
      cmocka_unit_test(test_bad_cluster_id),
      cmocka_unit_test(test_cluster_id_length),
      cmocka_unit_test(test_error_message),
      cmocka_unit_test(test_hmac_vector),
      cmocka_unit_test(test_auth_check),
      cmocka_unit_test(test_sparse_roundtrip),
      cmocka_unit_test(test_sparse_refused),
      cmocka_unit_test(test_sparse_bags),
      cmocka_unit_test(test_sparse_vector),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
