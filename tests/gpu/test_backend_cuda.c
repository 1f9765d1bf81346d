/* The CUDA backend against the CPU backend, as ggml's test-backend-ops checks
 * its backends: every op on random inputs of several shapes, odd ones
 * included, run on both and compared; then whole forward and backward
 * passes of the mlp and the cnn, ps_compute on both devices (a sparse
 * model's embedding input and its gradient too), and the
 * finite-difference gradient checks of test_model.c run on the GPU.  Built
 * by make CUDA=1 (make cuda-check, which make test runs); where no GPU
 * answers (no NVIDIA device at all) it prints "skip: test_backend_cuda: no GPU
 * (...)" and exits 77; with a device present, or with PS_REQUIRE_GPU=1, that
 * fails instead, as any other CUDA error does (tests/gpu/gpu_present.h).
 * PS_CUDA_DEVICE=N runs it on GPU N (default 0): scripts/gpu-check plants a
 * device that is not there and expects a failure.
 *
 * The tests keep backend.h's ordering rule: host memory handed to
 * to_device stays unchanged until the next to_host (or nll) returns, so
 * each runs the GPU's op and reads its result back before the CPU's op
 * overwrites the host copies.
 *
 * Errors are measured as ggml does, by the normalized mean squared error
 * NMSE = sum (gpu - cpu)^2 / sum cpu^2, against these bars: */
#define NMSE_SAME 1e-12   /* the kernel does the CPU's float ops in the CPU's order:
                             add, bias_add, relu, im2col, col2im (a convolution
                             with identity weights), max-pool, dropout, the
                             optimizers (expected 0; the bar only forgives a
                             contracted op) */
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
#include <sys/resource.h>

#include "tests/unit/gradcheck.h"

#include "common/parse.h"
#include "common/rng.h"
#include "common/timeutil.h"
#include "nn/backend.h"
#include "nn/compute.h"
#include "nn/model.h"
#include "tests/gpu/gpu_present.h"

static ps_backend *cpu, *gpu;
static int device;  /* PS_CUDA_DEVICE, default 0 */
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

/* One gemm on both backends, C = 0.5 op(A) op(B) + beta C, with each
 * leading dimension `pad` above its minimum; the whole of C, padding
 * included, must match (the padding untouched on both). */
static void gemm_case(int m, int n, int k, int ta, int tb, float beta, int pad) {
  int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
  size_t na = (size_t)(ta ? k : m) * lda, nb = (size_t)(tb ? n : k) * ldb, nc = (size_t)m * ldc;
  float *a = host(na * 4), *b = host(nb * 4), *c = host(nc * 4);
  fill(a, na, -1, 1);
  fill(b, nb, -1, 1);
  fill(c, nc, -1, 1);
  float *da = up(a, na * 4), *db = up(b, nb * 4), *dc = up(c, nc * 4);
  gpu->ops->gemm(gpu, ta, tb, m, n, k, 0.5f, da, lda, db, ldb, beta, dc, ldc);
  float *got = down(dc, nc * 4);
  cpu->ops->gemm(cpu, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, beta, c, ldc);
  char what[128];
  snprintf(what, sizeof what, "gemm %dx%dx%d ta=%d tb=%d beta=%g lda %d ldb %d ldc %d", m, n, k,
           ta, tb, beta, lda, ldb, ldc);
  expect_close(what, got, c, nc, NMSE_GEMM);
  free(got);
  free(a);
  free(b);
  free(c);
  gfree(da);
  gfree(db);
  gfree(dc);
}

static void test_gemm(void **state) {
  (void)state;
  /* m x n x k, every transpose: the degenerate, odd sizes, the mlp's first
   * layer, the cnn's conv2 and a backward shape. */
  const int sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {128, 784, 100}, {64, 576, 288}, {100, 128, 784}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int beta_zero = 0; beta_zero < 2; beta_zero++)
          gemm_case(sizes[s][0], sizes[s][1], sizes[s][2], ta, tb, beta_zero ? 0.0f : 0.25f, 0);
  /* The large shapes of a training step at batch 128, with the transposes
   * the models use: the cnn's fc1 (K = 9216) forward, weight and input
   * gradient; the 4096-wide mlp's hidden layer the same. */
  const int steps[][5] = {{128, 128, 9216, 0, 1}, {128, 9216, 128, 1, 0}, {128, 9216, 128, 0, 0},
                          {128, 4096, 4096, 0, 1}, {4096, 4096, 128, 1, 0},
                          {128, 4096, 4096, 0, 0}};
  for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++)
    gemm_case(steps[s][0], steps[s][1], steps[s][2], steps[s][3], steps[s][4], 0.0f, 0);
}

