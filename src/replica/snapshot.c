/* A shard's snapshots in Redis (see snapshot.h, REDIS.md §6). */
#include "replica/snapshot.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "replica/rows.h"

struct ps_snap_job {
  ps_shard_reader *rd;    /* the state image as it was at the cut, read chunk by chunk */
  float *chunk;           /* the chunk being sent (hiredis copies it into its buffer) */
  ps_state_info info;
  uint64_t journal, nondurable;
  uint64_t log_at_cut;    /* the snaps' log_unswitched at the cut: what a switch covers */
  uint64_t taken_ns;      /* when the state was copied */
  uint64_t nchunks;
  char id[48];
  uint64_t next;          /* the next chunk to SET */
  uint64_t pending;       /* chunk SETs issued and not yet answered */
  int failed;
  char why[240];          /* why it failed, from Redis's reply ("" unknown) */
  /* Format 5 with sparse tables: the image's tables are empty, their
   * changes go as delta chunks (rows.h), merged after the switch. */
  int rows;
  ps_tsec_table shapes[PS_SHARD_MAX_TABLES];
  ps_delta delta;         /* the delta chunk being sent */
  uint64_t ndeltas, delta_max;  /* made so far; at most (registered) */
  uint32_t **groups;      /* each delta chunk's groups' buckets (delta_max of room) */
  size_t *ngroups;
  uint32_t next_replace;  /* a cut of all: buckets whose replace group is still to come */
  int changes_done;       /* the cut's changes all read */
  int deltas_done;        /* every delta chunk sent */
  int carried;            /* a record that did not fit the last chunk: the next one's first */
  uint32_t carry_bucket, carry_table, carry_vlen;
  uint64_t carry_key;
  uint8_t *carry;
  uint64_t rank_base, rank_next;
  char rows_text[PS_SHARD_MAX_TABLES * 88];  /* the meta's `rows` (REDIS.md §2) */
};

/* Point the meta hash at a new snapshot and trim the log it covers, if the
 * epoch still holds.  An epoch absent or smaller is Redis's loss (LOST: the
 * shard reconnects and claims it back, REDIS.md §5), a larger one a newer
 * incarnation (FENCED).  KEYS: epoch, meta, log.  ARGV: epoch, trim MINID,
 * then the meta hash's field/value pairs. */
static const char SWITCH_SCRIPT[] =
    "local e = redis.call('GET', KEYS[1])\n"
    "if e ~= ARGV[1] then\n"
    "  if e == false or tonumber(e) < tonumber(ARGV[1]) then\n"
    "    return redis.error_reply('LOST epoch') end\n"
    "  return redis.error_reply('FENCED epoch is ' .. e) end\n"
    "redis.call('DEL', KEYS[2])\n"
    "redis.call('HSET', KEYS[2], unpack(ARGV, 3))\n"
    "redis.call('XTRIM', KEYS[3], 'MINID', ARGV[2])\n"
    "return 'OK'\n";

void ps_snaps_init(ps_snaps *s, ps_link *l, ps_shard *shard, uint64_t layout_hash,
                   const ps_restore_info *restored, const ps_snap_events *ev) {
  *s = (ps_snaps){.link = l, .shard = shard, .layout_hash = layout_hash, .ev = *ev,
                  .version = restored->loaded ? restored->snap_version : 0,
                  .rank_next = restored->rank_next, .started_ns = ps_now_ns(),
                  /* the first snapshot records this incarnation's start */
                  .need_full = 1};
  ps_backoff_init(&s->backoff, (unsigned)l->cfg->replicate_interval_ms, PS_LINK_BACKOFF_CAP_MS,
                  0);
}

int ps_snaps_busy(const ps_snaps *s) { return s->job != NULL || s->mg.running; }

static void merges_drop(ps_snaps *s) {
  for (uint64_t i = 0; i < s->mg.made; i++)
    free(s->mg.groups[i]);
  free(s->mg.groups);
  free(s->mg.ngroups);
  s->mg = (struct ps_snap_merges){0};
}

void ps_snaps_owe(ps_snaps *s) { s->need_full = 1; }

void ps_snaps_connected(ps_snaps *s, int claimed) {
  if (claimed) {
    /* Redis lost what it held of the shard: its rows too. */
    s->version = 0;
    s->need_all = 1;
    merges_drop(s);
  }
  s->next_ns = 0;  /* a new connection: try at once */
  ps_snaps_start(s);
}

