/* The chief's lease (see lease.h). */
#include "chief/lease.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Renew if ours, take if free; either way report who holds it. */
static const char TAKE_SCRIPT[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if v == ARGV[1] or not v then\n"
    "  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return {1, ARGV[1]} end\n"
    "return {0, v}\n";

static const char RELEASE_SCRIPT[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n"
    "return 0\n";

void ps_lease_init(ps_lease *l, const char *cluster, uint64_t token, int64_t ms) {
  char host[128] = "?";
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  snprintf(l->key, sizeof l->key, "{%s}:chief", cluster);
  snprintf(l->value, sizeof l->value, "token %" PRIu64 " host %s pid %d", token, host,
           (int)getpid());
  l->token = token;
  l->ms = ms;
}

int ps_lease_take(const ps_lease *l, void *redis, char *holder, size_t holder_len) {
  char ms[32];
  snprintf(ms, sizeof ms, "%" PRId64, l->ms);
  redisReply *r = redisCommand(redis, "EVAL %s 1 %s %s %s", TAKE_SCRIPT, l->key, l->value, ms);
  if (r == NULL)
    return -1;
  int rc = -1;
  if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
      r->element[0]->type == REDIS_REPLY_INTEGER && r->element[1]->type == REDIS_REPLY_STRING) {
    rc = r->element[0]->integer == 1;
    snprintf(holder, holder_len, "%s", r->element[1]->str);
  }
  freeReplyObject(r);
  return rc;
}

static const char STEAL_SCRIPT[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
    "  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end\n"
    "return 0\n";

int ps_lease_holder_dead(const char *holder) {
  char host[128] = "?", their[128];
  unsigned long long token;
  int pid;
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  if (sscanf(holder, "token %llu host %127s pid %d", &token, their, &pid) != 3 || pid <= 0)
    return 0;
  if (strcmp(host, their) != 0 || pid == (int)getpid())
    return 0;
  if (kill(pid, 0) != 0)
    return errno == ESRCH;
  /* A zombie (killed, not yet reaped by its parent) is gone too. */
  char path[64], stat[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  size_t n = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[n] = '\0';
  const char *close = strrchr(stat, ')');
  return close != NULL && close[1] == ' ' && close[2] == 'Z';
}

int ps_lease_steal(const ps_lease *l, void *redis, const char *holder) {
  char ms[32];
  snprintf(ms, sizeof ms, "%" PRId64, l->ms);
  redisReply *r =
      redisCommand(redis, "EVAL %s 1 %s %s %s %s", STEAL_SCRIPT, l->key, holder, l->value, ms);
  if (r == NULL)
    return -1;
  int rc = r->type == REDIS_REPLY_INTEGER ? (int)r->integer : -1;
  freeReplyObject(r);
  return rc;
}

void ps_lease_release(const ps_lease *l, void *redis) {
  redisReply *r = redisCommand(redis, "EVAL %s 1 %s %s", RELEASE_SCRIPT, l->key, l->value);
  freeReplyObject(r);
}
