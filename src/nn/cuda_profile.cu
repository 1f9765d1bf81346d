/* The CUDA backend's op timer (see cuda_profile.h). */
#include "nn/cuda_profile.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const op_names[PS_CUDA_NOPS] = {
    "h2d",      "d2h",       "copy",     "zero",     "add",         "gemm",
    "bias_add", "bias_grad", "relu_fwd", "relu_bwd", "im2col",      "col2im",
    "maxpool_fwd", "maxpool_bwd", "dropout_fwd", "dropout_bwd", "nll",
    "transpose",   "optim"};

#define CHUNK 1024          /* event pairs created at a time */
#define MAX_MARKS 65536     /* pairs pending at most; then one forced read */
#define SHAPES 64           /* distinct gemm shapes counted apart */
#define GATE_LIMIT_NS 100000000ull  /* a gate gives up after 100 ms */

typedef struct tally {
  unsigned long long calls, timed;
  double gpu_ms, launch_ms;
} tally;

typedef struct gemm_shape {
  int m, n, k, ta, tb;
  tally t;
} gemm_shape;

/* The events cost a few microseconds an op, and the gates make the device
 * wait for the host at every op, which is why the profile is off unless
 * asked for. */
struct ps__cuda_profile {
  cudaEvent_t *start, *end;      /* cap pairs */
  int *op, *shape;               /* per recorded pair */
  double *launch;                /* per recorded pair: host ms inside the op's launch */
  int marks, cap;                /* recorded, not yet read; created */
  int syncs;                     /* synchronizations seen: timing starts at the second */
  int pending_shape;             /* the gemm shape ps__cuda_profile_shape named, or -1 */
  int open, gated;               /* the op between begin and end is timed, gated */
  double t0;                     /* host seconds at its begin */
  volatile unsigned long long *gate;  /* mapped pinned: the ticket released */
  const unsigned long long *d_gate;   /* the same, as the device sees it */
  unsigned long long ticket, gates, forced;
  unsigned *d_timeouts;          /* device memory: gates that gave up */
  tally ops[PS_CUDA_NOPS];
  gemm_shape shapes[SHAPES];
  int nshapes;
};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Holds the stream until the host has queued the op behind it: spins on
 * the ticket the host releases after the op's launch (ps__cuda_profile_end),
 * so that the op's start event is stamped when its launch is queued, not
 * while the host is still preparing it.  Gives up after GATE_LIMIT_NS (a
 * launch that waits for the device itself, as a first launch that loads a
 * module may), counting it. */
__global__ void k_gate(const volatile unsigned long long *gate, unsigned long long ticket,
                       unsigned *timeouts) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (*gate < ticket) {
    __nanosleep(256);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > GATE_LIMIT_NS) {
      atomicAdd(timeouts, 1u);
      return;
    }
  }
}

/* Room for CHUNK more pairs; cudaSuccess or the runtime's error. */
static cudaError_t grow(ps__cuda_profile *p) {
  int cap = p->cap + CHUNK;
  cudaEvent_t *s = (cudaEvent_t *)realloc(p->start, cap * sizeof *s);
  if (s != NULL)
    p->start = s;
  cudaEvent_t *e = (cudaEvent_t *)realloc(p->end, cap * sizeof *e);
  if (e != NULL)
    p->end = e;
  int *o = (int *)realloc(p->op, cap * sizeof *o);
  if (o != NULL)
    p->op = o;
  int *sh = (int *)realloc(p->shape, cap * sizeof *sh);
  if (sh != NULL)
    p->shape = sh;
  double *l = (double *)realloc(p->launch, cap * sizeof *l);
  if (l != NULL)
    p->launch = l;
  if (s == NULL || e == NULL || o == NULL || sh == NULL || l == NULL)
    return cudaErrorMemoryAllocation;
  for (int i = p->cap; i < cap; i++) {
    /* Timing events, no blocking sync: only read after the stream synced. */
    cudaError_t err = cudaEventCreate(&p->start[i]);
    if (err == cudaSuccess && (err = cudaEventCreate(&p->end[i])) != cudaSuccess)
      cudaEventDestroy(p->start[i]);
    if (err != cudaSuccess)
      return err;
    p->cap = i + 1;
  }
  return cudaSuccess;
}