/* In `log` mode a snapshot only compacts: every acknowledged update is in
 * the log already.  Its cost is a read of the whole state and the state's
 * bytes sent, so it waits until the log holds [replication] log_ratio (1)
 * times as many bytes as the image (then it costs no more than the log
 * did, and a restore replays at most that many images' worth of entries);
 * a small dense state passes at once, a large table waits many intervals.
 * An idle shard (no update since the previous tick) snapshots at once: the
 * time is free.  In `snapshot` mode the snapshots are the durability, on
 * the interval and every_updates. */
static int compaction_due(const ps_snaps *s) {
  if (s->link->cfg->replication != PS_REPLICATION_LOG)
    return 1;
  ps_state_info in = ps_shard_state_info(s->shard);
  double ratio = s->link->cfg->replicate_log_ratio, log = (double)s->log_bytes;
  if (ps_shard_ntables(s->shard) == 0 || s->link->cfg->sparse_rows != PS_SPARSE_ROWS_KEYED)
    return log >= (double)in.image_floats * sizeof(float) * ratio;
  /* With sparse tables a snapshot writes the image without their rows,
   * and the rows changed since the last one (all of them after a loss).
   * When most pushes bring rows not changed since (ids mostly distinct),
   * those grow faster than the log, which then never reaches them: so a
   * snapshot is also due once the log and the changes it would write
   * reach [replication] log_budget (an eighth) of the rows, which bounds
   * what Redis holds beside the rows to that; and once the log holds
   * [replication] log_max_mb, which bounds a restart's replay (every row
   * the log touches is fetched before it is replayed) whatever the size
   * of the tables: a snapshot then costs the rows the log changed, about
   * what it costs later, unless the dense part's image is the larger. */
  double rows = (double)in.table_floats * sizeof(float);
  double changes = s->need_all ? rows : (double)ps_shard_changes_bytes(s->shard);
  double head = (double)(in.image_floats - in.table_floats) * sizeof(float);
  double budget = s->link->cfg->replicate_log_budget;
  double max = (double)s->link->cfg->replicate_log_max_mb * 1048576.0;
  return log >= (head + changes) * ratio ||
         (!s->need_all && budget > 0 && log + changes >= rows * budget) ||
         (!s->need_all && max > 0 && log >= max && log >= head * ratio);
}

void ps_snaps_tick(ps_snaps *s) {
  int idle = s->updates == s->ticked;
  s->ticked = s->updates;
  if (s->need_full || s->ev.owed(s->ev.arg) || (s->updates > 0 && (idle || compaction_due(s))))
    ps_snaps_start(s);
}

void ps_snaps_updated(ps_snaps *s) {
  if (++s->updates >= (uint64_t)s->link->cfg->replicate_every_updates && compaction_due(s))
    ps_snaps_start(s);
}

void ps_snaps_logged(ps_snaps *s, uint64_t bytes) {
  s->log_bytes += bytes;
  s->log_unswitched += bytes;
}

uint64_t ps_snaps_backlog(const ps_snaps *s) {
  uint64_t unmerged = s->mg.count > s->mg.next ? s->mg.count - s->mg.next : 0;
  return s->log_unswitched + unmerged * PS_DELTA_BYTES;
}

static void drained(ps_snaps *s) {
  if (s->ev.drained != NULL)
    s->ev.drained(s->ev.arg);
}

/* The job switched: it covers every entry up to its cut. */
static void switched(ps_snaps *s, ps_snap_job *j) {
  s->log_unswitched -= j->log_at_cut < s->log_unswitched ? j->log_at_cut : s->log_unswitched;
  s->ev.switched(s->ev.arg, j->journal);
}

uint64_t ps_snaps_lag(const ps_snaps *s) { return ps_shard_version(s->shard) - s->version; }

double ps_snaps_lag_seconds(const ps_snaps *s) {
  if (ps_snaps_lag(s) == 0)
    return 0;
  /* With no snapshot of this run yet, the lag began when the process did
   * (the restored snapshot's own age is not known here). */
  uint64_t since = s->taken_ns != 0 ? s->taken_ns : s->started_ns;
  return (double)(ps_now_ns() - since) * 1e-9;
}

static void job_free(ps_snap_job *j) {
  if (j == NULL)
    return;
  ps_shard_reader_end(j->rd);
  free(j->chunk);
  ps_delta_free(&j->delta);
  if (j->groups != NULL)
    for (uint64_t i = 0; i < j->ndeltas; i++)
      free(j->groups[i]);
  free(j->groups);
  free(j->ngroups);
  free(j->carry);
  free(j);
}

