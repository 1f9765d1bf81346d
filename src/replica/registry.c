/* A process's own small records in Redis (see registry.h). */
#include "replica/registry.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/backoff.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "replica/keys.h"

#define POS_EVERY_NS 100000000ULL       /* 100 ms */
#define RECONNECT_EVERY_NS 1000000000ULL /* 1 s */

/* max(stored + 1, now in ms): atomic in Redis, so two starts never share
 * an epoch. */
static const char EPOCH_SCRIPT[] =
    "local e = tonumber(redis.call('GET', KEYS[1]) or '0') + 1\n"
    "local t = tonumber(ARGV[1])\n"
    "if t > e then e = t end\n"
    "redis.call('SET', KEYS[1], string.format('%d', e))\n"
    "return e\n";

int ps_redis_new_epoch(void *redis_context, const char *key, uint64_t *epoch, ps_errbuf *eb) {
  redisContext *c = redis_context;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char now[32];
  snprintf(now, sizeof now, "%lld", (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
  redisReply *r = redisCommand(c, "EVAL %s 1 %s %s", EPOCH_SCRIPT, key, now);
  int rc = 0;
  if (r != NULL && r->type == REDIS_REPLY_INTEGER)
    *epoch = (uint64_t)r->integer;
  else
    rc = ps_err_set(eb, r ? -EIO : -ECONNRESET, "redis: new epoch at %s: %s", key,
                    r ? (r->str ? r->str : "unexpected reply") : c->errstr);
  freeReplyObject(r);
  return rc;
}

struct ps_registry {
  const ps_config *cfg;
  char role[16];
  int index;
  redisContext *c;
  uint64_t epoch;
  uint64_t clock;    /* saved with the data position */
  uint64_t last_try_ns, last_pos_ns, last_hb_ns;
  int down_logged;
  char last_why[300];   /* why the last connection failed or was dropped */
  int auth_failed;   /* a refused AUTH is not worth retrying */
  char host[128];
};

ps_registry *ps_registry_new(const ps_config *cfg, const char *role, int index) {
  ps_registry *r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  r->cfg = cfg;
  snprintf(r->role, sizeof r->role, "%s", role);
  r->index = index;
  if (gethostname(r->host, sizeof r->host) != 0)
    snprintf(r->host, sizeof r->host, "?");
  r->host[sizeof r->host - 1] = '\0';
  return r;
}

void ps_registry_free(ps_registry *r) {
  if (r == NULL)
    return;
  redisFree(r->c);
  free(r);
}

/* Which Redis, for messages: [redis] address, or with Sentinels (a
 * Redis Cluster) the node they named (when connected) or how it is found. */
static const char *redis_name(const ps_registry *r, char *buf, size_t n) {
  const ps_config *cfg = r->cfg;
  if (cfg->nsentinels == 0 && cfg->ncluster == 0)
    snprintf(buf, n, "%s:%u", cfg->redis.host, cfg->redis.port);
  else if (r->c != NULL && r->c->tcp.host != NULL && cfg->ncluster > 0)
    snprintf(buf, n, "%s:%d (the cluster's node for {%s})", r->c->tcp.host, r->c->tcp.port,
             cfg->cluster_id);
  else if (r->c != NULL && r->c->tcp.host != NULL)
    snprintf(buf, n, "%s:%d (primary '%s')", r->c->tcp.host, r->c->tcp.port,
             cfg->redis_master_name);
  else if (cfg->ncluster > 0)
    snprintf(buf, n, "the Redis Cluster's node for {%s}", cfg->cluster_id);
  else
    snprintf(buf, n, "primary '%s' (from the Sentinels)", cfg->redis_master_name);
  return buf;
}

static void drop(ps_registry *r, const char *why) {
  char name[400];
  /* ps_redis_connect's messages name the address already. */
  snprintf(r->last_why, sizeof r->last_why, "%s", why);
  if (!r->down_logged && strncmp(why, "redis ", 6) == 0)
    ps_log(PS_LOG_WARN, "%s; this process goes on, its records wait until Redis is back", why);
  else if (!r->down_logged)
    ps_log(PS_LOG_WARN, "redis %s: %s; this process goes on, its records wait until Redis is "
           "back", redis_name(r, name, sizeof name), why);
  r->down_logged = 1;
  redisFree(r->c);
  r->c = NULL;
}

/* Connected, or NULL (at most one attempt per second while Redis is away). */
static redisContext *ctx(ps_registry *r, int wait) {
  if (r->c != NULL)
    return r->c;
  uint64_t now = ps_now_ns();
  if (!wait && now - r->last_try_ns < RECONNECT_EVERY_NS)
    return NULL;
  r->last_try_ns = now;
  /* Short: the worker calls this on its training path. */
  ps_errbuf eb = {0};
  char tag[PS_KEY_MAX];
  ps_cluster_tag(tag, r->cfg->cluster_id);
  redisContext *c = ps_redis_connect(r->cfg, tag, r->cfg->redis_timeout_ms < 500
                                                      ? r->cfg->redis_timeout_ms : 500, &eb);
  if (c == NULL) {
    r->auth_failed = eb.code == -EACCES;
    drop(r, eb.msg);
    return NULL;
  }
  r->c = c;
  char name[400];
  if (r->down_logged)
    ps_log(PS_LOG_INFO, "redis %s: connected again", redis_name(r, name, sizeof name));
  r->down_logged = 0;
  return c;
}

/* Run a command; NULL (and the connection dropped) when Redis is away. */
static redisReply *vcmd(ps_registry *r, int wait, const char *fmt, va_list ap) {
  redisContext *c = ctx(r, wait);
  if (c == NULL)
    return NULL;
  redisReply *rep = redisvCommand(c, fmt, ap);
  if (rep == NULL)
    drop(r, c->errstr);
  else if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "READONLY", 8) == 0)
    drop(r, "it is a replica now (READONLY): a failover");  /* the next call finds the primary */
  else if (ps_redis_redirect(rep, &(ps_addr){0}) == 1)
    drop(r, rep->str);  /* the cluster's slot moved: the next call asks where it is */
  return rep;
}

