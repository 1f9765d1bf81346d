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

#include "optim/optim.h"
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
  /* rows rows of width floats from src (a row every src_stride floats) to
   * dst (every dst_stride): the concatenation of an embedding input. */
  void (*copy2d)(ps_backend *b, int rows, size_t width, float *dst, size_t dst_stride,
                 const float *src, size_t src_stride);
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

  /* Convolution of n samples, without the bias, in one call, so that the
   * backend chooses how to batch it (the CUDA backend: a few gemms over the
   * whole batch; the CPU's: sample by sample, which is faster there).  With
   * k = c*kh*kw, plane = oh*ow and col(x) the im2col matrix of a sample
   * x[c][h][w] (row (c*kh + ki)*kw + kj, column oy*ow + ox: the input pixel
   * that output position's window takes there, 0 in the padding),
   *   y[s] = w col(x[s])   for x [n][c][h][w], w [oc][k] (PyTorch's
   *                        [oc][c][kh][kw]), y [n][oc][plane].
   * ws: scratch of conv_ws(b, n', g, oc) floats of backend memory for some
   * n' >= n (the size grows with n, so one workspace for the largest batch
   * serves every smaller one). */
  size_t (*conv_ws)(ps_backend *b, int n, const ps_conv_geom *g, int oc);
  void (*conv_fwd)(ps_backend *b, int n, const ps_conv_geom *g, int oc, const float *w,
                   const float *x, float *y, float *ws);
  /* Its backward pass from dy [n][oc][plane]: dw = the sum over samples of
   * dy[s] col(x[s])^T (overwrites dw); when dx is not NULL, dx[s] = col2im
   * of w^T dy[s], each input position getting the sum of the entries col
   * took from it (overwrites dx). */
  void (*conv_bwd)(ps_backend *b, int n, const ps_conv_geom *g, int oc, const float *w,
                   const float *x, const float *dy, float *dw, float *dx, float *ws);

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
   * rows of the NLL, and adds to *correct the rows whose argmax is the label.
   * k = 1 is the logistic loss of one logit z and a label y of 0 or 1:
   * max(z, 0) - z y + log(1 + exp(-|z|)), dlogits = (sigmoid(z) - y) scale,
   * correct when (z > 0) is y. */
  double (*nll)(ps_backend *b, int n, int k, const float *logits, const uint8_t *labels,
                float scale, float *dlogits, size_t *correct);

  /* One optimizer update of w[0..count) with gradient g: what
   * ps_optim_apply (optim/optim.h) computes, the same float operations in
   * the same order, so the results are equal to the bit.  slots: a host
   * array of ps_optim_nslots(o->kind) pointers to count floats each of
   * backend memory (NULL when there are none); o: host memory. */
  void (*optim)(ps_backend *b, const ps_optim *o, float lr, uint64_t t, float *w,
                const float *g, float *const *slots, size_t count);
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
 * missing or the CUDA call that failed and its error, eb->code -ENODEV for
 * an unusable device ("cuda: no GPU: cudaGetDeviceCount: ...", "cuda: CUDA
 * cannot use this machine's GPU: cudaGetDeviceCount: ...", "cuda:3: device
 * 3 not present, this machine has 1", "cuda:0: cublasCreate: ...", and in a
 * build without CUDA "cuda: this paramserv was built without CUDA (make
 * CUDA=1)") or -ENOMEM.  Free with ps_backend_free.
 *
 * Its ops stop the process (abort, after one line on stderr naming the
 * call or op and the CUDA error) on any CUDA or cuBLAS failure but out of
 * memory, which alloc and host_alloc answer with NULL.  A kernel's fault
 * surfaces at the next wait (to_host, nll) naming the last op queued;
 * PS_CUDA_SYNC=1 waits after every op, so that the op named is the one
 * that faulted. */
ps_backend *ps_backend_cuda_new(int device, ps_errbuf *eb);

/* How many CUDA devices answer: >= 1; -ENODEV where there is no GPU to use
 * (cudaGetDeviceCount finds no device, or no NVIDIA driver is installed, or
 * this build has no CUDA); -EIO where CUDA fails otherwise (a driver too old
 * for the runtime, a device that does not initialize): a GPU may be there.
 * The reason in eb names the call and the error ("cudaGetDeviceCount:
 * cudaErrorNoDevice: no CUDA-capable device is detected").  What a GPU test
 * asks before it runs (tests/gpu/gpu_present.h: only -ENODEV may skip). */
int ps_backend_cuda_devices(ps_errbuf *eb);

/* With PS_CUDA_PROFILE=1 (nn/cuda_profile.h): the calls of one gemm shape a
 * CUDA backend has timed so far and their total device milliseconds, timed
 * as every op is (read at the backend's last to_host or nll).  What
 * tests/gpu/bench_sgemm reports, so that cuBLAS alone is timed as the
 * step's GEMMs are.  @return 0, or -ENOENT (no profile, not a CUDA
 * backend, or no call of that shape timed). */
int ps_backend_cuda_profile_gemm(ps_backend *b, int m, int n, int k, int ta, int tb,
                                 unsigned long long *timed, double *gpu_ms);

/* The backend for `device`: the CPU when device < 0, else that CUDA device.
 * @return NULL with a message in eb, as the constructors above. */
ps_backend *ps_backend_new(int device, ps_errbuf *eb);

/* Release a backend of any kind; ps_backend_free(NULL) does nothing.  Memory
 * from its alloc must have been freed first. */
void ps_backend_free(ps_backend *b);

/* Describe the BLAS in use, e.g. "OpenBLAS 0.3.21 (Zen)". */
const char *ps_backend_cpu_describe(void);

#endif
