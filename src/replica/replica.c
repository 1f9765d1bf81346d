/* Replication of a shard's state to Redis (see replica.h, REDIS.md).
 *
 * Start-up is blocking (hiredis's synchronous API): take an epoch, load the
 * snapshot, replay the log.  At run time everything goes through hiredis's
 * async API on the shard's own libuv loop, so a log append never blocks a
 * pull.  Snapshots are copied on the loop and compressed on libuv's thread
 * pool; the switch to a new snapshot is one Lua script, atomic in Redis,
 * that also checks the epoch, so a stale incarnation can never replace a
 * newer one's state. */
#include "replica/replica.h"

#include <errno.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <lz4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/endian.h"
#include "common/timeutil.h"
#include "replica/registry.h"

#define CHUNK_FLOATS (256 * 1024)  /* 1 MiB of raw floats per snapshot chunk */
#define BACKOFF_CAP_MS 2000

/* Log appends carry the gradient, hundreds of kilobytes: as an argument of
 * a Lua script Redis would hash the whole string (measured: 10.3 ms against
 * 4.2 ms for a plain XADD of 4 MB).  So appends are plain
 * `XADD <stream> NOMKSTREAM`, and the fence is the stream's name: each
 * incarnation logs to its own stream `{..}:log:<epoch>`, which it takes
 * over from its predecessor by RENAME at start-up.  An old incarnation's
 * next append then finds no stream and gets a nil reply: it is fenced.
 *
 * TAKE_LOG (start-up, after the epoch): if the epoch still holds, rename
 * the stream named by KEYS[2] (the log key) to KEYS[3], make sure KEYS[3]
 * exists, and record it in KEYS[2].  ARGV: epoch. */
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

/* LZ4 acceleration for gradients and snapshot chunks: float32 data barely
 * compresses (94-98%), and the default setting spent a quarter of the
 * shard's loop on it; a high acceleration skips incompressible runs fast. */
#define LZ4_ACCEL 32

/* Point the meta hash at a new snapshot and trim the log it covers, if the
 * epoch still holds.  KEYS: epoch, meta, log.  ARGV: epoch, trim MINID,
 * then the meta hash's field/value pairs. */
static const char SWITCH_SCRIPT[] =
    "local e = redis.call('GET', KEYS[1])\n"
    "if e ~= ARGV[1] then return redis.error_reply('FENCED epoch is ' .. tostring(e)) end\n"
    "redis.call('DEL', KEYS[2])\n"
    "redis.call('HSET', KEYS[2], unpack(ARGV, 3))\n"
    "redis.call('XTRIM', KEYS[3], 'MINID', ARGV[2])\n"
    "return 'OK'\n";

/* On every (re)connection: the epoch key must hold this incarnation's
 * epoch.  A Redis that lost its data (restarted without persistence) has
 * none: the shard claims it back and rewrites its state.  A larger one
 * means a newer incarnation exists. */
static const char CLAIM_SCRIPT[] =
    "local e = redis.call('GET', KEYS[1])\n"
    "local r = 'OK'\n"
    "if e ~= ARGV[1] then\n"
    "  if e ~= false and tonumber(e) > tonumber(ARGV[1]) then\n"
    "    return redis.error_reply('FENCED epoch is ' .. e) end\n"
    "  redis.call('SET', KEYS[1], ARGV[1]) r = 'CLAIMED' end\n"
    /* An emptied Redis lost the stream too: appends need it back. */
    "if redis.call('EXISTS', KEYS[3]) == 0 then\n"
    "  redis.call('XGROUP', 'CREATE', KEYS[3], 'g', '$', 'MKSTREAM')\n"
    "  redis.call('XGROUP', 'DESTROY', KEYS[3], 'g')\n"
    "  redis.call('SET', KEYS[2], KEYS[3]) end\n"
    "return r\n";

/* The shard's heartbeat, written only while its epoch holds: this is also
 * how an idle stale incarnation learns within a second that it is one.
 * KEYS: epoch, node.  ARGV: epoch, payload, ttl ms. */
static const char HEARTBEAT_SCRIPT[] =
    "local e = redis.call('GET', KEYS[1])\n"
    "if e ~= ARGV[1] then return redis.error_reply('FENCED epoch is ' .. tostring(e)) end\n"
    "return redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])\n";

#define FORMAT_VERSION "1"

/* ------------------------------------------------ hiredis on libuv */

/* hiredis 0.14's own libuv adapter ignores a poll that reports an error or
 * a hang-up: when Redis dies the connection is never seen to close and
 * every pending append waits forever.  This one hands such events to
 * hiredis's read path, which then sees the socket's error and disconnects
 * (calling every pending callback with no reply). */
typedef struct uv_redis {
  redisAsyncContext *ac;
  uv_poll_t poll;
  int events;
} uv_redis;

static void uv_redis_poll(uv_poll_t *h, int status, int events) {
  uv_redis *p = h->data;
  if (p->ac == NULL)
    return;
  if (status < 0 || (events & UV_DISCONNECT)) {
    redisAsyncHandleRead(p->ac);
    return;
  }
  if (events & UV_READABLE)
    redisAsyncHandleRead(p->ac);
  if (p->ac != NULL && (events & UV_WRITABLE))
    redisAsyncHandleWrite(p->ac);
}

static void uv_redis_update(uv_redis *p, int add, int ev) {
  p->events = add ? p->events | ev : p->events & ~ev;
  if (p->events)
    uv_poll_start(&p->poll, p->events | UV_DISCONNECT, uv_redis_poll);
  else
    uv_poll_stop(&p->poll);
}

static void uv_redis_add_read(void *d) { uv_redis_update(d, 1, UV_READABLE); }
static void uv_redis_del_read(void *d) { uv_redis_update(d, 0, UV_READABLE); }
static void uv_redis_add_write(void *d) { uv_redis_update(d, 1, UV_WRITABLE); }
static void uv_redis_del_write(void *d) { uv_redis_update(d, 0, UV_WRITABLE); }
static void uv_redis_freed(uv_handle_t *h) { free(h->data); }

static void uv_redis_cleanup(void *d) {
  uv_redis *p = d;
  p->ac = NULL;
  uv_close((uv_handle_t *)&p->poll, uv_redis_freed);
}

