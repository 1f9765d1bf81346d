/* The worker process: trains on its part of the data through the client,
 * pulling weights from and pushing gradients to every shard. */
#ifndef PS_WORKER_WORKER_H
#define PS_WORKER_WORKER_H

#include "common/config.h"

/* Run worker `index` of the cluster in cfg (read from cfg->path) until the
 * global step reaches [train] last_step, or SIGTERM / SIGINT.  Worker 0
 * then evaluates the final weights on the test set and prints
 * "final test_acc A".  @return the exit status: 0 at the step limit or on
 * a signal, 1 on an error (one line). */
int ps_worker_run(const ps_config *cfg, int index);

#endif
