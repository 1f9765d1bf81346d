/* The one backoff (src/common/backoff.c): doubling, capped, jittered
 * within [c/2, c], starting over after a reset. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/backoff.h"

static void test_doubles_to_the_cap_within_jitter(void **state) {
  (void)state;
  ps_backoff b;
  ps_backoff_init(&b, 100, 2000, 42);
  unsigned want[] = {100, 200, 400, 800, 1600, 2000, 2000, 2000};
  for (int round = 0; round < 50; round++) {
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
      unsigned d = ps_backoff_next(&b);
      assert_in_range(d, want[k] - want[k] / 2, want[k]);
    }
    assert_int_equal(b.attempts, sizeof want / sizeof *want);
    ps_backoff_reset(&b);
  }
}

static void test_jitter_spreads(void **state) {
  (void)state;
  ps_backoff a, b;
  ps_backoff_init(&a, 1000, 1000, 1);
  ps_backoff_init(&b, 1000, 1000, 2);
  int differ = 0;
  for (int k = 0; k < 20; k++)
    differ += ps_backoff_next(&a) != ps_backoff_next(&b);
  assert_true(differ > 10);
}

static void test_tiny_and_huge(void **state) {
  (void)state;
  ps_backoff b;
  ps_backoff_init(&b, 0, 0, 3);  /* at least 1 ms */
  assert_int_equal(ps_backoff_next(&b), 1);
  ps_backoff_init(&b, 7, 5000, 3);
  for (int k = 0; k < 100; k++)  /* the shift stops; the cap holds */
    assert_in_range(ps_backoff_next(&b), 1, 5000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_doubles_to_the_cap_within_jitter),
      cmocka_unit_test(test_jitter_spreads),
      cmocka_unit_test(test_tiny_and_huge),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
