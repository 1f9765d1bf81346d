/* libFuzzer target for the wire codec: a byte stream read as frames must be accepted or refused cleanly, and what is accepted must re-encode to the same bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_PAYLOAD (1u << 20)

/* A refused frame leaves a one-line message that carries its code. */
static void check_error(int rc, const ps_errbuf *eb) {
  if (rc >= 0 || eb->code != rc || memchr(eb->msg, '\0', sizeof eb->msg) == NULL ||
      strchr(eb->msg, '\n') != NULL || eb->msg[0] == '\0')
    abort();
}

/* The floats of a float-carrying message (PULL_REPLY, PUSH, FETCH_REPLY,
 * LOAD, RING_CHUNK), or NULL. */
static const uint8_t *floats_of(const ps_msg *m, uint64_t *count) {
  switch (m->type) {
  case PS_MSG_PUSH: *count = m->u.push.count; return m->u.push.data;
  case PS_MSG_PULL_REPLY: *count = m->u.pull_reply.count; return m->u.pull_reply.data;
  case PS_MSG_FETCH_REPLY: *count = m->u.fetch_reply.count; return m->u.fetch_reply.data;
  case PS_MSG_LOAD: *count = m->u.load.count; return m->u.load.data;
  case PS_MSG_RING_CHUNK: *count = m->u.ring_chunk.count; return m->u.ring_chunk.data;
  default: *count = 0; return NULL;
  }
}

/* The sparse blocks of a PULL, PULL_REPLY or PUSH, or NULL. */
static ps_sparse *sparse_of(ps_msg *m) {
  switch (m->type) {
  case PS_MSG_PULL: return &m->u.pull.sparse;
  case PS_MSG_PULL_REPLY: return &m->u.pull_reply.sparse;
  case PS_MSG_PUSH: return &m->u.push.sparse;
  default: return NULL;
  }
}

static void clear_floats(ps_msg *m) {
  ps_sparse *sp = sparse_of(m);
  if (sp != NULL)
    sp->data = NULL;
  switch (m->type) {
  case PS_MSG_PUSH: m->u.push.data = NULL; break;
  case PS_MSG_PULL_REPLY: m->u.pull_reply.data = NULL; break;
  case PS_MSG_FETCH_REPLY: m->u.fetch_reply.data = NULL; break;
  case PS_MSG_LOAD: m->u.load.data = NULL; break;
  case PS_MSG_RING_CHUNK: m->u.ring_chunk.data = NULL; break;
  default: break;
  }
}

/* Two decoded messages are the same when their floats hold the same bytes
 * and everything else is equal; decode zeroes the struct first, so the rest
 * compares bytewise once the float pointers are set aside. */
static int same_msg(const ps_msg *a, const ps_msg *b) {
  uint64_t na, nb;
  const uint8_t *fa = floats_of(a, &na), *fb = floats_of(b, &nb);
  if (na != nb || (na > 0 && memcmp(fa, fb, 4 * na) != 0))
    return 0;
  ps_msg x = *a, y = *b;
  const ps_sparse *sa = sparse_of(&x), *sb = sparse_of(&y);
  if (sa != NULL && (sa->bytes != sb->bytes ||
                     (sa->bytes > 0 && memcmp(sa->data, sb->data, sa->bytes) != 0)))
    return 0;
  clear_floats(&x);
  clear_floats(&y);
  return memcmp(&x, &y, sizeof x) == 0;
}

/* Everything the decoder accepts has exactly one encoding (zero padding,
 * exact lengths), so re-encoding must give back the received bytes. */
static void check_accepted(const ps_frame_header *h, const uint8_t *frame, const ps_msg *m) {
  size_t n = PS_PROTO_HEADER_SIZE + (size_t)h->length;
  uint8_t *re = malloc(n);
  if (re == NULL)
    return;
  if (ps_proto_encode(m, h->request_id, re, n) != n || memcmp(re, frame, n) != 0)
    abort();
  if (n > PS_PROTO_HEADER_SIZE && ps_proto_encode(m, h->request_id, re, n - 1) != 0)
    abort();

  ps_frame_header h2;
  ps_msg m2;
  ps_errbuf eb = {0};
  if (ps_proto_decode_header(re, MAX_PAYLOAD, &h2, &eb) != 0 ||
      h2.type != h->type || h2.request_id != h->request_id || h2.length != h->length ||
      ps_proto_decode(&h2, re + PS_PROTO_HEADER_SIZE, h2.length, &m2, &eb) != 0 ||
      !same_msg(m, &m2))
    abort();

  /* The zero-copy path: prefix then the floats gives the same frame. */
  uint64_t count;
  const uint8_t *f = floats_of(m, &count);
  ps_msg copy = *m;
  const ps_sparse *sp = sparse_of(&copy);
  uint64_t blocks = sp != NULL ? sp->bytes : 0;
  if (f != NULL) {
    uint8_t prefix[PS_PROTO_PREFIX_MAX];
    size_t np = ps_proto_encode_prefix(m, h->request_id, prefix);
    if (np == 0 || np + 4 * count + blocks != n || memcmp(prefix, frame, np) != 0)
      abort();
  } else if (ps_proto_encode_prefix(m, h->request_id, re) != 0) {
    abort();
  }
  free(re);

  /* A PUSH's bags as a shard turns them into rows: a section of rows
   * alone, as many blocks, no key twice in a block. */
  if (m->type == PS_MSG_PUSH && ps_sparse_has_bags(PS_SPARSE_KV, sp->data, sp->bytes)) {
    uint8_t *rows = NULL;
    size_t cap = 0;
    uint64_t len = 0;
    uint32_t before, after;
    if (ps_sparse_check(PS_SPARSE_KV | PS_SPARSE_BAGS_OK, sp->data, sp->bytes, &before, NULL) != 0 ||
        ps_sparse_unbag(sp->data, sp->bytes, &rows, &cap, &len) != 0 ||
        ps_sparse_check(PS_SPARSE_KV, rows, len, &after, NULL) != 0 || after != before)
      abort();
    free(rows);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  while (size >= PS_PROTO_HEADER_SIZE) {
    ps_frame_header h;
    ps_errbuf eb = {0};
    int rc = ps_proto_decode_header(data, MAX_PAYLOAD, &h, &eb);
    if (rc != 0) {
      /* A receiver answers ERROR and closes: nothing after this is read. */
      check_error(rc, &eb);
      return 0;
    }
    if (size - PS_PROTO_HEADER_SIZE < h.length)
      return 0;
    /* Own, exactly sized copy of the payload, as a receiver has, so that
     * any read past the end is caught by AddressSanitizer. */
    uint8_t *payload = malloc(h.length > 0 ? h.length : 1);
    if (payload == NULL)
      return 0;
    memcpy(payload, data + PS_PROTO_HEADER_SIZE, h.length);
    ps_msg m;
    rc = ps_proto_decode(&h, payload, h.length, &m, &eb);
    if (rc != 0) {
      check_error(rc, &eb);
      static const ps_msg zero;
      if (memcmp(&m, &zero, sizeof m) != 0)
        abort();
      free(payload);
      return 0;
    }
    if ((int)m.type != h.type)
      abort();
    check_accepted(&h, data, &m);
    free(payload);
    data += PS_PROTO_HEADER_SIZE + h.length;
    size -= PS_PROTO_HEADER_SIZE + h.length;
  }
  return 0;
}
