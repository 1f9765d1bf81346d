/* The ring's membership in Redis (see view.h). */
#include "ring/view.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/parse.h"
#include "replica/keys.h"

/* KEYS[1] the view.  ARGV[1] the expected epoch, ARGV[2] the members.  The
 * new view is written only while the current one is the expected one, or
 * when there is none: then it is numbered above the expected one, so that
 * a Redis that lost its data never gives an old number again to a member
 * that still knows it. */
static const char PROPOSE_SCRIPT[] =
    "local cur = redis.call('GET', KEYS[1]) "
    "local e = 0 "
    "if cur then e = tonumber(string.match(cur, '^%d+')) end "
    "local want = tonumber(ARGV[1]) "
    "if cur and e ~= want then return {0, cur} end "
    "if want > e then e = want end "
    "local v = tostring(e + 1) .. ' ' .. ARGV[2] "
    "redis.call('SET', KEYS[1], v) "
    "return {1, v}";

/* Views of this long ago are reported no more: their reports expire. */
#define REPORT_TTL_MS 600000

/* A command's reply, NULL when Redis is away or answers with an error. */
#define command(reg, ...) reply_ok(ps_registry_command((reg), __VA_ARGS__))

static redisReply *reply_ok(redisReply *rep) {
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR) {
    freeReplyObject(rep);
    return NULL;
  }
  return rep;
}

static int cmp_int(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

static int parse(const char *s, int nworkers, ps_view *v) {
  char *end;
  memset(v, 0, sizeof *v);
  if (*s < '0' || *s > '9') /* strtoull would skip spaces and take a sign */
    return -1;
  errno = 0;
  v->epoch = strtoull(s, &end, 10);
  if (*end != ' ' || v->epoch == 0 || errno == ERANGE)
    return -1;
  s = end + 1;
  while (*s) {
    if (*s < '0' || *s > '9')
      return -1;
    long m = strtol(s, &end, 10);
    if (end == s || m < 0 || m >= nworkers || v->n >= PS_CONFIG_MAX_NODES ||
        (v->n > 0 && m <= v->members[v->n - 1]) || (*end != ',' && *end != '\0'))
      return -1;
    v->members[v->n++] = (int)m;
    if (*end == ',' && end[1] == '\0')
      return -1; /* a trailing comma */
    s = *end == ',' ? end + 1 : end;
  }
  return v->n > 0 ? 0 : -1;
}

int ps_view_parse(const char *text, int nworkers, ps_view *v) {
  if (parse(text, nworkers, v) == 0)
    return 0;
  memset(v, 0, sizeof *v);
  return -1;
}

int ps_view_get(ps_registry *reg, ps_view *v) {
  char key[PS_KEY_MAX];
  ps_key_ring_view(key, ps_registry_config(reg)->cluster_id);
  redisReply *rep = command(reg, "GET %s", key);
  if (rep == NULL)
    return -1;
  int rc = rep->type == REDIS_REPLY_STRING && ps_view_parse(rep->str, ps_registry_config(reg)->nworkers, v) == 0 ? 1 : 0;
  if (rc == 0)
    memset(v, 0, sizeof *v);
  freeReplyObject(rep);
  return rc;
}

int ps_view_propose(ps_registry *reg, uint64_t expected, const int *members, int n, ps_view *v) {
  int sorted[PS_CONFIG_MAX_NODES];
  memcpy(sorted, members, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_int);
  char list[PS_CONFIG_MAX_NODES * 4 + 1] = "", key[PS_KEY_MAX], want[24];
  size_t at = 0;
  for (int i = 0; i < n; i++)
    at += (size_t)snprintf(list + at, sizeof list - at, "%s%d", i ? "," : "", sorted[i]);
  ps_key_ring_view(key, ps_registry_config(reg)->cluster_id);
  snprintf(want, sizeof want, "%" PRIu64, expected);
  redisReply *rep = command(reg, "EVAL %s 1 %s %s %s", PROPOSE_SCRIPT, key, want, list);
  if (rep == NULL)
    return -1;
  int rc = -1;
  if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
      rep->element[0]->type == REDIS_REPLY_INTEGER && rep->element[1]->type == REDIS_REPLY_STRING &&
      ps_view_parse(rep->element[1]->str, ps_registry_config(reg)->nworkers, v) == 0)
    rc = rep->element[0]->integer == 1;
  freeReplyObject(rep);
  return rc;
}

int ps_view_live(ps_registry *reg, int *live) {
  const ps_config *cfg = ps_registry_config(reg);
  redisContext *c = ps_registry_redis(reg, 0);
  if (c == NULL)
    return -1;
  char key[PS_KEY_MAX];
  for (int j = 0; j < cfg->nworkers; j++) {
    ps_key_node(key, cfg->cluster_id, "worker", j);
    redisAppendCommand(c, "EXISTS %s", key);
  }
  int count = 0, rc = 0;
  for (int j = 0; j < cfg->nworkers; j++) {
    redisReply *rep = NULL;
    if (redisGetReply(c, (void **)&rep) != REDIS_OK || rep == NULL) {
      ps_registry_lost(reg, c->errstr);
      return -1;
    }
    live[j] = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
    if (rep->type == REDIS_REPLY_ERROR)
      rc = -1;
    count += live[j];
    freeReplyObject(rep);
  }
  return rc < 0 ? -1 : count;
}

int ps_view_report(ps_registry *reg, uint64_t epoch, int rank, uint64_t step, int holds) {
  char key[PS_KEY_MAX];
  ps_key_ring_reports(key, ps_registry_config(reg)->cluster_id, epoch);
  redisReply *rep = command(reg, "HSET %s %d %" PRIu64 ":%d", key, rank, step, holds ? 1 : 0);
  if (rep == NULL)
    return -1;
  freeReplyObject(rep);
  rep = command(reg, "PEXPIRE %s %d", key, REPORT_TTL_MS);
  if (rep == NULL)
    return -1;
  freeReplyObject(rep);
  return 0;
}

int ps_view_reports(ps_registry *reg, const ps_view *v, uint64_t *steps, int *holds) {
  char key[PS_KEY_MAX];
  ps_key_ring_reports(key, ps_registry_config(reg)->cluster_id, v->epoch);
  for (int i = 0; i < v->n; i++)
    steps[i] = UINT64_MAX;
  redisReply *rep = command(reg, "HGETALL %s", key);
  if (rep == NULL)
    return -1;
  if (rep->type == REDIS_REPLY_ARRAY)
    for (size_t k = 0; k + 1 < rep->elements; k += 2) {
      int rank = atoi(rep->element[k]->str);
      char *end;
      uint64_t step = strtoull(rep->element[k + 1]->str, &end, 10);
      for (int i = 0; i < v->n; i++)
        if (v->members[i] == rank) {
          steps[i] = step;
          holds[i] = strcmp(end, ":0") != 0;
        }
    }
  freeReplyObject(rep);
  return 0;
}

int ps_view_has(const ps_view *v, int rank) {
  for (int i = 0; i < v->n; i++)
    if (v->members[i] == rank)
      return 1;
  return 0;
}

const char *ps_view_format(const ps_view *v, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "%" PRIu64 ":", v->epoch);
  for (int i = 0; i < v->n && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s%d", i ? "," : " ", v->members[i]);
  return buf;
}
