/* Tests of the per-worker sample order: coverage, reshuffling, determinism and seek. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "data/sampler.h"

/* Pulls exactly `count` indices in uneven chunks (1, 2, 3, ... 7, 1, ...),
 * so that chunk ends fall anywhere relative to epoch ends. */
static void pull(ps_sampler *s, size_t *out, size_t count) {
  size_t got = 0, chunk = 1;
  while (got < count) {
    size_t want = chunk < count - got ? chunk : count - got;
    size_t n = ps_sampler_next(s, out + got, want);
    assert_true(n >= 1 && n <= want);
    got += n;
    chunk = chunk % 7 + 1;
  }
}

/* Within one epoch, the M workers' parts are disjoint and cover [0, n); their
 * sizes differ by at most one; and together, in worker order, they are the
 * permutation a single worker would see. */
static void check_partition(size_t n, int m, uint64_t seed) {
  int *seen = calloc(n, sizeof *seen);
  size_t *all = malloc(n * sizeof *all), *solo = malloc(n * sizeof *solo);
  assert_true(seen && all && solo);
  size_t at = 0, lo = n, hi = 0;
  for (int j = 0; j < m; j++) {
    ps_sampler s;
    assert_int_equal(ps_sampler_init(&s, n, j, m, seed), 0);
    size_t part = ps_sampler_part_size(&s);
    lo = part < lo ? part : lo;
    hi = part > hi ? part : hi;
    assert_true(at + part <= n);
    pull(&s, all + at, part);
    assert_int_equal(s.pos.epoch, 0);
    assert_int_equal(s.pos.offset, part);
    for (size_t i = 0; i < part; i++) {
      assert_true(all[at + i] < n);
      seen[all[at + i]]++;
    }
    at += part;
    ps_sampler_close(&s);
  }
  assert_int_equal(at, n);
  assert_true(hi - lo <= 1);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(seen[i], 1);

  ps_sampler s;
  assert_int_equal(ps_sampler_init(&s, n, 0, 1, seed), 0);
  pull(&s, solo, n);
  assert_memory_equal(all, solo, n * sizeof *solo);
  ps_sampler_close(&s);
  free(seen);
  free(all);
  free(solo);
}

static void test_partition(void **state) {
  (void)state;
  check_partition(20, 4, 1);     /* divisible */
  check_partition(23, 4, 2);     /* not divisible */
  check_partition(1000, 7, 3);   /* not divisible */
  check_partition(7, 7, 4);      /* one sample each */
  check_partition(5, 1, 5);      /* a single worker */
  check_partition(60000, 3, 6);  /* the real training set's size */
}

static int is_permutation(const size_t *v, size_t n) {
  int ok = 1;
  char *seen = calloc(n, 1);
  for (size_t i = 0; i < n && ok; i++) {
    ok = v[i] < n && !seen[v[i]];
    if (ok)
      seen[v[i]] = 1;
  }
  free(seen);
  return ok;
}

static void test_reshuffle_each_epoch(void **state) {
  (void)state;
  enum { N = 100 };
  size_t e[3][N];
  ps_sampler s;
  assert_int_equal(ps_sampler_init(&s, N, 0, 1, 42), 0);
  for (int k = 0; k < 3; k++) {
    pull(&s, e[k], N);
    assert_int_equal(s.pos.epoch, (uint64_t)k);
    assert_true(is_permutation(e[k], N));
  }
  assert_memory_not_equal(e[0], e[1], sizeof e[0]);
  assert_memory_not_equal(e[1], e[2], sizeof e[0]);
  /* Shuffled at all: not the identity. */
  size_t fixed = 0;
  for (size_t i = 0; i < N; i++)
    fixed += e[0][i] == i;
  assert_true(fixed < N / 4);
  ps_sampler_close(&s);
}

static void test_deterministic(void **state) {
  (void)state;
  enum { N = 50, TOTAL = 3 * 17 };
  size_t a[TOTAL], b[TOTAL], c[TOTAL];
  ps_sampler s1, s2, s3;
  assert_int_equal(ps_sampler_init(&s1, N, 1, 3, 7), 0);
  assert_int_equal(ps_sampler_init(&s2, N, 1, 3, 7), 0);
  assert_int_equal(ps_sampler_init(&s3, N, 1, 3, 8), 0);
  pull(&s1, a, TOTAL);
  pull(&s2, b, TOTAL);
  pull(&s3, c, TOTAL);
  assert_memory_equal(a, b, sizeof a);
  assert_memory_not_equal(a, c, sizeof a);
  ps_sampler_close(&s1);
  ps_sampler_close(&s2);
  ps_sampler_close(&s3);
}

