/* Built-in models: their variable tables, whole-model gradients against
 * finite differences, and thread-count independence of the computation. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gradcheck.h"

#include "common/parse.h"
#include "common/rng.h"
#include "nn/compute.h"
#include "nn/model.h"

static void test_cnn_table(void **state) {
  (void)state;
  ps_model m;
  gradcheck_build("cnn", NULL, &m);
  const struct { const char *name; size_t count; } want[] = {
      {"conv1.weight", 32 * 1 * 3 * 3}, {"conv1.bias", 32},
      {"conv2.weight", 64 * 32 * 3 * 3}, {"conv2.bias", 64},
      {"fc1.weight", 128 * 9216}, {"fc1.bias", 128},
      {"fc2.weight", 20 * 128}, {"fc2.bias", 20},
      {"fc3.weight", 10 * 20}, {"fc3.bias", 10},
  };
  assert_int_equal(m.vars.n, 10);
  size_t off = 0;
  for (int i = 0; i < 10; i++) {
    assert_string_equal(m.vars.vars[i].name, want[i].name);
    assert_int_equal(m.vars.vars[i].count, want[i].count);
    assert_int_equal(m.vars.vars[i].offset, off);
    off += want[i].count;
  }
  assert_int_equal(m.vars.total, 1201382);
  assert_int_equal(m.layers[m.nlayers - 1].out_size, 10);
  char buf[64];
  assert_string_equal(ps_model_spec_format(&m.spec, buf, sizeof buf), "cnn 1x28x28-10");
  ps_model_close(&m);
}

static void test_mlp_spec(void **state) {
  (void)state;
  ps_model m;
  gradcheck_build("mlp", NULL, &m);
  char buf[64];
  assert_string_equal(ps_model_spec_format(&m.spec, buf, sizeof buf), "mlp 784-256-128-10");
  assert_int_equal(m.vars.total, 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  ps_model_close(&m);
  ps_model_spec spec;
  ps_errbuf eb = {0};
  const char *bad[] = {"", "12,", "a", "0", "1,,2", "99999999", "1,2,3,4,5,6,7,8,9"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(ps_model_spec_parse("mlp", bad[i], &spec, &eb), PS_EUSAGE);
    assert_non_null(strstr(eb.msg, "hidden sizes"));
  }
  assert_int_equal(ps_model_spec_parse("resnet", NULL, &spec, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "resnet"));
}

/* Initial values depend on (seed, name, element) only: any slice of a
 * variable computed alone equals the same slice of the whole arena. */
static void test_init_slices(void **state) {
  (void)state;
  ps_model m;
  gradcheck_build("cnn", NULL, &m);
  float *a = malloc(m.vars.total * sizeof *a), *b = malloc(m.vars.total * sizeof *b);
  ps_vartable_init_arena(&m.vars, 5, a);
  ps_vartable_init_arena(&m.vars, 5, b);
  assert_memory_equal(a, b, m.vars.total * sizeof *a);
  int v = ps_vartable_find(&m.vars, "fc1.weight");
  float part[1000];
  ps_vartable_init_values(&m.vars, v, 5, 123456, 1000, part);
  assert_memory_equal(part, a + m.vars.vars[v].offset + 123456, sizeof part);
  /* Bounds: PyTorch's +-1/sqrt(fan_in). */
  float bound = 1.0f / sqrtf(9216.0f);
  for (size_t i = 0; i < m.vars.vars[v].count; i++)
    assert_true(fabsf(a[m.vars.vars[v].offset + i]) <= bound);
  ps_vartable_init_arena(&m.vars, 6, b);
  assert_memory_not_equal(a, b, m.vars.total * sizeof *a);
  free(a);
  free(b);
  ps_model_close(&m);
}

static void test_mlp_gradcheck(void **state) {
  (void)state;
  gradcheck_params("mlp", "16,8", PS_DEVICE_CPU, 300, 1e-3f);
}

static void test_cnn_directional(void **state) {
  (void)state;
  gradcheck_directional("cnn", PS_DEVICE_CPU);
}

/* The gradient does not depend on how the batch is split among threads
 * (up to float summation order), nor does the loss. */
