/* The CUDA compute backend: cuBLAS's sgemm for gemm, kernels for the other
 * ops of backend.h (the convolution: kernels around sgemms over the whole
 * batch), queued on one stream per backend object, on device memory from a
 * per-backend cache of freed blocks; PS_CUDA_PROFILE=1 times every op
 * (cuda_profile.cu).  Built with make CUDA=1.
 *
 * The kernels compute what backend_cpu.c computes, in the same order where
 * the CPU's order decides the last bit (col2im and max-pool backward gather
 * their sums in the CPU's scatter order; the optimizers do optim.c's float
 * operations, none fused), and dropout draws its masks from the one
 * definition in nn/dropout.h: tests/gpu/test_backend_cuda.c checks each op
 * against the CPU backend. */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <float.h>
#include <limits.h>
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
  int sync;                /* PS_CUDA_SYNC=1: wait for every op, naming it */
  int last_op;             /* the kind of the last op queued (PS_CUDA_OP_...), -1 */
  char desc[256];
} cuda_impl;

/* A fault on the device (an illegal address, a launch failure) is sticky:
 * every later call fails too, so the one honest answer is to stop. */
static void die(const cuda_impl *I, const char *what, const char *why) {
  fprintf(stderr, "paramserv: cuda:%d: %s: %s (the GPU cannot go on; stopping)\n", I->device,
          what, why);
  abort();
}

/* "cudaErrorIllegalAddress: an illegal memory access was encountered" */
static const char *cuda_why(cudaError_t e, char *buf, size_t size) {
  snprintf(buf, size, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
  return buf;
}

/* A kernel's fault (sticky: every later call returns it). */
static int is_fault(cudaError_t e) {
  switch (e) {
  case cudaErrorIllegalAddress: case cudaErrorLaunchFailure: case cudaErrorLaunchTimeout:
  case cudaErrorIllegalInstruction: case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace: case cudaErrorInvalidPc: case cudaErrorHardwareStackError:
  case cudaErrorAssert:
    return 1;
  default:
    return 0;
  }
}

static void check(const cuda_impl *I, cudaError_t e, const char *what) {
  char why[512], err[256];
  if (e == cudaSuccess)
    return;
  /* A fault shows at whatever call comes next: say which op came before. */
  if (is_fault(e) && !I->sync)
    snprintf(why, sizeof why,
             "%s (a fault of an op queued before, the last one: %s; PS_CUDA_SYNC=1 names "
             "the op that faulted)",
             cuda_why(e, err, sizeof err), ps__cuda_op_name(I->last_op));
  else
    cuda_why(e, why, sizeof why);
  die(I, what, why);
}

/* Where nothing is left to protect (closing): say it and go on. */
static void warn(const cuda_impl *I, cudaError_t e, const char *what) {
  char why[256];
  if (e != cudaSuccess)
    fprintf(stderr, "paramserv: cuda:%d: %s: %s\n", I->device, what, cuda_why(e, why, sizeof why));
}

/* The runtime's current device is per host thread; the ops of one backend
 * may come from different threads (one at a time), and a library user may
 * call cudaSetDevice between them, so each asks the runtime which device is
 * current (a thread-local read, no driver call) and sets its own when it is
 * not. */
static cuda_impl *use(ps_backend *b) {
  cuda_impl *I = (cuda_impl *)b->impl;
  int current = -1;
  check(I, cudaGetDevice(&current), "cudaGetDevice");
  if (current != I->device)
    check(I, cudaSetDevice(I->device), "cudaSetDevice");
  return I;
}

/* -------------------------------------------------------- profile, sync */

/* Wait for the stream.  A fault of an op queued since the last wait shows
 * here; `what` says which wait, and the message names the last op queued
 * (PS_CUDA_SYNC=1 waits after every op, so that the op named is the one
 * that faulted). */
static void stream_sync(cuda_impl *I, const char *what) {
  cudaError_t e = cudaStreamSynchronize(I->stream);
  if (e != cudaSuccess) {
    char why[512], err[256];
    snprintf(why, sizeof why, "%s (in an op queued since the last wait; the last one: %s%s)",
             cuda_why(e, err, sizeof err), ps__cuda_op_name(I->last_op),
             I->sync ? "" : "; PS_CUDA_SYNC=1 names the op that faulted");
    die(I, what, why);
  }
  if (I->prof != NULL)
    check(I, ps__cuda_profile_synced(I->prof), "cudaEventElapsedTime");
}

/* Before a kernel or cuBLAS call: with PS_CUDA_PROFILE=1, the gate and the
 * start event (cuda_profile.h).  Nothing between it and prof_end may wait
 * for the stream. */
static void prof_begin(cuda_impl *I) {
  if (I->prof != NULL)
    check(I, ps__cuda_profile_begin(I->prof, I->stream, 1), "PS_CUDA_PROFILE: begin");
}

/* Before a copy between the host and the device, which may wait for the
 * stream (pageable host memory): no gate. */
static void prof_begin_copy(cuda_impl *I) {
  if (I->prof != NULL)
    check(I, ps__cuda_profile_begin(I->prof, I->stream, 0), "PS_CUDA_PROFILE: begin");
}

/* After every op's launch: the end event (PS_CUDA_PROFILE=1), and with
 * PS_CUDA_SYNC=1 a wait that names the op when it faulted. */
static void prof_end(cuda_impl *I, int op, int shape) {
  I->last_op = op;
  if (I->prof != NULL)
    check(I, ps__cuda_profile_end(I->prof, I->stream, op, shape), "PS_CUDA_PROFILE: end");
  if (I->sync) {
    cudaError_t e = cudaStreamSynchronize(I->stream);
    char why[320], err[256];
    if (e != cudaSuccess) {
      snprintf(why, sizeof why, "%s (PS_CUDA_SYNC=1: this op faulted)",
               cuda_why(e, err, sizeof err));
      die(I, ps__cuda_op_name(op), why);
    }
  }
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
      check(I, cudaFree(I->blocks[i].p), "cudaFree of a cached block");
  }
  I->nblocks = kept;
}

