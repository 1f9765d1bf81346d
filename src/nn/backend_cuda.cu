/* The CUDA compute backend: cuBLAS's sgemm for gemm and a kernel for every
 * other op of backend.h, queued on one stream per backend object, on device
 * memory from a per-backend cache of freed blocks; PS_CUDA_PROFILE=1 times
 * every op (cuda_profile.cu).  Built with make CUDA=1.
 *
 * The kernels compute what backend_cpu.c computes, in the same order where
 * the CPU's order decides the last bit (col2im and max-pool backward gather
 * their sums in the CPU's scatter order), and dropout draws its masks from
 * the one definition in nn/dropout.h: tests/gpu/test_backend_cuda.c checks
 * each op against the CPU backend. */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "nn/backend.h"
#include "nn/dropout.h"
}
#include "nn/cuda_profile.h"

/* ------------------------------------------------------------------ state */

/* A block of device memory from cudaMalloc, in use or cached. */
typedef struct block {
  void *p;
  size_t bytes;
  int used;
} block;

typedef struct cuda_impl {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  block *blocks;
  size_t nblocks, cap;
  /* nll's scratch, for up to nll_rows rows: the labels and each row's loss
   * and hit, on the device and pinned on the host. */
  int nll_rows;
  uint8_t *d_labels, *h_labels, *d_right, *h_right;
  double *d_loss, *h_loss;
  ps__cuda_profile *prof;  /* NULL unless PS_CUDA_PROFILE=1 */
  char desc[256];
} cuda_impl;

/* A fault on the device (an illegal address, a launch failure) is sticky:
 * every later call fails too, so the one honest answer is to stop. */
static void die(const cuda_impl *I, const char *what, const char *why) {
  fprintf(stderr, "paramserv: cuda:%d: %s: %s (the GPU cannot go on; stopping)\n", I->device,
          what, why);
  abort();
}

static void check(const cuda_impl *I, cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    die(I, what, cudaGetErrorString(e));
}

/* The runtime's current device is per host thread; the ops of one backend
 * may come from different threads (one at a time), so each makes sure its
 * device is current, remembering per thread which one is. */
static thread_local int current_device = -1;

static cuda_impl *use(ps_backend *b) {
  cuda_impl *I = (cuda_impl *)b->impl;
  if (current_device != I->device) {
    check(I, cudaSetDevice(I->device), "cudaSetDevice");
    current_device = I->device;
  }
  return I;
}

/* -------------------------------------------------------------- profile */

static void prof_begin(cuda_impl *I) {
  if (I->prof != NULL)
    check(I, ps__cuda_profile_begin(I->prof, I->stream), "cudaEventRecord");
}

static void prof_end(cuda_impl *I, int op, int shape) {
  if (I->prof != NULL)
    check(I, ps__cuda_profile_end(I->prof, I->stream, op, shape), "cudaEventRecord");
}

/* --------------------------------------------------------------- memory */

/* Device memory.  Every block this backend got from cudaMalloc stays in its
 * list: free marks a block unused, and alloc takes the smallest unused block
 * that fits (and is at most twice the request, so that a small buffer does
 * not hold a large one) before it asks cudaMalloc.  Workspaces are built
 * once per run, not per step, so cudaMalloc (which waits for the device) is
 * never on a step's path, and a workspace rebuilt at the same sizes (tests,
 * evaluations) reuses the same blocks.  Cached blocks go back to the device
 * when cudaMalloc fails (then it is tried once more) and when the backend
 * is freed. */
static void release_cached(cuda_impl *I) {
  size_t kept = 0;
  for (size_t i = 0; i < I->nblocks; i++) {
    if (I->blocks[i].used)
      I->blocks[kept++] = I->blocks[i];
    else
      cudaFree(I->blocks[i].p);
  }
  I->nblocks = kept;
}