static int uv_redis_attach(redisAsyncContext *ac, uv_loop_t *loop) {
  uv_redis *p = calloc(1, sizeof *p);
  if (p == NULL)
    return REDIS_ERR;
  if (uv_poll_init(loop, &p->poll, ac->c.fd) != 0) {
    free(p);
    return REDIS_ERR;
  }
  p->ac = ac;
  p->poll.data = p;
  ac->ev.data = p;
  ac->ev.addRead = uv_redis_add_read;
  ac->ev.delRead = uv_redis_del_read;
  ac->ev.addWrite = uv_redis_add_write;
  ac->ev.delWrite = uv_redis_del_write;
  ac->ev.cleanup = uv_redis_cleanup;
  return REDIS_OK;
}

/* ---------------------------------------------------------------- keys */

typedef struct keys {
  char epoch[160], meta[160], snap_prefix[160], node[160];
  char logkey[160];  /* names the current log stream */
  char log[192];     /* this incarnation's log stream, once its epoch is known */
} keys;

static void make_keys(keys *k, const char *cluster, int index) {
  /* One hash tag per shard: every key of a shard lives in one Redis
   * Cluster slot, so its scripts touch one node. */
  snprintf(k->epoch, sizeof k->epoch, "{%s:ps:%d}:epoch", cluster, index);
  snprintf(k->meta, sizeof k->meta, "{%s:ps:%d}:meta", cluster, index);
  snprintf(k->logkey, sizeof k->logkey, "{%s:ps:%d}:logkey", cluster, index);
  k->log[0] = '\0';
  snprintf(k->snap_prefix, sizeof k->snap_prefix, "{%s:ps:%d}:snap:", cluster, index);
  snprintf(k->node, sizeof k->node, "{%s:ps:%d}:node", cluster, index);
}

/* ------------------------------------------------------ state encoding */

/* The raw snapshot: values, then each slot, then (sync) the step's sum. */
static size_t raw_floats(const ps_shard *s) {
  size_t arrays = 1 + (size_t)ps_optim_nslots(s->o.optim.kind) + (s->accum != NULL);
  return arrays * s->o.nfloats;
}

static float *raw_array(ps_shard *s, size_t i) {
  int nslots = ps_optim_nslots(s->o.optim.kind);
  if (i == 0)
    return s->values;
  if ((int)i <= nslots)
    return s->slots[i - 1];
  return s->accum;
}

/* --------------------------------------------------------- start-up */

static redisContext *connect_sync(const ps_config *cfg, ps_errbuf *eb) {
  struct timeval tv = {.tv_sec = 2};
  redisContext *c = redisConnectWithTimeout(cfg->redis.host, cfg->redis.port, tv);
  if (c == NULL || c->err) {
    ps_err_set(eb, -ECONNREFUSED, "redis %s:%u: %s", cfg->redis.host, cfg->redis.port,
               c ? c->errstr : "out of memory");
    redisFree(c);
    return NULL;
  }
  struct timeval rw = {.tv_sec = 10};
  redisSetTimeout(c, rw);
  return c;
}

static int auth_sync(redisContext *c, const ps_config *cfg, ps_errbuf *eb) {
  char pw[512];
  if (ps_config_read_redis_password(cfg, pw, sizeof pw, eb) < 0)
    return eb->code;
  if (pw[0] == '\0')
    return 0;
  redisReply *r = cfg->redis_user[0] ? redisCommand(c, "AUTH %s %s", cfg->redis_user, pw)
                                     : redisCommand(c, "AUTH %s", pw);
  int rc = 0;
  if (r == NULL || r->type == REDIS_REPLY_ERROR)
    rc = ps_err_set(eb, -EACCES, "redis %s:%u: AUTH%s%s failed: %s", cfg->redis.host,
                    cfg->redis.port, cfg->redis_user[0] ? " as " : "", cfg->redis_user,
                    r ? r->str : c->errstr);
  freeReplyObject(r);
  memset(pw, 0, sizeof pw);
  return rc;
}

static const redisReply *hash_get(const redisReply *h, const char *field) {
  for (size_t i = 0; i + 1 < h->elements; i += 2)
    if (strcmp(h->element[i]->str, field) == 0)
      return h->element[i + 1];
  return NULL;
}

static int hash_u64(const redisReply *h, const char *field, uint64_t *out) {
  const redisReply *v = hash_get(h, field);
  if (v == NULL || v->type != REDIS_REPLY_STRING)
    return -1;
  char *end;
  *out = strtoull(v->str, &end, 10);
  return *end == '\0' ? 0 : -1;
}