static redisReply *cmd(ps_registry *r, int wait, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  redisReply *rep = vcmd(r, wait, fmt, ap);
  va_end(ap);
  return rep;
}

void *ps_registry_command(ps_registry *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  redisReply *rep = vcmd(r, 0, fmt, ap);
  va_end(ap);
  return rep;
}

int ps_registry_new_epoch(ps_registry *r, volatile int *stop, uint64_t *epoch, ps_errbuf *eb) {
  char key[PS_KEY_MAX];
  ps_key_epoch(key, r->cfg->cluster_id, r->role, r->index);
  ps_backoff b;
  ps_backoff_init(&b, PS_REDIS_RETRY_BASE_MS, PS_REDIS_RETRY_CAP_MS, 0);
  ps_redis_wait wait = {0};
  char name[400];
  while (!*stop) {
    redisContext *c = ctx(r, 1);
    if (c == NULL && r->auth_failed)
      return ps_err_set(eb, -EACCES, "redis %s: AUTH%s%s failed (see [redis] user and "
                        "password_file in %s)", redis_name(r, name, sizeof name),
                        r->cfg->redis_user[0] ? " as " : "", r->cfg->redis_user, r->cfg->path);
    if (c != NULL) {
      int rc = ps_redis_new_epoch(c, key, epoch, eb);
      if (rc == 0) {
        r->epoch = *epoch;
        return 0;
      }
      /* An error reply (OOM, READONLY, MISCONF, NOREPLICAS, ...) is Redis
       * refusing writes for now, like Redis away: wait.  Not so a refused
       * login: that is this config's to fix. */
      if (strstr(eb->msg, "NOAUTH") != NULL || strstr(eb->msg, "WRONGPASS") != NULL)
        return rc;
      if (rc == -ECONNRESET || strstr(eb->msg, "READONLY") != NULL)
        drop(r, eb->msg);  /* lost, or a replica now: the next try finds the primary */
    }
    unsigned ms = ps_backoff_next(&b);
    char what[500];
    snprintf(what, sizeof what, "%s for this %s's incarnation", redis_name(r, name, sizeof name),
             r->role);
    ps_redis_wait_failed(&wait, what, c != NULL ? eb->msg : r->last_why);
    usleep(ms * 1000);
  }
  return ps_err_set(eb, -EINTR, "stopped while waiting for Redis");
}

void *ps_registry_redis(ps_registry *r, int wait) { return ctx(r, wait); }
const ps_config *ps_registry_config(const ps_registry *r) { return r->cfg; }

void ps_registry_lost(ps_registry *r, const char *why) { drop(r, why); }

