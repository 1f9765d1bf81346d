/* Encoding and decoding of wire frames (src/proto/PROTOCOL.md, version 3): pure, no I/O. */
#include "proto/proto.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/endian.h"

/* Integers are written with shifts and so do not depend on the host, but
 * float arrays travel as the host's bytes: only a little-endian host sends
 * the little-endian IEEE 754 floats the spec promises. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "paramserv's wire format copies floats as host bytes: little-endian hosts only");
_Static_assert(sizeof(float) == 4, "the wire carries 4-byte IEEE 754 floats");

/* ------------------------------------------------------------------------ */
/* Message sizes and field rules shared by the encoder and the decoder      */
/* ------------------------------------------------------------------------ */

/* Bytes of each type's fixed part, the offsets of PROTOCOL.md.  Fixed parts
 * of float-carrying types are multiples of 16 so that their floats land on a
 * 16-byte boundary of the receiver's aligned payload buffer. */
enum {
  CHALLENGE_SIZE = 48,
  HELLO_FIXED = 58,
  WELCOME_SIZE = 56,
  PULL_SIZE = 16,
  PULL_REPLY_FIXED = 32,
  PUSH_FIXED = 48,
  PUSH_ACK_SIZE = 32,
  STATS_SIZE = 0,
  STATS_REPLY_SIZE = 88,
  ERROR_FIXED = 16,
  PING_SIZE = 8,
  STATE_SIZE = 48,          /* the ps_state_info block inside CUT_REPLY and LOAD */
  /* Every chief -> shard frame starts with its 8-byte fence token. */
  CUT_SIZE = 24,
  CUT_REPLY_SIZE = 8 + STATE_SIZE,
  RESUME_SIZE = 16,
  FETCH_SIZE = 32,
  FETCH_REPLY_FIXED = 32,
  LOAD_STATE_AT = 16,       /* the fence, 8 reserved bytes, then the state block */
  LOAD_FIXED = LOAD_STATE_AT + STATE_SIZE + 16,
  STOP_SIZE = 16,
  RING_JOIN_SIZE = 24,
  RING_CHUNK_FIXED = 48,
  FLOAT_FIXED_MAX = 80,     /* the largest fixed part of a float-carrying type */
};

static const uint32_t fixed_size[PS_MSG_TYPE_MAX + 1] = {
    [PS_MSG_CHALLENGE] = CHALLENGE_SIZE,   [PS_MSG_HELLO] = HELLO_FIXED,
    [PS_MSG_WELCOME] = WELCOME_SIZE,       [PS_MSG_PULL] = PULL_SIZE,
    [PS_MSG_PULL_REPLY] = PULL_REPLY_FIXED, [PS_MSG_PUSH] = PUSH_FIXED,
    [PS_MSG_PUSH_ACK] = PUSH_ACK_SIZE,     [PS_MSG_STATS] = STATS_SIZE,
    [PS_MSG_STATS_REPLY] = STATS_REPLY_SIZE, [PS_MSG_ERROR] = ERROR_FIXED,
    [PS_MSG_PING] = PING_SIZE,             [PS_MSG_PONG] = PING_SIZE,
    [PS_MSG_CUT] = CUT_SIZE,               [PS_MSG_CUT_REPLY] = CUT_REPLY_SIZE,
    [PS_MSG_RESUME] = RESUME_SIZE,         [PS_MSG_FETCH] = FETCH_SIZE,
    [PS_MSG_FETCH_REPLY] = FETCH_REPLY_FIXED, [PS_MSG_LOAD] = LOAD_FIXED,
    [PS_MSG_STOP] = STOP_SIZE,
    [PS_MSG_RING_JOIN] = RING_JOIN_SIZE,   [PS_MSG_RING_CHUNK] = RING_CHUNK_FIXED,
};

_Static_assert(PULL_REPLY_FIXED % 16 == 0 && PUSH_FIXED % 16 == 0 &&
                   FETCH_REPLY_FIXED % 16 == 0 && LOAD_FIXED % 16 == 0 &&
                   RING_CHUNK_FIXED % 16 == 0 && RING_CHUNK_FIXED <= FLOAT_FIXED_MAX &&
                   LOAD_FIXED <= FLOAT_FIXED_MAX && PUSH_FIXED <= FLOAT_FIXED_MAX,
               "floats must start 16-byte aligned in the payload");