static int load_snapshot(redisContext *c, const keys *k, const redisReply *meta, ps_shard *s,
                         ps_errbuf *eb) {
  uint64_t nfloats, nslots, chunks, version, gstep, accum_count, target;
  const redisReply *snap = hash_get(meta, "snap"), *once = hash_get(meta, "once");
  if (snap == NULL || once == NULL || hash_u64(meta, "nfloats", &nfloats) ||
      hash_u64(meta, "nslots", &nslots) || hash_u64(meta, "chunks", &chunks) ||
      hash_u64(meta, "version", &version) || hash_u64(meta, "global_step", &gstep) ||
      hash_u64(meta, "accum_count", &accum_count) || hash_u64(meta, "target", &target))
    return ps_err_set(eb, PS_ECORRUPT, "%s: incomplete snapshot metadata", k->meta);
  const redisReply *fmt = hash_get(meta, "format"), *opt = hash_get(meta, "optimizer");
  const redisReply *cons = hash_get(meta, "consistency");
  if (fmt == NULL || strcmp(fmt->str, FORMAT_VERSION) != 0)
    return ps_err_set(eb, PS_EVERSION, "%s: snapshot format %s, expected %s", k->meta,
                      fmt ? fmt->str : "(none)", FORMAT_VERSION);
  if (opt == NULL || strcmp(opt->str, ps_optim_name(&s->o.optim)) != 0 || cons == NULL ||
      atoi(cons->str) != s->o.consistency)
    return ps_err_set(eb, PS_ELAYOUT,
                      "%s: replica written with optimizer %s and consistency %s; this shard runs "
                      "%s and %d (change the config back, or delete the shard's keys)",
                      k->meta, opt ? opt->str : "?", cons ? cons->str : "?",
                      ps_optim_name(&s->o.optim), s->o.consistency);
  if (nfloats != s->o.nfloats || nslots != (uint64_t)ps_optim_nslots(s->o.optim.kind) ||
      once->len != (size_t)s->o.nworkers * 16)
    return ps_err_set(eb, PS_ELAYOUT,
                      "%s: replica holds %" PRIu64 " floats with %" PRIu64 " optimizer slots and "
                      "%zu workers; this shard has %zu floats, %d slots, %d workers",
                      k->meta, nfloats, nslots, once->len / 16, s->o.nfloats,
                      ps_optim_nslots(s->o.optim.kind), s->o.nworkers);
  size_t total = raw_floats(s), done = 0;
  for (uint64_t i = 0; i < chunks; i++) {
    redisReply *r = redisCommand(c, "GET %s%s:%" PRIu64, k->snap_prefix, snap->str, i);
    if (r == NULL || r->type != REDIS_REPLY_STRING) {
      freeReplyObject(r);
      return ps_err_set(eb, PS_ECORRUPT, "%s%s:%" PRIu64 ": snapshot chunk missing",
                        k->snap_prefix, snap->str, i);
    }
    size_t want = total - done < CHUNK_FLOATS ? total - done : CHUNK_FLOATS;
    float *dst = raw_array(s, done / s->o.nfloats) + done % s->o.nfloats;
    /* Chunks never straddle two arrays unless an array is not a multiple
     * of a chunk: decompress into a bounce buffer then. */
    float *tmp = NULL;
    if (done % s->o.nfloats + want > s->o.nfloats) {
      tmp = malloc(want * sizeof(float));
      dst = tmp;
    }
    int n = dst ? LZ4_decompress_safe(r->str, (char *)dst, (int)r->len, (int)(want * sizeof(float)))
                : -1;
    freeReplyObject(r);
    if (n != (int)(want * sizeof(float))) {
      free(tmp);
      return ps_err_set(eb, PS_ECORRUPT, "%s%s:%" PRIu64 ": chunk does not decompress to %zu bytes",
                        k->snap_prefix, snap->str, i, want * sizeof(float));
    }
    if (tmp != NULL) {
      for (size_t j = 0; j < want; j++) {
        size_t at = done + j;
        raw_array(s, at / s->o.nfloats)[at % s->o.nfloats] = tmp[j];
      }
      free(tmp);
    }
    done += want;
  }
  if (done != total)
    return ps_err_set(eb, PS_ECORRUPT, "%s: %" PRIu64 " chunks hold %zu of %zu floats", k->meta,
                      chunks, done, total);
  const uint8_t *ob = (const uint8_t *)once->str;
  for (int w = 0; w < s->o.nworkers; w++) {
    s->once[w].incarnation = ps_get_le64(ob + 16 * w);
    s->once[w].last_seq = ps_get_le64(ob + 16 * w + 8);
  }
  s->version = version;
  s->global_step = gstep;
  s->accum_count = (int)accum_count;
  s->target = (int)target;
  return 0;
}

static const redisReply *entry_field(const redisReply *fields, const char *name) {
  for (size_t i = 0; i + 1 < fields->elements; i += 2)
    if (strcmp(fields->element[i]->str, name) == 0)
      return fields->element[i + 1];
  return NULL;
}

static uint64_t field_u64(const redisReply *fields, const char *name, int *bad) {
  const redisReply *v = entry_field(fields, name);
  if (v == NULL) {
    *bad = 1;
    return 0;
  }
  return strtoull(v->str, NULL, 10);
}

/* Replace the log stream by an empty one (its last id back to 0-0). */
static int reset_log(redisContext *c, const keys *k, ps_errbuf *eb) {
  redisReply *r = redisCommand(c, "DEL %s", k->log);
  freeReplyObject(r);
  r = redisCommand(c, "XGROUP CREATE %s g $ MKSTREAM", k->log);
  int ok = r != NULL && r->type != REDIS_REPLY_ERROR;
  freeReplyObject(r);
  r = redisCommand(c, "XGROUP DESTROY %s g", k->log);
  freeReplyObject(r);
  return ok ? 0 : ps_err_set(eb, -EIO, "%s: cannot start an empty log: %s", k->log, c->errstr);
}

/* Replay log entries after the snapshot through the shard's own rules.
 * Outside sync mode every applied entry must lead to the next version: an
 * entry past it means appends were lost while Redis was away (REDIS.md),
 * and the replay stops there rather than apply gradients out of order. */
static int replay(redisContext *c, const keys *k, ps_shard *s, float *g, uint64_t *count,
                  int *gap, ps_errbuf *eb) {
  char start[48];
  snprintf(start, sizeof start, "%" PRIu64 "-0", s->version + 1);
  for (;;) {
    redisReply *r = redisCommand(c, "XRANGE %s %s + COUNT 256", k->log, start);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
      int rc = ps_err_set(eb, PS_ECORRUPT, "%s: XRANGE failed: %s", k->log,
                          r ? r->str : c->errstr);
      freeReplyObject(r);
      return rc;
    }
    if (r->elements == 0) {
      freeReplyObject(r);
      return 0;
    }
    for (size_t i = 0; i < r->elements; i++) {
      const redisReply *e = r->element[i];
      const char *id = e->element[0]->str;
      const redisReply *f = e->element[1];
      int bad = 0;
      const redisReply *kind = entry_field(f, "k");
      uint64_t w = field_u64(f, "w", &bad), inc = field_u64(f, "i", &bad);
      uint64_t seq = field_u64(f, "s", &bad), step = field_u64(f, "t", &bad);
      if (kind == NULL || bad || w >= (uint64_t)s->o.nworkers) {
        freeReplyObject(r);
        return ps_err_set(eb, PS_ECORRUPT, "%s entry %s: malformed", k->log, id);
      }
      uint64_t v = strtoull(id, NULL, 10);
      if (s->accum == NULL && kind->str[0] == PS_LOG_PUSH && v != s->version + 1 &&
          !(w < (uint64_t)s->o.nworkers && s->once[w].incarnation == inc &&
            s->once[w].last_seq >= seq)) {
        ps_log(PS_LOG_WARN, "%s: entry %s after version %" PRIu64 ": a hole in the log (appends "
               "lost while Redis was away); replay stops here", k->log, id, s->version);
        *gap = 1;
        freeReplyObject(r);
        return 0;
      }
      if (kind->str[0] == PS_LOG_PUSH) {
        const redisReply *gz = entry_field(f, "g");
        int n = gz ? LZ4_decompress_safe(gz->str, (char *)g, (int)gz->len,
                                         (int)(s->o.nfloats * sizeof(float)))
                   : -1;
        if (n != (int)(s->o.nfloats * sizeof(float))) {
          freeReplyObject(r);
          return ps_err_set(eb, PS_ECORRUPT, "%s entry %s: gradient does not decompress to %zu "
                            "floats", k->log, id, s->o.nfloats);
        }
        ps_shard_push(s, (uint32_t)w, inc, seq, step, g);
      } else if (kind->str[0] == PS_LOG_FLUSH) {
        ps_shard_sync_flush(s);
      } else if (kind->str[0] == PS_LOG_RESET) {
        ps_shard_sync_reset_target(s);
      }
      (*count)++;
      snprintf(start, sizeof start, "(%s", id);
    }
    freeReplyObject(r);
  }
}

