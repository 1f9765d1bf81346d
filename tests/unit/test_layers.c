/* Every layer's backward pass against central finite differences of its
 * forward pass, on small random shapes, through the CPU backend. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/rng.h"
#include "nn/backend.h"
#include "nn/layers.h"

typedef struct fixture {
  ps_backend *b;
  ps_rng rng;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->b = ps_backend_cpu_new();
  ps_rng_seed(&f->rng, 42);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  ps_backend_free(f->b);
  free(f);
  return 0;
}

static void fill(ps_rng *r, float *p, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++)
    p[i] = lo + (hi - lo) * (float)ps_rng_uniform(r);
}

/* Values in +-[0.1, 1]: far from relu's kink at 0. */
static void fill_away_from_zero(ps_rng *r, float *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = 0.1f + 0.9f * (float)ps_rng_uniform(r);
    p[i] = ps_rng_uniform(r) < 0.5 ? -v : v;
  }
}

typedef struct run {
  const ps_layer *l;
  ps_backend *b;
  ps_layer_aux aux;
  int n;
  float *params, *x, *y, *r;  /* r: the weights of L = sum(y * r) */
} run;

static double objective(run *u) {
  ps_layer_forward(u->l, u->b, u->params, u->x, u->y, u->n, &u->aux, 1, 7, 100);
  double s = 0.0;
  for (size_t i = 0; i < (size_t)u->n * u->l->out_size; i++)
    s += (double)u->y[i] * u->r[i];
  return s;
}

static void expect_close(const char *what, size_t i, double analytic, double numeric) {
  double tol = 2e-2 * fmax(1.0, fmax(fabs(analytic), fabs(numeric)));
  if (fabs(analytic - numeric) > tol)
    fail_msg("%s[%zu]: backward %.6f, finite difference %.6f", what, i, analytic, numeric);
}

/* Check dx and every parameter gradient of layer l (nparams floats). */
static void gradcheck(fixture *f, const ps_layer *l, int n, size_t nparams, int relu_like) {
  run u = {.l = l, .b = f->b, .n = n};
  size_t mask, idx, conv_ws;
  ps_layer_aux_sizes(l, f->b, n, &mask, &idx, &conv_ws);
  u.aux.mask = mask ? malloc(mask) : NULL;
  u.aux.idx = idx ? malloc(idx) : NULL;
  u.aux.conv_ws = conv_ws ? malloc(conv_ws) : NULL;
  size_t nin = (size_t)n * l->in_size, nout = (size_t)n * l->out_size;
  u.params = malloc((nparams ? nparams : 1) * sizeof(float));
  u.x = malloc(nin * sizeof(float));
  u.y = malloc(nout * sizeof(float));
  u.r = malloc(nout * sizeof(float));
  float *dx = malloc(nin * sizeof(float));
  float *grads = malloc((nparams ? nparams : 1) * sizeof(float));
  fill(&f->rng, u.params, nparams, -0.5f, 0.5f);
  if (relu_like)
    fill_away_from_zero(&f->rng, u.x, nin);
  else
    fill(&f->rng, u.x, nin, -1.0f, 1.0f);
  fill(&f->rng, u.r, nout, -1.0f, 1.0f);

  objective(&u);
  ps_layer_backward(l, f->b, u.params, u.x, u.y, u.r, dx, grads, n, &u.aux);

  const float eps = 1e-2f;
  for (size_t i = 0; i < nin; i++) {
    float keep = u.x[i];
    u.x[i] = keep + eps;
    double up = objective(&u);
    u.x[i] = keep - eps;
    double down = objective(&u);
    u.x[i] = keep;
    expect_close("dx", i, dx[i], (up - down) / (2.0 * eps));
  }
  for (size_t i = 0; i < nparams; i++) {
    float keep = u.params[i];
    u.params[i] = keep + eps;
    double up = objective(&u);
    u.params[i] = keep - eps;
    double down = objective(&u);
    u.params[i] = keep;
    expect_close("dparam", i, grads[i], (up - down) / (2.0 * eps));
  }
  free(u.aux.mask);
  free(u.aux.idx);
  free(u.aux.conv_ws);
  free(u.params);
  free(u.x);
  free(u.y);
  free(u.r);
  free(dx);
  free(grads);
}

static void test_dense(void **state) {
  ps_layer l = {.kind = PS_LAYER_DENSE, .in_size = 7, .out_size = 5, .out_c = 5,
                .woff = 0, .boff = 35};
  gradcheck(*state, &l, 3, 40, 0);
}

