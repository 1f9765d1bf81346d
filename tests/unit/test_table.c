/* Unit tests for the sparse embedding table (src/ps/table.c): rows,
 * initial values, the row-wise optimizers against their plain formulas,
 * admission, eviction, restore, memory, and a random history checked
 * against a plain reference model. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "ps/table.h"
#include "table_history.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

/* The events a table reported, in order. */
typedef struct events {
  size_t n, cap;
  char *kind;
  uint64_t *key;
} events;

static void on_event(void *arg, ps_table_event kind, uint64_t key) {
  events *ev = arg;
  if (ev->n == ev->cap) {
    ev->cap = ev->cap ? 2 * ev->cap : 64;
    ev->kind = realloc(ev->kind, ev->cap);
    ev->key = realloc(ev->key, ev->cap * sizeof *ev->key);
    assert_non_null(ev->kind);
    assert_non_null(ev->key);
  }
  ev->kind[ev->n] = (char)kind;
  ev->key[ev->n++] = key;
}

static void events_free(events *ev) {
  free(ev->kind);
  free(ev->key);
  memset(ev, 0, sizeof *ev);
}

/* "a1 a2 e1" for admissions of 1 and 2 and an eviction of 1. */
static void events_str(const events *ev, char *out, size_t len) {
  size_t off = 0;
  out[0] = 0;
  for (size_t i = 0; i < ev->n && off < len; i++)
    off += (size_t)snprintf(out + off, len - off, "%s%c%llu", i ? " " : "", ev->kind[i],
                            (unsigned long long)ev->key[i]);
}

static void assert_events(const events *ev, const char *want) {
  char got[1024];
  events_str(ev, got, sizeof got);
  assert_string_equal(got, want);
}

static void push1(ps_table *t, uint64_t key, const float *g, float lr, uint64_t step) {
  push(t, &key, g, 1, lr, step);
}

static void check_near(double got, double want, const char *what, int idx) {
  double tol = 1e-5 * fabs(want) + 1e-7;
  if (!(fabs(got - want) <= tol))
    fail_msg("%s[%d]: got %.9g, expected %.9g (tolerance %.3g)", what, idx, got, want, tol);
}

/* ------------------------------------------------------------------------ */
/* Rows and initial values                                                   */
/* ------------------------------------------------------------------------ */

static void test_insert_and_read_back(void **state) {
  (void)state;
  ps_table_opts o = opts_of(PS_OPTIM_SGD, 4);
  o.init.kind = PS_TABLE_INIT_ZEROS;
  ps_table *t = table_new(&o);
  const uint64_t keys[2] = {10, 20};
  const float g[8] = {1, 2, 3, 4, -1, -2, -3, -4};
  push(t, keys, g, 2, 0.5f, 1);

  const uint64_t ask[3] = {20, 99, 10};
  float out[12];
  ps_table_pull(t, ask, 3, out);
  const float want[12] = {0.5f, 1, 1.5f, 2, 0, 0, 0, 0, -0.5f, -1, -1.5f, -2};
  assert_memory_equal(out, want, sizeof want);

  ps_table_entry e;
  assert_int_equal(ps_table_get(t, 10, &e), 1);
  assert_int_equal(e.pending, 0);
  assert_int_equal(e.count, 1);
  assert_int_equal(e.last_step, 1);
  assert_int_equal(ps_table_get(t, 99, &e), 0);
  ps_table_stats st = ps_table_get_stats(t);
  assert_int_equal(st.rows, 2);
  assert_int_equal(st.admitted, 2);
  /* A pull creates nothing. */
  assert_int_equal(ps_table_get_stats(t).rows, 2);
  ps_table_free(t);
}

static void test_initial_values(void **state) {
  (void)state;
  enum { DIM = 16, KEYS = 1000 };
  ps_table_opts o = opts_of(PS_OPTIM_SGD, DIM);
  ps_table *t = table_new(&o);
  float a[DIM], b[DIM], want[DIM];

  /* Never created, and just created by a zero gradient, read the same. */
  ps_table_init_row(&o, 5, want);
  ps_table_pull(t, (const uint64_t[]){5}, 1, a);
  assert_memory_equal(a, want, sizeof a);
  const float zero[DIM] = {0};
  push1(t, 5, zero, 0.1f, 1);
  assert_int_equal(ps_table_get_stats(t).rows, 1);
  ps_table_pull(t, (const uint64_t[]){5}, 1, b);
  assert_memory_equal(b, want, sizeof b);

  /* Another key, table or seed gives other values. */
  ps_table_init_row(&o, 6, a);
  assert_memory_not_equal(a, want, sizeof a);
  ps_table_opts o2 = o;
  o2.table_id = 8;
  ps_table_init_row(&o2, 5, a);
  assert_memory_not_equal(a, want, sizeof a);
  o2 = o;
  o2.seed = 43;
  ps_table_init_row(&o2, 5, a);
  assert_memory_not_equal(a, want, sizeof a);

  /* normal(0, 0.01): over 16000 draws the mean and stddev are close. */
  double s = 0, s2 = 0;
  for (uint64_t k = 0; k < KEYS; k++) {
    ps_table_init_row(&o, k, a);
    for (int i = 0; i < DIM; i++) {
      s += a[i];
      s2 += (double)a[i] * a[i];
    }
  }
  double mean = s / (KEYS * DIM), sd = sqrt(s2 / (KEYS * DIM) - mean * mean);
  assert_true(fabs(mean) < 0.001);
  assert_true(fabs(sd - 0.01) < 0.0005);

  /* uniform in [-0.05, 0.05): inside, and spread over it. */
  o2 = o;
  o2.init = (ps_table_init){PS_TABLE_INIT_UNIFORM, 0.05f};
  float lo = 1, hi = -1;
  for (uint64_t k = 0; k < KEYS; k++) {
    ps_table_init_row(&o2, k, a);
    for (int i = 0; i < DIM; i++) {
      assert_true(a[i] >= -0.05f && a[i] <= 0.05f);
      lo = fminf(lo, a[i]);
      hi = fmaxf(hi, a[i]);
    }
  }
  assert_true(lo < -0.049f && hi > 0.049f);

  o2.init.kind = PS_TABLE_INIT_ZEROS;
  ps_table_init_row(&o2, 5, a);
  assert_memory_equal(a, zero, sizeof a);
  ps_table_free(t);
}

