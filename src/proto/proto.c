/* Encoding of wire frames (src/proto/PROTOCOL.md, version 3), their headers,
 * names and authentication: pure, no I/O.  The decoder is decode.c. */
#include "proto/proto.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/endian.h"
#include "proto/proto_internal.h"

/* Integers are written with shifts and so do not depend on the host, but
 * float arrays travel as the host's bytes: only a little-endian host sends
 * the little-endian IEEE 754 floats the spec promises. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "paramserv's wire format copies floats as host bytes: little-endian hosts only");
_Static_assert(sizeof(float) == 4, "the wire carries 4-byte IEEE 754 floats");

/* The fence token of a chief -> shard frame; NULL for any other type. */
static uint64_t *fence_field(ps_msg *m) {
  switch (m->type) {
  case PS_MSG_CUT: return &m->u.cut.fence;
  case PS_MSG_RESUME: return &m->u.resume.fence;
  case PS_MSG_FETCH: return &m->u.fetch.fence;
  case PS_MSG_LOAD: return &m->u.load.fence;
  case PS_MSG_STOP: return &m->u.stop.fence;
  default: return NULL;
  }
}

uint64_t ps_proto_fence(const ps_msg *m) {
  const uint64_t *f = fence_field((ps_msg *)m);
  return f != NULL ? *f : 0;
}

int ps_proto_set_fence(ps_msg *m, uint64_t fence) {
  uint64_t *f = fence_field(m);
  if (f == NULL)
    return -1;
  *f = fence;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Names                                                                    */
/* ------------------------------------------------------------------------ */

const char *ps_proto_type_name(int type) {
  static const char *const names[PS_MSG_TYPE_MAX + 1] = {
      [PS_MSG_CHALLENGE] = "CHALLENGE", [PS_MSG_HELLO] = "HELLO",
      [PS_MSG_WELCOME] = "WELCOME",     [PS_MSG_PULL] = "PULL",
      [PS_MSG_PULL_REPLY] = "PULL_REPLY", [PS_MSG_PUSH] = "PUSH",
      [PS_MSG_PUSH_ACK] = "PUSH_ACK",   [PS_MSG_STATS] = "STATS",
      [PS_MSG_STATS_REPLY] = "STATS_REPLY", [PS_MSG_ERROR] = "ERROR",
      [PS_MSG_PING] = "PING",           [PS_MSG_PONG] = "PONG",
      [PS_MSG_CUT] = "CUT",             [PS_MSG_CUT_REPLY] = "CUT_REPLY",
      [PS_MSG_RESUME] = "RESUME",       [PS_MSG_FETCH] = "FETCH",
      [PS_MSG_FETCH_REPLY] = "FETCH_REPLY", [PS_MSG_LOAD] = "LOAD",
      [PS_MSG_STOP] = "STOP",           [PS_MSG_RING_JOIN] = "RING_JOIN",
      [PS_MSG_RING_CHUNK] = "RING_CHUNK",
  };
  if (type < 1 || type > PS_MSG_TYPE_MAX)
    return "unknown";
  return names[type];
}

const char *ps_role_name(int role) {
  static const char *const names[] = {[PS_ROLE_WORKER] = "worker", [PS_ROLE_CHIEF] = "chief",
                                      [PS_ROLE_PS] = "ps", [PS_ROLE_TOOL] = "tool"};
  return role_ok((unsigned)role) ? names[role] : "unknown";
}

/* ------------------------------------------------------------------------ */
/* Header                                                                   */
/* ------------------------------------------------------------------------ */

static void put_header(uint8_t *p, int type, uint64_t request_id, uint32_t length) {
  ps_put_le32(p, PS_PROTO_MAGIC);
  ps_put_le16(p + 4, PS_PROTO_VERSION);
  ps_put_le16(p + 6, (uint16_t)type);
  ps_put_le32(p + 8, 0);
  ps_put_le64(p + 12, request_id);
  ps_put_le32(p + 20, length);
}

int ps_proto_decode_header(const uint8_t *buf, uint64_t max_payload, ps_frame_header *h,
                           ps_errbuf *eb) {
  h->magic = ps_get_le32(buf);
  h->version = ps_get_le16(buf + 4);
  h->type = ps_get_le16(buf + 6);
  h->flags = ps_get_le32(buf + 8);
  h->request_id = ps_get_le64(buf + 12);
  h->length = ps_get_le32(buf + 20);

  if (h->magic != PS_PROTO_MAGIC)
    return ps_err_set(eb, PS_EFORMAT,
                      "frame: bad magic 0x%08" PRIx32 ", expected 0x%08x (\"PSRV\"): not a "
                      "paramserv peer",
                      h->magic, PS_PROTO_MAGIC);
  if (h->version != PS_PROTO_VERSION)
    return ps_err_set(eb, PS_EVERSION,
                      "frame: protocol version %u, expected version %d", (unsigned)h->version,
                      PS_PROTO_VERSION);
  if (h->type < 1 || h->type > PS_MSG_TYPE_MAX)
    return ps_err_set(eb, PS_EFORMAT, "frame: unknown message type %u, expected 1..%d",
                      (unsigned)h->type, PS_MSG_TYPE_MAX);
  const char *name = ps_proto_type_name(h->type);
  if (h->flags != 0)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: header flags are 0x%" PRIx32 ", expected 0 in protocol version %d",
                      name, h->flags, PS_PROTO_VERSION);
  uint64_t cap = is_large_type(h->type) ? max_payload : PS_PROTO_SMALL_PAYLOAD_MAX;
  if (h->length > cap)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: payload is %" PRIu32 " bytes, more than the cap of %" PRIu64, name,
                      h->length, cap);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

