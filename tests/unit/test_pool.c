/* The fork-join pool (src/common/pool.c): ps_pool_run runs on every
 * thread; ps_pool_for calls fn once for each item, whatever the count. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/pool.h"

typedef struct counts {
  _Atomic int n[64];
} counts;

static void count_item(void *arg, int k) {
  counts *c = arg;
  c->n[k]++;
}

static void test_for_calls_each_item_once(void **state) {
  (void)state;
  int sizes[] = {0, 1, 2, 3, 7, 64};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    counts c = {0};
    ps_pool_for(sizes[s], count_item, &c);
    for (int k = 0; k < 64; k++)
      assert_int_equal(c.n[k], k < sizes[s] ? 1 : 0);
  }
}

static void record_tid(void *arg, int tid, int nthreads) {
  int *seen = arg;
  assert_int_equal(nthreads, 3);
  seen[tid]++;
}

static void test_run_on_every_thread(void **state) {
  (void)state;
  ps_pool *p = ps_pool_new(3);
  assert_non_null(p);
  int seen[3] = {0};
  ps_pool_run(p, record_tid, seen);
  ps_pool_run(p, record_tid, seen);
  for (int t = 0; t < 3; t++)
    assert_int_equal(seen[t], 2);
  ps_pool_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_for_calls_each_item_once),
      cmocka_unit_test(test_run_on_every_thread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
