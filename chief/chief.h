/* The chief: holds the cluster's lease in Redis, settles the restore plan
 * (Redis replicas, else the newest valid checkpoint, else the seeded
 * initialization) and loads the shards that need a state, then runs the
 * hooks: consistent-cut checkpoints every N steps and/or seconds, progress
 * logs, evaluations, the NaN/Inf guard, JSON-lines summaries, and the stop
 * at [train] last_step (a final checkpoint, then STOP to every shard, which
 * tells its workers). */
#ifndef PS_CHIEF_CHIEF_H
#define PS_CHIEF_CHIEF_H

#include "common/config.h"

/* Exit statuses of the chief. */
enum {
  PS_CHIEF_DONE = 0,      /* the run reached last_step, or SIGTERM */
  PS_CHIEF_FAILED = 1,    /* start-up error or a lost lease: a restart may help */
  PS_CHIEF_REFUSED = 2,   /* what it found would lose work (checkpoints it cannot use, a
                             checkpoint of another optimizer): the user must choose */
  PS_CHIEF_NONFINITE = 3, /* the weights went NaN/Inf: restarting would not help */
};

/* Run the chief of the cluster in cfg until the run ends or SIGTERM.
 * @return one of the statuses above. */
int ps_chief_run(const ps_config *cfg);

#endif
