/* The compute backend interface: every numeric kernel the layers use, on
 * memory the backend owns.  The CPU backend (backend_cpu.c, OpenBLAS) and the
 * CUDA backend (backend_cuda.cu, cuBLAS and kernels, built with make CUDA=1)
 * implement the same table; the layers know neither.
 *
 * Conventions: float32, row-major; activations are [n, features] or NCHW.
 * Every pointer passed to an op is backend memory (from ->alloc), except where
 * a comment says host.  An op never fails: sizes are checked when the model
 * and its workspace are built (a GPU that faults mid-step is reported on
 * stderr and the process aborts: its results would be garbage).  Ops on one
 * backend object are called from one thread at a time; separate backend
 * objects may run concurrently.
 *
 * Ordering: a backend may run its ops asynchronously, in call order (the
 * CUDA backend queues them on its one stream).  Only to_host and nll wait:
 * when they return, every op called before them has completed.  So host
 * memory handed to to_device must stay unchanged until the next to_host or
 * nll returns. */
#ifndef PS_NN_BACKEND_H
#define PS_NN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "paramserv/error.h"

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
  /* One line saying what computes, e.g. "OpenBLAS (Haswell core), ..." or
   * "cuda:0 NVIDIA H100 ..."; valid while the backend lives. */
  const char *(*describe)(ps_backend *b);
  /* Optional: releases what the backend object holds (ps_backend_free calls
   * it); NULL when there is nothing beyond the object itself. */
  void (*close)(ps_backend *b);
  /* Memory.  alloc returns NULL on failure; free(NULL) does nothing. */
  void *(*alloc)(ps_backend *b, size_t bytes);
  void (*free)(ps_backend *b, void *p);
  void (*to_device)(ps_backend *b, void *dst, const void *host_src, size_t bytes);
  void (*to_host)(ps_backend *b, void *host_dst, const void *src, size_t bytes);
  void (*copy)(ps_backend *b, void *dst, const void *src, size_t bytes);
  /* Optional: host memory that to_device / to_host move fastest (pinned,
   * page-locked, on a GPU).  NULL: plain malloc / free serve.  host_alloc
   * returns NULL on failure; host_free(NULL) does nothing. */
  void *(*host_alloc)(ps_backend *b, size_t bytes);
  void (*host_free)(ps_backend *b, void *p);
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
   * pure function of (seed, first + i), defined once in nn/dropout.h for
   * every backend, so the result depends neither on how a batch is split
   * among threads nor on the device.  group divides per.  mask: n*per
   * bytes, one per value. */
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

/* The CUDA backend on GPU `device` (0, 1, ...): cuBLAS and its own kernels
 * on one stream, device memory from a cache of the blocks it freed (see
 * backend_cuda.cu).  @return NULL with one line in eb naming what is
 * missing, eb->code -ENODEV for an unusable device ("cuda: no GPU:
 * cudaGetDeviceCount: ...", "cuda:3: device 3 not present, this machine has
 * 1", and in a build without CUDA "cuda: this paramserv was built without
 * CUDA (make CUDA=1)") or -ENOMEM.  Free with ps_backend_free. */
ps_backend *ps_backend_cuda_new(int device, ps_errbuf *eb);

/* How many CUDA devices answer: >= 1, or -ENODEV with the reason in eb
 * ("cudaGetDeviceCount: <the runtime's error string>", or that this build
 * has no CUDA).  What a GPU test asks before it runs. */
int ps_backend_cuda_devices(ps_errbuf *eb);

/* The backend for `device`: the CPU when device < 0, else that CUDA device.
 * @return NULL with a message in eb, as the constructors above. */
ps_backend *ps_backend_new(int device, ps_errbuf *eb);

/* Release a backend of any kind; ps_backend_free(NULL) does nothing.  Memory
 * from its alloc must have been freed first. */
void ps_backend_free(ps_backend *b);

/* Describe the BLAS in use, e.g. "OpenBLAS 0.3.21 (Zen)". */
const char *ps_backend_cpu_describe(void);

#endif
