/* The CUDA backend against the CPU backend, as ggml's test-backend-ops checks
 * its backends: every op on random inputs of several shapes, odd ones
 * included, run on both and compared; then whole forward and backward
 * passes of the mlp and the cnn, ps_compute on both devices, and the
 * finite-difference gradient checks of test_model.c run on the GPU.  Built
 * by make CUDA=1 (make cuda-check, which make test runs); where no GPU
 * answers (no NVIDIA device at all) it prints "skip: test_backend_cuda: no GPU
 * (...)" and exits 77; with a device present, a CUDA error fails.
 *
 * Errors are measured as ggml does, by the normalized mean squared error
 * NMSE = sum (gpu - cpu)^2 / sum cpu^2, against these bars: */
#define NMSE_SAME 1e-12   /* the kernel does the CPU's float ops in the CPU's order:
                             add, bias_add, relu, im2col, col2im, max-pool, dropout
                             (expected 0; the bar only forgives a contracted op) */
#define NMSE_SUM 1e-10    /* sums in another order: bias_grad; nll's dlogits (the
                             GPU's double exp and log differ in the last bits) */
#define NMSE_GEMM 1e-8    /* cuBLAS's sgemm against OpenBLAS's: other blocking, other
                             order, FP32 throughout (no TF32) */
#define NMSE_LOGITS 1e-8  /* a whole forward pass: gemms and sums stacked */
#define NMSE_GRAD 1e-5    /* a whole backward pass, per variable: besides the order
                             of sums, an activation within float noise of a relu's
                             kink or a max-pool tie may switch, moving one value's
                             gradient (~1e-3 of a layer's NMSE, rarely) */
/* Dropout masks, max-pool argmax indices and the count of correct
 * predictions must be equal. */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/gradcheck.h"

#include "common/parse.h"
#include "common/rng.h"
#include "nn/backend.h"
#include "nn/compute.h"
#include "nn/model.h"
#include "tests/gpu/gpu_present.h"

static ps_backend *cpu, *gpu;
static ps_rng rng;

/* ------------------------------------------------------------- helpers */

static void fill(float *p, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++)
    p[i] = lo + (hi - lo) * (float)ps_rng_uniform(&rng);
}

static void *host(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  assert_non_null(p);
  return p;
}

/* A device copy of bytes of host memory. */
static void *up(const void *h, size_t bytes) {
  void *d = gpu->ops->alloc(gpu, bytes);
  assert_non_null(d);
  gpu->ops->to_device(gpu, d, h, bytes);
  return d;
}

/* A host copy of bytes of device memory (malloc'd). */
static void *down(const void *d, size_t bytes) {
  void *h = host(bytes);
  gpu->ops->to_host(gpu, h, d, bytes);
  return h;
}

static void gfree(void *d) { gpu->ops->free(gpu, d); }

static void expect_close(const char *what, const float *got, const float *want, size_t n,
                         double bar) {
  double err = 0.0, ref = 0.0, worst = -1.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - (double)want[i];
    err += d * d;
    ref += (double)want[i] * want[i];
    if (!(fabs(d) <= worst)) {
      worst = fabs(d);
      at = i;
    }
  }
  double nmse = ref > 0.0 ? err / ref : err;
  if (!(nmse <= bar))
    fail_msg("%s: NMSE %.3g above %.0e (worst [%zu]: gpu %.9g, cpu %.9g)", what, nmse, bar, at,
             n ? got[at] : 0.0f, n ? want[at] : 0.0f);
}

/* ----------------------------------------------------------------- ops */

static void test_gemm(void **state) {
  (void)state;
  /* m x n x k: the degenerate, odd sizes, the mlp's first layer, the cnn's
   * conv2 and a backward shape. */
  const int sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {128, 784, 100}, {64, 576, 288}, {100, 128, 784}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int beta_zero = 0; beta_zero < 2; beta_zero++) {
          int m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
          int lda = ta ? m : k, ldb = tb ? k : n;
          float beta = beta_zero ? 0.0f : 0.25f;
          size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
          float *a = host(na * 4), *b = host(nb * 4), *c = host(nc * 4);
          fill(a, na, -1, 1);
          fill(b, nb, -1, 1);
          fill(c, nc, -1, 1);
          float *da = up(a, na * 4), *db = up(b, nb * 4), *dc = up(c, nc * 4);
          cpu->ops->gemm(cpu, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, beta, c, n);
          gpu->ops->gemm(gpu, ta, tb, m, n, k, 0.5f, da, lda, db, ldb, beta, dc, n);
          float *got = down(dc, nc * 4);
          char what[96];
          snprintf(what, sizeof what, "gemm %dx%dx%d ta=%d tb=%d beta=%g", m, n, k, ta, tb, beta);
          expect_close(what, got, c, nc, NMSE_GEMM);
          free(got);
          free(a);
          free(b);
          free(c);
          gfree(da);
          gfree(db);
          gfree(dc);
        }
}

