/* Sparse blocks (PROTOCOL.md, "Sparse blocks"): the rows a PULL asks for,
 * a PULL_REPLY sends back and a PUSH updates.  Pure, no I/O; decode.c and
 * proto.c call it for the frames that carry them. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "proto/proto.h"

static int has_keys(ps_sparse_kind k) { return k == PS_SPARSE_K || k == PS_SPARSE_KV; }
static int has_values(ps_sparse_kind k) { return k == PS_SPARSE_KV || k == PS_SPARSE_V; }

uint64_t ps_sparse_block_bytes(ps_sparse_kind kind, uint32_t dim, uint64_t n) {
  uint64_t per = (has_keys(kind) ? 8u : 0u) + (has_values(kind) ? 4ull * dim : 0u);
  if (per != 0 && n > (UINT64_MAX - PS_SPARSE_HEAD) / per)
    return UINT64_MAX;
  return PS_SPARSE_HEAD + n * per;
}

uint64_t ps_sparse_bag_bytes(ps_sparse_kind kind, uint32_t dim, uint64_t n, uint64_t nkeys) {
  if (kind == PS_SPARSE_V)
    return ps_sparse_block_bytes(PS_SPARSE_V, dim, n);
  uint64_t heads = ps_sparse_block_bytes(PS_SPARSE_K, dim, n);  /* 16 + 8 n */
  uint64_t vals = kind == PS_SPARSE_KV ? ps_sparse_block_bytes(PS_SPARSE_V, dim, n) - PS_SPARSE_HEAD
                                       : 0;
  if (heads == UINT64_MAX || vals == UINT64_MAX - PS_SPARSE_HEAD ||
      nkeys > (UINT64_MAX - heads) / 8 || vals > UINT64_MAX - heads - 8 * nkeys)
    return UINT64_MAX;
  return heads + 8 * nkeys + vals;
}

void ps_sparse_iter_init(const ps_sparse *s, ps_sparse_iter *it) {
  it->p = s->data;
  it->end = s->data != NULL ? s->data + s->bytes : NULL;
}

int ps_sparse_iter_next(ps_sparse_iter *it, ps_sparse_kind kind, ps_sparse_block *out) {
  if (it->p == NULL || it->p >= it->end)
    return 0;
  const uint8_t *p = it->p;
  uint32_t table = ps_get_le32(p);
  out->table = table & ~PS_SPARSE_BAGS;
  out->bags = (table & PS_SPARSE_BAGS) != 0;
  out->dim = ps_get_le32(p + 4);
  out->n = ps_get_le64(p + 8);
  p += PS_SPARSE_HEAD;
  out->heads = NULL;
  out->nkeys = out->n;
  if (out->bags && has_keys(kind)) {
    out->heads = p;
    out->nkeys = 0;
    for (uint64_t i = 0; i < out->n; i++)
      out->nkeys += ps_get_le32(p + 8 * i + 4);
    p += 8 * out->n;
  }
  out->keys = has_keys(kind) ? p : NULL;
  p += has_keys(kind) ? 8 * out->nkeys : 0;
  out->values = has_values(kind) ? p : NULL;
  it->p = it->p + (out->bags ? ps_sparse_bag_bytes(kind, out->dim, out->n, out->nkeys)
                             : ps_sparse_block_bytes(kind, out->dim, out->n));
  return 1;
}

int ps_sparse_has_bags(ps_sparse_kind kind, const uint8_t *data, uint64_t bytes) {
  ps_sparse sp = {.bytes = bytes, .data = data};
  ps_sparse_iter it;
  ps_sparse_block b;
  ps_sparse_iter_init(&sp, &it);
  while (ps_sparse_iter_next(&it, kind, &b))
    if (b.bags)
      return 1;
  return 0;
}

/* A bag block's heads from p (n of them, within left bytes): samples
 * strictly ascending, counts >= 1; their counts summed into *nkeys.
 * @return 0 or PS_EFORMAT. */
static int check_heads(const uint8_t *p, uint64_t n, uint64_t left, uint32_t b, uint32_t table,
                       uint64_t *nkeys, ps_errbuf *eb) {
  if (n > left / 8)
    return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): %" PRIu64
                      " bags need %s bytes of heads, %" PRIu64 " left", b, table, n,
                      n > UINT64_MAX / 8 ? "more than 2^64" : "more", left);
  uint64_t keys = 0;
  for (uint64_t i = 0; i < n; i++) {
    uint32_t sample = ps_get_le32(p + 8 * i), count = ps_get_le32(p + 8 * i + 4);
    if (i > 0 && sample <= ps_get_le32(p + 8 * (i - 1)))
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): bag %"
                        PRIu64 " of sample %" PRIu32 " not above sample %" PRIu32 ", expected "
                        "strictly ascending samples", b, table, i, sample,
                        ps_get_le32(p + 8 * (i - 1)));
    if (count == 0)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): bag %"
                        PRIu64 " (sample %" PRIu32 ") of 0 keys, expected at least 1 (a bag "
                        "with none is not sent)", b, table, i, sample);
    keys += count;  /* at most 2^61 bags of fewer than 2^32: no wrap */
  }
  *nkeys = keys;
  return 0;
}

