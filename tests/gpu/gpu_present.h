/* When a GPU program may skip.  Whether this machine has an NVIDIA GPU at
 * all is asked of the kernel (a device node, the driver's /proc entry) and
 * not of CUDA: a GPU program skips only where none is present and CUDA says
 * no GPU (ps_backend_cuda_devices: -ENODEV, no device or no driver), and
 * never with PS_REQUIRE_GPU=1 (scripts/gpu-check sets it: on the GPU
 * machine a skip would pass every check unseen).  Any other CUDA error (a
 * driver too old for the runtime, a device that does not answer, a device
 * the kernel shows that CUDA does not) is a failure naming the CUDA call
 * and its error. */
#ifndef PS_TESTS_GPU_PRESENT_H
#define PS_TESTS_GPU_PRESENT_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nn/backend.h"

static inline int gpu_present(void) {
  return access("/dev/nvidia0", F_OK) == 0 || access("/proc/driver/nvidia/version", F_OK) == 0;
}

/* PS_REQUIRE_GPU set and not "0": every skip is a failure. */
static inline int gpu_required(void) {
  const char *v = getenv("PS_REQUIRE_GPU");
  return v != NULL && *v != '\0' && strcmp(v, "0") != 0;
}

/* After ps_backend_cuda_devices failed with eb: prints `SKIP no GPU (why)`
 * (SKIP: "skip: NAME:" or "skip:", what the caller's runner expects) and
 * returns 77 where a skip is allowed; else prints `NAME: why` on stderr
 * and returns 1. */
static inline int gpu_skip_or_fail(const char *skip, const char *name, const ps_errbuf *eb) {
  if (eb->code != -ENODEV) {
    fprintf(stderr, "%s: CUDA failed: %s\n", name, eb->msg);
    return 1;
  }
  if (gpu_present()) {
    fprintf(stderr, "%s: an NVIDIA device is present but CUDA cannot use it: %s\n", name,
            eb->msg);
    return 1;
  }
  if (gpu_required()) {
    fprintf(stderr, "%s: no GPU (%s), and PS_REQUIRE_GPU=1 makes that a failure\n", name,
            eb->msg);
    return 1;
  }
  printf("%s no GPU (%s)\n", skip, eb->msg);
  return 77;
}

/* The CUDA device a GPU program runs on: PS_CUDA_DEVICE (default 0), so
 * that a check can plant a device that is not there (scripts/gpu-check:
 * PS_CUDA_DEVICE=7 must fail, not skip).  -1 when it does not parse. */
static inline int gpu_device(void) {
  const char *v = getenv("PS_CUDA_DEVICE");
  if (v == NULL || *v == '\0')
    return 0;
  char *end = NULL;
  long d = strtol(v, &end, 10);
  return *end == '\0' && d >= 0 && d <= 255 ? (int)d : -1;
}

#endif