static void test_elementwise(void **state) {
  (void)state;
  const size_t sizes[] = {1, 1000, (1u << 20) + 3};
  for (size_t s = 0; s < 3; s++) {
    size_t n = sizes[s], bytes = n * sizeof(float);
    float *x = host(bytes), *y = host(bytes), *g = host(bytes), *r = host(bytes);
    fill(x, n, -1, 1);
    fill(y, n, -1, 1);
    fill(g, n, -1, 1);
    x[0] = 0.0f;  /* relu's kink itself */
    float *dx = up(x, bytes), *dy = up(y, bytes), *dg = up(g, bytes), *dr = up(r, bytes);
    cpu->ops->add(cpu, n, x, y);
    gpu->ops->add(gpu, n, dx, dy);
    float *got = down(dy, bytes);
    expect_close("add", got, y, n, NMSE_SAME);
    free(got);
    cpu->ops->relu_fwd(cpu, n, x, r);
    gpu->ops->relu_fwd(gpu, n, dx, dr);
    got = down(dr, bytes);
    expect_close("relu_fwd", got, r, n, NMSE_SAME);
    free(got);
    cpu->ops->relu_bwd(cpu, n, r, g, y);
    gpu->ops->relu_bwd(gpu, n, dr, dg, dy);
    got = down(dy, bytes);
    expect_close("relu_bwd", got, y, n, NMSE_SAME);
    free(got);
    gpu->ops->copy(gpu, dy, dx, bytes);
    got = down(dy, bytes);
    assert_memory_equal(got, x, bytes);
    free(got);
    gpu->ops->zero(gpu, dy, n);
    got = down(dy, bytes);
    for (size_t i = 0; i < n; i++)
      assert_true(got[i] == 0.0f);
    free(got);
    free(x);
    free(y);
    free(g);
    free(r);
    gfree(dx);
    gfree(dy);
    gfree(dg);
    gfree(dr);
  }
}

static void test_bias(void **state) {
  (void)state;
  /* n x c x inner: a single value, odd sizes, the cnn's conv1 and a wide
   * dense layer. */
  const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {128, 32, 676}, {128, 4096, 1}, {5, 3, 1}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], c = shapes[s][1], inner = shapes[s][2];
    size_t ny = (size_t)n * c * inner;
    float *y = host(ny * 4), *bias = host((size_t)c * 4), *db = host((size_t)c * 4);
    fill(y, ny, -1, 1);
    fill(bias, (size_t)c, -1, 1);
    float *dy = up(y, ny * 4), *dbias = up(bias, (size_t)c * 4), *ddb = up(db, (size_t)c * 4);
    cpu->ops->bias_add(cpu, n, c, inner, bias, y);
    gpu->ops->bias_add(gpu, n, c, inner, dbias, dy);
    float *got = down(dy, ny * 4);
    expect_close("bias_add", got, y, ny, NMSE_SAME);
    free(got);
    cpu->ops->bias_grad(cpu, n, c, inner, y, db);
    gpu->ops->bias_grad(gpu, n, c, inner, dy, ddb);
    got = down(ddb, (size_t)c * 4);
    expect_close("bias_grad", got, db, (size_t)c, NMSE_SUM);
    free(got);
    free(y);
    free(bias);
    free(db);
    gfree(dy);
    gfree(dbias);
    gfree(ddb);
  }
}

static ps_conv_geom geom(int c, int h, int w, int kh, int kw, int stride, int pad) {
  ps_conv_geom g = {.c = c, .h = h, .w = w, .kh = kh, .kw = kw, .stride = stride, .pad = pad};
  g.oh = (h + 2 * pad - kh) / stride + 1;
  g.ow = (w + 2 * pad - kw) / stride + 1;
  return g;
}

