/* A shard's start-up from its replica in Redis (see restore.h, REDIS.md §7).
 * hiredis's blocking API, every command under [redis] timeout_ms. */
#include "replica/restore.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <lz4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backoff.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "proto/proto.h"
#include "replica/keys.h"
#include "replica/registry.h"
#include "replica/restore_rows.h"
#include "replica/rows.h"

/* If the epoch still holds, rename the stream named by KEYS[2] (the log
 * key) to KEYS[3], make sure KEYS[3] exists, and record it in KEYS[2]:
 * the previous incarnation's next append (XADD NOMKSTREAM on its own
 * name) then finds no stream.  ARGV: epoch. */
static const char TAKE_LOG_SCRIPT[] =
    "local e = redis.call('GET', KEYS[1])\n"
    "if e ~= ARGV[1] then return redis.error_reply('FENCED epoch is ' .. tostring(e)) end\n"
    "local old = redis.call('GET', KEYS[2])\n"
    "if old and old ~= KEYS[3] and redis.call('EXISTS', old) == 1 then\n"
    "  redis.call('RENAME', old, KEYS[3]) end\n"
    "if redis.call('EXISTS', KEYS[3]) == 0 then\n"
    "  redis.call('XGROUP', 'CREATE', KEYS[3], 'g', '$', 'MKSTREAM')\n"
    "  redis.call('XGROUP', 'DESTROY', KEYS[3], 'g') end\n"
    "redis.call('SET', KEYS[2], KEYS[3])\n"
    "return 'OK'\n";

/* ------------------------------------------------------------ snapshot */

