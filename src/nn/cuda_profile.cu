/* The CUDA backend's op timer (see cuda_profile.h). */
#include "nn/cuda_profile.h"

#include <stdlib.h>
#include <string.h>

static const char *const op_names[PS_CUDA_NOPS] = {
    "h2d",      "d2h",       "copy",     "zero",     "add",         "gemm",
    "bias_add", "bias_grad", "relu_fwd", "relu_bwd", "im2col",      "col2im",
    "maxpool_fwd", "maxpool_bwd", "dropout_fwd", "dropout_bwd", "nll"};

#define MARKS 1024  /* event pairs recorded before they are read */
#define SHAPES 64   /* distinct gemm shapes counted apart */

typedef struct gemm_shape {
  int m, n, k, ta, tb;
  unsigned long long calls;
  double ms;
} gemm_shape;

/* The events cost a few microseconds an op, which is why the profile is off
 * unless asked for. */
struct ps__cuda_profile {
  cudaEvent_t start[MARKS], end[MARKS];
  int op[MARKS], shape[MARKS];
  int marks;  /* recorded, not yet read */
  unsigned long long calls[PS_CUDA_NOPS];
  double ms[PS_CUDA_NOPS];
  gemm_shape shapes[SHAPES];
  int nshapes;
};

cudaError_t ps__cuda_profile_new(ps__cuda_profile **out) {
  *out = NULL;
  const char *env = getenv("PS_CUDA_PROFILE");
  if (env == NULL || *env == '\0' || strcmp(env, "0") == 0)
    return cudaSuccess;
  ps__cuda_profile *p = (ps__cuda_profile *)calloc(1, sizeof *p);
  if (p == NULL)
    return cudaErrorMemoryAllocation;
  for (int i = 0; i < MARKS; i++) {
    cudaError_t e = cudaEventCreate(&p->start[i]);
    if (e == cudaSuccess)
      e = cudaEventCreate(&p->end[i]);
    if (e != cudaSuccess) {
      ps__cuda_profile_free(p);
      return e;
    }
  }
  *out = p;
  return cudaSuccess;
}

void ps__cuda_profile_free(ps__cuda_profile *p) {
  if (p == NULL)
    return;
  for (int i = 0; i < MARKS; i++) {
    if (p->start[i] != NULL)
      cudaEventDestroy(p->start[i]);
    if (p->end[i] != NULL)
      cudaEventDestroy(p->end[i]);
  }
  free(p);
}

cudaError_t ps__cuda_profile_begin(ps__cuda_profile *p, cudaStream_t stream) {
  return cudaEventRecord(p->start[p->marks], stream);
}

/* Sum the elapsed times of the recorded pairs; waits for the last one. */
static cudaError_t read_marks(ps__cuda_profile *p) {
  if (p->marks == 0)
    return cudaSuccess;
  cudaError_t e = cudaEventSynchronize(p->end[p->marks - 1]);
  for (int i = 0; e == cudaSuccess && i < p->marks; i++) {
    float ms = 0.0f;
    e = cudaEventElapsedTime(&ms, p->start[i], p->end[i]);
    p->calls[p->op[i]]++;
    p->ms[p->op[i]] += ms;
    if (p->shape[i] >= 0) {
      p->shapes[p->shape[i]].calls++;
      p->shapes[p->shape[i]].ms += ms;
    }
  }
  p->marks = 0;
  return e;
}

cudaError_t ps__cuda_profile_end(ps__cuda_profile *p, cudaStream_t stream, int op, int shape) {
  cudaError_t e = cudaEventRecord(p->end[p->marks], stream);
  p->op[p->marks] = op;
  p->shape[p->marks] = shape;
  if (++p->marks == MARKS && e == cudaSuccess)
    e = read_marks(p);
  return e;
}

int ps__cuda_profile_shape(ps__cuda_profile *p, int m, int n, int k, int ta, int tb) {
  for (int i = 0; i < p->nshapes; i++) {
    const gemm_shape *s = &p->shapes[i];
    if (s->m == m && s->n == n && s->k == k && s->ta == ta && s->tb == tb)
      return i;
  }
  if (p->nshapes == SHAPES)
    return -1;
  p->shapes[p->nshapes] = gemm_shape{m, n, k, ta, tb, 0, 0.0};
  return p->nshapes++;
}

cudaError_t ps__cuda_profile_report(ps__cuda_profile *p, FILE *f) {
  cudaError_t e = read_marks(p);
  for (int op = 0; op < PS_CUDA_NOPS; op++)
    if (p->calls[op] > 0)
      fprintf(f, "cuda-profile: op %s calls %llu ms %.3f\n", op_names[op], p->calls[op],
              p->ms[op]);
  for (int i = 0; i < p->nshapes; i++) {
    const gemm_shape *s = &p->shapes[i];
    fprintf(f, "cuda-profile: gemm m %d n %d k %d ta %d tb %d calls %llu ms %.3f\n", s->m, s->n,
            s->k, s->ta, s->tb, s->calls, s->ms);
  }
  return e;
}