/* Closing: write one last snapshot if the newest is older than the shard
 * (or one is owed), then disconnect; the link's down (or ev.closed, with no
 * connection) finishes the close, possibly before this returns, so s must
 * not be touched after. */
static void close_step(ps_snaps *s) {
  ps_link *l = s->link;
  if (s->mg.running)
    return;  /* the merges' end comes back here */
  if (ps_link_ac(l) != NULL && ps_link_up(l) && !s->final_started &&
      (s->version != ps_shard_version(s->shard) || s->ev.owed(s->ev.arg))) {
    s->final_started = 1;
    ps_snaps_start(s);
    if (s->job != NULL)
      return;
  }
  if (ps_link_ac(l) != NULL) {
    ps_link_disconnect(l);
    return;
  }
  s->ev.closed(s->ev.arg);
}

void ps_snaps_close(ps_snaps *s) {
  s->closing = 1;
  /* A snapshot in flight is finished first (its callbacks abandon it and
   * come here), and a clean stop loses nothing even in `snapshot` mode. */
  if (s->job == NULL)
    close_step(s);
}

static void merges_send(ps_snaps *s);

static void snapshot_done(ps_snaps *s, int ok) {
  ps_snap_job *j = s->job;
  if (!ok && j->rows && ps_shard_reader_undo(j->rd) != 0)
    s->need_all = 1;  /* a table's changes are lost: its next cut is of all (the shard's own) */
  if (ok && j->rows) {
    /* Its delta chunks, merged into the rows from now on. */
    merges_drop(s);
    snprintf(s->mg.id, sizeof s->mg.id, "%s", j->id);
    s->mg.count = s->mg.made = j->ndeltas;
    s->mg.groups = j->groups;
    s->mg.ngroups = j->ngroups;
    j->groups = NULL;
    j->ngroups = NULL;
    s->need_all = 0;
  }
  if (!ok) {
    /* Retried at a later tick, backing off while Redis keeps refusing: a
     * read of a large state every interval would be work thrown away. */
    s->need_full = 1;
    s->next_ns = ps_now_ns() + ps_backoff_next(&s->backoff) * 1000000ULL;
  } else {
    ps_backoff_reset(&s->backoff);
    s->next_ns = 0;
    if (s->said_ns != 0)
      ps_log(PS_LOG_INFO, "redis: snapshot written again (%" PRIu64 " more had failed since the "
             "last report)", s->failures);
    s->said_ns = 0;
    s->failures = 0;
  }
  job_free(s->job);
  s->job = NULL;
  if (ok && s->mg.next < s->mg.count)
    merges_send(s);
  if (ok && !s->closing)
    drained(s);  /* the log it covers is off the backlog, its chunks on */
  /* A switch's GC issues its DELs from the listing's reply, and hiredis
   * takes no command once a disconnect is asked: the clean stop waits
   * for the listing (on_snaps_listed) before disconnecting. */
  if (s->closing && !s->gc_pending)
    close_step(s);
}

#define SNAP_SAY_NS (30 * 1000000000ULL)

/* A snapshot Redis would not take: said at once with Redis's reason, again
 * once acknowledgements are held for it, then at most every 30 s with the
 * count of failures since, until one is written (said too). */
static void snapshot_failed(ps_snaps *s, const char *why) {
  uint64_t now = ps_now_ns();
  uint64_t held = s->ev.held(s->ev.arg);
  s->failures++;
  if (s->said_ns == 0 || now - s->said_ns >= SNAP_SAY_NS || (held > 0 && !s->said_held)) {
    char held_text[96] = "";
    if (held > 0)
      snprintf(held_text, sizeof held_text,
               "; %" PRIu64 " acknowledgements held until one is written", held);
    ps_log(PS_LOG_WARN, "redis: snapshot not written: %s%s (%" PRIu64 " failed since the last "
           "report; retrying with backoff)", why, held_text, s->failures);
    s->said_ns = now;
    s->said_held = held > 0;
    s->failures = 0;
  }
  snapshot_done(s, 0);
}

/* Delete the chunks and registrations of every snapshot but `keep`: those
 * replaced, and those a killed incarnation left half written. */
typedef struct gc_req {
  ps_snaps *s;
  char keep[48];
} gc_req;