static int load_snapshot(redisContext *c, const ps_shard_keys *k, const redisReply *meta,
                         ps_shard *s, ps_restore_info *info, ps_errbuf *eb) {
  const ps_shard_opts *o = ps_shard_options(s);
  uint64_t journal, chunks, nfloats, nondurable = 0;
  ps_state_info in = {0};
  const redisReply *snap = ps_redis_field(meta, "snap"), *fmt = ps_redis_field(meta, "format");
  /* Format 2 stored its chunks as LZ4 blocks; 3 and 4 store them raw;
   * 4 adds the sparse tables (table_floats, sparse blocks in `v`); 5 keeps
   * their rows by key, beside the image (rows.h). */
  int lz4 = fmt != NULL && fmt->type == REDIS_REPLY_STRING && strcmp(fmt->str, "2") == 0;
  int old = lz4 || (fmt != NULL && fmt->type == REDIS_REPLY_STRING && strcmp(fmt->str, "3") == 0);
  int v4 = fmt != NULL && fmt->type == REDIS_REPLY_STRING && strcmp(fmt->str, "4") == 0;
  if (!old && !v4 &&
      (fmt == NULL || fmt->type != REDIS_REPLY_STRING || strcmp(fmt->str, PS_SNAP_FORMAT) != 0))
    return ps_err_set(eb, PS_EVERSION,
                      "%s: replica format %s, this shard reads formats 2 to %s (restore from a "
                      "checkpoint: delete the keys of %s)",
                      k->meta, fmt && fmt->str ? fmt->str : "(none)", PS_SNAP_FORMAT, k->tag);
  if (snap == NULL || snap->type != REDIS_REPLY_STRING ||
      ps_redis_field_u64(meta, "journal", &journal) ||
      ps_redis_field_u64(meta, "nfloats", &nfloats) || ps_redis_field_u64(meta, "chunks", &chunks))
    return ps_err_set(eb, PS_ECORRUPT, "%s: incomplete snapshot metadata", k->meta);
  /* The state's fixed fields, each under its own name (state.h). */
  for (const ps_state_field *f = ps_state_fields; f < ps_state_fields + PS_STATE_NFIELDS; f++) {
    uint64_t v = 0;
    if (old && strcmp(f->name, "table_floats") == 0)
      continue;  /* no tables before format 4 */
    if (ps_redis_field_u64(meta, f->name, &v))
      return ps_err_set(eb, PS_ECORRUPT, "%s: incomplete snapshot metadata (no %s)", k->meta,
                        f->name);
    if (ps_state_set(&in, f, v) != 0)
      return ps_err_set(eb, PS_ECORRUPT, "%s: snapshot %s %" PRIu64 " out of range (at most %"
                        PRIu64 ")", k->meta, f->name, v, f->max);
  }
  ps_redis_field_u64(meta, "nondurable", &nondurable);
  const redisReply *opt = ps_redis_field(meta, "optimizer");
  const redisReply *cons = ps_redis_field(meta, "consistency");
  if (opt == NULL || opt->type != REDIS_REPLY_STRING ||
      strcmp(opt->str, ps_optim_name(&o->optim)) != 0 || cons == NULL ||
      cons->type != REDIS_REPLY_STRING || atoi(cons->str) != o->consistency)
    return ps_err_set(eb, PS_ELAYOUT,
                      "%s: replica written with optimizer %s and consistency %s; this shard runs "
                      "%s and %d (change the config back, or delete the shard's keys)",
                      k->meta, opt && opt->str ? opt->str : "?",
                      cons && cons->str ? cons->str : "?",
                      ps_optim_name(&o->optim), o->consistency);
  char why[256];
  if (nfloats != o->nfloats)
    return ps_err_set(eb, PS_ELAYOUT, "%s: replica of %" PRIu64 " floats per array; this shard "
                      "holds %zu", k->meta, nfloats, o->nfloats);
  if (ps_shard_state_check(s, &in, why, sizeof why) != 0)
    return ps_err_set(eb, PS_ELAYOUT, "%s: %s", k->meta, why);
  uint64_t image_floats = in.image_floats, version = in.version;
  if (chunks != ps_snap_chunks(image_floats))
    return ps_err_set(eb, PS_ECORRUPT, "%s: %" PRIu64 " chunks for %" PRIu64 " floats, expected %"
                      PRIu64, k->meta, chunks, image_floats, ps_snap_chunks(image_floats));
  /* Chunk by chunk into the state, through one chunk's room: a large
   * state never needs a second copy.  A failure part-way leaves the state
   * half loaded, and every path after a failure loads it whole again. */
  uint64_t t0 = ps_now_ns();
  float *piece = malloc(PS_SNAP_CHUNK_FLOATS * sizeof(float));
  if (piece == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory for a snapshot chunk");
  int rc = 0;
  for (uint64_t i = 0; i < chunks && rc == 0; i++) {
    redisReply *r = redisCommand(c, "GET %s%s:%" PRIu64, k->snap_prefix, snap->str, i);
    uint64_t off = i * PS_SNAP_CHUNK_FLOATS;
    uint64_t want = ps_snap_chunk_floats(image_floats, i);
    if (r == NULL || r->type == REDIS_REPLY_ERROR)
      rc = ps_err_set(eb, -EIO, "%s%s:%" PRIu64 ": GET failed: %s", k->snap_prefix, snap->str, i,
                      r ? r->str : c->errstr);
    else if (r->type != REDIS_REPLY_STRING)
      rc = ps_err_set(eb, PS_ECORRUPT, "%s%s:%" PRIu64 ": snapshot chunk missing",
                      k->snap_prefix, snap->str, i);
    else if (lz4 && LZ4_decompress_safe(r->str, (char *)piece, (int)r->len,
                                        (int)(want * sizeof(float))) != (int)(want * sizeof(float)))
      rc = ps_err_set(eb, PS_ECORRUPT, "%s%s:%" PRIu64 ": chunk does not decompress to %" PRIu64
                      " bytes", k->snap_prefix, snap->str, i, want * sizeof(float));
    else if (!lz4 && r->len != want * sizeof(float))
      rc = ps_err_set(eb, PS_ECORRUPT, "%s%s:%" PRIu64 ": chunk of %zu bytes, expected %" PRIu64,
                      k->snap_prefix, snap->str, i, r->len, want * sizeof(float));
    else
      ps_shard_state_load_piece(s, &in, off, lz4 ? piece : (const float *)(const void *)r->str,
                                want);
    freeReplyObject(r);
  }
  free(piece);
  uint64_t t1 = ps_now_ns();
  if (rc == 0)
    rc = ps_shard_state_load_end(s, &in, eb);
  /* Format 5 with keyed rows: the image's tables are empty, their rows in
   * the hashes. */
  uint64_t keyed = 0;
  ps_redis_field_u64(meta, "keyed", &keyed);
  if (rc == 0 && !old && !v4 && keyed)
    rc = ps_restore_load_rows(c, k, meta, s, info, eb);
  else if (rc == 0 && !old && !v4)
    ps_redis_field_u64(meta, "rank_next", &info->rank_next);
  info->read_s = (double)(t1 - t0) * 1e-9;
  info->decode_s = (double)(ps_now_ns() - t1) * 1e-9;
  if (rc == 0) {
    ps_shard_set_journal(s, journal);
    info->snap_version = version;
    info->snap_journal = journal;
    info->nondurable = nondurable;
  }
  return rc;
}

/* -------------------------------------------------------------- replay */


/* Replay the stream after the snapshot, in stream order.  An entry is
 * applied when it continues the state's journal (n = journal + 1) and its
 * writer is not older than the writer of what the state holds; anything
 * else is skipped: entries the snapshot covers, and entries after one that
 * is missing (an append Redis refused), which were never acknowledged in
 * `block` mode.  Ids are <writer epoch>-<n> (REDIS.md §4). */
static int replay(redisContext *c, const ps_shard_keys *k, ps_shard *s, uint64_t lineage,
                  ps_restore_info *info, ps_errbuf *eb) {
  const ps_shard_opts *o = ps_shard_options(s);
  float *g = malloc((o->nfloats ? o->nfloats : 1) * sizeof(float));
  if (g == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory for the log replay");
  char start[48] = "-";
  int rc = 0;
  for (;;) {
    redisReply *r = redisCommand(c, "XRANGE %s %s + COUNT 256", k->log, start);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
      rc = ps_err_set(eb, -EIO, "%s: XRANGE failed: %s", k->log,
                      r && r->str ? r->str : c->errstr);
      freeReplyObject(r);
      break;
    }
    size_t count = r->elements;
    if (ps_shard_lazy(s) && (rc = ps_restore_prefetch(c, k, s, r, info, eb)) != 0) {
      freeReplyObject(r);
      break;
    }
    for (size_t i = 0; i < count && rc == 0; i++) {
      const redisReply *e = r->element[i];
      const char *id = e->element[0]->str;
      const redisReply *f = e->element[1];
      uint64_t writer = 0, n = 0, w = 0, inc = 0, seq = 0, t = 0;
      snprintf(start, sizeof start, "(%s", id);
      if (sscanf(id, "%" SCNu64 "-%" SCNu64, &writer, &n) != 2) {
        rc = ps_err_set(eb, PS_ECORRUPT, "%s entry %s: id is not <epoch>-<n>", k->log, id);
        break;
      }
      if (writer < lineage || n <= ps_shard_journal(s))
        continue;
      if (n != ps_shard_journal(s) + 1) {
        info->skipped++;
        continue;
      }
      const redisReply *kind = ps_redis_field(f, "k");
      if (kind == NULL || kind->type != REDIS_REPLY_STRING || kind->len != 1 ||
          ps_redis_field_u64(f, "w", &w) || ps_redis_field_u64(f, "i", &inc) ||
          ps_redis_field_u64(f, "s", &seq) ||
          ps_redis_field_u64(f, "t", &t) || w >= (uint64_t)o->nworkers) {
        rc = ps_err_set(eb, PS_ECORRUPT, "%s entry %s: malformed", k->log, id);
        break;
      }
      ps_journal j = {.kind = kind->str[0], .n = n, .worker = (uint32_t)w, .incarnation = inc,
                      .seq = seq, .step = t, .target = (int)t, .g = g};
      if (j.kind == PS_JOURNAL_PUSH) {
        /* `v`: the gradient as it is; `g`: an LZ4 block (format 2). */
        const redisReply *v = ps_redis_field(f, "v"), *gz = v ? NULL : ps_redis_field(f, "g");
        size_t want = o->nfloats * sizeof(float);
        /* `v` is the slice's gradient, then the push's sparse blocks. */
        if (v != NULL && (v->type != REDIS_REPLY_STRING || v->len < want ||
                          (v->len > want && o->ntables == 0))) {
          rc = ps_err_set(eb, PS_ECORRUPT, "%s entry %s: gradient of %zu bytes, expected %zu",
                          k->log, id, v->type == REDIS_REPLY_STRING ? v->len : 0, want);
          break;
        }
        if (v != NULL && v->len > want) {
          char why[256];
          ps_errbuf sb = {0};
          uint32_t nb = 0;
          j.sparse = v->str + want;
          j.sparse_bytes = v->len - want;
          if (ps_sparse_check(PS_SPARSE_KV, j.sparse, j.sparse_bytes, &nb, &sb) != 0 ||
              ps_shard_sparse_check(s, PS_SPARSE_KV, j.sparse, j.sparse_bytes, why,
                                    sizeof why) != 0) {
            rc = ps_err_set(eb, PS_ECORRUPT, "%s entry %s: sparse blocks: %s", k->log, id,
                            sb.msg[0] ? sb.msg : why);
            break;
          }
          /* A lazy load: the rows it touches came in first (prefetch);
           * keys it admits were new then. */
        }
        if (v != NULL) {
          j.g = (const float *)(const void *)v->str;
        } else if (gz == NULL || gz->type != REDIS_REPLY_STRING ||
                   LZ4_decompress_safe(gz->str, (char *)g, (int)gz->len, (int)want) != (int)want) {
          rc = ps_err_set(eb, PS_ECORRUPT, "%s entry %s: no gradient, or one that does not "
                          "decompress to %zu floats", k->log, id, o->nfloats);
          break;
        }
      }
      rc = ps_shard_replay(s, &j);
      if (rc < 0) {
        ps_err_set(eb, rc, "%s entry %s: cannot be applied", k->log, id);
        break;
      }
      rc = 0;
      lineage = writer;
      info->replayed++;
    }
    freeReplyObject(r);
    if (rc != 0 || count == 0)
      break;
  }
  free(g);
  return rc;
}

/* ------------------------------------------------------------------ GC */

/* Delete every snapshot registered in P:snaps but `keep` (NULL: all),
 * chunks first, then the registration. */
static void gc_snapshots(redisContext *c, const ps_shard_keys *k, const char *keep,
                         ps_restore_info *info) {
  redisReply *h = redisCommand(c, "HGETALL %s", k->snaps);
  if (h == NULL || h->type != REDIS_REPLY_ARRAY) {
    freeReplyObject(h);
    return;
  }
  for (size_t i = 0; i + 1 < h->elements; i += 2) {
    const char *id = h->element[i]->str;
    if (id == NULL || (keep != NULL && strcmp(id, keep) == 0))
      continue;
    uint64_t chunks, deltas;
    ps_snap_registered(h->element[i + 1]->str, &chunks, &deltas);
    for (uint64_t j = 0; j < chunks; j++)
      redisAppendCommand(c, "DEL %s%s:%" PRIu64, k->snap_prefix, id, j);
    for (uint64_t j = 0; j < deltas; j++)
      redisAppendCommand(c, "DEL %s%s:d%" PRIu64, k->snap_prefix, id, j);
    redisAppendCommand(c, "HDEL %s %s", k->snaps, id);
    for (uint64_t j = 0; j <= chunks + deltas; j++) {
      redisReply *r = NULL;
      if (redisGetReply(c, (void **)&r) != REDIS_OK)
        break;
      freeReplyObject(r);
    }
    info->gc_snapshots++;
  }
  freeReplyObject(h);
}

/* Delete the log streams of incarnations other than this one: after the
 * take-over, nothing names them. */
static void gc_streams(redisContext *c, const ps_shard_keys *k, ps_restore_info *info) {
  char pattern[PS_KEY_MAX + 8], cursor[32] = "0";
  /* The hash tag's braces are not glob characters; its name could hold
   * none either (cluster ids are [A-Za-z0-9_.-]). */
  snprintf(pattern, sizeof pattern, "%s:log:*", k->tag);
  do {
    redisReply *r = redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
      freeReplyObject(r);
      return;
    }
    snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
    const redisReply *keys = r->element[1];
    for (size_t i = 0; i < keys->elements; i++)
      if (strcmp(keys->element[i]->str, k->log) != 0) {
        freeReplyObject(redisCommand(c, "DEL %s", keys->element[i]->str));
        info->gc_streams++;
      }
    freeReplyObject(r);
  } while (strcmp(cursor, "0") != 0);
}

