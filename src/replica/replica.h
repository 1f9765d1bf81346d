/* A shard's run-time replication to Redis (spec: REDIS.md): the journal
 * appended entry by entry (durability `log`), snapshots that compact it,
 * the heartbeat.  Every write is fenced by the shard's epoch.  Redis
 * transport only: which entries are durable, and the acknowledgements
 * that wait for them, are the owner's (src/ps/durable.c), told what Redis
 * answered through ps_replica_events.  Start-up is restore.h.
 *
 * Inside: link.c (the connection: connect, AUTH, CLAIM, fence, READONLY,
 * LOST, WAIT, the heartbeat's script) at the bottom, snapshot.c on it, and
 * this file (the log, the heartbeat's payload, the timers) on both; each
 * reports up through callbacks. */
#ifndef PS_REPLICA_REPLICA_H
#define PS_REPLICA_REPLICA_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/config.h"
#include "paramserv/error.h"
#include "ps/shard.h"
#include "replica/restore.h"

typedef struct ps_replica ps_replica;

/* What the replica tells its owner, and asks it; each with `arg`, on the
 * loop (an append that cannot be sent is answered before the call that
 * made it returns). */
typedef struct ps_replica_events {
  void *arg;
  /* Redis answered the append of journal entry n (in the order of n):
   * stored when failure is NULL, else not, and why (Redis's words: an
   * error reply, too few replicas confirming it, the connection lost or
   * past its deadline, not connected).  An append refused because this
   * incarnation was fenced out is not answered (fenced is). */
  void (*appended)(void *arg, uint64_t n, const char *failure);
  /* A snapshot of the state at journal count n switched (and, with
   * redis_replicas, the replicas hold it): Redis holds every entry <= n. */
  void (*switched)(void *arg, uint64_t n);
  /* Redis lost this shard's keys (FLUSHALL, a failover to a node without
   * them, a DEL...) and they were claimed back, at journal count n: what
   * it held is gone until a snapshot covering n switches. */
  void (*lost)(void *arg, uint64_t n, const char *why);
  /* Redis refused a write because a newer incarnation took the shard's
   * epoch: this process must stop serving.  Once. */
  void (*fenced)(void *arg, const char *why);
  /* Is a snapshot owed although the state did not change (entries are not
   * durable until one covers them)? */
  int (*owed)(void *arg);
  /* The updates acknowledged without being durable, over the run (the
   * heartbeat and the snapshots' meta carry it), and the acknowledgements
   * held now (the heartbeat's `held`; a failed snapshot says it). */
  uint64_t (*nondurable)(void *arg);
  uint64_t (*held)(void *arg);
  /* What a restart would replay shrank (a snapshot switched, a merge
   * answered): ps_replica_backlog is worth asking again.  May be NULL. */
  void (*drained)(void *arg);
} ps_replica_events;

/* Run-time replication on `loop` for shard `index`, whose start-up found
 * `restored` (its epoch; loaded or not).  `shard` must outlive the object;
 * ev is copied.  Connects in the background and reconnects with backoff;
 * every command has the [redis] timeout_ms deadline.  The first snapshot
 * starts as soon as the connection is up.  @return NULL on allocation
 * failure. */
ps_replica *ps_replica_new(uv_loop_t *loop, const ps_config *cfg, int index,
                           const ps_restore_info *restored, uint64_t layout_hash, ps_shard *shard,
                           const ps_replica_events *ev);

/* Append a journal entry the shard just made (durability `log`).  Entries
 * must be appended in the order of their n; the gradient is copied before
 * this returns. */
void ps_replica_append(ps_replica *r, const ps_journal *e);

/* The same, but the entry may be kept, its gradient borrowed, until
 * ps_replica_flush: so that a shard answers the pull that came with a push
 * before it copies the push's gradient into the XADD.  Any other append,
 * a snapshot's start and ps_replica_close flush it first, keeping the
 * order.  @return 1 when the entry was kept (e->g must stay valid and
 * unchanged until ps_replica_flush), 0 when it was handled now. */
int ps_replica_append_later(ps_replica *r, const ps_journal *e);

/* Append the kept entry, if any. */
void ps_replica_flush(ps_replica *r);

/* The shard's version changed: counts towards the every-K-updates
 * snapshot trigger. */
void ps_replica_updated(ps_replica *r);

/* Updates applied since the newest snapshot Redis holds. */
uint64_t ps_replica_lag(const ps_replica *r);
/* The bytes a restart would replay or merge before it serves: the log
 * since the newest snapshot Redis holds, and that snapshot's delta chunks
 * not merged yet (snapshot.h, ps_snaps_backlog). */
uint64_t ps_replica_backlog(const ps_replica *r);

/* How old the newest snapshot Redis holds is (seconds since its state was
 * copied), 0 when it covers every update (ps_replica_lag is 0). */
double ps_replica_lag_seconds(const ps_replica *r);

/* Called about once a heartbeat with which workers' heartbeat keys exist:
 * alive[j] for j < nworkers. */
typedef void (*ps_replica_alive_fn)(void *arg, const uint8_t *alive, int nworkers);

/* Watch the workers' heartbeats (set before the loop runs). */
void ps_replica_watch_workers(ps_replica *r, ps_replica_alive_fn fn, void *arg);

/* Stop: the kept entry goes out, then a last snapshot when connected and
 * the newest one is older than the shard (or one is owed), then every
 * handle is closed; done(arg) runs when all is released.  Events may come
 * until then (the answers of what was sent). */
void ps_replica_close(ps_replica *r, void (*done)(void *arg), void *arg);

/* A lazy restore (restore.h `lazy`): bring keys[0..n) (ps_shard_lazy_missing's)
 * into the shard's tables; done(arg) once they are in, on the loop.
 * @return 0 (done follows), 1 (no lazy load: nothing to wait for), or
 * -ENOMEM. */
int ps_replica_fetch(ps_replica *r, const ps_shard_key *keys, size_t n, void (*done)(void *),
                     void *arg);

#endif
