/* Unit tests for the optimizers and learning-rate schedules, against values worked out by hand. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "optim/optim.h"
#include "paramserv/error.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

/* Relative 1e-6: float arithmetic over three steps stays within a few ulps
 * (1.2e-7 each) of the exact value.  An expected 0 must come out as 0. */
static void check_near(double got, double want, const char *what, int idx) {
  double tol = 1e-6 * fabs(want);
  if (fabs(got - want) > tol)
    fail_msg("%s[%d]: got %.9g, expected %.9g (tolerance %.3g)", what, idx, got, want, tol);
}

static void check_vec(const float *got, const double *want, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    check_near(got[i], want[i], what, (int)i);
}

/* A slice of 3 weights with its slots set as the trainer would set them. */
typedef struct slice3 {
  float w[3];
  float s[PS_OPTIM_MAX_SLOTS][3];
  float *slots[PS_OPTIM_MAX_SLOTS];
} slice3;

static void slice3_init(slice3 *sl, const ps_optim *o, const float w[3]) {
  memcpy(sl->w, w, sizeof sl->w);
  for (int i = 0; i < PS_OPTIM_MAX_SLOTS; i++) {
    for (int j = 0; j < 3; j++)
      sl->s[i][j] = ps_optim_slot_init(o, i);
    sl->slots[i] = sl->s[i];
  }
}

static const float W0[3] = {1.0f, -2.0f, 0.5f};
static const float G0[3] = {0.5f, -1.0f, 2.0f};

/* ------------------------------------------------------------------------ */
/* Optimizers, by hand                                                       */
/* ------------------------------------------------------------------------ */

static void test_sgd(void **state) {
  (void)state;
  ps_optim o = ps_optim_default(PS_OPTIM_SGD, 0.1f);
  slice3 sl;
  slice3_init(&sl, &o, W0);

  ps_optim_apply(&o, 0.1f, 1, sl.w, G0, NULL, 3);
  /* w - 0.1 * g: 1 - 0.05, -2 + 0.1, 0.5 - 0.2 */
  check_vec(sl.w, (const double[]){0.95, -1.9, 0.3}, 3, "sgd step 1");

  const float g2[3] = {1.0f, 1.0f, -1.0f};
  ps_optim_apply(&o, 0.1f, 2, sl.w, g2, NULL, 3);
  /* 0.95 - 0.1, -1.9 - 0.1, 0.3 + 0.1 */
  check_vec(sl.w, (const double[]){0.85, -2.0, 0.4}, 3, "sgd step 2");

  /* The rate given to apply() is the one used, not o.lr. */
  ps_optim_apply(&o, 0.5f, 3, sl.w, g2, NULL, 3);
  /* 0.85 - 0.5, -2.0 - 0.5, 0.4 + 0.5 */
  check_vec(sl.w, (const double[]){0.35, -2.5, 0.9}, 3, "sgd step 3 at lr 0.5");
}

static void test_momentum(void **state) {
  (void)state;
  ps_optim o = ps_optim_default(PS_OPTIM_MOMENTUM, 0.1f);
  slice3 sl;
  slice3_init(&sl, &o, W0);

  ps_optim_apply(&o, 0.1f, 1, sl.w, G0, sl.slots, 3);
  /* v = 0.9 * 0 + g = g; w -= 0.1 * g: 0.95, -1.9, 0.3 */
  check_vec(sl.s[0], (const double[]){0.5, -1.0, 2.0}, 3, "momentum v 1");
  check_vec(sl.w, (const double[]){0.95, -1.9, 0.3}, 3, "momentum step 1");

  ps_optim_apply(&o, 0.1f, 2, sl.w, G0, sl.slots, 3);
  /* v = 0.9 g + g = 1.9 g = 0.95, -1.9, 3.8;
   * w = 0.95 - 0.095, -1.9 + 0.19, 0.3 - 0.38 */
  check_vec(sl.s[0], (const double[]){0.95, -1.9, 3.8}, 3, "momentum v 2");
  check_vec(sl.w, (const double[]){0.855, -1.71, -0.08}, 3, "momentum step 2");

  ps_optim_apply(&o, 0.1f, 3, sl.w, G0, sl.slots, 3);
  /* v = 0.9 * 1.9 g + g = 2.71 g = 1.355, -2.71, 5.42;
   * w = 0.855 - 0.1355, -1.71 + 0.271, -0.08 - 0.542 */
  check_vec(sl.w, (const double[]){0.7195, -1.439, -0.622}, 3, "momentum step 3");
}

