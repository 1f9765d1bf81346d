/* `paramserv train`'s options, and its loop for Criteo data (a model with
 * sparse tables) in train_ctr.c: train.c parses the command line and runs
 * the IDX loop itself, or calls ps_train_ctr.  Internal to src/cmd. */
#ifndef PS_CMD_TRAIN_CTR_H
#define PS_CMD_TRAIN_CTR_H

#include <signal.h>
#include <stdint.h>

#include "nn/model.h"
#include "optim/optim.h"

typedef struct ps_train_opts {
  const char *model, *hidden, *model_file, *data;
  const char *train, *test;          /* --train, --test: Criteo files */
  int bag_separator;                 /* --bag-separator: the byte, or -1 (none) */
  const char *npy, *npy_test;        /* --npy, --npy-test: the user's own data (NPY.md) */
  const char *ckpt_dir, *init_from;  /* --checkpoint-dir, --init-from */
  int64_t ckpt_every, keep;          /* --checkpoint-every, --keep */
  int64_t epochs, batch, threads, max_steps, train_limit, warmup;
  int device;  /* PS_DEVICE_CPU or a CUDA device number */
  double lr, momentum, weight_decay, gamma, step_epochs, min_lr;
  uint64_t seed;
  int eval;
  ps_optim optim;
  ps_sched sched;
} ps_train_opts;

/* Fill o->sched's fields that depend on the run's length: the
 * step schedule's step size and factor, the total steps, the cosine
 * schedule's final factor and the warm-up (train_ctr.c, for both loops: the
 * calls go one way, train.c to train_ctr.c). */
void ps_train_sched_setup(ps_train_opts *o, uint64_t steps_per_epoch);

/* Train `spec` (input [13], one sigmoid output; its embedding_bag layers as
 * sparse tables) on o->train, evaluating AUC and log loss on o->test at
 * each epoch's end; print the epoch lines and the done line.  *stop is set
 * by a signal (SIGINT, SIGTERM): the loop stops after the step in
 * progress.  @return the exit status: 0, 1 (a failure of the run), 2 (bad
 * input: a file, the device), 128 + the signal. */
int ps_train_ctr(ps_train_opts *o, const ps_model_spec *spec, volatile sig_atomic_t *stop);

#endif
