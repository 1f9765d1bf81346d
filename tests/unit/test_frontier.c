/* The durability frontier (src/ps/frontier.c): which journal entries
 * are durable, and when held acknowledgements go out. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>

#include "common/log.h"
#include "ps/frontier.h"

/* A waiter records the status it was released with. */
typedef struct rec {
  int status;
  int calls;
} rec;

static void done(void *arg, int status) {
  rec *r = arg;
  r->status = status;
  r->calls++;
}

static void test_restored_state_is_durable(void **state) {
  (void)state;
  ps_frontier f;
  ps_frontier_init(&f, 0, 1, 10, 0);
  rec a = {0};
  assert_int_equal(ps_frontier_wait(&f, 10, done, &a), PS_DURABLE_NOW);
  assert_int_equal(ps_frontier_wait(&f, 11, done, &a), PS_DURABLE_QUEUED);
  ps_frontier_answered(&f, 11, NULL);
  assert_int_equal(a.calls, 1);
  assert_int_equal(a.status, PS_DURABLE_NOW);
  assert_int_equal(f.waiting, 0);
}

/* Back-pressure: while held at 11, entry 11's acknowledgement goes out
 * when durable, 12's and 13's wait although durable, and go out in order
 * once the hold ends; new ones then go at once. */
static void test_hold_keeps_durable_ones(void **state) {
  (void)state;
  ps_frontier f;
  ps_frontier_init(&f, 0, 1, 10, 0);
  ps_frontier_hold(&f, 11);
  rec a = {0}, b = {0}, c = {0};
  assert_int_equal(ps_frontier_wait(&f, 11, done, &a), PS_DURABLE_QUEUED);
  assert_int_equal(ps_frontier_wait(&f, 12, done, &b), PS_DURABLE_QUEUED);
  ps_frontier_answered(&f, 11, NULL);
  ps_frontier_answered(&f, 12, NULL);
  assert_int_equal(a.calls, 1);
  assert_int_equal(b.calls, 0);
  assert_int_equal(ps_frontier_wait(&f, 13, done, &c), PS_DURABLE_QUEUED);
  ps_frontier_answered(&f, 13, NULL);
  ps_frontier_covered(&f, 13);
  assert_int_equal(b.calls + c.calls, 0);
  assert_int_equal(f.waiting, 2);
  ps_frontier_unhold(&f);
  assert_int_equal(b.calls, 1);
  assert_int_equal(b.status, PS_DURABLE_NOW);
  assert_int_equal(c.calls, 1);
  assert_int_equal(f.waiting, 0);
  assert_int_equal(ps_frontier_wait(&f, 13, done, &a), PS_DURABLE_NOW);
}

static void test_fresh_state_waits_for_its_first_snapshot(void **state) {
  (void)state;
  ps_frontier f;
  ps_frontier_init(&f, 0, 0, 0, 0);
  rec a = {0}, b = {0};
  /* Even an entry Redis stored is not durable: its base state is not. */
  assert_int_equal(ps_frontier_wait(&f, 0, done, &a), PS_DURABLE_QUEUED);
  assert_int_equal(ps_frontier_wait(&f, 1, done, &b), PS_DURABLE_QUEUED);
  ps_frontier_answered(&f, 1, NULL);
  assert_int_equal(a.calls + b.calls, 0);
  /* The first snapshot, cut at 0, switches: 0 and the stored 1 are durable. */
  ps_frontier_covered(&f, 0);
  assert_int_equal(a.calls, 1);
  assert_int_equal(b.calls, 1);
  assert_int_equal(b.status, PS_DURABLE_NOW);
  assert_int_equal(ps_frontier_wait(&f, 1, done, &a), PS_DURABLE_NOW);
}

