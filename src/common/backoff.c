/* Backoff with jitter (see backoff.h). */
#include "common/backoff.h"

#include <unistd.h>

#include "common/timeutil.h"

void ps_backoff_init(ps_backoff *b, unsigned base_ms, unsigned cap_ms, uint64_t seed) {
  b->base_ms = base_ms ? base_ms : 1;
  b->cap_ms = cap_ms > b->base_ms ? cap_ms : b->base_ms;
  b->attempts = 0;
  ps_rng_seed(&b->rng, seed ? seed : ps_now_ns() ^ ((uint64_t)getpid() << 32));
}

unsigned ps_backoff_next(ps_backoff *b) {
  uint64_t c = (uint64_t)b->base_ms << (b->attempts < 20 ? b->attempts : 20);
  if (c > b->cap_ms)
    c = b->cap_ms;
  b->attempts++;
  uint64_t half = c / 2;  /* [c - half, c]: at least half of c, never 0 */
  return (unsigned)(c - half + (uint64_t)(ps_rng_uniform(&b->rng) * (double)(half + 1)));
}
