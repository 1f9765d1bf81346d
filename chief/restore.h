/* The chief's restore of shards that hold no state (PROTOCOL.md,
 * "Starting a shard from a state"): each gets the newest valid checkpoint's
 * slice, or the seeded initialization (recovery/plan.h), in LOAD pieces;
 * when no shard had a state, the checkpoint's data positions go back to
 * Redis for the workers. */
#ifndef PS_CHIEF_RESTORE_H
#define PS_CHIEF_RESTORE_H

#include <stdint.h>

#include "chief/cut.h"
#include "chief/summary.h"
#include "recovery/checkpoint.h"
#include "replica/registry.h"

typedef struct ps_restore_result {
  int found;                       /* a checkpoint was used */
  char from[PS_CKPT_NAME_MAX];     /* its name */
  uint64_t step;                   /* its step */
} ps_restore_result;

/* LOAD a state into every shard i whose stats[i] lacks
 * PS_STATS_INITIALIZED, through env's call (the chief's: fenced, renewing
 * the lease).  `everyone`: no shard had a state (a fresh or whole-cluster
 * restart), so the checkpoint's data positions are written to Redis
 * through reg too.  One log line and one summary event (sum) per shard
 * loaded.  out says which checkpoint was used, also on failure.
 * @return 0; -1 a shard did not take its state (logged; try again); -2 the
 * plan itself failed (logged: e.g. another optimizer than the
 * checkpoint's), retrying will not help. */
int ps_chief_restore(const ps_cut_env *env, ps_registry *reg, ps_summary *sum,
                     const ps_msg_stats_reply *stats, int everyone, ps_restore_result *out);

#endif
