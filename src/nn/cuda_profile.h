/* Times a CUDA backend's ops with events on its stream, when the
 * environment asks for it (PS_CUDA_PROFILE=1), and reports the time per
 * kind of op and per gemm shape: what scripts/bench-gpu reads to say where
 * a step goes.  For nvcc-compiled code only (backend_cuda.cu). */
#ifndef PS_NN_CUDA_PROFILE_H
#define PS_NN_CUDA_PROFILE_H

#include <stdio.h>

#include <cuda_runtime.h>

/* The kinds of op timed apart. */
enum {
  PS_CUDA_OP_H2D, PS_CUDA_OP_D2H, PS_CUDA_OP_COPY, PS_CUDA_OP_ZERO, PS_CUDA_OP_ADD,
  PS_CUDA_OP_GEMM, PS_CUDA_OP_BIAS_ADD, PS_CUDA_OP_BIAS_GRAD, PS_CUDA_OP_RELU_FWD,
  PS_CUDA_OP_RELU_BWD, PS_CUDA_OP_IM2COL, PS_CUDA_OP_COL2IM, PS_CUDA_OP_MAXPOOL_FWD,
  PS_CUDA_OP_MAXPOOL_BWD, PS_CUDA_OP_DROPOUT_FWD, PS_CUDA_OP_DROPOUT_BWD, PS_CUDA_OP_NLL,
  PS_CUDA_NOPS
};

typedef struct ps__cuda_profile ps__cuda_profile;

/* *out = a new profile when PS_CUDA_PROFILE is set and not "0", else NULL.
 * The current device must be the backend's.  @return cudaSuccess, or the
 * error that stopped it (*out then NULL).  Free with ps__cuda_profile_free. */
cudaError_t ps__cuda_profile_new(ps__cuda_profile **out);
void ps__cuda_profile_free(ps__cuda_profile *p);

/* Bracket one op queued on `stream`: begin before it, end after it, with
 * its kind and its gemm shape (ps__cuda_profile_shape; -1 for others).
 * The elapsed times are read in batches (one wait for the stream each).
 * @return cudaSuccess or the runtime's error. */
cudaError_t ps__cuda_profile_begin(ps__cuda_profile *p, cudaStream_t stream);
cudaError_t ps__cuda_profile_end(ps__cuda_profile *p, cudaStream_t stream, int op, int shape);

/* The slot of a gemm shape, -1 when the table of shapes is full. */
int ps__cuda_profile_shape(ps__cuda_profile *p, int m, int n, int k, int ta, int tb);

/* Read what is pending and write one line per kind of op and per gemm
 * shape to f:
 *   cuda-profile: op gemm calls 1234 ms 56.789
 *   cuda-profile: gemm m 128 n 4096 k 784 ta 0 tb 1 calls 100 ms 12.345
 * @return cudaSuccess or the runtime's error. */
cudaError_t ps__cuda_profile_report(ps__cuda_profile *p, FILE *f);

#endif
