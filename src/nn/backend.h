/* The compute backend interface: every numeric kernel the layers use, on
 * memory the backend owns.  The CPU backend (backend_cpu.c, OpenBLAS) is the
 * first; a CUDA backend implements the same table without touching layers.
 *
 * Conventions: float32, row-major; activations are [n, features] or NCHW.
 * Every pointer passed to an op is backend memory (from ->alloc), except where
 * a comment says host.  An op never fails: sizes are checked when the model
 * and its workspace are built.  Ops on one backend object are called from one
 * thread at a time; separate backend objects may run concurrently. */
#ifndef PS_NN_BACKEND_H
#define PS_NN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* Geometry of a 2-d convolution or pooling window over one sample. */
typedef struct ps_conv_geom {
  int c, h, w;       /* input channels, height, width */
  int kh, kw;        /* window */
  int stride, pad;
  int oh, ow;        /* output height, width */
} ps_conv_geom;

typedef struct ps_backend ps_backend;

typedef struct ps_backend_ops {
  const char *name;
  /* Memory.  alloc returns NULL on failure; free(NULL) does nothing. */
  void *(*alloc)(ps_backend *b, size_t bytes);
  void (*free)(ps_backend *b, void *p);
  void (*to_device)(ps_backend *b, void *dst, const void *host_src, size_t bytes);
  void (*to_host)(ps_backend *b, void *host_dst, const void *src, size_t bytes);
  void (*copy)(ps_backend *b, void *dst, const void *src, size_t bytes);
  void (*zero)(ps_backend *b, float *p, size_t n);
  /* y[i] += x[i] */
  void (*add)(ps_backend *b, size_t n, const float *x, float *y);

  /* C[MxN] = alpha * op(A) op(B) + beta * C, row-major; op = transpose when ta/tb. */
  void (*gemm)(ps_backend *b, int ta, int tb, int m, int n, int k, float alpha,
               const float *a, int lda, const float *bm, int ldb, float beta, float *c, int ldc);

  /* y[i][j][k] += bias[j] for i < n, j < c, k < inner. */
  void (*bias_add)(ps_backend *b, int n, int c, int inner, const float *bias, float *y);
  /* db[j] = sum over i, k of dy[i][j][k]  (overwrites db). */
  void (*bias_grad)(ps_backend *b, int n, int c, int inner, const float *dy, float *db);

  /* y = max(x, 0); dx = dy where y > 0, else 0.  In place is allowed. */
  void (*relu_fwd)(ps_backend *b, size_t n, const float *x, float *y);
  void (*relu_bwd)(ps_backend *b, size_t n, const float *y, const float *dy, float *dx);

  /* One sample: col[(c*kh*kw) x (oh*ow)] from x[c][h][w]. */
  void (*im2col)(ps_backend *b, const ps_conv_geom *g, const float *x, float *col);
  /* One sample: dx[c][h][w] = the sum of col's entries that im2col took from
   * each input position (overwrites dx). */
  void (*col2im)(ps_backend *b, const ps_conv_geom *g, const float *col, float *dx);

  /* n samples of max pooling; idx records the argmax (index within the
   * input plane) of each output for the backward pass. */
  void (*maxpool_fwd)(ps_backend *b, int n, const ps_conv_geom *g, const float *x, float *y,
                      int32_t *idx);
  /* dx = scatter of dy to the recorded argmax positions (overwrites dx). */
  void (*maxpool_bwd)(ps_backend *b, int n, const ps_conv_geom *g, const int32_t *idx,
                      const float *dy, float *dx);

  /* Inverted dropout over n samples of `per` values, in groups of `group`
   * consecutive values (1: each value alone; a channel's plane: whole
   * channels, as PyTorch's Dropout2d).  Each group is dropped with
   * probability p, kept ones scaled by 1/(1-p).  The mask of sample i is a
   * pure function of (seed, first + i), so the result does not depend on
   * how a batch is split among threads.  mask: n*per bytes, one per value. */
  void (*dropout_fwd)(ps_backend *b, int n, size_t per, size_t group, float p, uint64_t seed,
                      uint64_t first, const float *x, float *y, uint8_t *mask);
  void (*dropout_bwd)(ps_backend *b, size_t count, float p, const uint8_t *mask,
                      const float *dy, float *dx);

  /* Log-softmax + negative log-likelihood over n rows of k logits.
   * labels: host memory, n bytes.  Writes dlogits = (softmax - onehot) *
   * scale (when dlogits is not NULL).  Returns, on the host, the sum over
   * rows of the NLL, and adds to *correct the rows whose argmax is the label. */
  double (*nll)(ps_backend *b, int n, int k, const float *logits, const uint8_t *labels,
                float scale, float *dlogits, size_t *correct);
} ps_backend_ops;

struct ps_backend {
  const ps_backend_ops *ops;
  int host_memory;  /* 1 when backend memory is plain host memory */
  void *impl;
};

/* The CPU backend on OpenBLAS.  Each backend object computes on the calling
 * thread only (OpenBLAS is set to one thread; paramserv runs one backend per
 * thread).  @return NULL on allocation failure.  Free with ps_backend_free. */
ps_backend *ps_backend_cpu_new(void);

void ps_backend_free(ps_backend *b);

/* Describe the BLAS in use, e.g. "OpenBLAS 0.3.21 (Zen)". */
const char *ps_backend_cpu_describe(void);

#endif
