/* A shard's snapshots in Redis (see replica_internal.h, REDIS.md §6): the
 * state image copied on the loop (the consistent cut), registered in
 * P:snaps, stored in raw chunks a few at a time, then switched in by one
 * fenced script that trims the log it covers (and, with
 * redis_replicas, confirmed by WAIT before it covers anything); each
 * switch deletes the snapshots that never switched. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "replica/replica_internal.h"

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

static void job_free(snap_job *j) {
  if (j == NULL)
    return;
  free(j->img);
  free(j);
}

/* Closing: write one last snapshot if the newest is older than the shard
 * (or the journal is not durable), then disconnect; on_disconnect finishes
 * the close, possibly before this returns, so r must not be touched after. */
void ps__replica_snapshots_close(ps_replica *r) {
  if (r->ac != NULL && r->state == RS_UP && !r->final_started &&
      (r->snap_version != ps_shard_version(r->shard) || r->f.hole)) {
    r->final_started = 1;
    ps__replica_snapshot_start(r);
    if (r->job != NULL)
      return;
  }
  if (r->ac != NULL) {
    redisAsyncDisconnect(r->ac);
    return;
  }
  ps__replica_maybe_finish_close(r);
}

static void snapshot_done(ps_replica *r, int ok) {
  if (!ok) {
    /* Retried at a later tick, backing off while Redis keeps refusing: a
     * copy of a large state every interval would be work thrown away. */
    r->need_full = 1;
    r->snap_next_ns = ps_now_ns() + ps_backoff_next(&r->snap_backoff) * 1000000ULL;
  } else {
    ps_backoff_reset(&r->snap_backoff);
    r->snap_next_ns = 0;
    if (r->snap_said_ns != 0)
      ps_log(PS_LOG_INFO, "redis: snapshot written again (%" PRIu64 " more had failed since the "
             "last report)", r->snap_failures);
    r->snap_said_ns = 0;
    r->snap_failures = 0;
  }
  job_free(r->job);
  r->job = NULL;
  /* A switch's GC issues its DELs from the listing's reply, and hiredis
   * takes no command once a disconnect is asked: the clean stop waits
   * for the listing (on_snaps_listed) before disconnecting. */
  if (r->closing && !r->gc_pending)
    ps__replica_snapshots_close(r);
}

#define SNAP_SAY_NS (30 * 1000000000ULL)

/* A snapshot Redis would not take: said at once with Redis's reason, again
 * once acknowledgements are held for it, then at most every 30 s with the
 * count of failures since, until one is written (said too). */
static void snapshot_failed(ps_replica *r, const char *why) {
  uint64_t now = ps_now_ns();
  r->snap_failures++;
  if (r->snap_said_ns == 0 || now - r->snap_said_ns >= SNAP_SAY_NS ||
      (r->f.waiting > 0 && !r->snap_said_held)) {
    char held[96] = "";
    if (r->f.waiting > 0)
      snprintf(held, sizeof held, "; %" PRIu64 " acknowledgements held until one is written",
               r->f.waiting);
    ps_log(PS_LOG_WARN, "redis: snapshot not written: %s%s (%" PRIu64 " failed since the last "
           "report; retrying with backoff)", why, held, r->snap_failures);
    r->snap_said_ns = now;
    r->snap_said_held = r->f.waiting > 0;
    r->snap_failures = 0;
  }
  snapshot_done(r, 0);
}

/* Delete the chunks and registrations of every snapshot but `keep`: those
 * replaced, and those a killed incarnation left half written. */
typedef struct gc_req {
  ps_replica *r;
  char keep[48];
} gc_req;

static void on_snaps_listed(redisAsyncContext *ac, void *reply, void *priv) {
  gc_req *g = priv;
  ps_replica *r = g->r;
  redisReply *h = reply;
  if (h != NULL && h->type == REDIS_REPLY_ARRAY && r->ac == ac && r->state == RS_UP) {
    for (size_t i = 0; i + 1 < h->elements; i += 2) {
      const char *id = h->element[i]->str;
      if (id == NULL || strcmp(id, g->keep) == 0)
        continue;
      uint64_t chunks = strtoull(h->element[i + 1]->str ? h->element[i + 1]->str : "0", NULL, 10);
      for (uint64_t c = 0; c < chunks; c++)
        redisAsyncCommand(ac, NULL, NULL, "DEL %s%s:%" PRIu64, r->k.snap_prefix, id, c);
      redisAsyncCommand(ac, NULL, NULL, "HDEL %s %s", r->k.snaps, id);
    }
  }
  free(g);
  r->gc_pending = 0;
  /* Without a reply the connection is going: on_disconnect closes. */
  if (h != NULL && r->closing && r->job == NULL)
    ps__replica_snapshots_close(r);
}

