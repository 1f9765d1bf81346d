/* Small deterministic random numbers: splitmix64 for seeding and hashing
 * counters, xoshiro256** for streams.  Identical on every machine, so that a
 * seed names the same initial weights and the same data order everywhere. */
#ifndef PS_COMMON_RNG_H
#define PS_COMMON_RNG_H

#include <stdint.h>

/* Marks the functions that nvcc also compiles for the GPU, so that the CUDA
 * backend draws the same numbers as the CPU (dropout masks) from the one
 * definition here. */
#ifdef __CUDACC__
#define PS_HOSTDEV __host__ __device__
#else
#define PS_HOSTDEV
#endif

typedef struct ps_rng {
  uint64_t s[4];
} ps_rng;

/* One step of splitmix64 over `x`: a good 64-bit mixer of counters. */
static inline PS_HOSTDEV uint64_t ps_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static inline PS_HOSTDEV void ps_rng_seed(ps_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) {
    seed = ps_mix64(seed);
    r->s[i] = seed;
  }
}

static inline PS_HOSTDEV uint64_t ps_rng_next(ps_rng *r) {
  uint64_t *s = r->s;
  uint64_t x = s[1] * 5;
  uint64_t result = ((x << 7) | (x >> 57)) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = (s[3] << 45) | (s[3] >> 19);
  return result;
}

/* Uniform in [0, 1). */
static inline double ps_rng_uniform(ps_rng *r) {
  return (double)(ps_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n), n > 0, without modulo bias. */
uint64_t ps_rng_below(ps_rng *r, uint64_t n);

/* Standard normal (Box-Muller). */
double ps_rng_normal(ps_rng *r);

#endif
