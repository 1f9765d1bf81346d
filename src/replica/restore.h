/* A shard's start-up from its replica in Redis (spec: REDIS.md §7):
 * blocking, before the shard listens. */
#ifndef PS_REPLICA_RESTORE_H
#define PS_REPLICA_RESTORE_H

#include <stdint.h>

#include "common/config.h"
#include "paramserv/error.h"
#include "ps/shard.h"

/* What ps_replica_restore found. */
typedef struct ps_restore_info {
  int loaded;            /* 1: the shard holds the replica's state */
  uint64_t epoch;        /* this incarnation's epoch (Redis EPOCH) */
  uint64_t snap_version; /* version of the snapshot loaded */
  uint64_t snap_journal; /* its journal count */
  uint64_t replayed;     /* log entries replayed after it */
  uint64_t skipped;      /* entries after a missing one: never acknowledged
                            with on_redis_failure = block (REDIS.md §9) */
  uint64_t nondurable;   /* acknowledged without their entry, over the run */
  uint64_t rank_next;    /* format 5: the next snapshot's rows rank above this */
  uint64_t merged;       /* delta chunks a previous incarnation left, merged */
  uint64_t rows;         /* sparse table entries read from the rows' hashes */
  int lazy;              /* the tables' entries come in while the shard serves (rowload.h) */
  const ps_config *cfg;  /* the config restored with (set by ps_replica_restore) */
  uint64_t gc_snapshots; /* snapshots that never switched, deleted */
  uint64_t gc_streams;   /* logs of dead incarnations, deleted */
  double seconds;        /* time spent, connect to ready */
  double claim_s;        /* of which connecting, the epoch, the log taken over, the meta read */
  double merge_s;        /* finishing the delta chunks' merges */
  double read_s;         /* of which reading the snapshot's chunks (and rows) */
  double decode_s;       /* decoding its sparse tables into the shard */
  double replay_s;       /* reading and replaying the log */
  uint64_t fetched;      /* of which (a lazy restore) the keys its entries name, fetched first */
  double fetch_s;        /* in this many seconds */
  double gc_s;           /* deleting what no restore can use */
} ps_restore_info;

/* Connect to Redis (retrying with backoff while it is unreachable, logging
 * what it waits for, until *stop becomes nonzero), take a new epoch (which
 * fences every older incarnation), take the log stream over, and when a
 * replica of this shard with the same layout exists, load its snapshot and
 * replay the log entries that follow it into `shard` (initialized with its
 * options; its state is overwritten).  Deletes what no restore can use:
 * chunks of snapshots that never switched and streams of dead
 * incarnations.  A replica of another layout is PS_ELAYOUT naming both.
 * @return 0, or a negative code with a message. */
int ps_replica_restore(const ps_config *cfg, int index, uint64_t layout_hash, ps_shard *shard,
                       volatile int *stop, ps_restore_info *info, ps_errbuf *eb);

#endif