/* ------------------------------------------------------------- restore */

/* One attempt: -EIO or -ECONNREFUSED when Redis refused a command or went
 * away (the caller waits and tries again), another code when the replica
 * itself is wrong. */
static int restore_once(redisContext *c, ps_shard_keys *k, uint64_t layout_hash,
                        ps_shard *shard, ps_restore_info *info, ps_errbuf *eb, uint64_t t_start) {
  int rc = ps_redis_new_epoch(c, k->epoch, &info->epoch, eb);
  if (rc != 0)
    return -EIO;
  ps_shard_keys_log(k, info->epoch);
  /* The log taken over and the meta read in one round trip: a restart
   * waits behind whatever Redis runs for the other shards. */
  redisReply *t = NULL, *meta = NULL;
  redisAppendCommand(c, "EVAL %s 3 %s %s %s %" PRIu64, TAKE_LOG_SCRIPT, k->epoch, k->logkey,
                     k->log, info->epoch);
  redisAppendCommand(c, "HGETALL %s", k->meta);
  if (redisGetReply(c, (void **)&t) == REDIS_OK)
    redisGetReply(c, (void **)&meta);
  if (t == NULL || t->type == REDIS_REPLY_ERROR) {
    rc = ps_err_set(eb, -EIO, "%s: taking over the log: %s", k->log,
                    t && t->str ? t->str : c->errstr);
    freeReplyObject(t);
    freeReplyObject(meta);
    return rc;
  }
  freeReplyObject(t);
  if (meta == NULL || meta->type != REDIS_REPLY_ARRAY) {
    rc = ps_err_set(eb, -EIO, "%s: HGETALL failed: %s", k->meta,
                    meta && meta->str ? meta->str : c->errstr);
    freeReplyObject(meta);
    return rc;
  }
  if (meta->elements == 0) {
    /* No replica.  A log without a snapshot holds only entries that were
     * never acknowledged (nothing is durable before the first switch,
     * REDIS.md §9); the first switch trims them. */
    freeReplyObject(meta);
    gc_snapshots(c, k, NULL, info);
    gc_streams(c, k, info);
    return 0;
  }
  uint64_t layout = 0, lineage = 0;
  const redisReply *lv = ps_redis_field(meta, "layout");
  if (lv == NULL || lv->type != REDIS_REPLY_STRING || sscanf(lv->str, "%" SCNx64, &layout) != 1 ||
      layout != layout_hash) {
    rc = ps_err_set(eb, PS_ELAYOUT,
                    "%s: a replica of layout %s exists, this shard's layout is %016" PRIx64
                    " (another model, shard count or placement; delete the keys of %s to "
                    "start over)",
                    k->meta, lv && lv->str ? lv->str : "?", layout_hash, k->tag);
    freeReplyObject(meta);
    return rc;
  }
  ps_redis_field_u64(meta, "epoch", &lineage);
  const redisReply *fv = ps_redis_field(meta, "format");
  uint64_t tm = ps_now_ns();
  info->claim_s = (double)(tm - t_start) * 1e-9;
  if (fv != NULL && fv->type == REDIS_REPLY_STRING && strcmp(fv->str, PS_SNAP_FORMAT) == 0)
    rc = ps_restore_finish_merges(c, k, meta, info, eb);
  info->merge_s = (double)(ps_now_ns() - tm) * 1e-9;
  if (rc == 0)
    rc = load_snapshot(c, k, meta, shard, info, eb);
  char snap_id[64] = "";
  const redisReply *sid = ps_redis_field(meta, "snap");
  if (sid != NULL && sid->type == REDIS_REPLY_STRING)
    snprintf(snap_id, sizeof snap_id, "%s", sid->str);
  freeReplyObject(meta);
  uint64_t t0 = ps_now_ns();
  if (rc == 0)
    rc = replay(c, k, shard, lineage, info, eb);
  info->replay_s = (double)(ps_now_ns() - t0) * 1e-9;
  if (rc != 0)
    return rc;
  info->loaded = 1;
  uint64_t tg = ps_now_ns();
  gc_snapshots(c, k, snap_id, info);
  gc_streams(c, k, info);
  info->gc_s = (double)(ps_now_ns() - tg) * 1e-9;
  return 0;
}

