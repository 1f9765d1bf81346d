/* Strict parsing of numbers from text (flags, config values). */
#ifndef PS_COMMON_PARSE_H
#define PS_COMMON_PARSE_H

#include <stdint.h>

/* The whole of s must be a base-10 integer in [lo, hi].
 * @return 0, or -EINVAL (not a number, trailing text) / -ERANGE. */
int ps_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);

/* The whole of s must be a finite number in [lo, hi].  Same returns. */
int ps_parse_double(const char *s, double lo, double hi, double *out);

#endif