static void on_snaps_listed(redisAsyncContext *ac, void *reply, void *priv) {
  gc_req *g = priv;
  ps_snaps *s = g->s;
  redisReply *h = reply;
  if (h != NULL && h->type == REDIS_REPLY_ARRAY && ps_link_ac(s->link) == ac &&
      ps_link_up(s->link)) {
    for (size_t i = 0; i + 1 < h->elements; i += 2) {
      const char *id = h->element[i]->str;
      if (id == NULL || strcmp(id, g->keep) == 0)
        continue;
      uint64_t chunks, deltas;
      ps_snap_registered(h->element[i + 1]->str, &chunks, &deltas);
      for (uint64_t c = 0; c < chunks; c++)
        redisAsyncCommand(ac, NULL, NULL, "DEL %s%s:%" PRIu64, s->link->k->snap_prefix, id, c);
      for (uint64_t c = 0; c < deltas; c++)
        redisAsyncCommand(ac, NULL, NULL, "DEL %s%s:d%" PRIu64, s->link->k->snap_prefix, id, c);
      redisAsyncCommand(ac, NULL, NULL, "HDEL %s %s", s->link->k->snaps, id);
    }
  }
  free(g);
  s->gc_pending = 0;
  /* Without a reply the connection is going: the link's down closes. */
  if (h != NULL && s->closing && s->job == NULL)
    close_step(s);
}

/* The WAIT after a switch: only a snapshot the replicas hold covers the
 * entries it replaced (a failover must not lose them with it). */
static void on_switch_waited(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_snaps *s = priv;
  char why[200];
  const char *failure = ps_link_wait_failure(s->link, reply, why, sizeof why);
  if (failure == NULL) {
    switched(s, s->job);
    snapshot_done(s, 1);
    return;
  }
  char msg[300];
  snprintf(msg, sizeof msg, "switched on the primary, but %s", failure);
  snapshot_failed(s, msg);
}

static void on_switched(redisAsyncContext *ac, void *reply, void *priv) {
  ps_snaps *s = priv;
  ps_link *l = s->link;
  redisReply *rep = reply;
  ps_snap_job *j = s->job;
  int wait_replicas = ps_link_wait_replicas(l);
  if (rep != NULL && rep->type != REDIS_REPLY_ERROR) {
    s->version = j->info.version;
    l->meta_expected = 1;
    s->taken_ns = j->taken_ns;
    gc_req *g = ac != NULL && ps_link_up(l) ? malloc(sizeof *g) : NULL;
    if (g != NULL) {
      g->s = s;
      snprintf(g->keep, sizeof g->keep, "%s", j->id);
      if (redisAsyncCommand(ac, on_snaps_listed, g, "HGETALL %s", s->link->k->snaps) != REDIS_OK)
        free(g);
      else
        s->gc_pending = 1;
    }
    if (wait_replicas > 0 && ac != NULL && ps_link_send_wait(l, ac, on_switch_waited, s) == 0)
      return;
    if (wait_replicas > 0) {
      snapshot_done(s, 0);
      return;
    }
    switched(s, j);
    snapshot_done(s, 1);
    return;
  }
  if (ps_link_is_fenced(rep)) {
    ps_link_fence(l, rep->str);
  } else if (ps_link_check_lost(l, rep)) {
    /* The reconnection claims the keys back and writes a full snapshot. */
  } else if (rep != NULL) {
    char msg[300];
    snprintf(msg, sizeof msg, "the switch failed: %s", rep->str);
    ps_link_check_role(l, rep);
    snapshot_failed(s, msg);
    return;
  }
  ps_link_check_role(l, rep);
  snapshot_done(s, 0);
}

