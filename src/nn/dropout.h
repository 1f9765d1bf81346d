/* Dropout's masks as a pure function of (seed, sample number), defined once
 * for the CPU backend and the CUDA kernels: both draw the same masks, so a
 * run's result does not depend on the device (nor on the threads). */
#ifndef PS_NN_DROPOUT_H
#define PS_NN_DROPOUT_H

#include <stdint.h>

#include "common/rng.h"

/* The keep/drop decisions of one sample's groups, in order.  Group j is kept
 * when the j-th 16-bit draw of the sample's stream (four per 64-bit number
 * of xoshiro256** seeded with seed ^ mix64(sample)) is below keep_below. */
typedef struct ps_dropout_draws {
  ps_rng r;
  uint64_t bits;
  unsigned left;  /* 16-bit draws still in bits */
} ps_dropout_draws;

/* 16 bits of randomness per group: p is resolved to 1/65536. */
static inline PS_HOSTDEV uint32_t ps_dropout_keep_below(float p) {
  return (uint32_t)((1.0 - (double)p) * 65536.0 + 0.5);
}

/* Kept values are scaled by 1/(1-p) (inverted dropout); p = 1 drops all. */
static inline PS_HOSTDEV float ps_dropout_scale(float p) {
  return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
}

static inline PS_HOSTDEV void ps_dropout_begin(ps_dropout_draws *d, uint64_t seed,
                                               uint64_t sample) {
  ps_rng_seed(&d->r, seed ^ ps_mix64(sample));
  d->bits = 0;
  d->left = 0;
}

/* The next group's decision: 1 keep, 0 drop. */
static inline PS_HOSTDEV uint8_t ps_dropout_next(ps_dropout_draws *d, uint32_t keep_below) {
  if (d->left == 0) {
    d->bits = ps_rng_next(&d->r);
    d->left = 4;
  }
  uint32_t v = (uint32_t)(d->bits & 0xffff);
  d->bits >>= 16;
  d->left--;
  return v < keep_below;
}

#endif
