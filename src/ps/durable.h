/* How an update a shard applied becomes one it may acknowledge (REDIS.md
 * section 9, "Durability"): the one module between the shard server and
 * its Redis replica.  It owns the replication mode ([replication] mode:
 * off, snapshot, log), the replica (src/replica: Redis transport and
 * snapshots, which reports what Redis answered), the durability frontier
 * (frontier.c: which entries a restore would reach), the journal entries
 * the shard makes, the borrowed payload of the frame being handled with
 * its connection's hold, and the acknowledgements that wait for the
 * frontier.  Private to src/ps:
 * the server (server.c), the consistency rules (consistency.c) and the
 * control frames (control.c) use it; none of them sees ps_replica.
 *
 * A push's path: the shard applies it and makes its journal entry
 * (ps_shard_push); ps_durable_journal hands the entry over (log mode: kept
 * with its gradient borrowed from the frame while the frames read with it
 * are answered, then appended at ps_durable_flush); ps_durable_submit
 * either says "acknowledge now" or keeps the acknowledgement until the
 * entry is durable and gives it back through its callback. */
#ifndef PS_PS_DURABLE_H
#define PS_PS_DURABLE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/config.h"
#include "net/conn.h"
#include "ps/shard.h"
#include "replica/restore.h"

typedef struct ps_durable ps_durable;

/* Called once when Redis refuses a write because a newer incarnation took
 * the shard's epoch: this process must stop serving. */
typedef void (*ps_durable_fenced_fn)(void *arg, const char *why);

/* The durability of shard `index`'s updates on `loop` with cfg's
 * replication mode; `shard` must outlive it.  Nothing is replicated until
 * ps_durable_start.  @return NULL on allocation failure. */
ps_durable *ps_durable_new(uv_loop_t *loop, const ps_config *cfg, int index, uint64_t layout_hash,
                           ps_shard *shard, ps_durable_fenced_fn fenced, void *fenced_arg);

/* The shard holds a state (restored, seeded or loaded by the chief, as
 * `restored` says): replicate it from now on (mode off: nothing).  A state
 * Redis does not hold yet is durable only once its first snapshot
 * switches.  @return 0, or -ENOMEM. */
int ps_durable_start(ps_durable *d, const ps_restore_info *restored);

/* A lazy restore: bring these keys' rows in from Redis (replica.h,
 * ps_replica_fetch); done(arg) once they are.  @return 0 (done follows), 1
 * (nothing to wait for), -ENOMEM. */
int ps_durable_fetch(ps_durable *d, const ps_shard_key *keys, size_t n, void (*done)(void *),
                     void *arg);

/* The frame being handled, while it is: a journal entry whose gradient is
 * `payload` borrows it, and `conn` holds the frame (ps_conn_hold) until
 * ps_durable_flush.  NULL, NULL after the frame. */
void ps_durable_frame(ps_durable *d, const void *payload, ps_conn *conn);

/* A journal entry the shard just made (in the order of their n): appended
 * to the replica's log in mode log, nothing otherwise. */
void ps_durable_journal(ps_durable *d, const ps_journal *j);

/* The frames read with a held payload were handled: its entry goes out. */
void ps_durable_flush(ps_durable *d);

/* The shard's version changed (it counts towards the every-K-updates
 * snapshot trigger). */
void ps_durable_updated(ps_durable *d);

/* What becomes of an acknowledgement kept by ps_durable_submit: acked 1
 * (send it: its entry is durable, or in degrade mode Redis failed it and it
 * is counted as non-durable), or 0 (send nothing: fenced out, or closing).
 * `ack` is the submitted copy, freed after the call. */
typedef void (*ps_durable_ack_fn)(void *ack, int acked);

/* May the acknowledgement of a push whose journal count is n (its own
 * entry's, or for a duplicate the shard's count now, which covers its
 * original) be sent?  @return 1: now; 0: later, through fn with a copy of
 * the len bytes at `ack`; -EPERM: never (fenced out: the server stops);
 * -ENOMEM: not kept (the caller closes the connection: the worker sends the
 * push again on a new one, a duplicate then). */
int ps_durable_submit(ps_durable *d, uint64_t n, const void *ack, size_t len,
                      ps_durable_ack_fn fn);

/* The replica's figures for metrics (0 without one). */
typedef struct ps_durable_stats {
  int started;           /* a replica runs (the figures below are its) */
  uint64_t lag;          /* updates since the newest snapshot Redis holds */
  double lag_seconds;    /* that snapshot's age (0 when it covers every update) */
  uint64_t nondurable;   /* acknowledged without being durable (degrade), over the run */
  uint64_t acks_waiting; /* acknowledgements kept for the frontier */
} ps_durable_stats;
void ps_durable_stats_get(const ps_durable *d, ps_durable_stats *out);

/* Called about once a heartbeat with which workers' heartbeat keys exist:
 * alive[j] for j < nworkers.  Set after ps_durable_start (no-op before, or
 * without Redis). */
typedef void (*ps_durable_alive_fn)(void *arg, const uint8_t *alive, int nworkers);
void ps_durable_watch_workers(ps_durable *d, ps_durable_alive_fn fn, void *arg);

/* Stop replicating: a last snapshot when connected and the newest is older
 * than the shard (finished on the loop); kept acknowledgements get acked 0
 * now; every later call is a no-op. */
void ps_durable_stop(ps_durable *d);

/* Free, once the loop has run out (the replica may call back until its
 * handles are closed).  NULL does nothing. */
void ps_durable_free(ps_durable *d);

#endif