static void send_switch(ps_snaps *s) {
  ps_snap_job *j = s->job;
  const ps_shard_opts *o = ps_shard_options(s->shard);
  const ps_shard_keys *k = s->link->k;
  const char *epoch_text = s->link->epoch_text;
  char trim[48], f[12][24], st[PS_STATE_NFIELDS][24];
  snprintf(trim, sizeof trim, "%" PRIu64 "-%" PRIu64, s->link->epoch, j->journal + 1);
  snprintf(f[0], 24, "%" PRIu64, j->journal);
  snprintf(f[1], 24, "%zu", o->nfloats);
  snprintf(f[2], 24, "%" PRIu64, j->nchunks);
  snprintf(f[3], 24, "%016" PRIx64, s->layout_hash);
  snprintf(f[4], 24, "%lld", (long long)time(NULL));
  snprintf(f[5], 24, "%d", o->consistency);
  snprintf(f[6], 24, "%" PRIu64, j->nondurable);
  snprintf(f[7], 24, "%" PRIu64, j->ndeltas);
  snprintf(f[8], 24, "%d", PS_ROWS_BITS);
  snprintf(f[9], 24, "%" PRIu64, j->rank_next);
  const char *argv[8 + 2 * PS_STATE_NFIELDS + 34] = {
      "EVAL", SWITCH_SCRIPT, "3", k->epoch, k->meta, k->log, epoch_text, trim};
  int argc = 8;
  /* The state's fixed fields under their own names (state.h), then the snapshot's. */
  for (int i = 0; i < PS_STATE_NFIELDS; i++) {
    snprintf(st[i], 24, "%" PRIu64, ps_state_get(&j->info, &ps_state_fields[i]));
    argv[argc++] = ps_state_fields[i].name;
    argv[argc++] = st[i];
  }
  const char *rest[] = {"snap", j->id, "journal", f[0], "nfloats", f[1], "chunks", f[2],
                        "layout", f[3], "epoch", epoch_text, "time", f[4],
                        "format", PS_SNAP_FORMAT, "optimizer", ps_optim_name(&o->optim),
                        "consistency", f[5], "nondurable", f[6], "deltas", f[7],
                        "merged", "0", "row_bits", f[8], "rank_next", f[9],
                        "rows", j->rows_text, "keyed", j->rows ? "1" : "0"};
  _Static_assert(sizeof rest / sizeof rest[0] <= 34, "argv has room for rest");
  for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
    argv[argc++] = rest[i];
  if (redisAsyncCommandArgv(ps_link_ac(s->link), on_switched, s, argc, argv, NULL) != REDIS_OK)
    snapshot_done(s, 0);
}

/* At most this many chunk SETs in flight: hiredis's output buffer (a log
 * entry waits behind it) stays a few MiB, not the whole state. */
#define SET_WINDOW 2

static void on_chunk_set(redisAsyncContext *ac, void *reply, void *priv);

/* The next delta chunk from the cut's changes into j->delta (empty: no
 * more): a cut of all first deletes every bucket's hash (replace groups),
 * then each change is a record, removals as removals, entries as their
 * values ranked from the cut's base.  A record that does not fit is kept
 * (its bytes: the table may change before the next chunk) and opens the
 * next.  @return 0, or -ENOMEM (the cut cannot go on). */
static int make_delta(ps_snap_job *j) {
  ps_delta *d = &j->delta;
  ps_delta_clear(d);
  if (ps_shard_reader_all(j->rd))
    for (; j->next_replace < (1u << PS_ROWS_BITS); j->next_replace++) {
      int rc = ps_delta_replace(d, j->next_replace);
      if (rc == -ENOSPC)
        return 0;
      if (rc != 0)
        return rc;
    }
  if (j->carried) {
    uint8_t *p = ps_delta_add(d, j->carry_bucket, j->carry_table, j->carry_key, j->carry_vlen);
    if (p == NULL)
      return -ENOMEM;
    if (j->carry_vlen != PS_DELTA_REMOVE)
      memcpy(p, j->carry, j->carry_vlen);
    j->carried = 0;
  }
  while (!j->changes_done) {
    ps_shard_change c;
    int rc = ps_shard_reader_change(j->rd, &c);
    if (rc < 0)
      return rc;
    if (rc == 0) {
      j->changes_done = 1;
      break;
    }
    const ps_tsec_table *tb = &j->shapes[c.table];
    uint32_t vlen = c.removed ? PS_DELTA_REMOVE : ps_rows_value_bytes(tb, c.e.pending);
    uint64_t rank = j->rank_base + c.place;
    if (!ps_delta_fits(d, c.bucket, vlen)) {
      j->carried = 1;
      j->carry_bucket = c.bucket;
      j->carry_table = (uint32_t)c.table;
      j->carry_key = c.e.key;
      j->carry_vlen = vlen;
      if (!c.removed)
        ps_rows_value_put(j->carry, tb, &c.e, rank);
      break;
    }
    uint8_t *p = ps_delta_add(d, c.bucket, (uint32_t)c.table, c.e.key, vlen);
    if (p == NULL)
      return -ENOMEM;
    if (!c.removed)
      ps_rows_value_put(p, tb, &c.e, rank);
  }
  return 0;
}

