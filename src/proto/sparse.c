/* Sparse blocks (PROTOCOL.md, "Sparse blocks"): the rows a PULL asks for,
 * a PULL_REPLY sends back and a PUSH updates.  Pure, no I/O; decode.c and
 * proto.c call it for the frames that carry them. */
#include <inttypes.h>
#include <stdio.h>
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

void ps_sparse_iter_init(const ps_sparse *s, ps_sparse_iter *it) {
  it->p = s->data;
  it->end = s->data != NULL ? s->data + s->bytes : NULL;
}

int ps_sparse_iter_next(ps_sparse_iter *it, ps_sparse_kind kind, ps_sparse_block *out) {
  if (it->p == NULL || it->p >= it->end)
    return 0;
  const uint8_t *p = it->p;
  out->table = ps_get_le32(p);
  out->dim = ps_get_le32(p + 4);
  out->n = ps_get_le64(p + 8);
  p += PS_SPARSE_HEAD;
  out->keys = has_keys(kind) ? p : NULL;
  p += has_keys(kind) ? 8 * out->n : 0;
  out->values = has_values(kind) ? p : NULL;
  it->p = it->p + ps_sparse_block_bytes(kind, out->dim, out->n);
  return 1;
}

int ps_sparse_check(ps_sparse_kind kind, const uint8_t *data, uint64_t bytes, uint32_t *blocks,
                    ps_errbuf *eb) {
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
    if ((int64_t)table <= last_table)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 ": table %" PRIu32 " after "
                        "table %" PRId64 ", expected ascending tables", b, table, last_table);
    if (dim < 1 || dim > PS_PROTO_SPARSE_DIM_MAX)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): dim %"
                        PRIu32 ", expected 1..%d", b, table, dim, PS_PROTO_SPARSE_DIM_MAX);
    if (n == 0)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): 0 rows, "
                        "expected at least 1 (a table with none has no block)", b, table);
    uint64_t need = ps_sparse_block_bytes(kind, dim, n);
    if (need > bytes - at)
      return ps_err_set(eb, PS_EFORMAT, "sparse block %" PRIu32 " (table %" PRIu32 "): %"
                        PRIu64 " rows of dim %" PRIu32 " need %s bytes, %" PRIu64 " left", b,
                        table, n, dim, need == UINT64_MAX ? "more than 2^64" : "more", bytes - at);
    if (has_keys(kind)) {
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