/* Leading dimensions above the minimum (a gemm on a block of a larger
 * matrix), every transpose, beta 0 and not. */
static void test_gemm_ld(void **state) {
  (void)state;
  const int sizes[][3] = {{7, 13, 5}, {64, 576, 288}, {33, 10, 128}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        gemm_case(sizes[s][0], sizes[s][1], sizes[s][2], ta, tb, 0.0f, 3);
        gemm_case(sizes[s][0], sizes[s][1], sizes[s][2], ta, tb, 0.25f, 17);
      }
}

/* More values than one launch's grid covers (the kernels' blocks are
 * capped at 65536 of 256 threads: each thread must loop). */
#define PAST_ONE_GRID ((size_t)65536 * 256 + 4099)

static void test_elementwise(void **state) {
  (void)state;
  const size_t sizes[] = {1, 1000, (1u << 20) + 3, PAST_ONE_GRID};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s], bytes = n * sizeof(float);
    float *x = host(bytes), *y = host(bytes), *g = host(bytes), *r = host(bytes);
    fill(x, n, -1, 1);
    fill(y, n, -1, 1);
    fill(g, n, -1, 1);
    fill(r, n, -1, 1);
    x[0] = 0.0f;  /* relu's kink itself */
    float *dx = up(x, bytes), *dy = up(y, bytes), *dg = up(g, bytes), *dr = up(r, bytes);
    gpu->ops->add(gpu, n, dx, dy);
    float *got = down(dy, bytes);
    cpu->ops->add(cpu, n, x, y);
    expect_close("add", got, y, n, NMSE_SAME);
    free(got);
    gpu->ops->relu_fwd(gpu, n, dx, dr);
    got = down(dr, bytes);
    cpu->ops->relu_fwd(cpu, n, x, r);
    expect_close("relu_fwd", got, r, n, NMSE_SAME);
    free(got);
    gpu->ops->relu_bwd(gpu, n, dr, dg, dy);
    got = down(dy, bytes);
    cpu->ops->relu_bwd(cpu, n, r, g, y);
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
  /* ... and more values than one launch's grid covers. */
  const int shapes[][3] = {{1, 1, 1},     {3, 5, 7}, {128, 32, 676},
                           {128, 4096, 1}, {5, 3, 1}, {129, 64, 2048}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], c = shapes[s][1], inner = shapes[s][2];
    size_t ny = (size_t)n * c * inner;
    float *y = host(ny * 4), *bias = host((size_t)c * 4), *db = host((size_t)c * 4);
    fill(y, ny, -1, 1);
    fill(bias, (size_t)c, -1, 1);
    float *dy = up(y, ny * 4), *dbias = up(bias, (size_t)c * 4);
    float *ddb = gpu->ops->alloc(gpu, (size_t)c * 4);
    assert_non_null(ddb);
    gpu->ops->bias_add(gpu, n, c, inner, dbias, dy);
    float *got = down(dy, ny * 4);
    cpu->ops->bias_add(cpu, n, c, inner, bias, y);
    expect_close("bias_add", got, y, ny, NMSE_SAME);
    free(got);
    gpu->ops->bias_grad(gpu, n, c, inner, dy, ddb);
    got = down(ddb, (size_t)c * 4);
    cpu->ops->bias_grad(cpu, n, c, inner, y, db);
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

/* One run of conv_fwd and conv_bwd (with and without dx) on both backends,
 * on fresh random x and dy and on w random in [-1, 1] or, when identity,
 * the identity (oc = k): then y[s] is the im2col matrix itself and dx[s]
 * col2im of dy[s], which every gemm computes exactly, so the kernels'
 * im2col and col2im are checked to the bit. */