/* Issue the next delta chunk's SET.  @return 1 issued, 0 none left, -1 as
 * send_chunks. */
static int send_delta(ps_snaps *s) {
  ps_snap_job *j = s->job;
  if (make_delta(j) != 0) {
    snprintf(j->why, sizeof j->why, "out of memory for the rows that changed while it was "
             "written");
    return -1;
  }
  if (j->delta.len == 0)
    return 0;
  if (j->ndeltas == j->delta_max) {
    snprintf(j->why, sizeof j->why, "more delta chunks than the %" PRIu64 " registered",
             j->delta_max);
    return -1;
  }
  uint32_t *g = malloc((j->delta.ngroups ? j->delta.ngroups : 1) * sizeof *g);
  if (g == NULL) {
    snprintf(j->why, sizeof j->why, "out of memory for a delta chunk's buckets");
    return -1;
  }
  memcpy(g, j->delta.groups, j->delta.ngroups * sizeof *g);
  j->groups[j->ndeltas] = g;
  j->ngroups[j->ndeltas] = j->delta.ngroups;
  char key[PS_KEY_MAX + 80];
  snprintf(key, sizeof key, "%s%s:d%" PRIu64, s->link->k->snap_prefix, j->id, j->ndeltas);
  j->ndeltas++;
  const char *argv[3] = {"SET", key, (const char *)j->delta.buf};
  size_t argl[3] = {3, strlen(key), j->delta.len};
  if (redisAsyncCommandArgv(ps_link_ac(s->link), on_chunk_set, s, 3, argv, argl) != REDIS_OK)
    return -1;
  j->pending++;
  return 1;
}

/* Issue chunk SETs up to the window: the image's, then the delta chunks.
 * @return 0, or -1 when hiredis took none (the connection is going) or
 * the state could not be read (j->why). */
static int send_chunks(ps_snaps *s) {
  ps_snap_job *j = s->job;
  while (j->pending < SET_WINDOW) {
    if (j->next == j->nchunks) {
      if (!j->rows || j->deltas_done)
        break;
      int rc = send_delta(s);
      if (rc < 0)
        return -1;
      if (rc == 0)
        j->deltas_done = 1;
      continue;
    }
    uint64_t i = j->next;
    char key[PS_KEY_MAX + 80];
    snprintf(key, sizeof key, "%s%s:%" PRIu64, s->link->k->snap_prefix, j->id, i);
    uint64_t floats = ps_snap_chunk_floats(j->info.image_floats, i);
    /* The chunks are read in order, each once: a chunk is made when it
     * is sent. */
    int rc = ps_shard_reader_read(j->rd, j->chunk, floats);
    if (rc != 0) {
      snprintf(j->why, sizeof j->why, "out of memory for the rows that changed while it was "
               "written");
      return -1;
    }
    const char *argv[3] = {"SET", key, (const char *)j->chunk};
    size_t argl[3] = {3, strlen(key), (size_t)floats * sizeof(float)};
    if (redisAsyncCommandArgv(ps_link_ac(s->link), on_chunk_set, s, 3, argv, argl) != REDIS_OK)
      return -1;
    j->next++;
    j->pending++;
  }
  return 0;
}

/* The connection the job's commands went on is no longer the one to use,
 * or the job was abandoned to a close. */
static int job_cut_off(const ps_snaps *s, const redisAsyncContext *ac) {
  return ac == NULL || !ps_link_up(s->link) || (s->closing && !s->final_started);
}

static void on_chunk_set(redisAsyncContext *ac, void *reply, void *priv) {
  ps_snaps *s = priv;
  redisReply *rep = reply;
  ps_snap_job *j = s->job;
  j->pending--;
  if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
    if (!j->failed && rep != NULL)
      snprintf(j->why, sizeof j->why, "a chunk was not stored: %s", rep->str);
    j->failed = 1;
    ps_link_check_role(s->link, rep);
  }
  if (!j->failed && (ps_link_ac(s->link) == NULL || job_cut_off(s, ac)))
    j->failed = 1;
  if (!j->failed && send_chunks(s) != 0)
    j->failed = 1;
  if (j->pending > 0)
    return;
  if (j->failed) {
    if (j->why[0])
      snapshot_failed(s, j->why);
    else
      snapshot_done(s, 0);
    return;
  }
  /* Every chunk is stored: switch the meta hash to them, atomically. */
  send_switch(s);
}