int ps_registry_workers_alive(ps_registry *r, uint8_t *alive, int n) {
  const char *argv[1 + PS_CONFIG_MAX_NODES];
  char keys[PS_CONFIG_MAX_NODES][PS_KEY_MAX];
  argv[0] = "MGET";
  for (int j = 0; j < n && j < PS_CONFIG_MAX_NODES; j++) {
    ps_key_node(keys[j], r->cfg->cluster_id, "worker", j);
    argv[1 + j] = keys[j];
  }
  redisContext *c = ctx(r, 0);
  if (c == NULL)
    return -1;
  redisReply *rep = redisCommandArgv(c, 1 + n, argv, NULL);
  if (rep == NULL) {
    drop(r, c->errstr);
    return -1;
  }
  int ok = rep->type == REDIS_REPLY_ARRAY && rep->elements == (size_t)n;
  for (int j = 0; ok && j < n; j++)
    alive[j] = rep->element[j]->type == REDIS_REPLY_STRING;
  if (!ok && ps_redis_redirect(rep, &(ps_addr){0}) == 1)
    drop(r, rep->str);
  freeReplyObject(rep);
  return ok ? 0 : -1;
}

int ps_registry_get_pos(ps_registry *r, int worker, ps_data_pos *pos) {
  char key[PS_KEY_MAX];
  ps_key_worker_pos(key, r->cfg->cluster_id, worker);
  redisReply *rep = cmd(r, 1, "GET %s", key);
  int found = rep == NULL ? -1
              : rep->type == REDIS_REPLY_STRING &&
                      sscanf(rep->str, "%" SCNu64 " %" SCNu64, &pos->epoch, &pos->offset) == 2
                  ? 1
                  : 0;
  freeReplyObject(rep);
  return found;
}

int ps_registry_set_pos(ps_registry *r, int worker, const ps_data_pos *pos) {
  char value[48];
  snprintf(value, sizeof value, "%" PRIu64 " %" PRIu64, pos->epoch, pos->offset);
  char key[PS_KEY_MAX];
  ps_key_worker_pos(key, r->cfg->cluster_id, worker);
  redisReply *rep = cmd(r, 1, "SET %s %s", key, value);
  int ok = rep != NULL && rep->type != REDIS_REPLY_ERROR;
  freeReplyObject(rep);
  return ok ? 0 : -1;
}

/* The done key's value (a GET's reply, or MGET's element): 1 found, 0 none
 * (or not a value), -1 no reply. */
static int parse_done(const redisReply *rep, uint64_t *step, int *nonfinite) {
  int found = rep == NULL ? -1
              : rep->type == REDIS_REPLY_STRING && sscanf(rep->str, "%" SCNu64, step) == 1 ? 1
                                                                                          : 0;
  if (found == 1)
    *nonfinite = strstr(rep->str, "nonfinite") != NULL;
  return found;
}

static int parse_token(const redisReply *rep, uint64_t *token) {
  return rep == NULL ? -1
         : rep->type == REDIS_REPLY_STRING && sscanf(rep->str, "%" SCNu64, token) == 1 ? 1
                                                                                       : 0;
}

int ps_registry_get_done(ps_registry *r, uint64_t *step, int *nonfinite) {
  char key[PS_KEY_MAX];
  ps_key_done(key, r->cfg->cluster_id);
  redisReply *rep = cmd(r, 1, "GET %s", key);
  int found = parse_done(rep, step, nonfinite);
  freeReplyObject(rep);
  return found;
}

/* Has a run that ended at `step` (found: 1) ended for this config? */
static int ended_at(const ps_registry *r, int found, uint64_t step, int nonfinite) {
  if (found != 1)
    return 0;
  if (nonfinite) {
    ps_log(PS_LOG_INFO, "the run was stopped at global step %" PRIu64 " (non-finite weights; "
           "{%s}:done in Redis): nothing to do", step, r->cfg->cluster_id);
    return 1;
  }
  if (r->cfg->last_step > 0 && (uint64_t)r->cfg->last_step > step)
    return 0;  /* last_step was raised: the run goes on */
  ps_log(PS_LOG_INFO, "the run already ended at global step %" PRIu64 " ({%s}:done in Redis): "
         "nothing to do", step, r->cfg->cluster_id);
  return 1;
}

int ps_registry_run_ended(ps_registry *r) {
  uint64_t step = 0;
  int nonfinite = 0;
  int found = ps_registry_get_done(r, &step, &nonfinite);
  return ended_at(r, found, step, nonfinite);
}

