/* The CPU backend's kernels against plain-C references. */
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

static ps_rng rng;

static void fill(float *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] = (float)(2.0 * ps_rng_uniform(&rng) - 1.0);
}

/* C = alpha op(A) op(B) + beta C, the textbook triple loop in double. */
static void gemm_ref(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double s = 0.0;
      for (int p = 0; p < k; p++) {
        double av = ta ? a[p * lda + i] : a[i * lda + p];
        double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
        s += av * bv;
      }
      c[i * ldc + j] = (float)(alpha * s + beta * c[i * ldc + j]);
    }
}

static void test_gemm(void **state) {
  (void)state;
  ps_backend *be = ps_backend_cpu_new();
  /* Odd sizes exercise the kernels' edges; the last is the cnn's conv2. */
  const int sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 576, 288}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        int m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
        int lda = ta ? m : k, ldb = tb ? k : n;
        float *a = malloc((size_t)m * k * sizeof *a), *b = malloc((size_t)k * n * sizeof *b);
        float *c = malloc((size_t)m * n * sizeof *c), *r = malloc((size_t)m * n * sizeof *r);
        fill(a, (size_t)m * k);
        fill(b, (size_t)k * n);
        fill(c, (size_t)m * n);
        memcpy(r, c, (size_t)m * n * sizeof *r);
        be->ops->gemm(be, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, c, n);
        gemm_ref(ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, r, n);
        for (int i = 0; i < m * n; i++)
          if (fabsf(c[i] - r[i]) > 1e-4f * (1.0f + (float)k))
            fail_msg("gemm %dx%dx%d ta=%d tb=%d: [%d] = %f, reference %f", m, n, k, ta, tb, i,
                     c[i], r[i]);
        free(a);
        free(b);
        free(c);
        free(r);
      }
  ps_backend_free(be);
}

/* The convolution of sample s at output (o, oy, ox), the textbook loops in
 * double: the sum over the window of w * x, padding being 0. */
static double conv_ref(const ps_conv_geom *g, int oc, const float *w, const float *x, int s,
                       int o, int oy, int ox) {
  double sum = 0.0;
  for (int c = 0; c < g->c; c++)
    for (int ki = 0; ki < g->kh; ki++)
      for (int kj = 0; kj < g->kw; kj++) {
        int iy = oy * g->stride - g->pad + ki, ix = ox * g->stride - g->pad + kj;
        if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)
          continue;
        sum += (double)w[((o * g->c + c) * g->kh + ki) * g->kw + kj] *
               x[(((size_t)s * g->c + c) * g->h + iy) * g->w + ix];
      }
  (void)oc;
  return sum;
}

/* conv_fwd against conv_ref; conv_bwd's dw and dx against the gradients of
 * L = sum(y * r) written out from the definition: dw[o][c][ki][kj] = sum
 * over samples and outputs of r * the input pixel under the weight, dx
 * the scatter of r * w to the pixels under each window.  Several samples,
 * strides, padding, a non-square window, a 1x1 window, a single sample. */
