/* A shard's run-time replication to Redis (spec: REDIS.md): the journal
 * appended entry by entry (durability `log`), snapshots that compact it,
 * and the durability frontier that says when an acknowledgement may be
 * sent.  Every write is fenced by the shard's epoch.  Start-up is
 * restore.h. */
#ifndef PS_REPLICA_REPLICA_H
#define PS_REPLICA_REPLICA_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/config.h"
#include "paramserv/error.h"
#include "ps/shard.h"
#include "replica/frontier.h"
#include "replica/restore.h"

typedef struct ps_replica ps_replica;

/* Called once when Redis refuses a write because a newer incarnation took
 * the shard's epoch: this process must stop serving. */
typedef void (*ps_replica_fenced_fn)(void *arg, const char *why);

/* Run-time replication on `loop` for shard `index`, whose start-up found
 * `restored` (its epoch; loaded or not).  `shard` must outlive the object.
 * Connects in the background and reconnects with backoff; every command
 * has the [redis] timeout_ms deadline.  The first snapshot starts as soon
 * as the connection is up.  @return NULL on allocation failure. */
ps_replica *ps_replica_new(uv_loop_t *loop, const ps_config *cfg, int index,
                           const ps_restore_info *restored, uint64_t layout_hash, ps_shard *shard,
                           ps_replica_fenced_fn fenced, void *fenced_arg);

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

/* When is journal entry n (and every entry before it) durable: stored in
 * Redis so that a restore reaches it?  Either now (a PS_DURABLE_* code,
 * done is not called), or later: done(arg, status) runs on the loop with
 * status PS_DURABLE_NOW or PS_DURABLE_NOT as above, or -EPERM (fenced out:
 * acknowledge nothing), or -ECANCELED (the replica is closing).  With
 * on_redis_failure = block an entry is durable only once its append and
 * every earlier one succeeded, or a snapshot that covers it switched. */
int ps_replica_when_durable(ps_replica *r, uint64_t n, void (*done)(void *arg, int status),
                            void *arg);

/* The shard's version changed: counts towards the every-K-updates
 * snapshot trigger. */
void ps_replica_updated(ps_replica *r);

/* Updates applied since the newest snapshot Redis holds. */
uint64_t ps_replica_lag(const ps_replica *r);

/* How old the newest snapshot Redis holds is (seconds since its state was
 * copied), 0 when it covers every update (ps_replica_lag is 0). */
double ps_replica_lag_seconds(const ps_replica *r);

/* Updates acknowledged without being durable (degrade), over the run. */
uint64_t ps_replica_nondurable(const ps_replica *r);

/* Acknowledgements held until their entries are durable (log mode). */
uint64_t ps_replica_acks_waiting(const ps_replica *r);

/* Called about once a heartbeat with which workers' heartbeat keys exist:
 * alive[j] for j < nworkers. */
typedef void (*ps_replica_alive_fn)(void *arg, const uint8_t *alive, int nworkers);

/* Watch the workers' heartbeats (set before the loop runs). */
void ps_replica_watch_workers(ps_replica *r, ps_replica_alive_fn fn, void *arg);

/* Stop: writes a last snapshot when connected and the newest one is older
 * than the shard, then closes every handle; queued when_durable callbacks
 * get -ECANCELED; done(arg) runs when all is released. */
void ps_replica_close(ps_replica *r, void (*done)(void *arg), void *arg);

#endif