static void conv_layer(ps_layer *l, int c, int h, int w, int k, int out_c, int stride,
                       int pad) {
  memset(l, 0, sizeof *l);
  l->kind = PS_LAYER_CONV2D;
  l->geom = (ps_conv_geom){.c = c, .h = h, .w = w, .kh = k, .kw = k, .stride = stride,
                           .pad = pad, .oh = (h + 2 * pad - k) / stride + 1,
                           .ow = (w + 2 * pad - k) / stride + 1};
  l->out_c = out_c;
  l->in_size = (size_t)c * h * w;
  l->out_size = (size_t)out_c * l->geom.oh * l->geom.ow;
  l->woff = 0;
  l->boff = (size_t)out_c * c * k * k;
}

static void test_conv2d(void **state) {
  ps_layer l;
  conv_layer(&l, 2, 6, 5, 3, 3, 1, 0);
  gradcheck(*state, &l, 2, l.boff + 3, 0);
}

static void test_conv2d_stride_pad(void **state) {
  ps_layer l;
  conv_layer(&l, 2, 7, 6, 3, 2, 2, 1);
  gradcheck(*state, &l, 2, l.boff + 2, 0);
}

static void test_maxpool2d(void **state) {
  ps_layer l = {.kind = PS_LAYER_MAXPOOL2D};
  l.geom = (ps_conv_geom){.c = 3, .h = 6, .w = 4, .kh = 2, .kw = 2, .stride = 2, .oh = 3, .ow = 2};
  l.in_size = 3 * 6 * 4;
  l.out_size = 3 * 3 * 2;
  /* Random inputs spaced by more than 2*eps never tie inside a window. */
  gradcheck(*state, &l, 2, 0, 1);
}

static void test_relu(void **state) {
  ps_layer l = {.kind = PS_LAYER_RELU, .in_size = 11, .out_size = 11};
  gradcheck(*state, &l, 3, 0, 1);
}

static void test_dropout(void **state) {
  ps_layer l = {.kind = PS_LAYER_DROPOUT, .in_size = 50, .out_size = 50, .p = 0.5f};
  gradcheck(*state, &l, 3, 0, 0);
}

/* The mask is a function of (seed, sample number) only, dropped values are
 * zero, kept ones scaled by 1/(1-p), and the drop rate is about p. */
static void test_dropout_mask(void **state) {
  fixture *f = *state;
  enum { N = 4, PER = 5000 };
  float *x = malloc(N * PER * sizeof(float)), *y = malloc(N * PER * sizeof(float));
  float *y2 = malloc(PER * sizeof(float));
  uint8_t *m = malloc(N * PER), *m2 = malloc(PER);
  for (size_t i = 0; i < N * PER; i++)
    x[i] = 1.0f;
  f->b->ops->dropout_fwd(f->b, N, PER, 1, 0.75f, 99, 10, x, y, m);
  size_t kept = 0;
  for (size_t i = 0; i < N * PER; i++) {
    assert_true(y[i] == 0.0f || fabsf(y[i] - 4.0f) < 1e-6f);
    kept += m[i];
  }
  assert_in_range(kept, (size_t)(0.23 * N * PER), (size_t)(0.27 * N * PER));
  /* Sample 12 alone gives the same mask as it did as the third of four. */
  f->b->ops->dropout_fwd(f->b, 1, PER, 1, 0.75f, 99, 12, x, y2, m2);
  assert_memory_equal(m2, m + 2 * PER, PER);
  free(x);
  free(y);
  free(y2);
  free(m);
  free(m2);
}

/* The masks follow nn/dropout.h's definition, written out once more here:
 * group j of sample s is kept when the 16 bits at 16 * (j % 4) of
 * mix64(key + (j / 4) * 0x9e3779b97f4a7c15), key = mix64(seed ^ mix64(s)),
 * are below (1 - p) * 65536 rounded; groups of 1, 3 (a 64-bit word's draws
 * spanning groups of several values) and whole planes. */
