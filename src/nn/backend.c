/* What every backend shares: choosing one by device, releasing one, and, in
 * a build without CUDA, the CUDA entry points that say so. */
#include "nn/backend.h"

#include <errno.h>
#include <stdlib.h>

ps_backend *ps_backend_new(int device, ps_errbuf *eb) {
  if (device >= 0)
    return ps_backend_cuda_new(device, eb);
  ps_backend *b = ps_backend_cpu_new();
  if (b == NULL)
    ps_err_set(eb, -ENOMEM, "cpu: out of memory for a backend");
  return b;
}

void ps_backend_free(ps_backend *b) {
  if (b == NULL)
    return;
  if (b->ops->close != NULL)
    b->ops->close(b);
  free(b);
}

#ifndef PS_HAVE_CUDA
/* The default build must build and run where there is no CUDA toolkit, yet
 * `--device cuda` must still get its one-line answer, and no caller should
 * need an #ifdef: so the CUDA entry points exist in every build, and here,
 * where make CUDA=1 has not put backend_cuda.cu's in their place, they say
 * what is missing. */
#define NO_CUDA "this paramserv was built without CUDA (make CUDA=1)"

int ps_backend_cuda_devices(ps_errbuf *eb) { return ps_err_set(eb, -ENODEV, NO_CUDA); }

ps_backend *ps_backend_cuda_new(int device, ps_errbuf *eb) {
  (void)device;
  ps_err_set(eb, -ENODEV, "cuda: " NO_CUDA);
  return NULL;
}

int ps_backend_cuda_profile_gemm(ps_backend *b, int m, int n, int k, int ta, int tb,
                                 unsigned long long *timed, double *gpu_ms) {
  (void)b, (void)m, (void)n, (void)k, (void)ta, (void)tb;
  *timed = 0;
  *gpu_ms = 0.0;
  return -ENOENT;
}
#endif
