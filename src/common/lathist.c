/* A latency histogram for summary lines (see lathist.h). */
#include "common/lathist.h"

#include <math.h>
#include <string.h>

void ps_lathist_init(ps_lathist *h) { memset(h, 0, sizeof *h); }

void ps_lathist_add(ps_lathist *h, double seconds) {
  double s = seconds > 0 ? seconds : 0, us = s * 1e6;
  int b;
  if (!(us >= 1))
    b = 0;
  else if (us >= ldexp(1.0, PS_LATHIST_OCTAVES))
    b = PS_LATHIST_BUCKETS - 1;
  else {
    b = 1 + (int)floor(log2(us) * PS_LATHIST_PER_OCTAVE);
    /* log2's rounding at a bucket's edge: keep the bucket's bounds exact. */
    if (b > 1 && us < exp2((double)(b - 1) / PS_LATHIST_PER_OCTAVE))
      b--;
    else if (b < PS_LATHIST_BUCKETS - 2 && us >= exp2((double)b / PS_LATHIST_PER_OCTAVE))
      b++;
  }
  h->count[b]++;
  h->n++;
  h->sum_s += s;
  if (s > h->max_s)
    h->max_s = s;
}

double ps_lathist_quantile(const ps_lathist *h, double q) {
  if (h->n == 0)
    return 0;
  q = q < 0 ? 0 : q > 1 ? 1 : q;
  uint64_t rank = (uint64_t)ceil(q * (double)h->n);
  if (rank == 0)
    rank = 1;
  uint64_t seen = 0;
  int b = 0;
  for (; b < PS_LATHIST_BUCKETS - 1; b++)
    if ((seen += h->count[b]) >= rank)
      break;
  double v;
  if (b == 0)
    v = 0.5e-6;
  else if (b == PS_LATHIST_BUCKETS - 1)
    v = h->max_s;
  else
    v = exp2(((double)b - 0.5) / PS_LATHIST_PER_OCTAVE) * 1e-6;
  return v < h->max_s ? v : h->max_s;
}