/* 200000 keys, each pushed once with its own number: each reads its own
 * row back, also after half of them are removed. */
static void test_no_collisions(void **state) {
  (void)state;
  enum { N = 200000, BATCH = 1000 };
  ps_table_opts o = opts_of(PS_OPTIM_SGD, 2);
  o.init.kind = PS_TABLE_INIT_ZEROS;
  ps_table *t = table_new(&o);
  uint64_t *keys = malloc(N * sizeof *keys);
  float *g = malloc(2 * BATCH * sizeof *g), *out = malloc(2 * BATCH * sizeof *out);
  assert_non_null(keys);
  ps_rng r;
  ps_rng_seed(&r, 1);
  /* Random keys, and keys that differ only in their high or low bits. */
  for (size_t i = 0; i < N; i++)
    keys[i] = i % 4 == 0 ? (uint64_t)i << 40 : i % 4 == 1 ? (uint64_t)i : ps_rng_next(&r);
  for (size_t b = 0; b < N; b += BATCH) {
    for (size_t i = 0; i < BATCH; i++) {
      g[2 * i] = -(float)(b + i + 1);
      g[2 * i + 1] = (float)(keys[b + i] & 0xffff);
    }
    push(t, keys + b, g, BATCH, 1.0f, 1);
  }
  assert_int_equal(ps_table_get_stats(t).rows, N);
  for (size_t b = 0; b < N; b += BATCH) {
    ps_table_pull(t, keys + b, BATCH, out);
    for (size_t i = 0; i < BATCH; i++) {
      if (out[2 * i] != (float)(b + i + 1) || out[2 * i + 1] != -(float)(keys[b + i] & 0xffff))
        fail_msg("key %zu (%llx) reads %g %g", b + i, (unsigned long long)keys[b + i],
                 (double)out[2 * i], (double)out[2 * i + 1]);
    }
  }
  /* Removing every other key leaves the rest found (the map's deletion). */
  for (size_t i = 0; i < N; i += 2)
    assert_int_equal(ps_table_remove(t, keys[i]), 1);
  assert_int_equal(ps_table_get_stats(t).rows, N / 2);
  for (size_t b = 0; b < N; b += BATCH) {
    ps_table_pull(t, keys + b, BATCH, out);
    for (size_t i = 0; i < BATCH; i++) {
      float want = (b + i) % 2 == 0 ? 0.0f : (float)(b + i + 1);
      if (out[2 * i] != want)
        fail_msg("after removals key %zu reads %g, expected %g", b + i, (double)out[2 * i],
                 (double)want);
    }
  }
  free(keys);
  free(g);
  free(out);
  ps_table_free(t);
}

/* ------------------------------------------------------------------------ */
/* The optimizers, against the plain formulas in double                     */
/* ------------------------------------------------------------------------ */

enum { ODIM = 5 };

/* One row of the reference: weights, slots, and its own update count. */
typedef struct ref_row {
  double w[ODIM], s[2][ODIM];
  uint64_t t;
} ref_row;

static void ref_init(const ps_table_opts *o, uint64_t key, ref_row *r) {
  float w[ODIM];
  ps_table_init_row(o, key, w);
  memset(r, 0, sizeof *r);
  for (int i = 0; i < ODIM; i++) {
    r->w[i] = w[i];
    r->s[0][i] = o->optim.kind == PS_OPTIM_ADAGRAD ? o->optim.initial_accumulator : 0.0;
  }
}

static void ref_apply(const ps_optim *o, ref_row *r, const float *g, double lr) {
  r->t++;
  for (int i = 0; i < ODIM; i++) {
    double gi = g[i];
    switch (o->kind) {
    case PS_OPTIM_SGD:
      r->w[i] -= lr * gi;
      break;
    case PS_OPTIM_ADAGRAD:
      r->s[0][i] += gi * gi;
      r->w[i] -= lr * gi / (sqrt(r->s[0][i]) + o->eps);
      break;
    case PS_OPTIM_ADAM: {
      double b1 = o->beta1, b2 = o->beta2;
      r->s[0][i] = b1 * r->s[0][i] + (1 - b1) * gi;
      r->s[1][i] = b2 * r->s[1][i] + (1 - b2) * gi * gi;
      double mhat = r->s[0][i] / (1 - pow(b1, (double)r->t));
      double vhat = r->s[1][i] / (1 - pow(b2, (double)r->t));
      r->w[i] -= lr * mhat / (sqrt(vhat) + o->eps);
      break;
    }
    default:
      fail_msg("no reference for optimizer %d", (int)o->kind);
    }
  }
}

static void check_row(const ps_table *t, uint64_t key, const ref_row *r, int nslots) {
  ps_table_entry e;
  assert_int_equal(ps_table_get(t, key, &e), 1);
  assert_int_equal(e.count, r->t);
  char what[64];
  for (int i = 0; i < ODIM; i++) {
    snprintf(what, sizeof what, "key %llu w", (unsigned long long)key);
    check_near(e.values[i], r->w[i], what, i);
    for (int s = 0; s < nslots; s++) {
      snprintf(what, sizeof what, "key %llu slot %d", (unsigned long long)key, s);
      check_near(e.slots[s][i], r->s[s][i], what, i);
    }
  }
}

/* Key 1 is pushed at every step, key 2 from the third on, so that the two
 * rows' own update counts differ (adam's bias correction is per row). */
