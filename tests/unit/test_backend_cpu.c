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

/* col2im is im2col's adjoint: <im2col(x), c> == <x, col2im(c)>, and
 * im2col copies the right pixels. */
static void test_im2col(void **state) {
  (void)state;
  ps_backend *be = ps_backend_cpu_new();
  const ps_conv_geom geoms[] = {
      {.c = 2, .h = 5, .w = 4, .kh = 3, .kw = 3, .stride = 1, .pad = 0, .oh = 3, .ow = 2},
      {.c = 3, .h = 7, .w = 6, .kh = 3, .kw = 2, .stride = 2, .pad = 1, .oh = 4, .ow = 4},
  };
  for (size_t gi = 0; gi < 2; gi++) {
    const ps_conv_geom *g = &geoms[gi];
    size_t nx = (size_t)g->c * g->h * g->w, ncol = (size_t)g->c * g->kh * g->kw * g->oh * g->ow;
    float *x = malloc(nx * sizeof *x), *dx = malloc(nx * sizeof *dx);
    float *col = malloc(ncol * sizeof *col), *c = malloc(ncol * sizeof *c);
    fill(x, nx);
    fill(c, ncol);
    be->ops->im2col(be, g, x, col);
    be->ops->col2im(be, g, c, dx);
    double lhs = 0.0, rhs = 0.0;
    for (size_t i = 0; i < ncol; i++)
      lhs += (double)col[i] * c[i];
    for (size_t i = 0; i < nx; i++)
      rhs += (double)x[i] * dx[i];
    assert_true(fabs(lhs - rhs) < 1e-4);
    for (int ch = 0; ch < g->c; ch++)
      for (int ki = 0; ki < g->kh; ki++)
        for (int kj = 0; kj < g->kw; kj++)
          for (int oy = 0; oy < g->oh; oy++)
            for (int ox = 0; ox < g->ow; ox++) {
              int iy = oy * g->stride - g->pad + ki, ix = ox * g->stride - g->pad + kj;
              float want = (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)
                               ? 0.0f
                               : x[(ch * g->h + iy) * g->w + ix];
              size_t row = (size_t)(ch * g->kh + ki) * g->kw + kj;
              assert_true(col[row * g->oh * g->ow + (size_t)oy * g->ow + ox] == want);
            }
    free(x);
    free(dx);
    free(col);
    free(c);
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

int main(void) {
  ps_rng_seed(&rng, 7);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_im2col),
      cmocka_unit_test(test_bias_and_relu),
      cmocka_unit_test(test_maxpool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