int ps_replica_restore(const ps_config *cfg, int index, uint64_t layout_hash, ps_shard *shard,
                       volatile int *stop, ps_restore_info *info, ps_errbuf *eb) {
  memset(info, 0, sizeof *info);
  keys k;
  make_keys(&k, cfg->cluster_id, index);
  uint64_t t0 = ps_now_ns();
  redisContext *c = NULL;
  for (int attempt = 0; !*stop; attempt++) {
    c = connect_sync(cfg, eb);
    if (c != NULL)
      break;
    unsigned ms = 100u << (attempt < 5 ? attempt : 5);
    ps_log(PS_LOG_WARN, "waiting for Redis to restore shard %d: %s; retry in %u ms", index,
           eb->msg, ms);
    usleep(ms * 1000);
  }
  if (c == NULL)
    return ps_err_set(eb, -EINTR, "stopped while waiting for Redis");
  int rc = auth_sync(c, cfg, eb);
  if (rc != 0)
    goto out;
  rc = ps_redis_new_epoch(c, k.epoch, &info->epoch, eb);
  if (rc != 0)
    goto out;
  snprintf(k.log, sizeof k.log, "{%s:ps:%d}:log:%" PRIu64, cfg->cluster_id, index, info->epoch);
  redisReply *t = redisCommand(c, "EVAL %s 3 %s %s %s %" PRIu64, TAKE_LOG_SCRIPT, k.epoch,
                               k.logkey, k.log, info->epoch);
  if (t == NULL || t->type == REDIS_REPLY_ERROR) {
    rc = ps_err_set(eb, -EIO, "%s: taking over the log: %s", k.log, t ? t->str : c->errstr);
    freeReplyObject(t);
    goto out;
  }
  freeReplyObject(t);
  redisReply *meta = redisCommand(c, "HGETALL %s", k.meta);
  if (meta == NULL || meta->type != REDIS_REPLY_ARRAY) {
    rc = ps_err_set(eb, -EIO, "%s: HGETALL failed: %s", k.meta, meta ? meta->str : c->errstr);
    freeReplyObject(meta);
    goto out;
  }
  if (meta->elements == 0) {
    /* No replica: a fresh shard.  Entries a first incarnation logged before
     * its first snapshot belong to a state that is gone: they go too, so
     * that new ids start from version 1. */
    freeReplyObject(meta);
    rc = reset_log(c, &k, eb);
    goto out;
  }
  uint64_t layout = 0;
  const redisReply *lv = hash_get(meta, "layout");
  if (lv == NULL || sscanf(lv->str, "%" SCNx64, &layout) != 1 || layout != layout_hash) {
    rc = ps_err_set(eb, PS_ELAYOUT,
                    "%s: a replica of layout %s exists, this shard's layout is %016" PRIx64
                    " (another model, shard count or placement; delete the keys of "
                    "{%s:ps:%d} to start over)",
                    k.meta, lv ? lv->str : "?", layout_hash, cfg->cluster_id, index);
    freeReplyObject(meta);
    goto out;
  }
  rc = load_snapshot(c, &k, meta, shard, eb);
  const redisReply *sid = hash_get(meta, "snap");
  if (sid != NULL)
    snprintf(info->snap_id, sizeof info->snap_id, "%s", sid->str);
  hash_u64(meta, "chunks", &info->snap_chunks);
  freeReplyObject(meta);
  if (rc != 0)
    goto out;
  info->snap_version = shard->version;
  float *g = malloc((shard->o.nfloats ? shard->o.nfloats : 1) * sizeof(float));
  if (g == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "out of memory for the log replay");
    goto out;
  }
  rc = replay(c, &k, shard, g, &info->replayed, &info->gap, eb);
  free(g);
  if (rc == 0)
    info->loaded = 1;
  /* Entries past a hole cannot be applied, and ids above them would look
   * like the next hole: start the log over (the first snapshot of this
   * incarnation covers what was replayed). */
  if (rc == 0 && info->gap)
    rc = reset_log(c, &k, eb);
out:
  if (rc == 0) {
    /* Redis remembers a stream's last id even after trimming: new entries
     * must go above it. */
    redisReply *x = redisCommand(c, "XINFO STREAM %s", k.log);
    if (x != NULL && x->type == REDIS_REPLY_ARRAY) {
      const redisReply *last = hash_get(x, "last-generated-id");
      if (last != NULL && last->type == REDIS_REPLY_STRING)
        sscanf(last->str, "%" SCNu64 "-%" SCNu64, &info->last_v, &info->last_k);
    }
    freeReplyObject(x);
  }
  redisFree(c);
  info->seconds = (double)(ps_now_ns() - t0) * 1e-9;
  return rc;
}

/* The stream this incarnation logs to, as ps_replica_restore named it. */
static void incarnation_log(keys *k, const char *cluster, int index, uint64_t epoch) {
  snprintf(k->log, sizeof k->log, "{%s:ps:%d}:log:%" PRIu64, cluster, index, epoch);
}

/* ------------------------------------------------------------ run time */

typedef struct snap_job {
  uv_work_t work;
  struct ps_replica *r;
  float *raw;          /* the copied state */
  size_t nraw;
  char **chunk;        /* compressed chunks */
  int *chunk_len;
  size_t nchunks;
  uint64_t version, global_step;
  int accum_count, target;
  uint8_t *once;
  size_t once_len;
  char id[48];
  size_t pending;      /* chunk SETs not yet answered */
  int failed;
} snap_job;