static void test_nesterov(void **state) {
  (void)state;
  ps_optim o = ps_optim_default(PS_OPTIM_MOMENTUM, 0.1f);
  o.nesterov = 1;
  slice3 sl;
  slice3_init(&sl, &o, W0);

  ps_optim_apply(&o, 0.1f, 1, sl.w, G0, sl.slots, 3);
  /* v = g; w -= 0.1 * (g + 0.9 v) = 0.19 g = 0.095, -0.19, 0.38.
   * Plain momentum moved only 0.1 g here: Nesterov looks one step ahead. */
  check_vec(sl.s[0], (const double[]){0.5, -1.0, 2.0}, 3, "nesterov v 1");
  check_vec(sl.w, (const double[]){0.905, -1.81, 0.12}, 3, "nesterov step 1");

  ps_optim_apply(&o, 0.1f, 2, sl.w, G0, sl.slots, 3);
  /* v = 1.9 g, the same buffer as plain momentum keeps;
   * w -= 0.1 * (g + 0.9 * 1.9 g) = 0.271 g = 0.1355, -0.271, 0.542 */
  check_vec(sl.s[0], (const double[]){0.95, -1.9, 3.8}, 3, "nesterov v 2");
  check_vec(sl.w, (const double[]){0.7695, -1.539, -0.422}, 3, "nesterov step 2");
}

static void test_nesterov_differs_from_momentum(void **state) {
  (void)state;
  ps_optim plain = ps_optim_default(PS_OPTIM_MOMENTUM, 0.1f);
  ps_optim nest = plain;
  nest.nesterov = 1;
  slice3 a, b;
  slice3_init(&a, &plain, W0);
  slice3_init(&b, &nest, W0);
  for (uint64_t t = 1; t <= 3; t++) {
    ps_optim_apply(&plain, 0.1f, t, a.w, G0, a.slots, 3);
    ps_optim_apply(&nest, 0.1f, t, b.w, G0, b.slots, 3);
    for (int i = 0; i < 3; i++) {
      /* Same velocity; for a constant g Nesterov's step g + mu v_t equals
       * v_(t+1), one step ahead of plain momentum's v_t, so it has gone
       * further along -g. */
      assert_true(a.s[0][i] == b.s[0][i]);
      assert_true(fabsf(b.w[i] - W0[i]) > fabsf(a.w[i] - W0[i]));
    }
  }
}

static void test_adagrad(void **state) {
  (void)state;
  ps_optim o = ps_optim_default(PS_OPTIM_ADAGRAD, 0.1f);
  /* 0.16 makes every accumulator below a perfect square. */
  o.initial_accumulator = 0.16f;
  slice3 sl;
  slice3_init(&sl, &o, W0);
  check_vec(sl.s[0], (const double[]){0.16, 0.16, 0.16}, 3, "adagrad slot init");

  const float g1[3] = {0.3f, -0.42f, 0.75f};
  ps_optim_apply(&o, 0.1f, 1, sl.w, g1, sl.slots, 3);
  /* acc = 0.16 + g^2 = 0.25, 0.3364, 0.7225 = 0.5^2, 0.58^2, 0.85^2;
   * w -= 0.1 g / sqrt(acc): 0.1 * 0.3/0.5 = 0.06, 0.1 * 0.42/0.58 = 0.0724137931,
   * 0.1 * 0.75/0.85 = 0.0882352941 (eps 1e-10 is far below the tolerance) */
  check_vec(sl.s[0], (const double[]){0.25, 0.3364, 0.7225}, 3, "adagrad acc 1");
  check_vec(sl.w, (const double[]){0.94, -1.9275862069, 0.4117647059}, 3, "adagrad step 1");

  const float g2[3] = {1.2f, -0.609f, 0.6375f};
  ps_optim_apply(&o, 0.1f, 2, sl.w, g2, sl.slots, 3);
  /* acc = 0.25 + 1.44 = 1.69 = 1.3^2; 0.3364 + 0.370881 = 0.707281 = 0.841^2;
   * 0.7225 + 0.40640625 = 1.12890625 = 1.0625^2.
   * w -= 0.1 * (1.2/1.3, -0.609/0.841, 0.6375/1.0625)
   *    = 0.0923076923, -0.0724137931, 0.06 */
  check_vec(sl.s[0], (const double[]){1.69, 0.707281, 1.12890625}, 3, "adagrad acc 2");
  check_vec(sl.w, (const double[]){0.8476923077, -1.8551724138, 0.3517647059}, 3,
            "adagrad step 2");
}

