/* Replication of a shard's state to Redis (spec: src/replica/REDIS.md):
 * restoring it at start-up, appending every accepted push to the shard's
 * log before it is acknowledged (durability `log`), and writing snapshots
 * that compact the log.  Every write is fenced by the shard's epoch. */
#ifndef PS_REPLICA_REPLICA_H
#define PS_REPLICA_REPLICA_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/config.h"
#include "paramserv/error.h"
#include "ps/shard.h"

/* What ps_replica_restore found. */
typedef struct ps_restore_info {
  int loaded;            /* 1: the shard holds the replica's state */
  uint64_t epoch;        /* this incarnation's epoch (Redis INCR) */
  uint64_t snap_version; /* version of the snapshot loaded */
  uint64_t replayed;     /* log entries replayed after it */
  double seconds;        /* time spent, connect to ready */
} ps_restore_info;

/* Start-up, blocking: connect to Redis (retrying with backoff while it is
 * unreachable, logging what it waits for, until *stop becomes nonzero),
 * take a new epoch, and when a replica of this shard with the same layout
 * exists, load its snapshot and replay its log after it into `shard`
 * (which must be initialized with its options; values and slots are
 * overwritten).  A replica of another layout is an error (PS_ELAYOUT)
 * naming both hashes.  @return 0, or a negative code with a message. */
int ps_replica_restore(const ps_config *cfg, int index, uint64_t layout_hash, ps_shard *shard,
                       volatile int *stop, ps_restore_info *info, ps_errbuf *eb);

typedef struct ps_replica ps_replica;

/* Called when Redis refuses a write because a newer incarnation took the
 * shard's epoch: this process must stop serving. */
typedef void (*ps_replica_fenced_fn)(void *arg, const char *why);

/* Runtime replication on `loop` for shard `index` at `epoch`.  `shard`
 * must outlive the object.  Connects in the background and reconnects
 * with backoff; while Redis is away the shard keeps serving and the next
 * connection starts with a full snapshot.  @return NULL on allocation
 * failure. */
ps_replica *ps_replica_new(uv_loop_t *loop, const ps_config *cfg, int index, uint64_t epoch,
                           uint64_t layout_hash, ps_shard *shard, ps_replica_fenced_fn fenced,
                           void *fenced_arg);

/* Kinds of log entries. */
enum { PS_LOG_PUSH = 'p', PS_LOG_FLUSH = 'f', PS_LOG_RESET = 'r' };

/* Append one entry to the log, after the shard applied (or, in sync mode,
 * accepted) it: a push with its gradient (n floats), or a sync flush /
 * target reset (g NULL).  done(arg, status) runs once Redis stored it
 * (status 0) or when it cannot be stored now (status < 0: Redis away; the
 * entry is covered by the full snapshot written on reconnection).
 * Entries are stored in the order of the calls. */
void ps_replica_log(ps_replica *r, int kind, uint32_t worker, uint64_t incarnation, uint64_t seq,
                    uint64_t step, const float *g, size_t n, void (*done)(void *arg, int status),
                    void *arg);

/* The shard's version changed: counts towards the every-K-updates
 * snapshot trigger. */
void ps_replica_updated(ps_replica *r);

/* Lag: updates applied since the newest snapshot Redis holds. */
uint64_t ps_replica_lag(const ps_replica *r);

/* Stop: writes a last snapshot when connected, then closes every handle;
 * done(arg) runs when all is released. */
void ps_replica_close(ps_replica *r, void (*done)(void *arg), void *arg);

#endif