/* The WAIT after a switch: only a snapshot the replicas hold covers the
 * entries it replaced (a failover must not lose them with it). */
static void on_switch_waited(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_replica *r = priv;
  char why[200];
  const char *failure = ps__replica_wait_failure(r, reply, why, sizeof why);
  if (failure == NULL) {
    ps_frontier_covered(&r->f, r->job->journal);
    snapshot_done(r, 1);
    return;
  }
  char msg[300];
  snprintf(msg, sizeof msg, "switched on the primary, but %s", failure);
  snapshot_failed(r, msg);
}

static void on_switched(redisAsyncContext *ac, void *reply, void *priv) {
  ps_replica *r = priv;
  redisReply *rep = reply;
  snap_job *j = r->job;
  if (rep != NULL && rep->type != REDIS_REPLY_ERROR) {
    r->snap_version = j->info.version;
    r->meta_expected = 1;
    r->snap_taken_ns = j->taken_ns;
    gc_req *g = ac != NULL && r->state == RS_UP ? malloc(sizeof *g) : NULL;
    if (g != NULL) {
      g->r = r;
      snprintf(g->keep, sizeof g->keep, "%s", j->id);
      if (redisAsyncCommand(ac, on_snaps_listed, g, "HGETALL %s", r->k.snaps) != REDIS_OK)
        free(g);
      else
        r->gc_pending = 1;
    }
    if (r->wait_replicas > 0 && ac != NULL &&
        ps__replica_send_wait(r, ac, on_switch_waited, r) == 0)
      return;
    if (r->wait_replicas > 0) {
      snapshot_done(r, 0);
      return;
    }
    ps_frontier_covered(&r->f, j->journal);
    snapshot_done(r, 1);
    return;
  }
  if (ps__replica_is_fenced(rep)) {
    ps__replica_fence(r, rep->str);
  } else if (ps__replica_check_lost(r, rep)) {
    /* The reconnection claims the keys back and writes a full snapshot. */
  } else if (rep != NULL) {
    char msg[300];
    snprintf(msg, sizeof msg, "the switch failed: %s", rep->str);
    ps__replica_check_readonly(r, rep);
    snapshot_failed(r, msg);
    return;
  }
  ps__replica_check_readonly(r, rep);
  snapshot_done(r, 0);
}

static void send_switch(ps_replica *r) {
  snap_job *j = r->job;
  const ps_state_info *in = &j->info;
  char trim[48], f[16][24];
  snprintf(trim, sizeof trim, "%" PRIu64 "-%" PRIu64, r->epoch, j->journal + 1);
  snprintf(f[0], 24, "%" PRIu64, in->version);
  snprintf(f[1], 24, "%" PRIu64, in->global_step);
  snprintf(f[2], 24, "%" PRIu64, j->journal);
  snprintf(f[3], 24, "%" PRIu64, in->image_floats);
  snprintf(f[4], 24, "%zu", ps_shard_options(r->shard)->nfloats);
  snprintf(f[5], 24, "%" PRIu32, in->nslots);
  snprintf(f[6], 24, "%" PRIu32, in->has_accum);
  snprintf(f[7], 24, "%" PRIu32, in->nonce);
  snprintf(f[8], 24, "%" PRIu32, in->accum_count);
  snprintf(f[9], 24, "%" PRIu32, in->target);
  snprintf(f[10], 24, "%" PRIu64, j->nchunks);
  snprintf(f[11], 24, "%016" PRIx64, r->layout_hash);
  snprintf(f[12], 24, "%lld", (long long)time(NULL));
  snprintf(f[13], 24, "%d", ps_shard_options(r->shard)->consistency);
  snprintf(f[14], 24, "%" PRIu64, j->nondurable);
  const char *argv[] = {"EVAL", SWITCH_SCRIPT, "3", r->k.epoch, r->k.meta, r->k.log,
                        r->epoch_text, trim,
                        "snap", j->id, "version", f[0], "global_step", f[1], "journal", f[2],
                        "image_floats", f[3], "nfloats", f[4], "nslots", f[5],
                        "has_accum", f[6], "nonce", f[7], "accum_count", f[8], "target", f[9],
                        "chunks", f[10], "layout", f[11], "epoch", r->epoch_text, "time", f[12],
                        "format", PS_SNAP_FORMAT,
                        "optimizer", ps_optim_name(&ps_shard_options(r->shard)->optim),
                        "consistency", f[13], "nondurable", f[14]};
  if (redisAsyncCommandArgv(r->ac, on_switched, r, (int)(sizeof argv / sizeof argv[0]), argv,
                            NULL) != REDIS_OK)
    snapshot_done(r, 0);
}

