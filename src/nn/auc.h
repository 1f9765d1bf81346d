/* The area under the ROC curve of scores against 0/1 labels: what a CTR
 * model's test is judged by. */
#ifndef PS_NN_AUC_H
#define PS_NN_AUC_H

#include <stddef.h>
#include <stdint.h>

/* The probability that a random positive scores above a random negative,
 * a tie counting one half (the Mann-Whitney statistic, from the ranks of
 * the sorted scores: O(n log n)).  NaN when either class is absent or out
 * of memory. */
double ps_auc(const float *scores, const uint8_t *labels, size_t n);

#endif