static void run_optim(ps_optim_kind kind, int nslots) {
  ps_table_opts o = opts_of(kind, ODIM);
  ps_table *t = table_new(&o);
  ref_row r1, r2;
  ref_init(&o, 1, &r1);
  ref_init(&o, 2, &r2);
  ps_rng rng;
  ps_rng_seed(&rng, 9);
  for (uint64_t step = 1; step <= 6; step++) {
    float g[2 * ODIM];
    for (int i = 0; i < 2 * ODIM; i++)
      g[i] = (float)(ps_rng_uniform(&rng) * 2 - 1);
    float lr = step % 2 ? 0.1f : 0.05f;
    if (step < 3) {
      push1(t, 1, g, lr, step);
      ref_apply(&o.optim, &r1, g, lr);
    } else {
      push(t, (const uint64_t[]){2, 1}, g, 2, lr, step);
      ref_apply(&o.optim, &r2, g, lr);
      ref_apply(&o.optim, &r1, g + ODIM, lr);
    }
    check_row(t, 1, &r1, nslots);
    if (step >= 3)
      check_row(t, 2, &r2, nslots);
  }
  assert_int_equal(r1.t, 6);
  assert_int_equal(r2.t, 4);
  ps_table_free(t);
}

static void test_optim_sgd(void **state) {
  (void)state;
  run_optim(PS_OPTIM_SGD, 0);
}

static void test_optim_adagrad(void **state) {
  (void)state;
  run_optim(PS_OPTIM_ADAGRAD, 1);
}

static void test_optim_adam(void **state) {
  (void)state;
  run_optim(PS_OPTIM_ADAM, 2);
}

/* ------------------------------------------------------------------------ */
/* Admission and eviction                                                    */
/* ------------------------------------------------------------------------ */

static void test_admission(void **state) {
  (void)state;
  events ev = {0};
  ps_table_opts o = opts_of(PS_OPTIM_SGD, 3);
  o.admit_after = 3;
  o.on_event = on_event;
  o.event_arg = &ev;
  ps_table *t = table_new(&o);
  float init[3], got[3];
  ps_table_init_row(&o, 77, init);
  const float g[3] = {1, 2, 4};
  ps_table_entry e;

  for (uint64_t step = 1; step <= 2; step++) {
    push1(t, 77, g, 0.5f, step);
    ps_table_pull(t, (const uint64_t[]){77}, 1, got);
    assert_memory_equal(got, init, sizeof got);
    assert_int_equal(ps_table_get(t, 77, &e), 1);
    assert_int_equal(e.pending, 1);
    assert_int_equal(e.count, step);
    assert_null(e.values);
  }
  assert_int_equal(ev.n, 0);
  ps_table_stats st = ps_table_get_stats(t);
  assert_int_equal(st.rows, 0);
  assert_int_equal(st.pending, 1);
  assert_int_equal(st.dropped, 2);

  /* The third push creates the row and applies its own gradient only. */
  push1(t, 77, g, 0.5f, 3);
  assert_events(&ev, "a77");
  ps_table_pull(t, (const uint64_t[]){77}, 1, got);
  for (int i = 0; i < 3; i++)
    assert_true(got[i] == init[i] - 0.5f * g[i]);
  assert_int_equal(ps_table_get(t, 77, &e), 1);
  assert_int_equal(e.pending, 0);
  assert_int_equal(e.count, 1);
  st = ps_table_get_stats(t);
  assert_int_equal(st.rows, 1);
  assert_int_equal(st.pending, 0);
  assert_int_equal(st.admitted, 1);
  ps_table_free(t);
  events_free(&ev);

  /* admit_after 0 and 1: at once. */
  for (uint32_t n = 0; n <= 1; n++) {
    o.admit_after = n;
    o.on_event = NULL;
    t = table_new(&o);
    push1(t, 77, g, 0.5f, 1);
    assert_int_equal(ps_table_get_stats(t).rows, 1);
    ps_table_free(t);
  }
}

/* max_pending bounds the counts; the least recently seen is forgotten. */
static void test_pending_is_bounded(void **state) {
  (void)state;
  ps_table_opts o = opts_of(PS_OPTIM_SGD, 2);
  o.admit_after = 2;
  o.max_pending = 4;
  ps_table *t = table_new(&o);
  const float g[2] = {1, 1};
  for (uint64_t k = 1; k <= 10; k++)
    push1(t, k, g, 0.1f, k);
  ps_table_stats st = ps_table_get_stats(t);
  assert_int_equal(st.pending, 4);
  assert_int_equal(st.forgotten, 6);
  ps_table_entry e;
  assert_int_equal(ps_table_get(t, 6, &e), 0);
  assert_int_equal(ps_table_get(t, 7, &e), 1);
  /* Key 1 was forgotten: it counts from 0 again.  Key 10 is admitted. */
  push1(t, 1, g, 0.1f, 11);
  assert_int_equal(ps_table_get_stats(t).rows, 0);
  push1(t, 10, g, 0.1f, 12);
  assert_int_equal(ps_table_get(t, 10, &e), 1);
  assert_int_equal(e.pending, 0);
  ps_table_free(t);
}