static void conv_case(const ps_conv_geom *g, int oc, int n, int identity) {
  const int k = g->c * g->kh * g->kw, plane = g->oh * g->ow;
  if (identity)
    oc = k;
  const size_t nx = (size_t)n * g->c * g->h * g->w, ny = (size_t)n * oc * plane;
  const size_t nw = (size_t)oc * k;
  size_t cws = cpu->ops->conv_ws(cpu, n, g, oc), gwsn = gpu->ops->conv_ws(gpu, n, g, oc);
  float *x = host(nx * 4), *w = host(nw * 4), *dy = host(ny * 4);
  float *y = host(ny * 4), *dw = host(nw * 4), *dx = host(nx * 4), *ws = host(cws * 4);
  fill(x, nx, -1, 1);
  fill(dy, ny, -1, 1);
  if (identity) {
    memset(w, 0, nw * 4);
    for (int i = 0; i < k; i++)
      w[(size_t)i * k + i] = 1.0f;
  } else {
    fill(w, nw, -1, 1);
  }
  float *gx = up(x, nx * 4), *gw = up(w, nw * 4), *gdy = up(dy, ny * 4);
  float *gy = gpu->ops->alloc(gpu, ny * 4), *gdw = gpu->ops->alloc(gpu, nw * 4);
  float *gdx = gpu->ops->alloc(gpu, nx * 4), *gws = gpu->ops->alloc(gpu, gwsn * 4);
  assert_non_null(gy);
  assert_non_null(gdw);
  assert_non_null(gdx);
  assert_non_null(gws);
  char what[160];
  int len = snprintf(what, sizeof what, "conv c%d %dx%d k%dx%d s%d p%d oc%d n%d%s", g->c, g->h,
                     g->w, g->kh, g->kw, g->stride, g->pad, oc, n, identity ? " (identity)" : "");
  const double bar = identity ? NMSE_SAME : NMSE_GEMM;

  cpu->ops->conv_fwd(cpu, n, g, oc, w, x, y, ws);
  gpu->ops->conv_fwd(gpu, n, g, oc, gw, gx, gy, gws);
  float *got = down(gy, ny * 4);
  snprintf(what + len, sizeof what - (size_t)len, ": y");
  expect_close(what, got, y, ny, bar);
  free(got);

  cpu->ops->conv_bwd(cpu, n, g, oc, w, x, dy, dw, dx, ws);
  gpu->ops->conv_bwd(gpu, n, g, oc, gw, gx, gdy, gdw, gdx, gws);
  got = down(gdw, nw * 4);
  snprintf(what + len, sizeof what - (size_t)len, ": dw");
  expect_close(what, got, dw, nw, NMSE_GEMM);
  free(got);
  got = down(gdx, nx * 4);
  snprintf(what + len, sizeof what - (size_t)len, ": dx");
  expect_close(what, got, dx, nx, bar);
  free(got);

  /* Without dx (a model's first layer): dw alone, as before. */
  gpu->ops->zero(gpu, gdw, nw);
  gpu->ops->conv_bwd(gpu, n, g, oc, gw, gx, gdy, gdw, NULL, gws);
  got = down(gdw, nw * 4);
  snprintf(what + len, sizeof what - (size_t)len, ": dw without dx");
  expect_close(what, got, dw, nw, NMSE_GEMM);
  free(got);

  free(x);
  free(w);
  free(dy);
  free(y);
  free(dw);
  free(dx);
  free(ws);
  gfree(gx);
  gfree(gw);
  gfree(gdy);
  gfree(gy);
  gfree(gdw);
  gfree(gdx);
  gfree(gws);
}

