/* cuBLAS's sgemm alone, at given shapes: the limit that scripts/bench-gpu
 * holds the GEMMs of a training step against.  It runs through the CUDA
 * backend itself (its gemm: cuBLAS with the backend's row-major operand
 * swap, on the backend's stream) with the backend's profile on
 * (PS_CUDA_PROFILE=1, set here), so each call is timed exactly as a step's
 * GEMMs are: gated, its device time between events (nn/cuda_profile.h).
 * The backend checks every CUDA and cuBLAS status and stops naming the call
 * and its error: a shape that fails is an error, never a timed empty loop.
 *
 *   bench_sgemm --probe              "gpu: <the backend's description>", or
 *                                    "skip: no GPU (why)"
 *   bench_sgemm M N K TA TB ...      one line per shape:
 *     sgemm m M n N k K ta TA tb TB calls C ms_per_call X gflops G
 *
 * PS_CUDA_DEVICE picks the GPU (default 0).  Exit 0; 77 after the skip line
 * where this machine has no GPU (tests/gpu/gpu_present.h; never with
 * PS_REQUIRE_GPU=1); 1 on an error (a CUDA failure aborts: 134).  The
 * backend's profile lines go to stderr at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/backend.h"
#include "tests/gpu/gpu_present.h"

#define MIN_MS 50.0     /* time each shape over at least this long */
#define MAX_REPS 20000  /* and at most this many calls */

static int die(const char *what, const char *why) {
  fprintf(stderr, "bench_sgemm: %s: %s\n", what, why);
  return 1;
}

typedef struct shape {
  int m, n, k, ta, tb;
} shape;

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi)
    return -1;
  *out = (int)v;
  return 0;
}

static ps_backend *g;
static float *da, *db, *dc;

/* Waits for the stream (a to_host of one value), which is where the
 * profile reads its events. */
static void wait_stream(void) {
  float sink;
  g->ops->to_host(g, &sink, dc, sizeof sink);
}

static void calls(const shape *s, int reps) {
  int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
  for (int r = 0; r < reps; r++)
    g->ops->gemm(g, s->ta, s->tb, s->m, s->n, s->k, 1.0f, da, lda, db, ldb, 0.0f, dc, s->n);
  wait_stream();
}

/* The profile's timed calls of s and their milliseconds so far. */
static void so_far(const shape *s, unsigned long long *timed, double *ms) {
  if (ps_backend_cuda_profile_gemm(g, s->m, s->n, s->k, s->ta, s->tb, timed, ms) != 0) {
    *timed = 0;
    *ms = 0.0;
  }
}

/* Milliseconds per call over reps timed calls of s. */
static int time_calls(const shape *s, int reps, double *ms_per_call) {
  unsigned long long t0, t1;
  double ms0, ms1;
  so_far(s, &t0, &ms0);
  calls(s, reps);
  so_far(s, &t1, &ms1);
  if (t1 - t0 != (unsigned long long)reps) {
    char why[128];
    snprintf(why, sizeof why, "the profile timed %llu of %d calls", t1 - t0, reps);
    return die("PS_CUDA_PROFILE", why);
  }
  *ms_per_call = (ms1 - ms0) / reps;
  return 0;
}

int main(int argc, char **argv) {
  ps_errbuf eb = {0};
  if (ps_backend_cuda_devices(&eb) < 0)
    return gpu_skip_or_fail("skip:", "bench_sgemm", &eb);
  int device = gpu_device();
  if (device < 0)
    return die("PS_CUDA_DEVICE", "expected a GPU number in [0, 255]");
  int probe = argc == 2 && strcmp(argv[1], "--probe") == 0;
  if (!probe && (argc < 6 || (argc - 1) % 5 != 0)) {
    fprintf(stderr, "usage: bench_sgemm --probe | M N K TA TB [M N K TA TB ...]\n");
    return 1;
  }
  int nshapes = probe ? 0 : (argc - 1) / 5;
  shape *shapes = calloc((size_t)nshapes + 1, sizeof *shapes);
  if (shapes == NULL)
    return die("malloc", "out of memory");
  size_t most = 1;
  for (int i = 0; i < nshapes; i++) {
    shape *s = &shapes[i];
    char **a = argv + 1 + 5 * i;
    if (parse_int(a[0], 1, 1 << 20, &s->m) != 0 || parse_int(a[1], 1, 1 << 20, &s->n) != 0 ||
        parse_int(a[2], 1, 1 << 20, &s->k) != 0 || parse_int(a[3], 0, 1, &s->ta) != 0 ||
        parse_int(a[4], 0, 1, &s->tb) != 0) {
      fprintf(stderr, "bench_sgemm: shape %d: '%s %s %s %s %s': expected M N K in [1, 2^20] "
              "and TA TB 0 or 1\n", i + 1, a[0], a[1], a[2], a[3], a[4]);
      free(shapes);
      return 1;
    }
    size_t m = (size_t)s->m, n = (size_t)s->n, k = (size_t)s->k;
    size_t big = m * k > k * n ? m * k : k * n;
    big = big > m * n ? big : m * n;
    most = big > most ? big : most;
  }
  /* The backend's profile times the calls. */
  setenv("PS_CUDA_PROFILE", "1", 1);
  g = ps_backend_cuda_new(device, &eb);
  if (g == NULL) {
    free(shapes);
    return die("cuda", eb.msg);
  }
  if (probe) {
    printf("gpu: %s\n", g->ops->describe(g));
    ps_backend_free(g);
    free(shapes);
    return 0;
  }
  float *hbuf = malloc(most * sizeof *hbuf);
  da = g->ops->alloc(g, most * sizeof *da);
  db = g->ops->alloc(g, most * sizeof *db);
  dc = g->ops->alloc(g, most * sizeof *dc);
  if (hbuf == NULL || da == NULL || db == NULL || dc == NULL)
    return die("alloc", "out of host or device memory for the operands");
  /* Values in [-1, 1): sgemm's speed does not depend on them, but zeros
   * might take a path real data does not. */
  for (size_t i = 0; i < most; i++)
    hbuf[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  g->ops->to_device(g, da, hbuf, most * sizeof *hbuf);
  g->ops->to_device(g, db, hbuf, most * sizeof *hbuf);
  g->ops->zero(g, dc, most);
  /* The profile times from its second wait on (cuda_profile.h). */
  wait_stream();
  wait_stream();
  int rc = 0;
  for (int i = 0; i < nshapes && rc == 0; i++) {
    const shape *s = &shapes[i];
    /* The shape's first call (cuBLAS picks and loads its kernel; not
     * timed), ten to size the run, then enough to fill MIN_MS. */
    calls(s, 1);
    double ms = 0.0;
    if ((rc = time_calls(s, 10, &ms)) != 0)
      break;
    double want = ms > 0 ? MIN_MS / ms + 1 : MAX_REPS;
    int reps = want < 10 ? 10 : want > MAX_REPS ? MAX_REPS : (int)want;
    if ((rc = time_calls(s, reps, &ms)) != 0)
      break;
    printf("sgemm m %d n %d k %d ta %d tb %d calls %d ms_per_call %.6f gflops %.1f\n", s->m, s->n,
           s->k, s->ta, s->tb, reps, ms, ms > 0 ? 2.0 * s->m * s->n * s->k / (ms * 1e6) : 0.0);
    fflush(stdout);
  }
  g->ops->free(g, da);
  g->ops->free(g, db);
  g->ops->free(g, dc);
  ps_backend_free(g);
  free(hbuf);
  free(shapes);
  return rc;
}