static void test_im2col(void **state) {
  (void)state;
  /* The cnn's two convolutions, stride 2 with padding 1, a non-square
   * window and odd planes. */
  const ps_conv_geom geoms[] = {geom(1, 28, 28, 3, 3, 1, 0), geom(32, 26, 26, 3, 3, 1, 0),
                                geom(3, 7, 6, 3, 2, 2, 1), geom(5, 9, 11, 3, 3, 2, 1),
                                geom(2, 5, 4, 3, 3, 1, 1)};
  for (size_t i = 0; i < sizeof geoms / sizeof geoms[0]; i++) {
    const ps_conv_geom *g = &geoms[i];
    size_t nx = (size_t)g->c * g->h * g->w, ncol = (size_t)g->c * g->kh * g->kw * g->oh * g->ow;
    float *x = host(nx * 4), *col = host(ncol * 4), *dx = host(nx * 4);
    fill(x, nx, -1, 1);
    float *gx = up(x, nx * 4), *gcol = gpu->ops->alloc(gpu, ncol * 4);
    float *gdx = gpu->ops->alloc(gpu, nx * 4);
    cpu->ops->im2col(cpu, g, x, col);
    gpu->ops->im2col(gpu, g, gx, gcol);
    float *got = down(gcol, ncol * 4);
    char what[96];
    snprintf(what, sizeof what, "im2col c%d %dx%d k%dx%d s%d p%d", g->c, g->h, g->w, g->kh,
             g->kw, g->stride, g->pad);
    expect_close(what, got, col, ncol, NMSE_SAME);
    free(got);
    /* col2im of a random gradient, not of col: every entry distinct. */
    fill(col, ncol, -1, 1);
    gpu->ops->to_device(gpu, gcol, col, ncol * 4);
    cpu->ops->col2im(cpu, g, col, dx);
    gpu->ops->col2im(gpu, g, gcol, gdx);
    got = down(gdx, nx * 4);
    snprintf(what, sizeof what, "col2im c%d %dx%d k%dx%d s%d p%d", g->c, g->h, g->w, g->kh,
             g->kw, g->stride, g->pad);
    expect_close(what, got, dx, nx, NMSE_SAME);
    free(got);
    free(x);
    free(col);
    free(dx);
    gfree(gx);
    gfree(gcol);
    gfree(gdx);
  }
}

static void test_maxpool(void **state) {
  (void)state;
  enum { N = 5 };
  /* 2x2 stride 2 (the cnn's, and on an odd plane), 3x3 stride 2 whose
   * windows overlap, with and without padding. */
  const ps_conv_geom geoms[] = {geom(64, 24, 24, 2, 2, 2, 0), geom(3, 7, 7, 2, 2, 2, 0),
                                geom(3, 9, 9, 3, 3, 2, 0), geom(4, 8, 7, 3, 3, 2, 1)};
  for (size_t i = 0; i < sizeof geoms / sizeof geoms[0]; i++) {
    const ps_conv_geom *g = &geoms[i];
    size_t nx = (size_t)N * g->c * g->h * g->w, ny = (size_t)N * g->c * g->oh * g->ow;
    float *x = host(nx * 4), *y = host(ny * 4), *dy = host(ny * 4), *dx = host(nx * 4);
    int32_t *idx = host(ny * 4);
    fill(x, nx, -1, 1);
    fill(dy, ny, -1, 1);
    /* Ties: the first maximum must win on both. */
    for (size_t j = 0; j + 1 < nx; j += 7)
      x[j + 1] = x[j];
    float *gx = up(x, nx * 4), *gdy = up(dy, ny * 4);
    float *gy = gpu->ops->alloc(gpu, ny * 4), *gdx = gpu->ops->alloc(gpu, nx * 4);
    int32_t *gidx = gpu->ops->alloc(gpu, ny * 4);
    cpu->ops->maxpool_fwd(cpu, N, g, x, y, idx);
    gpu->ops->maxpool_fwd(gpu, N, g, gx, gy, gidx);
    float *got = down(gy, ny * 4);
    int32_t *got_idx = down(gidx, ny * 4);
    char what[96];
    snprintf(what, sizeof what, "maxpool c%d %dx%d k%d s%d p%d", g->c, g->h, g->w, g->kh,
             g->stride, g->pad);
    expect_close(what, got, y, ny, NMSE_SAME);
    assert_memory_equal(got_idx, idx, ny * 4);
    free(got);
    cpu->ops->maxpool_bwd(cpu, N, g, idx, dy, dx);
    gpu->ops->maxpool_bwd(gpu, N, g, gidx, gdy, gdx);
    got = down(gdx, nx * 4);
    expect_close(what, got, dx, nx, NMSE_SAME);
    free(got);
    free(got_idx);
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(idx);
    gfree(gx);
    gfree(gdy);
    gfree(gy);
    gfree(gdx);
    gfree(gidx);
  }
}