static void test_adagrad_default_accumulator(void **state) {
  (void)state;
  ps_optim o = ps_optim_default(PS_OPTIM_ADAGRAD, 0.1f);
  assert_true(o.initial_accumulator == 0.1f);
  assert_true(ps_optim_slot_init(&o, 0) == 0.1f);
  slice3 sl;
  slice3_init(&sl, &o, W0);

  const float g[3] = {0.3f, 0.3f, 0.3f};
  ps_optim_apply(&o, 0.1f, 1, sl.w, g, sl.slots, 3);
  /* acc = 0.1 + 0.09 = 0.19, sqrt = 0.4358898944;
   * step = 0.1 * 0.3 / 0.4358898944 = 0.0688247201.  Starting from 0 instead
   * the step would be lr = 0.1 exactly. */
  check_vec(sl.s[0], (const double[]){0.19, 0.19, 0.19}, 3, "adagrad default acc");
  check_vec(sl.w, (const double[]){0.9311752799, -2.0688247201, 0.4311752799}, 3,
            "adagrad default step");
}

static void test_adam(void **state) {
  (void)state;
  ps_optim o = ps_optim_default(PS_OPTIM_ADAM, 0.001f);
  slice3 sl;
  slice3_init(&sl, &o, W0);

  ps_optim_apply(&o, 0.001f, 1, sl.w, G0, sl.slots, 3);
  /* m = 0.1 g, v = 0.001 g^2; bias corrections 1 - 0.9 = 0.1 and
   * 1 - 0.999 = 0.001 give mhat = g, vhat = g^2, so each weight moves by
   * lr * g / |g| = 0.001 * sign(g) (eps 1e-8 changes it by 1e-8 relative). */
  check_vec(sl.s[0], (const double[]){0.05, -0.1, 0.2}, 3, "adam m 1");
  /* beta2 is held as the float 0.999f, so 1 - beta2 is 9.9998713e-4 and v is
   * 1.3e-5 off 0.001 g^2; the bias correction divides by that same 1 - beta2,
   * which is why the weights still land on lr * sign(g). */
  const double c2 = 1.0 - (double)0.999f;
  check_vec(sl.s[1], (const double[]){c2 * 0.25, c2 * 1.0, c2 * 4.0}, 3, "adam v 1");
  check_vec(sl.w, (const double[]){0.999, -1.999, 0.499}, 3, "adam step 1");

  ps_optim_apply(&o, 0.001f, 2, sl.w, G0, sl.slots, 3);
  /* m = 0.9 * 0.1 g + 0.1 g = 0.19 g over 1 - 0.81 = 0.19;
   * v = 0.999 * 0.001 g^2 + 0.001 g^2 = 0.001999 g^2 over 1 - 0.998001 = 0.001999:
   * a constant gradient keeps moving by lr * sign(g). */
  check_vec(sl.s[0], (const double[]){0.095, -0.19, 0.38}, 3, "adam m 2");
  check_vec(sl.w, (const double[]){0.998, -1.998, 0.498}, 3, "adam step 2");

  const float g3[3] = {0.5f, 1.0f, 0.0f};
  ps_optim_apply(&o, 0.001f, 3, sl.w, g3, sl.slots, 3);
  /* bias corrections 1 - 0.729 = 0.271 and 1 - 0.997002999 = 0.002997001.
   * [0] same g: m = 0.271 g, v = 0.002997001 g^2 -> lr * sign(g) again: 0.997.
   * [1] g flips from -1 to 1: m = -0.171 + 0.1 = -0.071, mhat = -0.2619926199;
   *     v = 0.001997001 + 0.001 = 0.002997001, vhat = 1;
   *     w = -1.998 + 0.001 * 0.2619926199 = -1.9977380074.
   * [2] g drops from 2 to 0: m = 0.171 * 2, mhat = 0.6309963100 * 2;
   *     v = 0.001997001 * 4, sqrt(vhat) = 0.8162922951 * 2;
   *     w = 0.498 - 0.001 * 0.6309963100 / 0.8162922951 = 0.498 - 0.000773002898 */
  check_vec(sl.w, (const double[]){0.997, -1.9977380074, 0.4972269971}, 3, "adam step 3");
}