/* The payload length msg encodes to, after checking that it is a message
 * the decoder would accept (so that no peer ever receives a frame it must
 * refuse); its sparse blocks are checked when `blocks` (a prefix's are the
 * caller's to write, only their length counts).  Returns 0 or -1. */
static int payload_length(const ps_msg *msg, int blocks, uint32_t *len) {
  int type = msg->type;
  if (type < 1 || type > PS_MSG_TYPE_MAX)
    return -1;
  uint64_t n = fixed_size[type];
  ps_sparse_kind kind;
  const ps_sparse *sp = sparse_of(msg, &kind);
  if (sp != NULL && sp->bytes > 0) {
    uint32_t nb;
    if (sp->bytes > UINT32_MAX ||
        (blocks && (sp->data == NULL ||
                    ps_sparse_check(kind | PS_SPARSE_BAGS_OK, sp->data, sp->bytes, &nb, NULL))))
      return -1;
    n += sp->bytes;
  }
  if (fence_field((ps_msg *)msg) != NULL && ps_proto_fence(msg) == 0)
    return -1;
  switch (type) {
  case PS_MSG_CHALLENGE:
    if (!role_ok(msg->u.challenge.role))
      return -1;
    break;
  case PS_MSG_HELLO: {
    const ps_msg_hello *m = &msg->u.hello;
    size_t id_len = strnlen(m->cluster_id, sizeof m->cluster_id);
    if (!role_ok(m->role) || id_len < 1 || id_len > PS_PROTO_CLUSTER_ID_MAX ||
        cluster_id_bad_byte(m->cluster_id, id_len) >= 0)
      return -1;
    n += id_len;
    break;
  }
  case PS_MSG_LOAD:
    if (ps_state_over(&msg->u.load.state) != NULL || msg->u.load.offset > msg->u.load.state.image_floats ||
        msg->u.load.count > msg->u.load.state.image_floats - msg->u.load.offset)
      return -1;
    /* fall through */
  case PS_MSG_PULL_REPLY:
  case PS_MSG_PUSH:
  case PS_MSG_FETCH_REPLY:
  case PS_MSG_RING_CHUNK: {
    uint64_t count = float_count(msg);
    if (n > UINT32_MAX || count > (UINT32_MAX - n) / 4 || (count > 0 && float_data(msg) == NULL))
      return -1;
    n += 4 * count;
    break;
  }
  case PS_MSG_CUT_REPLY:
    if (ps_state_over(&msg->u.cut_reply.state) != NULL)
      return -1;
    break;
  case PS_MSG_STATS_REPLY:
    if ((msg->u.stats_reply.flags & ~(uint64_t)(PS_STATS_INITIALIZED | PS_STATS_PAUSED)) != 0)
      return -1;
    break;
  case PS_MSG_PUSH_ACK:
    if (msg->u.push_ack.status > PS_PUSH_STALE)
      return -1;
    break;
  case PS_MSG_ERROR:
    if (msg->u.error.code >= 0 || (msg->u.error.flags & ~PS_ERROR_RETRY) != 0)
      return -1;
    n += strnlen(msg->u.error.message, PS_PROTO_ERROR_MSG_MAX);
    break;
  default:
    break;
  }
  *len = (uint32_t)n;
  return 0;
}

