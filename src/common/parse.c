/* Strict parsing of numbers from text. */
#include "common/parse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

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
