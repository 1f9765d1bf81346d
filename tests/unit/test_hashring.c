/* src/layout/hashring.c: the placement of sparse keys (LAYOUT.md §6):
 * the same everywhere (fixed owners of fixed keys), every shard owning a
 * fair share, about 1/N of the keys moving when a shard is added, and a
 * Zipf stream's busiest shard near the mean. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/rng.h"
#include "layout/hashring.h"

/* Owners of some keys on rings of 2 and 5 shards: LAYOUT.md's rule, frozen.
 * A change of the hashes, the seeds or the order of points moves rows
 * between shards, which a restored table would then look for in the wrong
 * place: this test fails first. */
static void test_fixed_owners(void **state) {
  (void)state;
  static const struct {
    int nshards;
    uint32_t table;
    uint64_t key;
    int owner;
  } want[] = {
      {2, 0, 0ULL, 0},
      {2, 0, 1ULL, 1},
      {2, 0, 42ULL, 1},
      {2, 0, 3735928559ULL, 0},
      {2, 0, 18446744073709551615ULL, 1},
      {2, 0, 123456789012345ULL, 0},
      {2, 7, 0ULL, 0},
      {2, 7, 1ULL, 0},
      {2, 7, 42ULL, 1},
      {2, 7, 3735928559ULL, 0},
      {2, 7, 18446744073709551615ULL, 0},
      {2, 7, 123456789012345ULL, 1},
      {5, 0, 0ULL, 2},
      {5, 0, 1ULL, 2},
      {5, 0, 42ULL, 1},
      {5, 0, 3735928559ULL, 2},
      {5, 0, 18446744073709551615ULL, 1},
      {5, 0, 123456789012345ULL, 0},
      {5, 7, 0ULL, 4},
      {5, 7, 1ULL, 2},
      {5, 7, 42ULL, 1},
      {5, 7, 3735928559ULL, 2},
      {5, 7, 18446744073709551615ULL, 0},
      {5, 7, 123456789012345ULL, 2},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    ps_hashring r;
    assert_int_equal(ps_hashring_init(&r, want[i].nshards, PS_HASHRING_VNODES), 0);
    int got = ps_hashring_owner(&r, want[i].table, want[i].key);
    if (got != want[i].owner)
      fail_msg("%d shards, table %u, key %llu: owner %d, expected %d", want[i].nshards,
               want[i].table, (unsigned long long)want[i].key, got, want[i].owner);
    ps_hashring_free(&r);
  }
}

static void test_bad_sizes(void **state) {
  (void)state;
  ps_hashring r;
  assert_int_equal(ps_hashring_init(&r, 0, 8), -EINVAL);
  assert_int_equal(ps_hashring_init(&r, 65536, 8), -EINVAL);
  assert_int_equal(ps_hashring_init(&r, 2, 0), -EINVAL);
  assert_null(r.point);
  ps_hashring_free(&r);
  ps_hashring_free(NULL);
}

/* One shard owns everything; the owner is always in range. */
static void test_range(void **state) {
  (void)state;
  ps_hashring one, five;
  assert_int_equal(ps_hashring_init(&one, 1, 4), 0);
  assert_int_equal(ps_hashring_init(&five, 5, 16), 0);
  ps_rng g;
  ps_rng_seed(&g, 7);
  for (int i = 0; i < 100000; i++) {
    uint64_t k = ps_rng_next(&g);
    assert_int_equal(ps_hashring_owner(&one, 3, k), 0);
    int o = ps_hashring_owner(&five, 3, k);
    assert_true(o >= 0 && o < 5);
  }
  /* The wrap: a key past the last point belongs to the first point's owner. */
  assert_int_equal(ps_hashring_owner(&five, 0, 0), ps_hashring_owner(&five, 0, 0));
  ps_hashring_free(&one);
  ps_hashring_free(&five);
}