_Static_assert(PS_PROTO_HEADER_SIZE + HELLO_FIXED + PS_PROTO_CLUSTER_ID_MAX <=
                   PS_PROTO_SMALL_PAYLOAD_MAX &&
                   ERROR_FIXED + PS_PROTO_ERROR_MSG_MAX <= PS_PROTO_SMALL_PAYLOAD_MAX,
               "every small message must fit under the small payload cap");
_Static_assert(PS_PROTO_HEADER_SIZE + STATS_REPLY_SIZE <= PS_PROTO_PREFIX_MAX,
               "PS_PROTO_PREFIX_MAX must hold a header and any fixed part");

static int is_float_type(int type) {
  return type == PS_MSG_PULL_REPLY || type == PS_MSG_PUSH || type == PS_MSG_FETCH_REPLY ||
         type == PS_MSG_LOAD || type == PS_MSG_RING_CHUNK;
}

/* The count and data of a float-carrying message. */
static uint64_t float_count(const ps_msg *m) {
  switch (m->type) {
  case PS_MSG_PUSH: return m->u.push.count;
  case PS_MSG_PULL_REPLY: return m->u.pull_reply.count;
  case PS_MSG_FETCH_REPLY: return m->u.fetch_reply.count;
  case PS_MSG_LOAD: return m->u.load.count;
  case PS_MSG_RING_CHUNK: return m->u.ring_chunk.count;
  default: return 0;
  }
}

static const uint8_t *float_data(const ps_msg *m) {
  switch (m->type) {
  case PS_MSG_PUSH: return m->u.push.data;
  case PS_MSG_PULL_REPLY: return m->u.pull_reply.data;
  case PS_MSG_FETCH_REPLY: return m->u.fetch_reply.data;
  case PS_MSG_LOAD: return m->u.load.data;
  case PS_MSG_RING_CHUNK: return m->u.ring_chunk.data;
  default: return NULL;
  }
}

static void set_float_data(ps_msg *m, const uint8_t *data) {
  switch (m->type) {
  case PS_MSG_PUSH: m->u.push.data = data; break;
  case PS_MSG_PULL_REPLY: m->u.pull_reply.data = data; break;
  case PS_MSG_FETCH_REPLY: m->u.fetch_reply.data = data; break;
  case PS_MSG_LOAD: m->u.load.data = data; break;
  case PS_MSG_RING_CHUNK: m->u.ring_chunk.data = data; break;
  default: break;
  }
}

static int state_ok(const ps_state_info *st) {
  return st->nslots <= 2 && st->has_accum <= 1;
}

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

static int role_ok(unsigned role) {
  return role >= PS_ROLE_WORKER && role <= PS_ROLE_TOOL;
}

/* Cluster ids end up in Redis keys and log lines, so they are kept to a set
 * of bytes that needs no quoting anywhere.  Returns the index of the first
 * bad byte, or -1. */
static int cluster_id_bad_byte(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
          c == '_' || c == '.' || c == '-'))
      return (int)i;
  }
  return -1;
}

/* An ERROR message is shown to a user as one log line: printable ASCII only. */
static int msg_byte_ok(unsigned char c) {
  return c >= 0x20 && c <= 0x7e;
}

static int all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0)
      return 0;
  return 1;
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
  uint64_t cap = is_float_type(h->type) ? max_payload : PS_PROTO_SMALL_PAYLOAD_MAX;
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
 * refuse).  Returns 0 or -1. */