static void test_dropout(void **state) {
  (void)state;
  /* n, values per sample, group, p: single values (more groups than the
   * kernel decides per round), the cnn's channels, p = 0 and p = 1. */
  const struct { int n; size_t per, group; float p; } cases[] = {
      {7, 5408, 1, 0.5f}, {5, 32 * 26 * 26, 676, 0.5f}, {3, 64 * 24 * 24, 576, 0.25f},
      {4, 10, 1, 0.0f},   {2, 8, 2, 1.0f},              {1, 1, 1, 0.3f}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t count = (size_t)cases[i].n * cases[i].per;
    float *x = host(count * 4), *y = host(count * 4), *dy = host(count * 4), *dx = host(count * 4);
    uint8_t *mask = host(count);
    fill(x, count, -1, 1);
    fill(dy, count, -1, 1);
    float *gx = up(x, count * 4), *gdy = up(dy, count * 4);
    float *gy = gpu->ops->alloc(gpu, count * 4), *gdx = gpu->ops->alloc(gpu, count * 4);
    uint8_t *gmask = gpu->ops->alloc(gpu, count);
    uint64_t seed = 0x5eed + i, first = 1000 * i;
    cpu->ops->dropout_fwd(cpu, cases[i].n, cases[i].per, cases[i].group, cases[i].p, seed, first,
                          x, y, mask);
    gpu->ops->dropout_fwd(gpu, cases[i].n, cases[i].per, cases[i].group, cases[i].p, seed, first,
                          gx, gy, gmask);
    uint8_t *got_mask = down(gmask, count);
    assert_memory_equal(got_mask, mask, count);
    float *got = down(gy, count * 4);
    expect_close("dropout_fwd", got, y, count, NMSE_SAME);
    free(got);
    cpu->ops->dropout_bwd(cpu, count, cases[i].p, mask, dy, dx);
    gpu->ops->dropout_bwd(gpu, count, cases[i].p, gmask, gdy, gdx);
    got = down(gdx, count * 4);
    expect_close("dropout_bwd", got, dx, count, NMSE_SAME);
    free(got);
    free(got_mask);
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(mask);
    gfree(gx);
    gfree(gdy);
    gfree(gy);
    gfree(gdx);
    gfree(gmask);
  }
}

static void test_nll(void **state) {
  (void)state;
  const int shapes[][2] = {{1, 10}, {128, 10}, {77, 37}, {2000, 10}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], k = shapes[s][1];
    size_t nz = (size_t)n * k;
    float *z = host(nz * 4), *d = host(nz * 4);
    uint8_t *labels = host((size_t)n);
    fill(z, nz, -4, 4);
    for (int i = 0; i < n; i++)
      labels[i] = (uint8_t)ps_rng_below(&rng, (uint64_t)k);
    float *gz = up(z, nz * 4), *gd = gpu->ops->alloc(gpu, nz * 4);
    for (int with_grad = 0; with_grad < 2; with_grad++) {
      size_t right_cpu = 0, right_gpu = 0;
      float scale = 1.0f / (float)n;
      double lc = cpu->ops->nll(cpu, n, k, z, labels, scale, with_grad ? d : NULL, &right_cpu);
      double lg = gpu->ops->nll(gpu, n, k, gz, labels, scale, with_grad ? gd : NULL, &right_gpu);
      if (!(fabs(lg - lc) <= 1e-9 * fabs(lc) + 1e-12))
        fail_msg("nll %dx%d: loss gpu %.12g, cpu %.12g", n, k, lg, lc);
      assert_int_equal(right_gpu, right_cpu);
      if (with_grad) {
        float *got = down(gd, nz * 4);
        expect_close("nll dlogits", got, d, nz, NMSE_SUM);
        free(got);
      }
    }
    free(z);
    free(d);
    free(labels);
    gfree(gz);
    gfree(gd);
  }
}