int ps_replica_restore(const ps_config *cfg, int index, uint64_t layout_hash, ps_shard *shard,
                       volatile int *stop, ps_restore_info *info, ps_errbuf *eb) {
  ps_shard_keys k;
  ps_shard_keys_init(&k, cfg->cluster_id, index);
  uint64_t t0 = ps_now_ns();
  int rc = -EINTR;
  ps_backoff b;
  ps_backoff_init(&b, PS_REDIS_RETRY_BASE_MS, PS_REDIS_RETRY_CAP_MS, 0);
  ps_redis_wait wait = {0};
  while (!*stop) {
    memset(info, 0, sizeof *info);
    info->cfg = cfg;
    uint64_t t_start = ps_now_ns();
    redisContext *c = ps_redis_connect(cfg, k.tag, cfg->redis_timeout_ms, eb);
    if (c == NULL && eb->code == -EACCES)
      return eb->code;
    if (c != NULL) {
      rc = restore_once(c, &k, layout_hash, shard, info, eb, t_start);
      redisFree(c);
      /* Redis refusing or going away mid-way is waited out: the next
       * attempt takes a new epoch and starts over (the state is loaded
       * whole again). */
      if (rc != -EIO)
        break;
    }
    unsigned ms = ps_backoff_next(&b);
    char what[64];
    snprintf(what, sizeof what, "to restore shard %d", index);
    ps_redis_wait_failed(&wait, what, eb->msg);
    usleep(ms * 1000);
  }
  if (*stop && rc == -EIO)
    rc = ps_err_set(eb, -EINTR, "stopped while waiting for Redis");
  else if (*stop && rc == -EINTR)
    ps_err_set(eb, -EINTR, "stopped while waiting for Redis");
  info->seconds = (double)(ps_now_ns() - t0) * 1e-9;
  return rc;
}
