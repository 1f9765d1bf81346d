/* A shard's run-time replication to Redis (see replica.h, REDIS.md).
 *
 * The top of the run-time half: the connection is link.c's (its state
 * machine, CLAIM, fencing, WAIT), the snapshots snapshot.c's; here are the
 * log (journal entries appended in order, confirmed by WAIT with
 * redis_replicas), the heartbeat's payload, the workers' liveness and the
 * replication interval's timer.  What Redis answered goes to the owner
 * (ps_replica_events), which decides what is durable. */
#include "replica/replica.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "replica/keys.h"
#include "replica/link.h"
#include "replica/registry.h"
#include "replica/rowload.h"
#include "replica/snapshot.h"

struct ps_replica {
  uv_loop_t *loop;
  const ps_config *cfg;
  int index;
  uint64_t epoch;
  ps_shard_keys k;
  ps_shard *shard;
  ps_replica_events ev;     /* the owner's */
  ps_link link;
  ps_snaps snaps;
  ps_rowload *rowload;      /* a lazy restore's rows still coming in (NULL: none) */

  uv_timer_t interval;
  int interval_open;
  int closing;
  void (*close_done)(void *);
  void *close_arg;

  char *entry;              /* a log entry's XADD: its head, then the gradient */
  size_t entry_cap;
  ps_journal later;         /* ps_replica_append_later's entry, its gradient borrowed */
  int has_later;
  uint64_t last_hb_ns;
  ps_replica_alive_fn alive_fn;
  void *alive_arg;
  /* The workers' heartbeats are the cluster's records ({C}), which a
   * Redis Cluster keeps on the node of that tag's slot, not the shard's:
   * they are read on a blocking connection of their own, on the loop's
   * thread pool. */
  ps_registry *watch_reg;
  uv_work_t watch;
  int watching;             /* a read in flight */
  int watch_ok;
  uint8_t alive[PS_CONFIG_MAX_NODES];
};

/* One log append in flight: its XADD's answer, kept until its WAIT's. */
typedef struct append_req {
  struct ps_replica *r;
  uint64_t n;
  int waiting;              /* a WAIT follows the XADD */
  int fenced;               /* the XADD fenced this incarnation out */
  char failure[160];        /* the XADD's failure; "" when Redis stored it */
} append_req;

/* ------------------------------------------------------------ close */

/* Free r once nothing of it is left on the loop: the link's connection,
 * Sentinel query and timer, a snapshot in flight, the interval timer. */
static void maybe_finish_close(ps_replica *r) {
  if (!r->closing || ps_link_busy(&r->link) || ps_snaps_busy(&r->snaps) || r->interval_open ||
      r->watching)
    return;
  ps_registry_free(r->watch_reg);
  ps_rowload_free(r->rowload);
  free(r->entry);
  void (*done)(void *) = r->close_done;
  void *arg = r->close_arg;
  free(r);
  if (done)
    done(arg);
}

static void on_interval_closed(uv_handle_t *h) {
  ps_replica *r = h->data;
  r->interval_open = 0;
  maybe_finish_close(r);
}

/* ----------------------------------------------- the link's reports */

/* The rows of a lazy restore could not come in: the state is not whole,
 * so nothing more may be acknowledged; the process stops, and its next
 * start restores again. */
static void on_rows_failed(void *arg, const char *why) {
  ps_replica *r = arg;
  char line[900];
  snprintf(line, sizeof line, "rows: the tables' rows could not be loaded from Redis: %s", why);
  ps_log(PS_LOG_ERROR, "%s", line);
  r->ev.fenced(r->ev.arg, line);
}

static void on_link_up(void *arg, int claimed) {
  ps_replica *r = arg;
  /* Whatever Redis held of this shard is gone: nothing is durable until a
   * new snapshot switches. */
  if (claimed)
    r->ev.lost(r->ev.arg, ps_shard_journal(r->shard), "Redis lost this shard's keys");
  ps_snaps_connected(&r->snaps, claimed);
  if (r->rowload != NULL && claimed && ps_shard_lazy(r->shard)) {
    /* The rows not back yet went with the rest. */
    on_rows_failed(r, "Redis lost this shard's keys while its rows were coming back");
    return;
  }
  if (r->rowload != NULL)
    ps_rowload_up(r->rowload);
}

int ps_replica_fetch(ps_replica *r, const ps_shard_key *keys, size_t n, void (*done)(void *),
                     void *arg) {
  if (r->rowload == NULL)
    return 1;
  return ps_rowload_fetch(r->rowload, keys, n, done, arg);
}

static void on_link_down(void *arg) {
  ps_replica *r = arg;
  ps_snaps_owe(&r->snaps);
  if (r->closing)
    maybe_finish_close(r);
}