/* A freed block comes back for a request of its size (the cache), and
 * pinned host memory is there to have. */
static void test_memory(void **state) {
  (void)state;
  void *a = gpu->ops->alloc(gpu, 1000000);
  assert_non_null(a);
  gpu->ops->free(gpu, a);
  void *b = gpu->ops->alloc(gpu, 999000);
  assert_ptr_equal(a, b);
  gpu->ops->free(gpu, b);
  void *h = gpu->ops->host_alloc(gpu, 1 << 20);
  assert_non_null(h);
  gpu->ops->host_free(gpu, h);
}

/* -------------------------------------------------------------- models */

/* One forward (training: dropout on) and backward pass of n samples on each
 * backend's workspace: logits, loss and every variable's gradient. */
static void model_passes(const char *name, const char *hidden, int n) {
  ps_model m;
  gradcheck_build(name, hidden, &m);
  size_t total = m.vars.total, nx = (size_t)n * m.in_size;
  size_t nlog = (size_t)n * (size_t)m.spec.classes;
  float *params = host(total * 4), *x = host(nx * 4), *grad = host(total * 4);
  uint8_t *y = host((size_t)n);
  ps_vartable_init_arena(&m.vars, 5, params);
  fill(x, nx, -1, 2);
  for (int i = 0; i < n; i++)
    y[i] = (uint8_t)ps_rng_below(&rng, 10);
  ps_model_ws wc, wg;
  assert_int_equal(ps_model_ws_init(&wc, &m, cpu, n), 0);
  assert_int_equal(ps_model_ws_init(&wg, &m, gpu, n), 0);
  float *gp = up(params, total * 4), *gx = up(x, nx * 4), *gg = gpu->ops->alloc(gpu, total * 4);
  for (int train = 0; train < 2; train++) {
    const float *lc = ps_model_forward(&m, &wc, params, x, n, train, 77, 123);
    const float *lg = ps_model_forward(&m, &wg, gp, gx, n, train, 77, 123);
    float *got = down(lg, nlog * 4);
    char what[96];
    snprintf(what, sizeof what, "%s logits (train %d)", name, train);
    expect_close(what, got, lc, nlog, NMSE_LOGITS);
    free(got);
  }
  size_t right_c = 0, right_g = 0;
  double loss_c = ps_model_backward(&m, &wc, params, x, y, n, 1.0f / n, grad, &right_c);
  double loss_g = ps_model_backward(&m, &wg, gp, gx, y, n, 1.0f / n, gg, &right_g);
  if (!(fabs(loss_g - loss_c) <= 1e-6 * fabs(loss_c)))
    fail_msg("%s: loss gpu %.9g, cpu %.9g", name, loss_g, loss_c);
  assert_int_equal(right_g, right_c);
  float *got = down(gg, total * 4);
  for (int v = 0; v < m.vars.n; v++) {
    const ps_var *var = &m.vars.vars[v];
    char what[96];
    snprintf(what, sizeof what, "%s gradient of %s", name, var->name);
    expect_close(what, got + var->offset, grad + var->offset, var->count, NMSE_GRAD);
  }
  free(got);
  gfree(gp);
  gfree(gx);
  gfree(gg);
  ps_model_ws_close(&wc);
  ps_model_ws_close(&wg);
  free(params);
  free(x);
  free(grad);
  free(y);
  ps_model_close(&m);
}

static void test_mlp_passes(void **state) {
  (void)state;
  model_passes("mlp", NULL, 64);
  model_passes("mlp", "4096,4096", 7);
}

static void test_cnn_passes(void **state) {
  (void)state;
  model_passes("cnn", NULL, 16);
}

/* ps_compute on the GPU (its copies in and out, pinned or not) against 2
 * CPU threads: the step's gradient and loss, and an evaluation in chunks. */
