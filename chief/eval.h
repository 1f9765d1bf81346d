/* The chief's evaluations: the model's test loss and accuracy over the
 * test set, for weights the chief pulled, on a thread of their own. */
#ifndef PS_CHIEF_EVAL_H
#define PS_CHIEF_EVAL_H

#include <stdint.h>

#include "common/config.h"
#include "nn/model.h"

typedef struct ps_eval ps_eval;

typedef struct ps_eval_result {
  uint64_t step;         /* the global step of the weights */
  double loss, accuracy; /* a model with sparse tables: loss is the log loss, accuracy unset */
  int has_auc;           /* a model with sparse tables: its test AUC in auc */
  double auc;
  char nonfinite[256];   /* non-empty: the weights held NaN or Inf (what and where) */
} ps_eval_result;

/* Load the test set (cfg->data_dir, "t10k"; npy: [data] test) and a
 * compute engine for model; a model with sparse tables: its evaluator of
 * [data] test (eval_ctr.h).
 * @return the evaluator, or NULL when evaluations are off (logged: why). */
ps_eval *ps_eval_new(const ps_config *cfg, const ps_model *model);

/* A model with sparse tables: evaluations pull each test batch's rows,
 * through the chief's client, so they run on the caller's thread
 * (ps_eval_pulled) instead of ps_eval_start's. */
#include "paramserv/client.h"
int ps_eval_needs_client(const ps_eval *e);

/* Evaluate `params` (pulled at `step`; taken, freed here) with client c,
 * calling tick(arg) between batches; the result is then finished
 * (ps_eval_finished).  @return 0, or -1 when the pass failed (logged). */
int ps_eval_pulled(ps_eval *e, ps_client *c, uint64_t step, float *params, int (*tick)(void *),
                   void *arg);

/* Wait for an evaluation in flight and free everything; NULL does nothing. */
void ps_eval_free(ps_eval *e);

/* Evaluate `params` (model->vars.total floats; taken, freed here) at
 * `step`: on the evaluator's thread, or on the caller's when `wait` or no
 * thread could be made.  Only while not ps_eval_busy. */
void ps_eval_start(ps_eval *e, uint64_t step, float *params, int wait);

/* Running, or finished and not yet taken. */
int ps_eval_busy(ps_eval *e);

/* @return 1 and the finished evaluation in *out, or 0 while none is. */
int ps_eval_finished(ps_eval *e, ps_eval_result *out);

#endif