struct ps_replica {
  uv_loop_t *loop;
  const ps_config *cfg;
  int index;
  uint64_t epoch, layout_hash;
  char epoch_text[24];
  keys k;
  ps_shard *shard;
  ps_replica_fenced_fn fenced;
  void *fenced_arg;
  redisAsyncContext *ac;
  int connected;       /* AUTH done, commands flow */
  int attempts;
  uv_timer_t retry, interval;
  int closing;
  void (*close_done)(void *);
  void *close_arg;
  int handles_open;
  uint64_t last_v, last_k;  /* the last log entry id */
  uint64_t snap_version;    /* newest snapshot Redis holds */
  uint64_t updates;         /* since the last snapshot began */
  int need_full;            /* entries were not logged: snapshot at once */
  snap_job *job;            /* a snapshot in flight */
  char old_snap[48];
  uint64_t old_chunks;
  uint64_t snap_counter;
  char *gz;                 /* compression buffer for log entries */
  int gz_cap;
  int redis_down_logged;
  uint64_t last_hb_ns;
  int final_snapshot;       /* closing: snapshots may still run */
  int final_started;        /* closing: the last one was started */
  int fenced_out;           /* a newer incarnation owns the shard */
  ps_replica_alive_fn alive_fn;
  void *alive_arg;
};

static void start_snapshot(ps_replica *r);
static void replica_connect(ps_replica *r);

static void maybe_finish_close(ps_replica *r) {
  if (!r->closing || r->ac != NULL || r->job != NULL || r->handles_open > 0)
    return;
  free(r->gz);
  void (*done)(void *) = r->close_done;
  void *arg = r->close_arg;
  free(r);
  if (done)
    done(arg);
}

static void on_handle_closed(uv_handle_t *h) {
  ps_replica *r = h->data;
  r->handles_open--;
  maybe_finish_close(r);
}

static void fence(ps_replica *r, const char *why) {
  r->fenced_out = 1;
  ps_log(PS_LOG_ERROR, "shard %d epoch %" PRIu64 " fenced out by Redis: %s", r->index, r->epoch,
         why);
  if (r->fenced)
    r->fenced(r->fenced_arg, why);
}

static int is_fenced(const redisReply *rep) {
  return rep != NULL && rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "FENCED", 6) == 0;
}

static void on_retry_timer(uv_timer_t *t) { replica_connect(t->data); }

static void schedule_reconnect(ps_replica *r) {
  if (r->closing)
    return;
  unsigned cap = 100u << (r->attempts < 5 ? r->attempts : 5);
  if (cap > BACKOFF_CAP_MS)
    cap = BACKOFF_CAP_MS;
  /* Never wait longer than one replication interval, so that a Redis that
   * is back is current again within two. */
  if (cap > (unsigned)r->cfg->replicate_interval_ms)
    cap = (unsigned)r->cfg->replicate_interval_ms;
  if (cap < 2)
    cap = 2;
  r->attempts++;
  uv_timer_start(&r->retry, on_retry_timer, cap / 2 + (unsigned)rand() % (cap / 2 + 1), 0);
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  ps_replica *r = ac->data;
  (void)status;
  r->ac = NULL;
  if (!r->closing && (r->connected || !r->redis_down_logged))
    ps_log(PS_LOG_WARN, "redis %s:%u: connection lost; serving on, %s", r->cfg->redis.host,
           r->cfg->redis.port, "a full snapshot follows when it is back");
  r->redis_down_logged = 1;
  r->connected = 0;
  r->need_full = 1;
  if (r->closing)
    maybe_finish_close(r);
  else
    schedule_reconnect(r);
}

static void on_claimed(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_replica *r = priv;
  redisReply *rep = reply;
  if (rep == NULL)
    return;  /* disconnected again: on_disconnect handles it */
  if (is_fenced(rep)) {
    fence(r, rep->str);
    return;
  }
  if (rep->type == REDIS_REPLY_ERROR) {
    ps_log(PS_LOG_WARN, "redis: epoch check failed: %s", rep->str);
    redisAsyncDisconnect(r->ac);
    return;
  }
  r->connected = 1;
  r->attempts = 0;
  if (r->redis_down_logged || strcmp(rep->str, "CLAIMED") == 0)
    ps_log(PS_LOG_INFO, "redis %s:%u: connected%s; writing a full snapshot", r->cfg->redis.host,
           r->cfg->redis.port, strcmp(rep->str, "CLAIMED") == 0 ? " to an empty Redis" : " again");
  r->redis_down_logged = 0;
  start_snapshot(r);
}

static void on_auth(redisAsyncContext *ac, void *reply, void *priv) {
  (void)priv;
  redisReply *rep = reply;
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR) {
    ps_log(PS_LOG_ERROR, "redis AUTH failed: %s", rep->str);
    redisAsyncDisconnect(ac);
  }
}

static void on_connect(const redisAsyncContext *ac, int status) {
  ps_replica *r = ac->data;
  if (status == REDIS_OK)
    return;  /* AUTH and CLAIM are already queued behind the connect */
  if (!r->redis_down_logged)
    ps_log(PS_LOG_WARN, "redis %s:%u: %s; serving on and retrying", r->cfg->redis.host,
           r->cfg->redis.port, ac->errstr);
  r->redis_down_logged = 1;
  r->ac = NULL;  /* hiredis frees the context after this callback */
  r->need_full = 1;
  if (r->closing)
    maybe_finish_close(r);
  else
    schedule_reconnect(r);
}

