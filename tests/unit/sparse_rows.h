/* A shard of sparse tables and the pushes of its rows, shared by the
 * tests of the tables' state (test_sparse_shard.c) and of their rows kept
 * in Redis (test_snapshot.c): N dense floats, NT tables of DIM, pushes
 * whose keys repeat, come and go, so that rows are admitted, evicted for
 * room and expired. */
#ifndef PS_TEST_SPARSE_ROWS_H
#define PS_TEST_SPARSE_ROWS_H

#include <string.h>

#include "layout/hashring.h"
#include "ps/shard.h"
#include "worker/sparse_split.h"

#define N 5      /* dense floats */
#define DIM 4
#define NT 2     /* tables */
#define MAXK 16  /* keys per table per push */

static inline ps_shard_opts opts(void) {
  ps_shard_opts o = {.index = 0, .nworkers = 2, .nfloats = N, .replicas_to_aggregate = 1};
  o.optim = ps_optim_default(PS_OPTIM_ADAM, 0.01f);
  o.ntables = NT;
  for (int t = 0; t < NT; t++) {
    o.tables[t] = (ps_table_opts){.dim = DIM, .optim = ps_optim_default(PS_OPTIM_ADAGRAD, 0.1f),
                                  .seed = 7, .table_id = (uint32_t)t,
                                  .init = {PS_TABLE_INIT_NORMAL, 0.1f}};
    o.table_lr[t] = 0.1f;
  }
  /* Table 1 admits on the second push of a key, holds 6 rows, and expires
   * rows idle for 4 steps. */
  o.tables[1].admit_after = 2;
  o.tables[1].max_rows = 6;
  o.tables[1].idle_steps = 4;
  return o;
}

/* One push's rows: for each table, keys from a small pool (so that some
 * repeat and some are new), ascending, with gradients. */
typedef struct step_rows {
  uint64_t keys[NT][MAXK];
  float grads[NT][MAXK * DIM];
  ps_sparse_batch b;
} step_rows;

static inline void make_rows(step_rows *r, int k) {
  memset(r, 0, sizeof *r);
  r->b.ntables = NT;
  for (int t = 0; t < NT; t++) {
    size_t n = 0;
    for (uint64_t key = 1; key <= 40 && n < MAXK; key++)
      if ((key * 2654435761u + (uint64_t)k * 40503u + (uint64_t)t) % 5 < 2)
        r->keys[t][n++] = key * 1000003u;
    for (size_t i = 0; i < n * DIM; i++)
      r->grads[t][i] = (float)((int)((i * 3 + (size_t)k * 5) % 9) - 4) / 8.0f;
    r->b.dims[t] = DIM;
    r->b.keys[t] = r->keys[t];
    r->b.n[t] = n;
    r->b.grads[t] = r->grads[t];
  }
}

/* Its KV blocks, all for shard 0 (a ring of one). */
static inline void blocks(const step_rows *r, ps_sparse_part *part) {
  ps_hashring ring;
  assert_int_equal(ps_hashring_init(&ring, 1, 4), 0);
  ps_sparse_part *parts[1] = {part};
  assert_int_equal(ps_sparse_split(&ring, &r->b, PS_SPARSE_KV, parts), 0);
  uint32_t nb = 0;
  ps_errbuf eb = {0};
  assert_int_equal(ps_sparse_check(PS_SPARSE_KV, part->bytes, part->len, &nb, &eb), 0);
  ps_hashring_free(&ring);
}

/* The KV blocks of pushes 0..n-1 (make_rows), into part[0..n). */
static inline void make_parts(ps_sparse_part *part, int n) {
  memset(part, 0, (size_t)n * sizeof *part);
  for (int k = 0; k < n; k++) {
    step_rows r;
    make_rows(&r, k);
    blocks(&r, &part[k]);
  }
}

#endif
