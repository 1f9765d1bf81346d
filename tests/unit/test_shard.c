/* The shard's journal (src/ps/shard.c): every change is an entry, and a
 * replay of the entries through ps_shard_replay gives the same bytes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "ps/shard.h"
#include "state_assert.h"

#define N 37

static ps_shard_opts opts(int consistency) {
  ps_shard_opts o = {.index = 0, .nworkers = 2, .nfloats = N, .consistency = consistency,
                     .replicas_to_aggregate = 2};
  o.optim = ps_optim_default(PS_OPTIM_ADAM, 0.01f);
  return o;
}

/* A recorded entry, its gradient copied. */
typedef struct rec {
  ps_journal j;
  float g[N];
} rec;

static void record(rec *r, const ps_journal *j) {
  r->j = *j;
  if (j->kind == PS_JOURNAL_PUSH) {
    memcpy(r->g, j->g, sizeof r->g);
    r->j.g = r->g;
  }
}

/* The whole state of a and b, image against image: values, slots,
 * accumulator, exactly-once rows and the fixed fields. */
static void assert_same_state(const ps_shard *a, const ps_shard *b) {
  ps_state_info ia = ps_shard_state_info(a), ib = ps_shard_state_info(b);
  assert_state_equal(&ia, &ib);
  assert_int_equal(ps_shard_journal(a), ps_shard_journal(b));
  float *xa = malloc(ia.image_floats * sizeof(float)), *xb = malloc(ib.image_floats * sizeof(float));
  assert_non_null(xa);
  assert_non_null(xb);
  ps_shard_state_write(a, xa);
  ps_shard_state_write(b, xb);
  assert_memory_equal(xa, xb, ia.image_floats * sizeof(float));
  free(xa);
  free(xb);
}

static void grad(float *g, int k) {
  for (int i = 0; i < N; i++)
    g[i] = (float)((i * 7 + k * 13) % 11) / 11.0f - 0.5f;
}

static void test_async_replay_is_exact(void **state) {
  (void)state;
  ps_shard_opts o = opts(PS_CONSISTENCY_ASYNC);
  ps_shard *live = ps_shard_new(&o, NULL), *again = ps_shard_new(&o, NULL);
  assert_non_null(live);
  assert_non_null(again);
  rec log[8];
  int n = 0;
  float g[N];
  for (int k = 0; k < 6; k++) {
    grad(g, k);
    ps_journal j;
    assert_int_equal(ps_shard_push(live, (uint32_t)(k % 2), 5, (uint64_t)(k / 2 + 1), 0, g, NULL, 0, &j),
                     PS_SHARD_APPLIED);
    assert_int_equal(j.n, (uint64_t)k + 1);
    assert_int_equal(j.version, (uint64_t)k + 1);
    record(&log[n++], &j);
  }
  /* A duplicate makes no entry. */
  assert_int_equal(ps_shard_push(live, 0, 5, 1, 0, g, NULL, 0, NULL), PS_SHARD_DUPLICATE);
  assert_int_equal(ps_shard_journal(live), 6);
  for (int k = 0; k < n; k++)
    assert_int_equal(ps_shard_replay(again, &log[k].j), 0);
  assert_same_state(again, live);
  /* Entries that do not follow the state are not applied: one already
   * held, and one after a missing entry. */
  assert_int_equal(ps_shard_replay(again, &log[2].j), 1);
  ps_journal ahead = log[5].j;
  ahead.n = 8;
  assert_int_equal(ps_shard_replay(again, &ahead), 1);
  assert_int_equal(ps_shard_version(again), 6);
  ps_shard_free(live);
  ps_shard_free(again);
}

static void test_sync_flush_and_target_replay(void **state) {
  (void)state;
  ps_shard_opts o = opts(PS_CONSISTENCY_SYNC);
  ps_shard *live = ps_shard_new(&o, NULL), *again = ps_shard_new(&o, NULL);
  assert_non_null(live);
  assert_non_null(again);
  rec log[8];
  int n = 0;
  float g[N];
  ps_journal j;
  grad(g, 1);
  assert_int_equal(ps_shard_push(live, 0, 1, 1, 0, g, NULL, 0, &j), PS_SHARD_APPLIED);
  record(&log[n++], &j);
  assert_int_equal(ps_shard_version(live), 0);  /* one of two gradients: the step is open */
  assert_int_equal(ps_shard_sync_flush(live, &j), 1);
  record(&log[n++], &j);
  assert_int_equal(ps_shard_version(live), 1);
  assert_int_equal(ps_shard_state_info(live).target, 1);
  grad(g, 2);
  assert_int_equal(ps_shard_push(live, 0, 1, 2, 1, g, NULL, 0, &j), PS_SHARD_APPLIED);
  record(&log[n++], &j);
  assert_int_equal(ps_shard_version(live), 2);  /* target 1: one gradient completes a step */
  assert_int_equal(ps_shard_sync_set_target(live, 2, &j), 1);
  record(&log[n++], &j);
  assert_int_equal(ps_shard_sync_set_target(live, 2, &j), 0);  /* no change, no entry */
  for (int k = 0; k < n; k++)
    assert_int_equal(ps_shard_replay(again, &log[k].j), 0);
  assert_int_equal(ps_shard_state_info(again).target, 2);
  assert_same_state(again, live);
  ps_shard_free(live);
  ps_shard_free(again);
}

