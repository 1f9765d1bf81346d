/* Unit tests for a sparse table's change walks (src/ps/table.h,
 * TABLE.md "Changes"): a copy kept elsewhere from change walks alone --
 * each stored as its removals, then its entries ranked after every entry
 * stored before -- equals the table as each walk began, through admission,
 * eviction, expiry, removal, walks read while the table changes, and walks
 * that were not stored (undone). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "ps/table.h"
#include "table_history.h"

#define NKEYS 60    /* history_step's keys: 1000 .. 1059 */
#define DIM 3
#define NSLOTS 2    /* adam */

/* The copy: per key what the last stored walk said of it. */
typedef struct copied {
  int present, pending;
  uint64_t count, last_step, rank;
  float values[DIM], slots[NSLOTS][DIM];
} copied;

typedef struct copy {
  copied e[NKEYS];
  uint64_t next_rank;
} copy;

static copied *slot_of(copy *c, uint64_t key) {
  assert_true(key >= 1000 && key < 1000 + NKEYS);
  return &c->e[key - 1000];
}

static void copy_store(copy *c, const ps_table_entry *e, uint64_t rank) {
  copied *x = slot_of(c, e->key);
  *x = (copied){.present = 1, .pending = e->pending, .count = e->count,
                .last_step = e->last_step, .rank = rank};
  if (e->pending)
    return;
  memcpy(x->values, e->values, sizeof x->values);
  for (int s = 0; s < NSLOTS; s++)
    memcpy(x->slots[s], e->slots[s], sizeof x->slots[s]);
}

