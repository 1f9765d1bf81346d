/* What the chief knows of the other nodes: each shard up or lost (from
 * its STATS replies) and each worker (from its heartbeat in Redis), and
 * their incarnations, so that a restart between two looks is seen.  Each
 * change is logged and written to the summaries (node_lost, node_back). */
#ifndef PS_CHIEF_NODES_H
#define PS_CHIEF_NODES_H

#include <stdint.h>

#include "chief/summary.h"
#include "common/config.h"
#include "proto/proto.h"
#include "replica/registry.h"

typedef struct ps_nodes {
  const ps_config *cfg;
  ps_summary *sum;             /* not owned */
  int shard_up[PS_CONFIG_MAX_NODES];
  uint64_t shard_incarnation[PS_CONFIG_MAX_NODES];  /* 0: never seen */
  int worker_up[PS_CONFIG_MAX_NODES];               /* 0 not seen yet, 1 up, -1 lost */
  uint64_t worker_incarnation[PS_CONFIG_MAX_NODES];
  uint64_t worker_lost_ns[PS_CONFIG_MAX_NODES];     /* when its heartbeat was found gone */
  uint64_t workers_checked_ns;
} ps_nodes;

void ps_nodes_init(ps_nodes *n, const ps_config *cfg, ps_summary *sum);

/* A round of STATS: shard i answered when ok[i], with stats[i]; `why` says
 * why the others did not.  gstep: the step events are written at. */
void ps_nodes_shards(ps_nodes *n, const int *ok, const ps_msg_stats_reply *stats,
                     const char *why, uint64_t gstep);

/* The workers' heartbeats in Redis, at most once a second. */
void ps_nodes_workers(ps_nodes *n, ps_registry *reg, uint64_t gstep);

#endif