cudaError_t ps__cuda_profile_new(ps__cuda_profile **out, cudaStream_t stream) {
  *out = NULL;
  const char *env = getenv("PS_CUDA_PROFILE");
  if (env == NULL || *env == '\0' || strcmp(env, "0") == 0)
    return cudaSuccess;
  ps__cuda_profile *p = (ps__cuda_profile *)calloc(1, sizeof *p);
  if (p == NULL)
    return cudaErrorMemoryAllocation;
  p->pending_shape = -1;
  void *gate = NULL;
  cudaError_t e = grow(p);
  if (e == cudaSuccess)
    e = cudaHostAlloc(&gate, 64, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e == cudaSuccess) {
    p->gate = (volatile unsigned long long *)gate;
    *p->gate = 0;
    void *d = NULL;
    e = cudaHostGetDevicePointer(&d, gate, 0);
    p->d_gate = (const unsigned long long *)d;
  }
  if (e == cudaSuccess)
    e = cudaMalloc((void **)&p->d_timeouts, sizeof *p->d_timeouts);
  if (e == cudaSuccess)
    e = cudaMemset(p->d_timeouts, 0, sizeof *p->d_timeouts);
  /* The gate's own first launch, which may load its module: open at once. */
  if (e == cudaSuccess) {
    k_gate<<<1, 1, 0, stream>>>(p->d_gate, 0, p->d_timeouts);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) {
    ps__cuda_profile_free(p);
    return e;
  }
  *out = p;
  return cudaSuccess;
}

void ps__cuda_profile_free(ps__cuda_profile *p) {
  if (p == NULL)
    return;
  for (int i = 0; i < p->cap; i++) {
    cudaEventDestroy(p->start[i]);
    cudaEventDestroy(p->end[i]);
  }
  free(p->start);
  free(p->end);
  free(p->op);
  free(p->shape);
  free(p->launch);
  if (p->gate != NULL)
    cudaFreeHost((void *)p->gate);
  if (p->d_timeouts != NULL)
    cudaFree(p->d_timeouts);
  free(p);
}

/* Add the recorded pairs to the tallies.  Every end event must have
 * completed (the stream synchronized): nothing here waits. */
static cudaError_t read_marks(ps__cuda_profile *p) {
  cudaError_t e = cudaSuccess;
  for (int i = 0; e == cudaSuccess && i < p->marks; i++) {
    float ms = 0.0f;
    e = cudaEventElapsedTime(&ms, p->start[i], p->end[i]);
    tally *t[2] = {&p->ops[p->op[i]], p->shape[i] >= 0 ? &p->shapes[p->shape[i]].t : NULL};
    for (int j = 0; j < 2; j++)
      if (t[j] != NULL) {
        t[j]->timed++;
        t[j]->gpu_ms += ms;
        t[j]->launch_ms += p->launch[i];
      }
  }
  p->marks = 0;
  return e;
}

cudaError_t ps__cuda_profile_begin(ps__cuda_profile *p, cudaStream_t stream, int gate) {
  int s = p->pending_shape;
  /* Untimed: the first two synchronizations' ops (kernels load, cuBLAS
   * picks its algorithms) and a gemm shape's first call. */
  p->open = p->syncs >= 2 && (s < 0 || p->shapes[s].t.calls > 0);
  p->gated = 0;
  if (!p->open)
    return cudaSuccess;
  cudaError_t e = cudaSuccess;
  if (p->marks == p->cap) {
    if (p->cap < MAX_MARKS) {
      e = grow(p);
    } else {
      /* A run without a synchronization in MAX_MARKS ops: one wait. */
      p->forced++;
      e = cudaEventSynchronize(p->end[p->marks - 1]);
      if (e == cudaSuccess)
        e = read_marks(p);
    }
    if (e != cudaSuccess || p->marks == p->cap) {
      p->open = 0;
      return e;
    }
  }
  if (gate) {
    k_gate<<<1, 1, 0, stream>>>(p->d_gate, ++p->ticket, p->d_timeouts);
    if ((e = cudaGetLastError()) != cudaSuccess) {
      p->open = 0;
      return e;
    }
    p->gated = 1;
    p->gates++;
  }
  e = cudaEventRecord(p->start[p->marks], stream);
  p->t0 = now_ms();
  return e;
}

