/* A shard's snapshots in Redis (REDIS.md §6), on the link (link.h): the
 * state image copied on the loop (the consistent cut), registered in
 * P:snaps, stored in raw chunks a few at a time, then switched in by one
 * fenced script that trims the log it covers (and, with redis_replicas,
 * confirmed by WAIT before it covers anything); each switch deletes the
 * snapshots that never switched.  When one is due and what a switch means
 * for durability are the owner's: it reports through ps_snap_events and
 * calls nothing above it.  Private to src/replica (replica.c). */
#ifndef PS_REPLICA_SNAPSHOT_H
#define PS_REPLICA_SNAPSHOT_H

#include <stdint.h>

#include "common/backoff.h"
#include "ps/shard.h"
#include "replica/link.h"
#include "replica/restore.h"

/* What the snapshots tell, and ask, their owner; each with `arg`. */
typedef struct ps_snap_events {
  void *arg;
  /* A snapshot is about to cut the state: every journal entry made so
   * far must be sent before its chunks (the owner's kept entry). */
  void (*before_copy)(void *arg);
  /* A snapshot of the state at journal count n switched (and, with
   * redis_replicas, the replicas hold it): it covers every entry <= n. */
  void (*switched)(void *arg, uint64_t n);
  /* Closing: the snapshots are done (the last one ended, or none was due)
   * and the connection is gone.  The owner may free them. */
  void (*closed)(void *arg);
  /* Is a snapshot owed although the state did not change: entries are not
   * durable until one covers them (a hole). */
  int (*owed)(void *arg);
  /* The updates acknowledged without being durable, over the run: the
   * snapshot's meta carries it on. */
  uint64_t (*nondurable)(void *arg);
  /* Acknowledgements held until entries are durable: a failed snapshot
   * says so. */
  uint64_t (*held)(void *arg);
  /* What a restart would replay shrank (a switch, a merge answered):
   * ps_snaps_backlog is worth asking again.  May be NULL. */
  void (*drained)(void *arg);
} ps_snap_events;

typedef struct ps_snap_job ps_snap_job;

typedef struct ps_snaps {
  ps_link *link;          /* its config, keys and epoch are the snapshots' */
  ps_shard *shard;
  uint64_t layout_hash;
  ps_snap_events ev;

  uint64_t version;       /* newest snapshot Redis holds */
  uint64_t taken_ns;      /* when its state was copied (0: none this run) */
  uint64_t started_ns;    /* ps_snaps_init: the lag's start without one */
  uint64_t updates;       /* since the last snapshot began */
  uint64_t ticked;        /* `updates` at the previous tick: none since, the shard is idle */
  uint64_t log_bytes;     /* journal bytes appended since the last snapshot began */
  uint64_t log_unswitched; /* ... since the newest switched snapshot's cut: a restart replays it */
  int need_full;          /* a snapshot is owed: a new connection, or the last one failed */
  ps_snap_job *job;       /* a snapshot in flight */
  ps_backoff backoff;     /* between snapshots that failed */
  uint64_t next_ns;       /* no new one before this, after a failure */
  uint64_t said_ns;       /* when a failed snapshot was last reported (0: none since one worked) */
  uint64_t failures;      /* failed snapshots since that report */
  int said_held;          /* that report named acknowledgements held */
  int gc_pending;         /* a switch's GC listing not yet answered */
  uint64_t counter;
  int closing, final_started;
  /* Format 5, sparse tables: the rows kept by key (rows.h). */
  int need_all;           /* the next cut is of every entry: Redis lost rows, or a merge failed */
  uint64_t rank_next;     /* the next cut's entries rank from here */
  struct ps_snap_merges {
    char id[48];          /* the switched snapshot whose delta chunks are being merged */
    uint64_t count, next; /* its delta chunks to merge; the first not known to be merged */
    uint64_t made;        /* its delta chunks (groups[0 .. made)) */
    uint64_t sent;        /* merges issued */
    uint32_t **groups;    /* each chunk's groups' buckets: its merge's KEYS */
    size_t *ngroups;
    int running;          /* merges in flight */
  } mg;
} ps_snaps;

/* The snapshots of `shard` on `l` (the link's shard keys and epoch), after
 * `restored` (what the restore loaded: the version of the snapshot Redis
 * holds, none when not loaded; where its rows' ranks end).  The first one
 * is owed. */
void ps_snaps_init(ps_snaps *s, ps_link *l, ps_shard *shard, uint64_t layout_hash,
                   const ps_restore_info *restored, const ps_snap_events *ev);

/* Start a snapshot when one may (connected, none in flight, not backing
 * off after a failure): the state cut now (ps_shard_reader), its chunks
 * read from the cut as they are sent, on the loop. */
void ps_snaps_start(ps_snaps *s);
/* The replication interval's tick: a snapshot when the state changed
 * since the last one began, one is owed, or the owner owes one. */
void ps_snaps_tick(ps_snaps *s);
/* The shard's version changed: counts towards [replication]
 * every_updates. */
void ps_snaps_updated(ps_snaps *s);

/* A journal entry of `bytes` went to Redis (durability `log`): a snapshot
 * waits until the log it would trim holds about as many bytes as the state
 * image (see ps_snaps_tick). */
void ps_snaps_logged(ps_snaps *s, uint64_t bytes);
/* The bytes a restart would replay or merge first (REDIS.md §6): the log
 * since the newest switched snapshot's cut, and that snapshot's delta
 * chunks not merged yet (counted at PS_DELTA_BYTES each). */
uint64_t ps_snaps_backlog(const ps_snaps *s);
/* The connection went down: a full snapshot is owed. */
void ps_snaps_owe(ps_snaps *s);
/* A new connection is up (claimed: Redis had lost the shard's keys, and
 * holds no snapshot of it now): a snapshot at once. */
void ps_snaps_connected(ps_snaps *s, int claimed);

/* Updates applied since the newest snapshot Redis holds, and how old it is
 * (seconds since its state was copied; 0 when it covers every update). */
uint64_t ps_snaps_lag(const ps_snaps *s);
double ps_snaps_lag_seconds(const ps_snaps *s);

/* The clean stop: a last snapshot when the newest switched one is older
 * than the state (or one is owed), then the link's disconnect (the link's
 * down says when it is gone), or ev.closed when no connection is left.  A
 * snapshot in flight is abandoned first. */
void ps_snaps_close(ps_snaps *s);
/* A snapshot, or the merges of one, in flight. */
int ps_snaps_busy(const ps_snaps *s);

#endif