static void *cu_alloc(ps_backend *b, size_t bytes) {
  cuda_impl *I = use(b);
  size_t need = bytes == 0 ? 256 : (bytes + 255) & ~(size_t)255;
  block *best = NULL;
  for (size_t i = 0; i < I->nblocks; i++) {
    block *k = &I->blocks[i];
    if (!k->used && k->bytes >= need && k->bytes / 2 <= need &&
        (best == NULL || k->bytes < best->bytes))
      best = k;
  }
  if (best != NULL) {
    best->used = 1;
    return best->p;
  }
  if (I->nblocks == I->cap) {
    size_t cap = I->cap ? 2 * I->cap : 64;
    block *grown = (block *)realloc(I->blocks, cap * sizeof *grown);
    if (grown == NULL)
      return NULL;
    I->blocks = grown;
    I->cap = cap;
  }
  void *p = NULL;
  if (cudaMalloc(&p, need) != cudaSuccess) {
    (void)cudaGetLastError();  /* out of memory is not sticky: clear it */
    release_cached(I);
    if (cudaMalloc(&p, need) != cudaSuccess) {
      (void)cudaGetLastError();
      return NULL;
    }
  }
  I->blocks[I->nblocks++] = block{p, need, 1};
  return p;
}

static void cu_free(ps_backend *b, void *p) {
  if (p == NULL)
    return;
  cuda_impl *I = (cuda_impl *)b->impl;
  for (size_t i = 0; i < I->nblocks; i++)
    if (I->blocks[i].p == p) {
      I->blocks[i].used = 0;
      return;
    }
  die(I, "free", "a pointer this backend did not allocate");
}

/* Pinned host memory: the copies from and to it run as DMA, without the
 * driver's staging copy, and a copy to the device returns at once. */
static void *cu_host_alloc(ps_backend *b, size_t bytes) {
  (void)use(b);
  void *p = NULL;
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return p;
}

static void cu_host_free(ps_backend *b, void *p) {
  if (p != NULL)
    check((cuda_impl *)b->impl, cudaFreeHost(p), "cudaFreeHost");
}

static void cu_to_device(ps_backend *b, void *dst, const void *host_src, size_t bytes) {
  cuda_impl *I = use(b);
  prof_begin(I);
  check(I, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, I->stream),
        "cudaMemcpyAsync to the device");
  prof_end(I, PS_CUDA_OP_H2D, -1);
}

static void cu_to_host(ps_backend *b, void *host_dst, const void *src, size_t bytes) {
  cuda_impl *I = use(b);
  prof_begin(I);
  check(I, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, I->stream),
        "cudaMemcpyAsync to the host");
  prof_end(I, PS_CUDA_OP_D2H, -1);
  check(I, cudaStreamSynchronize(I->stream), "cudaStreamSynchronize");
}

static void cu_copy(ps_backend *b, void *dst, const void *src, size_t bytes) {
  if (dst == src)
    return;
  cuda_impl *I = use(b);
  prof_begin(I);
  check(I, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, I->stream),
        "cudaMemcpyAsync on the device");
  prof_end(I, PS_CUDA_OP_COPY, -1);
}

static void cu_zero(ps_backend *b, float *p, size_t n) {
  cuda_impl *I = use(b);
  prof_begin(I);
  check(I, cudaMemsetAsync(p, 0, n * sizeof *p, I->stream), "cudaMemsetAsync");
  prof_end(I, PS_CUDA_OP_ZERO, -1);
}

/* -------------------------------------------------------------- kernels */

#define THREADS 256

/* Enough blocks of THREADS to cover n once, capped: the kernels loop. */
static unsigned blocks_for(size_t n) {
  size_t blocks = (n + THREADS - 1) / THREADS;
  if (blocks > 65536)
    blocks = 65536;
  return blocks ? (unsigned)blocks : 1;
}

#define GRID_STRIDE(i, n)                                                         \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)(n); \
       i += (size_t)gridDim.x * blockDim.x)

/* Launch `kernel` over n items on the backend's stream, timed as `op`
 * (PS_CUDA_OP_...). */
