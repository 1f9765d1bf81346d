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
  int gap;               /* replay stopped at a hole in the log (REDIS.md) */
  double seconds;        /* time spent, connect to ready */
  char snap_id[48];      /* the snapshot found, deleted after the next one */
  uint64_t snap_chunks;
  uint64_t last_v, last_k;  /* the log's newest entry id: new ids go above it */
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
ps_replica *ps_replica_new(uv_loop_t *loop, const ps_config *cfg, int index,
                           const ps_restore_info *restored, uint64_t layout_hash, ps_shard *shard,
                           ps_replica_fenced_fn fenced, void *fenced_arg);

/* Called about once a heartbeat with which workers' heartbeat keys exist:
 * alive[j] for j < nworkers. */
typedef void (*ps_replica_alive_fn)(void *arg, const uint8_t *alive, int nworkers);

/* Watch the workers' heartbeats (set before the loop runs). */
void ps_replica_watch_workers(ps_replica *r, ps_replica_alive_fn fn, void *arg);

/* Kinds of log entries. */
enum { PS_LOG_PUSH = 'p', PS_LOG_FLUSH = 'f', PS_LOG_RESET = 'r' };

typedef struct ps_log_entry {
  int kind;              /* PS_LOG_* */
  uint64_t v;            /* the version the entry leads to: its id is v-k */
  uint32_t worker;       /* push: who, which incarnation, which sequence */
  uint64_t incarnation, seq;
  uint64_t step;         /* push: the global step it was computed at */
  const float *g;        /* push: the gradient, n floats; NULL otherwise */
  size_t n;
} ps_log_entry;

/* Append an entry to the log, after the shard applied (or, in sync mode,
 * accepted) it.  done(arg, status) runs once Redis stored it (status 0) or
 * when it cannot be stored now (status < 0: Redis away or refusing; the
 * entry is then covered by the full snapshot written next).  Entries are
 * stored in the order of the calls. */
void ps_replica_log(ps_replica *r, const ps_log_entry *e, void (*done)(void *arg, int status),
                    void *arg);

/* done(arg, status) runs after every entry appended before this call was
 * answered: a duplicate push is acknowledged only once its original is
 * stored. */
void ps_replica_barrier(ps_replica *r, void (*done)(void *arg, int status), void *arg);

/* The shard's version changed: counts towards the every-K-updates
 * snapshot trigger. */
void ps_replica_updated(ps_replica *r);

/* Lag: updates applied since the newest snapshot Redis holds. */
uint64_t ps_replica_lag(const ps_replica *r);

/* Stop: writes a last snapshot when connected and the newest one is
 * older than the shard, then closes every handle; done(arg) runs when all
 * is released. */
void ps_replica_close(ps_replica *r, void (*done)(void *arg), void *arg);

#endif
