/* Deterministic random numbers (see rng.h). */
#include "common/rng.h"

#include <math.h>

uint64_t ps_rng_below(ps_rng *r, uint64_t n) {
  /* Rejection keeps every value equally likely. */
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do
    x = ps_rng_next(r);
  while (x >= limit);
  return x % n;
}

double ps_rng_normal(ps_rng *r) {
  double u1 = ps_rng_uniform(r), u2 = ps_rng_uniform(r);
  if (u1 < 1e-300)
    u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
