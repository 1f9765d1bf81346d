/* The replica's state, shared by its two halves: replica.c (the
 * connection's state machine, the log, the heartbeat) and snapshot.c (the
 * snapshot job: copy, compress, register, store, switch, GC).  Private to
 * src/replica. */
#ifndef PS_REPLICA_REPLICA_INTERNAL_H
#define PS_REPLICA_REPLICA_INTERNAL_H

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdint.h>
#include <uv.h>

#include "common/backoff.h"
#include "replica/frontier.h"
#include "replica/keys.h"
#include "replica/replica.h"

typedef enum { RS_DOWN = 0, RS_CONNECTING, RS_UP, RS_FENCED } rstate;

typedef struct snap_job {
  float *img;             /* the copied state image; chunk k is floats [k*262144, ...) */
  ps_state_info info;
  uint64_t journal, nondurable;
  uint64_t taken_ns;      /* when the state was copied */
  uint64_t nchunks;
  char id[48];
  uint64_t next;          /* the next chunk to SET */
  uint64_t pending;       /* chunk SETs issued and not yet answered */
  int failed;
  char why[240];          /* why it failed, from Redis's reply ("" unknown) */
} snap_job;


struct ps_replica {
  uv_loop_t *loop;
  const ps_config *cfg;
  int index;
  uint64_t epoch, layout_hash;
  char epoch_text[24];
  ps_shard_keys k;
  ps_shard *shard;
  ps_replica_fenced_fn fenced;
  void *fenced_arg;

  rstate state;
  redisAsyncContext *ac;
  ps_addr at;               /* the primary connected to (or last tried) */
  uv_work_t resolve;        /* asking the Sentinels where the primary is */
  int resolving;
  ps_addr resolved;
  ps_errbuf resolve_eb;
  int wait_replicas;        /* WAIT for this many after each write that makes entries durable */
  ps_backoff backoff;  /* between connection attempts */
  int down_logged;
  char drop_why[96];        /* why this side dropped the connection */
  ps_frontier f;            /* which entries are durable; the acks waiting */

  uv_timer_t retry, interval;
  int handles_open;
  int closing, final_started;
  void (*close_done)(void *);
  void *close_arg;

  uint64_t snap_version;    /* newest snapshot Redis holds */
  int meta_expected;        /* Redis held a snapshot of this state: its meta and chunks must be there */
  uint64_t snap_taken_ns;   /* when its state was copied (0: none this run) */
  uint64_t started_ns;      /* ps_replica_new */
  uint64_t updates;         /* since the last snapshot began */
  int need_full;            /* a snapshot is owed: a new connection, or the last one failed */
  snap_job *job;            /* a snapshot in flight */
  ps_backoff snap_backoff;  /* between snapshots that failed */
  uint64_t snap_next_ns;    /* no new one before this, after a failure */
  uint64_t snap_said_ns;    /* when a failed snapshot was last reported (0: none since one worked) */
  uint64_t snap_failures;   /* failed snapshots since that report */
  int snap_said_held;       /* that report named acknowledgements held */
  int gc_pending;           /* a switch's GC listing not yet answered */
  uint64_t snap_counter;
  char *entry;              /* a log entry's XADD: its head, then the gradient */
  size_t entry_cap;
  ps_journal later;         /* ps_replica_append_later's entry, its gradient borrowed */
  int has_later;
  uint64_t last_hb_ns;
  ps_replica_alive_fn alive_fn;
  void *alive_arg;
};

/* replica.c, for snapshot.c */
void ps__replica_fence(ps_replica *r, const char *why);   /* a newer incarnation took over */
int ps__replica_is_fenced(const redisReply *rep);         /* a FENCED error reply */
void ps__replica_check_readonly(ps_replica *r, const redisReply *rep);  /* READONLY: reconnect */
/* Drop the connection for `why` (logged as it goes down), if it is up: the
 * reconnection's CLAIM follows. */
void ps__replica_drop(ps_replica *r, const char *why);
/* A LOST reply (HEARTBEAT's keys check, SWITCH's epoch): Redis lost this
 * shard's keys; drop the connection so that CLAIM takes them back.
 * @return 1 when rep was one. */
int ps__replica_check_lost(ps_replica *r, const redisReply *rep);
/* WAIT for wait_replicas replicas after what ac sent so far, fn(arg) on its
 * answer: 0, or -1 when hiredis refused the command. */
int ps__replica_send_wait(ps_replica *r, redisAsyncContext *ac, redisCallbackFn *fn, void *arg);
/* A WAIT's answer: NULL when enough replicas confirmed, else why not (a
 * static string, the reply's, or written into why). */
const char *ps__replica_wait_failure(const ps_replica *r, const redisReply *rep, char *why,
                                     size_t len);
void ps__replica_maybe_finish_close(ps_replica *r);       /* the close's last step, when due */

/* snapshot.c, for replica.c */
/* Start a snapshot when one is due and none is in flight (a copy of the
 * state now, the rest off the loop). */
void ps__replica_snapshot_start(ps_replica *r);
/* The clean stop: a last snapshot when the newest switched one is older
 * than the state, then the close. */
void ps__replica_snapshots_close(ps_replica *r);

#endif