/* An image loaded piece by piece, in pieces that split segments and rows,
 * last piece first, is the state it was written from. */
static void test_state_load_in_pieces(void **state) {
  (void)state;
  ps_shard_opts o = opts(PS_CONSISTENCY_SYNC);
  ps_shard *live = ps_shard_new(&o, NULL), *again = ps_shard_new(&o, NULL);
  assert_non_null(live);
  assert_non_null(again);
  float g[N];
  for (int k = 0; k < 5; k++) {
    grad(g, k);
    assert_int_equal(ps_shard_push(live, (uint32_t)(k % 2), 7 + (uint64_t)(k % 2),
                                   (uint64_t)(k / 2 + 1), ps_shard_version(live), g, NULL, 0, NULL),
                     PS_SHARD_APPLIED);
  }
  ps_state_info in = ps_shard_state_info(live);
  assert_int_equal(in.accum_count, 1);  /* an open step: the accumulator counts */
  float *img = malloc(in.image_floats * sizeof(float));
  assert_non_null(img);
  ps_shard_state_write(live, img);
  const uint64_t piece = 5;  /* splits every segment of 37 and the 4-float rows */
  uint64_t last = (in.image_floats - 1) / piece * piece;
  for (uint64_t off = last + piece; off > 0;) {
    off -= piece;
    uint64_t count = in.image_floats - off < piece ? in.image_floats - off : piece;
    /* unaligned on purpose: a wire buffer's floats may be */
    unsigned char raw[piece * sizeof(float) + 1];
    memcpy(raw + 1, img + off, count * sizeof(float));
    ps_shard_state_load_piece(again, &in, off, raw + 1, count);
  }
  assert_int_equal(ps_shard_state_load_end(again, &in, NULL), 0);
  ps_shard_set_journal(again, ps_shard_journal(live));
  assert_same_state(again, live);
  free(img);
  ps_shard_free(live);
  ps_shard_free(again);
}

/* A sync image whose target is above this cluster's replicas_to_aggregate
 * (a checkpoint of a larger cluster) loads with the cluster's: two
 * gradients then complete a step, rather than a step waiting out
 * sync_timeout_ms for a third worker that does not exist. */
static void test_load_target_capped(void **state) {
  (void)state;
  ps_shard_opts o = opts(PS_CONSISTENCY_SYNC);
  ps_shard *s = ps_shard_new(&o, NULL);
  assert_non_null(s);
  ps_state_info in = ps_shard_state_info(s);
  float *img = malloc(in.image_floats * sizeof(float));
  assert_non_null(img);
  ps_shard_state_write(s, img);
  in.target = 3;
  ps_shard_state_load_piece(s, &in, 0, img, in.image_floats);
  assert_int_equal(ps_shard_state_load_end(s, &in, NULL), 0);
  assert_int_equal(ps_shard_sync_target(s), 2);
  float g[N];
  for (uint32_t w = 0; w < 2; w++) {
    grad(g, (int)w);
    assert_int_equal(ps_shard_push(s, w, 1, 1, 0, g, NULL, 0, NULL), PS_SHARD_APPLIED);
  }
  assert_int_equal(ps_shard_version(s), 1);
  free(img);
  ps_shard_free(s);
}

/* Shard 0's last_step: a push at or past it is STALE and counted, the
 * version stays; a replay applies what was applied whatever the limit. */
static void test_last_step(void **state) {
  (void)state;
  ps_shard_opts o = opts(PS_CONSISTENCY_ASYNC);
  o.last_step = 3;
  ps_shard *s = ps_shard_new(&o, NULL);
  assert_non_null(s);
  float g[N];
  rec log[4];
  for (int k = 0; k < 4; k++) {
    grad(g, k);
    ps_journal j;
    ps_push_result r = ps_shard_push(s, 0, 1, (uint64_t)k + 1, (uint64_t)k, g, NULL, 0, &j);
    assert_int_equal(r, k < 3 ? PS_SHARD_APPLIED : PS_SHARD_STALE);
    if (r == PS_SHARD_APPLIED)
      record(&log[k], &j);
  }
  assert_int_equal(ps_shard_version(s), 3);
  ps_shard_counts c = ps_shard_get_counts(s);
  assert_int_equal(c.applied, 3);
  assert_int_equal(c.stale, 1);
  assert_int_equal(ps_shard_worker_incarnation(s, 0), 1);
  /* Lowered to 1 for a restart: the replay still reaches version 3. */
  o.last_step = 1;
  ps_shard *again = ps_shard_new(&o, NULL);
  assert_non_null(again);
  for (int k = 0; k < 3; k++)
    assert_int_equal(ps_shard_replay(again, &log[k].j), 0);
  assert_same_state(s, again);
  ps_shard_free(s);
  ps_shard_free(again);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_async_replay_is_exact),
      cmocka_unit_test(test_sync_flush_and_target_replay),
      cmocka_unit_test(test_state_load_in_pieces),
      cmocka_unit_test(test_last_step),
      cmocka_unit_test(test_load_target_capped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
