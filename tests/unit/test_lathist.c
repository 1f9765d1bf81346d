/* The summary lines' latency histogram (src/common/lathist.c): buckets
 * at their bounds, quantiles within a bucket's width of the truth, the
 * edges (empty, below 1 us, past the top). */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/lathist.h"

/* Half a bucket's width, as a ratio: the most a quantile may be off. */
static const double slack = 1.0443;

static void test_empty(void **state) {
  (void)state;
  ps_lathist h;
  ps_lathist_init(&h);
  assert_true(ps_lathist_quantile(&h, 0.5) == 0);
  assert_true(ps_lathist_quantile(&h, 1) == 0);
}

/* Just inside each bucket's bounds (seconds to microseconds rounds: a
 * bound itself may land either side). */
static void test_buckets_hold_their_range(void **state) {
  (void)state;
  for (int k = 0; k < 8 * 24; k++) {
    ps_lathist h;
    ps_lathist_init(&h);
    ps_lathist_add(&h, exp2(k / 8.0) * 1e-6 * (1 + 1e-12));
    ps_lathist_add(&h, exp2((k + 1) / 8.0) * 1e-6 * (1 - 1e-12));
    assert_int_equal(h.count[1 + k], 2);
  }
}

static void test_quantiles_of_a_known_spread(void **state) {
  (void)state;
  ps_lathist h;
  ps_lathist_init(&h);
  /* 1000 observations 1 ms .. 1000 ms: the q-quantile is q seconds. */
  for (int i = 1; i <= 1000; i++)
    ps_lathist_add(&h, i * 1e-3);
  assert_int_equal(h.n, 1000);
  assert_true(fabs(h.sum_s - 500.5) < 1e-9);
  assert_true(h.max_s == 1.0);
  double qs[] = {0.01, 0.1, 0.5, 0.9, 0.99};
  for (size_t i = 0; i < sizeof qs / sizeof *qs; i++) {
    double v = ps_lathist_quantile(&h, qs[i]);
    assert_true(v <= qs[i] * slack && v >= qs[i] / slack);
  }
  assert_true(ps_lathist_quantile(&h, 1) == 1.0);  /* never above the maximum */
}

static void test_edges(void **state) {
  (void)state;
  ps_lathist h;
  ps_lathist_init(&h);
  ps_lathist_add(&h, -1);
  ps_lathist_add(&h, 0.2e-6);
  assert_int_equal(h.count[0], 2);
  assert_true(ps_lathist_quantile(&h, 0.5) == 0.2e-6);  /* the maximum caps 0.5 us */
  ps_lathist_add(&h, 100.0);
  assert_int_equal(h.count[PS_LATHIST_BUCKETS - 1], 1);
  assert_true(ps_lathist_quantile(&h, 1) == 100.0);
  assert_true(ps_lathist_quantile(&h, 0) == 0.5e-6);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_empty),
      cmocka_unit_test(test_buckets_hold_their_range),
      cmocka_unit_test(test_quantiles_of_a_known_spread),
      cmocka_unit_test(test_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
