/* Pull replies (see server_internal.h): written from the slice itself when
 * the socket takes them whole, else the rest from a copy of the slice made
 * once per version into a pooled buffer that every such reply shares. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "net/conn.h"
#include "proto/proto.h"
#include "common/timeutil.h"
#include "ps/server_internal.h"

/* A copy of the slice at one version, shared by every pull reply of that
 * version whose write did not complete at once.  Copying keeps each reply one
 * version even when pushes are applied during its write.  Buffers are kept
 * for reuse: a fresh multi-megabyte malloc per pull would be mmapped,
 * faulted in page by page and unmapped again, which costs more than the
 * copy itself. */
typedef struct reply_buf {
  struct server *srv;
  float *data;
  uint64_t version;
  int refs;
  struct reply_buf *next;  /* in the free list */
} reply_buf;

#define REPLY_BUFS_KEPT 2

static void reply_buf_release(reply_buf *b) {
  server *s = b->srv;
  if (--b->refs > 0 || b == s->reply_cur)
    return;
  if (s->reply_nfree < REPLY_BUFS_KEPT) {
    b->next = s->reply_free;
    s->reply_free = b;
    s->reply_nfree++;
    return;
  }
  free(b->data);
  free(b);
}

/* A buffer holding the slice at the shard's current version. */
static reply_buf *reply_buf_get(server *s) {
  size_t n = ps_shard_options(s->shard)->nfloats;
  reply_buf *b = s->reply_cur;
  if (b != NULL && b->version == ps_shard_version(s->shard)) {
    b->refs++;
    return b;
  }
  if (b != NULL) {
    s->reply_cur = NULL;
    b->refs++;
    reply_buf_release(b);  /* back to the pool once its writes are done */
  }
  b = s->reply_free;
  if (b != NULL) {
    s->reply_free = b->next;
    s->reply_nfree--;
  } else {
    b = calloc(1, sizeof *b);
    if (b == NULL || posix_memalign((void **)&b->data, 64, (n ? n : 1) * sizeof(float))) {
      free(b);
      return NULL;
    }
    b->srv = s;
  }
  memcpy(b->data, ps_shard_values(s->shard), n * sizeof(float));
  b->version = ps_shard_version(s->shard);
  b->refs = 1;
  s->reply_cur = b;
  return b;
}

static void reply_written(void *arg, int status) {
  (void)status;
  reply_buf_release(arg);
}

static void free_written(void *arg, int status) {
  (void)status;
  free(arg);
}

/* Block b's bags pooled into out (n * dim floats): each bag's rows summed,
 * a row read as many times as the bag holds its key.  @return 0 or
 * -ENOMEM. */
static int pool_bags(server *s, const ps_sparse_block *b, float *out) {
  uint32_t most = 0;
  for (uint64_t i = 0; i < b->n; i++) {
    uint32_t c = ps_get_le32(b->heads + 8 * i + 4);
    most = c > most ? c : most;
  }
  size_t dim = b->dim;
  float *rows = malloc((size_t)most * dim * sizeof *rows);
  uint64_t *keys = malloc((size_t)most * sizeof *keys);
  if (rows == NULL || keys == NULL) {
    free(rows);
    free(keys);
    return -ENOMEM;
  }
  const uint8_t *k = b->keys;
  for (uint64_t i = 0; i < b->n; i++, out += dim) {
    uint32_t c = ps_get_le32(b->heads + 8 * i + 4);
    for (uint32_t j = 0; j < c; j++, k += 8)
      keys[j] = ps_get_le64(k);
    ps_shard_table_pull(s->shard, (int)b->table, keys, c, rows);
    memcpy(out, rows, dim * sizeof(float));
    for (uint32_t j = 1; j < c; j++)
      for (size_t d = 0; d < dim; d++)
        out[d] += rows[j * dim + d];
  }
  free(rows);
  free(keys);
  return 0;
}

/* A reply to a PULL that asked for rows: the slice and a V block per K
 * block asked (a P block, the pooled bags, per B block), built whole in
 * one buffer (the rows are read now, so the reply is one version however
 * long its write takes). */
