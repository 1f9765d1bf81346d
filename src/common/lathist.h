/* A latency histogram for a process's own summary lines: log-spaced
 * buckets, 8 an octave from 1 microsecond to 2^24 microseconds (about
 * 16.8 s), so that a quantile read from it is within 4.4% of the true
 * one (the bucket's geometric middle); below 1 us and above the top are
 * a bucket each.  The exact count, sum and maximum are kept too.  One
 * writer; no I/O, no allocation.  (Prometheus's histograms, metrics.h,
 * have at most 16 bounds: too coarse for a p99 read back.) */
#ifndef PS_COMMON_LATHIST_H
#define PS_COMMON_LATHIST_H

#include <stdint.h>

#define PS_LATHIST_PER_OCTAVE 8
#define PS_LATHIST_OCTAVES 24
/* [0]: below 1 us; [1 + k]: [2^(k/8), 2^((k+1)/8)) us; the last: the top and above. */
#define PS_LATHIST_BUCKETS (PS_LATHIST_PER_OCTAVE * PS_LATHIST_OCTAVES + 2)

typedef struct ps_lathist {
  uint64_t n;
  double sum_s, max_s;
  uint64_t count[PS_LATHIST_BUCKETS];
} ps_lathist;

/* Zero it (a zeroed struct is an empty histogram too). */
void ps_lathist_init(ps_lathist *h);

/* Count one observation of `seconds` (negative counts as 0). */
void ps_lathist_add(ps_lathist *h, double seconds);

/* The q-quantile (0 <= q <= 1) in seconds: the geometric middle of the
 * bucket holding the ceil(q * n)-th smallest observation (the first for
 * q = 0), never above the maximum; 0 when empty.  The bottom bucket reads
 * as 0.5 us, the top one as the maximum. */
double ps_lathist_quantile(const ps_lathist *h, double q);

#endif