int ps_registry_run_ended_token(ps_registry *r, uint64_t *token, int *token_found) {
  char done[PS_KEY_MAX], epoch[PS_KEY_MAX];
  ps_key_done(done, r->cfg->cluster_id);
  ps_key_epoch(epoch, r->cfg->cluster_id, "chief", 0);
  /* One slot (the cluster's hash tag): one MGET. */
  redisReply *rep = cmd(r, 1, "MGET %s %s", done, epoch);
  uint64_t step = 0;
  int nonfinite = 0, found = -1;
  *token_found = -1;
  if (rep != NULL && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2) {
    found = parse_done(rep->element[0], &step, &nonfinite);
    *token_found = parse_token(rep->element[1], token);
  }
  freeReplyObject(rep);
  return ended_at(r, found, step, nonfinite);
}

int ps_registry_set_done(ps_registry *r, uint64_t step, int nonfinite) {
  char value[48];
  snprintf(value, sizeof value, "%" PRIu64 "%s", step, nonfinite ? " nonfinite" : "");
  /* One argument: hiredis splits the format at its own spaces, never an
   * interpolated string's. */
  char key[PS_KEY_MAX];
  ps_key_done(key, r->cfg->cluster_id);
  redisReply *rep = cmd(r, 1, "SET %s %s", key, value);
  int ok = rep != NULL && rep->type != REDIS_REPLY_ERROR;
  freeReplyObject(rep);
  return ok ? 0 : -1;
}

int ps_registry_clear_done(ps_registry *r) {
  char key[PS_KEY_MAX];
  ps_key_done(key, r->cfg->cluster_id);
  redisReply *rep = cmd(r, 1, "DEL %s", key);
  int ok = rep != NULL && rep->type != REDIS_REPLY_ERROR;
  freeReplyObject(rep);
  return ok ? 0 : -1;
}

int ps_registry_load_pos(ps_registry *r, ps_data_pos *pos, uint64_t *clock) {
  char key[PS_KEY_MAX];
  ps_key_worker_pos(key, r->cfg->cluster_id, r->index);
  redisReply *rep = cmd(r, 1, "GET %s", key);
  *clock = 0;
  /* "<epoch> <offset>" (REDIS.md §10) or "<epoch> <offset> <clock>". */
  int found = rep != NULL && rep->type == REDIS_REPLY_STRING &&
              sscanf(rep->str, "%" SCNu64 " %" SCNu64 " %" SCNu64, &pos->epoch, &pos->offset,
                     clock) >= 2;
  freeReplyObject(rep);
  return found;
}

void ps_registry_set_clock(ps_registry *r, uint64_t clock) { r->clock = clock; }

void ps_registry_tick(ps_registry *r, const ps_data_pos *pos, uint64_t step, double steps_per_s,
                      int force) {
  uint64_t now = ps_now_ns();
  if (pos != NULL && (force || now - r->last_pos_ns >= POS_EVERY_NS)) {
    r->last_pos_ns = now;
    char value[72];
    snprintf(value, sizeof value, "%" PRIu64 " %" PRIu64 " %" PRIu64, pos->epoch, pos->offset,
             r->clock);
    char key[PS_KEY_MAX];
    ps_key_worker_pos(key, r->cfg->cluster_id, r->index);
    redisReply *rep = cmd(r, force, "SET %s %s", key, value);
    if (rep != NULL && rep->type == REDIS_REPLY_ERROR)
      ps_log(PS_LOG_WARN, "redis: saving the data position: %s", rep->str);
    freeReplyObject(rep);
  }
  uint64_t every = (uint64_t)r->cfg->heartbeat_ms * 1000000ULL;
  if (force || now - r->last_hb_ns >= every) {
    r->last_hb_ns = now;
    char payload[256];
    snprintf(payload, sizeof payload,
             "pid %d host %s incarnation %" PRIu64 " step %" PRIu64 " steps/s %.1f", (int)getpid(),
             r->host, r->epoch, step, steps_per_s);
    char key[PS_KEY_MAX];
    ps_key_node(key, r->cfg->cluster_id, r->role, r->index);
    redisReply *rep = cmd(r, 0, "SET %s %s PX %" PRId64, key, payload, 3 * r->cfg->heartbeat_ms);
    freeReplyObject(rep);
  }
}
