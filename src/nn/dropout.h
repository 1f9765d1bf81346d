/* Dropout's masks as a pure function of (seed, sample number, group), defined
 * once for the CPU backend and the CUDA kernels: both draw the same masks, so
 * a run's result does not depend on the device (nor on the threads), and any
 * group's decision can be computed on its own (a GPU thread per value). */
#ifndef PS_NN_DROPOUT_H
#define PS_NN_DROPOUT_H

#include <stdint.h>

#include "common/rng.h"

/* Counter-based: sample s's groups take their decisions from the splitmix64
 * stream whose state starts at key = mix64(seed ^ mix64(s)): the w-th 64-bit
 * number of that stream is mix64(key + w * 0x9e3779b97f4a7c15) (ps_mix64
 * adds the constant once more: splitmix64's step), and it holds the 16-bit
 * draws of groups 4w to 4w+3, lowest bits first.  Group j is kept when its
 * draw is below keep_below. */

/* 16 bits of randomness per group: p is resolved to 1/65536. */
static inline PS_HOSTDEV uint32_t ps_dropout_keep_below(float p) {
  return (uint32_t)((1.0 - (double)p) * 65536.0 + 0.5);
}

/* Kept values are scaled by 1/(1-p) (inverted dropout); p = 1 drops all. */
static inline PS_HOSTDEV float ps_dropout_scale(float p) {
  return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
}

/* The key of sample `sample`'s stream. */
static inline PS_HOSTDEV uint64_t ps_dropout_key(uint64_t seed, uint64_t sample) {
  return ps_mix64(seed ^ ps_mix64(sample));
}

/* The 64-bit number holding the draws of groups 4w to 4w+3. */
static inline PS_HOSTDEV uint64_t ps_dropout_word(uint64_t key, uint64_t w) {
  return ps_mix64(key + w * 0x9e3779b97f4a7c15ULL);
}

/* Group j's decision, from the word of its four (ps_dropout_word(key, j / 4)):
 * 1 keep, 0 drop. */
static inline PS_HOSTDEV uint8_t ps_dropout_decide(uint64_t word, uint64_t j,
                                                   uint32_t keep_below) {
  return (uint32_t)(word >> (16 * (j & 3)) & 0xffff) < keep_below;
}

#endif
