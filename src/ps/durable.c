/* How an applied update becomes one a shard may acknowledge (see durable.h,
 * REDIS.md section 9). */
#include "ps/durable.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "ps/frontier.h"
#include "replica/replica.h"

struct ps_durable {
  uv_loop_t *loop;
  const ps_config *cfg;
  int index;
  uint64_t layout_hash;
  ps_shard *shard;
  ps_durable_fenced_fn fenced;
  void *fenced_arg;
  ps_replica *replica;      /* NULL before ps_durable_start, and with mode off */
  int closing;
  int fenced_out;           /* a newer incarnation took the shard: nothing is ever acked */
  /* Which entries are durable, and the acknowledgements waiting for them
   * (with a replica): fed what the replica reports Redis answered. */
  ps_frontier f;
  /* Back-pressure (REDIS.md §9): acknowledgements held while what a
   * restart would replay reaches backlog_max (0: never). */
  uint64_t backlog_max;
  uint64_t hold_ns;         /* when the hold began */
  int said_hold;
  /* The frame being handled (ps_durable_frame). */
  const void *frame_payload;
  ps_conn *frame_conn;
};

/* A kept acknowledgement: the caller's bytes follow. */
typedef struct kept_ack {
  ps_durable_ack_fn fn;
  max_align_t data[];
} kept_ack;

ps_durable *ps_durable_new(uv_loop_t *loop, const ps_config *cfg, int index, uint64_t layout_hash,
                           ps_shard *shard, ps_durable_fenced_fn fenced, void *fenced_arg) {
  ps_durable *d = calloc(1, sizeof *d);
  if (d == NULL)
    return NULL;
  *d = (ps_durable){.loop = loop, .cfg = cfg, .index = index, .layout_hash = layout_hash,
                    .shard = shard, .fenced = fenced, .fenced_arg = fenced_arg};
  return d;
}

#define MIB (1024.0 * 1024.0)

/* Keyed rows: when Redis merges changed rows slower than the workers make
 * them, the log and the unmerged delta chunks would grow without bound,
 * and with them a restart's replay and Redis's memory.  Once they reach
 * backlog_max the acknowledgements of later entries wait (the workers
 * wait with them) until a switch or the merges bring them under it. */
static void check_backlog(ps_durable *d) {
  if (d->backlog_max == 0 || d->replica == NULL || d->closing || d->fenced_out)
    return;
  uint64_t b = ps_replica_backlog(d->replica);
  if (!d->f.holding && b >= d->backlog_max) {
    ps_frontier_hold(&d->f, ps_shard_journal(d->shard));
    d->hold_ns = ps_now_ns();
    if (!d->said_hold)
      ps_log(PS_LOG_WARN, "redis: %.1f MiB of log and delta chunks not merged yet, what a "
             "restart would replay (2 x [replication] log_max_mb): acknowledgements held until a "
             "snapshot catches up (Redis merges changed rows slower than the workers change them; "
             "later holds are said when they last 1 s or more)", (double)b / MIB);
    d->said_hold = 1;
  } else if (d->f.holding && b < d->backlog_max) {
    double secs = (double)(ps_now_ns() - d->hold_ns) * 1e-9;
    if (secs >= 1)
      ps_log(PS_LOG_INFO, "redis: acknowledgements held %.1f s while Redis merged (%" PRIu64
             " waiting; the backlog is %.1f MiB, the bound %.1f MiB)", secs, d->f.waiting,
             (double)b / MIB, (double)d->backlog_max / MIB);
    ps_frontier_unhold(&d->f);
  }
}

/* What the replica reports Redis answered moves the frontier. */
static void on_appended(void *arg, uint64_t n, const char *failure) {
  ps_durable *d = arg;
  ps_frontier_answered(&d->f, n, failure);
  check_backlog(d);
}

static void on_drained(void *arg) { check_backlog(arg); }

static void on_switched(void *arg, uint64_t n) {
  ps_durable *d = arg;
  ps_frontier_covered(&d->f, n);
}

static void on_lost(void *arg, uint64_t n, const char *why) {
  ps_durable *d = arg;
  ps_frontier_lost(&d->f, n, why);
}

/* Fenced out: the kept acknowledgements are dropped, no later one is
 * kept, and the server stops (unless it is stopping already). */
static void on_fenced(void *arg, const char *why) {
  ps_durable *d = arg;
  d->fenced_out = 1;
  ps_frontier_cancel(&d->f, -EPERM);
  if (!d->closing && d->fenced != NULL)
    d->fenced(d->fenced_arg, why);
}

/* A hole (an entry not stored, or a state Redis does not hold) is
 * durable only once a snapshot covers it: one is owed. */
static int owed(void *arg) {
  const ps_durable *d = arg;
  return d->f.hole;
}

static uint64_t nondurable(void *arg) {
  const ps_durable *d = arg;
  return d->f.nondurable;
}

static uint64_t held(void *arg) {
  const ps_durable *d = arg;
  return d->f.waiting;
}