/* The snapshot is registered: a crash from now on leaves chunks that the
 * next start-up or switch finds and deletes.  Store them.  (Registering
 * first also means a Redis that refuses writes costs a cut and one
 * command, not the whole state sent.) */
static void on_registered(redisAsyncContext *ac, void *reply, void *priv) {
  ps_snaps *s = priv;
  redisReply *rep = reply;
  ps_snap_job *j = s->job;
  if (rep == NULL || rep->type == REDIS_REPLY_ERROR || job_cut_off(s, ac)) {
    if (rep != NULL && rep->type == REDIS_REPLY_ERROR) {
      char msg[300];
      snprintf(msg, sizeof msg, "not registered: %s", rep->str);
      ps_link_check_role(s->link, rep);
      snapshot_failed(s, msg);
    } else {
      snapshot_done(s, 0);
    }
    return;
  }
  if (j->nchunks == 0 && !j->rows) {
    send_switch(s);
    return;
  }
  if (send_chunks(s) != 0) {
    /* hiredis took no more (the connection is going), or the state could
     * not be read.  With none in flight, nothing else will end the job. */
    if (j->pending == 0) {
      if (j->why[0])
        snapshot_failed(s, j->why);
      else
        snapshot_done(s, 0);
      return;
    }
    j->failed = 1;
  }
}

/* A cut with sparse tables: the tables' shapes, the room for its delta
 * chunks, its ranks (from the base, past every rank the rows hold), the
 * bound on its chunks that its registration names, and the meta's
 * `rows`.  @return 0 or -ENOMEM. */
static int rows_prepare(ps_snaps *s, ps_snap_job *j) {
  const ps_shard_opts *o = ps_shard_options(s->shard);
  uint64_t total = ps_shard_reader_all(j->rd) ? (uint64_t)PS_DELTA_GROUP << PS_ROWS_BITS : 0;
  uint64_t rec_max = 0, span = 0;
  size_t at = 0;
  ps_rows_shapes(o, j->shapes);
  for (int t = 0; t < o->ntables; t++) {
    const ps_tsec_table *tb = &j->shapes[t];
    ps_shard_cut_counts c = ps_shard_reader_table_counts(j->rd, t);
    uint64_t row = PS_DELTA_GROUP + PS_DELTA_RECORD + ps_rows_value_bytes(tb, 0);
    uint64_t pend = PS_DELTA_GROUP + PS_DELTA_RECORD + ps_rows_value_bytes(tb, 1);
    total += c.changed_rows * row + c.changed_pending * pend +
             c.removed * (PS_DELTA_GROUP + PS_DELTA_RECORD);
    rec_max = row > rec_max ? row : rec_max;
    uint64_t most = c.changed_rows > c.changed_pending ? c.changed_rows : c.changed_pending;
    span = most > span ? most : span;
    at += (size_t)snprintf(j->rows_text + at, sizeof j->rows_text - at,
                           "%s%" PRIu64 ":%" PRIu64 ":%" PRIu64 ":%" PRIu64, t > 0 ? "," : "",
                           c.rows, c.pending, c.rows_newest, c.pending_newest);
  }
  /* Every chunk but the last is fuller than PS_DELTA_BYTES less one record. */
  j->delta_max = total / (PS_DELTA_BYTES - rec_max) + 1;
  j->rank_base = s->rank_next;
  j->rank_next = s->rank_next = s->rank_next + span;
  j->groups = calloc(j->delta_max, sizeof *j->groups);
  j->ngroups = calloc(j->delta_max, sizeof *j->ngroups);
  j->carry = malloc(rec_max);
  if (j->groups == NULL || j->ngroups == NULL || j->carry == NULL || ps_delta_init(&j->delta))
    return -ENOMEM;
  return 0;
}

/* A job that could not start (no memory): its cut's changes go to the
 * next one. */
static void job_abandon(ps_snaps *s, ps_snap_job *j) {
  if (j->rd != NULL && ps_shard_reader_undo(j->rd) != 0)
    s->need_all = 1;
  job_free(j);
}

/* ------------------------------------------------------------ merges */

/* Merges in flight at most: each holds a chunk's worth of Redis's time. */
#define MERGE_WINDOW 2

static void on_merged(redisAsyncContext *ac, void *reply, void *priv);

/* Issue the switched snapshot's remaining merges (REDIS.md §6 step 6), in
 * order, a few at a time.  A merge of a chunk already merged (by this
 * incarnation before a reconnection, or by a restore) does nothing. */
