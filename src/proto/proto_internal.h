/* What the encoder (proto.c) and the decoder (decode.c) of the wire
 * frames share: each type's fixed size (PROTOCOL.md's offsets) and the
 * field rules both apply.  Internal to src/proto. */
#ifndef PS_PROTO_INTERNAL_H
#define PS_PROTO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

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
  PULL_FIXED = 32,
  PULL_REPLY_FIXED = 32,
  PUSH_FIXED = 48,
  PUSH_ACK_SIZE = 32,
  STATS_SIZE = 0,
  STATS_REPLY_SIZE = 88,
  ERROR_FIXED = 16,
  PING_SIZE = 8,
  STATE_SIZE = PS_STATE_WIRE_SIZE, /* the ps_state_info block inside CUT_REPLY and LOAD */
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
  FLOAT_FIXED_MAX = LOAD_FIXED, /* the largest fixed part of a float-carrying type */
};

static const uint32_t fixed_size[PS_MSG_TYPE_MAX + 1] = {
    [PS_MSG_CHALLENGE] = CHALLENGE_SIZE,   [PS_MSG_HELLO] = HELLO_FIXED,
    [PS_MSG_WELCOME] = WELCOME_SIZE,       [PS_MSG_PULL] = PULL_FIXED,
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

static inline int is_float_type(int type) {
  return type == PS_MSG_PULL_REPLY || type == PS_MSG_PUSH || type == PS_MSG_FETCH_REPLY ||
         type == PS_MSG_LOAD || type == PS_MSG_RING_CHUNK;
}

/* Types whose payload may pass the small cap: the float-carrying ones and
 * a PULL's keys. */
static inline int is_large_type(int type) { return is_float_type(type) || type == PS_MSG_PULL; }

/* The sparse blocks a PULL, PULL_REPLY or PUSH carries (NULL: another
 * type), and their kind. */
static inline const ps_sparse *sparse_of(const ps_msg *m, ps_sparse_kind *kind) {
  switch (m->type) {
  case PS_MSG_PULL: *kind = PS_SPARSE_K; return &m->u.pull.sparse;
  case PS_MSG_PULL_REPLY: *kind = PS_SPARSE_V; return &m->u.pull_reply.sparse;
  case PS_MSG_PUSH: *kind = PS_SPARSE_KV; return &m->u.push.sparse;
  default: return NULL;
  }
}

/* The count and data of a float-carrying message. */
static inline uint64_t float_count(const ps_msg *m) {
  switch (m->type) {
  case PS_MSG_PUSH: return m->u.push.count;
  case PS_MSG_PULL_REPLY: return m->u.pull_reply.count;
  case PS_MSG_FETCH_REPLY: return m->u.fetch_reply.count;
  case PS_MSG_LOAD: return m->u.load.count;
  case PS_MSG_RING_CHUNK: return m->u.ring_chunk.count;
  default: return 0;
  }
}

static inline const uint8_t *float_data(const ps_msg *m) {
  switch (m->type) {
  case PS_MSG_PUSH: return m->u.push.data;
  case PS_MSG_PULL_REPLY: return m->u.pull_reply.data;
  case PS_MSG_FETCH_REPLY: return m->u.fetch_reply.data;
  case PS_MSG_LOAD: return m->u.load.data;
  case PS_MSG_RING_CHUNK: return m->u.ring_chunk.data;
  default: return NULL;
  }
}

static inline void set_float_data(ps_msg *m, const uint8_t *data) {
  switch (m->type) {
  case PS_MSG_PUSH: m->u.push.data = data; break;
  case PS_MSG_PULL_REPLY: m->u.pull_reply.data = data; break;
  case PS_MSG_FETCH_REPLY: m->u.fetch_reply.data = data; break;
  case PS_MSG_LOAD: m->u.load.data = data; break;
  case PS_MSG_RING_CHUNK: m->u.ring_chunk.data = data; break;
  default: break;
  }
}

static inline int role_ok(unsigned role) {
  return role >= PS_ROLE_WORKER && role <= PS_ROLE_TOOL;
}

/* Cluster ids end up in Redis keys and log lines, so they are kept to a set
 * of bytes that needs no quoting anywhere.  Returns the index of the first
 * bad byte, or -1. */
static inline int cluster_id_bad_byte(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
          c == '_' || c == '.' || c == '-'))
      return (int)i;
  }
  return -1;
}

/* An ERROR message is shown to a user as one log line: printable ASCII only. */
static inline int msg_byte_ok(unsigned char c) {
  return c >= 0x20 && c <= 0x7e;
}

static inline int all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0)
      return 0;
  return 1;
}

#endif
