/* Decoding of wire frames (PROTOCOL.md): every length, count, pad and
 * field checked before anything is trusted; pure, no I/O.  The encoder is
 * proto.c. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/endian.h"
#include "proto/proto.h"
#include "proto/proto_internal.h"

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

/* The tail after a fixed part: 4 * count bytes of floats, then exactly
 * `sparse` bytes of blocks of `kind`, compared without overflow; *out
 * points at the blocks. */
static int check_sparse(const char *name, const uint8_t *p, size_t len, size_t fixed,
                        uint64_t count, uint64_t sparse, ps_sparse_kind kind, ps_sparse *out,
                        ps_errbuf *eb) {
  size_t rest = len - fixed;
  if (sparse > rest)
    return ps_err_set(eb, PS_EFORMAT, "%s: payload is %zu bytes, fewer than its %zu-byte fixed "
                      "part and %" PRIu64 " bytes of sparse blocks", name, len, fixed, sparse);
  int rc = check_count(name, len - (size_t)sparse, fixed, count, eb);
  if (rc != 0)
    return rc;
  out->bytes = sparse;
  out->data = sparse ? p + (len - sparse) : NULL;
  uint32_t blocks;
  ps_errbuf why = {0};
  if (sparse && ps_sparse_check(kind | PS_SPARSE_BAGS_OK, out->data, sparse, &blocks, &why) != 0)
    return ps_err_set(eb, PS_EFORMAT, "%s: %s", name, why.msg);
  return 0;
}

static int decode_pull(const uint8_t *p, size_t len, ps_msg_pull *m, ps_errbuf *eb) {
  int rc;
  if ((rc = check_fixed("PULL", len, PULL_FIXED, eb)) != 0 ||
      (rc = check_pad("PULL", p, 4, 4, eb)) != 0 || (rc = check_pad("PULL", p, 24, 8, eb)) != 0)
    return rc;
  m->worker = ps_get_le32(p);
  m->step = ps_get_le64(p + 8);
  return check_sparse("PULL", p, len, PULL_FIXED, 0, ps_get_le64(p + 16), PS_SPARSE_K,
                      &m->sparse, eb);
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
  if ((rc = check_fixed("PULL_REPLY", len, PULL_REPLY_FIXED, eb)) != 0)
    return rc;
  m->version = ps_get_le64(p);
  m->global_step = ps_get_le64(p + 8);
  m->count = ps_get_le64(p + 16);
  if ((rc = check_sparse("PULL_REPLY", p, len, PULL_REPLY_FIXED, m->count, ps_get_le64(p + 24),
                         PS_SPARSE_V, &m->sparse, eb)) != 0)
    return rc;
  m->data = p + PULL_REPLY_FIXED;
  return 0;
}

static int decode_push(const uint8_t *p, size_t len, ps_msg_push *m, ps_errbuf *eb) {
  int rc;
  if ((rc = check_fixed("PUSH", len, PUSH_FIXED, eb)) != 0 ||
      (rc = check_pad("PUSH", p, 4, 4, eb)) != 0)
    return rc;
  m->worker = ps_get_le32(p);
  m->incarnation = ps_get_le64(p + 8);
  m->seq = ps_get_le64(p + 16);
  m->step = ps_get_le64(p + 24);
  m->count = ps_get_le64(p + 32);
  if ((rc = check_sparse("PUSH", p, len, PUSH_FIXED, m->count, ps_get_le64(p + 40), PS_SPARSE_KV,
                         &m->sparse, eb)) != 0)
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
  if ((rc = check_pad(name, payload, at + PS_STATE_WIRE_USED,
                      PS_STATE_WIRE_SIZE - PS_STATE_WIRE_USED, eb)) != 0)
    return rc;
  uint64_t found;
  const ps_state_field *f = ps_state_wire_get(p, st, &found);
  if (f != NULL)
    return ps_err_set(eb, PS_EFORMAT, "%s: state field %s is %" PRIu64 ", expected at most %"
                      PRIu64, name, f->name, found, f->max);
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
  case PS_MSG_PULL:
    rc = decode_pull(payload, len, &out->u.pull, eb);
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
