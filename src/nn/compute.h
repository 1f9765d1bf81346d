/* Gradient computation over a batch, on the CPU or a GPU.  On the CPU the
 * batch is split across threads: each thread runs the model on its slice
 * with its own backend and workspace, and the slices' gradients are summed.
 * On a GPU one CUDA backend runs the whole batch: ps_compute_grad copies
 * the parameters and the batch to the device and the gradient back, once
 * each (what a worker calls once per step); ps_compute_train_step keeps the
 * parameters and the optimizer on the device and copies only the batch
 * (what `paramserv train` calls). */
#ifndef PS_NN_COMPUTE_H
#define PS_NN_COMPUTE_H

#include <stddef.h>
#include <stdint.h>

#include "nn/model.h"
#include "optim/optim.h"
#include "paramserv/error.h"

typedef struct ps_compute ps_compute;

/* On the CPU: ps_compute_new_on(m, PS_DEVICE_CPU, threads, max_batch, eb). */
ps_compute *ps_compute_new(const ps_model *m, int threads, int max_batch, ps_errbuf *eb);

/* `m` must outlive the object; batches of up to max_batch.  device:
 * PS_DEVICE_CPU (common/parse.h) computes on `threads` (>= 1) threads; a
 * CUDA device number computes on that GPU (threads is then unused).
 * @return NULL with one line in eb on failure; eb->code is -ENODEV when the
 * device cannot be used (no GPU, no such GPU, a build without CUDA), so
 * that a command can tell that from running out of memory.  Free with
 * ps_compute_free. */
ps_compute *ps_compute_new_on(const ps_model *m, int device, int threads, int max_batch,
                              ps_errbuf *eb);
void ps_compute_free(ps_compute *c);

/* Host memory for the params, x and grad a caller passes every step: on a
 * GPU it is pinned (page-locked), so that the step's copies run as direct
 * DMA instead of through the driver's staging buffer; on the CPU plain
 * memory.  Any host memory works with ps_compute_grad: this one is only
 * faster.  @return NULL when out of memory.  Free with ps_compute_host_free
 * on the same object, before ps_compute_free; freeing NULL does nothing. */
void *ps_compute_host_alloc(ps_compute *c, size_t bytes);
void ps_compute_host_free(ps_compute *c, void *p);

/* One line saying what computes (the BLAS, or the GPU); valid while c lives. */
const char *ps_compute_describe(const ps_compute *c);

/* Mean loss gradient over the batch: grad (m->vars.total floats, host) is
 * overwritten with d(mean NLL)/d(params).  x: n * in_size floats, labels: n
 * bytes, params: the arena, all host memory.  Dropout masks depend on
 * (seed, first + i) for sample i.  Adds correct predictions to *correct
 * when not NULL.  @return the mean NLL of the batch. */
double ps_compute_grad(ps_compute *c, const float *params, const float *x,
                       const uint8_t *labels, int n, uint64_t seed, uint64_t first,
                       float *grad, size_t *correct);

/* ps_compute_grad for a model with sparse tables: emb (host, n x
 * m->emb_size) is the batch's embedding input, and demb (host, as large)
 * gets the gradient of the batch's mean loss with respect to it. */
double ps_compute_grad_emb(ps_compute *c, const float *params, const float *x,
                           const float *emb, const uint8_t *labels, int n, uint64_t seed,
                           uint64_t first, float *grad, float *demb, size_t *correct);

/* The probabilities a one-output (sigmoid) model gives n samples (any n;
 * host memory; emb NULL for a model without tables) into prob. */
void ps_compute_predict(ps_compute *c, const float *params, const float *x, const float *emb,
                        int n, float *prob);

/* Evaluate (no dropout) any number of samples in chunks of max_batch, with
 * params (host memory) or, when params is NULL, the parameters of
 * ps_compute_train_init.
 * @return the mean NLL; *correct = samples whose argmax is the label. */
double ps_compute_eval(ps_compute *c, const float *params, const float *x,
                       const uint8_t *labels, size_t n, size_t *correct);

/* Training where the computation keeps the parameters, their gradient and
 * the optimizer's slots in its own memory (on a GPU, device memory), so
 * that a step moves only the batch in and the loss out: what `paramserv
 * train` runs.  train_init copies params (host, m->vars.total floats) in,
 * which must stay as they are until the first step returns (backend.h's
 * to_device), and sets the slots to their initial values
 * (ps_optim_slot_init); `o` is copied.  @return 0 or -ENOMEM. */
int ps_compute_train_init(ps_compute *c, const float *params, const ps_optim *o);

/* One step on the kept parameters: the mean loss gradient over the batch
 * (as ps_compute_grad), then the optimizer's update with rate lr and
 * 1-based update count t, computed where the parameters are (backend.h's
 * optim op: bit for bit ps_optim_apply).  x, labels: host memory.  Adds
 * correct predictions to *correct when not NULL.  @return the mean NLL of
 * the batch. */
double ps_compute_train_step(ps_compute *c, const float *x, const uint8_t *labels, int n,
                             uint64_t seed, uint64_t first, float lr, uint64_t t,
                             size_t *correct);

/* Copy the kept parameters to params (host, m->vars.total floats). */
void ps_compute_train_params(ps_compute *c, float *params);

/* The kept optimizer slots, the nslots of train_init's optimizer, each
 * m->vars.total floats in host memory: copied out into slots[k], or in
 * from slots[k] (a resumed run's, after train_init; they must stay as they
 * are until the first step returns, as train_init's params). */
void ps_compute_train_slots(ps_compute *c, float *const *slots);
void ps_compute_train_load_slots(ps_compute *c, const float *const *slots);

/* Threads the CPU computes on; 1 on a GPU. */
int ps_compute_threads(const ps_compute *c);

#endif