static void test_adam_t0_is_first_step(void **state) {
  (void)state;
  ps_optim o = ps_optim_default(PS_OPTIM_ADAM, 0.001f);
  slice3 sl;
  slice3_init(&sl, &o, W0);
  ps_optim_apply(&o, 0.001f, 0, sl.w, G0, sl.slots, 3);
  /* t = 0 would divide by 1 - beta^0 = 0; it is taken as t = 1. */
  check_vec(sl.w, (const double[]){0.999, -1.999, 0.499}, 3, "adam t=0");
}

static void test_weight_decay(void **state) {
  (void)state;
  /* sgd: g + 0.1 w = 0.6, -1.2, 2.05; w = 1 - 0.06, -2 + 0.12, 0.5 - 0.205 */
  ps_optim o = ps_optim_default(PS_OPTIM_SGD, 0.1f);
  o.weight_decay = 0.1f;
  slice3 sl;
  slice3_init(&sl, &o, W0);
  ps_optim_apply(&o, 0.1f, 1, sl.w, G0, NULL, 3);
  check_vec(sl.w, (const double[]){0.94, -1.88, 0.295}, 3, "sgd wd");

  /* momentum: step 1 as sgd, v = 0.6, -1.2, 2.05.
   * step 2: g + 0.1 w = 0.5 + 0.094, -1 - 0.188, 2 + 0.0295 = 0.594, -1.188, 2.0295;
   * v = 0.9 v + that = 1.134, -2.268, 3.8745;
   * w = 0.94 - 0.1134, -1.88 + 0.2268, 0.295 - 0.38745 */
  o = ps_optim_default(PS_OPTIM_MOMENTUM, 0.1f);
  o.weight_decay = 0.1f;
  slice3_init(&sl, &o, W0);
  ps_optim_apply(&o, 0.1f, 1, sl.w, G0, sl.slots, 3);
  ps_optim_apply(&o, 0.1f, 2, sl.w, G0, sl.slots, 3);
  check_vec(sl.s[0], (const double[]){1.134, -2.268, 3.8745}, 3, "momentum wd v");
  check_vec(sl.w, (const double[]){0.8266, -1.6532, -0.09245}, 3, "momentum wd");

  /* adam (L2 in the gradient, not AdamW): g + 1.0 w = -0.5 + 1, 1 - 2, 2 + 0.5
   * = 0.5, -1, 2.5, so the first weight moves down although its raw gradient
   * says up: 0.999, -1.999, 0.499. */
  o = ps_optim_default(PS_OPTIM_ADAM, 0.001f);
  o.weight_decay = 1.0f;
  slice3_init(&sl, &o, W0);
  const float g[3] = {-0.5f, 1.0f, 2.0f};
  ps_optim_apply(&o, 0.001f, 1, sl.w, g, sl.slots, 3);
  check_vec(sl.w, (const double[]){0.999, -1.999, 0.499}, 3, "adam wd");
}

