/* Helpers shared by the sparse table's unit tests (test_table.c,
 * test_table_changes.c): options, pushes, a seeded history that makes
 * every kind of change, and two tables compared entry by entry.  Include
 * it after cmocka.h. */
#ifndef PS_TESTS_TABLE_HISTORY_H
#define PS_TESTS_TABLE_HISTORY_H

#include <stdint.h>

#include "common/rng.h"
#include "optim/optim.h"
#include "ps/table.h"

static inline ps_table_opts opts_of(ps_optim_kind kind, uint32_t dim) {
  return (ps_table_opts){.dim = dim, .optim = ps_optim_default(kind, 0.1f), .seed = 42,
                         .table_id = 7,
                         .init = {.kind = PS_TABLE_INIT_NORMAL, .scale = 0.01f}};
}

static inline ps_table *table_new(const ps_table_opts *o) {
  ps_table *t = NULL;
  ps_errbuf eb = {0};
  int rc = ps_table_new(o, &t, &eb);
  if (rc != 0)
    fail_msg("ps_table_new: %d: %s", rc, eb.msg);
  return t;
}

static inline void push(ps_table *t, const uint64_t *keys, const float *g, size_t n, float lr,
                 uint64_t step) {
  ps_errbuf eb = {0};
  int rc = ps_table_push(t, keys, g, n, lr, step, &eb);
  if (rc != 0)
    fail_msg("ps_table_push: %d: %s", rc, eb.msg);
}


/* n distinct keys, each drawn from universe[0, size). */
static inline void draw_keys(ps_rng *r, uint64_t *keys, size_t n, const uint64_t *universe,
                      uint64_t size) {
  for (size_t i = 0; i < n; i++) {
    size_t j;
    do {
      keys[i] = universe[ps_rng_below(r, size)];
      for (j = 0; j < i && keys[j] != keys[i]; j++)
        ;
    } while (j < i);
  }
}


static inline void assert_tables_equal(const ps_table *a, const ps_table *b) {
  ps_table_iter ia, ib;
  ps_table_entry ea, eb;
  uint32_t dim = ps_table_options(a)->dim;
  int nslots = ps_optim_nslots(ps_table_options(a)->optim.kind);
  size_t n = 0;
  ps_table_iter_init(a, &ia);
  ps_table_iter_init(b, &ib);
  for (;; n++) {
    int more = ps_table_iter_next(a, &ia, &ea);
    assert_int_equal(ps_table_iter_next(b, &ib, &eb), more);
    if (!more)
      break;
    if (ea.key != eb.key || ea.pending != eb.pending || ea.count != eb.count ||
        ea.last_step != eb.last_step)
      fail_msg("entry %zu: key %llu pending %d count %llu step %llu vs key %llu pending %d "
               "count %llu step %llu", n, (unsigned long long)ea.key, ea.pending,
               (unsigned long long)ea.count, (unsigned long long)ea.last_step,
               (unsigned long long)eb.key, eb.pending, (unsigned long long)eb.count,
               (unsigned long long)eb.last_step);
    if (ea.pending)
      continue;
    assert_memory_equal(ea.values, eb.values, dim * sizeof(float));
    for (int s = 0; s < nslots; s++)
      assert_memory_equal(ea.slots[s], eb.slots[s], dim * sizeof(float));
  }
  ps_table_stats sa = ps_table_get_stats(a), sb = ps_table_get_stats(b);
  assert_int_equal(sa.rows, sb.rows);
  assert_int_equal(sa.pending, sb.pending);
  assert_true(n == sa.rows + sa.pending);
}


/* One step of a history that touches every kind of change: a push of
 * up to 8 keys (rows updated, keys counted, rows admitted and evicted),
 * every third step an expiry, every fifth a removal. */
static inline void history_step(ps_table *t, ps_rng *r, uint64_t step) {
  uint32_t dim = ps_table_options(t)->dim;
  uint64_t universe[60];
  for (uint64_t i = 0; i < 60; i++)
    universe[i] = 1000 + i;
  uint64_t keys[8];
  float g[8 * 8];
  size_t n = 1 + ps_rng_below(r, 8);
  draw_keys(r, keys, n, universe, 60);
  for (size_t i = 0; i < n * dim; i++)
    g[i] = (float)(ps_rng_uniform(r) - 0.5);
  push(t, keys, g, n, 0.05f, step);
  if (step % 3 == 0)
    ps_table_expire(t, step);
  if (step % 5 == 0)
    ps_table_remove(t, universe[ps_rng_below(r, 60)]);
}

/* A's entries put into a new table of options o: a's state now. */
static inline ps_table *table_copy(const ps_table *a, const ps_table_opts *o) {
  ps_table *t = table_new(o);
  ps_table_iter it;
  ps_table_entry e;
  ps_errbuf eb = {0};
  ps_table_iter_init(a, &it);
  while (ps_table_iter_next(a, &it, &e))
    assert_int_equal(ps_table_put(t, &e, &eb), 0);
  return t;
}

#endif