/* Write the fixed part of msg's payload at p; padding is written as zeros. */
static void put_fixed(const ps_msg *msg, uint8_t *p) {
  memset(p, 0, fixed_size[msg->type]);
  switch (msg->type) {
  case PS_MSG_CHALLENGE: {
    const ps_msg_challenge *m = &msg->u.challenge;
    memcpy(p, m->nonce, PS_PROTO_NONCE_SIZE);
    p[32] = m->role;
    ps_put_le32(p + 36, m->index);
    ps_put_le64(p + 40, m->incarnation);
    break;
  }
  case PS_MSG_HELLO: {
    const ps_msg_hello *m = &msg->u.hello;
    p[0] = m->role;
    ps_put_le32(p + 4, m->index);
    ps_put_le64(p + 8, m->incarnation);
    ps_put_le64(p + 16, m->layout_hash);
    memcpy(p + 24, m->proof, PS_PROTO_PROOF_SIZE);
    ps_put_le16(p + 56, (uint16_t)strnlen(m->cluster_id, sizeof m->cluster_id));
    break;
  }
  case PS_MSG_WELCOME: {
    const ps_msg_welcome *m = &msg->u.welcome;
    ps_put_le32(p, m->index);
    p[4] = m->consistency;
    ps_put_le64(p + 8, m->incarnation);
    ps_put_le64(p + 16, m->layout_hash);
    ps_put_le64(p + 24, m->slice_floats);
    ps_put_le64(p + 32, m->version);
    ps_put_le64(p + 40, m->global_step);
    ps_put_le32(p + 48, m->max_payload);
    break;
  }
  case PS_MSG_PULL:
    ps_put_le32(p, msg->u.pull.worker);
    ps_put_le64(p + 8, msg->u.pull.step);
    ps_put_le64(p + 16, msg->u.pull.sparse.bytes);
    break;
  case PS_MSG_PULL_REPLY: {
    const ps_msg_pull_reply *m = &msg->u.pull_reply;
    ps_put_le64(p, m->version);
    ps_put_le64(p + 8, m->global_step);
    ps_put_le64(p + 16, m->count);
    ps_put_le64(p + 24, m->sparse.bytes);
    break;
  }
  case PS_MSG_PUSH: {
    const ps_msg_push *m = &msg->u.push;
    ps_put_le32(p, m->worker);
    ps_put_le64(p + 8, m->incarnation);
    ps_put_le64(p + 16, m->seq);
    ps_put_le64(p + 24, m->step);
    ps_put_le64(p + 32, m->count);
    ps_put_le64(p + 40, m->sparse.bytes);
    break;
  }
  case PS_MSG_PUSH_ACK: {
    const ps_msg_push_ack *m = &msg->u.push_ack;
    ps_put_le64(p, m->seq);
    ps_put_le64(p + 8, m->version);
    ps_put_le64(p + 16, m->global_step);
    ps_put_le32(p + 24, m->status);
    break;
  }
  case PS_MSG_STATS_REPLY: {
    const ps_msg_stats_reply *m = &msg->u.stats_reply;
    const uint64_t v[10] = {m->version,          m->global_step,   m->incarnation,
                            m->pushes_applied,   m->pushes_duplicate, m->pushes_stale,
                            m->pulls,            m->bytes_in,      m->bytes_out,
                            m->clients};
    for (int i = 0; i < 10; i++)
      ps_put_le64(p + 8 * i, v[i]);
    ps_put_le64(p + 80, m->flags);
    break;
  }
  case PS_MSG_CUT:
    ps_put_le64(p, msg->u.cut.fence);
    ps_put_le64(p + 8, msg->u.cut.cut_id);
    ps_put_le32(p + 16, msg->u.cut.hold_ms);
    break;
  case PS_MSG_CUT_REPLY:
    ps_put_le64(p, msg->u.cut_reply.cut_id);
    ps_state_wire_put(p + 8, &msg->u.cut_reply.state);
    break;
  case PS_MSG_RESUME:
    ps_put_le64(p, msg->u.resume.fence);
    ps_put_le64(p + 8, msg->u.resume.cut_id);
    break;
  case PS_MSG_FETCH:
    ps_put_le64(p, msg->u.fetch.fence);
    ps_put_le64(p + 8, msg->u.fetch.cut_id);
    ps_put_le64(p + 16, msg->u.fetch.offset);
    ps_put_le64(p + 24, msg->u.fetch.count);
    break;
  case PS_MSG_FETCH_REPLY:
    ps_put_le64(p, msg->u.fetch_reply.cut_id);
    ps_put_le64(p + 8, msg->u.fetch_reply.offset);
    ps_put_le64(p + 16, msg->u.fetch_reply.count);
    break;
  case PS_MSG_LOAD:
    ps_put_le64(p, msg->u.load.fence);
    ps_state_wire_put(p + LOAD_STATE_AT, &msg->u.load.state);
    ps_put_le64(p + LOAD_STATE_AT + STATE_SIZE, msg->u.load.offset);
    ps_put_le64(p + LOAD_STATE_AT + STATE_SIZE + 8, msg->u.load.count);
    break;
  case PS_MSG_STOP:
    ps_put_le64(p, msg->u.stop.fence);
    ps_put_le64(p + 8, msg->u.stop.step);
    break;
  case PS_MSG_RING_JOIN:
    ps_put_le64(p, msg->u.ring_join.epoch);
    ps_put_le64(p + 8, msg->u.ring_join.step);
    ps_put_le32(p + 16, msg->u.ring_join.rank);
    break;
  case PS_MSG_RING_CHUNK: {
    const ps_msg_ring_chunk *m = &msg->u.ring_chunk;
    ps_put_le64(p, m->epoch);
    ps_put_le64(p + 8, m->step);
    ps_put_le32(p + 16, m->phase);
    ps_put_le64(p + 24, m->offset);
    ps_put_le64(p + 32, m->count);
    break;
  }
  case PS_MSG_ERROR: {
    const ps_msg_error *m = &msg->u.error;
    ps_put_le32(p, (uint32_t)m->code);
    ps_put_le32(p + 4, m->flags);
    ps_put_le16(p + 8, (uint16_t)strnlen(m->message, PS_PROTO_ERROR_MSG_MAX));
    break;
  }
  case PS_MSG_PING:
  case PS_MSG_PONG:
    ps_put_le64(p, msg->u.ping.token);
    break;
  default:
    break;
  }
}