static void test_epoch_rollover(void **state) {
  (void)state;
  size_t out[8];
  ps_sampler s;
  assert_int_equal(ps_sampler_init(&s, 40, 2, 4, 9), 0);
  assert_int_equal(ps_sampler_part_size(&s), 10);
  assert_int_equal(ps_sampler_next(&s, out, 7), 7);
  /* Only the 3 left in the epoch, and the epoch stays until the next call. */
  assert_int_equal(ps_sampler_next(&s, out, 7), 3);
  assert_int_equal(s.pos.epoch, 0);
  assert_int_equal(s.pos.offset, 10);
  assert_int_equal(ps_sampler_next(&s, out, 0), 0);
  assert_int_equal(s.pos.epoch, 0);
  assert_int_equal(ps_sampler_next(&s, out, 8), 8);
  assert_int_equal(s.pos.epoch, 1);
  assert_int_equal(s.pos.offset, 8);
  ps_sampler_close(&s);
}

/* A sampler restored from a saved position hands out exactly what the
 * original went on to hand out, across an epoch boundary too. */
static void check_seek(ps_data_pos after_pull, size_t pulled) {
  enum { N = 97, M = 4, W = 3, MORE = 80 };
  size_t *skip = malloc(pulled * sizeof *skip + 1);
  size_t a[MORE], b[MORE];
  ps_sampler s, r;
  assert_int_equal(ps_sampler_init(&s, N, W, M, 123), 0);
  pull(&s, skip, pulled);
  assert_int_equal(s.pos.epoch, after_pull.epoch);
  assert_int_equal(s.pos.offset, after_pull.offset);
  ps_data_pos saved = s.pos;
  pull(&s, a, MORE);

  assert_int_equal(ps_sampler_init(&r, N, W, M, 123), 0);
  assert_int_equal(ps_sampler_seek(&r, saved), 0);
  assert_int_equal(r.pos.epoch, saved.epoch);
  assert_int_equal(r.pos.offset, saved.offset);
  pull(&r, b, MORE);
  assert_memory_equal(a, b, sizeof a);
  assert_int_equal(r.pos.epoch, s.pos.epoch);
  assert_int_equal(r.pos.offset, s.pos.offset);

  /* Seeking the original itself back replays the same continuation. */
  assert_int_equal(ps_sampler_seek(&s, saved), 0);
  pull(&s, b, MORE);
  assert_memory_equal(a, b, sizeof a);
  ps_sampler_close(&s);
  ps_sampler_close(&r);
  free(skip);
}

static void test_seek(void **state) {
  (void)state;
  /* Worker 3 of 4 over 97 samples has a part of 25. */
  check_seek((ps_data_pos){0, 10}, 10);  /* mid-epoch 0 */
  check_seek((ps_data_pos){2, 5}, 55);   /* mid-epoch 2 */
  check_seek((ps_data_pos){1, 25}, 50);  /* at the very end of epoch 1 */
  check_seek((ps_data_pos){0, 0}, 0);    /* the start */
}

static void test_bad_arguments(void **state) {
  (void)state;
  ps_sampler s;
  assert_int_equal(ps_sampler_init(&s, 10, 0, 0, 1), -EINVAL);
  assert_null(s.perm);
  ps_sampler_close(&s); /* a failed init leaves nothing to free */
  assert_int_equal(ps_sampler_init(&s, 10, -1, 2, 1), -EINVAL);
  assert_int_equal(ps_sampler_init(&s, 10, 2, 2, 1), -EINVAL);
  assert_int_equal(ps_sampler_init(&s, 3, 0, 4, 1), -EINVAL);
  assert_int_equal(ps_sampler_init(&s, 0, 0, 1, 1), -EINVAL);
  ps_sampler_close(NULL);

  assert_int_equal(ps_sampler_init(&s, 10, 1, 2, 1), 0);
  assert_int_equal(ps_sampler_seek(&s, (ps_data_pos){3, 6}), -EINVAL);
  /* A refused seek leaves the position alone. */
  assert_int_equal(s.pos.epoch, 0);
  assert_int_equal(s.pos.offset, 0);
  assert_int_equal(ps_sampler_seek(&s, (ps_data_pos){3, 5}), 0);
  ps_sampler_close(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_partition),
      cmocka_unit_test(test_reshuffle_each_epoch),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_epoch_rollover),
      cmocka_unit_test(test_seek),
      cmocka_unit_test(test_bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