static void sparse_reply(client *cl, uint64_t req, ps_msg *m) {
  server *s = cl->srv;
  ps_sparse asked = {.bytes = cl->pull_keys_bytes, .data = cl->pull_keys};
  ps_sparse_iter it;
  ps_sparse_block b;
  uint64_t sparse = 0;
  ps_sparse_iter_init(&asked, &it);
  while (ps_sparse_iter_next(&it, PS_SPARSE_K, &b))
    sparse += ps_sparse_block_bytes(PS_SPARSE_V, b.dim, b.n);  /* a P block's size too */
  size_t dense = ps_shard_options(s->shard)->nfloats * sizeof(float);
  m->u.pull_reply.sparse.bytes = sparse;
  uint8_t prefix[PS_PROTO_PREFIX_MAX];
  size_t plen = ps_proto_encode_prefix(m, req, prefix);
  uint8_t *body = plen ? malloc(dense + sparse) : NULL;
  if (body == NULL) {
    ps_conn_fail(cl->conn, -ENOMEM, PS_ERROR_RETRY, "shard %d: out of memory for a pull reply",
                 s->index);
    return;
  }
  memcpy(body, ps_shard_values(s->shard), dense);
  uint8_t *p = body + dense;
  ps_sparse_iter_init(&asked, &it);
  while (ps_sparse_iter_next(&it, PS_SPARSE_K, &b)) {
    /* PROTOCOL.md's block head, then the rows, read straight into place:
     * the copied keys are 8-byte aligned (each block is 16 + 8 n bytes
     * from the buffer's start), the rows 4-byte aligned. */
    ps_put_le32(p, b.table | (b.bags ? PS_SPARSE_BAGS : 0));
    ps_put_le32(p + 4, b.dim);
    ps_put_le64(p + 8, b.n);
    float *rows = (float *)(void *)(p + 16);
    if (!b.bags) {
      ps_shard_table_pull(s->shard, (int)b.table, (const uint64_t *)(const void *)b.keys,
                          (size_t)b.n, rows);
    } else if (pool_bags(s, &b, rows) != 0) {
      free(body);
      ps_conn_fail(cl->conn, -ENOMEM, PS_ERROR_RETRY, "shard %d: out of memory pooling bags",
                   s->index);
      return;
    }
    p += ps_sparse_block_bytes(PS_SPARSE_V, b.dim, b.n);
  }
  s->pulls++;
  if (ps_conn_send(cl->conn, prefix, plen, body, dense + sparse, free_written, body) != 0) {
    free(body);
    ps_conn_close(cl->conn);
  }
}

void ps_server_pull_reply(client *cl, uint64_t req) {
  server *s = cl->srv;
  if (!s->pulled) {
    s->pulled = 1;
    ps_log(PS_LOG_INFO, "first pull answered %.3f s after start",
           (double)(ps_now_ns() - s->started_ns) * 1e-9);
  }
  ps_msg m = {.type = PS_MSG_PULL_REPLY};
  m.u.pull_reply.version = ps_shard_version(s->shard);
  m.u.pull_reply.global_step = ps_shard_global_step(s->shard);
  m.u.pull_reply.count = ps_shard_options(s->shard)->nfloats;
  if (cl->pull_keys_bytes > 0) {
    sparse_reply(cl, req, &m);
    return;
  }
  uint8_t prefix[PS_PROTO_PREFIX_MAX];
  size_t plen = ps_proto_encode_prefix(&m, req, prefix);
  size_t bytes = ps_shard_options(s->shard)->nfloats * sizeof(float);
  s->pulls++;
  /* Most replies fit the socket's buffer: written from the slice itself,
   * they need no copy.  Only what the socket does not take now is sent
   * from a copy of this version. */
  size_t sent;
  int rc = ps_conn_try_send(cl->conn, prefix, plen, ps_shard_values(s->shard), bytes, &sent);
  if (rc != 0) {
    if (rc != UV_ECANCELED)
      ps_conn_close(cl->conn);  /* the socket failed: the worker reconnects */
    return;
  }
  if (sent == plen + bytes)
    return;
  reply_buf *b = reply_buf_get(s);
  size_t head = sent < plen ? sent : plen, body = sent - head;
  if (b != NULL && ps_conn_send(cl->conn, prefix + head, plen - head,
                                (const uint8_t *)b->data + body, bytes - body, reply_written,
                                b) == 0)
    return;
  if (b != NULL)
    reply_buf_release(b);
  /* Part of this frame may be out: no other frame (not even an ERROR) can
   * follow it on this connection, so it closes and the worker reconnects. */
  if (sent > 0)
    ps_conn_close(cl->conn);
  else
    ps_conn_fail(cl->conn, -ENOMEM, PS_ERROR_RETRY, "shard %d: out of memory for a pull reply",
                 s->index);
}

void ps_server_pull_bufs_free(server *s) {
  if (s->reply_cur != NULL && s->reply_cur->refs == 0) {
    free(s->reply_cur->data);
    free(s->reply_cur);
  }
  s->reply_cur = NULL;
  while (s->reply_free != NULL) {
    reply_buf *b = s->reply_free;
    s->reply_free = b->next;
    free(b->data);
    free(b);
  }
}