static void merges_send(ps_snaps *s) {
  struct ps_snap_merges *m = &s->mg;
  redisAsyncContext *ac = ps_link_ac(s->link);
  if (ac == NULL || !ps_link_up(s->link))
    return;
  if (m->running == 0)
    m->sent = m->next;
  while (m->sent < m->count && m->running < MERGE_WINDOW) {
    ps_rows_merge mg;
    if (ps_rows_merge_make(&mg, s->link->k, m->id, m->sent, m->groups[m->sent],
                           m->ngroups[m->sent]) != 0)
      return;  /* retried at the next snapshot's start */
    int rc = redisAsyncCommandArgv(ac, on_merged, s, mg.argc, mg.argv, NULL);
    ps_rows_merge_free(&mg);
    if (rc != REDIS_OK)
      return;
    m->sent++;
    m->running++;
  }
}

static void on_merged(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_snaps *s = priv;
  struct ps_snap_merges *m = &s->mg;
  redisReply *rep = reply;
  m->running--;
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR) {
    /* Redis lost a chunk, or refuses: the rows no longer follow the
     * meta's snapshot.  The next one writes every row, replacing them. */
    if (m->count > 0)
      ps_log(PS_LOG_WARN, "redis: the merge of snapshot %s's delta chunk %" PRIu64 " failed: "
             "%s; the next snapshot writes every row", m->id, m->next, rep->str);
    ps_link_check_role(s->link, rep);
    s->need_all = 1;
    s->need_full = 1;
    m->count = m->next;  /* no more are sent */
  } else if (rep != NULL) {
    m->next++;
    if (!s->closing)
      drained(s);
  } else {
    m->count = m->count > m->next ? m->count : m->next;
    m->sent = m->next;   /* the connection is gone: the next start sends from here */
  }
  if (rep != NULL && m->running == 0 && m->next < m->count)
    merges_send(s);
  if (m->running > 0)
    return;
  if (m->next >= m->count)
    merges_drop(s);
  if (s->closing && s->job == NULL && !s->gc_pending)
    close_step(s);
}

void ps_snaps_start(ps_snaps *s) {
  if (s->job != NULL || !ps_link_up(s->link) || (s->closing && !s->final_started))
    return;
  if (!s->final_started && ps_now_ns() < s->next_ns)
    return;
  /* The rows follow the previous snapshot once its merges are done: only
   * then may the next cut's changes go on top of them. */
  if (s->mg.running > 0)
    return;
  if (s->mg.next < s->mg.count && !s->need_all) {
    merges_send(s);
    return;
  }
  merges_drop(s);
  /* The image covers every entry so far: each goes out before its chunks. */
  s->ev.before_copy(s->ev.arg);
  ps_shard *sh = s->shard;
  ps_snap_job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return;
  j->taken_ns = ps_now_ns();
  /* The reader is the consistent cut: everything below happens off it,
   * the chunks read from it as they are sent, while the shard goes on. */
  j->rows = ps_shard_ntables(sh) > 0 && s->link->cfg->sparse_rows == PS_SPARSE_ROWS_KEYED;
  j->rd = j->rows ? ps_shard_reader_begin_changes(sh, &j->info, s->need_all, PS_ROWS_BITS)
                  : ps_shard_reader_begin(sh, &j->info);
  j->chunk = malloc(PS_SNAP_CHUNK_FLOATS * sizeof(float));
  if (j->rd == NULL || j->chunk == NULL) {
    job_abandon(s, j);
    return;
  }
  j->nchunks = ps_snap_chunks(j->info.image_floats);
  j->journal = ps_shard_journal(sh);
  j->nondurable = s->ev.nondurable(s->ev.arg);
  if (j->rows && rows_prepare(s, j) != 0) {
    job_abandon(s, j);
    return;
  }
  snprintf(j->id, sizeof j->id, "%" PRIu64 ".%" PRIu64, s->link->epoch, ++s->counter);
  s->job = j;
  s->updates = 0;
  s->ticked = 0;
  s->log_bytes = 0;
  j->log_at_cut = s->log_unswitched;
  s->need_full = 0;
  char chunks[48];
  snprintf(chunks, sizeof chunks, "%" PRIu64 " %" PRIu64, j->nchunks, j->delta_max);
  if (redisAsyncCommand(ps_link_ac(s->link), on_registered, s, "HSET %s %s %s",
                        s->link->k->snaps, j->id, chunks) != REDIS_OK)
    snapshot_done(s, 0);
}
