/* Where things live in Redis, and a blocking connection to it (see keys.h). */
#include "replica/keys.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void ps_shard_keys_init(ps_shard_keys *k, const char *cluster, int index) {
  memset(k, 0, sizeof *k);
  snprintf(k->tag, sizeof k->tag, "{%s:ps:%d}", cluster, index);
  snprintf(k->epoch, sizeof k->epoch, "%s:epoch", k->tag);
  snprintf(k->meta, sizeof k->meta, "%s:meta", k->tag);
  snprintf(k->logkey, sizeof k->logkey, "%s:logkey", k->tag);
  snprintf(k->snaps, sizeof k->snaps, "%s:snaps", k->tag);
  snprintf(k->snap_prefix, sizeof k->snap_prefix, "%s:snap:", k->tag);
  snprintf(k->node, sizeof k->node, "%s:node", k->tag);
}

void ps_shard_keys_log(ps_shard_keys *k, uint64_t epoch) {
  snprintf(k->log, sizeof k->log, "%s:log:%" PRIu64, k->tag, epoch);
}

void ps_cluster_key(char out[PS_KEY_MAX], const char *cluster, const char *fmt, ...) {
  int n = snprintf(out, PS_KEY_MAX, "{%s}:", cluster);
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && n < PS_KEY_MAX)
    vsnprintf(out + n, PS_KEY_MAX - (size_t)n, fmt, ap);
  va_end(ap);
}

void ps_key_node(char out[PS_KEY_MAX], const char *cluster, const char *role, int index) {
  ps_cluster_key(out, cluster, "node:%s:%d", role, index);
}

void ps_key_epoch(char out[PS_KEY_MAX], const char *cluster, const char *role, int index) {
  ps_cluster_key(out, cluster, "epoch:%s:%d", role, index);
}

void ps_key_worker_pos(char out[PS_KEY_MAX], const char *cluster, int worker) {
  ps_cluster_key(out, cluster, "pos:worker:%d", worker);
}

void ps_key_chief_lease(char out[PS_KEY_MAX], const char *cluster) {
  ps_cluster_key(out, cluster, "chief");
}

void ps_key_done(char out[PS_KEY_MAX], const char *cluster) {
  ps_cluster_key(out, cluster, "done");
}

void *ps_redis_connect(const ps_config *cfg, int64_t timeout_ms, ps_errbuf *eb) {
  struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
  redisContext *c = redisConnectWithTimeout(cfg->redis.host, cfg->redis.port, tv);
  if (c == NULL || c->err) {
    ps_err_set(eb, -ECONNREFUSED, "redis %s:%u: %s", cfg->redis.host, cfg->redis.port,
               c ? c->errstr : "out of memory");
    redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, tv);
  char pw[512];
  if (ps_config_read_redis_password(cfg, pw, sizeof pw, eb) < 0) {
    eb->code = -EACCES;
    redisFree(c);
    return NULL;
  }
  if (pw[0] != '\0') {
    redisReply *r = cfg->redis_user[0] ? redisCommand(c, "AUTH %s %s", cfg->redis_user, pw)
                                       : redisCommand(c, "AUTH %s", pw);
    memset(pw, 0, sizeof pw);
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
      /* A reply of NULL is the connection failing, not a refusal. */
      ps_err_set(eb, r ? -EACCES : -ECONNREFUSED, "redis %s:%u: AUTH%s%s failed: %s",
                 cfg->redis.host, cfg->redis.port, cfg->redis_user[0] ? " as " : "",
                 cfg->redis_user, r ? r->str : c->errstr);
      freeReplyObject(r);
      redisFree(c);
      return NULL;
    }
    freeReplyObject(r);
  }
  return c;
}
