/* A worker's sparse rows, split by shard: each table's distinct keys of a
 * step go to the shards the hash ring names (src/layout/LAYOUT.md, section
 * 6) as PROTOCOL.md's sparse blocks, and a shard's rows come back to their
 * place in the step's arrays.  No I/O: the client (client.c) sends the
 * parts and hands the replies here. */
#ifndef PS_WORKER_SPARSE_SPLIT_H
#define PS_WORKER_SPARSE_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "layout/hashring.h"
#include "proto/proto.h"

#define PS_SPARSE_SPLIT_MAX_TABLES 64

/* One step's rows, per table t < ntables: n[t] distinct keys in ascending
 * order, with dims[t] floats per row.  grads: what a push sends (n[t] *
 * dims[t] floats); rows: where a pull's reply goes (as many).  Tables with
 * n[t] = 0 send nothing.
 *
 * A table pooled on the shards (bags[t], PROTOCOL.md "Bags") sends bags
 * instead: sample i < nsamples[t] holds the keys keys[bag[j]] for j in
 * boff[i] .. boff[i + 1]; each shard gets, per sample, those of its keys
 * (B blocks, a sample none of whose keys it holds not at all), and a
 * pull's pooled sums come back into pooled (nsamples * dim floats, summed
 * over the shards: zeroed by the split of the pull's keys); a push sends
 * each sample's gradient, bgrads (as many floats), with its keys (BG). */
typedef struct ps_sparse_batch {
  int ntables;
  uint32_t dims[PS_SPARSE_SPLIT_MAX_TABLES];
  const uint64_t *keys[PS_SPARSE_SPLIT_MAX_TABLES];
  size_t n[PS_SPARSE_SPLIT_MAX_TABLES];
  const float *grads[PS_SPARSE_SPLIT_MAX_TABLES];
  float *rows[PS_SPARSE_SPLIT_MAX_TABLES];
  int bags[PS_SPARSE_SPLIT_MAX_TABLES];
  size_t nsamples[PS_SPARSE_SPLIT_MAX_TABLES];
  const uint32_t *boff[PS_SPARSE_SPLIT_MAX_TABLES], *bag[PS_SPARSE_SPLIT_MAX_TABLES];
  float *pooled[PS_SPARSE_SPLIT_MAX_TABLES];
  const float *bgrads[PS_SPARSE_SPLIT_MAX_TABLES];
} ps_sparse_batch;

/* One shard's share: its blocks, and where each of their keys sits in the
 * batch (idx, in block order: the index within its table's keys; for a
 * bag block, each bag's sample). */
typedef struct ps_sparse_part {
  uint8_t *bytes;
  size_t len, cap;
  uint32_t *idx;
  size_t nidx, idx_cap;
} ps_sparse_part;

/* Split b into *parts[0 .. ring->nshards): K blocks (kind PS_SPARSE_K, a
 * pull's keys) or KV blocks (PS_SPARSE_KV, a push's keys and grads).  The
 * parts' buffers are reused from call to call.  @return 0 or -ENOMEM (the
 * parts then hold nothing), or -EINVAL when a table's keys are not
 * strictly ascending. */
int ps_sparse_split(const ps_hashring *ring, const ps_sparse_batch *b, ps_sparse_kind kind,
                    ps_sparse_part *const *parts);

/* The rows a shard sent (its reply's V blocks, accepted by the decoder)
 * for the keys `asked` (its K part): each table's rows into b->rows at
 * their keys' places.  @return 0, or PS_EFORMAT with one line in why when
 * the reply's blocks do not answer the question (another table, dim or
 * count); then some rows may have been written. */
int ps_sparse_scatter(const ps_sparse_part *asked, const ps_sparse *reply,
                      const ps_sparse_batch *b, char *why, size_t why_len);

/* Forget the blocks (the buffers stay for the next split). */
static inline void ps_sparse_part_clear(ps_sparse_part *p) {
  p->len = 0;
  p->nidx = 0;
}

void ps_sparse_part_free(ps_sparse_part *p);

#endif
