/* The chief's evaluation of a model with sparse tables: its test AUC and
 * log loss over [data] test (Criteo format), each batch's rows pulled from
 * the shards that hold them (a pull creates no row: src/ps/TABLE.md). */
#ifndef PS_CHIEF_EVAL_CTR_H
#define PS_CHIEF_EVAL_CTR_H

#include <stddef.h>

#include "common/config.h"
#include "nn/model.h"
#include "paramserv/client.h"

typedef struct ps_eval_ctr ps_eval_ctr;

/* For model (with tables) and cfg's [data] test, in batches of [train]
 * batch (a pull of one batch's rows fits the shards' frame cap).
 * @return it, or NULL with the reason in eb (no test file, out of memory). */
ps_eval_ctr *ps_eval_ctr_new(const ps_config *cfg, const ps_model *model, ps_errbuf *eb);
void ps_eval_ctr_free(ps_eval_ctr *e);

typedef struct ps_eval_ctr_result {
  double auc, logloss;
  size_t samples;
} ps_eval_ctr_result;

/* One pass over the test file with the dense weights `params` (read,
 * written by the pulls: the same weights each time) and each batch's rows
 * pulled through c; tick(arg) between batches (the chief's lease: nonzero
 * stops the pass).  @return 0, or a negative code with eb set. */
int ps_eval_ctr_run(ps_eval_ctr *e, ps_client *c, float *params, int (*tick)(void *), void *arg,
                    ps_eval_ctr_result *out, ps_errbuf *eb);

#endif
