/* Whether this machine has an NVIDIA GPU at all, asked of the kernel and
 * not of CUDA: the GPU tests skip only where none is present.  Where one
 * is, a CUDA error (a driver too old for the runtime, a device that does
 * not answer) is a failure, not a skip. */
#ifndef PS_TESTS_GPU_PRESENT_H
#define PS_TESTS_GPU_PRESENT_H

#include <unistd.h>

static inline int gpu_present(void) {
  return access("/dev/nvidia0", F_OK) == 0 || access("/proc/driver/nvidia/version", F_OK) == 0;
}

#endif