static void test_conv(void **state) {
  (void)state;
  ps_backend *be = ps_backend_cpu_new();
  const struct { ps_conv_geom g; int oc, n; } cases[] = {
      {{.c = 2, .h = 5, .w = 4, .kh = 3, .kw = 3, .stride = 1, .pad = 0, .oh = 3, .ow = 2}, 3, 5},
      {{.c = 3, .h = 7, .w = 6, .kh = 3, .kw = 2, .stride = 2, .pad = 1, .oh = 4, .ow = 4}, 2, 3},
      {{.c = 1, .h = 28, .w = 28, .kh = 3, .kw = 3, .stride = 1, .pad = 0, .oh = 26, .ow = 26},
       4, 7},
      {{.c = 4, .h = 6, .w = 6, .kh = 1, .kw = 1, .stride = 1, .pad = 0, .oh = 6, .ow = 6}, 5, 1},
      {{.c = 2, .h = 9, .w = 9, .kh = 5, .kw = 5, .stride = 2, .pad = 2, .oh = 5, .ow = 5}, 3, 4},
  };
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const ps_conv_geom *g = &cases[ci].g;
    const int oc = cases[ci].oc, n = cases[ci].n, k = g->c * g->kh * g->kw;
    const int plane = g->oh * g->ow;
    const size_t nx = (size_t)n * g->c * g->h * g->w, ny = (size_t)n * oc * plane;
    float *x = malloc(nx * sizeof *x), *y = malloc(ny * sizeof *y), *r = malloc(ny * sizeof *r);
    float *w = malloc((size_t)oc * k * sizeof *w), *dw = malloc((size_t)oc * k * sizeof *dw);
    float *dx = malloc(nx * sizeof *dx);
    double *dw_ref = calloc((size_t)oc * k, sizeof *dw_ref), *dx_ref = calloc(nx, sizeof *dx_ref);
    float *ws = malloc(be->ops->conv_ws(be, n, g, oc) * sizeof *ws + 1);
    fill(x, nx);
    fill(w, (size_t)oc * k);
    fill(r, ny);
    be->ops->conv_fwd(be, n, g, oc, w, x, y, ws);
    for (int s = 0; s < n; s++)
      for (int o = 0; o < oc; o++)
        for (int p = 0; p < plane; p++) {
          double want = conv_ref(g, oc, w, x, s, o, p / g->ow, p % g->ow);
          float got = y[((size_t)s * oc + o) * plane + p];
          if (fabs(got - want) > 1e-5 * (1.0 + k))
            fail_msg("conv_fwd case %zu: y[%d][%d][%d] = %f, reference %f", ci, s, o, p, got,
                     want);
          /* The gradients of sum(y * r), scattered from this output. */
          double rv = r[((size_t)s * oc + o) * plane + p];
          for (int c = 0; c < g->c; c++)
            for (int ki = 0; ki < g->kh; ki++)
              for (int kj = 0; kj < g->kw; kj++) {
                int iy = (p / g->ow) * g->stride - g->pad + ki;
                int ix = (p % g->ow) * g->stride - g->pad + kj;
                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)
                  continue;
                size_t wi = (size_t)((o * g->c + c) * g->kh + ki) * g->kw + kj;
                size_t xi = (((size_t)s * g->c + c) * g->h + iy) * g->w + ix;
                dw_ref[wi] += rv * x[xi];
                dx_ref[xi] += rv * w[wi];
              }
        }
    /* dw and dx are overwritten, not added to. */
    for (size_t i = 0; i < nx; i++)
      dx[i] = 99.0f;
    for (size_t i = 0; i < (size_t)oc * k; i++)
      dw[i] = 99.0f;
    be->ops->conv_bwd(be, n, g, oc, w, x, r, dw, dx, ws);
    for (size_t i = 0; i < (size_t)oc * k; i++)
      if (fabs(dw[i] - dw_ref[i]) > 1e-5 * (1.0 + (double)n * plane))
        fail_msg("conv_bwd case %zu: dw[%zu] = %f, reference %f", ci, i, dw[i], dw_ref[i]);
    for (size_t i = 0; i < nx; i++)
      if (fabs(dx[i] - dx_ref[i]) > 1e-5 * (1.0 + oc * k))
        fail_msg("conv_bwd case %zu: dx[%zu] = %f, reference %f", ci, i, dx[i], dx_ref[i]);
    /* Without dx (a first layer): the same dw, dx untouched. */
    for (size_t i = 0; i < (size_t)oc * k; i++)
      dw[i] = 99.0f;
    for (size_t i = 0; i < nx; i++)
      dx[i] = 99.0f;
    be->ops->conv_bwd(be, n, g, oc, w, x, r, dw, NULL, ws);
    for (size_t i = 0; i < (size_t)oc * k; i++)
      if (fabs(dw[i] - dw_ref[i]) > 1e-5 * (1.0 + (double)n * plane))
        fail_msg("conv_bwd without dx, case %zu: dw[%zu] = %f, reference %f", ci, i, dw[i],
                 dw_ref[i]);
    for (size_t i = 0; i < nx; i++)
      assert_true(dx[i] == 99.0f);
    free(x);
    free(y);
    free(r);
    free(w);
    free(dw);
    free(dx);
    free(dw_ref);
    free(dx_ref);
    free(ws);
  }
  ps_backend_free(be);
}