static void replica_connect(ps_replica *r) {
  if (r->closing || r->ac != NULL)
    return;
  redisAsyncContext *ac = redisAsyncConnect(r->cfg->redis.host, r->cfg->redis.port);
  if (ac == NULL || ac->err) {
    if (ac)
      redisAsyncFree(ac);
    schedule_reconnect(r);
    return;
  }
  ac->data = r;
  if (uv_redis_attach(ac, r->loop) != REDIS_OK) {
    redisAsyncFree(ac);
    schedule_reconnect(r);
    return;
  }
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  r->ac = ac;
  /* hiredis queues commands until the connection is up: AUTH and the
   * epoch claim go first, so every append after them is authenticated
   * and fenced, even those issued while connecting. */
  char pw[512];
  ps_errbuf eb = {0};
  if (ps_config_read_redis_password(r->cfg, pw, sizeof pw, &eb) > 0) {
    if (r->cfg->redis_user[0])
      redisAsyncCommand(ac, on_auth, NULL, "AUTH %s %s", r->cfg->redis_user, pw);
    else
      redisAsyncCommand(ac, on_auth, NULL, "AUTH %s", pw);
  }
  memset(pw, 0, sizeof pw);
  redisAsyncCommand(ac, on_claimed, r, "EVAL %s 3 %s %s %s %s", CLAIM_SCRIPT, r->k.epoch,
                    r->k.logkey, r->k.log, r->epoch_text);
}

/* ------------------------------------------------------------ the log */

typedef struct log_req {
  ps_replica *r;
  void (*done)(void *, int);
  void *arg;
} log_req;

static void on_logged(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  log_req *q = priv;
  redisReply *rep = reply;
  int status = 0;
  if (rep == NULL) {
    status = -ECONNRESET;  /* the connection went: covered by the next full snapshot */
  } else if (rep->type == REDIS_REPLY_NIL) {
    /* NOMKSTREAM found no stream: a newer incarnation took it over. */
    status = -EPERM;
    fence(q->r, "the log stream was taken over by a newer incarnation");
  } else if (is_fenced(rep)) {
    status = -EPERM;
    fence(q->r, rep->str);
  } else if (rep->type == REDIS_REPLY_ERROR) {
    ps_log(PS_LOG_WARN, "redis: log append failed: %s", rep->str);
    q->r->need_full = 1;
    status = -EIO;
  }
  if (q->done)
    q->done(q->arg, status);
  free(q);
}

void ps_replica_log(ps_replica *r, const ps_log_entry *e, void (*done)(void *arg, int status),
                    void *arg) {
  if (r->ac == NULL || r->closing) {
    r->need_full = 1;
    if (done)
      done(arg, -ENOTCONN);
    return;
  }
  /* Stream ids grow with the version the entry leads to, so that a
   * snapshot of version S trims exactly the entries it covers (MINID S+1). */
  if (e->v > r->last_v) {
    r->last_v = e->v;
    r->last_k = 0;
  } else {
    r->last_k++;
  }
  int gz_len = 0;
  if (e->g != NULL) {
    int raw = (int)(e->n * sizeof(float));
    int bound = LZ4_compressBound(raw);
    if (bound > r->gz_cap) {
      char *p = realloc(r->gz, (size_t)bound);
      if (p == NULL) {
        r->need_full = 1;
        if (done)
          done(arg, -ENOMEM);
        return;
      }
      r->gz = p;
      r->gz_cap = bound;
    }
    gz_len = LZ4_compress_fast((const char *)e->g, r->gz, raw, r->gz_cap, LZ4_ACCEL);
    if (gz_len <= 0 && raw > 0) {
      r->need_full = 1;
      if (done)
        done(arg, -EIO);
      return;
    }
  }
  char id[48], ks[2] = {(char)e->kind, 0}, ws[16], is[24], ss[24], ts[24];
  snprintf(id, sizeof id, "%" PRIu64 "-%" PRIu64, r->last_v, r->last_k);
  snprintf(ws, sizeof ws, "%u", e->worker);
  snprintf(is, sizeof is, "%" PRIu64, e->incarnation);
  snprintf(ss, sizeof ss, "%" PRIu64, e->seq);
  snprintf(ts, sizeof ts, "%" PRIu64, e->step);
  const char *argv[16] = {"XADD", r->k.log, "NOMKSTREAM", id, "k", ks, "w", ws, "i", is,
                          "s", ss, "t", ts, "g", e->g ? r->gz : ""};
  size_t argl[16];
  for (int i = 0; i < 15; i++)
    argl[i] = strlen(argv[i]);
  argl[15] = (size_t)gz_len;
  log_req *q = malloc(sizeof *q);
  if (q == NULL) {
    r->need_full = 1;
    if (done)
      done(arg, -ENOMEM);
    return;
  }
  *q = (log_req){r, done, arg};
  /* hiredis copies the arguments into its output buffer. */
  if (redisAsyncCommandArgv(r->ac, on_logged, q, 16, argv, argl) != REDIS_OK) {
    free(q);
    r->need_full = 1;
    if (done)
      done(arg, -EIO);
  }
}

void ps_replica_barrier(ps_replica *r, void (*done)(void *arg, int status), void *arg) {
  log_req *q = r->ac != NULL && !r->closing ? malloc(sizeof *q) : NULL;
  if (q == NULL) {
    done(arg, -ENOTCONN);
    return;
  }
  *q = (log_req){r, done, arg};
  /* Redis answers in order: this PING's reply follows every earlier append's. */
  if (redisAsyncCommand(r->ac, on_logged, q, "PING") != REDIS_OK) {
    free(q);
    done(arg, -EIO);
  }
}

/* ------------------------------------------------------- snapshots */

static void job_free(snap_job *j) {
  if (j == NULL)
    return;
  for (size_t i = 0; j->chunk && i < j->nchunks; i++)
    free(j->chunk[i]);
  free(j->chunk);
  free(j->chunk_len);
  free(j->raw);
  free(j->once);
  free(j);
}

static void compress_work(uv_work_t *w) {
  snap_job *j = w->data;
  for (size_t i = 0; i < j->nchunks; i++) {
    size_t off = i * CHUNK_FLOATS;
    size_t n = j->nraw - off < CHUNK_FLOATS ? j->nraw - off : CHUNK_FLOATS;
    int bound = LZ4_compressBound((int)(n * sizeof(float)));
    j->chunk[i] = malloc((size_t)bound);
    if (j->chunk[i] == NULL) {
      j->failed = 1;
      return;
    }
    j->chunk_len[i] =
        LZ4_compress_fast((const char *)(j->raw + off), j->chunk[i], (int)(n * sizeof(float)), bound,
                          LZ4_ACCEL);
    if (j->chunk_len[i] <= 0) {
      j->failed = 1;
      return;
    }
  }
}

/* Closing: write one last snapshot if the newest is older than the shard,
 * then disconnect; on_disconnect finishes the close, possibly before this
 * returns, so r must not be touched after it. */