static void test_conv(void **state) {
  (void)state;
  /* The cnn's two convolutions, the strided model file's stem, stride 2
   * with padding 1, a non-square window, odd planes; one sample and many.
   * The last, 170 samples of 206,848 floats of scratch each, takes two
   * chunks on the GPU (162 and 8: backend_cuda.cu's CONV_WS_MAX), dw
   * summed over both (random weights only: with the identity's 200
   * outputs its CPU side would take seconds). */
  const struct { ps_conv_geom g; int oc, n, identity; } cases[] = {
      {geom(1, 28, 28, 3, 3, 1, 0), 32, 16, 1}, {geom(1, 28, 28, 3, 3, 1, 0), 32, 1, 1},
      {geom(32, 26, 26, 3, 3, 1, 0), 64, 9, 1}, {geom(32, 26, 26, 3, 3, 1, 0), 64, 1, 1},
      {geom(1, 28, 28, 5, 5, 2, 2), 16, 5, 1},  {geom(3, 7, 6, 3, 2, 2, 1), 5, 4, 1},
      {geom(5, 9, 11, 3, 3, 2, 1), 7, 3, 1},    {geom(2, 5, 4, 3, 3, 1, 1), 3, 1, 1},
      {geom(8, 32, 32, 5, 5, 1, 2), 2, 170, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int identity = 0; identity <= cases[i].identity; identity++)
      conv_case(&cases[i].g, cases[i].oc, cases[i].n, identity);
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
  /* n, values per sample, group, p: single values, the cnn's channels,
   * p = 0 and p = 1, groups of 3 (a word's four draws across group
   * boundaries), more values per sample than the grid's x covers at once
   * (300,000 > 1024 blocks of 256) and more samples than its y (70,000 >
   * 65,535). */
  const struct { int n; size_t per, group; float p; } cases[] = {
      {7, 5408, 1, 0.5f},  {5, 32 * 26 * 26, 676, 0.5f}, {3, 64 * 24 * 24, 576, 0.25f},
      {4, 10, 1, 0.0f},    {2, 8, 2, 1.0f},              {1, 1, 1, 0.3f},
      {300, 12, 3, 0.4f},  {2, 300000, 1, 0.5f},         {70000, 2, 1, 0.5f}};
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

/* A block of columns into another matrix's columns (an embedding_bag's
 * concatenation), the rest of dst as it was: equal to the bit. */
static void test_copy2d(void **state) {
  (void)state;
  /* rows, width, src stride, dst stride, dst column */
  const size_t cases[][5] = {{5, 4, 7, 11, 3}, {1, 1, 1, 1, 0}, {1000, 416, 416, 432, 16},
                             {257, 16, 432, 16, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    size_t rows = cases[c][0], width = cases[c][1], ss = cases[c][2], ds = cases[c][3],
           at = cases[c][4], ns = rows * ss, nd = rows * ds;
    float *src = host(ns * 4), *dst = host(nd * 4);
    fill(src, ns, -1, 1);
    fill(dst, nd, -1, 1);
    float *gs = up(src, ns * 4), *gd = up(dst, nd * 4);
    gpu->ops->copy2d(gpu, (int)rows, width, gd + at, ds, gs, ss);
    float *got = down(gd, nd * 4);
    cpu->ops->copy2d(cpu, (int)rows, width, dst + at, ds, src, ss);
    assert_memory_equal(got, dst, nd * 4);
    free(got);
    free(src);
    free(dst);
    gfree(gs);
    gfree(gd);
  }
}

static void test_nll(void **state) {
  (void)state;
  /* k = 1: the logistic loss of one logit (labels 0 and 1). */
  const int shapes[][2] = {{1, 10}, {128, 10}, {77, 37}, {2000, 10}, {1, 1}, {333, 1}, {2000, 1}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], k = shapes[s][1];
    size_t nz = (size_t)n * k;
    float *z = host(nz * 4), *d = host(nz * 4);
    uint8_t *labels = host((size_t)n);
    fill(z, nz, -4, 4);
    for (int i = 0; i < n; i++)
      labels[i] = (uint8_t)ps_rng_below(&rng, k == 1 ? 2 : (uint64_t)k);
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
 * pinned host memory is there to have.  More than the GPU has is NULL, not
 * a crash nor an abort (the CUDA backend stops on every CUDA error but out
 * of memory), and the backend goes on working after it, its cache given
 * back to the device on the way. */
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
  const size_t tib = (size_t)1 << 40;
  assert_null(gpu->ops->alloc(gpu, tib));
  assert_null(gpu->ops->alloc(gpu, SIZE_MAX));
  float v[4] = {1, 2, 3, 4}, w[4] = {0};
  float *d = up(v, sizeof v);
  gpu->ops->to_host(gpu, w, d, sizeof w);
  assert_memory_equal(w, v, sizeof v);
  gfree(d);
}

/* This program again, as a child that faults a kernel on purpose (relu
 * on an address no allocation has) with PS_CUDA_SYNC=1: it must stop,
 * naming that op.  A child, because a fault ends the CUDA context. */
static void test_fault_named(void **state) {
  (void)state;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "PS_CUDA_SYNC=1 /proc/%d/exe --fault 2>&1", (int)getpid());
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char out[4096];
  size_t len = fread(out, 1, sizeof out - 1, p);
  out[len] = '\0';
  int status = pclose(p);
  printf("child: %s", out);
  if (status == 0 || strstr(out, ": relu_fwd: cuda") == NULL ||
      strstr(out, "PS_CUDA_SYNC=1: this op faulted") == NULL)
    fail_msg("PS_CUDA_SYNC=1 and a faulting relu_fwd: exit status %d, output '%s'; expected a "
             "stop naming relu_fwd",
             status, out);
}

/* PS_CUDA_PROFILE=1 on a backend of its own: after the warm-up (two
 * waits, and a gemm shape's first call) every call is timed, behind a gate
 * that the host opens right after the launch; a gate that never opened
 * would hold each op 100 ms (cuda_profile.h), which the wall clock shows. */
static void test_profile(void **state) {
  (void)state;
  setenv("PS_CUDA_PROFILE", "1", 1);
  ps_errbuf eb = {0};
  ps_backend *p = ps_backend_cuda_new(device, &eb);
  unsetenv("PS_CUDA_PROFILE");
  if (p == NULL)
    fail_msg("%s", eb.msg);
  enum { N = 64, CALLS = 50 };
  float *a = p->ops->alloc(p, N * N * 4), *c = p->ops->alloc(p, N * N * 4), sink;
  assert_non_null(a);
  assert_non_null(c);
  p->ops->zero(p, a, N * N);
  p->ops->to_host(p, &sink, a, 4);
  p->ops->to_host(p, &sink, a, 4);
  p->ops->gemm(p, 0, 1, N, N, N, 1.0f, a, N, a, N, 0.0f, c, N); /* the shape's first call */
  p->ops->to_host(p, &sink, c, 4);
  double t0 = ps_now_s();
  for (int i = 0; i < CALLS; i++) {
    p->ops->gemm(p, 0, 1, N, N, N, 1.0f, a, N, a, N, 0.0f, c, N);
    p->ops->relu_fwd(p, N * N, c, c);
  }
  p->ops->to_host(p, &sink, c, 4);
  double secs = ps_now_s() - t0;
  unsigned long long timed = 0;
  double ms = 0.0;
  assert_int_equal(ps_backend_cuda_profile_gemm(p, N, N, N, 0, 1, &timed, &ms), 0);
  assert_int_equal(timed, CALLS);
  printf("profile: %d gemm %dx%dx%d timed, %.4f ms each on the device; %d gated calls took %.3f s\n",
         CALLS, N, N, N, ms / CALLS, 2 * CALLS, secs);
  if (!(ms > 0.0 && ms / CALLS < 1.0))
    fail_msg("profile: %llu gemm %dx%dx%d calls timed at %.6f ms in all", timed, N, N, N, ms);
  if (!(secs < 2.0))
    fail_msg("profile: %d gated calls took %.3f s: the gates did not open", 2 * CALLS, secs);
  p->ops->free(p, a);
  p->ops->free(p, c);
  ps_backend_free(p);
}

/* The child of test_fault_named. */
static int fault(void) {
  struct rlimit none = {0, 0};
  setrlimit(RLIMIT_CORE, &none); /* the abort is expected: no core file */
  ps_errbuf eb = {0};
  ps_backend *b = ps_backend_cuda_new(device, &eb);
  if (b == NULL) {
    fprintf(stderr, "fault: %s\n", eb.msg);
    return 1;
  }
  float *bogus = (float *)(uintptr_t)0x1000;
  b->ops->relu_fwd(b, 1 << 20, bogus, bogus);
  float sink;
  float *d = b->ops->alloc(b, sizeof sink);
  b->ops->to_host(b, &sink, d, sizeof sink);
  fprintf(stderr, "fault: the faulting relu_fwd went unnoticed\n");
  return 0;
}

/* The optim op on both backends, for every optimizer, with and without
 * weight decay, over three updates (fresh gradients, a schedule's changing
 * rate, t = 1, 2, 3: adam's bias corrections): weights and slots equal to
 * the bit (the GPU does optim.c's float operations, none fused).  Sizes: one
 * value, optim.c's padded tail, and, for adam with decay, more values than
 * one launch's grid covers (65,536 blocks of 256). */
static void test_optim(void **state) {
  (void)state;
  const char *names[] = {"sgd", "momentum", "nesterov", "adagrad", "adam"};
  const size_t sizes[] = {1, 1000 + 7, (1u << 24) + 3};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
    for (int decay = 0; decay < 2; decay++)
      for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        if (si == 2 && !(k == 4 && decay))
          continue;
        size_t n = sizes[si], bytes = n * sizeof(float);
        ps_optim o = ps_optim_default(PS_OPTIM_SGD, 0.01f);
        assert_int_equal(ps_optim_parse(names[k], &o), 0);
        o.weight_decay = decay ? 0.01f : 0.0f;
        int nslots = ps_optim_nslots(o.kind);
        float *w = host(bytes), *slots[PS_OPTIM_MAX_SLOTS] = {0};
        float *gw = NULL, *gslots[PS_OPTIM_MAX_SLOTS] = {0};
        fill(w, n, -1, 1);
        gw = up(w, bytes);
        for (int i = 0; i < nslots; i++) {
          slots[i] = host(bytes);
          /* adagrad's accumulator and adam's v are sums of squares. */
          int squares = o.kind == PS_OPTIM_ADAGRAD || (o.kind == PS_OPTIM_ADAM && i == 1);
          fill(slots[i], n, squares ? 0.0f : -0.1f, 0.1f);
          gslots[i] = up(slots[i], bytes);
        }
        char what[96];
        for (uint64_t t = 1; t <= 3; t++) {
          float *g = host(bytes);
          fill(g, n, -1, 1);
          float *gg = up(g, bytes);
          float lr = 0.01f / (float)t;
          cpu->ops->optim(cpu, &o, lr, t, w, g, slots, n);
          gpu->ops->optim(gpu, &o, lr, t, gw, gg, gslots, n);
          snprintf(what, sizeof what, "%s%s n %zu t %d", names[k], decay ? " decay" : "", n,
                   (int)t);
          float *got = down(gw, bytes);
          if (memcmp(got, w, bytes) != 0)
            expect_close(what, got, w, n, 0.0);
          assert_memory_equal(got, w, bytes);
          free(got);
          for (int i = 0; i < nslots; i++) {
            got = down(gslots[i], bytes);
            if (memcmp(got, slots[i], bytes) != 0)
              expect_close(what, got, slots[i], n, 0.0);
            assert_memory_equal(got, slots[i], bytes);
            free(got);
          }
          free(g);
          gfree(gg);
        }
        free(w);
        gfree(gw);
        for (int i = 0; i < nslots; i++) {
          free(slots[i]);
          gfree(gslots[i]);
        }
      }
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
  ps_compute *cg = ps_compute_new_on(&m, device, 2, N, &eb);
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

/* `paramserv train`'s steps: the parameters and nesterov's slot kept on the
 * GPU (ps_compute_train_*, the optim op) against 2 CPU threads: each step's
 * loss, the parameters after three steps, and an evaluation on the kept
 * parameters. */
static void test_compute_train(void **state) {
  (void)state;
  enum { N = 37 };
  ps_model m;
  gradcheck_build("cnn", NULL, &m);
  ps_errbuf eb = {0};
  ps_compute *cc = ps_compute_new_on(&m, PS_DEVICE_CPU, 2, N, &eb);
  ps_compute *cg = ps_compute_new_on(&m, device, 1, N, &eb);
  assert_non_null(cc);
  if (cg == NULL)
    fail_msg("%s", eb.msg);
  size_t total = m.vars.total, nx = 3 * N * m.in_size;
  float *params = host(total * 4), *pc = host(total * 4), *pg = host(total * 4);
  float *x = ps_compute_host_alloc(cg, nx * 4);
  uint8_t y[3 * N];
  assert_non_null(x);
  ps_vartable_init_arena(&m.vars, 6, params);
  fill(x, nx, -1, 2);
  for (int i = 0; i < 3 * N; i++)
    y[i] = (uint8_t)ps_rng_below(&rng, 10);
  ps_optim o = ps_optim_default(PS_OPTIM_MOMENTUM, 0.01f);
  o.nesterov = 1;
  o.weight_decay = 1e-4f;
  assert_int_equal(ps_compute_train_init(cc, params, &o), 0);
  assert_int_equal(ps_compute_train_init(cg, params, &o), 0);
  for (int step = 0; step < 3; step++) {
    size_t rc = 0, rg = 0;
    const float *xs = x + (size_t)step * N * m.in_size;
    float lr = 0.01f / (float)(step + 1);
    double lc = ps_compute_train_step(cc, xs, y + step * N, N, 3, (uint64_t)step * N, lr,
                                      (uint64_t)step + 1, &rc);
    double lg = ps_compute_train_step(cg, xs, y + step * N, N, 3, (uint64_t)step * N, lr,
                                      (uint64_t)step + 1, &rg);
    if (!(fabs(lg - lc) <= 1e-5 * fabs(lc)))
      fail_msg("train step %d: loss gpu %.9g, cpu %.9g", step, lg, lc);
    assert_int_equal(rg, rc);
  }
  ps_compute_train_params(cc, pc);
  ps_compute_train_params(cg, pg);
  for (int v = 0; v < m.vars.n; v++) {
    char what[96];
    snprintf(what, sizeof what, "parameters after 3 steps: %s", m.vars.vars[v].name);
    expect_close(what, pg + m.vars.vars[v].offset, pc + m.vars.vars[v].offset,
                 m.vars.vars[v].count, NMSE_LOGITS);
  }
  size_t rc = 0, rg = 0;
  double ec = ps_compute_eval(cc, NULL, x, y, 3 * N, &rc);
  double eg = ps_compute_eval(cg, NULL, x, y, 3 * N, &rg);
  if (!(fabs(eg - ec) <= 1e-5 * fabs(ec)))
    fail_msg("eval on the kept parameters: loss gpu %.9g, cpu %.9g", eg, ec);
  /* Parameters a few ulps apart may tip one near tie. */
  assert_true(rg + 1 >= rc && rc + 1 >= rg);
  ps_compute_host_free(cg, x);
  free(params);
  free(pc);
  free(pg);
  ps_compute_free(cc);
  ps_compute_free(cg);
  ps_model_close(&m);
}

/* A sparse model (models/ctr.json) through ps_compute on the GPU against 2
 * CPU threads: a step's loss, gradient and embedding-input gradient (emb
 * goes over and demb comes back with the step), and the probabilities of a
 * prediction in chunks of the batch. */
static void test_sparse_compute(void **state) {
  (void)state;
  enum { N = 37, MANY = 3 * N - 5 };
  ps_model m;
  gradcheck_build("models/ctr.json", NULL, &m);
  ps_errbuf eb = {0};
  ps_compute *cc = ps_compute_new_on(&m, PS_DEVICE_CPU, 2, N, &eb);
  ps_compute *cg = ps_compute_new_on(&m, device, 1, N, &eb);
  assert_non_null(cc);
  if (cg == NULL)
    fail_msg("%s", eb.msg);
  size_t total = m.vars.total, E = m.emb_size, nx = MANY * m.in_size;
  float *params = host(total * 4), *gc = host(total * 4), *gg = host(total * 4);
  float *x = host(nx * 4), *emb = ps_compute_host_alloc(cg, MANY * E * 4);
  float *dc = host(N * E * 4), *dg = ps_compute_host_alloc(cg, N * E * 4);
  float *pc = host(MANY * 4), *pg = host(MANY * 4);
  uint8_t y[N];
  assert_non_null(emb);
  assert_non_null(dg);
  ps_vartable_init_arena(&m.vars, 8, params);
  fill(x, nx, 0, 3);
  /* Pooled vectors as trained rows might be (new rows, at 0.01, would
   * leave the top MLP near its bias). */
  fill(emb, MANY * E, -0.5f, 0.5f);
  for (int i = 0; i < N; i++)
    y[i] = (uint8_t)ps_rng_below(&rng, 2);
  size_t rc = 0, rg = 0;
  double lc = ps_compute_grad_emb(cc, params, x, emb, y, N, 3, 0, gc, dc, &rc);
  double lg = ps_compute_grad_emb(cg, params, x, emb, y, N, 3, 0, gg, dg, &rg);
  if (!(fabs(lg - lc) <= 1e-6 * fabs(lc)))
    fail_msg("sparse step: loss gpu %.9g, cpu %.9g", lg, lc);
  assert_int_equal(rg, rc);
  for (int v = 0; v < m.vars.n; v++)
    expect_close(m.vars.vars[v].name, gg + m.vars.vars[v].offset, gc + m.vars.vars[v].offset,
                 m.vars.vars[v].count, NMSE_GRAD);
  expect_close("embedding input gradient", dg, dc, N * E, NMSE_GRAD);
  ps_compute_predict(cc, params, x, emb, MANY, pc);
  ps_compute_predict(cg, params, x, emb, MANY, pg);
  expect_close("sparse model's probabilities", pg, pc, MANY, NMSE_LOGITS);
  ps_compute_host_free(cg, emb);
  ps_compute_host_free(cg, dg);
  free(params);
  free(gc);
  free(gg);
  free(x);
  free(dc);
  free(pc);
  free(pg);
  ps_compute_free(cc);
  ps_compute_free(cg);
  ps_model_close(&m);
}

/* test_model.c's finite-difference checks, on the GPU. */
static void test_mlp_gradcheck(void **state) {
  (void)state;
  gradcheck_params("mlp", "16,8", device, 300, 1e-3f);
}

static void test_cnn_directional(void **state) {
  (void)state;
  gradcheck_directional("cnn", device);
}

int main(int argc, char **argv) {
  ps_errbuf eb = {0};
  if (ps_backend_cuda_devices(&eb) < 0)
    return gpu_skip_or_fail("skip: test_backend_cuda:", "test_backend_cuda", &eb);
  device = gpu_device();
  if (device < 0) {
    fprintf(stderr, "test_backend_cuda: PS_CUDA_DEVICE '%s': expected a GPU number in [0, 255]\n",
            getenv("PS_CUDA_DEVICE"));
    return 1;
  }
  if (argc == 2 && strcmp(argv[1], "--fault") == 0)
    return fault();
  cpu = ps_backend_cpu_new();
  gpu = ps_backend_cuda_new(device, &eb);
  if (cpu == NULL || gpu == NULL) {
    fprintf(stderr, "test_backend_cuda: %s\n", gpu == NULL ? eb.msg : "out of memory");
    return 1;
  }
  printf("gpu: %s\ncpu: %s\n", gpu->ops->describe(gpu), cpu->ops->describe(cpu));
  ps_rng_seed(&rng, 2024);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm),         cmocka_unit_test(test_elementwise),
      cmocka_unit_test(test_bias),         cmocka_unit_test(test_conv),
      cmocka_unit_test(test_maxpool),      cmocka_unit_test(test_dropout),
      cmocka_unit_test(test_optim),
      cmocka_unit_test(test_nll),          cmocka_unit_test(test_memory),
      cmocka_unit_test(test_gemm_ld),      cmocka_unit_test(test_fault_named),
      cmocka_unit_test(test_profile),
      cmocka_unit_test(test_mlp_passes),   cmocka_unit_test(test_cnn_passes),
      cmocka_unit_test(test_compute),      cmocka_unit_test(test_compute_train),
      cmocka_unit_test(test_copy2d),       cmocka_unit_test(test_sparse_compute),
      cmocka_unit_test(test_mlp_gradcheck),
      cmocka_unit_test(test_cnn_directional),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  ps_backend_free(gpu);
  ps_backend_free(cpu);
  return failed;
}