static void on_link_fenced(void *arg, const char *why) {
  ps_replica *r = arg;
  r->ev.fenced(r->ev.arg, why);
}

static void on_link_released(void *arg) { maybe_finish_close(arg); }

/* -------------------------------------------- the snapshots' reports */

static void on_snap_before_copy(void *arg) { ps_replica_flush(arg); }

static void on_snap_switched(void *arg, uint64_t n) {
  ps_replica *r = arg;
  r->ev.switched(r->ev.arg, n);
}

static void on_snap_closed(void *arg) { maybe_finish_close(arg); }

static int snap_owed(void *arg) {
  ps_replica *r = arg;
  return r->ev.owed(r->ev.arg);
}

static uint64_t snap_nondurable(void *arg) {
  ps_replica *r = arg;
  return r->ev.nondurable(r->ev.arg);
}

static uint64_t snap_held(void *arg) {
  ps_replica *r = arg;
  return r->ev.held(r->ev.arg);
}

static void snap_drained(void *arg) {
  ps_replica *r = arg;
  if (r->ev.drained != NULL)
    r->ev.drained(r->ev.arg);
}

uint64_t ps_replica_backlog(const ps_replica *r) { return ps_snaps_backlog(&r->snaps); }

/* ------------------------------------------------------------ the log */

static void on_appended(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  append_req *q = priv;
  ps_replica *r = q->r;
  redisReply *rep = reply;
  if (rep != NULL && rep->type == REDIS_REPLY_NIL) {
    /* NOMKSTREAM found no stream: a newer incarnation took it over, or
     * Redis lost it.  The reconnection's claim tells which (FENCED, or
     * CLAIMED and a full snapshot). */
    snprintf(q->failure, sizeof q->failure, "the log stream %.120s is gone", r->k.log);
    ps_link_drop(&r->link,
                 "the log stream is gone (a newer incarnation, or Redis lost it): checking");
  } else if (ps_link_is_fenced(rep)) {
    q->fenced = 1;
    ps_link_fence(&r->link, rep->str);
  } else if (rep == NULL) {
    snprintf(q->failure, sizeof q->failure, "the connection to Redis was lost");
  } else if (rep->type == REDIS_REPLY_ERROR) {
    snprintf(q->failure, sizeof q->failure, "%s", rep->str);
    ps_link_check_role(&r->link, rep);
  }
  if (q->waiting)
    return;  /* on_waited answers */
  if (!q->fenced)
    r->ev.appended(r->ev.arg, q->n, q->failure[0] ? q->failure : NULL);
  free(q);
}

/* The WAIT after an append: the entry is durable once the primary and
 * wait_replicas replicas hold it (REDIS.md, "Sentinel"). */
static void on_waited(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  append_req *q = priv;
  ps_replica *r = q->r;
  char why[200];
  if (!q->fenced)
    r->ev.appended(r->ev.arg, q->n,
                   q->failure[0] ? q->failure
                                 : ps_link_wait_failure(&r->link, reply, why, sizeof why));
  free(q);
}

/* The XADD of an entry is written as RESP around its gradient: the
 * gradient is copied into r->entry after room for the command's head, the
 * head goes just before it, and hiredis copies the whole into its output
 * buffer.  redisAsyncCommandArgv makes as many copies, but formats each
 * command into a fresh buffer: on the mlp 1250 (4 MB entries) that was
 * about 6% fewer samples/s (median of 12 alternating runs, log mode). */
#define XADD_HEAD_MAX 1024

