/* Strict parsing of numbers and devices from text (flags, config values). */
#ifndef PS_COMMON_PARSE_H
#define PS_COMMON_PARSE_H

#include <stddef.h>
#include <stdint.h>

/* The whole of s must be a base-10 integer in [lo, hi].
 * @return 0, or -EINVAL (not a number, trailing text) / -ERANGE. */
int ps_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);

/* The whole of s must be a u64 in its one decimal spelling: 1 to 20
 * digits, no sign, no blank, no leading zero, at most UINT64_MAX (as
 * recovery/FORMAT.md writes u64 strings and checkpoint names' steps).
 * @return 0, or -EINVAL (another spelling) / -ERANGE, leaving *out. */
int ps_parse_u64(const char *s, uint64_t *out);

/* The whole of s must be a finite number in [lo, hi].  Same returns. */
int ps_parse_double(const char *s, double lo, double hi, double *out);

/* A compute device: "cpu" is PS_DEVICE_CPU; "cuda" is CUDA device 0 and
 * "cuda:N" device N, N in [0, PS_DEVICE_MAX].  The expected form, for
 * messages, is PS_DEVICE_FORM.  @return 0, or -EINVAL (*device untouched). */
#define PS_DEVICE_CPU (-1)
#define PS_DEVICE_MAX 255
#define PS_DEVICE_FORM "cpu, cuda or cuda:N (N a GPU number in [0, 255])"
int ps_parse_device(const char *s, int *device);

/* The inverse: "cpu" or "cuda:N" into buf[len].  @return buf. */
const char *ps_device_format(int device, char *buf, size_t len);

/* The shortest decimal (%g, 1 to 9 digits) that reads back as the same
 * float: "0.001" rather than 0.0010000000474974513; buf of at least 32
 * bytes.  @return buf. */
const char *ps_float_format(float f, char *buf, size_t len);

#endif
