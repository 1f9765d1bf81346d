/* The CPU compute backend: sgemm from OpenBLAS, the other kernels in plain C
 * loops written so that the compiler vectorizes them. */
#include "nn/backend.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/dropout.h"

static void *cpu_alloc(ps_backend *b, size_t bytes) {
  (void)b;
  void *p = NULL;
  /* 64-byte alignment keeps AVX-512 loads on one cache line. */
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
    return NULL;
  return p;
}

static void cpu_free(ps_backend *b, void *p) {
  (void)b;
  free(p);
}

static void cpu_copy(ps_backend *b, void *dst, const void *src, size_t bytes) {
  (void)b;
  if (dst != src)
    memcpy(dst, src, bytes);
}

static void cpu_zero(ps_backend *b, float *p, size_t n) {
  (void)b;
  memset(p, 0, n * sizeof *p);
}

static void cpu_add(ps_backend *b, size_t n, const float *restrict x, float *restrict y) {
  (void)b;
  for (size_t i = 0; i < n; i++)
    y[i] += x[i];
}

static void cpu_gemm(ps_backend *b, int ta, int tb, int m, int n, int k, float alpha,
                     const float *a, int lda, const float *bm, int ldb, float beta, float *c,
                     int ldc) {
  (void)b;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
              n, k, alpha, a, lda, bm, ldb, beta, c, ldc);
}

static void cpu_bias_add(ps_backend *b, int n, int c, int inner, const float *restrict bias,
                         float *restrict y) {
  (void)b;
  if (inner == 1) {
    for (int i = 0; i < n; i++, y += c)
      for (int j = 0; j < c; j++)
        y[j] += bias[j];
    return;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < c; j++, y += inner) {
      float v = bias[j];
      for (int k = 0; k < inner; k++)
        y[k] += v;
    }
}

/* Sum with 16 independent lanes: a plain `s += x[i]` loop is not
 * vectorized, because reordering float additions changes the result. */
static float sum_floats(const float *restrict x, size_t n) {
  float lane[16] = {0};
  size_t bulk = n - n % 16;
  for (size_t i = 0; i < bulk; i += 16)
    for (size_t j = 0; j < 16; j++)
      lane[j] += x[i + j];
  float s = 0.0f;
  for (size_t i = bulk; i < n; i++)
    s += x[i];
  for (size_t j = 0; j < 16; j++)
    s += lane[j];
  return s;
}

static void cpu_bias_grad(ps_backend *b, int n, int c, int inner, const float *restrict dy,
                          float *restrict db) {
  (void)b;
  memset(db, 0, (size_t)c * sizeof *db);
  if (inner == 1) {
    for (int i = 0; i < n; i++, dy += c)
      for (int j = 0; j < c; j++)
        db[j] += dy[j];
    return;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < c; j++, dy += inner)
      db[j] += sum_floats(dy, (size_t)inner);
}

