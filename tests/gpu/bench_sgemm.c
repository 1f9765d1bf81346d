/* cuBLAS's sgemm alone, timed at given shapes: the limit that
 * scripts/bench-gpu holds the GEMMs of a training step against.  Each shape
 * is called back to back on one stream, as a step calls it, with the
 * backend's row-major convention (backend_cuda.cu's operand swap), and timed
 * with CUDA events.
 *
 *   bench_sgemm --probe              "gpu: <name>", or "skip: no GPU (why)"
 *   bench_sgemm M N K TA TB ...      one line per shape:
 *     sgemm m M n N k K ta TA tb TB ms_per_call X gflops G
 *
 * Exit 0, 77 when no GPU answers (after the skip line), 1 on error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "nn/backend.h"
#include "tests/gpu/gpu_present.h"

#define MIN_MS 50.0  /* time each shape over at least this long */

static int die(const char *what, const char *why) {
  fprintf(stderr, "bench_sgemm: %s: %s\n", what, why);
  return 1;
}

/* Milliseconds per call of `reps` back-to-back calls. */
static double time_calls(cublasHandle_t h, cudaStream_t s, int reps, int m, int n, int k, int ta,
                         int tb, const float *a, const float *b, float *c) {
  const float one = 1.0f, zero = 0.0f;
  int lda = ta ? m : k, ldb = tb ? k : n;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, s);
  for (int r = 0; r < reps; r++)
    cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one,
                b, ldb, a, lda, &zero, c, n);
  cudaEventRecord(e1, s);
  cudaEventSynchronize(e1);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return (double)ms / reps;
}

int main(int argc, char **argv) {
  ps_errbuf eb = {0};
  if (ps_backend_cuda_devices(&eb) < 0) {
    if (gpu_present())
      return die("an NVIDIA device is present but CUDA cannot use it", eb.msg);
    printf("skip: no GPU (%s)\n", eb.msg);
    return 77;
  }
  cudaError_t e;
  struct cudaDeviceProp prop;
  if ((e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess)
    return die("cudaGetDeviceProperties", cudaGetErrorString(e));
  if (argc == 2 && strcmp(argv[1], "--probe") == 0) {
    printf("gpu: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    return 0;
  }
  if (argc < 6 || (argc - 1) % 5 != 0) {
    fprintf(stderr, "usage: bench_sgemm --probe | M N K TA TB [M N K TA TB ...]\n");
    return 1;
  }
  int nshapes = (argc - 1) / 5;
  size_t most = 0;
  for (int i = 0; i < nshapes; i++) {
    size_t m = strtoul(argv[1 + 5 * i], NULL, 10), n = strtoul(argv[2 + 5 * i], NULL, 10);
    size_t k = strtoul(argv[3 + 5 * i], NULL, 10);
    size_t big = m * k > k * n ? m * k : k * n;
    big = big > m * n ? big : m * n;
    most = big > most ? big : most;
  }
  float *a, *b, *c, *hbuf = malloc(most * sizeof *hbuf);
  if (hbuf == NULL)
    return die("malloc", "out of memory");
  /* Values in [-1, 1): sgemm's speed does not depend on them, but zeros
   * might take a path real data does not. */
  for (size_t i = 0; i < most; i++)
    hbuf[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  if (cudaMalloc((void **)&a, most * 4) != cudaSuccess ||
      cudaMalloc((void **)&b, most * 4) != cudaSuccess ||
      cudaMalloc((void **)&c, most * 4) != cudaSuccess)
    return die("cudaMalloc", "out of device memory");
  cudaMemcpy(a, hbuf, most * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(b, hbuf, most * 4, cudaMemcpyHostToDevice);
  cudaStream_t s;
  cublasHandle_t h;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cublasStatus_t st = cublasCreate(&h);
  if (st != CUBLAS_STATUS_SUCCESS)
    return die("cublasCreate", cublasGetStatusString(st));
  cublasSetStream(h, s);
  for (int i = 0; i < nshapes; i++) {
    int m = atoi(argv[1 + 5 * i]), n = atoi(argv[2 + 5 * i]), k = atoi(argv[3 + 5 * i]);
    int ta = atoi(argv[4 + 5 * i]), tb = atoi(argv[5 + 5 * i]);
    if (m < 1 || n < 1 || k < 1)
      return die("shape", "M, N and K must be positive");
    /* Warm up (cuBLAS picks and loads its kernel), then enough calls to
     * fill MIN_MS. */
    double ms = time_calls(h, s, 10, m, n, k, ta, tb, a, b, c);
    int reps = ms > 0 ? (int)(MIN_MS / ms) + 1 : 1000;
    if (reps < 10)
      reps = 10;
    ms = time_calls(h, s, reps, m, n, k, ta, tb, a, b, c);
    if ((e = cudaGetLastError()) != cudaSuccess)
      return die("cublasSgemm", cudaGetErrorString(e));
    printf("sgemm m %d n %d k %d ta %d tb %d ms_per_call %.6f gflops %.1f\n", m, n, k, ta, tb, ms,
           2.0 * m * n * k / (ms * 1e6));
  }
  cublasDestroy(h);
  cudaStreamDestroy(s);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  free(hbuf);
  return 0;
}
