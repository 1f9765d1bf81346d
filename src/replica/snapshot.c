/* A shard's snapshots in Redis (see snapshot.h, REDIS.md §6). */
#include "replica/snapshot.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/timeutil.h"

struct ps_snap_job {
  ps_shard_reader *rd;    /* the state image as it was at the cut, read chunk by chunk */
  float *chunk;           /* the chunk being sent (hiredis copies it into its buffer) */
  ps_state_info info;
  uint64_t journal, nondurable;
  uint64_t taken_ns;      /* when the state was copied */
  uint64_t nchunks;
  char id[48];
  uint64_t next;          /* the next chunk to SET */
  uint64_t pending;       /* chunk SETs issued and not yet answered */
  int failed;
  char why[240];          /* why it failed, from Redis's reply ("" unknown) */
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
                   uint64_t restored_version, const ps_snap_events *ev) {
  *s = (ps_snaps){.link = l, .shard = shard, .layout_hash = layout_hash, .ev = *ev,
                  .version = restored_version, .started_ns = ps_now_ns(),
                  /* the first snapshot records this incarnation's start */
                  .need_full = 1};
  ps_backoff_init(&s->backoff, (unsigned)l->cfg->replicate_interval_ms, PS_LINK_BACKOFF_CAP_MS,
                  0);
}

int ps_snaps_busy(const ps_snaps *s) { return s->job != NULL; }

void ps_snaps_owe(ps_snaps *s) { s->need_full = 1; }

void ps_snaps_connected(ps_snaps *s, int claimed) {
  if (claimed)
    s->version = 0;
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
  return (double)s->log_bytes >=
         (double)in.image_floats * sizeof(float) * s->link->cfg->replicate_log_ratio;
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

void ps_snaps_logged(ps_snaps *s, uint64_t bytes) { s->log_bytes += bytes; }

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
  free(j);
}

/* Closing: write one last snapshot if the newest is older than the shard
 * (or one is owed), then disconnect; the link's down (or ev.closed, with no
 * connection) finishes the close, possibly before this returns, so s must
 * not be touched after. */
static void close_step(ps_snaps *s) {
  ps_link *l = s->link;
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

static void snapshot_done(ps_snaps *s, int ok) {
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
      uint64_t chunks = strtoull(h->element[i + 1]->str ? h->element[i + 1]->str : "0", NULL, 10);
      for (uint64_t c = 0; c < chunks; c++)
        redisAsyncCommand(ac, NULL, NULL, "DEL %s%s:%" PRIu64, s->link->k->snap_prefix, id, c);
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
    s->ev.switched(s->ev.arg, s->job->journal);
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
    s->ev.switched(s->ev.arg, j->journal);
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
  char trim[48], f[8][24], st[PS_STATE_NFIELDS][24];
  snprintf(trim, sizeof trim, "%" PRIu64 "-%" PRIu64, s->link->epoch, j->journal + 1);
  snprintf(f[0], 24, "%" PRIu64, j->journal);
  snprintf(f[1], 24, "%zu", o->nfloats);
  snprintf(f[2], 24, "%" PRIu64, j->nchunks);
  snprintf(f[3], 24, "%016" PRIx64, s->layout_hash);
  snprintf(f[4], 24, "%lld", (long long)time(NULL));
  snprintf(f[5], 24, "%d", o->consistency);
  snprintf(f[6], 24, "%" PRIu64, j->nondurable);
  const char *argv[8 + 2 * PS_STATE_NFIELDS + 22] = {
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
                        "consistency", f[5], "nondurable", f[6]};
  _Static_assert(sizeof rest / sizeof rest[0] <= 22, "argv has room for rest");
  for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
    argv[argc++] = rest[i];
  if (redisAsyncCommandArgv(ps_link_ac(s->link), on_switched, s, argc, argv, NULL) != REDIS_OK)
    snapshot_done(s, 0);
}

/* At most this many chunk SETs in flight: hiredis's output buffer (a log
 * entry waits behind it) stays a few MiB, not the whole state. */
#define SET_WINDOW 2

static void on_chunk_set(redisAsyncContext *ac, void *reply, void *priv);

/* Issue chunk SETs up to the window.  @return 0, or -1 when hiredis took
 * none (the connection is going). */
static int send_chunks(ps_snaps *s) {
  ps_snap_job *j = s->job;
  while (j->pending < SET_WINDOW && j->next < j->nchunks) {
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
  if (j->nchunks == 0) {
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

void ps_snaps_start(ps_snaps *s) {
  if (s->job != NULL || !ps_link_up(s->link) || (s->closing && !s->final_started))
    return;
  if (!s->final_started && ps_now_ns() < s->next_ns)
    return;
  /* The image covers every entry so far: each goes out before its chunks. */
  s->ev.before_copy(s->ev.arg);
  ps_shard *sh = s->shard;
  ps_snap_job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return;
  j->taken_ns = ps_now_ns();
  /* The reader is the consistent cut: everything below happens off it,
   * the chunks read from it as they are sent, while the shard goes on. */
  j->rd = ps_shard_reader_begin(sh, &j->info);
  j->chunk = malloc(PS_SNAP_CHUNK_FLOATS * sizeof(float));
  if (j->rd == NULL || j->chunk == NULL) {
    job_free(j);
    return;
  }
  j->nchunks = ps_snap_chunks(j->info.image_floats);
  j->journal = ps_shard_journal(sh);
  j->nondurable = s->ev.nondurable(s->ev.arg);
  snprintf(j->id, sizeof j->id, "%" PRIu64 ".%" PRIu64, s->link->epoch, ++s->counter);
  s->job = j;
  s->updates = 0;
  s->ticked = 0;
  s->log_bytes = 0;
  s->need_full = 0;
  char chunks[24];
  snprintf(chunks, sizeof chunks, "%" PRIu64, j->nchunks);
  if (redisAsyncCommand(ps_link_ac(s->link), on_registered, s, "HSET %s %s %s",
                        s->link->k->snaps, j->id, chunks) != REDIS_OK)
    snapshot_done(s, 0);
}
