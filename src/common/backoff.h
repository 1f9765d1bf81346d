/* The wait between attempts to reach something that is away (a shard, or
 * Redis): doubling from base_ms up to cap_ms, with jitter, so that the
 * processes that lost the same server do not all come back in step.  The
 * one backoff of the worker's links, the replica, the restore and the
 * registry. */
#ifndef PS_COMMON_BACKOFF_H
#define PS_COMMON_BACKOFF_H

#include <stdint.h>

#include "common/rng.h"

typedef struct ps_backoff {
  unsigned base_ms, cap_ms;
  unsigned attempts;     /* since the last success */
  ps_rng rng;
} ps_backoff;

/* seed 0: one of this process and this moment. */
void ps_backoff_init(ps_backoff *b, unsigned base_ms, unsigned cap_ms, uint64_t seed);

/* The wait before the next attempt, in ms, counting the attempt: uniform in
 * [c/2, c] with c = min(cap_ms, base_ms * 2^attempts) (at least 1). */
unsigned ps_backoff_next(ps_backoff *b);

/* The thing was reached: the next wait starts from base_ms again. */
static inline void ps_backoff_reset(ps_backoff *b) { b->attempts = 0; }

#endif
