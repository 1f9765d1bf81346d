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
  snprintf(k->rows_prefix, sizeof k->rows_prefix, "%s:rows:", k->tag);
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

/* Connect to one node and AUTH, nothing more.  NULL with eb set:
 * -ECONNREFUSED (unreachable), -EACCES (AUTH refused, password file). */
static redisContext *open_node(const ps_config *cfg, const ps_addr *at, int64_t timeout_ms,
                               ps_errbuf *eb);

int ps_redis_redirect(const void *reply, ps_addr *to) {
  const redisReply *r = reply;
  if (r == NULL || r->type != REDIS_REPLY_ERROR)
    return 0;
  int moved = strncmp(r->str, "MOVED ", 6) == 0, ask = strncmp(r->str, "ASK ", 4) == 0;
  if (!moved && !ask)
    return 0;
  /* "MOVED <slot> <host>:<port>" */
  const char *addr = strchr(r->str + (moved ? 6 : 4), ' ');
  if (addr == NULL || ps_addr_parse(addr + 1, to) != 0)
    return 0;
  return moved ? 1 : 2;
}

int ps_redis_slot_primary(const void *reply, long long slot, const ps_addr *asked, ps_addr *out,
                          char *why, size_t len) {
  const redisReply *r = reply;
  if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
    snprintf(why, len, "CLUSTER SLOTS: not a list");
    return -1;
  }
  for (size_t i = 0; i < r->elements; i++) {
    const redisReply *e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER ||
        e->element[0]->integer > slot || e->element[1]->integer < slot)
      continue;
    const redisReply *node = e->element[2];
    if (node->type != REDIS_REPLY_ARRAY || node->elements < 2 ||
        node->element[1]->type != REDIS_REPLY_INTEGER) {
      snprintf(why, len, "CLUSTER SLOTS: slot %lld's primary is not host, port", slot);
      return -1;
    }
    /* An empty or NULL host is the node asked (Redis's "unknown endpoint"). */
    const redisReply *h = node->element[0];
    const char *host = h->type == REDIS_REPLY_STRING && h->len > 0 ? h->str : asked->host;
    char addr[300];
    snprintf(addr, sizeof addr, strchr(host, ':') ? "[%.256s]:%lld" : "%.256s:%lld", host,
             node->element[1]->integer);
    if (ps_addr_parse(addr, out) != 0) {
      snprintf(why, len, "CLUSTER SLOTS named '%.200s', not host:port", addr);
      return -1;
    }
    return 0;
  }
  snprintf(why, len, "no node serves slot %lld: the cluster is failing over, or was never "
           "created (redis-cli --cluster create)", slot);
  return -1;
}

/* Ask one node of the Redis Cluster which primary serves tag's slot. */
static int ask_cluster(const ps_config *cfg, const ps_addr *seed, const char *tag,
                       int64_t timeout_ms, ps_addr *out, char *why, size_t len) {
  ps_errbuf eb = {0};
  redisContext *c = open_node(cfg, seed, timeout_ms, &eb);
  if (c == NULL) {
    snprintf(why, len, "%.200s", eb.msg);
    return -1;
  }
  int rc = -1;
  long long slot = -1;
  redisReply *r = redisCommand(c, "CLUSTER KEYSLOT %s", tag);
  if (r != NULL && r->type == REDIS_REPLY_INTEGER)
    slot = r->integer;
  else
    snprintf(why, len, "CLUSTER KEYSLOT: %s",
             r == NULL ? c->errstr : r->type == REDIS_REPLY_ERROR ? r->str : "no slot");
  freeReplyObject(r);
  r = slot < 0 ? NULL : redisCommand(c, "CLUSTER SLOTS");
  if (slot >= 0 && (r == NULL || r->type != REDIS_REPLY_ARRAY))
    snprintf(why, len, "CLUSTER SLOTS: %s",
             r == NULL ? c->errstr : r->type == REDIS_REPLY_ERROR ? r->str : "not a list");
  if (r != NULL && r->type == REDIS_REPLY_ARRAY)
    rc = ps_redis_slot_primary(r, slot, seed, out, why, len);
  freeReplyObject(r);
  redisFree(c);
  return rc;
}