size_t ps_proto_encode(const ps_msg *msg, uint64_t request_id, uint8_t *out, size_t cap) {
  uint32_t len;
  if (payload_length(msg, 1, &len) != 0 || cap < PS_PROTO_HEADER_SIZE ||
      cap - PS_PROTO_HEADER_SIZE < len)
    return 0;
  put_header(out, msg->type, request_id, len);
  uint8_t *p = out + PS_PROTO_HEADER_SIZE;
  uint32_t fixed = fixed_size[msg->type];
  put_fixed(msg, p);
  size_t tail = len - fixed;
  switch (msg->type) {
  case PS_MSG_HELLO:
    memcpy(p + fixed, msg->u.hello.cluster_id, tail);
    break;
  case PS_MSG_ERROR:
    /* The message often quotes user input (a path, a name): a byte that
     * could break the one-line rule becomes '?' rather than losing the
     * whole error. */
    for (size_t i = 0; i < tail; i++) {
      unsigned char c = (unsigned char)msg->u.error.message[i];
      p[fixed + i] = msg_byte_ok(c) ? c : '?';
    }
    break;
  default: {
    /* The floats, then any sparse blocks. */
    ps_sparse_kind kind;
    const ps_sparse *sp = sparse_of(msg, &kind);
    size_t blocks = sp != NULL ? (size_t)sp->bytes : 0;
    if (is_float_type(msg->type) && tail > blocks)
      memcpy(p + fixed, float_data(msg), tail - blocks);
    if (blocks > 0)
      memcpy(p + len - blocks, sp->data, blocks);
    break;
  }
  }
  return PS_PROTO_HEADER_SIZE + (size_t)len;
}