static void close_after_snapshots(ps_replica *r) {
  if (r->ac != NULL && r->connected && !r->fenced_out && !r->final_started &&
      r->snap_version != r->shard->version) {
    r->final_started = 1;
    start_snapshot(r);
    if (r->job != NULL)
      return;
  }
  if (r->ac != NULL) {
    redisAsyncDisconnect(r->ac);
    return;
  }
  maybe_finish_close(r);
}

static void snapshot_done(ps_replica *r) {
  job_free(r->job);
  r->job = NULL;
  if (r->closing)
    close_after_snapshots(r);
}

static void on_switched(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_replica *r = priv;
  redisReply *rep = reply;
  snap_job *j = r->job;
  if (rep != NULL && rep->type != REDIS_REPLY_ERROR) {
    /* The old snapshot's chunks are no longer referenced. */
    if (r->old_snap[0] != '\0' && r->ac != NULL && strcmp(r->old_snap, j->id) != 0)
      for (uint64_t i = 0; i < r->old_chunks; i++)
        redisAsyncCommand(r->ac, NULL, NULL, "DEL %s%s:%" PRIu64, r->k.snap_prefix, r->old_snap, i);
    snprintf(r->old_snap, sizeof r->old_snap, "%s", j->id);
    r->old_chunks = j->nchunks;
    r->snap_version = j->version;
  } else if (is_fenced(rep)) {
    fence(r, rep->str);
  } else if (rep != NULL) {
    ps_log(PS_LOG_WARN, "redis: snapshot switch failed: %s", rep->str);
    r->need_full = 1;
  } else {
    r->need_full = 1;
  }
  snapshot_done(r);
}

static void on_chunk_set(redisAsyncContext *ac, void *reply, void *priv) {
  ps_replica *r = priv;
  redisReply *rep = reply;
  snap_job *j = r->job;
  if (rep == NULL || rep->type == REDIS_REPLY_ERROR)
    j->failed = 1;
  if (--j->pending > 0)
    return;
  if (j->failed || r->ac == NULL || ac == NULL || (r->closing && !r->final_snapshot)) {
    r->need_full = 1;
    snapshot_done(r);
    return;
  }
  /* Every chunk is stored: switch the meta hash to them, atomically. */
  char trim[48], version[24], gstep[24], nfloats[24], nslots[24], chunks[24], layout[24],
      accum[24], target[24], t[24];
  snprintf(trim, sizeof trim, "%" PRIu64 "-0", j->version + 1);
  snprintf(version, sizeof version, "%" PRIu64, j->version);
  snprintf(gstep, sizeof gstep, "%" PRIu64, j->global_step);
  snprintf(nfloats, sizeof nfloats, "%zu", r->shard->o.nfloats);
  snprintf(nslots, sizeof nslots, "%d", ps_optim_nslots(r->shard->o.optim.kind));
  snprintf(chunks, sizeof chunks, "%zu", j->nchunks);
  snprintf(layout, sizeof layout, "%016" PRIx64, r->layout_hash);
  snprintf(accum, sizeof accum, "%d", j->accum_count);
  snprintf(target, sizeof target, "%d", j->target);
  snprintf(t, sizeof t, "%lld", (long long)time(NULL));
  char cons[8];
  snprintf(cons, sizeof cons, "%d", r->shard->o.consistency);
  const char *argv[] = {"EVAL", SWITCH_SCRIPT, "3", r->k.epoch, r->k.meta, r->k.log,
                        r->epoch_text, trim,
                        "snap", j->id, "version", version, "global_step", gstep,
                        "nfloats", nfloats, "nslots", nslots, "chunks", chunks,
                        "layout", layout, "accum_count", accum, "target", target,
                        "epoch", r->epoch_text, "time", t, "format", FORMAT_VERSION,
                        "optimizer", ps_optim_name(&r->shard->o.optim), "consistency", cons,
                        "once", (const char *)j->once};
  size_t argc = sizeof argv / sizeof argv[0];
  size_t argl[sizeof argv / sizeof argv[0]];
  for (size_t i = 0; i + 1 < argc; i++)
    argl[i] = strlen(argv[i]);
  argl[argc - 1] = j->once_len;  /* binary */
  redisAsyncCommandArgv(r->ac, on_switched, r, (int)argc, argv, argl);
}

static void after_compress(uv_work_t *w, int status) {
  snap_job *j = w->data;
  ps_replica *r = j->r;
  if (status != 0 || j->failed || !r->connected || r->ac == NULL ||
      (r->closing && !r->final_snapshot)) {
    r->need_full = 1;
    snapshot_done(r);
    return;
  }
  /* pending counts the SETs issued plus one, released below, so that the
   * switch starts only after every SET was both issued and answered. */
  j->pending = 1;
  for (size_t i = 0; i < j->nchunks; i++) {
    char key[256];
    snprintf(key, sizeof key, "%s%s:%zu", r->k.snap_prefix, j->id, i);
    const char *argv[3] = {"SET", key, j->chunk[i]};
    size_t argl[3] = {3, strlen(key), (size_t)j->chunk_len[i]};
    if (redisAsyncCommandArgv(r->ac, on_chunk_set, r, 3, argv, argl) == REDIS_OK)
      j->pending++;
    else
      j->failed = 1;
  }
  on_chunk_set(r->ac, &(redisReply){.type = REDIS_REPLY_STATUS}, r);
}