static void cpu_relu_fwd(ps_backend *b, size_t n, const float *x, float *y) {
  (void)b;
  for (size_t i = 0; i < n; i++)
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void cpu_relu_bwd(ps_backend *b, size_t n, const float *y, const float *dy, float *dx) {
  (void)b;
  for (size_t i = 0; i < n; i++)
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

/* One sample's im2col matrix col[c*kh*kw][oh*ow] (backend.h). */
static void im2col(const ps_conv_geom *g, const float *restrict x, float *restrict col) {
  const size_t plane = (size_t)g->oh * g->ow;
  for (int c = 0; c < g->c; c++)
    for (int ki = 0; ki < g->kh; ki++)
      for (int kj = 0; kj < g->kw; kj++) {
        float *row = col + (size_t)((c * g->kh + ki) * g->kw + kj) * plane;
        for (int oy = 0; oy < g->oh; oy++) {
          int iy = oy * g->stride - g->pad + ki;
          float *out = row + oy * g->ow;
          if (iy < 0 || iy >= g->h) {
            memset(out, 0, (size_t)g->ow * sizeof *out);
            continue;
          }
          const float *in = x + ((size_t)c * g->h + iy) * g->w;
          if (g->stride == 1 && g->pad == 0) {
            /* The common case: one contiguous run per output row. */
            memcpy(out, in + kj, (size_t)g->ow * sizeof *out);
            continue;
          }
          for (int ox = 0; ox < g->ow; ox++) {
            int ix = ox * g->stride - g->pad + kj;
            out[ox] = (ix >= 0 && ix < g->w) ? in[ix] : 0.0f;
          }
        }
      }
}

/* im2col's adjoint for one sample: dx[c][h][w] = the sum of the col entries
 * im2col took from each input position, added in (c, ki, kj, oy, ox) order
 * (the CUDA kernel gathers in the same order).  Overwrites dx. */
static void col2im(const ps_conv_geom *g, const float *restrict col, float *restrict dx) {
  const size_t plane = (size_t)g->oh * g->ow;
  memset(dx, 0, (size_t)g->c * g->h * g->w * sizeof *dx);
  for (int c = 0; c < g->c; c++)
    for (int ki = 0; ki < g->kh; ki++)
      for (int kj = 0; kj < g->kw; kj++) {
        const float *row = col + (size_t)((c * g->kh + ki) * g->kw + kj) * plane;
        for (int oy = 0; oy < g->oh; oy++) {
          int iy = oy * g->stride - g->pad + ki;
          if (iy < 0 || iy >= g->h)
            continue;
          const float *in = row + oy * g->ow;
          float *out = dx + ((size_t)c * g->h + iy) * g->w;
          if (g->stride == 1 && g->pad == 0) {
            float *o = out + kj;
            for (int ox = 0; ox < g->ow; ox++)
              o[ox] += in[ox];
            continue;
          }
          for (int ox = 0; ox < g->ow; ox++) {
            int ix = ox * g->stride - g->pad + kj;
            if (ix >= 0 && ix < g->w)
              out[ix] += in[ox];
          }
        }
      }
}

/* On the CPU the convolution of a batch goes sample by sample inside the
 * op: im2col of one sample (663 KB for the cnn's conv2, which stays in L2),
 * then gemms of [oc x k] by [k x plane].  Chunks of S samples per gemm,
 * their im2col matrices side by side ([k][S * plane]) and the gemm's
 * [oc][S][plane] permuted into y's [S][oc][plane] (dy the other way round),
 * measured slower for every S from 2 to 64 (2-core EPYC, OpenBLAS 0.3.21,
 * 64 samples, one thread's half of the cnn's batch, best of 15: conv2
 * forward 16.3 ms one by one, 16.7 to 21.8 ms in chunks; backward 46.5
 * against 48.3 to 53.9; conv1 forward and backward 1.1 ms against 1.2 to
 * 1.7): OpenBLAS runs the 64 x 576 x 288 gemm near the cores' peak
 * already, and the permutations cost more than larger gemms gain.  A GPU
 * is another matter (backend_cuda.cu). */
static size_t cpu_conv_ws(ps_backend *b, int n, const ps_conv_geom *g, int oc) {
  (void)b, (void)n, (void)oc;
  return (size_t)g->c * g->kh * g->kw * g->oh * g->ow;
}

static void cpu_conv_fwd(ps_backend *b, int n, const ps_conv_geom *g, int oc, const float *w,
                         const float *x, float *y, float *ws) {
  (void)b;
  const int k = g->c * g->kh * g->kw, plane = g->oh * g->ow;
  const size_t in = (size_t)g->c * g->h * g->w, out = (size_t)oc * plane;
  for (int s = 0; s < n; s++) {
    im2col(g, x + (size_t)s * in, ws);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, oc, plane, k, 1.0f, w, k, ws, plane,
                0.0f, y + (size_t)s * out, plane);
  }
}

static void cpu_conv_bwd(ps_backend *b, int n, const ps_conv_geom *g, int oc, const float *w,
                         const float *x, const float *dy, float *dw, float *dx, float *ws) {
  (void)b;
  const int k = g->c * g->kh * g->kw, plane = g->oh * g->ow;
  const size_t in = (size_t)g->c * g->h * g->w, out = (size_t)oc * plane;
  if (n <= 0)
    memset(dw, 0, (size_t)oc * k * sizeof *dw);
  for (int s = 0; s < n; s++) {
    const float *d = dy + (size_t)s * out;
    /* The im2col matrix is rebuilt rather than kept from the forward pass:
     * it is cheap next to the gemms, and keeping one per sample would cost
     * tens of megabytes per thread and all their cache misses. */
    im2col(g, x + (size_t)s * in, ws);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, oc, k, plane, 1.0f, d, plane, ws, plane,
                s ? 1.0f : 0.0f, dw, k);
    if (dx == NULL)
      continue;
    /* dcol = w^T dy[s], into col's place: the dw gemm was its last reader. */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, plane, oc, 1.0f, w, k, d, plane, 0.0f,
                ws, plane);
    col2im(g, ws, dx + (size_t)s * in);
  }
}