/* ------------------------------------------------------------------------ */
/* Optimizers on long slices, against a plain double reference              */
/* ------------------------------------------------------------------------ */

/* Long enough for two whole chunks, a partial chunk and a partial block. */
#define LONG_N 2085

static uint64_t lcg_state;
static float lcg_uniform(void) {
  lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(lcg_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static void reference_step(const ps_optim *o, double lr, uint64_t t, double *w, const double *g,
                           double *s0, double *s1, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double ge = g[i] + (double)o->weight_decay * w[i];
    switch (o->kind) {
    case PS_OPTIM_SGD:
      w[i] -= lr * ge;
      break;
    case PS_OPTIM_MOMENTUM:
      s0[i] = o->momentum * s0[i] + ge;
      w[i] -= lr * (o->nesterov ? ge + o->momentum * s0[i] : s0[i]);
      break;
    case PS_OPTIM_ADAGRAD:
      s0[i] += ge * ge;
      w[i] -= lr * ge / (sqrt(s0[i]) + o->eps);
      break;
    case PS_OPTIM_ADAM: {
      s0[i] = o->beta1 * s0[i] + (1.0 - o->beta1) * ge;
      s1[i] = o->beta2 * s1[i] + (1.0 - o->beta2) * ge * ge;
      double mhat = s0[i] / (1.0 - pow(o->beta1, (double)t));
      double vhat = s1[i] / (1.0 - pow(o->beta2, (double)t));
      w[i] -= lr * mhat / (sqrt(vhat) + o->eps);
      break;
    }
    }
  }
}

static void check_against_reference(const ps_optim *o, float lr) {
  /* One float past the slice on each array: apply() must not touch it.  The
   * slice starts at index 1 so that it is not vector-aligned. */
  enum { N = LONG_N, PAD = 2 };
  static float w[N + PAD], g[N + PAD], s[PS_OPTIM_MAX_SLOTS][N + PAD];
  static double rw[N], rg[N], rs[PS_OPTIM_MAX_SLOTS][N];
  const float sentinel = 12345.0f;
  float *slots[PS_OPTIM_MAX_SLOTS] = {s[0] + 1, s[1] + 1};

  lcg_state = 42;
  for (size_t i = 0; i < N; i++) {
    w[i + 1] = lcg_uniform();
    rw[i] = w[i + 1];
    for (int k = 0; k < PS_OPTIM_MAX_SLOTS; k++) {
      s[k][i + 1] = ps_optim_slot_init(o, k);
      rs[k][i] = s[k][i + 1];
    }
  }
  w[0] = w[N + 1] = sentinel;
  for (int k = 0; k < PS_OPTIM_MAX_SLOTS; k++)
    s[k][0] = s[k][N + 1] = sentinel;

  for (uint64_t t = 1; t <= 3; t++) {
    for (size_t i = 0; i < N; i++) {
      g[i + 1] = lcg_uniform();
      rg[i] = g[i + 1];
    }
    ps_optim_apply(o, lr, t, w + 1, g + 1, slots, N);
    reference_step(o, lr, t, rw, rg, rs[0], rs[1], N);
  }

  /* Weights are O(1) and float carries 7 digits, so 1e-6 absolute. */
  for (size_t i = 0; i < N; i++)
    if (fabs(w[i + 1] - rw[i]) > 1e-6)
      fail_msg("%s wd %g: w[%zu] = %.9g, reference %.9g", ps_optim_name(o),
               (double)o->weight_decay, i, (double)w[i + 1], rw[i]);
  assert_true(w[0] == sentinel && w[N + 1] == sentinel);
  for (int k = 0; k < PS_OPTIM_MAX_SLOTS; k++)
    assert_true(s[k][0] == sentinel && s[k][N + 1] == sentinel);
}

static void test_long_slices_match_reference(void **state) {
  (void)state;
  static const char *const names[] = {"sgd", "momentum", "nesterov", "adagrad", "adam"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    ps_optim o = {.lr = 0.01f};
    assert_int_equal(ps_optim_parse(names[i], &o), 0);
    check_against_reference(&o, 0.01f);
    o.weight_decay = 0.05f;
    check_against_reference(&o, 0.01f);
  }
}

/* A shard may hold any cut of a tensor, so an element's update must not
 * depend on where the slice starts or ends: one 37-float slice and 37
 * one-float slices give bit-identical results. */
static void test_update_independent_of_slicing(void **state) {
  (void)state;
  enum { N = 37 };
  ps_optim o = ps_optim_default(PS_OPTIM_ADAM, 0.01f);
  o.weight_decay = 0.01f;
  float w1[N], w2[N], g[N], m1[N] = {0}, v1[N] = {0}, m2[N] = {0}, v2[N] = {0};
  lcg_state = 7;
  for (int i = 0; i < N; i++) {
    w1[i] = w2[i] = lcg_uniform();
    g[i] = lcg_uniform();
  }
  float *whole[2] = {m1, v1};
  ps_optim_apply(&o, 0.01f, 1, w1, g, whole, N);
  for (int i = 0; i < N; i++) {
    float *one[2] = {m2 + i, v2 + i};
    ps_optim_apply(&o, 0.01f, 1, w2 + i, g + i, one, 1);
  }
  assert_memory_equal(w1, w2, sizeof w1);
  assert_memory_equal(m1, m2, sizeof m1);
  assert_memory_equal(v1, v2, sizeof v1);
}

static void test_empty_slice(void **state) {
  (void)state;
  ps_optim o = ps_optim_default(PS_OPTIM_ADAM, 0.01f);
  float x = 1.0f;
  float *slots[2] = {&x, &x};
  ps_optim_apply(&o, 0.01f, 1, &x, &x, slots, 0);
  assert_true(x == 1.0f);
}

/* ------------------------------------------------------------------------ */
/* Defaults, slots and names                                                 */
/* ------------------------------------------------------------------------ */

static void test_defaults(void **state) {
  (void)state;
  ps_optim o = ps_optim_default(PS_OPTIM_ADAM, 0.003f);
  assert_int_equal(o.kind, PS_OPTIM_ADAM);
  assert_true(o.lr == 0.003f);
  assert_true(o.momentum == 0.9f);
  assert_int_equal(o.nesterov, 0);
  assert_true(o.beta1 == 0.9f && o.beta2 == 0.999f);
  assert_true(o.eps == 1e-8f);
  assert_true(o.initial_accumulator == 0.1f);
  assert_true(o.weight_decay == 0.0f);
  assert_true(ps_optim_default(PS_OPTIM_ADAGRAD, 0.1f).eps == 1e-10f);
}

static void test_nslots_and_slot_init(void **state) {
  (void)state;
  assert_int_equal(ps_optim_nslots(PS_OPTIM_SGD), 0);
  assert_int_equal(ps_optim_nslots(PS_OPTIM_MOMENTUM), 1);
  assert_int_equal(ps_optim_nslots(PS_OPTIM_ADAGRAD), 1);
  assert_int_equal(ps_optim_nslots(PS_OPTIM_ADAM), 2);
  assert_true(PS_OPTIM_MAX_SLOTS >= 2);

  ps_optim o = ps_optim_default(PS_OPTIM_ADAM, 0.1f);
  assert_true(ps_optim_slot_init(&o, 0) == 0.0f && ps_optim_slot_init(&o, 1) == 0.0f);
  o = ps_optim_default(PS_OPTIM_MOMENTUM, 0.1f);
  assert_true(ps_optim_slot_init(&o, 0) == 0.0f);
  o = ps_optim_default(PS_OPTIM_ADAGRAD, 0.1f);
  o.initial_accumulator = 0.25f;
  assert_true(ps_optim_slot_init(&o, 0) == 0.25f);
}

static void test_optim_parse_and_name(void **state) {
  (void)state;
  static const char *const names[] = {"sgd", "momentum", "nesterov", "adagrad", "adam"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    ps_optim o = ps_optim_default(PS_OPTIM_SGD, 0.05f);
    o.weight_decay = 0.3f;
    assert_int_equal(ps_optim_parse(names[i], &o), 0);
    assert_string_equal(ps_optim_name(&o), names[i]);
    /* The learning rate survives; every other field is the new kind's default. */
    assert_true(o.lr == 0.05f);
    assert_true(o.weight_decay == 0.0f);
  }

  ps_optim o = ps_optim_default(PS_OPTIM_SGD, 0.05f);
  assert_int_equal(ps_optim_parse("nesterov", &o), 0);
  assert_int_equal(o.kind, PS_OPTIM_MOMENTUM);
  assert_int_equal(o.nesterov, 1);
  assert_true(o.momentum == 0.9f);
  assert_int_equal(ps_optim_parse("momentum", &o), 0);
  assert_int_equal(o.nesterov, 0);
  assert_int_equal(ps_optim_parse("adagrad", &o), 0);
  assert_int_equal(o.kind, PS_OPTIM_ADAGRAD);
  assert_true(o.eps == 1e-10f && o.initial_accumulator == 0.1f);
  assert_int_equal(ps_optim_parse("adam", &o), 0);
  assert_true(o.eps == 1e-8f && o.beta1 == 0.9f && o.beta2 == 0.999f);

  /* Unknown names leave the struct as it was. */
  ps_optim before = o;
  assert_int_equal(ps_optim_parse("rmsprop", &o), PS_EUSAGE);
  assert_int_equal(ps_optim_parse("Adam", &o), PS_EUSAGE);
  assert_int_equal(ps_optim_parse("", &o), PS_EUSAGE);
  assert_int_equal(ps_optim_parse(NULL, &o), PS_EUSAGE);
  assert_memory_equal(&o, &before, sizeof o);
}

/* ------------------------------------------------------------------------ */
/* Schedules                                                                 */
/* ------------------------------------------------------------------------ */

static void check_lr(const ps_sched *s, uint64_t step, double want) {
  check_near(ps_sched_lr(s, 0.1f, step), want, ps_sched_name(s), (int)step);
}

static void test_sched_constant(void **state) {
  (void)state;
  ps_sched s = {.kind = PS_SCHED_CONSTANT};
  check_lr(&s, 0, 0.1);
  check_lr(&s, 1000000, 0.1);
}

static void test_sched_step(void **state) {
  (void)state;
  ps_sched s = {.kind = PS_SCHED_STEP, .step_size = 10, .gamma = 0.5f};
  check_lr(&s, 0, 0.1);
  check_lr(&s, 9, 0.1);     /* floor(9/10) = 0 */
  check_lr(&s, 10, 0.05);   /* first decay exactly at the boundary: 0.1 * 0.5 */
  check_lr(&s, 19, 0.05);
  check_lr(&s, 20, 0.025);  /* 0.1 * 0.5^2 */
  check_lr(&s, 35, 0.0125); /* 0.1 * 0.5^3 */
  s.step_size = 0;          /* no decay at all */
  check_lr(&s, 1000, 0.1);
}

static void test_sched_cosine(void **state) {
  (void)state;
  ps_sched s = {.kind = PS_SCHED_COSINE, .total = 100};
  check_lr(&s, 0, 0.1);             /* (1 + cos 0) / 2 = 1 */
  check_lr(&s, 25, 0.0853553391);   /* (1 + cos(pi/4)) / 2 = 0.8535533906 */
  check_lr(&s, 50, 0.05);           /* (1 + cos(pi/2)) / 2 = 0.5 */
  check_lr(&s, 100, 0.0);           /* (1 + cos pi) / 2 = 0 */
  check_lr(&s, 150, 0.0);           /* stays at the floor, no climb back */

  s.min_factor = 0.1f;
  check_lr(&s, 0, 0.1);
  check_lr(&s, 50, 0.055);          /* 0.1 * (0.1 + 0.9 * 0.5) */
  check_lr(&s, 100, 0.01);          /* 0.1 * 0.1 */
  check_lr(&s, 1000, 0.01);
}

static void test_sched_warmup(void **state) {
  (void)state;
  /* Warm-up: base * (step + 1) / warmup, reaching base on its last step. */
  ps_sched s = {.kind = PS_SCHED_CONSTANT, .warmup = 4};
  check_lr(&s, 0, 0.025);
  check_lr(&s, 1, 0.05);
  check_lr(&s, 3, 0.1);
  check_lr(&s, 4, 0.1);

  /* Step decay counts from the end of warm-up: step 14 is k = 9, 15 is k = 10. */
  s = (ps_sched){.kind = PS_SCHED_STEP, .step_size = 10, .gamma = 0.5f, .warmup = 5};
  check_lr(&s, 4, 0.1);
  check_lr(&s, 14, 0.1);
  check_lr(&s, 15, 0.05);

  /* Cosine runs over total - warmup = 100 steps after warm-up. */
  s = (ps_sched){.kind = PS_SCHED_COSINE, .total = 110, .warmup = 10};
  check_lr(&s, 0, 0.01);
  check_lr(&s, 9, 0.1);
  check_lr(&s, 10, 0.1);  /* k = 0 */
  check_lr(&s, 60, 0.05); /* k = 50 of 100 */
  check_lr(&s, 110, 0.0);
  check_lr(&s, 200, 0.0);
}

static void test_sched_parse_and_name(void **state) {
  (void)state;
  static const char *const names[] = {"constant", "step", "cosine"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    ps_sched s = {.step_size = 7, .gamma = 0.3f, .total = 9, .min_factor = 0.2f, .warmup = 3};
    assert_int_equal(ps_sched_parse(names[i], &s), 0);
    assert_string_equal(ps_sched_name(&s), names[i]);
    /* Only the kind changes. */
    assert_true(s.step_size == 7 && s.gamma == 0.3f && s.total == 9 && s.min_factor == 0.2f &&
                s.warmup == 3);
  }
  ps_sched s = {.kind = PS_SCHED_COSINE};
  assert_int_equal(ps_sched_parse("linear", &s), PS_EUSAGE);
  assert_int_equal(ps_sched_parse(NULL, &s), PS_EUSAGE);
  assert_int_equal(s.kind, PS_SCHED_COSINE);
}

/* A cluster's [train] schedule as its shards and workers run it: step
 * decays by decay_gamma every decay_steps, cosine reaches 0 at last_step. */
static void test_sched_of_config(void **state) {
  (void)state;
  ps_config c;
  ps_config_defaults(&c);
  snprintf(c.schedule, sizeof c.schedule, "step");
  c.decay_steps = 100;
  c.decay_gamma = 0.5;
  ps_sched s = ps_sched_of_config(&c);
  check_lr(&s, 99, 0.1);
  check_lr(&s, 100, 0.05);
  check_lr(&s, 250, 0.025);
  snprintf(c.schedule, sizeof c.schedule, "cosine");
  c.last_step = 1000;
  s = ps_sched_of_config(&c);
  check_lr(&s, 0, 0.1);
  check_lr(&s, 500, 0.05);
  check_lr(&s, 1000, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd),
      cmocka_unit_test(test_momentum),
      cmocka_unit_test(test_nesterov),
      cmocka_unit_test(test_nesterov_differs_from_momentum),
      cmocka_unit_test(test_adagrad),
      cmocka_unit_test(test_adagrad_default_accumulator),
      cmocka_unit_test(test_adam),
      cmocka_unit_test(test_adam_t0_is_first_step),
      cmocka_unit_test(test_weight_decay),
      cmocka_unit_test(test_long_slices_match_reference),
      cmocka_unit_test(test_update_independent_of_slicing),
      cmocka_unit_test(test_empty_slice),
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_nslots_and_slot_init),
      cmocka_unit_test(test_optim_parse_and_name),
      cmocka_unit_test(test_sched_constant),
      cmocka_unit_test(test_sched_step),
      cmocka_unit_test(test_sched_cosine),
      cmocka_unit_test(test_sched_warmup),
      cmocka_unit_test(test_sched_parse_and_name),
      cmocka_unit_test(test_sched_of_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