/* A new block of need bytes, or NULL when the device is out of memory
 * (cudaErrorMemoryAllocation, also after the cached blocks went back).  Any
 * other error is not a lack of memory but a fault or a misuse: it stops,
 * naming it. */
static void *device_malloc(cuda_impl *I, size_t need) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, need);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  /* out of memory is not sticky: clear it */
    release_cached(I);
    e = cudaMalloc(&p, need);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return NULL;
    }
  }
  if (e != cudaSuccess) {
    char what[64];
    snprintf(what, sizeof what, "cudaMalloc of %zu bytes", need);
    check(I, e, what);
  }
  return p;
}

static void *cu_alloc(ps_backend *b, size_t bytes) {
  cuda_impl *I = use(b);
  if (bytes > SIZE_MAX - 255)
    return NULL;
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
  void *p = device_malloc(I, need);
  if (p == NULL)
    return NULL;
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
  cuda_impl *I = use(b);
  void *p = NULL;
  cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return NULL;
  }
  check(I, e, "cudaHostAlloc");
  return p;
}

static void cu_host_free(ps_backend *b, void *p) {
  if (p != NULL) {
    cuda_impl *I = use(b);
    check(I, cudaFreeHost(p), "cudaFreeHost");
  }
}

static void cu_to_device(ps_backend *b, void *dst, const void *host_src, size_t bytes) {
  cuda_impl *I = use(b);
  prof_begin_copy(I);
  check(I, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, I->stream),
        "cudaMemcpyAsync to the device");
  prof_end(I, PS_CUDA_OP_H2D, -1);
}

static void cu_to_host(ps_backend *b, void *host_dst, const void *src, size_t bytes) {
  cuda_impl *I = use(b);
  prof_begin_copy(I);
  check(I, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, I->stream),
        "cudaMemcpyAsync to the host");
  prof_end(I, PS_CUDA_OP_D2H, -1);
  stream_sync(I, "cudaStreamSynchronize after a copy to the host");
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