/* Uniform keys: the busiest shard within 1.1 x the mean, for 2 to 8 shards. */
static void test_balance_uniform(void **state) {
  (void)state;
  enum { KEYS = 400000 };
  for (int n = 2; n <= 8; n++) {
    ps_hashring r;
    assert_int_equal(ps_hashring_init(&r, n, PS_HASHRING_VNODES), 0);
    long count[8] = {0};
    ps_rng g;
    ps_rng_seed(&g, (uint64_t)n);
    for (int i = 0; i < KEYS; i++)
      count[ps_hashring_owner(&r, 1, ps_rng_next(&g))]++;
    long max = 0;
    for (int s = 0; s < n; s++)
      max = count[s] > max ? count[s] : max;
    double ratio = (double)max / ((double)KEYS / n);
    print_message("%d shards: busiest / mean = %.3f\n", n, ratio);
    assert_true(ratio <= 1.1);
    ps_hashring_free(&r);
  }
}

/* From N to N + 1 shards about 1/(N + 1) of the keys move, and each one
 * that moves goes to the new shard. */
static void test_growth_moves_few(void **state) {
  (void)state;
  enum { KEYS = 200000 };
  for (int n = 2; n <= 6; n++) {
    ps_hashring a, b;
    assert_int_equal(ps_hashring_init(&a, n, PS_HASHRING_VNODES), 0);
    assert_int_equal(ps_hashring_init(&b, n + 1, PS_HASHRING_VNODES), 0);
    long moved = 0;
    ps_rng g;
    ps_rng_seed(&g, 99);
    for (int i = 0; i < KEYS; i++) {
      uint64_t k = ps_rng_next(&g);
      int oa = ps_hashring_owner(&a, 2, k), ob = ps_hashring_owner(&b, 2, k);
      if (oa != ob) {
        assert_int_equal(ob, n);
        moved++;
      }
    }
    double frac = (double)moved / KEYS, ideal = 1.0 / (n + 1);
    print_message("%d -> %d shards: %.4f of the keys moved (ideal %.4f)\n", n, n + 1, frac, ideal);
    assert_true(fabs(frac - ideal) <= 0.1 * ideal);
    ps_hashring_free(&a);
    ps_hashring_free(&b);
  }
}

/* A Zipf stream (alpha 1.1 over 100000 ids, 26 tables as a CTR model's
 * fields): the busiest of 2 and 4 shards within 1.1 x the mean load. */
static void test_balance_zipf(void **state) {
  (void)state;
  enum { IDS = 100000, TABLES = 26, DRAWS = 20000 };
  double *cdf = malloc(IDS * sizeof *cdf), sum = 0;
  assert_non_null(cdf);
  for (int i = 0; i < IDS; i++)
    cdf[i] = (sum += pow(i + 1, -1.1));
  for (int n = 2; n <= 4; n += 2) {
    ps_hashring r;
    assert_int_equal(ps_hashring_init(&r, n, PS_HASHRING_VNODES), 0);
    long count[4] = {0};
    ps_rng g;
    ps_rng_seed(&g, 5);
    for (uint32_t t = 0; t < TABLES; t++)
      for (int d = 0; d < DRAWS; d++) {
        double u = ps_rng_uniform(&g) * sum;
        size_t lo = 0, hi = IDS - 1;
        while (lo < hi) {
          size_t mid = (lo + hi) / 2;
          if (cdf[mid] < u)
            lo = mid + 1;
          else
            hi = mid;
        }
        count[ps_hashring_owner(&r, t, (uint64_t)lo * 2654435761u)]++;
      }
    long max = 0;
    for (int s = 0; s < n; s++)
      max = count[s] > max ? count[s] : max;
    double ratio = (double)max / ((double)TABLES * DRAWS / n);
    print_message("zipf, %d shards: busiest / mean = %.3f\n", n, ratio);
    assert_true(ratio <= 1.1);
    ps_hashring_free(&r);
  }
  free(cdf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixed_owners),    cmocka_unit_test(test_bad_sizes),
      cmocka_unit_test(test_range),           cmocka_unit_test(test_balance_uniform),
      cmocka_unit_test(test_growth_moves_few), cmocka_unit_test(test_balance_zipf),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