static void test_compute_threads(void **state) {
  (void)state;
  ps_model m;
  gradcheck_build("cnn", NULL, &m);
  enum { N = 7 };
  size_t total = m.vars.total;
  float *params = malloc(total * sizeof *params);
  float *g1 = malloc(total * sizeof *g1), *g3 = malloc(total * sizeof *g3);
  float *x = malloc(N * m.in_size * sizeof *x);
  uint8_t y[N] = {0, 1, 2, 3, 4, 5, 6};
  ps_vartable_init_arena(&m.vars, 1, params);
  ps_rng r;
  ps_rng_seed(&r, 3);
  for (size_t i = 0; i < N * m.in_size; i++)
    x[i] = (float)ps_rng_uniform(&r);
  ps_errbuf eb = {0};
  ps_compute *c1 = ps_compute_new(&m, 1, N, &eb), *c3 = ps_compute_new(&m, 3, N, &eb);
  assert_non_null(c1);
  assert_non_null(c3);
  double l1 = ps_compute_grad(c1, params, x, y, N, 42, 1000, g1, NULL);
  double l3 = ps_compute_grad(c3, params, x, y, N, 42, 1000, g3, NULL);
  assert_true(fabs(l1 - l3) < 1e-5 * fabs(l1));
  for (size_t i = 0; i < total; i++)
    if (fabsf(g1[i] - g3[i]) > 1e-5f + 1e-3f * fabsf(g1[i]))
      fail_msg("grad[%zu]: 1 thread %g, 3 threads %g", i, g1[i], g3[i]);
  size_t right1 = 0, right3 = 0;
  double e1 = ps_compute_eval(c1, params, x, y, N, &right1);
  double e3 = ps_compute_eval(c3, params, x, y, N, &right3);
  assert_true(fabs(e1 - e3) < 1e-5 * fabs(e1));
  assert_int_equal(right1, right3);
  ps_compute_free(c1);
  ps_compute_free(c3);
  free(params);
  free(g1);
  free(g3);
  free(x);
  ps_model_close(&m);
}

/* ps_compute_train_* on the CPU is ps_compute_grad followed by
 * ps_optim_apply, bit for bit (what `paramserv train` ran before it kept
 * its parameters in the computation), with 1 and 2 threads and every
 * optimizer; an evaluation with params NULL reads the kept ones. */
static void test_compute_train(void **state) {
  (void)state;
  ps_model m;
  gradcheck_build("cnn", NULL, &m);
  enum { N = 6, STEPS = 3 };
  const char *names[] = {"sgd", "momentum", "nesterov", "adagrad", "adam"};
  size_t total = m.vars.total;
  float *init = malloc(total * sizeof *init), *w = malloc(total * sizeof *w);
  float *g = malloc(total * sizeof *g), *kept = malloc(total * sizeof *kept);
  float *slots[PS_OPTIM_MAX_SLOTS] = {malloc(total * sizeof(float)), malloc(total * sizeof(float))};
  float *x = malloc(STEPS * N * m.in_size * sizeof *x);
  uint8_t y[STEPS * N];
  ps_vartable_init_arena(&m.vars, 2, init);
  ps_rng r;
  ps_rng_seed(&r, 4);
  for (size_t i = 0; i < STEPS * N * m.in_size; i++)
    x[i] = (float)ps_rng_uniform(&r);
  for (int i = 0; i < STEPS * N; i++)
    y[i] = (uint8_t)ps_rng_below(&r, 10);
  for (int threads = 1; threads <= 2; threads++)
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
      ps_optim o = ps_optim_default(PS_OPTIM_SGD, 0.01f);
      assert_int_equal(ps_optim_parse(names[k], &o), 0);
      o.weight_decay = k % 2 ? 0.001f : 0.0f;
      ps_errbuf eb = {0};
      ps_compute *c = ps_compute_new(&m, threads, N, &eb);
      ps_compute *ref = ps_compute_new(&m, threads, N, &eb);
      assert_non_null(c);
      assert_non_null(ref);
      memcpy(w, init, total * sizeof *w);
      for (int i = 0; i < ps_optim_nslots(o.kind); i++)
        for (size_t j = 0; j < total; j++)
          slots[i][j] = ps_optim_slot_init(&o, i);
      assert_int_equal(ps_compute_train_init(c, init, &o), 0);
      for (int s = 0; s < STEPS; s++) {
        const float *xs = x + (size_t)s * N * m.in_size;
        float lr = 0.01f / (float)(s + 1);
        size_t right = 0, right_ref = 0;
        double loss = ps_compute_train_step(c, xs, y + s * N, N, 5, (uint64_t)s * N, lr,
                                            (uint64_t)s + 1, &right);
        double loss_ref = ps_compute_grad(ref, w, xs, y + s * N, N, 5, (uint64_t)s * N, g,
                                          &right_ref);
        ps_optim_apply(&o, lr, (uint64_t)s + 1, w, g, slots, total);
        assert_true(loss == loss_ref);
        assert_int_equal(right, right_ref);
      }
      ps_compute_train_params(c, kept);
      if (memcmp(kept, w, total * sizeof *w) != 0)
        fail_msg("%s, %d threads: the kept parameters differ from grad + ps_optim_apply's",
                 names[k], threads);
      size_t r1 = 0, r2 = 0;
      double e1 = ps_compute_eval(c, NULL, x, y, STEPS * N, &r1);
      double e2 = ps_compute_eval(ref, w, x, y, STEPS * N, &r2);
      assert_true(e1 == e2);
      assert_int_equal(r1, r2);
      ps_compute_free(c);
      ps_compute_free(ref);
    }
  free(init);
  free(w);
  free(g);
  free(kept);
  free(slots[0]);
  free(slots[1]);
  free(x);
  ps_model_close(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cnn_table),
      cmocka_unit_test(test_mlp_spec),
      cmocka_unit_test(test_init_slices),
      cmocka_unit_test(test_mlp_gradcheck),
      cmocka_unit_test(test_cnn_directional),
      cmocka_unit_test(test_compute_threads),
      cmocka_unit_test(test_compute_train),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
