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

static void copy_store(copy *c, const ps_table_entry *e) {
  copied *x = slot_of(c, e->key);
  *x = (copied){.present = 1, .pending = e->pending, .count = e->count,
                .last_step = e->last_step, .rank = c->next_rank++};
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

/* 200 rounds: some history, a change walk (every 9th of all) read with
 * more history between its reads, stored or (one in four) undone. */
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
    while ((rc = ps_table_walk_next(w, &e)) == 1) {
      copy_store(&next, &e);
      read++;
      if (ps_rng_below(&r, 3) == 0)
        history_step(a, &r, step++);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(read, rows + pending);
    saved += ps_table_walk_saved(w);
    if (store) {
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
      while ((rc = ps_table_walk_next(w, &e)) == 1)
        copy_store(&c, &e);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_changes_keep_a_copy),
      cmocka_unit_test(test_changes_beside_walks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