static void cu_copy2d(ps_backend *b, int rows, size_t width, float *dst, size_t dst_stride,
                      const float *src, size_t src_stride) {
  cuda_impl *I = use(b);
  if (rows <= 0 || width == 0)
    return;
  prof_begin(I);
  check(I, cudaMemcpy2DAsync(dst, dst_stride * sizeof(float), src, src_stride * sizeof(float),
                             width * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice,
                             I->stream), "cudaMemcpy2DAsync on the device");
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

/* The convolution's kernels index with Ix: uint32_t, whose divisions cost a
 * fraction of 64-bit ones, whenever every index they compute is below 2^31
 * (then i + the grid's stride stays below 2^32), else size_t (LAUNCH_IX). */
#define GRID_STRIDE_IX(Ix, i, n)                                                       \
  for (Ix i = (Ix)(blockIdx.x * (size_t)blockDim.x + threadIdx.x); i < (Ix)(n);        \
       i += (Ix)gridDim.x * (Ix)blockDim.x)

#define LAUNCH_IX(I, op, n, largest, kernel, ...)                                      \
  do {                                                                                 \
    if ((size_t)(largest) < ((size_t)1 << 31))                                         \
      LAUNCH(I, op, n, kernel<uint32_t>, (uint32_t)(n), __VA_ARGS__);                  \
    else                                                                               \
      LAUNCH(I, op, n, kernel<size_t>, (size_t)(n), __VA_ARGS__);                      \
  } while (0)

/* The im2col matrices of m samples side by side, col[k][m * plane] (sample
 * s's columns at s * plane; ld = m * plane): one thread per entry of col,
 * the input pixel it takes or 0 in the padding. */
template <typename Ix>
__global__ void k_im2col(Ix total, ps_conv_geom g, Ix ld, const float *x, float *col) {
  const Ix plane = (Ix)g.oh * (Ix)g.ow, in = (Ix)g.c * (Ix)g.h * (Ix)g.w;
  GRID_STRIDE_IX(Ix, t, total) {
    Ix row = t / ld, r = t - row * ld, s = r / plane, pos = r - s * plane;
    int kj = (int)(row % (Ix)g.kw), ki = (int)(row / (Ix)g.kw % (Ix)g.kh);
    int c = (int)(row / ((Ix)g.kw * (Ix)g.kh));
    int oy = (int)(pos / (Ix)g.ow), ox = (int)(pos - (Ix)oy * (Ix)g.ow);
    int iy = oy * g.stride - g.pad + ki, ix = ox * g.stride - g.pad + kj;
    col[t] = (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
                 ? x[s * in + ((Ix)c * (Ix)g.h + (Ix)iy) * (Ix)g.w + (Ix)ix]
                 : 0.0f;
  }
}

/* dx of m samples from their col [k][ld] (k_im2col's layout): one thread per
 * input pixel, gathering the col entries im2col made of it.  The CPU
 * scatters them in (ki, kj) order; the gather adds them in the same order,
 * so the sums match to the bit and no atomics are needed. */
template <typename Ix>
__global__ void k_col2im(Ix total, ps_conv_geom g, Ix ld, const float *col, float *dx) {
  const Ix plane = (Ix)g.oh * (Ix)g.ow, in = (Ix)g.c * (Ix)g.h * (Ix)g.w;
  GRID_STRIDE_IX(Ix, t, total) {
    Ix s = t / in, r = t - s * in;
    int ix = (int)(r % (Ix)g.w), iy = (int)(r / (Ix)g.w % (Ix)g.h);
    int c = (int)(r / ((Ix)g.w * (Ix)g.h));
    const float *cs = col + s * plane;
    float sum = 0.0f;
    for (int ki = 0; ki < g.kh; ki++) {
      int ty = iy + g.pad - ki;
      if (ty < 0 || ty % g.stride != 0 || ty / g.stride >= g.oh)
        continue;
      for (int kj = 0; kj < g.kw; kj++) {
        int tx = ix + g.pad - kj;
        if (tx < 0 || tx % g.stride != 0 || tx / g.stride >= g.ow)
          continue;
        Ix row = (Ix)((c * g.kh + ki) * g.kw + kj);
        sum += cs[row * ld + (Ix)(ty / g.stride) * (Ix)g.ow + (Ix)(tx / g.stride)];
      }
    }
    dx[t] = sum;
  }
}

/* dst[j][i][p] = src[i][j][p] for i < a, j < b, p < plane: the convolution's
 * gemm output [oc][m][plane] into y's [m][oc][plane], and dy the other way. */
template <typename Ix>
__global__ void k_permute(Ix total, Ix a, Ix b, Ix plane, const float *src, float *dst) {
  GRID_STRIDE_IX(Ix, t, total) {
    Ix r = t / plane, p = t - r * plane, j = r / a, i = r - j * a;
    dst[t] = src[(i * b + j) * plane + p];
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

/* One thread per value, samples along the grid's y: each thread takes its
 * group's decision from nn/dropout.h's counter-based definition on its own,
 * so the draws spread over the grid and no thread waits for another's.
 * group must divide per; per < 2^32 (a model's activations are below 2^26
 * values a sample). */
__global__ void k_dropout_fwd(int n, uint32_t per, uint32_t group, uint32_t keep_below,
                              float scale, uint64_t seed, uint64_t first, const float *x,
                              float *y, uint8_t *mask) {
  for (int s = blockIdx.y; s < n; s += gridDim.y) {
    const uint64_t key = ps_dropout_key(seed, first + (uint64_t)s);
    const size_t base = (size_t)s * per;
    for (uint32_t v = blockIdx.x * blockDim.x + threadIdx.x; v < per;
         v += gridDim.x * blockDim.x) {
      uint32_t j = v / group;
      uint8_t m = ps_dropout_decide(ps_dropout_word(key, j / 4), j, keep_below);
      mask[base + v] = m;
      y[base + v] = x[base + v] * ((float)m * scale);
    }
  }
}

__global__ void k_dropout_bwd(size_t n, float scale, const uint8_t *mask, const float *dy,
                              float *dx) {
  GRID_STRIDE(i, n) dx[i] = dy[i] * ((float)mask[i] * scale);
}

/* The optimizers of optim.c, one thread per value, with its constants
 * (ps_optim_coefs).  Every float operation is a round-to-nearest intrinsic,
 * which nvcc never contracts into an FMA (the C build contracts none,
 * -std=c11), in optim.c's order, and division and sqrt are IEEE's as on
 * the CPU: the results equal ps_optim_apply's to the bit. */
#define OPT_SGD 0
#define OPT_MOMENTUM 1
#define OPT_NESTEROV 2
#define OPT_ADAGRAD 3
#define OPT_ADAM 4

__global__ void k_optim(size_t n, int rule, ps_optim_coef c, float *w, const float *g, float *s0,
                        float *s1) {
  GRID_STRIDE(i, n) {
    float gi = g[i], wi = w[i];
    if (c.wd != 0.0f)
      gi = __fadd_rn(gi, __fmul_rn(c.wd, wi));  /* g + wd * w */
    switch (rule) {
    case OPT_SGD:
      wi = __fsub_rn(wi, __fmul_rn(c.lr, gi));
      break;
    case OPT_MOMENTUM:
    case OPT_NESTEROV: {
      float v = __fadd_rn(__fmul_rn(c.mu, s0[i]), gi);  /* v = mu * v + g */
      s0[i] = v;
      float d = rule == OPT_MOMENTUM ? v : __fadd_rn(gi, __fmul_rn(c.mu, v));
      wi = __fsub_rn(wi, __fmul_rn(c.lr, d));
      break;
    }
    case OPT_ADAGRAD: {
      float acc = __fadd_rn(s0[i], __fmul_rn(gi, gi));
      s0[i] = acc;
      /* w -= lr * g / (sqrt(acc) + eps) */
      wi = __fsub_rn(wi, __fdiv_rn(__fmul_rn(c.lr, gi), __fadd_rn(__fsqrt_rn(acc), c.eps)));
      break;
    }
    case OPT_ADAM: {
      float m = __fadd_rn(__fmul_rn(c.b1, s0[i]), __fmul_rn(c.c1, gi));
      float v = __fadd_rn(__fmul_rn(c.b2, s1[i]), __fmul_rn(__fmul_rn(c.c2, gi), gi));
      s0[i] = m;
      s1[i] = v;
      /* w -= step * m / (sqrt(v) * isb + eps) */
      wi = __fsub_rn(wi, __fdiv_rn(__fmul_rn(c.step, m),
                                   __fadd_rn(__fmul_rn(__fsqrt_rn(v), c.inv_sqrt_bc2), c.eps)));
      break;
    }
    }
    w[i] = wi;
  }
}

/* One thread per row, in double as on the CPU; each row's loss and hit go
 * to the host, which sums them in row order. */
__global__ void k_nll(int n, int k, const float *logits, const uint8_t *labels, float scale,
                      float *dlogits, double *row_loss, uint8_t *row_right) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  if (k == 1) {
    /* The logistic loss of one logit, as the CPU computes it. */
    double z1 = logits[i], y = labels[i] ? 1.0 : 0.0;
    row_loss[i] = (z1 > 0 ? z1 : 0) - z1 * y + log1p(exp(-fabs(z1)));
    row_right[i] = (z1 > 0) == (labels[i] != 0);
    if (dlogits != NULL)
      dlogits[i] = (float)(1.0 / (1.0 + exp(-z1)) - y) * scale;
    return;
  }
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
  if (st != CUBLAS_STATUS_SUCCESS) {
    char what[160];
    snprintf(what, sizeof what, "cublasSgemm (m %d n %d k %d ta %d tb %d lda %d ldb %d ldc %d)", m,
             n, k, ta, tb, lda, ldb, ldc);
    die(I, what, cublasGetStatusString(st));
  }
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

/* The batched convolution: a chunk of m samples (the whole batch unless its
 * scratch would pass CONV_WS_MAX floats) goes through
 *   forward:  im2col of the chunk into col [k][m * plane], one gemm
 *             w [oc x k] col -> [oc][m * plane], one permutation into y's
 *             [m][oc][plane] (the gemm writes y itself when m = 1);
 *   backward: dy permuted to [oc][m * plane], im2col again, one gemm for dw
 *             (its K = m * plane, accumulated over chunks), one for
 *             dcol = w^T dy (into col's place: the dw gemm was col's last
 *             reader), and one col2im of the chunk,
 * 4 or 5 launches a chunk where the per-sample loop made 2 to 4 a sample.
 * The scratch: col, then the permuted activations [oc][m * plane]. */
/* 128 MiB: the cnn's conv2 takes 165 samples a chunk (811 KB of scratch
 * each), and gemms of 95,000 columns keep a GPU as busy as larger ones. */
#define CONV_WS_MAX ((size_t)1 << 25)  /* floats */

static int conv_chunk(int n, const ps_conv_geom *g, int oc) {
  size_t plane = (size_t)g->oh * g->ow, k = (size_t)g->c * g->kh * g->kw;
  size_t s = CONV_WS_MAX / (plane * (k + (size_t)oc));
  /* gemm dimensions are ints */
  if (s > (size_t)INT_MAX / plane)
    s = (size_t)INT_MAX / plane;
  if (s < 1)
    s = 1;
  return s < (size_t)n ? (int)s : (n > 1 ? n : 1);
}

static size_t cu_conv_ws(ps_backend *b, int n, const ps_conv_geom *g, int oc) {
  (void)b;
  size_t plane = (size_t)g->oh * g->ow, k = (size_t)g->c * g->kh * g->kw;
  return (size_t)conv_chunk(n, g, oc) * plane * (k + (size_t)oc);
}

static void cu_conv_fwd(ps_backend *b, int n, const ps_conv_geom *g, int oc, const float *w,
                        const float *x, float *y, float *ws) {
  cuda_impl *I = use(b);
  const int k = g->c * g->kh * g->kw, plane = g->oh * g->ow, chunk = conv_chunk(n, g, oc);
  const size_t in = (size_t)g->c * g->h * g->w, out = (size_t)oc * plane;
  float *col = ws, *tmp = ws + (size_t)chunk * plane * k;
  for (int s0 = 0; s0 < n; s0 += chunk) {
    const int m = n - s0 < chunk ? n - s0 : chunk, ld = m * plane;
    const size_t ncol = (size_t)k * ld, nx = (size_t)m * in, ny = (size_t)m * out;
    LAUNCH_IX(I, PS_CUDA_OP_IM2COL, ncol, ncol > nx ? ncol : nx, k_im2col, *g, ld,
              x + (size_t)s0 * in, col);
    float *c = m == 1 ? y + (size_t)s0 * out : tmp;
    cu_gemm(b, 0, 0, oc, ld, k, 1.0f, w, k, col, ld, 0.0f, c, ld);
    if (m > 1)
      LAUNCH_IX(I, PS_CUDA_OP_TRANSPOSE, ny, ny, k_permute, oc, m, plane, tmp,
                y + (size_t)s0 * out);
  }
}

static void cu_conv_bwd(ps_backend *b, int n, const ps_conv_geom *g, int oc, const float *w,
                        const float *x, const float *dy, float *dw, float *dx, float *ws) {
  cuda_impl *I = use(b);
  const int k = g->c * g->kh * g->kw, plane = g->oh * g->ow, chunk = conv_chunk(n, g, oc);
  const size_t in = (size_t)g->c * g->h * g->w, out = (size_t)oc * plane;
  float *col = ws, *tmp = ws + (size_t)chunk * plane * k;
  if (n <= 0)
    cu_zero(b, dw, (size_t)oc * k);
  for (int s0 = 0; s0 < n; s0 += chunk) {
    const int m = n - s0 < chunk ? n - s0 : chunk, ld = m * plane;
    const size_t ncol = (size_t)k * ld, nx = (size_t)m * in, ny = (size_t)m * out;
    const float *d = dy + (size_t)s0 * out;
    if (m > 1) {
      LAUNCH_IX(I, PS_CUDA_OP_TRANSPOSE, ny, ny, k_permute, m, oc, plane, d, tmp);
      d = tmp;
    }
    LAUNCH_IX(I, PS_CUDA_OP_IM2COL, ncol, ncol > nx ? ncol : nx, k_im2col, *g, ld,
              x + (size_t)s0 * in, col);
    cu_gemm(b, 0, 1, oc, k, ld, 1.0f, d, ld, col, ld, s0 ? 1.0f : 0.0f, dw, k);
    if (dx == NULL)
      continue;
    cu_gemm(b, 1, 0, k, ld, oc, 1.0f, w, k, d, ld, 0.0f, col, ld);
    LAUNCH_IX(I, PS_CUDA_OP_COL2IM, nx, ncol > nx ? ncol : nx, k_col2im, *g, ld, col,
              dx + (size_t)s0 * in);
  }
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
  size_t bx = (per + THREADS - 1) / THREADS;
  dim3 grid(bx < 1024 ? (unsigned)bx : 1024, n < 65535 ? (unsigned)n : 65535);
  prof_begin(I);
  k_dropout_fwd<<<grid, THREADS, 0, I->stream>>>(n, (uint32_t)per, (uint32_t)group,
                                                  ps_dropout_keep_below(p), ps_dropout_scale(p),
                                                  seed, first, x, y, mask);
  check(I, cudaGetLastError(), "k_dropout_fwd");
  prof_end(I, PS_CUDA_OP_DROPOUT_FWD, -1);
}

static void cu_dropout_bwd(ps_backend *b, size_t count, float p, const uint8_t *mask,
                           const float *dy, float *dx) {
  cuda_impl *I = use(b);
  LAUNCH(I, PS_CUDA_OP_DROPOUT_BWD, count, k_dropout_bwd, count, ps_dropout_scale(p), mask, dy,
         dx);
}

static void cu_optim(ps_backend *b, const ps_optim *o, float lr, uint64_t t, float *w,
                     const float *g, float *const *slots, size_t count) {
  cuda_impl *I = use(b);
  int rule;
  switch (o->kind) {
  case PS_OPTIM_SGD: rule = OPT_SGD; break;
  case PS_OPTIM_MOMENTUM: rule = o->nesterov ? OPT_NESTEROV : OPT_MOMENTUM; break;
  case PS_OPTIM_ADAGRAD: rule = OPT_ADAGRAD; break;
  case PS_OPTIM_ADAM: rule = OPT_ADAM; break;
  default: return;  /* as ps_optim_apply */
  }
  int nslots = ps_optim_nslots(o->kind);
  float *s0 = nslots > 0 ? slots[0] : NULL, *s1 = nslots > 1 ? slots[1] : NULL;
  LAUNCH(I, PS_CUDA_OP_OPTIM, count, k_optim, count, rule, ps_optim_coefs(o, lr, t), w, g, s0,
         s1);
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
  stream_sync(I, "cudaStreamSynchronize after nll");
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
  /* What fails here is said on stderr; nothing is left to protect. */
  cudaError_t e = cudaSuccess;
  if (I->stream != NULL) {
    warn(I, cudaSetDevice(I->device), "cudaSetDevice");
    e = cudaStreamSynchronize(I->stream);
    if (e != cudaSuccess) {
      char what[160];
      snprintf(what, sizeof what, "cudaStreamSynchronize at close (the last op: %s)",
               ps__cuda_op_name(I->last_op));
      warn(I, e, what);
    }
  }
  if (I->prof != NULL && I->stream != NULL && e == cudaSuccess)
    warn(I, ps__cuda_profile_report(I->prof, stderr), "PS_CUDA_PROFILE: report");
  ps__cuda_profile_free(I->prof);
  /* After a fault the context is gone with its memory: nothing to free
   * there (and the frees would fail). */
  if (e == cudaSuccess) {
    nll_scratch_free(b);
    for (size_t i = 0; i < I->nblocks; i++)
      warn(I, cudaFree(I->blocks[i].p), "cudaFree");
  }
  free(I->blocks);
  if (I->blas != NULL) {
    cublasStatus_t st = cublasDestroy(I->blas);
    if (st != CUBLAS_STATUS_SUCCESS)
      fprintf(stderr, "paramserv: cuda:%d: cublasDestroy: %s\n", I->device,
              cublasGetStatusString(st));
  }
  if (I->stream != NULL)
    warn(I, cudaStreamDestroy(I->stream), "cudaStreamDestroy");
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
    .copy2d = cu_copy2d,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .zero = cu_zero,
    .add = cu_add,
    .gemm = cu_gemm,
    .bias_add = cu_bias_add,
    .bias_grad = cu_bias_grad,
    .relu_fwd = cu_relu_fwd,
    .relu_bwd = cu_relu_bwd,
    .conv_ws = cu_conv_ws,
    .conv_fwd = cu_conv_fwd,
    .conv_bwd = cu_conv_bwd,
    .maxpool_fwd = cu_maxpool_fwd,
    .maxpool_bwd = cu_maxpool_bwd,
    .dropout_fwd = cu_dropout_fwd,
    .dropout_bwd = cu_dropout_bwd,
    .nll = cu_nll,
    .optim = cu_optim,
};

int ps_backend_cuda_profile_gemm(ps_backend *b, int m, int n, int k, int ta, int tb,
                                 unsigned long long *timed, double *gpu_ms) {
  *timed = 0;
  *gpu_ms = 0.0;
  if (b == NULL || b->ops != &cuda_ops || ((cuda_impl *)b->impl)->prof == NULL)
    return -ENOENT;
  return ps__cuda_profile_gemm(((cuda_impl *)b->impl)->prof, m, n, k, ta, tb, timed, gpu_ms) == 0
             ? 0
             : -ENOENT;
}

int ps_backend_cuda_devices(ps_errbuf *eb) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count >= 1)
    return count;
  (void)cudaGetLastError();
  char err[256];
  if (e == cudaSuccess)
    return ps_err_set(eb, -ENODEV, "cudaGetDeviceCount: 0 devices");
  /* No device at all (none visible): no GPU here. */
  if (e == cudaErrorNoDevice)
    return ps_err_set(eb, -ENODEV, "cudaGetDeviceCount: %s", cuda_why(e, err, sizeof err));
  /* "Driver version is insufficient" is also what a machine with no driver
   * at all gets: that is no GPU here; a driver too old is a failure. */
  int driver = -1, runtime = 0;
  if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess &&
      driver == 0)
    return ps_err_set(eb, -ENODEV, "cudaGetDeviceCount: %s (no NVIDIA driver is installed)",
                      cuda_why(e, err, sizeof err));
  char why[96] = "";
  if (e == cudaErrorInsufficientDriver && driver > 0 &&
      cudaRuntimeGetVersion(&runtime) == cudaSuccess)
    snprintf(why, sizeof why, " (the driver gives CUDA %d.%d, this runtime needs %d.%d)",
             driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
  return ps_err_set(eb, -EIO, "cudaGetDeviceCount: %s%s", cuda_why(e, err, sizeof err), why);
}

ps_backend *ps_backend_cuda_new(int device, ps_errbuf *eb) {
  ps_errbuf why = {0, {0}};
  int count = ps_backend_cuda_devices(&why);
  if (count < 0) {
    ps_err_set(eb, -ENODEV, "cuda: %s: %s",
               count == -ENODEV ? "no GPU" : "CUDA cannot use this machine's GPU", why.msg);
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
  I->last_op = -1;
  const char *sync = getenv("PS_CUDA_SYNC");
  I->sync = sync != NULL && *sync != '\0' && strcmp(sync, "0") != 0;
  cudaError_t e;
  cublasStatus_t st;
  cudaDeviceProp prop;
  int runtime = 0, blas_version = 0;
  const char *call = "";
  char err[256];
  /* Each CUDA and cuBLAS call named in its failure, with the error. */
#define TRY_CUDA(name, expr)  \
  if ((e = (expr)) != cudaSuccess) { \
    call = name;              \
    goto cuda_fail;           \
  }
#define TRY_BLAS(name, expr)           \
  if ((st = (expr)) != CUBLAS_STATUS_SUCCESS) { \
    call = name;                       \
    goto blas_fail;                    \
  }
  TRY_CUDA("cudaSetDevice", cudaSetDevice(device));
  /* Non-blocking: the stream does not wait for the legacy default stream,
   * which other code in the process may use. */
  TRY_CUDA("cudaStreamCreateWithFlags",
           cudaStreamCreateWithFlags(&I->stream, cudaStreamNonBlocking));
  TRY_BLAS("cublasCreate", cublasCreate(&I->blas));
  TRY_BLAS("cublasSetStream", cublasSetStream(I->blas, I->stream));
  TRY_BLAS("cublasGetVersion", cublasGetVersion(I->blas, &blas_version));
  TRY_CUDA("PS_CUDA_PROFILE", ps__cuda_profile_new(&I->prof, I->stream));
  TRY_CUDA("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, device));
  TRY_CUDA("cudaRuntimeGetVersion", cudaRuntimeGetVersion(&runtime));
#undef TRY_CUDA
#undef TRY_BLAS
  if (nll_room(b, 1024) != 0) {
    ps_err_set(eb, -ENOMEM, "cuda:%d: out of memory for a backend", device);
    goto fail;
  }
  snprintf(I->desc, sizeof I->desc,
           "cuda:%d %.100s (sm_%d%d, %.1f GiB), CUDA runtime %d.%d, cuBLAS %d", device, prop.name,
           prop.major, prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
           runtime / 1000, runtime % 1000 / 10, blas_version);
  return b;
cuda_fail:
  ps_err_set(eb, -ENODEV, "cuda:%d: %s: %s", device, call, cuda_why(e, err, sizeof err));
  goto fail;
blas_fail:
  ps_err_set(eb, -ENODEV, "cuda:%d: %s: %s", device, call, cublasGetStatusString(st));
fail:
  (void)cudaGetLastError();
  cu_close(b);
  free(b);
  return NULL;
}