size_t ps_proto_encode_prefix(const ps_msg *msg, uint64_t request_id, uint8_t *out) {
  uint32_t len;
  if (!is_float_type(msg->type))
    return 0;
  /* The floats are not read here, so only their count is checked: a
   * stand-in pointer lets payload_length accept a NULL data pointer. */
  ps_msg m = *msg;
  set_float_data(&m, (const uint8_t *)"");
  if (payload_length(&m, 0, &len) != 0)
    return 0;
  put_header(out, m.type, request_id, len);
  put_fixed(&m, out + PS_PROTO_HEADER_SIZE);
  return PS_PROTO_HEADER_SIZE + (size_t)fixed_size[m.type];
}

uint64_t ps_proto_max_payload(uint64_t floats) {
  if (floats > (UINT64_MAX - FLOAT_FIXED_MAX) / 4)
    return UINT64_MAX;
  return FLOAT_FIXED_MAX + 4 * floats;
}

uint64_t ps_proto_max_payload_sparse(uint64_t floats, uint64_t sparse) {
  uint64_t n = ps_proto_max_payload(floats);
  return sparse > UINT64_MAX - n ? UINT64_MAX : n + sparse;
}

/* ------------------------------------------------------------------------ */
/* Authentication                                                           */
/* ------------------------------------------------------------------------ */

/* The HMAC input: nonce || role || index || incarnation || layout_hash ||
 * cluster_id.  Binding the identity to the server's fresh nonce means a
 * recorded HELLO cannot be replayed, nor edited to claim another identity. */
static int compute_proof(const uint8_t *secret, size_t secret_len,
                         const uint8_t nonce[PS_PROTO_NONCE_SIZE], const ps_msg_hello *hello,
                         uint8_t proof[PS_PROTO_PROOF_SIZE]) {
  uint8_t in[PS_PROTO_NONCE_SIZE + 1 + 4 + 8 + 8 + PS_PROTO_CLUSTER_ID_MAX];
  size_t id_len = strnlen(hello->cluster_id, PS_PROTO_CLUSTER_ID_MAX);
  memcpy(in, nonce, PS_PROTO_NONCE_SIZE);
  uint8_t *p = in + PS_PROTO_NONCE_SIZE;
  p[0] = hello->role;
  ps_put_le32(p + 1, hello->index);
  ps_put_le64(p + 5, hello->incarnation);
  ps_put_le64(p + 13, hello->layout_hash);
  memcpy(p + 21, hello->cluster_id, id_len);
  size_t n = PS_PROTO_NONCE_SIZE + 21 + id_len;

  /* OpenSSL's HMAC init reads a NULL key as "keep the previous key", so an
   * empty secret is passed as a real, empty key. */
  static const uint8_t empty = 0;
  unsigned int md_len = 0;
  if (HMAC(EVP_sha256(), secret_len > 0 ? secret : &empty, (int)secret_len, in, n, proof,
           &md_len) == NULL ||
      md_len != PS_PROTO_PROOF_SIZE)
    return -1;
  return 0;
}

void ps_proto_auth_proof(const uint8_t *secret, size_t secret_len,
                         const uint8_t nonce[PS_PROTO_NONCE_SIZE], const ps_msg_hello *hello,
                         uint8_t proof[PS_PROTO_PROOF_SIZE]) {
  /* A failed HMAC (out of memory) leaves zeros, which the server refuses:
   * the connection fails with an auth error rather than a crash. */
  if (compute_proof(secret, secret_len, nonce, hello, proof) != 0)
    memset(proof, 0, PS_PROTO_PROOF_SIZE);
}

int ps_proto_auth_check(const uint8_t *secret, size_t secret_len,
                        const uint8_t nonce[PS_PROTO_NONCE_SIZE], const ps_msg_hello *hello) {
  uint8_t want[PS_PROTO_PROOF_SIZE];
  if (compute_proof(secret, secret_len, nonce, hello, want) != 0)
    return 0;
  return CRYPTO_memcmp(want, hello->proof, PS_PROTO_PROOF_SIZE) == 0;
}