static void test_hole_holds_until_a_covering_snapshot(void **state) {
  (void)state;
  ps_frontier f;
  ps_frontier_init(&f, 0, 1, 4, 0);
  rec r5 = {0}, r6 = {0}, r8 = {0};
  assert_int_equal(ps_frontier_wait(&f, 5, done, &r5), PS_DURABLE_QUEUED);
  ps_frontier_answered(&f, 5, "NOREPLICAS Not enough good replicas to write.");
  assert_int_equal(r5.calls, 0);
  assert_true(f.hole);
  /* Stored after the hole: still not durable, a replay could not reach it. */
  assert_int_equal(ps_frontier_wait(&f, 6, done, &r6), PS_DURABLE_QUEUED);
  ps_frontier_answered(&f, 6, NULL);
  assert_int_equal(r6.calls, 0);
  /* A snapshot cut before the hole does not cover it. */
  ps_frontier_covered(&f, 4);
  assert_int_equal(r5.calls, 0);
  ps_frontier_answered(&f, 7, "READONLY");
  ps_frontier_answered(&f, 8, NULL);
  assert_int_equal(ps_frontier_wait(&f, 8, done, &r8), PS_DURABLE_QUEUED);
  /* Cut at 6: covers the first hole but not the one at 7. */
  ps_frontier_covered(&f, 6);
  assert_int_equal(r5.calls, 1);
  assert_int_equal(r6.calls, 1);
  assert_int_equal(r8.calls, 0);
  assert_true(f.hole);
  /* Cut at 7 covers it; 8, stored after the cut with no failure since, is
   * durable too. */
  ps_frontier_covered(&f, 7);
  assert_int_equal(r8.calls, 1);
  assert_int_equal(r8.status, PS_DURABLE_NOW);
  assert_false(f.hole);
  assert_int_equal(f.durable_n, 8);
  assert_int_equal(f.nondurable, 0);
}

static void test_lost_redis_state(void **state) {
  (void)state;
  ps_frontier f;
  ps_frontier_init(&f, 0, 1, 20, 0);
  ps_frontier_lost(&f, 25, "Redis lost this shard's keys");
  rec a = {0};
  ps_frontier_answered(&f, 21, NULL);
  assert_int_equal(ps_frontier_wait(&f, 21, done, &a), PS_DURABLE_QUEUED);
  ps_frontier_covered(&f, 25);
  assert_int_equal(a.calls, 1);
}

static void test_degrade_acknowledges_and_counts(void **state) {
  (void)state;
  ps_frontier f;
  ps_frontier_init(&f, 1, 1, 0, 7);
  rec a = {0}, b = {0};
  assert_int_equal(ps_frontier_wait(&f, 1, done, &a), PS_DURABLE_QUEUED);
  ps_frontier_answered(&f, 1, "OOM command not allowed");
  assert_int_equal(a.calls, 1);
  assert_int_equal(a.status, PS_DURABLE_NOT);
  assert_int_equal(ps_frontier_wait(&f, 2, done, &b), PS_DURABLE_QUEUED);
  ps_frontier_answered(&f, 2, NULL);  /* stored, but after the hole */
  assert_int_equal(b.status, PS_DURABLE_NOT);
  /* A duplicate's wait for what was already answered: counted at once. */
  assert_int_equal(ps_frontier_wait(&f, 2, done, &b), PS_DURABLE_NOT);
  assert_int_equal(f.nondurable, 7 + 3);
  ps_frontier_covered(&f, 2);
  assert_int_equal(ps_frontier_wait(&f, 2, done, &b), PS_DURABLE_NOW);
  assert_int_equal(f.nondurable, 10);
}

static void test_cancel_runs_every_waiter(void **state) {
  (void)state;
  ps_frontier f;
  ps_frontier_init(&f, 0, 0, 0, 0);
  rec a = {0}, b = {0};
  ps_frontier_wait(&f, 1, done, &a);
  ps_frontier_wait(&f, 2, done, &b);
  ps_frontier_cancel(&f, -EPERM);
  assert_int_equal(a.status, -EPERM);
  assert_int_equal(b.status, -EPERM);
  assert_int_equal(f.waiting, 0);
  assert_null(f.wq);
}

int main(void) {
  ps_log_init("test", PS_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hold_keeps_durable_ones),
      cmocka_unit_test(test_restored_state_is_durable),
      cmocka_unit_test(test_fresh_state_waits_for_its_first_snapshot),
      cmocka_unit_test(test_hole_holds_until_a_covering_snapshot),
      cmocka_unit_test(test_lost_redis_state),
      cmocka_unit_test(test_degrade_acknowledges_and_counts),
      cmocka_unit_test(test_cancel_runs_every_waiter),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