static void test_expire_idle(void **state) {
  (void)state;
  events ev = {0};
  ps_table_opts o = opts_of(PS_OPTIM_SGD, 2);
  o.admit_after = 2;
  o.idle_steps = 10;
  o.on_event = on_event;
  o.event_arg = &ev;
  ps_table *t = table_new(&o);
  const float g[2] = {1, -1};
  push1(t, 1, g, 0.1f, 0);
  push1(t, 1, g, 0.1f, 1);  /* admitted, touched at 1 */
  push1(t, 2, g, 0.1f, 4);
  push1(t, 2, g, 0.1f, 5);  /* admitted, touched at 5 */
  push1(t, 3, g, 0.1f, 6);  /* pending, seen at 6 */
  assert_events(&ev, "a1 a2");

  assert_int_equal(ps_table_expire(t, 10), 0);
  assert_int_equal(ps_table_expire(t, 11), 1);
  assert_events(&ev, "a1 a2 x1");
  assert_int_equal(ps_table_expire(t, 14), 0);
  assert_int_equal(ps_table_get_stats(t).pending, 1);
  assert_int_equal(ps_table_expire(t, 16), 1);
  assert_events(&ev, "a1 a2 x1 x2");
  ps_table_stats st = ps_table_get_stats(t);
  assert_int_equal(st.rows, 0);
  assert_int_equal(st.pending, 0);  /* key 3's count is forgotten too */
  assert_int_equal(st.expired, 2);
  assert_int_equal(st.forgotten, 1);

  /* Key 1 comes back fresh: admission counts from 0, values from init. */
  float init[2], got[2];
  ps_table_init_row(&o, 1, init);
  push1(t, 1, g, 0.1f, 20);
  ps_table_pull(t, (const uint64_t[]){1}, 1, got);
  assert_memory_equal(got, init, sizeof got);
  push1(t, 1, g, 0.1f, 21);
  ps_table_pull(t, (const uint64_t[]){1}, 1, got);
  for (int i = 0; i < 2; i++)
    assert_true(got[i] == init[i] - 0.1f * g[i]);
  ps_table_entry e;
  assert_int_equal(ps_table_get(t, 1, &e), 1);
  assert_int_equal(e.count, 1);
  assert_events(&ev, "a1 a2 x1 x2 a1");

  /* idle_steps 0: nothing expires. */
  ps_table_free(t);
  o.idle_steps = 0;
  t = table_new(&o);
  push1(t, 1, g, 0.1f, 0);
  push1(t, 1, g, 0.1f, 0);
  assert_int_equal(ps_table_expire(t, 1000000), 0);
  assert_int_equal(ps_table_get_stats(t).rows, 1);
  ps_table_free(t);
  events_free(&ev);
}

static void test_evict_least_recently_touched(void **state) {
  (void)state;
  events ev = {0};
  ps_table_opts o = opts_of(PS_OPTIM_ADAGRAD, 2);
  o.max_rows = 3;
  o.on_event = on_event;
  o.event_arg = &ev;
  ps_table *t = table_new(&o);
  const float g[2] = {1, -1};
  push1(t, 1, g, 0.1f, 1);
  push1(t, 2, g, 0.1f, 2);
  push1(t, 3, g, 0.1f, 3);
  push1(t, 1, g, 0.1f, 4);  /* 1 is now the most recent: 2 is the least */
  push1(t, 4, g, 0.1f, 5);
  assert_events(&ev, "a1 a2 a3 e2 a4");
  /* The least recent now is 3, then 1; a pull refreshes nothing. */
  float v[2];
  ps_table_pull(t, (const uint64_t[]){3}, 1, v);
  push(t, (const uint64_t[]){5, 4}, (const float[]){1, 1, 1, 1}, 2, 0.1f, 6);
  assert_events(&ev, "a1 a2 a3 e2 a4 e3 a5");
  ps_table_stats st = ps_table_get_stats(t);
  assert_int_equal(st.rows, 3);
  assert_int_equal(st.evicted, 2);
  assert_int_equal(st.admitted, 5);

  /* An evicted key comes back from its initial values and fresh slots. */
  float init[2], got[2];
  ps_table_init_row(&o, 2, init);
  push1(t, 2, g, 0.1f, 7);
  ps_table_pull(t, (const uint64_t[]){2}, 1, got);
  ps_table_entry e;
  assert_int_equal(ps_table_get(t, 2, &e), 1);
  assert_int_equal(e.count, 1);
  for (int i = 0; i < 2; i++) {
    float acc = o.optim.initial_accumulator + g[i] * g[i];
    assert_true(e.slots[0][i] == acc);
    check_near(got[i], init[i] - 0.1 * g[i] / sqrt(acc), "comeback", i);
  }
  assert_events(&ev, "a1 a2 a3 e2 a4 e3 a5 e1 a2");
  ps_table_free(t);
  events_free(&ev);
}

/* A push at an older step stamps its rows with the newest step the table
 * has seen, so the list stays in order and expiry follows it. */
static void test_stale_step_stamps_newest(void **state) {
  (void)state;
  ps_table_opts o = opts_of(PS_OPTIM_SGD, 1);
  o.idle_steps = 5;
  ps_table *t = table_new(&o);
  const float g[1] = {1};
  push1(t, 1, g, 0.1f, 10);
  push1(t, 2, g, 0.1f, 3);
  ps_table_entry e;
  assert_int_equal(ps_table_get(t, 2, &e), 1);
  assert_int_equal(e.last_step, 10);
  assert_int_equal(ps_table_expire(t, 14), 0);
  assert_int_equal(ps_table_expire(t, 15), 2);
  ps_table_free(t);
}

/* ------------------------------------------------------------------------ */
/* Bad input                                                                 */
/* ------------------------------------------------------------------------ */

static void test_push_refuses_repeated_keys(void **state) {
  (void)state;
  events ev = {0};
  ps_table_opts o = opts_of(PS_OPTIM_SGD, 1);
  o.on_event = on_event;
  o.event_arg = &ev;
  ps_table *t = table_new(&o);
  ps_errbuf eb = {0};
  const uint64_t keys[4] = {5, 9, 3, 9};
  assert_int_equal(ps_table_push(t, keys, (const float[]){1, 1, 1, 1}, 4, 0.1f, 1, &eb),
                   PS_EFORMAT);
  assert_non_null(strstr(eb.msg, "sparse table 7: push of 4 keys has key 9 at 1 and 3"));
  assert_int_equal(ps_table_get_stats(t).rows, 0);
  assert_int_equal(ev.n, 0);
  ps_table_free(t);
  events_free(&ev);
}

