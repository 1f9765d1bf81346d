/* Tests of the metrics registry: the Prometheus text it formats. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/metrics.h"

static void test_off(void **state) {
  (void)state;
  ps_config c;
  ps_config_defaults(&c);
  ps_metrics *m = ps_metrics_new(&c, "worker", 0);
  assert_null(m);
  /* Every call accepts the NULL of metrics off. */
  static const ps_metric_def defs[] = {
      {.kind = PS_METRIC_COUNTER, .name = "paramserv_worker_steps_total", .help = "s"}};
  ps_metric *x;
  ps_metrics_register(m, defs, 1, &x);
  assert_null(x);
  ps_metric_set(x, 1);
  ps_metric_add(x, 1);
  ps_metric_observe(x, 1);
  assert_null(ps_metrics_format(m));
  assert_int_equal(ps_metrics_serve(m, NULL), 0);
  ps_metrics_free(m);
}

static void test_format(void **state) {
  (void)state;
  ps_config c;
  ps_config_defaults(&c);
  assert_int_equal(ps_addr_parse("127.0.0.1:9400", &c.metrics_listen), 0);
  ps_metrics *m = ps_metrics_new(&c, "ps", 1);
  assert_non_null(m);
  static const double bounds[] = {0, 1, 4};
  static const ps_metric_def defs[] = {
      {.kind = PS_METRIC_COUNTER, .name = "paramserv_ps_pushes_applied_total",
       .help = "pushes applied"},
      {.kind = PS_METRIC_GAUGE, .name = "paramserv_ps_restore_seconds", .help = "last restore"},
      {PS_METRIC_HISTOGRAM, "paramserv_ps_staleness", "staleness", bounds, 3},
  };
  ps_metric *x[3];
  ps_metrics_register(m, defs, 3, x);
  ps_metric *n = x[0], *g = x[1], *h = x[2];
  ps_metric_set(n, 41);
  ps_metric_add(n, 1);
  ps_metric_set(g, 0.25);
  ps_metric_observe(h, 0);
  ps_metric_observe(h, 3);
  ps_metric_observe(h, 9);
  char *t = ps_metrics_format(m);
  assert_non_null(t);
  static const char *const want[] = {
      "# HELP paramserv_ps_pushes_applied_total pushes applied\n"
      "# TYPE paramserv_ps_pushes_applied_total counter\n"
      "paramserv_ps_pushes_applied_total{role=\"ps\",index=\"1\"} 42\n",
      "# TYPE paramserv_ps_restore_seconds gauge\n"
      "paramserv_ps_restore_seconds{role=\"ps\",index=\"1\"} 0.25\n",
      "# TYPE paramserv_ps_staleness histogram\n"
      "paramserv_ps_staleness_bucket{role=\"ps\",index=\"1\",le=\"0\"} 1\n"
      "paramserv_ps_staleness_bucket{role=\"ps\",index=\"1\",le=\"1\"} 1\n"
      "paramserv_ps_staleness_bucket{role=\"ps\",index=\"1\",le=\"4\"} 2\n"
      "paramserv_ps_staleness_bucket{role=\"ps\",index=\"1\",le=\"+Inf\"} 3\n"
      "paramserv_ps_staleness_sum{role=\"ps\",index=\"1\"} 12\n"
      "paramserv_ps_staleness_count{role=\"ps\",index=\"1\"} 3\n",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (strstr(t, want[i]) == NULL)
      fail_msg("missing:\n%s\nin:\n%s", want[i], t);
  free(t);
  ps_metrics_free(m);
}

/* A family: one HELP and TYPE, a series per label value with the
 * process's labels and its own, values escaped; a histogram family and
 * metrics off give NULL children. */
static void test_family(void **state) {
  (void)state;
  ps_config c;
  ps_config_defaults(&c);
  assert_int_equal(ps_addr_parse("127.0.0.1:9400", &c.metrics_listen), 0);
  ps_metrics *m = ps_metrics_new(&c, "ps", 0);
  assert_non_null(m);
  static const double bounds[] = {1};
  static const ps_metric_def defs[] = {
      {.kind = PS_METRIC_GAUGE, .name = "paramserv_ps_table_rows", .help = "rows"},
      {.kind = PS_METRIC_COUNTER, .name = "paramserv_ps_table_admitted_total", .help = "adm"},
      {PS_METRIC_HISTOGRAM, "paramserv_ps_table_hist", "h", bounds, 1},
  };
  char named[8];
  snprintf(named, sizeof named, "C7");  /* values are copied */
  const char *values[3] = {named, "C8", "a\"b\\c\nd"};
  ps_metric *rows[3], *adm[3], *hist[3];
  ps_metrics_register_family(m, &defs[0], "table", values, 3, rows);
  ps_metrics_register_family(m, &defs[1], "table", values, 2, adm);
  ps_metrics_register_family(m, &defs[2], "table", values, 1, hist);
  named[0] = 'X';
  assert_null(hist[0]);
  for (int i = 0; i < 3; i++)
    assert_non_null(rows[i]);
  ps_metric_set(rows[0], 120);
  ps_metric_set(rows[1], 7);
  ps_metric_set(rows[2], 1);
  ps_metric_add(adm[1], 3);
  char *t = ps_metrics_format(m);
  assert_non_null(t);
  static const char *const want =
      "# HELP paramserv_ps_table_rows rows\n"
      "# TYPE paramserv_ps_table_rows gauge\n"
      "paramserv_ps_table_rows{role=\"ps\",index=\"0\",table=\"C7\"} 120\n"
      "paramserv_ps_table_rows{role=\"ps\",index=\"0\",table=\"C8\"} 7\n"
      "paramserv_ps_table_rows{role=\"ps\",index=\"0\",table=\"a\\\"b\\\\c\\nd\"} 1\n"
      "# HELP paramserv_ps_table_admitted_total adm\n"
      "# TYPE paramserv_ps_table_admitted_total counter\n"
      "paramserv_ps_table_admitted_total{role=\"ps\",index=\"0\",table=\"C7\"} 0\n"
      "paramserv_ps_table_admitted_total{role=\"ps\",index=\"0\",table=\"C8\"} 3\n";
  if (strcmp(t, want) != 0)
    fail_msg("got:\n%s\nexpected:\n%s", t, want);
  free(t);
  ps_metrics_free(m);
  /* Metrics off: every child NULL, and setting them does nothing. */
  ps_metrics_register_family(NULL, &defs[0], "table", values, 2, rows);
  assert_null(rows[0]);
  assert_null(rows[1]);
  ps_metric_set(rows[0], 1);
}

/* NaN and the infinities in Prometheus's spelling (NaN, +Inf, -Inf): C's
 * printf would write nan, inf and -inf, which Prometheus's parser refuses
 * (the whole scrape fails).  A gauge, a counter and a histogram's sum. */
static void test_nonfinite(void **state) {
  (void)state;
  ps_config c;
  ps_config_defaults(&c);
  assert_int_equal(ps_addr_parse("127.0.0.1:9400", &c.metrics_listen), 0);
  ps_metrics *m = ps_metrics_new(&c, "chief", 0);
  assert_non_null(m);
  static const double bounds[] = {1};
  static const ps_metric_def defs[] = {
      {.kind = PS_METRIC_GAUGE, .name = "paramserv_chief_loss", .help = "a"},
      {.kind = PS_METRIC_GAUGE, .name = "paramserv_chief_up_bound", .help = "b"},
      {.kind = PS_METRIC_GAUGE, .name = "paramserv_chief_down_bound", .help = "c"},
      {.kind = PS_METRIC_COUNTER, .name = "paramserv_chief_big_total", .help = "d"},
      {.kind = PS_METRIC_GAUGE, .name = "paramserv_chief_finite_max", .help = "e"},
      {PS_METRIC_HISTOGRAM, "paramserv_chief_up_hist", "f", bounds, 1},
      {PS_METRIC_HISTOGRAM, "paramserv_chief_nan_hist", "g", bounds, 1},
  };
  enum { N = sizeof defs / sizeof defs[0] };
  ps_metric *x[N];
  ps_metrics_register(m, defs, N, x);
  ps_metric_set(x[0], NAN);
  ps_metric_set(x[1], INFINITY);
  ps_metric_set(x[2], -INFINITY);
  ps_metric_set(x[3], 1);
  ps_metric_add(x[3], INFINITY);  /* a count that overflowed to +Inf */
  ps_metric_set(x[4], DBL_MAX);   /* finite: digits, not +Inf */
  ps_metric_observe(x[5], 0.5);
  ps_metric_observe(x[5], INFINITY);
  ps_metric_observe(x[6], INFINITY);
  ps_metric_observe(x[6], -INFINITY); /* +Inf + -Inf: the sum is NaN */
  char *t = ps_metrics_format(m);
  assert_non_null(t);
  static const char *const want[] = {
      "\nparamserv_chief_loss{role=\"chief\",index=\"0\"} NaN\n",
      "\nparamserv_chief_up_bound{role=\"chief\",index=\"0\"} +Inf\n",
      "\nparamserv_chief_down_bound{role=\"chief\",index=\"0\"} -Inf\n",
      "\nparamserv_chief_big_total{role=\"chief\",index=\"0\"} +Inf\n",
      "\nparamserv_chief_finite_max{role=\"chief\",index=\"0\"} 1.7976931348623157e+308\n",
      "\nparamserv_chief_up_hist_bucket{role=\"chief\",index=\"0\",le=\"1\"} 1\n"
      "paramserv_chief_up_hist_bucket{role=\"chief\",index=\"0\",le=\"+Inf\"} 2\n"
      "paramserv_chief_up_hist_sum{role=\"chief\",index=\"0\"} +Inf\n"
      "paramserv_chief_up_hist_count{role=\"chief\",index=\"0\"} 2\n",
      "\nparamserv_chief_nan_hist_sum{role=\"chief\",index=\"0\"} NaN\n"
      "paramserv_chief_nan_hist_count{role=\"chief\",index=\"0\"} 2\n",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (strstr(t, want[i]) == NULL)
      fail_msg("missing:\n%s\nin:\n%s", want[i], t);
  /* No value in C's spelling anywhere (the help strings hold none). */
  static const char *const c_spelling[] = {" nan\n", " inf\n", " -inf\n", " -nan\n"};
  for (size_t i = 0; i < sizeof c_spelling / sizeof c_spelling[0]; i++)
    if (strstr(t, c_spelling[i]) != NULL)
      fail_msg("a value in C's spelling '%s' in:\n%s", c_spelling[i] + 1, t);
  free(t);
  ps_metrics_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_off),
      cmocka_unit_test(test_format),
      cmocka_unit_test(test_family),
      cmocka_unit_test(test_nonfinite),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
