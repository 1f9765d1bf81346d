/* A shard's run-time connection to Redis (REDIS.md §8): the bottom of
 * src/replica's run-time half.  One hiredis async connection on the
 * shard's loop (redis_uv.c) whose life is one state machine: DOWN ->
 * CONNECTING (AUTH and CLAIM queued first) -> UP, back to DOWN on any loss
 * or deadline, FENCED for good when a newer incarnation took the shard.
 * It finds the primary (the Sentinels or the Redis Cluster's nodes asked
 * on the loop's thread pool; a MOVED reply followed),
 * reconnects with backoff, reads what Redis's replies say about the
 * connection (FENCED, READONLY, LOST), sends the fenced heartbeat and the
 * WAITs, and reports up through ps_link_events: it calls nothing above it.
 * Private to src/replica: the snapshots (snapshot.c) and the log
 * (replica.c) send their commands on it. */
#ifndef PS_REPLICA_LINK_H
#define PS_REPLICA_LINK_H

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/backoff.h"
#include "common/config.h"
#include "paramserv/error.h"
#include "replica/keys.h"

/* The longest wait between two tries: connections, and snapshots that
 * failed (snapshot.c). */
#define PS_LINK_BACKOFF_CAP_MS 2000

typedef enum { PS_LINK_DOWN = 0, PS_LINK_CONNECTING, PS_LINK_UP, PS_LINK_FENCED } ps_link_state;

/* What the link tells its owner, each with `arg`.  The owner may free the
 * link from down and released (when it is closing and ps_link_busy is 0):
 * the link touches nothing of its own after calling them. */
typedef struct ps_link_events {
  void *arg;
  /* CLAIM answered: the connection is up.  claimed: 0 when Redis held
   * every key of the shard, 1 when it had lost some (logged; they are
   * claimed back, and nothing Redis held of the shard is left). */
  void (*up)(void *arg, int claimed);
  /* The connection is gone (lost, refused, past its deadline, dropped);
   * unless closing or fenced a reconnection is scheduled. */
  void (*down)(void *arg);
  /* Redis refused a write because a newer incarnation took the shard's
   * epoch (logged): this process must stop serving.  Once. */
  void (*fenced)(void *arg, const char *why);
  /* Closing: the link released something it held (the Sentinel query,
   * its timer). */
  void (*released)(void *arg);
} ps_link_events;

typedef struct ps_link {
  uv_loop_t *loop;
  const ps_config *cfg;
  const ps_shard_keys *k;   /* the owner's, outliving the link */
  int index;
  uint64_t epoch;
  char epoch_text[24];
  ps_link_events ev;

  ps_link_state state;
  redisAsyncContext *ac;
  ps_addr at;               /* the primary connected to (or last tried) */
  uv_work_t resolve;        /* asking the Sentinels or the cluster where the primary is */
  int resolving;
  ps_addr resolved;
  ps_addr moved_to;         /* the node a MOVED reply named, when moved */
  int moved;
  ps_errbuf resolve_eb;
  int wait_replicas;        /* WAIT for this many after each write that makes entries durable */
  ps_backoff backoff;       /* between connection attempts */
  int down_logged;
  char drop_why[200];        /* why this side dropped the connection */
  uv_timer_t retry;
  int retry_open;
  int closing;
  /* Redis held a snapshot of this state: CLAIM and the heartbeat check
   * that its meta and chunks are there.  Set by the owner (a restore
   * loaded one, a switch); a CLAIMED connection clears it. */
  int meta_expected;
} ps_link;

/* The link of shard `index`, incarnation `epoch`, to its keys `k`;
 * nothing connects before ps_link_connect. */
void ps_link_init(ps_link *l, uv_loop_t *loop, const ps_config *cfg, int index, uint64_t epoch,
                  const ps_shard_keys *k, int meta_expected, const ps_link_events *ev);

/* Connect (in the background; reconnects follow on their own). */
void ps_link_connect(ps_link *l);

/* The connection (NULL when there is none), and whether CLAIM answered on
 * it: commands sent while it is not up are not fenced yet. */
redisAsyncContext *ps_link_ac(const ps_link *l);
int ps_link_up(const ps_link *l);
int ps_link_fenced(const ps_link *l);

/* A FENCED error reply. */
int ps_link_is_fenced(const redisReply *rep);
/* A newer incarnation took over (why: Redis's words): FENCED for good. */
void ps_link_fence(ps_link *l, const char *why);
/* A READONLY reply: this server was made a replica (a failover); a MOVED
 * reply: the Redis Cluster serves the shard's slot elsewhere now.  Either
 * drops the connection, so that the primary is found again (after MOVED,
 * the node it named is connected to first).  Any other reply: nothing. */
void ps_link_check_role(ps_link *l, const redisReply *rep);
/* A LOST reply (HEARTBEAT's keys check, SWITCH's epoch): Redis lost this
 * shard's keys; drop the connection so that CLAIM takes them back.
 * @return 1 when rep was one. */
int ps_link_check_lost(ps_link *l, const redisReply *rep);
/* Drop the connection for `why` (logged as it goes down), if it is up:
 * the reconnection's CLAIM follows. */
void ps_link_drop(ps_link *l, const char *why);

/* WAIT for the configured replicas ([replication] redis_replicas; none: 0)
 * after what ac sent so far, fn(arg) on its answer: 0, or -1 when hiredis
 * refused the command. */
int ps_link_wait_replicas(const ps_link *l);
int ps_link_send_wait(ps_link *l, redisAsyncContext *ac, redisCallbackFn *fn, void *arg);
/* A WAIT's answer: NULL when enough replicas confirmed, else why not (a
 * static string, the reply's, or written into why). */
const char *ps_link_wait_failure(const ps_link *l, const redisReply *rep, char *why, size_t len);

/* The fenced heartbeat (REDIS.md §5): P:node set to `payload` with a TTL
 * of three [worker] heartbeat_ms while every key of the shard holds; its
 * answer is the link's (FENCED, LOST).  Only while up. */
void ps_link_heartbeat(ps_link *l, const char *payload);

/* Closing: no reconnection from now on, the timer closed. */
void ps_link_close(ps_link *l);
/* End the connection once what was sent is answered (closing). */
void ps_link_disconnect(ps_link *l);
/* Whether the link still holds anything: a connection, a Sentinel query,
 * its timer.  The owner frees it only when not. */
int ps_link_busy(const ps_link *l);

#endif