static void test_bad_options(void **state) {
  (void)state;
  ps_table *t = (ps_table *)1;
  ps_errbuf eb = {0};
  ps_table_opts o = opts_of(PS_OPTIM_SGD, 0);
  assert_int_equal(ps_table_new(&o, &t, &eb), PS_ECONFIG);
  assert_null(t);
  assert_string_equal(eb.msg, "sparse table 7: dim 0, expected 1..65536");
  o = opts_of(PS_OPTIM_SGD, 4);
  o.init.scale = 0;
  assert_int_equal(ps_table_new(&o, &t, &eb), PS_ECONFIG);
  assert_string_equal(eb.msg,
                      "sparse table 7: initializer normal with scale 0, expected a finite "
                      "scale > 0");
  o = opts_of((ps_optim_kind)9, 4);
  assert_int_equal(ps_table_new(&o, &t, &eb), PS_ECONFIG);
  assert_non_null(strstr(eb.msg, "optimizer kind 9"));
}

/* ------------------------------------------------------------------------ */
/* Iteration and restore                                                     */
/* ------------------------------------------------------------------------ */

/* A seeded history of pushes and expiries over 60 keys. */
static void random_pushes(ps_table *t, uint64_t seed, uint64_t from, uint64_t to) {
  ps_rng r;
  ps_rng_seed(&r, seed);
  uint32_t dim = ps_table_options(t)->dim;
  uint64_t universe[60];
  for (uint64_t i = 0; i < 60; i++)
    universe[i] = 1000 + i;
  for (uint64_t step = from; step < to; step++) {
    uint64_t keys[8];
    float g[8 * 8];
    size_t n = 1 + ps_rng_below(&r, 8);
    draw_keys(&r, keys, n, universe, 60);
    for (size_t i = 0; i < n * dim; i++)
      g[i] = (float)(ps_rng_uniform(&r) - 0.5);
    push(t, keys, g, n, 0.05f, step);
    if (step % 7 == 0)
      ps_table_expire(t, step);
  }
}

static void test_iterate_and_put_restores(void **state) {
  (void)state;
  events ea = {0}, eb = {0};
  ps_table_opts o = opts_of(PS_OPTIM_ADAM, 3);
  o.admit_after = 2;
  o.max_rows = 30;
  o.max_pending = 20;
  o.idle_steps = 12;
  o.on_event = on_event;
  o.event_arg = &ea;
  ps_table *a = table_new(&o);
  random_pushes(a, 5, 1, 300);
  ps_table_stats st = ps_table_get_stats(a);
  assert_true(st.rows > 10 && st.pending > 0 && st.evicted > 0);

  o.event_arg = &eb;
  ps_table *b = table_copy(a, &o);
  ps_table_iter it;
  ps_table_entry e;
  ps_errbuf err = {0};
  assert_int_equal(eb.n, 0);  /* a restore reports nothing */
  assert_tables_equal(a, b);

  /* ps_table_load, after ps_table_reserve, restores the same table; a key
   * loaded twice (as a row, or as a row and a pending key) is refused. */
  ps_table *d = table_new(&o);
  assert_int_equal(ps_table_reserve(d, st.rows, st.pending), 0);
  ps_table_iter_init(a, &it);
  ps_table_entry first = {0}, first_pending = {0};
  while (ps_table_iter_next(a, &it, &e)) {
    if (!e.pending && first.key == 0)
      first = e;
    if (e.pending && first_pending.key == 0)
      first_pending = e;
    assert_int_equal(ps_table_load(d, &e, &err), 0);
  }
  assert_tables_equal(a, d);
  assert_int_equal(ps_table_load(d, &first, &err), PS_ECORRUPT);
  assert_non_null(strstr(err.msg, "again: expected each key once"));
  first_pending.key = first.key;
  assert_int_equal(ps_table_load(d, &first_pending, &err), PS_ECORRUPT);
  assert_tables_equal(a, d);
  ps_table_free(d);

  /* The same history from here gives the same tables and events. */
  size_t before = ea.n;
  random_pushes(a, 6, 300, 500);
  random_pushes(b, 6, 300, 500);
  assert_tables_equal(a, b);
  assert_true(eb.n > 0);
  assert_int_equal(eb.n, ea.n - before);
  assert_memory_equal(eb.kind, ea.kind + before, eb.n);
  assert_memory_equal(eb.key, ea.key + before, eb.n * sizeof *eb.key);

  /* Put out of order: placed by last_step. */
  ps_table_opts o2 = opts_of(PS_OPTIM_SGD, 1);
  ps_table *c = table_new(&o2);
  const float v[1] = {1};
  uint64_t steps[4] = {5, 2, 9, 5}, want[4] = {2, 5, 5, 9}, keys[4] = {1, 2, 3, 4};
  for (int i = 0; i < 4; i++) {
    e = (ps_table_entry){.key = keys[i], .count = 1, .last_step = steps[i], .values = v};
    assert_int_equal(ps_table_put(c, &e, &err), 0);
  }
  ps_table_iter_init(c, &it);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(ps_table_iter_next(c, &it, &e), 1);
    assert_int_equal(e.last_step, want[i]);
  }
  assert_int_equal(e.key, 3);

  /* Bad entries are refused, naming what is wrong. */
  e = (ps_table_entry){.pending = 1, .key = 8, .count = 1};
  assert_int_equal(ps_table_put(c, &e, &err), PS_EFORMAT);
  assert_non_null(strstr(err.msg, "pending key 8, expected none"));
  e = (ps_table_entry){.pending = 1, .key = 8, .count = 2};
  assert_int_equal(ps_table_put(b, &e, &err), PS_EFORMAT);
  assert_non_null(strstr(err.msg, "pending key 8 with count 2, expected 1..1"));
  e = (ps_table_entry){.key = 8, .count = 2, .values = v};
  assert_int_equal(ps_table_put(b, &e, &err), PS_EFORMAT);
  assert_non_null(strstr(err.msg, "row 8 without slot 0, expected 2 slots (adam)"));
  ps_table_free(a);
  ps_table_free(b);
  ps_table_free(c);
  events_free(&ea);
  events_free(&eb);
}