static void test_compute(void **state) {
  (void)state;
  enum { N = 37 };
  ps_model m;
  gradcheck_build("cnn", NULL, &m);
  ps_errbuf eb = {0};
  ps_compute *cc = ps_compute_new_on(&m, PS_DEVICE_CPU, 2, N, &eb);
  ps_compute *cg = ps_compute_new_on(&m, 0, 2, N, &eb);
  assert_non_null(cc);
  if (cg == NULL)
    fail_msg("%s", eb.msg);
  assert_int_equal(ps_compute_threads(cg), 1);
  size_t total = m.vars.total, nx = 3 * N * m.in_size;
  float *params = ps_compute_host_alloc(cg, total * 4), *gg = ps_compute_host_alloc(cg, total * 4);
  float *x = ps_compute_host_alloc(cg, nx * 4), *gc = host(total * 4);
  uint8_t y[3 * N];
  assert_non_null(params);
  assert_non_null(gg);
  assert_non_null(x);
  ps_vartable_init_arena(&m.vars, 8, params);
  fill(x, nx, -1, 2);
  for (int i = 0; i < 3 * N; i++)
    y[i] = (uint8_t)ps_rng_below(&rng, 10);
  for (int step = 0; step < 2; step++) {
    size_t rc = 0, rg = 0;
    double lc = ps_compute_grad(cc, params, x, y, N, 3, 1000 * step, gc, &rc);
    double lg = ps_compute_grad(cg, params, x, y, N, 3, 1000 * step, gg, &rg);
    if (!(fabs(lg - lc) <= 1e-6 * fabs(lc)))
      fail_msg("compute step %d: loss gpu %.9g, cpu %.9g", step, lg, lc);
    assert_int_equal(rg, rc);
    for (int v = 0; v < m.vars.n; v++)
      expect_close(m.vars.vars[v].name, gg + m.vars.vars[v].offset, gc + m.vars.vars[v].offset,
                   m.vars.vars[v].count, NMSE_GRAD);
  }
  size_t rc = 0, rg = 0;
  double ec = ps_compute_eval(cc, params, x, y, 3 * N - 5, &rc);
  double eg = ps_compute_eval(cg, params, x, y, 3 * N - 5, &rg);
  if (!(fabs(eg - ec) <= 1e-6 * fabs(ec)))
    fail_msg("compute eval: loss gpu %.9g, cpu %.9g", eg, ec);
  assert_int_equal(rg, rc);
  ps_compute_host_free(cg, params);
  ps_compute_host_free(cg, gg);
  ps_compute_host_free(cg, x);
  free(gc);
  ps_compute_free(cc);
  ps_compute_free(cg);
  ps_model_close(&m);
}

/* test_model.c's finite-difference checks, on the GPU. */
static void test_mlp_gradcheck(void **state) {
  (void)state;
  gradcheck_params("mlp", "16,8", 0, 300, 1e-3f);
}

static void test_cnn_directional(void **state) {
  (void)state;
  gradcheck_directional("cnn", 0);
}

int main(void) {
  ps_errbuf eb = {0};
  if (ps_backend_cuda_devices(&eb) < 0) {
    if (gpu_present()) {
      fprintf(stderr, "test_backend_cuda: an NVIDIA device is present but CUDA cannot use it: %s\n",
              eb.msg);
      return 1;
    }
    printf("skip: test_backend_cuda: no GPU (%s)\n", eb.msg);
    return 77;
  }
  cpu = ps_backend_cpu_new();
  gpu = ps_backend_cuda_new(0, &eb);
  if (cpu == NULL || gpu == NULL) {
    fprintf(stderr, "test_backend_cuda: %s\n", gpu == NULL ? eb.msg : "out of memory");
    return 1;
  }
  printf("gpu: %s\ncpu: %s\n", gpu->ops->describe(gpu), cpu->ops->describe(cpu));
  ps_rng_seed(&rng, 2024);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm),         cmocka_unit_test(test_elementwise),
      cmocka_unit_test(test_bias),         cmocka_unit_test(test_im2col),
      cmocka_unit_test(test_maxpool),      cmocka_unit_test(test_dropout),
      cmocka_unit_test(test_nll),          cmocka_unit_test(test_memory),
      cmocka_unit_test(test_mlp_passes),   cmocka_unit_test(test_cnn_passes),
      cmocka_unit_test(test_compute),      cmocka_unit_test(test_mlp_gradcheck),
      cmocka_unit_test(test_cnn_directional),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  ps_backend_free(gpu);
  ps_backend_free(cpu);
  return failed;
}
