/* Where things live in Redis, the AUTH of every connection, and a blocking
 * connection to it (see keys.h). */
#include "replica/keys.h"

#include <dirent.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"

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

void ps_key_ring_view(char out[PS_KEY_MAX], const char *cluster) {
  ps_cluster_key(out, cluster, "ring:view");
}

void ps_key_ring_reports(char out[PS_KEY_MAX], const char *cluster, uint64_t epoch) {
  ps_cluster_key(out, cluster, "ring:at:%" PRIu64, epoch);
}

void ps_key_bench_table(char out[PS_KEY_MAX], const char *cluster, int table) {
  ps_cluster_key(out, cluster, "bench:table:%d", table);
}

static struct timeval tv_of(int64_t ms) {
  return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

/* Ask one Sentinel for the primary of master_name. */
static int ask_sentinel(const ps_config *cfg, const ps_addr *s, int64_t timeout_ms,
                        ps_addr *out, char *why, size_t len) {
  redisContext *c = redisConnectWithTimeout(s->host, s->port, tv_of(timeout_ms));
  if (c == NULL || c->err) {
    snprintf(why, len, "%s", c ? c->errstr : "out of memory");
    redisFree(c);
    return -1;
  }
  redisSetTimeout(c, tv_of(timeout_ms));
  redisReply *r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", cfg->redis_master_name);
  int rc = -1;
  if (r == NULL)
    snprintf(why, len, "%s", c->errstr);
  else if (r->type == REDIS_REPLY_ERROR)
    snprintf(why, len, "%s", r->str);
  else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
           r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
    snprintf(why, len, "it monitors no primary named '%s'", cfg->redis_master_name);
  else {
    char addr[300];
    snprintf(addr, sizeof addr, "%s:%s", r->element[0]->str, r->element[1]->str);
    rc = ps_addr_parse(addr, out);
    if (rc != 0)
      snprintf(why, len, "it named '%.200s', not host:port", addr);
  }
  freeReplyObject(r);
  redisFree(c);
  return rc;
}

int ps_redis_primary(const ps_config *cfg, int64_t timeout_ms, ps_addr *out, ps_errbuf *eb) {
  if (cfg->nsentinels == 0) {
    *out = cfg->redis;
    return 0;
  }
  char why[256] = "", a[300];
  for (int i = 0; i < cfg->nsentinels; i++)
    if (ask_sentinel(cfg, &cfg->redis_sentinels[i], timeout_ms, out, why, sizeof why) == 0)
      return 0;
  return ps_err_set(eb, -ECONNREFUSED, "no Sentinel named the primary '%s' (the last, %s: %s)",
                    cfg->redis_master_name,
                    ps_addr_format(&cfg->redis_sentinels[cfg->nsentinels - 1], a, sizeof a), why);
}

/* With Sentinels, the server must be the primary now: right after a
 * failover a Sentinel may still name the old one, now a replica. */
static int check_primary(redisContext *c, const ps_addr *at, ps_errbuf *eb) {
  redisReply *r = redisCommand(c, "ROLE");
  int ok = r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
           r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "master") == 0;
  if (!ok)
    ps_err_set(eb, -ECONNREFUSED, "redis %s:%u: not the primary (%s): a failover is under way",
               at->host, at->port,
               r == NULL ? c->errstr
               : r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
                       r->element[0]->type == REDIS_REPLY_STRING
                   ? r->element[0]->str
                   : "no role");
  freeReplyObject(r);
  return ok ? 0 : -1;
}

int ps_redis_auth_init(ps_redis_auth *a, const ps_config *cfg, ps_errbuf *eb) {
  a->argc = 0;
  int n = ps_config_read_redis_password(cfg, a->pw, sizeof a->pw, eb);
  if (n <= 0)
    return n;
  a->argv[a->argc++] = "AUTH";
  if (cfg->redis_user[0])
    a->argv[a->argc++] = cfg->redis_user;
  a->argv[a->argc++] = a->pw;
  return a->argc;
}

void ps_redis_auth_clear(ps_redis_auth *a) {
  memset(a->pw, 0, sizeof a->pw);
}

void *ps_redis_connect(const ps_config *cfg, int64_t timeout_ms, ps_errbuf *eb) {
  ps_addr at;
  if (ps_redis_primary(cfg, timeout_ms, &at, eb) != 0)
    return NULL;
  return ps_redis_connect_to(cfg, &at, timeout_ms, eb);
}

void *ps_redis_connect_to(const ps_config *cfg, const ps_addr *to, int64_t timeout_ms,
                          ps_errbuf *eb) {
  struct timeval tv = tv_of(timeout_ms);
  ps_addr at = *to;
  redisContext *c = redisConnectWithTimeout(at.host, at.port, tv);
  if (c == NULL || c->err) {
    ps_err_set(eb, -ECONNREFUSED, "redis %s:%u: %s", at.host, at.port,
               c ? c->errstr : "out of memory");
    redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, tv);
  ps_redis_auth auth;
  int argc = ps_redis_auth_init(&auth, cfg, eb);
  if (argc < 0) {
    eb->code = -EACCES;
    redisFree(c);
    return NULL;
  }
  if (argc > 0) {
    redisReply *r = redisCommandArgv(c, argc, auth.argv, NULL);
    ps_redis_auth_clear(&auth);
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
      /* A reply of NULL is the connection failing, not a refusal. */
      ps_err_set(eb, r ? -EACCES : -ECONNREFUSED, "redis %s:%u: AUTH%s%s failed: %s",
                 at.host, at.port, cfg->redis_user[0] ? " as " : "",
                 cfg->redis_user, r ? r->str : c->errstr);
      freeReplyObject(r);
      redisFree(c);
      return NULL;
    }
    freeReplyObject(r);
  }
  if (cfg->nsentinels > 0 && check_primary(c, &at, eb) != 0) {
    redisFree(c);
    return NULL;
  }
  return c;
}

int ps_redis_running_here(void) {
  DIR *d = opendir("/proc");
  if (d == NULL)
    return 0;
  int found = 0;
  struct dirent *de;
  while (!found && (de = readdir(d)) != NULL) {
    if (de->d_name[0] < '0' || de->d_name[0] > '9')
      continue;
    char path[300], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%s/comm", de->d_name);
    FILE *f = fopen(path, "re");
    if (f == NULL)
      continue;
    if (fgets(comm, sizeof comm, f) != NULL && strncmp(comm, "redis-server", 12) == 0)
      found = 1;
    fclose(f);
  }
  closedir(d);
  return found;
}

#define WAIT_SAY_NS (30 * 1000000000ULL)

void ps_redis_wait_failed(ps_redis_wait *w, const char *what, const char *why) {
  uint64_t now = ps_now_ns();
  w->attempts++;
  if (w->first_ns == 0) {
    w->first_ns = w->said_ns = now;
    const char *hint = "";
    if (strstr(why, "Connection refused") != NULL)
      hint = ps_redis_running_here()
                 ? "; nothing answers there, though a redis-server runs on this machine: is "
                   "[redis] address its address and port?"
                 : "; nothing answers there, and no redis-server runs on this machine "
                   "(systemctl start redis-server, or [redis] address names another's)";
    ps_log(PS_LOG_WARN, "waiting for Redis %s: %s%s; retrying, said again every 30 s", what, why,
           hint);
  } else if (now - w->said_ns >= WAIT_SAY_NS) {
    w->said_ns = now;
    ps_log(PS_LOG_WARN, "still waiting for Redis %s (%.0f s, %u attempts): %s", what,
           (double)(now - w->first_ns) * 1e-9, w->attempts, why);
  }
}
