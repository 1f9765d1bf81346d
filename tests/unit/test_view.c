/* The ring's view as Redis holds it (src/ring/view.h): what parses, and
 * what is refused rather than trusted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ring/view.h"

static void test_good(void **state) {
  (void)state;
  ps_view v;
  assert_int_equal(ps_view_parse("7 0,2,5", 6, &v), 0);
  assert_true(v.epoch == 7);
  assert_int_equal(v.n, 3);
  assert_int_equal(v.members[0], 0);
  assert_int_equal(v.members[2], 5);
  assert_true(ps_view_has(&v, 2));
  assert_false(ps_view_has(&v, 1));
  assert_int_equal(ps_view_parse("1 3", 4, &v), 0);
  assert_int_equal(v.n, 1);
  char buf[64];
  assert_string_equal(ps_view_format(&v, buf, sizeof buf), "1: 3");
}

static void test_refused(void **state) {
  (void)state;
  static const char *const bad[] = {
      "",            /* empty */
      "7",           /* no members */
      "7 ",          /* no members */
      "0 1,2",       /* epoch 0 */
      "x 1",         /* not a number */
      "7 1,,2",      /* empty member */
      "7 2,1",       /* not ascending */
      "7 1,1",       /* twice */
      "7 1,6",       /* a worker the config does not have */
      "7 -1",        /* negative */
      "7 1,2,",      /* trailing comma */
      "7 1 2",       /* not a comma */
      "7  1",        /* two spaces */
      "18446744073709551616 1", /* past 64 bits: strtoull saturates, and that is refused too */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ps_view v;
    memset(&v, 0x55, sizeof v);
    if (ps_view_parse(bad[i], 6, &v) != -1)
      fail_msg("\"%s\" parsed as a view", bad[i]);
    assert_int_equal(v.n, 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