static void test_bias_and_relu(void **state) {
  (void)state;
  ps_backend *be = ps_backend_cpu_new();
  float y[2 * 3 * 2] = {0}, bias[3] = {1, -2, 3}, db[3];
  be->ops->bias_add(be, 2, 3, 2, bias, y);
  const float want[12] = {1, 1, -2, -2, 3, 3, 1, 1, -2, -2, 3, 3};
  assert_memory_equal(y, want, sizeof want);
  be->ops->bias_grad(be, 2, 3, 2, y, db);
  assert_true(db[0] == 4 && db[1] == -8 && db[2] == 12);
  float d1[6] = {0};
  be->ops->bias_add(be, 2, 3, 1, bias, d1);
  be->ops->bias_grad(be, 2, 3, 1, d1, db);
  assert_true(db[0] == 2 && db[1] == -4 && db[2] == 6);
  float r[4] = {-1, 2, 0, 3}, dr[4], g[4] = {5, 6, 7, 8};
  be->ops->relu_fwd(be, 4, r, r);
  assert_true(r[0] == 0 && r[1] == 2 && r[2] == 0 && r[3] == 3);
  be->ops->relu_bwd(be, 4, r, g, dr);
  assert_true(dr[0] == 0 && dr[1] == 6 && dr[2] == 0 && dr[3] == 8);
  ps_backend_free(be);
}

static void test_maxpool(void **state) {
  (void)state;
  ps_backend *be = ps_backend_cpu_new();
  ps_conv_geom g = {.c = 1, .h = 4, .w = 4, .kh = 2, .kw = 2, .stride = 2, .oh = 2, .ow = 2};
  float x[16] = {1, 2, 0, 0, 3, 4, 0, 9, -1, -2, 5, 5, -3, -4, 5, 6};
  float y[4], dx[16], dy[4] = {1, 2, 3, 4};
  int32_t idx[4];
  be->ops->maxpool_fwd(be, 1, &g, x, y, idx);
  assert_true(y[0] == 4 && y[1] == 9 && y[2] == -1 && y[3] == 6);
  be->ops->maxpool_bwd(be, 1, &g, idx, dy, dx);
  float want[16] = {0, 0, 0, 0, 0, 1, 0, 2, 3, 0, 0, 0, 0, 0, 0, 4};
  assert_memory_equal(dx, want, sizeof want);
  ps_backend_free(be);
}

/* A block of columns into another matrix's columns; the rest of dst as it
 * was. */
static void test_copy2d(void **state) {
  (void)state;
  ps_backend *be = ps_backend_cpu_new();
  enum { ROWS = 5, SRC = 7, DST = 11, WIDTH = 4, AT = 3 };
  float src[ROWS * SRC], dst[ROWS * DST], before[ROWS * DST];
  fill(src, ROWS * SRC);
  fill(dst, ROWS * DST);
  memcpy(before, dst, sizeof dst);
  be->ops->copy2d(be, ROWS, WIDTH, dst + AT, DST, src + 2, SRC);
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < DST; j++) {
      float want = j >= AT && j < AT + WIDTH ? src[r * SRC + 2 + j - AT] : before[r * DST + j];
      assert_true(dst[r * DST + j] == want);
    }
  memcpy(before, dst, sizeof dst);
  be->ops->copy2d(be, 0, WIDTH, dst, DST, src, SRC);  /* no rows: nothing */
  assert_memory_equal(dst, before, sizeof dst);
  ps_backend_free(be);
}

int main(void) {
  ps_rng_seed(&rng, 7);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_conv),
      cmocka_unit_test(test_bias_and_relu),
      cmocka_unit_test(test_maxpool),
      cmocka_unit_test(test_copy2d),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