static int by_rank(const void *a, const void *b) {
  const copied *x = *(const copied *const *)a, *y = *(const copied *const *)b;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The copy as a table: its entries loaded in rank order, as a restore
 * would. */
static ps_table *copy_table(const copy *c, const ps_table_opts *o) {
  ps_table *t = table_new(o);
  const copied *order[NKEYS];
  size_t n = 0;
  for (int k = 0; k < NKEYS; k++)
    if (c->e[k].present)
      order[n++] = &c->e[k];
  qsort(order, n, sizeof *order, by_rank);
  ps_errbuf eb = {0};
  for (size_t i = 0; i < n; i++) {
    const copied *x = order[i];
    ps_table_entry e = {.pending = x->pending, .key = 1000 + (uint64_t)(x - c->e),
                        .count = x->count, .last_step = x->last_step};
    if (!x->pending) {
      e.values = x->values;
      for (int s = 0; s < NSLOTS; s++)
        e.slots[s] = x->slots[s];
    }
    if (ps_table_load(t, &e, &eb) != 0)
      fail_msg("load of key %llu: %s", (unsigned long long)e.key, eb.msg);
  }
  return t;
}

static ps_table_opts history_opts(void) {
  ps_table_opts o = opts_of(PS_OPTIM_ADAM, DIM);
  o.admit_after = 2;
  o.max_rows = 30;
  o.max_pending = 20;
  o.idle_steps = 12;
  return o;
}

/* 200 rounds: some history, a change walk (every 9th of all), half of them
 * grouped by bucket, read with more history between its reads, stored
 * (each entry ranked by its place in its list, after every earlier walk's)
 * or (one in four) undone. */
static void test_changes_keep_a_copy(void **state) {
  (void)state;
  ps_table_opts o = history_opts();
  ps_table *a = table_new(&o);
  assert_int_equal(ps_table_changes_lost(a), 1); /* no walk of all yet */
  copy c = {0};
  ps_rng r;
  ps_rng_seed(&r, 17);
  uint64_t step = 1, stored = 0, removals = 0, saved = 0;
  for (int round = 0; round < 200; round++) {
    for (uint64_t k = ps_rng_below(&r, 12); k > 0; k--)
      history_step(a, &r, step++);
    int all = round == 0 || round % 9 == 0;
    ps_table *then = table_copy(a, &o);
    ps_table_walk *w = ps_table_changes_begin(a, all);
    assert_non_null(w);
    assert_int_equal(ps_table_changes_lost(a), 0);
    uint64_t rows, pending;
    ps_table_walk_counts(w, &rows, &pending);
    const uint64_t *rk, *pk;
    size_t nr, np;
    ps_table_changes_removed(w, &rk, &nr, &pk, &np);
    int store = ps_rng_below(&r, 4) != 0;
    copy next = c;
    if (all)
      memset(next.e, 0, sizeof next.e);
    for (size_t i = 0; i < nr; i++)
      slot_of(&next, rk[i])->present = 0;
    for (size_t i = 0; i < np; i++)
      slot_of(&next, pk[i])->present = 0;
    removals += nr + np;
    ps_table_entry e;
    int rc;
    uint64_t read = 0;
    unsigned bits = ps_rng_below(&r, 2) ? (unsigned)ps_rng_below(&r, 5) : 99;
    if (bits != 99)
      assert_int_equal(ps_table_walk_group(w, bits), 0);
    uint32_t last_bucket = 0;
    int last_pending = 0;
    while ((rc = ps_table_walk_next(w, &e)) == 1) {
      uint64_t place = ps_table_walk_place(w);
      assert_true(place < (e.pending ? pending : rows));
      copy_store(&next, &e, c.next_rank + place);
      if (bits != 99) {
        uint32_t b = ps_table_bucket(a, e.key, bits);
        if (e.pending == last_pending)
          assert_true(b >= last_bucket);
        last_bucket = b;
        last_pending = e.pending;
      }
      read++;
      if (ps_rng_below(&r, 3) == 0)
        history_step(a, &r, step++);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(read, rows + pending);
    saved += ps_table_walk_saved(w);
    if (store) {
      next.next_rank = c.next_rank + (rows > pending ? rows : pending);
      c = next;
      ps_table *got = copy_table(&c, &o);
      assert_tables_equal(then, got);
      ps_table_free(got);
      stored++;
    } else {
      assert_int_equal(ps_table_changes_undo(w), 0);
      assert_int_equal(ps_table_changes_lost(a), all);
    }
    ps_table_walk_end(w);
    ps_table_free(then);
    if (!store && all) {
      /* An undone walk of all: the next must be one of all too. */
      ps_table *now = table_copy(a, &o);
      w = ps_table_changes_begin(a, 1);
      assert_non_null(w);
      assert_int_equal(ps_table_changes_lost(a), 0);
      memset(c.e, 0, sizeof c.e);
      ps_table_walk_counts(w, &rows, &pending);
      while ((rc = ps_table_walk_next(w, &e)) == 1)
        copy_store(&c, &e, c.next_rank + ps_table_walk_place(w));
      c.next_rank += rows > pending ? rows : pending;
      assert_int_equal(rc, 0);
      ps_table_walk_end(w);
      ps_table *got = copy_table(&c, &o);
      assert_tables_equal(now, got);
      ps_table_free(got);
      ps_table_free(now);
      stored++;
    }
  }
  assert_true(stored > 100 && removals > 0 && saved > 0);
  ps_table_free(a);
}

/* A change walk is one of the 4 walks; an ordinary walk beside it neither
 * takes nor leaves changes. */
static void test_changes_beside_walks(void **state) {
  (void)state;
  ps_table_opts o = history_opts();
  ps_table *a = table_new(&o);
  ps_rng r;
  ps_rng_seed(&r, 3);
  uint64_t step = 1;
  for (; step < 100; step++)
    history_step(a, &r, step);
  ps_table_walk *w1 = ps_table_changes_begin(a, 1);
  assert_non_null(w1);
  ps_table_walk_end(w1);
  for (int k = 0; k < 5; k++)
    history_step(a, &r, step++);
  ps_table_walk *plain[3];
  for (int k = 0; k < 3; k++)
    assert_non_null(plain[k] = ps_table_walk_begin(a));
  ps_table_walk *w2 = ps_table_changes_begin(a, 0);
  assert_non_null(w2);
  assert_null(ps_table_changes_begin(a, 0));
  uint64_t rows, pending;
  ps_table_walk_counts(w2, &rows, &pending);
  assert_true(rows + pending > 0);
  uint64_t all_rows, all_pending;
  ps_table_walk_counts(plain[0], &all_rows, &all_pending);
  assert_true(rows <= all_rows && pending <= all_pending);
  for (int k = 0; k < 3; k++)
    ps_table_walk_end(plain[k]);
  ps_table_walk_end(w2);
  /* Nothing changed since w2 began: the next change walk is empty. */
  ps_table_walk *w3 = ps_table_changes_begin(a, 0);
  assert_non_null(w3);
  ps_table_walk_counts(w3, &rows, &pending);
  const uint64_t *rk, *pk;
  size_t nr, np;
  ps_table_changes_removed(w3, &rk, &nr, &pk, &np);
  assert_int_equal(rows + pending + nr + np, 0);
  ps_table_walk_end(w3);
  ps_table_free(a);
}

/* A copy of a table kept by key: each entry with its floats and a rank
 * (first + gap * its place in the table's iteration order), shuffled
 * with r.  @return them (free it), *n of them. */
typedef struct ranked {
  ps_table_entry e;
  uint64_t rank;
  float floats[DIM * (1 + NSLOTS)];
} ranked;

static ranked *ranked_copy(const ps_table *a, uint64_t first, uint64_t gap, ps_rng *r,
                           size_t *n) {
  ranked *v = calloc(2 * NKEYS, sizeof *v);
  assert_non_null(v);
  ps_table_iter it;
  ps_table_entry e;
  *n = 0;
  ps_table_iter_init(a, &it);
  while (ps_table_iter_next(a, &it, &e)) {
    assert_true(*n < 2 * NKEYS);
    ranked *x = &v[*n];
    x->e = e;
    x->rank = first + (uint64_t)*n * gap;
    if (!e.pending) {
      memcpy(x->floats, e.values, DIM * sizeof(float));
      for (int k = 0; k < NSLOTS; k++)
        memcpy(x->floats + DIM * (1 + k), e.slots[k], DIM * sizeof(float));
    }
    (*n)++;
  }
  for (size_t k = *n; k-- > 1;) {
    size_t j = ps_rng_below(r, k + 1);
    ranked t = v[k];
    v[k] = v[j];
    v[j] = t;
  }
  for (size_t k = 0; k < *n; k++)  /* the floats moved with their entries */
    if (!v[k].e.pending) {
      v[k].e.values = v[k].floats;
      for (int q = 0; q < NSLOTS; q++)
        v[k].e.slots[q] = v[k].floats + DIM * (1 + q);
    }
  return v;
}

/* A table loaded from its entries in a shuffled order, each with its rank
 * (its place in its list, spread over more than 16 bits), then linked:
 * the same table, and no changes to write. */
static void test_ranked_load(void **state) {
  (void)state;
  ps_table_opts o = history_opts();
  ps_table *a = table_new(&o);
  ps_rng r;
  ps_rng_seed(&r, 11);
  for (uint64_t step = 1; step < 400; step++)
    history_step(a, &r, step);
  /* Entries with their ranks (gaps: two radix passes), shuffled. */
  size_t n = 0;
  ranked *v = ranked_copy(a, 7, 100003, &r, &n);
  assert_true(n > 20);
  ps_table *b = table_new(&o);
  ps_errbuf eb = {0};
  for (size_t k = 0; k < n; k++)
    assert_int_equal(ps_table_load_ranked(b, &v[k].e, v[k].rank, &eb), 0);
  assert_int_equal(ps_table_load_ranked(b, &v[0].e, 1, &eb), PS_ECORRUPT);
  assert_int_equal(ps_table_link_ranked(b), 0);
  assert_tables_equal(a, b);
  assert_int_equal(ps_table_changes_lost(b), 0);
  ps_table_walk *w = ps_table_changes_begin(b, 0);
  assert_non_null(w);
  uint64_t rows, pending;
  ps_table_walk_counts(w, &rows, &pending);
  assert_int_equal(rows + pending, 0);
  ps_table_walk_end(w);
  /* And it goes on as the original does. */
  ps_rng rb = r;
  for (uint64_t step = 400; step < 450; step++) {
    history_step(a, &r, step);
    history_step(b, &rb, step);
  }
  assert_tables_equal(a, b);
  free(v);
  ps_table_free(a);
  ps_table_free(b);
}

/* A lazy load (TABLE.md "Lazy loads"): the table serves pushes while its
 * entries come in, each loaded before a push touches its key (as a shard
 * fetches it on first touch), the rest in any order, some twice; pushes
 * come at steps older than the copy's newest (stamped up to it).  At the
 * end it is the table a full ranked load, then the same pushes, make, with
 * the same changes to write. */
static void test_lazy_load(void **state) {
  (void)state;
  ps_table_opts o = opts_of(PS_OPTIM_ADAM, DIM);
  ps_table *a = table_new(&o);
  ps_rng r;
  ps_rng_seed(&r, 23);
  uint64_t universe[90];
  for (uint64_t i = 0; i < 90; i++)
    universe[i] = 5000 + i * 7919;
  float g[8 * DIM];
  uint64_t keys[8];
  for (uint64_t step = 1; step < 120; step++) {
    size_t n = 1 + ps_rng_below(&r, 8);
    draw_keys(&r, keys, n, universe, 60);  /* the copy holds keys of the first 60 */
    for (size_t i = 0; i < n * DIM; i++)
      g[i] = (float)(ps_rng_uniform(&r) - 0.5);
    push(a, keys, g, n, 0.05f, step / 2);  /* two pushes a step: ties broken by order */
  }
  /* The copy: every entry with its rank, shuffled; the list's newest stamp. */
  size_t nv = 0;
  ranked *v = ranked_copy(a, 3, 70001, &r, &nv);
  uint64_t newest = 0;
  for (size_t k = 0; k < nv; k++) {
    assert_false(v[k].e.pending);
    newest = v[k].e.last_step > newest ? v[k].e.last_step : newest;
  }
  ps_table *b = table_new(&o), *c = table_new(&o);
  ps_errbuf eb = {0};
  for (size_t k = 0; k < nv; k++)
    assert_int_equal(ps_table_load_ranked(b, &v[k].e, v[k].rank, &eb), 0);
  assert_int_equal(ps_table_link_ranked(b), 0);
  assert_int_equal(ps_table_lazy_begin(c, newest, 0), 0);
  /* Keys the copy does not hold, pushed before any entry came in (a log
   * replay's first page with only new keys): their records exist before
   * the load's rank bookkeeping does, and are on the list already. */
  for (size_t i = 0; i < 8; i++) {
    keys[i] = universe[60 + i];
    for (size_t d = 0; d < DIM; d++)
      g[i * DIM + d] = (float)(ps_rng_uniform(&r) - 0.5);
  }
  push(b, keys, g, 8, 0.05f, newest - 1);
  push(c, keys, g, 8, 0.05f, newest - 1);
  size_t loaded = 0;
  for (; loaded < nv / 3; loaded++)
    assert_int_equal(ps_table_load_lazy(c, &v[loaded].e, v[loaded].rank, &eb), 0);
  assert_null(ps_table_walk_begin(c));  /* a walk of all waits for the end */
  for (uint64_t k = 0; k < 60; k++) {
    size_t n = 1 + ps_rng_below(&r, 8);
    draw_keys(&r, keys, n, universe, 90);  /* new keys too */
    for (size_t i = 0; i < n * DIM; i++)
      g[i] = (float)(ps_rng_uniform(&r) - 0.5);
    uint64_t step = newest - 2 + k / 4;     /* some below the copy's newest */
    push(b, keys, g, n, 0.05f, step);
    for (size_t i = 0; i < n; i++)         /* first touch: its entry first */
      for (size_t q = 0; q < nv; q++)
        if (v[q].e.key == keys[i])
          assert_true(ps_table_load_lazy(c, &v[q].e, v[q].rank, &eb) >= 0);
    push(c, keys, g, n, 0.05f, step);
    if (loaded < nv)                        /* the background load goes on */
      assert_true(ps_table_load_lazy(c, &v[loaded].e, v[loaded].rank, &eb) >= 0), loaded++;
  }
  assert_true(ps_table_lazy_left(c) > 0);
  for (size_t k = 0; k < nv; k++)           /* the rest, and again what came */
    assert_true(ps_table_load_lazy(c, &v[k].e, v[k].rank, &eb) >= 0);
  assert_int_equal(ps_table_load_lazy(c, &v[0].e, v[0].rank, &eb), 1);
  assert_int_equal(ps_table_lazy_end(c), 0);
  assert_int_equal(ps_table_lazy_left(c), 0);
  assert_tables_equal(b, c);
  uint64_t eb_n, eb_r, ec_n, ec_r;
  ps_table_changes_count(b, &eb_n, &eb_r);
  ps_table_changes_count(c, &ec_n, &ec_r);
  assert_int_equal(eb_n, ec_n);
  assert_int_equal(eb_r, ec_r);
  /* And both go on alike. */
  ps_rng rb = r;
  for (uint64_t step = 200; step < 230; step++) {
    history_step(b, &r, step);
    history_step(c, &rb, step);
  }
  assert_tables_equal(b, c);
  free(v);
  ps_table_free(a);
  ps_table_free(b);
  ps_table_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_changes_keep_a_copy),
      cmocka_unit_test(test_changes_beside_walks),
      cmocka_unit_test(test_ranked_load),
      cmocka_unit_test(test_lazy_load),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