/* Format and send one entry's XADD (and its WAIT). */
/* Format and send one entry's XADD (and its WAIT). */
static void append_now(ps_replica *r, const ps_journal *e) {
  if (ps_link_fenced(&r->link))
    return;
  if (!ps_link_up(&r->link) || r->closing) {
    r->ev.appended(r->ev.arg, e->n, "Redis is not connected");
    return;
  }
  /* A push's `v`: its gradient for the slice, then its sparse blocks. */
  size_t dense = e->kind == PS_JOURNAL_PUSH ? ps_shard_options(r->shard)->nfloats * sizeof(float) : 0;
  size_t raw = dense + (e->kind == PS_JOURNAL_PUSH ? (size_t)e->sparse_bytes : 0);
  size_t need = XADD_HEAD_MAX + raw + 2;
  if (need > r->entry_cap) {
    char *p = realloc(r->entry, need);
    if (p == NULL) {
      r->ev.appended(r->ev.arg, e->n, "out of memory for the entry");
      return;
    }
    r->entry = p;
    r->entry_cap = need;
  }
  /* The gradient goes in as it is: LZ4 saved 7-9% of a gradient's bytes
   * (and 1-3% of a state's) for more CPU than sending them costs. */
  char *g = r->entry + XADD_HEAD_MAX;
  if (dense > 0)
    memcpy(g, e->g, dense);
  if (raw > dense)
    memcpy(g + dense, e->sparse, raw - dense);
  append_req *q = malloc(sizeof *q);
  if (q == NULL) {
    r->ev.appended(r->ev.arg, e->n, "out of memory");
    return;
  }
  *q = (append_req){.r = r, .n = e->n};
  char id[48], ks[2] = {(char)e->kind, 0}, ws[16], is[24], ss[24], ts[24];
  snprintf(id, sizeof id, "%" PRIu64 "-%" PRIu64, r->epoch, e->n);
  snprintf(ws, sizeof ws, "%u", e->worker);
  snprintf(is, sizeof is, "%" PRIu64, e->incarnation);
  snprintf(ss, sizeof ss, "%" PRIu64, e->seq);
  snprintf(ts, sizeof ts, "%" PRIu64,
           e->kind == PS_JOURNAL_TARGET ? (uint64_t)e->target : e->step);
  const char *argv[15] = {"XADD", r->k.log, "NOMKSTREAM", id, "k", ks, "w", ws, "i", is,
                          "s", ss, "t", ts, "v"};
  /* At most about 470 bytes besides the key (PS_KEY_MAX): never too long,
   * but a truncated head is refused rather than written past. */
  char head[XADD_HEAD_MAX];
  size_t hl = (size_t)snprintf(head, sizeof head, "*16\r\n");
  for (int i = 0; i < 15 && hl < sizeof head; i++)
    hl += (size_t)snprintf(head + hl, sizeof head - hl, "$%zu\r\n%s\r\n", strlen(argv[i]), argv[i]);
  if (hl < sizeof head)
    hl += (size_t)snprintf(head + hl, sizeof head - hl, "$%zu\r\n", raw);
  if (hl >= sizeof head) {
    free(q);
    r->ev.appended(r->ev.arg, e->n, "the XADD's head is too long");
    return;
  }
  memcpy(g - hl, head, hl);
  memcpy(g + raw, "\r\n", 2);
  redisAsyncContext *ac = ps_link_ac(&r->link);
  if (redisAsyncFormattedCommand(ac, on_appended, q, g - hl, hl + raw + 2) != REDIS_OK) {
    free(q);
    r->ev.appended(r->ev.arg, e->n, "hiredis refused the command");
    return;
  }
  ps_snaps_logged(&r->snaps, hl + raw + 2);
  if (ps_link_wait_replicas(&r->link) > 0 && ps_link_send_wait(&r->link, ac, on_waited, q) == 0)
    q->waiting = 1;
}

void ps_replica_flush(ps_replica *r) {
  if (!r->has_later)
    return;
  r->has_later = 0;
  append_now(r, &r->later);
}

void ps_replica_append(ps_replica *r, const ps_journal *e) {
  ps_replica_flush(r);
  append_now(r, e);
}

int ps_replica_append_later(ps_replica *r, const ps_journal *e) {
  ps_replica_flush(r);
  if (!ps_link_up(&r->link) || r->closing || e->g == NULL) {
    append_now(r, e);
    return 0;
  }
  r->later = *e;
  r->has_later = 1;
  return 1;
}

/* ------------------------------------------------- heartbeat, timers */

/* The heartbeat's payload (REDIS.md §8); with sparse tables, each one's
 * rows and memory here: "tables C1:ROWS:BYTES,C2:ROWS:BYTES,..." (a table
 * without a name by its number), which `paramserv status` shows. */
static void heartbeat(ps_replica *r) {
  enum { TABLE_TEXT = PS_SHARD_TABLE_NAME_MAX + 2 * 21 };
  char payload[320 + PS_SHARD_MAX_TABLES * TABLE_TEXT], host[128] = "?";
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  size_t w = (size_t)snprintf(payload, sizeof payload,
                              "pid %d host %s incarnation %" PRIu64 " step %" PRIu64
                              " version %" PRIu64 " lag %" PRIu64 " nondurable %" PRIu64
                              " held %" PRIu64,
                              (int)getpid(), host, r->epoch, ps_shard_global_step(r->shard),
                              ps_shard_version(r->shard), ps_replica_lag(r),
                              r->ev.nondurable(r->ev.arg), r->ev.held(r->ev.arg));
  for (int t = 0; t < ps_shard_ntables(r->shard) && w < sizeof payload; t++) {
    ps_table_stats st = ps_shard_table_stats(r->shard, t);
    const char *name = ps_shard_table_name(r->shard, t);
    char num[16];
    snprintf(num, sizeof num, "%d", t);
    w += (size_t)snprintf(payload + w, sizeof payload - w, "%s%s:%" PRIu64 ":%" PRIu64,
                          t == 0 ? " tables " : ",", name[0] ? name : num, st.rows, st.bytes);
  }
  ps_link_heartbeat(&r->link, payload);
}

