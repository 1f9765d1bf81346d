/* Gradient computation over a batch, split across threads: each thread runs
 * the model on its slice of the batch with its own backend and workspace,
 * and the slices' gradients are summed.  What a worker and `paramserv train`
 * call once per step. */
#ifndef PS_NN_COMPUTE_H
#define PS_NN_COMPUTE_H

#include <stddef.h>
#include <stdint.h>

#include "nn/model.h"
#include "paramserv/error.h"

typedef struct ps_compute ps_compute;

/* `m` must outlive the object.  threads >= 1; batches of up to max_batch.
 * @return NULL with a message in eb on failure.  Free with ps_compute_free. */
ps_compute *ps_compute_new(const ps_model *m, int threads, int max_batch, ps_errbuf *eb);
void ps_compute_free(ps_compute *c);

/* Mean loss gradient over the batch: grad (m->vars.total floats, host) is
 * overwritten with d(mean NLL)/d(params).  x: n * in_size floats, labels: n
 * bytes, params: the arena, all host memory.  Dropout masks depend on
 * (seed, first + i) for sample i.  Adds correct predictions to *correct
 * when not NULL.  @return the mean NLL of the batch. */
double ps_compute_grad(ps_compute *c, const float *params, const float *x,
                       const uint8_t *labels, int n, uint64_t seed, uint64_t first,
                       float *grad, size_t *correct);

/* Evaluate (no dropout) any number of samples in chunks of max_batch.
 * @return the mean NLL; *correct = samples whose argmax is the label. */
double ps_compute_eval(ps_compute *c, const float *params, const float *x,
                       const uint8_t *labels, size_t n, size_t *correct);

int ps_compute_threads(const ps_compute *c);

#endif