/* At most this many chunk SETs in flight: hiredis's output buffer (a log
 * entry waits behind it) stays a few MiB, not the whole state. */
#define SET_WINDOW 2

static void on_chunk_set(redisAsyncContext *ac, void *reply, void *priv);

/* Issue chunk SETs up to the window.  @return 0, or -1 when hiredis took
 * none (the connection is going). */
static int send_chunks(ps_replica *r) {
  snap_job *j = r->job;
  while (j->pending < SET_WINDOW && j->next < j->nchunks) {
    uint64_t i = j->next;
    char key[PS_KEY_MAX + 80];
    snprintf(key, sizeof key, "%s%s:%" PRIu64, r->k.snap_prefix, j->id, i);
    const char *argv[3] = {"SET", key, (const char *)(j->img + i * PS_SNAP_CHUNK_FLOATS)};
    size_t argl[3] = {3, strlen(key),
                      (size_t)ps_snap_chunk_floats(j->info.image_floats, i) * sizeof(float)};
    if (redisAsyncCommandArgv(r->ac, on_chunk_set, r, 3, argv, argl) != REDIS_OK)
      return -1;
    j->next++;
    j->pending++;
  }
  return 0;
}

static void on_chunk_set(redisAsyncContext *ac, void *reply, void *priv) {
  ps_replica *r = priv;
  redisReply *rep = reply;
  snap_job *j = r->job;
  j->pending--;
  if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
    if (!j->failed && rep != NULL)
      snprintf(j->why, sizeof j->why, "a chunk was not stored: %s", rep->str);
    j->failed = 1;
  }
  if (!j->failed && (r->ac == NULL || ac == NULL || r->state != RS_UP ||
                     (r->closing && !r->final_started)))
    j->failed = 1;
  if (!j->failed && send_chunks(r) != 0)
    j->failed = 1;
  if (j->pending > 0)
    return;
  if (j->failed) {
    if (j->why[0])
      snapshot_failed(r, j->why);
    else
      snapshot_done(r, 0);
    return;
  }
  /* Every chunk is stored: switch the meta hash to them, atomically. */
  send_switch(r);
}

/* The snapshot is registered: a crash from now on leaves chunks that the
 * next start-up or switch finds and deletes.  Store them.  (Registering
 * first also means a Redis that refuses writes costs a copy and one
 * command, not the whole state sent.) */
static void on_registered(redisAsyncContext *ac, void *reply, void *priv) {
  ps_replica *r = priv;
  redisReply *rep = reply;
  snap_job *j = r->job;
  if (rep == NULL || rep->type == REDIS_REPLY_ERROR || ac == NULL || r->state != RS_UP ||
      (r->closing && !r->final_started)) {
    if (rep != NULL && rep->type == REDIS_REPLY_ERROR) {
      char msg[300];
      snprintf(msg, sizeof msg, "not registered: %s", rep->str);
      snapshot_failed(r, msg);
    } else {
      snapshot_done(r, 0);
    }
    return;
  }
  if (j->nchunks == 0) {
    send_switch(r);
    return;
  }
  if (send_chunks(r) != 0) {
    /* hiredis took no more: the connection is going.  With none in
     * flight, nothing else will end the job. */
    if (j->pending == 0) {
      snapshot_done(r, 0);
      return;
    }
    j->failed = 1;
  }
}

void ps__replica_snapshot_start(ps_replica *r) {
  if (r->job != NULL || r->state != RS_UP || (r->closing && !r->final_started))
    return;
  if (!r->final_started && ps_now_ns() < r->snap_next_ns)
    return;
  /* The image covers every entry so far: each goes out before its chunks. */
  ps_replica_flush(r);
  ps_shard *s = r->shard;
  snap_job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return;
  j->info = ps_shard_state_info(s);
  j->taken_ns = ps_now_ns();
  j->nchunks = ps_snap_chunks(j->info.image_floats);
  j->img = malloc((size_t)(j->info.image_floats ? j->info.image_floats : 1) * sizeof(float));
  if (j->img == NULL) {
    job_free(j);
    return;
  }
  /* The copy is the consistent cut: everything below happens off it. */
  ps_shard_state_write(s, j->img);
  j->journal = ps_shard_journal(s);
  j->nondurable = r->f.nondurable;
  snprintf(j->id, sizeof j->id, "%" PRIu64 ".%" PRIu64, r->epoch, ++r->snap_counter);
  r->job = j;
  r->updates = 0;
  r->need_full = 0;
  char chunks[24];
  snprintf(chunks, sizeof chunks, "%" PRIu64, j->nchunks);
  if (redisAsyncCommand(r->ac, on_registered, r, "HSET %s %s %s", r->k.snaps, j->id, chunks) !=
      REDIS_OK)
    snapshot_done(r, 0);
}