cudaError_t ps__cuda_profile_end(ps__cuda_profile *p, cudaStream_t stream, int op, int shape) {
  double launch = now_ms() - p->t0;
  p->pending_shape = -1;
  p->ops[op].calls++;
  if (shape >= 0)
    p->shapes[shape].t.calls++;
  if (!p->open)
    return cudaSuccess;
  p->open = 0;
  cudaError_t e = cudaEventRecord(p->end[p->marks], stream);
  p->op[p->marks] = op;
  p->shape[p->marks] = shape;
  p->launch[p->marks] = launch;
  p->marks++;
  if (p->gated) /* the op is queued: let the device run it */
    __atomic_store_n((unsigned long long *)p->gate, p->ticket, __ATOMIC_RELEASE);
  return e;
}

cudaError_t ps__cuda_profile_synced(ps__cuda_profile *p) {
  p->syncs++;
  return read_marks(p);
}

int ps__cuda_profile_shape(ps__cuda_profile *p, int m, int n, int k, int ta, int tb) {
  p->pending_shape = -1;
  for (int i = 0; i < p->nshapes; i++) {
    const gemm_shape *s = &p->shapes[i];
    if (s->m == m && s->n == n && s->k == k && s->ta == ta && s->tb == tb)
      return p->pending_shape = i;
  }
  if (p->nshapes == SHAPES)
    return -1;
  p->shapes[p->nshapes] = gemm_shape{m, n, k, ta, tb, tally{0, 0, 0.0, 0.0}};
  return p->pending_shape = p->nshapes++;
}

int ps__cuda_profile_gemm(const ps__cuda_profile *p, int m, int n, int k, int ta, int tb,
                          unsigned long long *timed, double *gpu_ms) {
  for (int i = 0; i < p->nshapes; i++) {
    const gemm_shape *s = &p->shapes[i];
    if (s->m == m && s->n == n && s->k == k && s->ta == ta && s->tb == tb) {
      *timed = s->t.timed;
      *gpu_ms = s->t.gpu_ms;
      return s->t.timed > 0 ? 0 : -1;
    }
  }
  return -1;
}

const char *ps__cuda_op_name(int op) {
  return op >= 0 && op < PS_CUDA_NOPS ? op_names[op] : "(none)";
}

cudaError_t ps__cuda_profile_report(ps__cuda_profile *p, FILE *f) {
  cudaError_t e = read_marks(p);
  unsigned timeouts = 0;
  if (e == cudaSuccess)
    e = cudaMemcpy(&timeouts, p->d_timeouts, sizeof timeouts, cudaMemcpyDeviceToHost);
  for (int op = 0; op < PS_CUDA_NOPS; op++) {
    const tally *t = &p->ops[op];
    if (t->calls > 0)
      fprintf(f, "cuda-profile: op %s calls %llu timed %llu gpu_ms %.4f launch_ms %.4f\n",
              op_names[op], t->calls, t->timed, t->gpu_ms, t->launch_ms);
  }
  for (int i = 0; i < p->nshapes; i++) {
    const gemm_shape *s = &p->shapes[i];
    fprintf(f,
            "cuda-profile: gemm m %d n %d k %d ta %d tb %d calls %llu timed %llu gpu_ms %.4f "
            "launch_ms %.4f\n",
            s->m, s->n, s->k, s->ta, s->tb, s->t.calls, s->t.timed, s->t.gpu_ms, s->t.launch_ms);
  }
  fprintf(f, "cuda-profile: gates %llu timeouts %u forced_reads %llu\n", p->gates, timeouts,
          p->forced);
  return e;
}
