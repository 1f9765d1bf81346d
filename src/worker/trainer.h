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
#include "data/criteo.h"
#include "data/idx.h"
#include "data/sampler.h"
#include "nn/compute.h"
#include "nn/model.h"
#include "worker/embed.h"

typedef struct ps_trainer {
  ps_compute *compute;
  ps_dataset train, test;   /* idx, npy: test is worker 0's only (npy: when [data] test is set) */
  ps_sampler sampler;       /* idx, npy: this worker's part of train */
  ps_criteo *reader;        /* criteo: this worker's part of [data] train, streamed */
  float *labels;            /* criteo: the batch's labels as read */
  ps_criteo_keys keys;      /* criteo: the batch's keys, a bag per sample and field */
  float *emb, *demb;        /* a model with sparse tables: its embedding input and gradient */
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

/* The next batch into x and y (and keys, criteo).  @return its samples.
 * A bad line in a criteo file ends the process (exit status 2: the data's
 * fault, which a restart would meet again) after one line naming it. */
size_t ps_trainer_batch(ps_trainer *t);

/* The batch's keys (criteo) into e, n samples.  Out of memory ends the
 * process (exit status 1) after one line. */
void ps_trainer_embed(ps_trainer *t, ps_embed *e, size_t n);

/* Where this worker is in its part of the data; jump there (0, or -EINVAL
 * past the part: logged by the caller); the samples of a part an epoch
 * (0 for criteo: its files are streamed, not counted). */
ps_data_pos ps_trainer_pos(const ps_trainer *t);
int ps_trainer_seek(ps_trainer *t, ps_data_pos pos);
size_t ps_trainer_part_size(const ps_trainer *t);

/* Worker 0, at the end: the test accuracy of `params` (the whole model, in
 * the arena's order), printed as "final test_acc A global_step S" for the
 * scripts; nothing but a logged line without a test set (npy without
 * [data] test).  @return 0, or -ENOMEM (logged). */
int ps_trainer_final_test(ps_trainer *t, const float *params, uint64_t global_step);

#endif