static void test_dropout_definition(void **state) {
  fixture *f = *state;
  const struct { int n; size_t per, group; float p; uint64_t seed, first; } cases[] = {
      {3, 101, 1, 0.3f, 1, 0},
      {4, 30, 3, 0.5f, 0xdeadbeef, 77},
      {2, 5 * 16, 16, 0.25f, 9, 1u << 20}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    size_t count = (size_t)cases[c].n * cases[c].per;
    float *x = malloc(count * sizeof *x), *y = malloc(count * sizeof *y);
    uint8_t *m = malloc(count);
    fill(&f->rng, x, count, -1.0f, 1.0f);
    f->b->ops->dropout_fwd(f->b, cases[c].n, cases[c].per, cases[c].group, cases[c].p,
                           cases[c].seed, cases[c].first, x, y, m);
    uint32_t below = (uint32_t)((1.0 - (double)cases[c].p) * 65536.0 + 0.5);
    float scale = 1.0f / (1.0f - cases[c].p);
    for (int s = 0; s < cases[c].n; s++) {
      uint64_t key = ps_mix64(cases[c].seed ^ ps_mix64(cases[c].first + (uint64_t)s));
      for (size_t v = 0; v < cases[c].per; v++) {
        size_t j = v / cases[c].group, at = (size_t)s * cases[c].per + v;
        uint64_t word = ps_mix64(key + (uint64_t)(j / 4) * 0x9e3779b97f4a7c15ULL);
        uint8_t keep = ((word >> (16 * (j % 4))) & 0xffff) < below;
        if (m[at] != keep)
          fail_msg("case %zu sample %d value %zu: mask %d, definition %d", c, s, v, m[at], keep);
        assert_true(y[at] == x[at] * ((float)keep * scale));
      }
    }
    free(x);
    free(y);
    free(m);
  }
}

/* dlogits of the log-softmax NLL against finite differences of the loss. */
static void test_nll(void **state) {
  fixture *f = *state;
  enum { N = 4, K = 6 };
  float z[N * K], d[N * K];
  uint8_t labels[N] = {0, 5, 2, 3};
  fill(&f->rng, z, N * K, -3.0f, 3.0f);
  size_t correct = 0;
  double loss = f->b->ops->nll(f->b, N, K, z, labels, 1.0f, d, &correct);
  assert_true(loss > 0.0);
  const float eps = 1e-2f;
  for (int i = 0; i < N * K; i++) {
    float keep = z[i];
    z[i] = keep + eps;
    double up = f->b->ops->nll(f->b, N, K, z, labels, 1.0f, NULL, NULL);
    z[i] = keep - eps;
    double down = f->b->ops->nll(f->b, N, K, z, labels, 1.0f, NULL, NULL);
    z[i] = keep;
    expect_close("dlogits", (size_t)i, d[i], (up - down) / (2.0 * eps));
  }
  /* Rows of the gradient sum to zero; argmax counting. */
  for (int i = 0; i < N; i++) {
    double s = 0.0;
    for (int j = 0; j < K; j++)
      s += d[i * K + j];
    assert_true(fabs(s) < 1e-5);
  }
  float sure[K] = {0, 0, 0, 9, 0, 0};
  uint8_t three = 3;
  correct = 0;
  f->b->ops->nll(f->b, 1, K, sure, &three, 1.0f, NULL, &correct);
  assert_int_equal(correct, 1);
}

/* Channel dropout: each group of values shares one mask bit. */
static void test_dropout_channels(void **state) {
  fixture *f = *state;
  enum { N = 3, C = 40, PLANE = 9 };
  float x[N * C * PLANE], y[N * C * PLANE];
  uint8_t m[N * C * PLANE];
  fill(&f->rng, x, N * C * PLANE, 0.5f, 1.0f);
  f->b->ops->dropout_fwd(f->b, N, C * PLANE, PLANE, 0.5f, 5, 0, x, y, m);
  size_t kept = 0;
  for (int g = 0; g < N * C; g++) {
    for (int j = 1; j < PLANE; j++)
      assert_int_equal(m[g * PLANE + j], m[g * PLANE]);
    for (int j = 0; j < PLANE; j++)
      assert_true(y[g * PLANE + j] == (m[g * PLANE] ? 2.0f * x[g * PLANE + j] : 0.0f));
    kept += m[g * PLANE];
  }
  assert_in_range(kept, 30, 90);
  ps_layer l = {.kind = PS_LAYER_DROPOUT, .in_size = 4 * 6, .out_size = 4 * 6, .p = 0.5f,
                .group = 6};
  gradcheck(f, &l, 3, 0, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_dense, setup, teardown),
      cmocka_unit_test_setup_teardown(test_conv2d, setup, teardown),
      cmocka_unit_test_setup_teardown(test_conv2d_stride_pad, setup, teardown),
      cmocka_unit_test_setup_teardown(test_maxpool2d, setup, teardown),
      cmocka_unit_test_setup_teardown(test_relu, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dropout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dropout_mask, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dropout_definition, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dropout_channels, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nll, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