int ps_durable_start(ps_durable *d, const ps_restore_info *restored) {
  if (d->cfg->replication == PS_REPLICATION_OFF || d->replica != NULL || d->closing)
    return 0;
  /* What the restore loaded and replayed is in Redis; a state Redis never
   * held (fresh, or a chief's LOAD) is durable only once its first
   * snapshot switches. */
  ps_frontier_init(&d->f, d->cfg->on_redis_failure == PS_REDIS_FAILURE_DEGRADE,
                   restored->loaded, ps_shard_journal(d->shard), restored->nondurable);
  ps_replica_events ev = {.arg = d, .appended = on_appended, .switched = on_switched,
                          .lost = on_lost, .fenced = on_fenced, .owed = owed,
                          .nondurable = nondurable, .held = held, .drained = on_drained};
  /* Back-pressure for keyed rows in log mode (on_redis_failure = degrade
   * trains on whatever Redis does, so it holds nothing). */
  if (d->cfg->replication == PS_REPLICATION_LOG && d->cfg->sparse_rows == PS_SPARSE_ROWS_KEYED &&
      ps_shard_ntables(d->shard) > 0 && d->cfg->on_redis_failure != PS_REDIS_FAILURE_DEGRADE)
    d->backlog_max = (uint64_t)d->cfg->replicate_log_max_mb * 2 * 1048576;
  d->replica = ps_replica_new(d->loop, d->cfg, d->index, restored, d->layout_hash, d->shard, &ev);
  return d->replica != NULL ? 0 : -ENOMEM;
}

static int logging(const ps_durable *d) {
  return d->replica != NULL && d->cfg->replication == PS_REPLICATION_LOG;
}

void ps_durable_frame(ps_durable *d, const void *payload, ps_conn *conn) {
  d->frame_payload = payload;
  d->frame_conn = conn;
}

/* A push's entry borrows the frame's payload and goes out once the frames
 * read with it were handled: the pull that follows a push is answered
 * first, and the worker computes while the shard copies the gradient into
 * the XADD. */
void ps_durable_journal(ps_durable *d, const ps_journal *j) {
  if (!logging(d))
    return;
  if (j->g != NULL && (const void *)j->g == d->frame_payload && d->frame_conn != NULL) {
    if (ps_replica_append_later(d->replica, j))
      ps_conn_hold(d->frame_conn);
    return;
  }
  ps_replica_append(d->replica, j);
}

int ps_durable_fetch(ps_durable *d, const ps_shard_key *keys, size_t n, void (*done)(void *),
                     void *arg) {
  if (d->replica == NULL)
    return 1;
  return ps_replica_fetch(d->replica, keys, n, done, arg);
}

void ps_durable_flush(ps_durable *d) {
  if (d->replica != NULL)
    ps_replica_flush(d->replica);
}

void ps_durable_updated(ps_durable *d) {
  if (d->replica != NULL)
    ps_replica_updated(d->replica);
}

/* A kept acknowledgement's wait ended: PS_DURABLE_NOW or _NOT (send it),
 * or -EPERM (fenced out) or -ECANCELED (stopping): send nothing. */
static void ack_done(void *arg, int status) {
  kept_ack *k = arg;
  k->fn(k->data, status == PS_DURABLE_NOW || status == PS_DURABLE_NOT);
  free(k);
}

int ps_durable_submit(ps_durable *d, uint64_t n, const void *ack, size_t len,
                      ps_durable_ack_fn fn) {
  /* Durability `log`: the ack waits until Redis holds the entry (REDIS.md
   * section 9); in the other modes an update is acknowledged when applied. */
  if (!logging(d))
    return 1;
  kept_ack *k = malloc(sizeof *k + len);
  if (k == NULL)
    return -ENOMEM;
  k->fn = fn;
  memcpy(k->data, ack, len);
  /* An entry is durable when a restore would reach it (frontier.c); with
   * on_redis_failure = block only once its append and every earlier one
   * succeeded, or a snapshot that covers it switched. */
  int rc = d->fenced_out ? -EPERM : ps_frontier_wait(&d->f, n, ack_done, k);
  if (rc == PS_DURABLE_QUEUED)
    return 0;
  free(k);
  if (rc == PS_DURABLE_NOW || rc == PS_DURABLE_NOT)
    return 1;
  return rc;  /* -EPERM: fenced out, acknowledge nothing; -ENOMEM */
}

void ps_durable_stats_get(const ps_durable *d, ps_durable_stats *out) {
  memset(out, 0, sizeof *out);
  if (d->replica == NULL)
    return;
  out->started = 1;
  out->lag = ps_replica_lag(d->replica);
  out->lag_seconds = ps_replica_lag_seconds(d->replica);
  out->nondurable = d->f.nondurable;
  out->acks_waiting = d->f.waiting;
}

void ps_durable_watch_workers(ps_durable *d, ps_durable_alive_fn fn, void *arg) {
  if (d->replica != NULL)
    ps_replica_watch_workers(d->replica, fn, arg);
}

void ps_durable_stop(ps_durable *d) {
  if (d == NULL || d->closing)
    return;
  d->closing = 1;
  ps_replica *r = d->replica;
  d->replica = NULL;  /* from now on every call is a no-op */
  if (r == NULL)
    return;
  /* The close sends the kept entry first (answered now when it cannot be
   * sent), then whatever is still kept is dropped. */
  ps_replica_close(r, NULL, NULL);
  ps_frontier_cancel(&d->f, -ECANCELED);
}

void ps_durable_free(ps_durable *d) { free(d); }