int ps_sparse_check(int kind_bags, const uint8_t *data, uint64_t bytes, uint32_t *blocks,
                    ps_errbuf *eb) {
  ps_sparse_kind kind = (ps_sparse_kind)(kind_bags & ~PS_SPARSE_BAGS_OK);
  int bags_ok = (kind_bags & PS_SPARSE_BAGS_OK) != 0;
  uint64_t at = 0;
  uint32_t b = 0, ignored;
  int64_t last_table = -1;
  if (blocks == NULL)
    blocks = &ignored;
  *blocks = 0;
  if (bytes > 0 && data == NULL)
    return ps_err_set(eb, PS_EFORMAT, "sparse: %" PRIu64 " bytes of blocks and no data", bytes);
  while (at < bytes) {
    if (bytes - at < PS_SPARSE_HEAD)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 ": %" PRIu64 " bytes left, a "
                        "block head needs %d", b, bytes - at, PS_SPARSE_HEAD);
    const uint8_t *p = data + at;
    uint32_t table = ps_get_le32(p), dim = ps_get_le32(p + 4);
    uint64_t n = ps_get_le64(p + 8);
    int bags = (table & PS_SPARSE_BAGS) != 0;
    table &= ~PS_SPARSE_BAGS;
    if (bags && !bags_ok)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): a bag "
                        "block, expected rows (bags are turned into rows before they are kept)",
                        b, table);
    if ((int64_t)table <= last_table)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 ": table %" PRIu32 " after "
                        "table %" PRId64 ", expected ascending tables", b, table, last_table);
    if (dim < 1 || dim > PS_PROTO_SPARSE_DIM_MAX)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): dim %"
                        PRIu32 ", expected 1..%d", b, table, dim, PS_PROTO_SPARSE_DIM_MAX);
    if (n == 0)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): 0 rows, "
                        "expected at least 1 (a table with none has no block)", b, table);
    uint64_t nkeys = n, need;
    if (bags && has_keys(kind)) {
      int rc = check_heads(p + PS_SPARSE_HEAD, n, bytes - at - PS_SPARSE_HEAD, b, table, &nkeys,
                           eb);
      if (rc != 0)
        return rc;
    }
    need = bags ? ps_sparse_bag_bytes(kind, dim, n, nkeys) : ps_sparse_block_bytes(kind, dim, n);
    if (need > bytes - at)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): %"
                        PRIu64 " rows of dim %" PRIu32 " need %s bytes, %" PRIu64 " left", b,
                        table, n, dim, need == UINT64_MAX ? "more than 2^64" : "more", bytes - at);
    if (has_keys(kind) && !bags) {
      const uint8_t *k = p + PS_SPARSE_HEAD;
      for (uint64_t i = 1; i < n; i++) {
        uint64_t prev = ps_get_le64(k + 8 * (i - 1)), key = ps_get_le64(k + 8 * i);
        if (key <= prev)
          return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): key %"
                            PRIu64 " (row %" PRIu64 ") not above key %" PRIu64 ", expected "
                            "strictly ascending keys", b, table, key, i, prev);
      }
    }
    last_table = table;
    at += need;
    b++;
  }
  *blocks = b;
  return 0;
}

size_t ps_sparse_put(uint8_t *out, size_t cap, ps_sparse_kind kind, uint32_t table, uint32_t dim,
                     uint64_t n, const uint64_t *keys, const float *values) {
  uint64_t need = ps_sparse_block_bytes(kind, dim, n);
  if (n == 0 || dim < 1 || dim > PS_PROTO_SPARSE_DIM_MAX || need > cap ||
      (has_keys(kind) && keys == NULL) || (has_values(kind) && values == NULL))
    return 0;
  for (uint64_t i = 1; has_keys(kind) && i < n; i++)
    if (keys[i] <= keys[i - 1])
      return 0;
  ps_put_le32(out, table);
  ps_put_le32(out + 4, dim);
  ps_put_le64(out + 8, n);
  uint8_t *p = out + PS_SPARSE_HEAD;
  for (uint64_t i = 0; has_keys(kind) && i < n; i++, p += 8)
    ps_put_le64(p, keys[i]);
  if (has_values(kind))
    memcpy(p, values, (size_t)(n * dim * sizeof(float)));
  return (size_t)need;
}

