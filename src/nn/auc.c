/* The area under the ROC curve (see auc.h). */
#include "nn/auc.h"

#include <math.h>
#include <stdlib.h>

typedef struct scored {
  float score;
  uint8_t label;
} scored;

static int by_score(const void *a, const void *b) {
  float x = ((const scored *)a)->score, y = ((const scored *)b)->score;
  return (x > y) - (x < y);
}

double ps_auc(const float *scores, const uint8_t *labels, size_t n) {
  scored *s = malloc((n ? n : 1) * sizeof *s);
  if (s == NULL)
    return NAN;
  for (size_t i = 0; i < n; i++)
    s[i] = (scored){scores[i], labels[i] != 0};
  qsort(s, n, sizeof *s, by_score);
  /* Sum the positives' ranks (1-based), a run of equal scores each taking
   * the run's mean rank. */
  double rank_sum = 0.0, pos = 0.0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double run_pos = 0.0;
    while (j < n && s[j].score == s[i].score)
      run_pos += s[j++].label;
    rank_sum += run_pos * ((double)(i + 1) + (double)j) / 2.0;
    pos += run_pos;
    i = j;
  }
  free(s);
  double neg = (double)n - pos;
  if (pos == 0.0 || neg == 0.0)
    return NAN;
  return (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg);
}