/* The common 2x2, stride 2 window without the general loop's bounds checks. */
static void maxpool2x2_fwd(int planes, const ps_conv_geom *g, const float *x, float *y,
                           int32_t *idx) {
  const int w = g->w;
  for (int p = 0; p < planes; p++) {
    const float *in = x + (size_t)p * g->h * w;
    for (int oy = 0; oy < g->oh; oy++) {
      const float *r0 = in + 2 * oy * w, *r1 = r0 + w;
      for (int ox = 0; ox < g->ow; ox++) {
        int a = 2 * ox, best = 2 * oy * w + a;
        float v = r0[a];
        if (r0[a + 1] > v) {
          v = r0[a + 1];
          best = 2 * oy * w + a + 1;
        }
        if (r1[a] > v) {
          v = r1[a];
          best = (2 * oy + 1) * w + a;
        }
        if (r1[a + 1] > v) {
          v = r1[a + 1];
          best = (2 * oy + 1) * w + a + 1;
        }
        *y++ = v;
        *idx++ = best;
      }
    }
  }
}

static void cpu_maxpool_fwd(ps_backend *b, int n, const ps_conv_geom *g, const float *x,
                            float *y, int32_t *idx) {
  (void)b;
  const size_t in_plane = (size_t)g->h * g->w, out_plane = (size_t)g->oh * g->ow;
  if (g->kh == 2 && g->kw == 2 && g->stride == 2 && g->pad == 0) {
    maxpool2x2_fwd(n * g->c, g, x, y, idx);
    return;
  }
  for (size_t p = 0; p < (size_t)n * g->c; p++) {
    const float *in = x + p * in_plane;
    float *out = y + p * out_plane;
    int32_t *arg = idx + p * out_plane;
    for (int oy = 0; oy < g->oh; oy++)
      for (int ox = 0; ox < g->ow; ox++) {
        float best = -FLT_MAX;
        int32_t where = -1;
        for (int ki = 0; ki < g->kh; ki++) {
          int iy = oy * g->stride - g->pad + ki;
          if (iy < 0 || iy >= g->h)
            continue;
          for (int kj = 0; kj < g->kw; kj++) {
            int ix = ox * g->stride - g->pad + kj;
            if (ix < 0 || ix >= g->w)
              continue;
            float v = in[iy * g->w + ix];
            if (where < 0 || v > best) {
              best = v;
              where = iy * g->w + ix;
            }
          }
        }
        out[oy * g->ow + ox] = best;
        arg[oy * g->ow + ox] = where;
      }
  }
}

static void cpu_maxpool_bwd(ps_backend *b, int n, const ps_conv_geom *g, const int32_t *idx,
                            const float *dy, float *dx) {
  (void)b;
  const size_t in_plane = (size_t)g->h * g->w, out_plane = (size_t)g->oh * g->ow;
  memset(dx, 0, (size_t)n * g->c * in_plane * sizeof *dx);
  for (size_t p = 0; p < (size_t)n * g->c; p++)
    for (size_t o = 0; o < out_plane; o++)
      dx[p * in_plane + (size_t)idx[p * out_plane + o]] += dy[p * out_plane + o];
}

/* out = in * mask * scale, branch-free so that it vectorizes. */
static void apply_mask(size_t n, float scale, const uint8_t *restrict mask,
                       const float *restrict in, float *restrict out) {
  for (size_t i = 0; i < n; i++)
    out[i] = in[i] * ((float)mask[i] * scale);
}

static void cpu_dropout_fwd(ps_backend *b, int n, size_t per, size_t group, float p,
                            uint64_t seed, uint64_t first, const float *x, float *y,
                            uint8_t *mask) {
  (void)b;
  const uint32_t keep_below = ps_dropout_keep_below(p);
  const float scale = ps_dropout_scale(p);
  const size_t groups = per / group;
  for (int i = 0; i < n; i++) {
    uint64_t key = ps_dropout_key(seed, first + (uint64_t)i), word = 0;
    uint8_t *m = mask + (size_t)i * per;
    for (size_t j = 0; j < groups; j++) {
      if ((j & 3) == 0)
        word = ps_dropout_word(key, j / 4);
      memset(m + j * group, ps_dropout_decide(word, j, keep_below), group);
    }
    apply_mask(per, scale, m, x + (size_t)i * per, y + (size_t)i * per);
  }
}