static void start_snapshot(ps_replica *r) {
  if (r->job != NULL || !r->connected || (r->closing && !r->final_snapshot))
    return;
  ps_shard *s = r->shard;
  snap_job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return;
  j->r = r;
  j->nraw = raw_floats(s);
  j->nchunks = (j->nraw + CHUNK_FLOATS - 1) / CHUNK_FLOATS;
  j->raw = malloc((j->nraw ? j->nraw : 1) * sizeof(float));
  j->chunk = calloc(j->nchunks ? j->nchunks : 1, sizeof *j->chunk);
  j->chunk_len = calloc(j->nchunks ? j->nchunks : 1, sizeof *j->chunk_len);
  j->once_len = (size_t)s->o.nworkers * 16;
  j->once = malloc(j->once_len ? j->once_len : 1);
  if (j->raw == NULL || j->chunk == NULL || j->chunk_len == NULL || j->once == NULL) {
    job_free(j);
    return;
  }
  /* The copy is the consistent cut: everything below happens off it. */
  size_t arrays = j->nraw / (s->o.nfloats ? s->o.nfloats : 1);
  for (size_t a = 0; a < arrays; a++)
    memcpy(j->raw + a * s->o.nfloats, raw_array(s, a), s->o.nfloats * sizeof(float));
  for (int w = 0; w < s->o.nworkers; w++) {
    ps_put_le64(j->once + 16 * w, s->once[w].incarnation);
    ps_put_le64(j->once + 16 * w + 8, s->once[w].last_seq);
  }
  j->version = s->version;
  j->global_step = s->global_step;
  j->accum_count = s->accum_count;
  j->target = s->target;
  snprintf(j->id, sizeof j->id, "%" PRIu64 ".%" PRIu64, r->epoch, ++r->snap_counter);
  r->job = j;
  r->updates = 0;
  r->need_full = 0;
  j->work.data = j;
  if (uv_queue_work(r->loop, &j->work, compress_work, after_compress) != 0) {
    r->job = NULL;
    r->need_full = 1;
    job_free(j);
  }
}

static void on_heartbeat(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_replica *r = priv;
  if (is_fenced(reply))
    fence(r, ((redisReply *)reply)->str);
}

static void heartbeat(ps_replica *r) {
  char payload[256], host[128] = "?", ttl[24];
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  snprintf(payload, sizeof payload,
           "pid %d host %s incarnation %" PRIu64 " step %" PRIu64 " version %" PRIu64 " lag %" PRIu64,
           (int)getpid(), host, r->epoch, r->shard->global_step, r->shard->version,
           ps_replica_lag(r));
  snprintf(ttl, sizeof ttl, "%" PRId64, 3 * r->cfg->heartbeat_ms);
  const char *argv[] = {"EVAL", HEARTBEAT_SCRIPT, "2", r->k.epoch, r->k.node, r->epoch_text,
                        payload, ttl};
  redisAsyncCommandArgv(r->ac, on_heartbeat, r, 8, argv, NULL);
}

static void on_workers(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_replica *r = priv;
  redisReply *rep = reply;
  if (rep == NULL || rep->type != REDIS_REPLY_ARRAY || r->alive_fn == NULL)
    return;
  uint8_t alive[PS_CONFIG_MAX_NODES] = {0};
  for (size_t j = 0; j < rep->elements && j < PS_CONFIG_MAX_NODES; j++)
    alive[j] = rep->element[j]->type == REDIS_REPLY_STRING;
  r->alive_fn(r->alive_arg, alive, (int)rep->elements);
}

/* MGET of every worker's heartbeat key. */
static void watch_workers(ps_replica *r) {
  int n = r->cfg->nworkers;
  const char *argv[1 + PS_CONFIG_MAX_NODES];
  char keys_buf[PS_CONFIG_MAX_NODES][96];
  argv[0] = "MGET";
  for (int j = 0; j < n; j++) {
    snprintf(keys_buf[j], sizeof keys_buf[j], "{%s}:node:worker:%d", r->cfg->cluster_id, j);
    argv[1 + j] = keys_buf[j];
  }
  redisAsyncCommandArgv(r->ac, on_workers, r, 1 + n, argv, NULL);
}

void ps_replica_watch_workers(ps_replica *r, ps_replica_alive_fn fn, void *arg) {
  r->alive_fn = fn;
  r->alive_arg = arg;
}

static void on_interval(uv_timer_t *t) {
  ps_replica *r = t->data;
  if (r->updates > 0 || r->need_full)
    start_snapshot(r);
  uint64_t now = ps_now_ns();
  if (r->connected && now - r->last_hb_ns >= (uint64_t)r->cfg->heartbeat_ms * 1000000ULL) {
    r->last_hb_ns = now;
    heartbeat(r);
    if (r->alive_fn != NULL)
      watch_workers(r);
  }
}


void ps_replica_updated(ps_replica *r) {
  if (++r->updates >= (uint64_t)r->cfg->replicate_every_updates)
    start_snapshot(r);
}

uint64_t ps_replica_lag(const ps_replica *r) { return r->shard->version - r->snap_version; }

ps_replica *ps_replica_new(uv_loop_t *loop, const ps_config *cfg, int index,
                           const ps_restore_info *restored, uint64_t layout_hash, ps_shard *shard,
                           ps_replica_fenced_fn fenced, void *fenced_arg) {
  ps_replica *r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  r->loop = loop;
  r->cfg = cfg;
  r->index = index;
  r->epoch = restored->epoch;
  r->layout_hash = layout_hash;
  r->shard = shard;
  r->fenced = fenced;
  r->fenced_arg = fenced_arg;
  r->last_v = restored->last_v;
  r->last_k = restored->last_k;
  /* The snapshot this incarnation started from is deleted after its
   * first own one is switched in. */
  snprintf(r->old_snap, sizeof r->old_snap, "%s", restored->snap_id);
  r->old_chunks = restored->snap_chunks;
  r->snap_version = restored->loaded ? restored->snap_version : 0;
  r->need_full = 1;  /* the first snapshot records this incarnation's start */
  snprintf(r->epoch_text, sizeof r->epoch_text, "%" PRIu64, r->epoch);
  make_keys(&r->k, cfg->cluster_id, index);
  incarnation_log(&r->k, cfg->cluster_id, index, r->epoch);
  uv_timer_init(loop, &r->retry);
  uv_timer_init(loop, &r->interval);
  r->retry.data = r->interval.data = r;
  r->handles_open = 2;
  uv_timer_start(&r->interval, on_interval, (uint64_t)cfg->replicate_interval_ms,
                 (uint64_t)cfg->replicate_interval_ms);
  replica_connect(r);
  return r;
}

void ps_replica_close(ps_replica *r, void (*done)(void *arg), void *arg) {
  r->closing = 1;
  /* A snapshot in flight is finished, and a clean stop loses nothing even
   * in `snapshot` mode. */
  r->final_snapshot = 1;
  r->close_done = done;
  r->close_arg = arg;
  uv_close((uv_handle_t *)&r->retry, on_handle_closed);
  uv_close((uv_handle_t *)&r->interval, on_handle_closed);
  if (r->job == NULL)
    close_after_snapshots(r);
}
