/* What a process holds in memory (src/common/procmem.c): VmRSS and VmHWM
 * read, the heap's figures, and ps_procmem_trim giving memory freed in the
 * middle of the heap back to the kernel (RSS falls), and doing nothing
 * when there is little free.  Under ASan the C library's heap is not the
 * one in use (ASan's allocator serves malloc): there the trim finds
 * nothing of its own to give back, and that is what is checked. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/procmem.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static void test_reads_rss(void **state) {
  (void)state;
  long rss = -1, hwm = -1;
  assert_int_equal(ps_procmem_kb(&rss, &hwm), 0);
  assert_true(rss > 0);
  assert_true(hwm >= rss);
}

enum { PIECE = 64 << 10, PIECES = 1024 };  /* 64 MiB in pieces below the mmap threshold */

/* 64 MiB in 64 KiB pieces from the heap, touched, then every piece freed
 * but the last (so the heap's top is in use and free() cannot shrink it):
 * the free memory is resident until ps_procmem_trim gives it back. */
static void test_trim_gives_back(void **state) {
  (void)state;
  if (UNDER_ASAN) {
    assert_int_equal(ps_procmem_trim(), 0);
    return;
  }
  char **p = malloc(PIECES * sizeof *p);
  assert_non_null(p);
  for (int i = 0; i < PIECES; i++) {
    p[i] = malloc(PIECE);
    assert_non_null(p[i]);
    memset(p[i], 1 + i % 200, PIECE);
  }
  for (int i = 0; i < PIECES - 1; i++)
    free(p[i]);
  long used = 0, freed = 0, before = 0, after = 0;
  ps_procmem_heap_kb(&used, &freed);
  assert_true(freed >= 60 << 10);  /* the 63 MiB freed are held */
  assert_int_equal(ps_procmem_kb(&before, NULL), 0);
  assert_int_equal(ps_procmem_trim(), 1);
  assert_int_equal(ps_procmem_kb(&after, NULL), 0);
  if (before - after < 48 << 10)
    fail_msg("RSS %ld kB before the trim, %ld kB after: expected at least 48 MiB less", before,
             after);
  free(p[PIECES - 1]);
  free(p);
}

/* Little free memory: nothing to do. */
static void test_trim_skips_little(void **state) {
  (void)state;
  if (UNDER_ASAN)
    return;
  ps_procmem_trim();  /* whatever the earlier case left */
  void *q = malloc(PIECE);
  assert_non_null(q);
  free(q);
  assert_int_equal(ps_procmem_trim(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reads_rss),
      cmocka_unit_test(test_trim_gives_back),
      cmocka_unit_test(test_trim_skips_little),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