#define LAUNCH(I, op, n, kernel, ...)                                          \
  do {                                                                         \
    if ((n) == 0)                                                              \
      break;                                                                   \
    prof_begin(I);                                                             \
    kernel<<<blocks_for(n), THREADS, 0, (I)->stream>>>(__VA_ARGS__);           \
    check(I, cudaGetLastError(), #kernel);                                     \
    prof_end(I, op, -1);                                                       \
  } while (0)

__global__ void k_add(size_t n, const float *x, float *y) {
  GRID_STRIDE(i, n) y[i] += x[i];
}

__global__ void k_bias_add(size_t total, int c, int inner, const float *bias, float *y) {
  GRID_STRIDE(i, total) y[i] += bias[(i / (size_t)inner) % (size_t)c];
}

/* bias_grad of a dense layer: one thread per column, rows in order. */
__global__ void k_bias_grad_cols(int n, int c, const float *dy, float *db) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= c)
    return;
  float s = 0.0f;
  for (int i = 0; i < n; i++)
    s += dy[(size_t)i * c + j];
  db[j] = s;
}

/* bias_grad of a conv layer: one block per channel, a tree sum of its
 * n planes. */
__global__ void k_bias_grad_planes(int n, int c, int inner, const float *dy, float *db) {
  __shared__ float part[THREADS];
  const int j = blockIdx.x;
  const size_t count = (size_t)n * inner;
  float s = 0.0f;
  for (size_t t = threadIdx.x; t < count; t += blockDim.x) {
    size_t i = t / inner, k = t % inner;
    s += dy[(i * c + j) * inner + k];
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = THREADS / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w)
      part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    db[j] = part[0];
}

