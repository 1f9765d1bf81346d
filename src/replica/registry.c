/* A process's own small records in Redis (see registry.h). */
#include "replica/registry.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"

#define POS_EVERY_NS 100000000ULL       /* 100 ms */
#define RECONNECT_EVERY_NS 1000000000ULL /* 1 s */

struct ps_registry {
  const ps_config *cfg;
  char role[16];
  int index;
  redisContext *c;
  uint64_t epoch;
  uint64_t last_try_ns, last_pos_ns, last_hb_ns;
  int down_logged;
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

static void drop(ps_registry *r, const char *why) {
  if (!r->down_logged)
    ps_log(PS_LOG_WARN, "redis %s:%u: %s; training on, records not saved until it is back",
           r->cfg->redis.host, r->cfg->redis.port, why);
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
  struct timeval tv = {.tv_sec = 0, .tv_usec = 500000};
  redisContext *c = redisConnectWithTimeout(r->cfg->redis.host, r->cfg->redis.port, tv);
  if (c == NULL || c->err) {
    r->c = c;
    drop(r, c ? c->errstr : "out of memory");
    return NULL;
  }
  redisSetTimeout(c, tv);
  char pw[512];
  ps_errbuf eb = {0};
  if (ps_config_read_redis_password(r->cfg, pw, sizeof pw, &eb) > 0) {
    redisReply *a = r->cfg->redis_user[0] ? redisCommand(c, "AUTH %s %s", r->cfg->redis_user, pw)
                                          : redisCommand(c, "AUTH %s", pw);
    memset(pw, 0, sizeof pw);
    int bad = a == NULL || a->type == REDIS_REPLY_ERROR;
    freeReplyObject(a);
    if (bad) {
      r->c = c;
      drop(r, "AUTH failed");
      return NULL;
    }
  }
  if (r->down_logged)
    ps_log(PS_LOG_INFO, "redis %s:%u: connected again", r->cfg->redis.host, r->cfg->redis.port);
  r->down_logged = 0;
  r->c = c;
  return c;
}

/* Run a command; NULL (and the connection dropped) when Redis is away. */
static redisReply *cmd(ps_registry *r, int wait, const char *fmt, ...) {
  redisContext *c = ctx(r, wait);
  if (c == NULL)
    return NULL;
  va_list ap;
  va_start(ap, fmt);
  redisReply *rep = redisvCommand(c, fmt, ap);
  va_end(ap);
  if (rep == NULL)
    drop(r, c->errstr);
  return rep;
}

int ps_registry_new_epoch(ps_registry *r, volatile int *stop, uint64_t *epoch, ps_errbuf *eb) {
  for (int attempt = 0; !*stop; attempt++) {
    redisReply *rep = cmd(r, 1, "INCR {%s}:epoch:%s:%d", r->cfg->cluster_id, r->role, r->index);
    if (rep != NULL && rep->type == REDIS_REPLY_INTEGER) {
      r->epoch = *epoch = (uint64_t)rep->integer;
      freeReplyObject(rep);
      return 0;
    }
    if (rep != NULL) {
      int rc = ps_err_set(eb, -EIO, "redis: INCR epoch: %s", rep->str ? rep->str : "bad reply");
      freeReplyObject(rep);
      return rc;
    }
    unsigned ms = 100u << (attempt < 4 ? attempt : 4);
    ps_log(PS_LOG_WARN, "waiting for Redis %s:%u for this %s's incarnation; retry in %u ms",
           r->cfg->redis.host, r->cfg->redis.port, r->role, ms);
    usleep(ms * 1000);
  }
  return ps_err_set(eb, -EINTR, "stopped while waiting for Redis");
}

int ps_registry_load_pos(ps_registry *r, ps_data_pos *pos) {
  redisReply *rep = cmd(r, 1, "GET {%s}:pos:%s:%d", r->cfg->cluster_id, r->role, r->index);
  int found = rep != NULL && rep->type == REDIS_REPLY_STRING &&
              sscanf(rep->str, "%" SCNu64 " %" SCNu64, &pos->epoch, &pos->offset) == 2;
  freeReplyObject(rep);
  return found;
}

void ps_registry_tick(ps_registry *r, const ps_data_pos *pos, uint64_t step, double steps_per_s,
                      int force) {
  uint64_t now = ps_now_ns();
  if (force || now - r->last_pos_ns >= POS_EVERY_NS) {
    r->last_pos_ns = now;
    char value[48];
    snprintf(value, sizeof value, "%" PRIu64 " %" PRIu64, pos->epoch, pos->offset);
    redisReply *rep = cmd(r, force, "SET {%s}:pos:%s:%d %s", r->cfg->cluster_id, r->role,
                          r->index, value);
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
    redisReply *rep = cmd(r, 0, "SET {%s}:node:%s:%d %s PX %" PRId64, r->cfg->cluster_id, r->role,
                          r->index, payload, 3 * r->cfg->heartbeat_ms);
    freeReplyObject(rep);
  }
}
