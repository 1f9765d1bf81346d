/* A worker's sparse rows split by shard (see sparse_split.h). */
#include "worker/sparse_split.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "paramserv/error.h"

static int grow(void **p, size_t *cap, size_t need, size_t size) {
  if (need <= *cap)
    return 0;
  size_t n = *cap ? *cap : 64;
  while (n < need)
    n *= 2;
  void *q = realloc(*p, n * size);
  if (q == NULL)
    return -ENOMEM;
  *p = q;
  *cap = n;
  return 0;
}

/* Table t's keys of shard s into its part: a block of the keys the owner
 * array gives s (count of them), in ascending order. */
static int put_block(ps_sparse_part *p, ps_sparse_kind kind, const ps_sparse_batch *b, int t,
                     const uint16_t *owner, int s, size_t count) {
  size_t dim = b->dims[t], bytes = (size_t)ps_sparse_block_bytes(kind, (uint32_t)dim, count);
  if (grow((void **)&p->bytes, &p->cap, p->len + bytes, 1) != 0 ||
      grow((void **)&p->idx, &p->idx_cap, p->nidx + count, sizeof *p->idx) != 0)
    return -ENOMEM;
  uint8_t *at = p->bytes + p->len;
  /* PROTOCOL.md's block: table, dim, n, the keys, then (KV) the rows. */
  ps_put_le32(at, (uint32_t)t);
  ps_put_le32(at + 4, (uint32_t)dim);
  ps_put_le64(at + 8, count);
  uint8_t *key = at + 16, *val = key + 8 * count;
  for (size_t i = 0; i < b->n[t]; i++) {
    if (owner[i] != s)
      continue;
    ps_put_le64(key, b->keys[t][i]);
    key += 8;
    p->idx[p->nidx++] = (uint32_t)i;
    if (kind == PS_SPARSE_KV) {
      memcpy(val, b->grads[t] + i * dim, dim * sizeof(float));
      val += dim * sizeof(float);
    }
  }
  p->len += bytes;
  return 0;
}

/* Table t's bags for shard s (owner: each distinct key's shard) into its
 * part: a B block (kind K) or BG block (KV) of the samples with a key of
 * s, or none when no sample has one. */
static int put_bags(ps_sparse_part *p, ps_sparse_kind kind, const ps_sparse_batch *b, int t,
                    const uint16_t *owner, int s) {
  const uint32_t *boff = b->boff[t], *bag = b->bag[t];
  size_t nbags = 0, nkeys = 0, dim = b->dims[t];
  for (size_t i = 0; i < b->nsamples[t]; i++) {
    size_t c = 0;
    for (uint32_t j = boff[i]; j < boff[i + 1]; j++)
      c += owner[bag[j]] == s;
    nbags += c > 0;
    nkeys += c;
  }
  if (nbags == 0)
    return 0;
  size_t bytes = (size_t)ps_sparse_bag_bytes(kind, (uint32_t)dim, nbags, nkeys);
  if (grow((void **)&p->bytes, &p->cap, p->len + bytes, 1) != 0 ||
      grow((void **)&p->idx, &p->idx_cap, p->nidx + nbags, sizeof *p->idx) != 0)
    return -ENOMEM;
  uint8_t *at = p->bytes + p->len;
  ps_put_le32(at, (uint32_t)t | PS_SPARSE_BAGS);
  ps_put_le32(at + 4, (uint32_t)dim);
  ps_put_le64(at + 8, nbags);
  uint8_t *head = at + 16, *key = head + 8 * nbags, *val = key + 8 * nkeys;
  for (size_t i = 0; i < b->nsamples[t]; i++) {
    uint32_t c = 0;
    for (uint32_t j = boff[i]; j < boff[i + 1]; j++) {
      if (owner[bag[j]] != s)
        continue;
      ps_put_le64(key, b->keys[t][bag[j]]);
      key += 8;
      c++;
    }
    if (c == 0)
      continue;
    ps_put_le32(head, (uint32_t)i);
    ps_put_le32(head + 4, c);
    head += 8;
    p->idx[p->nidx++] = (uint32_t)i;
    if (kind == PS_SPARSE_KV) {
      memcpy(val, b->bgrads[t] + i * dim, dim * sizeof(float));
      val += dim * sizeof(float);
    }
  }
  p->len += bytes;
  return 0;
}