__global__ void k_relu_fwd(size_t n, const float *x, float *y) {
  GRID_STRIDE(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void k_relu_bwd(size_t n, const float *y, const float *dy, float *dx) {
  GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

/* One thread per entry of col: the input pixel it takes, or 0 in padding. */
__global__ void k_im2col(size_t total, ps_conv_geom g, const float *x, float *col) {
  const size_t plane = (size_t)g.oh * g.ow;
  GRID_STRIDE(t, total) {
    int pos = (int)(t % plane), row = (int)(t / plane);
    int kj = row % g.kw, ki = (row / g.kw) % g.kh, c = row / (g.kw * g.kh);
    int iy = (pos / g.ow) * g.stride - g.pad + ki, ix = (pos % g.ow) * g.stride - g.pad + kj;
    col[t] = (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) ? x[((size_t)c * g.h + iy) * g.w + ix]
                                                          : 0.0f;
  }
}

/* One thread per input pixel, gathering the col entries im2col made of it.
 * The CPU scatters them in (ki, kj) order; the gather adds them in the same
 * order, so the sums match to the bit and no atomics are needed. */
__global__ void k_col2im(size_t total, ps_conv_geom g, const float *col, float *dx) {
  const size_t plane = (size_t)g.oh * g.ow;
  GRID_STRIDE(t, total) {
    int ix = (int)(t % g.w), iy = (int)(t / g.w % g.h), c = (int)(t / ((size_t)g.w * g.h));
    float s = 0.0f;
    for (int ki = 0; ki < g.kh; ki++) {
      int ty = iy + g.pad - ki;
      if (ty < 0 || ty % g.stride != 0 || ty / g.stride >= g.oh)
        continue;
      for (int kj = 0; kj < g.kw; kj++) {
        int tx = ix + g.pad - kj;
        if (tx < 0 || tx % g.stride != 0 || tx / g.stride >= g.ow)
          continue;
        size_t row = (size_t)(c * g.kh + ki) * g.kw + kj;
        s += col[row * plane + (size_t)(ty / g.stride) * g.ow + tx / g.stride];
      }
    }
    dx[t] = s;
  }
}

/* One thread per output; the first maximum wins, as on the CPU. */
__global__ void k_maxpool_fwd(size_t total, ps_conv_geom g, const float *x, float *y,
                              int32_t *idx) {
  const size_t out_plane = (size_t)g.oh * g.ow, in_plane = (size_t)g.h * g.w;
  GRID_STRIDE(o, total) {
    const float *in = x + o / out_plane * in_plane;
    int r = (int)(o % out_plane), oy = r / g.ow, ox = r % g.ow;
    float best = -FLT_MAX;
    int32_t where = -1;
    for (int ki = 0; ki < g.kh; ki++) {
      int iy = oy * g.stride - g.pad + ki;
      if (iy < 0 || iy >= g.h)
        continue;
      for (int kj = 0; kj < g.kw; kj++) {
        int ix = ox * g.stride - g.pad + kj;
        if (ix < 0 || ix >= g.w)
          continue;
        float v = in[iy * g.w + ix];
        if (where < 0 || v > best) {
          best = v;
          where = iy * g.w + ix;
        }
      }
    }
    y[o] = best;
    idx[o] = where;
  }
}

/* The first output row or column whose window covers input position i. */
__device__ int first_window(int i, int pad, int k, int stride) {
  int lo = i + pad - k + 1;
  return lo <= 0 ? 0 : (lo + stride - 1) / stride;
}

/* One thread per input: the sum of the gradients of the outputs whose
 * argmax it was, in output order (the CPU's scatter order), so overlapping
 * windows (3x3, stride 2) need no atomics and match to the bit. */
__global__ void k_maxpool_bwd(size_t total, ps_conv_geom g, const int32_t *idx, const float *dy,
                              float *dx) {
  const size_t out_plane = (size_t)g.oh * g.ow, in_plane = (size_t)g.h * g.w;
  GRID_STRIDE(t, total) {
    size_t p = t / in_plane;
    int at = (int)(t % in_plane), iy = at / g.w, ix = at % g.w;
    int oy1 = min((iy + g.pad) / g.stride, g.oh - 1), ox1 = min((ix + g.pad) / g.stride, g.ow - 1);
    float s = 0.0f;
    for (int oy = first_window(iy, g.pad, g.kh, g.stride); oy <= oy1; oy++)
      for (int ox = first_window(ix, g.pad, g.kw, g.stride); ox <= ox1; ox++) {
        size_t o = p * out_plane + (size_t)oy * g.ow + ox;
        if (idx[o] == at)
          s += dy[o];
      }
    dx[t] = s;
  }
}

#define DROPOUT_CHUNK 4096  /* groups decided per round, in shared memory */

/* One block per sample.  A sample's decisions are one sequential stream
 * (nn/dropout.h), so thread 0 draws them, DROPOUT_CHUNK groups at a time,
 * and the block applies them to the values.  group must divide per. */
__global__ void k_dropout_fwd(size_t per, size_t group, uint32_t keep_below, float scale,
                              uint64_t seed, uint64_t first, const float *x, float *y,
                              uint8_t *mask) {
  __shared__ uint8_t keep[DROPOUT_CHUNK];
  const size_t groups = per / group, base = blockIdx.x * per;
  ps_dropout_draws d;
  ps_dropout_begin(&d, seed, first + blockIdx.x);
  for (size_t g0 = 0; g0 < groups; g0 += DROPOUT_CHUNK) {
    size_t ng = groups - g0 < DROPOUT_CHUNK ? groups - g0 : DROPOUT_CHUNK;
    if (threadIdx.x == 0)
      for (size_t j = 0; j < ng; j++)
        keep[j] = ps_dropout_next(&d, keep_below);
    __syncthreads();
    for (size_t v = threadIdx.x; v < ng * group; v += blockDim.x) {
      size_t at = base + g0 * group + v;
      uint8_t m = keep[v / group];
      mask[at] = m;
      y[at] = x[at] * ((float)m * scale);
    }
    __syncthreads();
  }
}

__global__ void k_dropout_bwd(size_t n, float scale, const uint8_t *mask, const float *dy,
                              float *dx) {
  GRID_STRIDE(i, n) dx[i] = dy[i] * ((float)mask[i] * scale);
}

/* One thread per row, in double as on the CPU; each row's loss and hit go
 * to the host, which sums them in row order. */
__global__ void k_nll(int n, int k, const float *logits, const uint8_t *labels, float scale,
                      float *dlogits, double *row_loss, uint8_t *row_right) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  const float *z = logits + (size_t)i * k;
  int best = 0;
  for (int j = 1; j < k; j++)
    if (z[j] > z[best])
      best = j;
  row_right[i] = best == labels[i];
  float mx = z[best];
  double sum = 0.0;
  for (int j = 0; j < k; j++)
    sum += exp((double)(z[j] - mx));
  double lse = (double)mx + log(sum);
  row_loss[i] = lse - (double)z[labels[i]];
  if (dlogits != NULL) {
    float *d = dlogits + (size_t)i * k;
    for (int j = 0; j < k; j++)
      d[j] = (float)exp((double)z[j] - lse) * scale;
    d[labels[i]] -= scale;
  }
}

/* ------------------------------------------------------------------ ops */

static void cu_add(ps_backend *b, size_t n, const float *x, float *y) {
  cuda_impl *I = use(b);
  LAUNCH(I, PS_CUDA_OP_ADD, n, k_add, n, x, y);
}

static void cu_gemm(ps_backend *b, int ta, int tb, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *bm, int ldb, float beta, float *c,
                    int ldc) {
  cuda_impl *I = use(b);
  int shape = I->prof != NULL ? ps__cuda_profile_shape(I->prof, m, n, k, ta, tb) : -1;
  prof_begin(I);
  /* cuBLAS is column-major: the row-major C[m x n] is the column-major
   * C^T[n x m] = op(B)^T op(A)^T, so the operands and m, n swap places and
   * every leading dimension stays what it is. */
  cublasStatus_t st = cublasSgemm(I->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, bm, ldb, a,
                                  lda, &beta, c, ldc);
  if (st != CUBLAS_STATUS_SUCCESS)
    die(I, "cublasSgemm", cublasGetStatusString(st));
  prof_end(I, PS_CUDA_OP_GEMM, shape);
}

static void cu_bias_add(ps_backend *b, int n, int c, int inner, const float *bias, float *y) {
  cuda_impl *I = use(b);
  size_t total = (size_t)n * c * inner;
  LAUNCH(I, PS_CUDA_OP_BIAS_ADD, total, k_bias_add, total, c, inner, bias, y);
}

static void cu_bias_grad(ps_backend *b, int n, int c, int inner, const float *dy, float *db) {
  cuda_impl *I = use(b);
  prof_begin(I);
  if (inner == 1)
    k_bias_grad_cols<<<(c + THREADS - 1) / THREADS, THREADS, 0, I->stream>>>(n, c, dy, db);
  else
    k_bias_grad_planes<<<c, THREADS, 0, I->stream>>>(n, c, inner, dy, db);
  check(I, cudaGetLastError(), "k_bias_grad");
  prof_end(I, PS_CUDA_OP_BIAS_GRAD, -1);
}

static void cu_relu_fwd(ps_backend *b, size_t n, const float *x, float *y) {
  cuda_impl *I = use(b);
  LAUNCH(I, PS_CUDA_OP_RELU_FWD, n, k_relu_fwd, n, x, y);
}

static void cu_relu_bwd(ps_backend *b, size_t n, const float *y, const float *dy, float *dx) {
  cuda_impl *I = use(b);
  LAUNCH(I, PS_CUDA_OP_RELU_BWD, n, k_relu_bwd, n, y, dy, dx);
}

static void cu_im2col(ps_backend *b, const ps_conv_geom *g, const float *x, float *col) {
  cuda_impl *I = use(b);
  size_t total = (size_t)g->c * g->kh * g->kw * g->oh * g->ow;
  LAUNCH(I, PS_CUDA_OP_IM2COL, total, k_im2col, total, *g, x, col);
}

static void cu_col2im(ps_backend *b, const ps_conv_geom *g, const float *col, float *dx) {
  cuda_impl *I = use(b);
  size_t total = (size_t)g->c * g->h * g->w;
  LAUNCH(I, PS_CUDA_OP_COL2IM, total, k_col2im, total, *g, col, dx);
}

static void cu_maxpool_fwd(ps_backend *b, int n, const ps_conv_geom *g, const float *x, float *y,
                           int32_t *idx) {
  cuda_impl *I = use(b);
  size_t total = (size_t)n * g->c * g->oh * g->ow;
  LAUNCH(I, PS_CUDA_OP_MAXPOOL_FWD, total, k_maxpool_fwd, total, *g, x, y, idx);
}

static void cu_maxpool_bwd(ps_backend *b, int n, const ps_conv_geom *g, const int32_t *idx,
                           const float *dy, float *dx) {
  cuda_impl *I = use(b);
  size_t total = (size_t)n * g->c * g->h * g->w;
  LAUNCH(I, PS_CUDA_OP_MAXPOOL_BWD, total, k_maxpool_bwd, total, *g, idx, dy, dx);
}

static void cu_dropout_fwd(ps_backend *b, int n, size_t per, size_t group, float p,
                           uint64_t seed, uint64_t first, const float *x, float *y,
                           uint8_t *mask) {
  cuda_impl *I = use(b);
  if (n <= 0 || per == 0)
    return;
  prof_begin(I);
  k_dropout_fwd<<<n, THREADS, 0, I->stream>>>(per, group, ps_dropout_keep_below(p),
                                               ps_dropout_scale(p), seed, first, x, y, mask);
  check(I, cudaGetLastError(), "k_dropout_fwd");
  prof_end(I, PS_CUDA_OP_DROPOUT_FWD, -1);
}

static void cu_dropout_bwd(ps_backend *b, size_t count, float p, const uint8_t *mask,
                           const float *dy, float *dx) {
  cuda_impl *I = use(b);
  LAUNCH(I, PS_CUDA_OP_DROPOUT_BWD, count, k_dropout_bwd, count, ps_dropout_scale(p), mask, dy,
         dx);
}

static void nll_scratch_free(ps_backend *b) {
  cuda_impl *I = (cuda_impl *)b->impl;
  cu_free(b, I->d_labels);
  cu_free(b, I->d_right);
  cu_free(b, I->d_loss);
  cu_host_free(b, I->h_labels);
  cu_host_free(b, I->h_right);
  cu_host_free(b, I->h_loss);
  I->d_labels = I->d_right = I->h_labels = I->h_right = NULL;
  I->d_loss = I->h_loss = NULL;
  I->nll_rows = 0;
}

/* Room for n rows in nll's scratch: grown, rarely, to the largest batch. */
static int nll_room(ps_backend *b, int n) {
  cuda_impl *I = (cuda_impl *)b->impl;
  if (n <= I->nll_rows)
    return 0;
  nll_scratch_free(b);
  size_t rows = (size_t)(n < 1024 ? 1024 : n);
  I->d_labels = (uint8_t *)cu_alloc(b, rows);
  I->d_right = (uint8_t *)cu_alloc(b, rows);
  I->d_loss = (double *)cu_alloc(b, rows * sizeof(double));
  I->h_labels = (uint8_t *)cu_host_alloc(b, rows);
  I->h_right = (uint8_t *)cu_host_alloc(b, rows);
  I->h_loss = (double *)cu_host_alloc(b, rows * sizeof(double));
  if (I->d_labels == NULL || I->d_right == NULL || I->d_loss == NULL || I->h_labels == NULL ||
      I->h_right == NULL || I->h_loss == NULL) {
    nll_scratch_free(b);
    return -ENOMEM;
  }
  I->nll_rows = (int)rows;
  return 0;
}

static double cu_nll(ps_backend *b, int n, int k, const float *logits, const uint8_t *labels,
                     float scale, float *dlogits, size_t *correct) {
  cuda_impl *I = use(b);
  if (n <= 0)
    return 0.0;
  if (nll_room(b, n) != 0)
    die(I, "nll", "out of device or pinned memory for the labels");
  prof_begin(I);
  /* The previous nll waited for its copies, so the pinned labels are free. */
  memcpy(I->h_labels, labels, (size_t)n);
  check(I, cudaMemcpyAsync(I->d_labels, I->h_labels, (size_t)n, cudaMemcpyHostToDevice,
                           I->stream), "cudaMemcpyAsync labels");
  k_nll<<<(n + 127) / 128, 128, 0, I->stream>>>(n, k, logits, I->d_labels, scale, dlogits,
                                                 I->d_loss, I->d_right);
  check(I, cudaGetLastError(), "k_nll");
  check(I, cudaMemcpyAsync(I->h_loss, I->d_loss, (size_t)n * sizeof(double),
                           cudaMemcpyDeviceToHost, I->stream), "cudaMemcpyAsync losses");
  check(I, cudaMemcpyAsync(I->h_right, I->d_right, (size_t)n, cudaMemcpyDeviceToHost, I->stream),
        "cudaMemcpyAsync hits");
  prof_end(I, PS_CUDA_OP_NLL, -1);
  check(I, cudaStreamSynchronize(I->stream), "cudaStreamSynchronize");
  double loss = 0.0;
  size_t right = 0;
  for (int i = 0; i < n; i++) {
    loss += I->h_loss[i];
    right += I->h_right[i];
  }
  if (correct != NULL)
    *correct += right;
  return loss;
}

/* ------------------------------------------------------------ lifecycle */

static const char *cu_describe(ps_backend *b) { return ((cuda_impl *)b->impl)->desc; }

/* Undoes what ps_backend_cuda_new did, however far it got. */
static void cu_close(ps_backend *b) {
  cuda_impl *I = (cuda_impl *)b->impl;
  if (I == NULL)
    return;
  if (I->stream != NULL) {
    cudaSetDevice(I->device);
    current_device = I->device;
    cudaStreamSynchronize(I->stream);
  }
  if (I->prof != NULL && I->stream != NULL)
    check(I, ps__cuda_profile_report(I->prof, stderr), "cudaEventElapsedTime");
  ps__cuda_profile_free(I->prof);
  nll_scratch_free(b);
  for (size_t i = 0; i < I->nblocks; i++)
    cudaFree(I->blocks[i].p);
  free(I->blocks);
  if (I->blas != NULL)
    cublasDestroy(I->blas);
  if (I->stream != NULL)
    cudaStreamDestroy(I->stream);
  free(I);
  b->impl = NULL;
}

static const ps_backend_ops cuda_ops = {
    .name = "cuda",
    .describe = cu_describe,
    .close = cu_close,
    .alloc = cu_alloc,
    .free = cu_free,
    .to_device = cu_to_device,
    .to_host = cu_to_host,
    .copy = cu_copy,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .zero = cu_zero,
    .add = cu_add,
    .gemm = cu_gemm,
    .bias_add = cu_bias_add,
    .bias_grad = cu_bias_grad,
    .relu_fwd = cu_relu_fwd,
    .relu_bwd = cu_relu_bwd,
    .im2col = cu_im2col,
    .col2im = cu_col2im,
    .maxpool_fwd = cu_maxpool_fwd,
    .maxpool_bwd = cu_maxpool_bwd,
    .dropout_fwd = cu_dropout_fwd,
    .dropout_bwd = cu_dropout_bwd,
    .nll = cu_nll,
};

int ps_backend_cuda_devices(ps_errbuf *eb) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    /* "driver version is insufficient" is also what a machine with no
     * driver at all gets: say which of the two it is. */
    int driver = 0, runtime = 0;
    char why[96] = "";
    if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess &&
        cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
      if (driver == 0)
        snprintf(why, sizeof why, " (no NVIDIA driver is installed)");
      else
        snprintf(why, sizeof why, " (the driver gives CUDA %d.%d, this runtime needs %d.%d)",
                 driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    }
    return ps_err_set(eb, -ENODEV, "cudaGetDeviceCount: %s%s", cudaGetErrorString(e), why);
  }
  if (count < 1)
    return ps_err_set(eb, -ENODEV, "cudaGetDeviceCount: 0 devices");
  return count;
}

