/* Times a CUDA backend's ops with events on its stream, when the
 * environment asks for it (PS_CUDA_PROFILE=1), and reports, per kind of op
 * and per gemm shape, the device's time and the host's launch time apart:
 * what scripts/bench-gpu reads to say where a step goes.  For nvcc-compiled
 * code only (backend_cuda.cu).
 *
 * How an op is timed: a gate (a one-thread kernel that spins on a ticket in
 * mapped host memory) holds the stream, then the start event, the op's
 * launch and the end event are queued, and only then does the host release
 * the gate.  So the start event is stamped when the op can run at once, and
 * the elapsed time is the op's on the device, not the host's launch work
 * while the device idles; the host's time inside the launch is measured
 * apart (launch_ms).  The events are read only where the stream has already
 * synchronized (ps__cuda_profile_synced: to_host, nll), never by waiting in
 * the middle of a step.  The ops before the second synchronization (kernels
 * load, cuBLAS picks its algorithms) and the first call of each gemm shape
 * are counted but not timed: the timed figures are per timed call. */
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
  PS_CUDA_OP_TRANSPOSE, /* the convolution's [oc][n][plane] <-> [n][oc][plane] */
  PS_CUDA_OP_OPTIM,     /* an optimizer update */
  PS_CUDA_NOPS
};

typedef struct ps__cuda_profile ps__cuda_profile;

/* *out = a new profile when PS_CUDA_PROFILE is set and not "0", else NULL.
 * The current device must be the backend's; stream is the backend's (the
 * gate kernel is loaded on it).  @return cudaSuccess, or the error that
 * stopped it (*out then NULL).  Free with ps__cuda_profile_free. */
cudaError_t ps__cuda_profile_new(ps__cuda_profile **out, cudaStream_t stream);
void ps__cuda_profile_free(ps__cuda_profile *p);

/* Bracket one op queued on `stream`: begin before its launch, end right
 * after it, with its kind and its gemm shape (ps__cuda_profile_shape; -1
 * for others).  gate: hold the stream until end (see above).  Between a
 * gated begin and its end nothing may wait for the stream (a copy to or
 * from pageable memory, a synchronization, cudaFree): it would wait for the
 * gate until the gate gives up (100 ms, counted as a timeout).
 * @return cudaSuccess or the runtime's error. */
cudaError_t ps__cuda_profile_begin(ps__cuda_profile *p, cudaStream_t stream, int gate);
cudaError_t ps__cuda_profile_end(ps__cuda_profile *p, cudaStream_t stream, int op, int shape);

/* The stream has just synchronized: read the events recorded so far (no
 * wait).  @return cudaSuccess or the runtime's error. */
cudaError_t ps__cuda_profile_synced(ps__cuda_profile *p);

/* The slot of a gemm shape, -1 when the table of shapes is full; call it
 * right before the gemm's begin (its first call is not timed). */
int ps__cuda_profile_shape(ps__cuda_profile *p, int m, int n, int k, int ta, int tb);

/* The timed calls of a gemm shape so far and their device milliseconds.
 * @return 0, or -1 when none was timed. */
int ps__cuda_profile_gemm(const ps__cuda_profile *p, int m, int n, int k, int ta, int tb,
                          unsigned long long *timed, double *gpu_ms);

/* The name of a kind of op ("im2col"), for messages. */
const char *ps__cuda_op_name(int op);

/* Read what is pending (the stream must have synchronized) and write one
 * line per kind of op and per gemm shape, then the gates' count, to f:
 *   cuda-profile: op gemm calls 1234 timed 1200 gpu_ms 56.7890 launch_ms 3.2100
 *   cuda-profile: gemm m 128 n 4096 k 784 ta 0 tb 1 calls 100 timed 98 gpu_ms 12.3450 launch_ms 0.3210
 *   cuda-profile: gates 5000 timeouts 0 forced_reads 0
 * calls counts every call; timed, gpu_ms (the device's time, events) and
 * launch_ms (the host's time inside the launch) the timed ones.
 * @return cudaSuccess or the runtime's error. */
cudaError_t ps__cuda_profile_report(ps__cuda_profile *p, FILE *f);

#endif