static int payload_length(const ps_msg *msg, uint32_t *len) {
  int type = msg->type;
  if (type < 1 || type > PS_MSG_TYPE_MAX)
    return -1;
  uint64_t n = fixed_size[type];
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
    if (!state_ok(&msg->u.load.state) || msg->u.load.offset > msg->u.load.state.image_floats ||
        msg->u.load.count > msg->u.load.state.image_floats - msg->u.load.offset)
      return -1;
    /* fall through */
  case PS_MSG_PULL_REPLY:
  case PS_MSG_PUSH:
  case PS_MSG_FETCH_REPLY:
  case PS_MSG_RING_CHUNK: {
    uint64_t count = float_count(msg);
    if (count > (UINT32_MAX - n) / 4 || (count > 0 && float_data(msg) == NULL))
      return -1;
    n += 4 * count;
    break;
  }
  case PS_MSG_CUT_REPLY:
    if (!state_ok(&msg->u.cut_reply.state))
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

static void put_state(uint8_t *p, const ps_state_info *st) {
  ps_put_le64(p, st->version);
  ps_put_le64(p + 8, st->global_step);
  ps_put_le64(p + 16, st->image_floats);
  ps_put_le32(p + 24, st->nslots);
  ps_put_le32(p + 28, st->has_accum);
  ps_put_le32(p + 32, st->accum_count);
  ps_put_le32(p + 36, st->target);
  ps_put_le32(p + 40, st->nonce);
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
    break;
  case PS_MSG_PULL_REPLY: {
    const ps_msg_pull_reply *m = &msg->u.pull_reply;
    ps_put_le64(p, m->version);
    ps_put_le64(p + 8, m->global_step);
    ps_put_le64(p + 16, m->count);
    break;
  }
  case PS_MSG_PUSH: {
    const ps_msg_push *m = &msg->u.push;
    ps_put_le32(p, m->worker);
    ps_put_le64(p + 8, m->incarnation);
    ps_put_le64(p + 16, m->seq);
    ps_put_le64(p + 24, m->step);
    ps_put_le64(p + 32, m->count);
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
    put_state(p + 8, &msg->u.cut_reply.state);
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
    put_state(p + LOAD_STATE_AT, &msg->u.load.state);
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
  if (payload_length(msg, &len) != 0 || cap < PS_PROTO_HEADER_SIZE ||
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
  default:
    if (is_float_type(msg->type) && tail > 0)
      memcpy(p + fixed, float_data(msg), tail);
    break;
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
  if (payload_length(&m, &len) != 0)
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

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

static int check_exact(const char *name, size_t len, size_t want, ps_errbuf *eb) {
  if (len != want)
    return ps_err_set(eb, PS_EFORMAT, "%s: payload is %zu bytes, expected %zu", name, len, want);
  return 0;
}

static int check_fixed(const char *name, size_t len, size_t fixed, ps_errbuf *eb) {
  if (len < fixed)
    return ps_err_set(eb, PS_EFORMAT, "%s: payload is %zu bytes, shorter than its %zu-byte fixed part",
                      name, len, fixed);
  return 0;
}

/* Padding is reserved for later versions, which can only use it if every
 * version-1 peer has sent zeros. */
static int check_pad(const char *name, const uint8_t *p, size_t off, size_t n, ps_errbuf *eb) {
  if (!all_zero(p + off, n))
    return ps_err_set(eb, PS_EFORMAT, "%s: padding bytes %zu..%zu are not zero", name, off,
                      off + n - 1);
  return 0;
}

static int check_role(const char *name, unsigned role, ps_errbuf *eb) {
  if (!role_ok(role))
    return ps_err_set(eb, PS_EFORMAT, "%s: role is %u, expected 1..4 (worker, chief, ps, tool)",
                      name, role);
  return 0;
}

/* The float tail after a fixed part: exactly 4 * count bytes, with count
 * compared by division so that a huge count cannot overflow. */
static int check_count(const char *name, size_t len, size_t fixed, uint64_t count,
                       ps_errbuf *eb) {
  size_t rest = len - fixed;
  if (rest % 4 == 0 && count == rest / 4)
    return 0;
  if (count > (UINT64_MAX - fixed) / 4)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: payload is %zu bytes, expected %zu + 4 * count (count %" PRIu64
                      "), which overflows",
                      name, len, fixed, count);
  return ps_err_set(eb, PS_EFORMAT,
                    "%s: payload is %zu bytes, expected %zu + 4 * count (count %" PRIu64
                    ") = %" PRIu64,
                    name, len, fixed, count, (uint64_t)fixed + 4 * count);
}

static int decode_hello(const uint8_t *p, size_t len, ps_msg_hello *m, ps_errbuf *eb) {
  int rc;
  if ((rc = check_fixed("HELLO", len, HELLO_FIXED, eb)) != 0 ||
      (rc = check_role("HELLO", p[0], eb)) != 0 || (rc = check_pad("HELLO", p, 1, 3, eb)) != 0)
    return rc;
  size_t id_len = ps_get_le16(p + 56);
  if (id_len < 1 || id_len > PS_PROTO_CLUSTER_ID_MAX)
    return ps_err_set(eb, PS_EFORMAT, "HELLO: cluster id length is %zu, expected 1..%d", id_len,
                      PS_PROTO_CLUSTER_ID_MAX);
  if (len != HELLO_FIXED + id_len)
    return ps_err_set(eb, PS_EFORMAT,
                      "HELLO: payload is %zu bytes, expected %d + cluster id length %zu = %zu",
                      len, HELLO_FIXED, id_len, HELLO_FIXED + id_len);
  const char *id = (const char *)p + HELLO_FIXED;
  int bad = cluster_id_bad_byte(id, id_len);
  if (bad >= 0)
    return ps_err_set(eb, PS_EFORMAT, "HELLO: cluster id byte %d is 0x%02x, expected [A-Za-z0-9_.-]",
                      bad, (unsigned)(unsigned char)id[bad]);
  m->role = p[0];
  m->index = ps_get_le32(p + 4);
  m->incarnation = ps_get_le64(p + 8);
  m->layout_hash = ps_get_le64(p + 16);
  memcpy(m->proof, p + 24, PS_PROTO_PROOF_SIZE);
  memcpy(m->cluster_id, id, id_len);
  m->cluster_id[id_len] = '\0';
  return 0;
}

static int decode_error(const uint8_t *p, size_t len, ps_msg_error *m, ps_errbuf *eb) {
  int rc;
  if ((rc = check_fixed("ERROR", len, ERROR_FIXED, eb)) != 0 ||
      (rc = check_pad("ERROR", p, 10, 6, eb)) != 0)
    return rc;
  m->code = (int32_t)ps_get_le32(p);
  m->flags = ps_get_le32(p + 4);
  size_t msg_len = ps_get_le16(p + 8);
  if (m->code >= 0)
    return ps_err_set(eb, PS_EFORMAT, "ERROR: code is %" PRId32 ", expected a negative error code",
                      m->code);
  if ((m->flags & ~PS_ERROR_RETRY) != 0)
    return ps_err_set(eb, PS_EFORMAT, "ERROR: flags are 0x%" PRIx32 ", expected only 0x%x (RETRY)",
                      m->flags, PS_ERROR_RETRY);
  if (msg_len > PS_PROTO_ERROR_MSG_MAX)
    return ps_err_set(eb, PS_EFORMAT, "ERROR: message length is %zu, expected at most %d", msg_len,
                      PS_PROTO_ERROR_MSG_MAX);
  if (len != ERROR_FIXED + msg_len)
    return ps_err_set(eb, PS_EFORMAT,
                      "ERROR: payload is %zu bytes, expected %d + message length %zu = %zu", len,
                      ERROR_FIXED, msg_len, ERROR_FIXED + msg_len);
  for (size_t i = 0; i < msg_len; i++)
    if (!msg_byte_ok(p[ERROR_FIXED + i]))
      return ps_err_set(eb, PS_EFORMAT,
                        "ERROR: message byte %zu is 0x%02x, expected printable ASCII on one line",
                        i, (unsigned)p[ERROR_FIXED + i]);
  memcpy(m->message, p + ERROR_FIXED, msg_len);
  m->message[msg_len] = '\0';
  return 0;
}

static int decode_pull_reply(const uint8_t *p, size_t len, ps_msg_pull_reply *m, ps_errbuf *eb) {
  int rc;
  if ((rc = check_fixed("PULL_REPLY", len, PULL_REPLY_FIXED, eb)) != 0 ||
      (rc = check_pad("PULL_REPLY", p, 24, 8, eb)) != 0)
    return rc;
  m->version = ps_get_le64(p);
  m->global_step = ps_get_le64(p + 8);
  m->count = ps_get_le64(p + 16);
  if ((rc = check_count("PULL_REPLY", len, PULL_REPLY_FIXED, m->count, eb)) != 0)
    return rc;
  m->data = p + PULL_REPLY_FIXED;
  return 0;
}

static int decode_push(const uint8_t *p, size_t len, ps_msg_push *m, ps_errbuf *eb) {
  int rc;
  if ((rc = check_fixed("PUSH", len, PUSH_FIXED, eb)) != 0 ||
      (rc = check_pad("PUSH", p, 4, 4, eb)) != 0 || (rc = check_pad("PUSH", p, 40, 8, eb)) != 0)
    return rc;
  m->worker = ps_get_le32(p);
  m->incarnation = ps_get_le64(p + 8);
  m->seq = ps_get_le64(p + 16);
  m->step = ps_get_le64(p + 24);
  m->count = ps_get_le64(p + 32);
  if ((rc = check_count("PUSH", len, PUSH_FIXED, m->count, eb)) != 0)
    return rc;
  m->data = p + PUSH_FIXED;
  return 0;
}

static int decode_ring_chunk(const uint8_t *p, size_t len, ps_msg_ring_chunk *m, ps_errbuf *eb) {
  int rc;
  if ((rc = check_fixed("RING_CHUNK", len, RING_CHUNK_FIXED, eb)) != 0 ||
      (rc = check_pad("RING_CHUNK", p, 20, 4, eb)) != 0 ||
      (rc = check_pad("RING_CHUNK", p, 40, 8, eb)) != 0)
    return rc;
  m->epoch = ps_get_le64(p);
  m->step = ps_get_le64(p + 8);
  m->phase = ps_get_le32(p + 16);
  m->offset = ps_get_le64(p + 24);
  m->count = ps_get_le64(p + 32);
  if ((rc = check_count("RING_CHUNK", len, RING_CHUNK_FIXED, m->count, eb)) != 0)
    return rc;
  if (m->offset > UINT64_MAX - m->count)
    return ps_err_set(eb, PS_EFORMAT, "RING_CHUNK: floats %" PRIu64 "..+%" PRIu64 " overflow",
                      m->offset, m->count);
  m->data = p + RING_CHUNK_FIXED;
  return 0;
}

/* The state block at payload offset `at` (8 in CUT_REPLY, 0 in LOAD); errors
 * name payload offsets, as every other message's do. */
static int get_state(const char *name, const uint8_t *payload, size_t at, ps_state_info *st,
                     ps_errbuf *eb) {
  const uint8_t *p = payload + at;
  int rc;
  if ((rc = check_pad(name, payload, at + 44, 4, eb)) != 0)
    return rc;
  st->version = ps_get_le64(p);
  st->global_step = ps_get_le64(p + 8);
  st->image_floats = ps_get_le64(p + 16);
  st->nslots = ps_get_le32(p + 24);
  st->has_accum = ps_get_le32(p + 28);
  st->accum_count = ps_get_le32(p + 32);
  st->target = ps_get_le32(p + 36);
  st->nonce = ps_get_le32(p + 40);
  if (!state_ok(st))
    return ps_err_set(eb, PS_EFORMAT, "%s: %" PRIu32 " slots and has_accum %" PRIu32
                      ", expected at most 2 slots and has_accum 0 or 1", name, st->nslots,
                      st->has_accum);
  return 0;
}

static int decode_fetch_reply(const uint8_t *p, size_t len, ps_msg_fetch_reply *m,
                              ps_errbuf *eb) {
  int rc;
  if ((rc = check_fixed("FETCH_REPLY", len, FETCH_REPLY_FIXED, eb)) != 0 ||
      (rc = check_pad("FETCH_REPLY", p, 24, 8, eb)) != 0)
    return rc;
  m->cut_id = ps_get_le64(p);
  m->offset = ps_get_le64(p + 8);
  m->count = ps_get_le64(p + 16);
  if ((rc = check_count("FETCH_REPLY", len, FETCH_REPLY_FIXED, m->count, eb)) != 0)
    return rc;
  m->data = p + FETCH_REPLY_FIXED;
  return 0;
}

/* The fence token at payload offset 0 of a chief -> shard frame. */
static int get_fence(const char *name, const uint8_t *p, uint64_t *fence, ps_errbuf *eb) {
  *fence = ps_get_le64(p);
  if (*fence == 0)
    return ps_err_set(eb, PS_EFORMAT, "%s: fence token is 0, expected the chief's lease token "
                      "(at least 1)", name);
  return 0;
}

static int decode_load(const uint8_t *p, size_t len, ps_msg_load *m, ps_errbuf *eb) {
  int rc;
  if ((rc = check_fixed("LOAD", len, LOAD_FIXED, eb)) != 0 ||
      (rc = get_fence("LOAD", p, &m->fence, eb)) != 0 ||
      (rc = check_pad("LOAD", p, 8, 8, eb)) != 0 ||
      (rc = get_state("LOAD", p, LOAD_STATE_AT, &m->state, eb)) != 0)
    return rc;
  m->offset = ps_get_le64(p + LOAD_STATE_AT + STATE_SIZE);
  m->count = ps_get_le64(p + LOAD_STATE_AT + STATE_SIZE + 8);
  if ((rc = check_count("LOAD", len, LOAD_FIXED, m->count, eb)) != 0)
    return rc;
  if (m->offset > m->state.image_floats || m->count > m->state.image_floats - m->offset)
    return ps_err_set(eb, PS_EFORMAT,
                      "LOAD: floats %" PRIu64 "..+%" PRIu64 " lie outside the image of %" PRIu64,
                      m->offset, m->count, m->state.image_floats);
  m->data = p + LOAD_FIXED;
  return 0;
}

/* The fixed-size messages: the length was checked by the caller. */
static int decode_fixed(int type, const uint8_t *p, ps_msg *out, ps_errbuf *eb) {
  const char *name = ps_proto_type_name(type);
  int rc = 0;
  switch (type) {
  case PS_MSG_CHALLENGE: {
    ps_msg_challenge *m = &out->u.challenge;
    if ((rc = check_role(name, p[32], eb)) != 0 || (rc = check_pad(name, p, 33, 3, eb)) != 0)
      return rc;
    memcpy(m->nonce, p, PS_PROTO_NONCE_SIZE);
    m->role = p[32];
    m->index = ps_get_le32(p + 36);
    m->incarnation = ps_get_le64(p + 40);
    break;
  }
  case PS_MSG_WELCOME: {
    ps_msg_welcome *m = &out->u.welcome;
    if ((rc = check_pad(name, p, 5, 3, eb)) != 0 || (rc = check_pad(name, p, 52, 4, eb)) != 0)
      return rc;
    m->index = ps_get_le32(p);
    m->consistency = p[4];
    m->incarnation = ps_get_le64(p + 8);
    m->layout_hash = ps_get_le64(p + 16);
    m->slice_floats = ps_get_le64(p + 24);
    m->version = ps_get_le64(p + 32);
    m->global_step = ps_get_le64(p + 40);
    m->max_payload = ps_get_le32(p + 48);
    break;
  }
  case PS_MSG_PULL:
    if ((rc = check_pad(name, p, 4, 4, eb)) != 0)
      return rc;
    out->u.pull.worker = ps_get_le32(p);
    out->u.pull.step = ps_get_le64(p + 8);
    break;
  case PS_MSG_PUSH_ACK: {
    ps_msg_push_ack *m = &out->u.push_ack;
    if ((rc = check_pad(name, p, 28, 4, eb)) != 0)
      return rc;
    m->seq = ps_get_le64(p);
    m->version = ps_get_le64(p + 8);
    m->global_step = ps_get_le64(p + 16);
    m->status = ps_get_le32(p + 24);
    if (m->status > PS_PUSH_STALE)
      return ps_err_set(eb, PS_EFORMAT,
                        "PUSH_ACK: status is %" PRIu32 ", expected 0..2 (applied, duplicate, stale)",
                        m->status);
    break;
  }
  case PS_MSG_STATS_REPLY: {
    ps_msg_stats_reply *m = &out->u.stats_reply;
    uint64_t *const v[10] = {&m->version,          &m->global_step,   &m->incarnation,
                             &m->pushes_applied,   &m->pushes_duplicate, &m->pushes_stale,
                             &m->pulls,            &m->bytes_in,      &m->bytes_out,
                             &m->clients};
    for (int i = 0; i < 10; i++)
      *v[i] = ps_get_le64(p + 8 * i);
    m->flags = ps_get_le64(p + 80);
    if ((m->flags & ~(uint64_t)(PS_STATS_INITIALIZED | PS_STATS_PAUSED)) != 0)
      return ps_err_set(eb, PS_EFORMAT, "STATS_REPLY: flags are 0x%" PRIx64 ", expected only 0x3",
                        m->flags);
    break;
  }
  case PS_MSG_PING:
  case PS_MSG_PONG:
    out->u.ping.token = ps_get_le64(p);
    break;
  case PS_MSG_CUT:
    if ((rc = get_fence(name, p, &out->u.cut.fence, eb)) != 0 ||
        (rc = check_pad(name, p, 20, 4, eb)) != 0)
      return rc;
    out->u.cut.cut_id = ps_get_le64(p + 8);
    out->u.cut.hold_ms = ps_get_le32(p + 16);
    break;
  case PS_MSG_RESUME:
    if ((rc = get_fence(name, p, &out->u.resume.fence, eb)) != 0)
      return rc;
    out->u.resume.cut_id = ps_get_le64(p + 8);
    break;
  case PS_MSG_CUT_REPLY:
    out->u.cut_reply.cut_id = ps_get_le64(p);
    return get_state(name, p, 8, &out->u.cut_reply.state, eb);
  case PS_MSG_FETCH:
    if ((rc = get_fence(name, p, &out->u.fetch.fence, eb)) != 0)
      return rc;
    out->u.fetch.cut_id = ps_get_le64(p + 8);
    out->u.fetch.offset = ps_get_le64(p + 16);
    out->u.fetch.count = ps_get_le64(p + 24);
    break;
  case PS_MSG_STOP:
    if ((rc = get_fence(name, p, &out->u.stop.fence, eb)) != 0)
      return rc;
    out->u.stop.step = ps_get_le64(p + 8);
    break;
  case PS_MSG_RING_JOIN:
    if ((rc = check_pad(name, p, 20, 4, eb)) != 0)
      return rc;
    out->u.ring_join.epoch = ps_get_le64(p);
    out->u.ring_join.step = ps_get_le64(p + 8);
    out->u.ring_join.rank = ps_get_le32(p + 16);
    break;
  default: /* STATS: nothing to read */
    break;
  }
  return 0;
}

int ps_proto_decode(const ps_frame_header *h, const uint8_t *payload, size_t len, ps_msg *out,
                    ps_errbuf *eb) {
  int type = h->type;
  /* Zeroed so that a rejected message leaves nothing half-filled and two
   * decodes of the same bytes compare equal byte for byte. */
  memset(out, 0, sizeof *out);
  if (type < 1 || type > PS_MSG_TYPE_MAX)
    return ps_err_set(eb, PS_EFORMAT, "frame: unknown message type %d, expected 1..%d", type,
                      PS_MSG_TYPE_MAX);
  const char *name = ps_proto_type_name(type);
  if (len != h->length)
    return ps_err_set(eb, PS_EFORMAT, "%s: payload is %zu bytes, but the header says %" PRIu32,
                      name, len, h->length);
  int rc;
  switch (type) {
  case PS_MSG_HELLO:
    rc = decode_hello(payload, len, &out->u.hello, eb);
    break;
  case PS_MSG_ERROR:
    rc = decode_error(payload, len, &out->u.error, eb);
    break;
  case PS_MSG_PULL_REPLY:
    rc = decode_pull_reply(payload, len, &out->u.pull_reply, eb);
    break;
  case PS_MSG_PUSH:
    rc = decode_push(payload, len, &out->u.push, eb);
    break;
  case PS_MSG_FETCH_REPLY:
    rc = decode_fetch_reply(payload, len, &out->u.fetch_reply, eb);
    break;
  case PS_MSG_LOAD:
    rc = decode_load(payload, len, &out->u.load, eb);
    break;
  case PS_MSG_RING_CHUNK:
    rc = decode_ring_chunk(payload, len, &out->u.ring_chunk, eb);
    break;
  default:
    rc = check_exact(name, len, fixed_size[type], eb);
    if (rc == 0)
      rc = decode_fixed(type, payload, out, eb);
    break;
  }
  if (rc != 0) {
    memset(out, 0, sizeof *out);
    return rc;
  }
  out->type = (ps_msg_type)type;
  return 0;
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