/* A walk reads the table as it was when it began, whatever the table does
 * between its reads; the table itself goes on as one without a walk. */
static void test_walk(void **state) {
  (void)state;
  ps_table_opts o = opts_of(PS_OPTIM_ADAM, 3);
  o.admit_after = 2;
  o.max_rows = 30;
  o.max_pending = 20;
  o.idle_steps = 12;
  ps_table *a = table_new(&o);
  random_pushes(a, 5, 1, 300);
  /* b: a as it is now; d: a copy that will live the same history. */
  ps_table *b = table_new(&o), *d = table_new(&o);
  ps_table_iter it;
  ps_table_entry e;
  ps_errbuf err = {0};
  ps_table_iter_init(a, &it);
  while (ps_table_iter_next(a, &it, &e)) {
    assert_int_equal(ps_table_put(b, &e, &err), 0);
    assert_int_equal(ps_table_put(d, &e, &err), 0);
  }
  ps_table_stats st = ps_table_get_stats(a);
  assert_true(st.rows > 10 && st.pending > 0);

  ps_table_walk *w = ps_table_walk_begin(a), *w2 = ps_table_walk_begin(a), *w3 = NULL;
  assert_non_null(w);
  assert_non_null(w2);
  uint64_t rows = 0, pending = 0;
  ps_table_walk_counts(w, &rows, &pending);
  assert_int_equal(rows, st.rows);
  assert_int_equal(pending, st.pending);
  /* Three steps of history between reads: rows and keys change and go
   * before the walk reaches them. */
  /* w2 is read at the end; w3 begins half way, with its own copy e3 of the
   * table then, and reads along. */
  ps_table *c = table_new(&o), *c2 = table_new(&o), *c3 = table_new(&o), *e3 = table_new(&o);
  ps_rng ra, rd;
  ps_rng_seed(&ra, 99);
  ps_rng_seed(&rd, 99);
  uint64_t step = 300, read = 0;
  int rc;
  while ((rc = ps_table_walk_next(w, &e)) == 1) {
    assert_int_equal(ps_table_load(c, &e, &err), 0);
    if (++read == st.rows / 2) {
      w3 = ps_table_walk_begin(a);
      assert_non_null(w3);
      ps_table_iter_init(a, &it);
      ps_table_entry x;
      while (ps_table_iter_next(a, &it, &x))
        assert_int_equal(ps_table_put(e3, &x, &err), 0);
    }
    if (w3 != NULL && ps_table_walk_next(w3, &e) == 1)
      assert_int_equal(ps_table_load(c3, &e, &err), 0);
    for (int k = 0; k < 3; k++, step++)
      history_step(a, &ra, step);
  }
  assert_int_equal(rc, 0);
  assert_true(ps_table_walk_saved(w) > 0);
  ps_table_walk_end(w);
  assert_tables_equal(b, c);
  while ((rc = ps_table_walk_next(w2, &e)) == 1)
    assert_int_equal(ps_table_load(c2, &e, &err), 0);
  assert_int_equal(rc, 0);
  ps_table_walk_end(w2);
  assert_tables_equal(b, c2);
  assert_non_null(w3);
  while ((rc = ps_table_walk_next(w3, &e)) == 1)
    assert_int_equal(ps_table_load(c3, &e, &err), 0);
  assert_int_equal(rc, 0);
  ps_table_walk_end(w3);
  assert_tables_equal(e3, c3);
  /* At most 4 at once. */
  ps_table_walk *four[5];
  for (int k = 0; k < 4; k++)
    assert_non_null(four[k] = ps_table_walk_begin(a));
  assert_null(four[4] = ps_table_walk_begin(a));
  for (int k = 0; k < 4; k++)
    ps_table_walk_end(four[k]);
  for (uint64_t s2 = 300; s2 < step; s2++)
    history_step(d, &rd, s2);
  assert_tables_equal(a, d);

  /* A walk ended early, and a new one after it; ps_table_free ends an
   * open one. */
  w = ps_table_walk_begin(a);
  assert_non_null(w);
  assert_int_equal(ps_table_walk_next(w, &e), 1);
  ps_table_walk_end(w);
  w = ps_table_walk_begin(a);
  assert_non_null(w);
  history_step(a, &ra, step++);
  ps_table_free(a);
  ps_table_free(b);
  ps_table_free(c);
  ps_table_free(c2);
  ps_table_free(c3);
  ps_table_free(e3);
  ps_table_free(d);
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */
/* ------------------------------------------------------------------------ */

static void test_memory_per_row(void **state) {
  (void)state;
  enum { N = 100000, DIM = 16, BATCH = 1000 };
  ps_table_opts o = opts_of(PS_OPTIM_ADAGRAD, DIM);
  ps_table *t = table_new(&o);
  uint64_t keys[BATCH];
  static float g[BATCH * DIM];
  for (size_t i = 0; i < BATCH * DIM; i++)
    g[i] = 0.01f;
  for (uint64_t b = 0; b < N; b += BATCH) {
    for (uint64_t i = 0; i < BATCH; i++)
      keys[i] = ps_mix64(b + i);
    push(t, keys, g, BATCH, 0.1f, b);
  }
  ps_table_stats st = ps_table_get_stats(t);
  assert_int_equal(st.rows, N);
  double per_row = (double)st.bytes / N;
  double payload = DIM * 4.0 * 2;  /* values and adagrad's accumulator */
  printf("sparse table: %d rows of dim %d (adagrad): %.1f bytes per row (payload %.0f)\n", N,
         DIM, per_row, payload);
  assert_true(per_row > payload);
  assert_true(per_row < 2 * payload + 64);
  ps_table_free(t);
}

/* ------------------------------------------------------------------------ */
/* A random history against a plain reference model                          */
/* ------------------------------------------------------------------------ */

enum { MDIM = 3, MKEYS = 120, MAX_ENTRIES = 256 };

/* The model: a plain array of entries.  Its order is each entry's serial
 * (when it was last touched); the rules are TABLE.md's, written out. */
typedef struct mentry {
  uint64_t key;
  int pending;
  uint64_t count, step, serial;
  float w[MDIM], acc[MDIM];
} mentry;

typedef struct model {
  ps_table_opts o;
  mentry e[MAX_ENTRIES];
  int n;
  uint64_t serial;
  events ev;
  ps_table_stats st;
} model;

static int m_find(const model *m, uint64_t key) {
  for (int i = 0; i < m->n; i++)
    if (m->e[i].key == key)
      return i;
  return -1;
}

static int m_count(const model *m, int pending) {
  int c = 0;
  for (int i = 0; i < m->n; i++)
    c += m->e[i].pending == pending;
  return c;
}

/* The least recently touched entry of the kind, or -1. */
static int m_oldest(const model *m, int pending) {
  int best = -1;
  for (int i = 0; i < m->n; i++)
    if (m->e[i].pending == pending && (best < 0 || m->e[i].serial < m->e[best].serial))
      best = i;
  return best;
}

static uint64_t m_stamp(const model *m, int pending, uint64_t step) {
  for (int i = 0; i < m->n; i++)
    if (m->e[i].pending == pending && m->e[i].step > step)
      step = m->e[i].step;
  return step;
}

static void m_del(model *m, int i) {
  m->e[i] = m->e[--m->n];
}

static void m_event(model *m, char kind, uint64_t key) {
  on_event(&m->ev, (ps_table_event)kind, key);
}

static void m_touch(model *m, mentry *e, uint64_t step) {
  e->step = m_stamp(m, e->pending, step);
  e->serial = ++m->serial;
}

static void m_apply(const model *m, mentry *e, const float *g, float lr) {
  e->count++;
  for (int i = 0; i < MDIM; i++) {
    e->acc[i] += g[i] * g[i];
    e->w[i] -= lr * g[i] / (sqrtf(e->acc[i]) + m->o.optim.eps);
  }
}

static void m_admit(model *m, uint64_t key, const float *g, float lr, uint64_t step) {
  if (m->o.max_rows && m_count(m, 0) >= (int)m->o.max_rows) {
    int old = m_oldest(m, 0);
    m_event(m, 'e', m->e[old].key);
    m->st.evicted++;
    m_del(m, old);
  }
  mentry *e = &m->e[m->n++];
  *e = (mentry){.key = key};
  ps_table_init_row(&m->o, key, e->w);
  for (int i = 0; i < MDIM; i++)
    e->acc[i] = m->o.optim.initial_accumulator;
  m_touch(m, e, step);
  m_event(m, 'a', key);
  m->st.admitted++;
  m_apply(m, e, g, lr);
}

static void m_push(model *m, const uint64_t *keys, const float *g, size_t n, float lr,
                   uint64_t step) {
  int had_row[16];
  for (size_t i = 0; i < n; i++) {
    int j = m_find(m, keys[i]);
    had_row[i] = j >= 0 && !m->e[j].pending;
    if (had_row[i]) {
      m_apply(m, &m->e[j], g + i * MDIM, lr);
      m_touch(m, &m->e[j], step);
    }
  }
  for (size_t i = 0; i < n; i++) {
    if (had_row[i])
      continue;
    int j = m_find(m, keys[i]);
    uint64_t c = (j >= 0 ? m->e[j].count : 0) + 1;
    if (c >= m->o.admit_after) {
      if (j >= 0)
        m_del(m, j);
      m_admit(m, keys[i], g + i * MDIM, lr, step);
      continue;
    }
    m->st.dropped++;
    if (j < 0) {
      if (m_count(m, 1) >= (int)m->o.max_pending) {
        m_del(m, m_oldest(m, 1));
        m->st.forgotten++;
      }
      j = m->n++;
      m->e[j] = (mentry){.key = keys[i], .pending = 1};
    }
    m->e[j].count = c;
    m_touch(m, &m->e[j], step);
  }
}

static void m_expire(model *m, uint64_t step) {
  for (int pending = 0; pending <= 1; pending++) {
    int i;
    while ((i = m_oldest(m, pending)) >= 0 && m->e[i].step <= step &&
           step - m->e[i].step >= m->o.idle_steps) {
      if (!pending) {
        m_event(m, 'x', m->e[i].key);
        m->st.expired++;
      } else {
        m->st.forgotten++;
      }
      m_del(m, i);
    }
  }
}

static int cmp_serial(const void *a, const void *b) {
  const mentry *x = a, *y = b;
  if (x->pending != y->pending)
    return x->pending - y->pending;
  return (x->serial > y->serial) - (x->serial < y->serial);
}

static void m_check(model *m, const ps_table *t, int op) {
  static mentry sorted[MAX_ENTRIES];
  memcpy(sorted, m->e, (size_t)m->n * sizeof *sorted);
  qsort(sorted, (size_t)m->n, sizeof *sorted, cmp_serial);
  ps_table_iter it;
  ps_table_entry e;
  ps_table_iter_init(t, &it);
  for (int i = 0; i < m->n; i++) {
    if (!ps_table_iter_next(t, &it, &e))
      fail_msg("op %d: the table ends after %d entries, the model has %d", op, i, m->n);
    const mentry *w = &sorted[i];
    if (e.key != w->key || e.pending != w->pending || e.count != w->count ||
        e.last_step != w->step)
      fail_msg("op %d entry %d: table key %llu pending %d count %llu step %llu, model key %llu "
               "pending %d count %llu step %llu", op, i, (unsigned long long)e.key, e.pending,
               (unsigned long long)e.count, (unsigned long long)e.last_step,
               (unsigned long long)w->key, w->pending, (unsigned long long)w->count,
               (unsigned long long)w->step);
    for (int j = 0; !e.pending && j < MDIM; j++) {
      check_near(e.values[j], w->w[j], "model w", j);
      check_near(e.slots[0][j], w->acc[j], "model acc", j);
    }
  }
  assert_int_equal(ps_table_iter_next(t, &it, &e), 0);
  ps_table_stats st = ps_table_get_stats(t);
  if (st.admitted != m->st.admitted || st.evicted != m->st.evicted ||
      st.expired != m->st.expired || st.forgotten != m->st.forgotten ||
      st.dropped != m->st.dropped)
    fail_msg("op %d: counters admitted %llu evicted %llu expired %llu forgotten %llu dropped "
             "%llu, model %llu %llu %llu %llu %llu", op, (unsigned long long)st.admitted,
             (unsigned long long)st.evicted, (unsigned long long)st.expired,
             (unsigned long long)st.forgotten, (unsigned long long)st.dropped,
             (unsigned long long)m->st.admitted, (unsigned long long)m->st.evicted,
             (unsigned long long)m->st.expired, (unsigned long long)m->st.forgotten,
             (unsigned long long)m->st.dropped);
}

static void test_random_against_model(void **state) {
  (void)state;
  enum { OPS = 4000 };
  events ev = {0};
  static model m;
  memset(&m, 0, sizeof m);
  ps_table_opts o = opts_of(PS_OPTIM_ADAGRAD, MDIM);
  o.admit_after = 3;
  o.max_rows = 25;
  o.max_pending = 50;
  o.idle_steps = 30;
  o.on_event = on_event;
  o.event_arg = &ev;
  m.o = o;
  ps_table *t = table_new(&o);
  ps_rng r;
  ps_rng_seed(&r, 2024);
  uint64_t universe[MKEYS];
  for (int i = 0; i < MKEYS; i++)
    universe[i] = ps_rng_next(&r);
  uint64_t step = 0;
  for (int op = 0; op < OPS; op++) {
    /* Mostly forward; now and then a push made at an older step. */
    uint64_t at;
    if (ps_rng_below(&r, 10) == 0) {
      at = step > 5 ? step - ps_rng_below(&r, 6) : 0;
    } else {
      step++;
      at = step;
    }
    uint64_t keys[16];
    float g[16 * MDIM], got[16 * MDIM], want[MDIM];
    unsigned what = (unsigned)ps_rng_below(&r, 100);
    if (what < 60) {
      size_t n = 1 + ps_rng_below(&r, 12);
      draw_keys(&r, keys, n, universe, MKEYS);
      for (size_t i = 0; i < n * MDIM; i++)
        g[i] = (float)(ps_rng_uniform(&r) - 0.5);
      float lr = 0.05f;
      push(t, keys, g, n, lr, at);
      m_push(&m, keys, g, n, lr, at);
    } else if (what < 75) {
      size_t n = 1 + ps_rng_below(&r, 10);
      for (size_t i = 0; i < n; i++)
        keys[i] = universe[ps_rng_below(&r, MKEYS)];
      ps_table_pull(t, keys, n, got);
      for (size_t i = 0; i < n; i++) {
        int j = m_find(&m, keys[i]);
        if (j >= 0 && !m.e[j].pending)
          memcpy(want, m.e[j].w, sizeof want);
        else
          ps_table_init_row(&o, keys[i], want);
        for (int d = 0; d < MDIM; d++)
          check_near(got[i * MDIM + d], want[d], "pull", d);
      }
    } else if (what < 85) {
      ps_table_expire(t, at);
      m_expire(&m, at);
    } else if (what < 95) {
      uint64_t k = universe[ps_rng_below(&r, MKEYS)];
      int j = m_find(&m, k);
      assert_int_equal(ps_table_remove(t, k), j >= 0);
      if (j >= 0)
        m_del(&m, j);
    } else {
      m_check(&m, t, op);
    }
    if (ev.n != m.ev.n || (ev.n > 0 && (memcmp(ev.kind, m.ev.kind, ev.n) != 0 ||
                                        memcmp(ev.key, m.ev.key, ev.n * sizeof *ev.key) != 0)))
      fail_msg("op %d: %zu events, the model has %zu (or they differ)", op, ev.n, m.ev.n);
  }
  m_check(&m, t, OPS);
  ps_table_stats st = ps_table_get_stats(t);
  printf("model: %d ops, %llu admitted, %llu evicted, %llu expired, %llu forgotten, %llu "
         "dropped\n", OPS, (unsigned long long)st.admitted, (unsigned long long)st.evicted,
         (unsigned long long)st.expired, (unsigned long long)st.forgotten,
         (unsigned long long)st.dropped);
  assert_true(st.evicted > 0 && st.expired > 0 && st.forgotten > 0 && st.admitted > 100);
  ps_table_free(t);
  events_free(&ev);
  events_free(&m.ev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_insert_and_read_back),
      cmocka_unit_test(test_initial_values),
      cmocka_unit_test(test_no_collisions),
      cmocka_unit_test(test_optim_sgd),
      cmocka_unit_test(test_optim_adagrad),
      cmocka_unit_test(test_optim_adam),
      cmocka_unit_test(test_admission),
      cmocka_unit_test(test_pending_is_bounded),
      cmocka_unit_test(test_expire_idle),
      cmocka_unit_test(test_evict_least_recently_touched),
      cmocka_unit_test(test_stale_step_stamps_newest),
      cmocka_unit_test(test_push_refuses_repeated_keys),
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_iterate_and_put_restores),
      cmocka_unit_test(test_walk),
      cmocka_unit_test(test_memory_per_row),
      cmocka_unit_test(test_random_against_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
