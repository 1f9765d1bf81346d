/* What a training process computes with, the same for a worker of either
 * mode (ps: worker.c, ring: src/ring/member.c): its device, its part of
 * the training data and the batch buffers, the test set of worker 0 and
 * the final evaluation; and the process's start (log tag, SIGTERM). */
#ifndef PS_WORKER_TRAINER_H
#define PS_WORKER_TRAINER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "data/idx.h"
#include "data/sampler.h"
#include "nn/compute.h"
#include "nn/model.h"

typedef struct ps_trainer {
  ps_compute *compute;
  ps_dataset train, test;   /* test: worker 0's only */
  ps_sampler sampler;       /* this worker's part of train */
  const ps_model *model;
  size_t total;             /* floats of the model */
  int batch;
  /* In the device's fastest host memory (pinned, on a GPU). */
  float *params, *grad, *x;
  uint8_t *y;
  size_t *idx;
} ps_trainer;

/* Log as "worker.<index>" at [cluster] log_level; SIGTERM and SIGINT set
 * the flag the process polls, which this returns. */
volatile sig_atomic_t *ps_trainer_start_process(const ps_config *cfg, int index);

/* For worker `index` of cfg: the device first (one that cannot be used
 * gives one line and exit status 2: the environment's fault), then the
 * data and the buffers.  @return 0, or the exit status (1 or 2) after one
 * logged line. */
int ps_trainer_open(ps_trainer *t, const ps_config *cfg, const ps_model *model, int index);
void ps_trainer_close(ps_trainer *t);

/* The sampler's next batch into x and y.  @return its samples. */
size_t ps_trainer_batch(ps_trainer *t);

/* Worker 0, at the end: the test accuracy of `params` (the whole model, in
 * the arena's order), printed as "final test_acc A global_step S" for the
 * scripts.  @return 0, or -ENOMEM (logged). */
int ps_trainer_final_test(ps_trainer *t, const float *params, uint64_t global_step);

#endif