int ps_redis_primary(const ps_config *cfg, const char *tag, int64_t timeout_ms, ps_addr *out,
                     ps_errbuf *eb) {
  char why[256] = "", a[300];
  if (cfg->ncluster > 0) {
    for (int i = 0; i < cfg->ncluster; i++) {
      why[0] = '\0';
      if (ask_cluster(cfg, &cfg->redis_cluster[i], tag, timeout_ms, out, why, sizeof why) == 0)
        return 0;
    }
    return ps_err_set(eb, -ECONNREFUSED, "no node of the Redis Cluster named the primary of %s "
                      "(the last asked, %s: %s)", tag,
                      ps_addr_format(&cfg->redis_cluster[cfg->ncluster - 1], a, sizeof a), why);
  }
  if (cfg->nsentinels == 0) {
    *out = cfg->redis;
    return 0;
  }
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

/* In a Redis Cluster, the node must serve tag's slot as its primary now:
 * a keyed read (EXISTS <tag>:epoch) answers there, and MOVED elsewhere
 * (a replica, another primary), which is followed to the node it names,
 * a few times.  @return the connection to the node that answered (c, or
 * one that replaced it; *at updated), or NULL with eb set. */
static redisContext *follow_slot(const ps_config *cfg, redisContext *c, const char *tag,
                                 ps_addr *at, int64_t timeout_ms, ps_errbuf *eb) {
  char key[PS_KEY_MAX];
  snprintf(key, sizeof key, "%s:epoch", tag);
  for (int hop = 0; hop < 4; hop++) {
    redisReply *r = redisCommand(c, "EXISTS %s", key);
    ps_addr to;
    int redirect = ps_redis_redirect(r, &to);
    if (r != NULL && r->type == REDIS_REPLY_INTEGER) {
      freeReplyObject(r);
      return c;
    }
    if (redirect == 1) {
      freeReplyObject(r);
      redisFree(c);
      *at = to;
      if ((c = open_node(cfg, at, timeout_ms, eb)) == NULL)
        return NULL;
      continue;
    }
    /* ASK (the slot is moving), CLUSTERDOWN, TRYAGAIN: retried later. */
    ps_err_set(eb, -ECONNREFUSED, "redis %s:%u: %s's slot: %s", at->host, at->port, tag,
               r == NULL ? c->errstr : r->type == REDIS_REPLY_ERROR ? r->str : "no answer");
    freeReplyObject(r);
    redisFree(c);
    return NULL;
  }
  ps_err_set(eb, -ECONNREFUSED, "redis %s:%u: %s's slot: still MOVED after 4 hops (the "
             "cluster is resharding)", at->host, at->port, tag);
  redisFree(c);
  return NULL;
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

void *ps_redis_connect(const ps_config *cfg, const char *tag, int64_t timeout_ms,
                       ps_errbuf *eb) {
  ps_addr at;
  if (ps_redis_primary(cfg, tag, timeout_ms, &at, eb) != 0)
    return NULL;
  return ps_redis_connect_to(cfg, tag, &at, timeout_ms, eb);
}

static redisContext *open_node(const ps_config *cfg, const ps_addr *at, int64_t timeout_ms,
                               ps_errbuf *eb) {
  struct timeval tv = tv_of(timeout_ms);
  redisContext *c = redisConnectWithTimeout(at->host, at->port, tv);
  if (c == NULL || c->err) {
    ps_err_set(eb, -ECONNREFUSED, "redis %s:%u: %s", at->host, at->port,
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
                 at->host, at->port, cfg->redis_user[0] ? " as " : "",
                 cfg->redis_user, r ? r->str : c->errstr);
      freeReplyObject(r);
      redisFree(c);
      return NULL;
    }
    freeReplyObject(r);
  }
  return c;
}

void *ps_redis_connect_to(const ps_config *cfg, const char *tag, const ps_addr *to,
                          int64_t timeout_ms, ps_errbuf *eb) {
  ps_addr at = *to;
  redisContext *c = open_node(cfg, &at, timeout_ms, eb);
  if (c == NULL)
    return NULL;
  if (cfg->nsentinels > 0 && check_primary(c, &at, eb) != 0) {
    redisFree(c);
    return NULL;
  }
  if (cfg->ncluster > 0)
    return follow_slot(cfg, c, tag, &at, timeout_ms, eb);
  return c;
}

void ps_cluster_tag(char out[PS_KEY_MAX], const char *cluster) {
  snprintf(out, PS_KEY_MAX, "{%s}", cluster);
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

const void *ps_redis_field(const void *reply, const char *field) {
  const redisReply *h = reply;
  for (size_t i = 0; i + 1 < h->elements; i += 2)
    if (h->element[i]->type == REDIS_REPLY_STRING && strcmp(h->element[i]->str, field) == 0)
      return h->element[i + 1];
  return NULL;
}

int ps_redis_field_u64(const void *reply, const char *field, uint64_t *out) {
  const redisReply *v = ps_redis_field(reply, field);
  if (v == NULL || v->type != REDIS_REPLY_STRING || v->len == 0)
    return -1;
  char *end;
  *out = strtoull(v->str, &end, 10);
  return *end == '\0' ? 0 : -1;
}