static void watch_work(uv_work_t *w) {
  ps_replica *r = w->data;
  r->watch_ok = ps_registry_workers_alive(r->watch_reg, r->alive, r->cfg->nworkers) == 0;
}

static void after_watch(uv_work_t *w, int status) {
  ps_replica *r = w->data;
  r->watching = 0;
  if (r->closing) {
    maybe_finish_close(r);
    return;
  }
  if (status == 0 && r->watch_ok)
    r->alive_fn(r->alive_arg, r->alive, r->cfg->nworkers);
}

/* Which workers' heartbeat keys exist, read in the background. */
static void watch_workers(ps_replica *r) {
  if (r->watching)
    return;
  if (r->watch_reg == NULL && (r->watch_reg = ps_registry_new(r->cfg, "ps", r->index)) == NULL)
    return;
  r->watch.data = r;
  if (uv_queue_work(r->loop, &r->watch, watch_work, after_watch) == 0)
    r->watching = 1;
}

void ps_replica_watch_workers(ps_replica *r, ps_replica_alive_fn fn, void *arg) {
  r->alive_fn = fn;
  r->alive_arg = arg;
}

static void on_interval(uv_timer_t *t) {
  ps_replica *r = t->data;
  uint64_t now = ps_now_ns();
  ps_snaps_tick(&r->snaps);
  if (ps_link_up(&r->link) &&
      now - r->last_hb_ns >= (uint64_t)r->cfg->heartbeat_ms * 1000000ULL) {
    r->last_hb_ns = now;
    heartbeat(r);
    if (r->alive_fn != NULL)
      watch_workers(r);
  }
}

void ps_replica_updated(ps_replica *r) { ps_snaps_updated(&r->snaps); }

uint64_t ps_replica_lag(const ps_replica *r) { return ps_snaps_lag(&r->snaps); }

double ps_replica_lag_seconds(const ps_replica *r) { return ps_snaps_lag_seconds(&r->snaps); }

ps_replica *ps_replica_new(uv_loop_t *loop, const ps_config *cfg, int index,
                           const ps_restore_info *restored, uint64_t layout_hash, ps_shard *shard,
                           const ps_replica_events *ev) {
  ps_replica *r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  r->loop = loop;
  r->cfg = cfg;
  r->index = index;
  r->epoch = restored->epoch;
  r->shard = shard;
  r->ev = *ev;
  ps_shard_keys_init(&r->k, cfg->cluster_id, index);
  ps_shard_keys_log(&r->k, r->epoch);
  if (restored->lazy && (r->rowload = ps_rowload_new(&r->link, shard, on_rows_failed, r)) == NULL) {
    free(r);
    return NULL;
  }
  /* What the restore loaded is a snapshot Redis holds: CLAIM and the
   * heartbeat check that it is still there. */
  ps_link_events le = {.arg = r, .up = on_link_up, .down = on_link_down,
                       .fenced = on_link_fenced, .released = on_link_released};
  ps_link_init(&r->link, loop, cfg, index, r->epoch, &r->k, restored->loaded, &le);
  ps_snap_events se = {.arg = r, .before_copy = on_snap_before_copy,
                       .switched = on_snap_switched, .closed = on_snap_closed,
                       .owed = snap_owed, .nondurable = snap_nondurable, .held = snap_held,
                       .drained = snap_drained};
  ps_snaps_init(&r->snaps, &r->link, shard, layout_hash, restored, &se);
  uv_timer_init(loop, &r->interval);
  r->interval.data = r;
  r->interval_open = 1;
  uv_timer_start(&r->interval, on_interval, (uint64_t)cfg->replicate_interval_ms,
                 (uint64_t)cfg->replicate_interval_ms);
  ps_link_connect(&r->link);
  return r;
}

void ps_replica_close(ps_replica *r, void (*done)(void *arg), void *arg) {
  ps_replica_flush(r);
  r->closing = 1;
  r->close_done = done;
  r->close_arg = arg;
  ps_link_close(&r->link);
  uv_close((uv_handle_t *)&r->interval, on_interval_closed);
  /* The last snapshot, then the disconnect: the link's down, or the
   * snapshots' closed, finishes the close. */
  ps_snaps_close(&r->snaps);
}
