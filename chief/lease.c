/* The chief's lease (see lease.h). */
#include "chief/lease.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "replica/keys.h"
#include "replica/registry.h"

/* Renew if ours; take if free, with a new token: max(stored epoch + 1, now
 * in ms), stored back, so that each holder's token is higher than every
 * earlier holder's (the order of taking, not of starting).  Either way
 * report who holds it.  KEYS: the lease, the chief's epoch; ARGV: our value
 * ("" before we hold it), the time to live, "host H pid P", now in ms. */
static const char TAKE_SCRIPT[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if v and v == ARGV[1] then\n"
    "  redis.call('SET', KEYS[1], v, 'PX', ARGV[2]) return {1, v} end\n"
    "if v then return {0, v} end\n"
    "local e = tonumber(redis.call('GET', KEYS[2]) or '0') + 1\n"
    "local t = tonumber(ARGV[4])\n"
    "if t > e then e = t end\n"
    "redis.call('SET', KEYS[2], string.format('%d', e))\n"
    "local nv = 'token ' .. string.format('%d', e) .. ' ' .. ARGV[3]\n"
    "redis.call('SET', KEYS[1], nv, 'PX', ARGV[2])\n"
    "return {1, nv}\n";

static const char RELEASE_SCRIPT[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n"
    "return 0\n";

void ps_lease_init(ps_lease *l, const char *cluster, int64_t ms) {
  char host[128] = "?";
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  memset(l, 0, sizeof *l);
  ps_key_chief_lease(l->key, cluster);
  ps_key_epoch(l->epoch_key, cluster, "chief", 0);
  snprintf(l->who, sizeof l->who, "host %s pid %d", host, (int)getpid());
  l->ms = ms;
}

int ps_lease_take(ps_lease *l, void *redis, char *holder, size_t holder_len) {
  char ms[32], now[32];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(ms, sizeof ms, "%" PRId64, l->ms);
  snprintf(now, sizeof now, "%lld", (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
  redisReply *r = redisCommand(redis, "EVAL %s 2 %s %s %s %s %s %s", TAKE_SCRIPT, l->key,
                               l->epoch_key, l->value, ms, l->who, now);
  if (r == NULL)
    return -1;
  int rc = -1;
  unsigned long long token;
  if (r->type == REDIS_REPLY_ERROR)
    snprintf(holder, holder_len, "%s", r->str);  /* Redis's own words: OOM, NOPERM, ... */
  if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
      r->element[0]->type == REDIS_REPLY_INTEGER && r->element[1]->type == REDIS_REPLY_STRING) {
    rc = r->element[0]->integer == 1;
    snprintf(holder, holder_len, "%s", r->element[1]->str);
    if (rc == 1 && strcmp(l->value, r->element[1]->str) != 0) {
      if (sscanf(r->element[1]->str, "token %llu ", &token) == 1) {
        snprintf(l->value, sizeof l->value, "%s", r->element[1]->str);
        l->token = token;
      } else {
        rc = -1;
      }
    }
  }
  freeReplyObject(r);
  return rc;
}

int ps_lease_check(const ps_lease *l, void *redis, char *holder, size_t holder_len) {
  redisReply *r = redisCommand(redis, "GET %s", l->key);
  if (r == NULL)
    return -1;
  int rc = -1;
  if (r->type == REDIS_REPLY_STRING) {
    rc = strcmp(r->str, l->value) == 0;
    snprintf(holder, holder_len, "%s", r->str);
  } else if (r->type == REDIS_REPLY_NIL) {
    rc = 0;
    snprintf(holder, holder_len, "nobody");
  }
  freeReplyObject(r);
  return rc;
}

int ps_lease_release(const ps_lease *l, void *redis) {
  redisReply *r = redisCommand(redis, "EVAL %s 1 %s %s", RELEASE_SCRIPT, l->key, l->value);
  int rc = r == NULL ? -1 : r->type == REDIS_REPLY_INTEGER ? r->integer == 1 : -1;
  freeReplyObject(r);
  return rc;
}

int ps_lease_fence_check(void *arg, char *why, size_t len) {
  ps_lease_fence *f = arg;
  void *c = ps_registry_redis(f->reg, 1);
  char holder[256] = "";
  int rc = c != NULL ? ps_lease_check(f->lease, c, holder, sizeof holder) : -1;
  if (rc == 1)
    return 0;
  if (rc < 0 && c != NULL)
    ps_registry_lost(f->reg, "lease check got no reply");
  if (rc == 0)
    snprintf(why, len, "this chief (token %" PRIu64 ") no longer holds the lease %s (held by: %s)",
             f->lease->token, f->lease->key, holder);
  else
    snprintf(why, len, "this chief (token %" PRIu64 ") cannot confirm the lease %s: Redis did not "
             "answer", f->lease->token, f->lease->key);
  return -1;
}