int ps_sparse_split(const ps_hashring *ring, const ps_sparse_batch *b, ps_sparse_kind kind,
                    ps_sparse_part *const *parts) {
  int ns = ring->nshards, rc = 0;
  for (int s = 0; s < ns; s++)
    ps_sparse_part_clear(parts[s]);
  size_t most = 0;
  for (int t = 0; t < b->ntables; t++)
    most = b->n[t] > most ? b->n[t] : most;
  uint16_t *owner = malloc((most ? most : 1) * sizeof *owner);
  size_t *count = calloc((size_t)ns, sizeof *count);
  if (owner == NULL || count == NULL)
    rc = -ENOMEM;
  for (int t = 0; t < b->ntables && rc == 0; t++) {
    memset(count, 0, (size_t)ns * sizeof *count);
    for (size_t i = 0; i < b->n[t]; i++) {
      if (i > 0 && b->keys[t][i] <= b->keys[t][i - 1]) {
        rc = -EINVAL;
        break;
      }
      owner[i] = (uint16_t)ps_hashring_owner(ring, (uint32_t)t, b->keys[t][i]);
      count[owner[i]]++;
    }
    if (b->bags[t] && kind == PS_SPARSE_K && b->nsamples[t] > 0)
      memset(b->pooled[t], 0, b->nsamples[t] * b->dims[t] * sizeof(float));
    for (int s = 0; s < ns && rc == 0; s++)
      if (b->bags[t])
        rc = put_bags(parts[s], kind, b, t, owner, s);
      else if (count[s] > 0)
        rc = put_block(parts[s], kind, b, t, owner, s, count[s]);
  }
  free(owner);
  free(count);
  if (rc != 0)
    for (int s = 0; s < ns; s++)
      ps_sparse_part_clear(parts[s]);
  return rc;
}

int ps_sparse_scatter(const ps_sparse_part *asked, const ps_sparse *reply,
                      const ps_sparse_batch *b, char *why, size_t why_len) {
  ps_sparse q = {.bytes = asked->len, .data = asked->bytes};
  ps_sparse_iter qi, ri;
  ps_sparse_block qb, rb;
  ps_sparse_iter_init(&q, &qi);
  ps_sparse_iter_init(reply, &ri);
  const uint32_t *idx = asked->idx;
  for (;;) {
    int more_q = ps_sparse_iter_next(&qi, PS_SPARSE_K, &qb);
    int more_r = ps_sparse_iter_next(&ri, PS_SPARSE_V, &rb);
    if (!more_q && !more_r)
      return 0;
    if (more_q != more_r || qb.table != rb.table || qb.dim != rb.dim || qb.n != rb.n ||
        qb.bags != rb.bags) {
      snprintf(why, why_len, "sparse %s of table %" PRIu32 " (dim %" PRIu32 ", %" PRIu64
               "), expected %s of table %" PRIu32 " (dim %" PRIu32 ", %" PRIu64 ")",
               more_r && rb.bags ? "pooled bags" : "rows", more_r ? rb.table : 0,
               more_r ? rb.dim : 0, more_r ? rb.n : 0, more_q && qb.bags ? "pooled bags" : "rows",
               more_q ? qb.table : 0, more_q ? qb.dim : 0, more_q ? qb.n : 0);
      return PS_EFORMAT;
    }
    size_t row = (size_t)qb.dim * sizeof(float);
    if (qb.bags) {
      /* Each bag's part pooled by this shard, added to its sample's. */
      float *dst = b->pooled[qb.table];
      for (uint64_t i = 0; i < qb.n; i++)
        ps_sparse_add_row(dst + (size_t)idx[i] * qb.dim, rb.values + i * row, qb.dim);
    } else {
      float *dst = b->rows[qb.table];
      for (uint64_t i = 0; i < qb.n; i++)
        memcpy(dst + (size_t)idx[i] * qb.dim, rb.values + i * row, row);
    }
    idx += qb.n;
  }
}

void ps_sparse_part_free(ps_sparse_part *p) {
  free(p->bytes);
  free(p->idx);
  *p = (ps_sparse_part){0};
}