ps_backend *ps_backend_cuda_new(int device, ps_errbuf *eb) {
  ps_errbuf why = {0, {0}};
  int count = ps_backend_cuda_devices(&why);
  if (count < 0) {
    ps_err_set(eb, -ENODEV, "cuda: no GPU: %s", why.msg);
    return NULL;
  }
  if (device < 0 || device >= count) {
    ps_err_set(eb, -ENODEV, "cuda:%d: device %d not present, this machine has %d", device,
               device, count);
    return NULL;
  }
  ps_backend *b = (ps_backend *)calloc(1, sizeof *b);
  cuda_impl *I = (cuda_impl *)calloc(1, sizeof *I);
  if (b == NULL || I == NULL) {
    free(b);
    free(I);
    ps_err_set(eb, -ENOMEM, "cuda:%d: out of host memory for a backend", device);
    return NULL;
  }
  b->ops = &cuda_ops;
  b->host_memory = 0;
  b->impl = I;
  I->device = device;
  cudaError_t e;
  cublasStatus_t st;
  cudaDeviceProp prop;
  int runtime = 0, blas_version = 0;
  if ((e = cudaSetDevice(device)) != cudaSuccess) {
    ps_err_set(eb, -ENODEV, "cuda:%d: cudaSetDevice: %s", device, cudaGetErrorString(e));
    goto fail;
  }
  current_device = device;
  /* Non-blocking: the stream does not wait for the legacy default stream,
   * which other code in the process may use. */
  if ((e = cudaStreamCreateWithFlags(&I->stream, cudaStreamNonBlocking)) != cudaSuccess) {
    ps_err_set(eb, -ENODEV, "cuda:%d: cudaStreamCreate: %s", device, cudaGetErrorString(e));
    goto fail;
  }
  if ((st = cublasCreate(&I->blas)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasSetStream(I->blas, I->stream)) != CUBLAS_STATUS_SUCCESS) {
    ps_err_set(eb, -ENODEV, "cuda:%d: cuBLAS: %s", device, cublasGetStatusString(st));
    goto fail;
  }
  if ((e = ps__cuda_profile_new(&I->prof)) != cudaSuccess) {
    ps_err_set(eb, -ENODEV, "cuda:%d: PS_CUDA_PROFILE: %s", device, cudaGetErrorString(e));
    goto fail;
  }
  if (nll_room(b, 1024) != 0) {
    ps_err_set(eb, -ENOMEM, "cuda:%d: out of memory for a backend", device);
    goto fail;
  }
  if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
    ps_err_set(eb, -ENODEV, "cuda:%d: cudaGetDeviceProperties: %s", device,
               cudaGetErrorString(e));
    goto fail;
  }
  cudaRuntimeGetVersion(&runtime);
  cublasGetVersion(I->blas, &blas_version);
  snprintf(I->desc, sizeof I->desc,
           "cuda:%d %.100s (sm_%d%d, %.1f GiB), CUDA runtime %d.%d, cuBLAS %d", device, prop.name,
           prop.major, prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
           runtime / 1000, runtime % 1000 / 10, blas_version);
  return b;
fail:
  (void)cudaGetLastError();
  cu_close(b);
  free(b);
  return NULL;
}