/* A bag block's (key, bag) pairs, sorted: the order unbag sums in. */
typedef struct key_bag {
  uint64_t key, bag;
} key_bag;

static int key_bag_cmp(const void *a, const void *b) {
  const key_bag *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return (x->bag > y->bag) - (x->bag < y->bag);
}

/* Block b's pairs into *pairs (sorted); @return the distinct keys, or -1
 * out of memory. */
static int64_t sorted_pairs(const ps_sparse_block *b, key_bag **pairs) {
  *pairs = malloc((b->nkeys ? b->nkeys : 1) * sizeof **pairs);
  if (*pairs == NULL)
    return -1;
  uint64_t k = 0;
  for (uint64_t i = 0; i < b->n; i++)
    for (uint32_t c = ps_get_le32(b->heads + 8 * i + 4); c > 0; c--, k++)
      (*pairs)[k] = (key_bag){ps_get_le64(b->keys + 8 * k), i};
  qsort(*pairs, (size_t)b->nkeys, sizeof **pairs, key_bag_cmp);
  int64_t u = 0;
  for (uint64_t j = 0; j < b->nkeys; j++)
    u += j == 0 || (*pairs)[j].key != (*pairs)[j - 1].key;
  return u;
}

void ps_sparse_add_row(float *dst, const uint8_t *src, uint32_t dim) {
  float v[64];
  for (uint32_t d0 = 0; d0 < dim; d0 += 64) {
    uint32_t m = dim - d0 < 64 ? dim - d0 : 64;
    memcpy(v, src + 4 * (size_t)d0, 4 * (size_t)m);
    for (uint32_t d = 0; d < m; d++)
      dst[d0 + d] += v[d];
  }
}

/* Room for `need` more bytes after the first `used` of *buf.  @return 0
 * or -ENOMEM. */
static int room(uint8_t **buf, size_t *cap, size_t used, uint64_t need) {
  if (used + need <= *cap)
    return 0;
  size_t c = *cap * 2 > used + need ? *cap * 2 : used + (size_t)need;
  uint8_t *p = realloc(*buf, c);
  if (p == NULL)
    return -ENOMEM;
  *buf = p;
  *cap = c;
  return 0;
}

int ps_sparse_unbag(const uint8_t *data, uint64_t bytes, uint8_t **buf, size_t *cap,
                    uint64_t *out) {
  ps_sparse sp = {.bytes = bytes, .data = data};
  ps_sparse_iter it;
  ps_sparse_block b;
  size_t used = 0;
  ps_sparse_iter_init(&sp, &it);
  for (const uint8_t *at = it.p; ps_sparse_iter_next(&it, PS_SPARSE_KV, &b); at = it.p) {
    if (!b.bags) {
      uint64_t len = ps_sparse_block_bytes(PS_SPARSE_KV, b.dim, b.n);
      if (room(buf, cap, used, len) != 0)
        return -ENOMEM;
      memcpy(*buf + used, at, (size_t)len);
      used += (size_t)len;
      continue;
    }
    key_bag *pairs;
    int64_t u = sorted_pairs(&b, &pairs);
    size_t row = (size_t)b.dim * sizeof(float);
    float *sum = u < 0 ? NULL : calloc(b.dim, sizeof *sum);
    if (sum == NULL ||
        room(buf, cap, used, ps_sparse_block_bytes(PS_SPARSE_KV, b.dim, (uint64_t)u)) != 0) {
      free(sum);
      free(pairs);
      return -ENOMEM;
    }
    uint8_t *o = *buf + used;
    ps_put_le32(o, b.table);
    ps_put_le32(o + 4, b.dim);
    ps_put_le64(o + 8, (uint64_t)u);
    uint8_t *key = o + PS_SPARSE_HEAD, *val = key + 8 * (uint64_t)u;
    for (uint64_t j = 0; j < b.nkeys; j++) {
      ps_sparse_add_row(sum, b.values + pairs[j].bag * row, b.dim);
      if (j + 1 == b.nkeys || pairs[j + 1].key != pairs[j].key) {
        ps_put_le64(key, pairs[j].key);
        key += 8;
        memcpy(val, sum, row);
        val += row;
        memset(sum, 0, row);
      }
    }
    free(sum);
    free(pairs);
    used = (size_t)(val - *buf);
  }
  *out = used;
  return 0;
}
