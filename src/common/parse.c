/* Strict parsing of numbers and devices from text. */
#include "common/parse.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end != '\0')
    return -EINVAL;
  if (errno == ERANGE || v < lo || v > hi)
    return -ERANGE;
  *out = v;
  return 0;
}

int ps_parse_u64(const char *s, uint64_t *out) {
  size_t n = strlen(s);
  if (n == 0 || n > 20 || (n > 1 && s[0] == '0'))
    return -EINVAL;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9')
      return -EINVAL;
  errno = 0;
  unsigned long long v = strtoull(s, NULL, 10);
  if (errno != 0)
    return -ERANGE;
  *out = v;
  return 0;
}

int ps_parse_double(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || isnan(v))
    return -EINVAL;
  if (errno == ERANGE || !isfinite(v) || v < lo || v > hi)
    return -ERANGE;
  *out = v;
  return 0;
}

int ps_parse_device(const char *s, int *device) {
  int64_t n = 0;
  if (strcmp(s, "cpu") == 0) {
    *device = PS_DEVICE_CPU;
    return 0;
  }
  if (strncmp(s, "cuda", 4) != 0)
    return -EINVAL;
  /* "cuda:" + digits only: ps_parse_i64 alone would take " 1" and "+1". */
  if (s[4] != '\0' && (s[4] != ':' || s[5] < '0' || s[5] > '9' ||
                        ps_parse_i64(s + 5, 0, PS_DEVICE_MAX, &n) != 0))
    return -EINVAL;
  *device = (int)n;
  return 0;
}

const char *ps_device_format(int device, char *buf, size_t len) {
  if (device < 0)
    snprintf(buf, len, "cpu");
  else
    snprintf(buf, len, "cuda:%d", device);
  return buf;
}

const char *ps_float_format(float f, char *buf, size_t len) {
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(buf, len, "%.*g", prec, (double)f);
    if ((float)strtod(buf, NULL) == f)
      break;
  }
  return buf;
}