static void cpu_dropout_bwd(ps_backend *b, size_t count, float p, const uint8_t *mask,
                            const float *dy, float *dx) {
  (void)b;
  apply_mask(count, ps_dropout_scale(p), mask, dy, dx);
}

static void cpu_copy2d(ps_backend *b, int rows, size_t width, float *dst, size_t dst_stride,
                       const float *src, size_t src_stride) {
  (void)b;
  for (int i = 0; i < rows; i++)
    memcpy(dst + (size_t)i * dst_stride, src + (size_t)i * src_stride, width * sizeof(float));
}

static double cpu_nll(ps_backend *b, int n, int k, const float *logits, const uint8_t *labels,
                      float scale, float *dlogits, size_t *correct) {
  (void)b;
  double loss = 0.0;
  for (int i = 0; i < n && k == 1; i++) {
    double z = logits[i], y = labels[i] ? 1.0 : 0.0;
    loss += (z > 0 ? z : 0) - z * y + log1p(exp(-fabs(z)));
    if (correct != NULL && (z > 0) == (labels[i] != 0))
      (*correct)++;
    if (dlogits != NULL)
      dlogits[i] = (float)(1.0 / (1.0 + exp(-z)) - y) * scale;
  }
  for (int i = 0; i < n && k > 1; i++) {
    const float *z = logits + (size_t)i * k;
    int best = 0;
    for (int j = 1; j < k; j++)
      if (z[j] > z[best])
        best = j;
    if (correct != NULL && best == labels[i])
      (*correct)++;
    float mx = z[best];
    double sum = 0.0;
    for (int j = 0; j < k; j++)
      sum += exp((double)(z[j] - mx));
    double lse = (double)mx + log(sum);
    loss += lse - (double)z[labels[i]];
    if (dlogits != NULL) {
      float *d = dlogits + (size_t)i * k;
      for (int j = 0; j < k; j++)
        d[j] = (float)exp((double)z[j] - lse) * scale;
      d[labels[i]] -= scale;
    }
  }
  return loss;
}

static void cpu_optim(ps_backend *b, const ps_optim *o, float lr, uint64_t t, float *w,
                      const float *g, float *const *slots, size_t count) {
  (void)b;
  ps_optim_apply(o, lr, t, w, g, slots, count);
}

static const char *cpu_describe(ps_backend *b) {
  (void)b;
  return ps_backend_cpu_describe();
}

static const ps_backend_ops cpu_ops = {
    .name = "cpu",
    .describe = cpu_describe,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .copy2d = cpu_copy2d,
    .zero = cpu_zero,
    .add = cpu_add,
    .gemm = cpu_gemm,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .relu_fwd = cpu_relu_fwd,
    .relu_bwd = cpu_relu_bwd,
    .conv_ws = cpu_conv_ws,
    .conv_fwd = cpu_conv_fwd,
    .conv_bwd = cpu_conv_bwd,
    .maxpool_fwd = cpu_maxpool_fwd,
    .maxpool_bwd = cpu_maxpool_bwd,
    .dropout_fwd = cpu_dropout_fwd,
    .dropout_bwd = cpu_dropout_bwd,
    .nll = cpu_nll,
    .optim = cpu_optim,
};

/* paramserv parallelizes over batch slices with one backend per thread, so
 * OpenBLAS's own thread pool must stay out of the way: two pools on two
 * cores fight each other.  Done once per process. */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) { openblas_set_num_threads(1); }

ps_backend *ps_backend_cpu_new(void) {
  pthread_once(&blas_once, blas_single_thread);
  ps_backend *b = calloc(1, sizeof *b);
  if (b == NULL)
    return NULL;
  b->ops = &cpu_ops;
  b->host_memory = 1;
  return b;
}

const char *ps_backend_cpu_describe(void) {
  static char buf[128];
  snprintf(buf, sizeof buf, "OpenBLAS (%s core), %s", openblas_get_corename(),
           openblas_get_config());
  return buf;
}
