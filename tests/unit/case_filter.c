/* One case of a cmocka binary by name: CMOCKA_TEST_FILTER=PATTERN runs only
 * the cases whose names match PATTERN, a shell pattern (fnmatch: '*', '?',
 * '[...]'), and CMOCKA_SKIP_FILTER=PATTERN leaves those that match out (the
 * variables of cmocka's later releases; Debian 12's cmocka 1.1.5 reads
 * neither).
 *
 *   CMOCKA_TEST_FILTER=test_roundtrip_none build/tests/test_checkpoint
 *   make test T=test_checkpoint CASE='test_roundtrip_*'
 *
 * Linked into every unit and GPU test with -Wl,--wrap=_cmocka_run_group_tests
 * (the Makefile), so that no test's main knows of it.  A filter that
 * matches no case of the binary fails it, naming its cases: a misspelt
 * name does not pass as zero tests run. */
#include <fnmatch.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

int __real__cmocka_run_group_tests(const char *group_name, const struct CMUnitTest *const tests,
                                   const size_t num_tests, CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown);
int __wrap__cmocka_run_group_tests(const char *group_name, const struct CMUnitTest *const tests,
                                   const size_t num_tests, CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown);

static const char *filter(const char *name) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

static int kept(const char *name, const char *only, const char *skip) {
  return (only == NULL || fnmatch(only, name, 0) == 0) &&
         (skip == NULL || fnmatch(skip, name, 0) != 0);
}

int __wrap__cmocka_run_group_tests(const char *group_name, const struct CMUnitTest *const tests,
                                   const size_t num_tests, CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown) {
  const char *only = filter("CMOCKA_TEST_FILTER"), *skip = filter("CMOCKA_SKIP_FILTER");
  if (only == NULL && skip == NULL)
    return __real__cmocka_run_group_tests(group_name, tests, num_tests, group_setup,
                                          group_teardown);
  struct CMUnitTest *run = malloc((num_tests ? num_tests : 1) * sizeof *run);
  if (run == NULL)
    return 1;
  size_t n = 0;
  for (size_t i = 0; i < num_tests; i++)
    if (kept(tests[i].name, only, skip))
      run[n++] = tests[i];
  int rc = 1;
  if (n == 0) {
    fprintf(stderr, "CMOCKA_TEST_FILTER='%s' CMOCKA_SKIP_FILTER='%s' leave none of the cases:\n",
            only ? only : "", skip ? skip : "");
    for (size_t i = 0; i < num_tests; i++)
      fprintf(stderr, "  %s\n", tests[i].name);
  } else {
    /* The group's fixtures still run once, around the cases kept. */
    rc = __real__cmocka_run_group_tests(group_name, run, n, group_setup, group_teardown);
  }
  free(run);
  return rc;
}
