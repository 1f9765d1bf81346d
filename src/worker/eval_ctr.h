/* The evaluation of a model with sparse tables: its test AUC and log loss
 * over a test file in the Criteo format, one pass, in batches; each batch's
 * rows (and the dense weights) come from the caller's `rows` function: the
 * chief pulls them from the shards (a pull creates no row: src/ps/TABLE.md),
 * `paramserv train` reads its own tables, the Redis-table baseline reads
 * Redis.  One evaluator for all three, so their figures are alike. */
#ifndef PS_WORKER_EVAL_CTR_H
#define PS_WORKER_EVAL_CTR_H

#include <stddef.h>
#include <stdint.h>

#include "nn/compute.h"
#include "nn/model.h"
#include "paramserv/error.h"
#include "worker/embed.h"

typedef struct ps_eval_ctr ps_eval_ctr;

/* For model (with tables) over the test file `path`, in batches of `batch`
 * (a pull of one batch's rows fits the shards' frame cap), its fields bags
 * separated by the byte `sep` (-1: one value a field; CRITEO.md), at most
 * max_samples of it (0: all).  compute: the caller's, borrowed (it must
 * outlive the evaluator), or NULL for one of the evaluator's own (one
 * thread).  @return it, or NULL with the reason in eb (out of memory). */
ps_eval_ctr *ps_eval_ctr_new(const ps_model *model, const char *path, int batch, int sep,
                             uint64_t max_samples, ps_compute *compute, ps_errbuf *eb);
void ps_eval_ctr_free(ps_eval_ctr *e);

typedef struct ps_eval_ctr_result {
  double auc, logloss;  /* logloss: the mean, probabilities clipped to [1e-7, 1 - 1e-7] */
  size_t samples;
} ps_eval_ctr_result;

/* Put into params the dense weights and into e->rows the rows of e's keys
 * (ps_embed_keys was called on the batch); between batches, so it may also
 * check what the caller must (the chief's lease).  @return 0, or nonzero
 * with one line in eb: the pass stops with that code. */
typedef int ps_eval_ctr_rows_fn(void *arg, ps_embed *e, float *params, ps_errbuf *eb);

/* One pass over the test file (a batch short of full ends it) with the
 * weights and rows `rows` gives each batch into params (model->vars.total
 * floats).  @return 0, or a negative code with eb set. */
int ps_eval_ctr_run(ps_eval_ctr *e, float *params, ps_eval_ctr_rows_fn *rows, void *arg,
                    ps_eval_ctr_result *out, ps_errbuf *eb);

#endif
