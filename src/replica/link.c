/* A shard's run-time connection to Redis (see link.h, REDIS.md §8). */
#include "replica/link.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "replica/redis_uv.h"

/* Which of this shard's keys Redis no longer holds as this incarnation
 * left them, into `lost` (the start of both scripts below): the epoch (a
 * larger one is a newer incarnation: FENCED), the log key naming this
 * incarnation's stream, the stream, and, once Redis held a snapshot of
 * this state, the meta and every chunk it names.  A newer incarnation
 * changes the epoch first, so what is missing under this epoch was lost:
 * FLUSHALL, FLUSHDB, a failover to a node without it, a DEL, an eviction.
 * KEYS: epoch, logkey, log, meta.  ARGV: epoch, meta expected (0/1),
 * chunk key prefix. */
#define KEYS_CHECK                                                                   \
  "local lost = {}\n"                                                               \
  "local e = redis.call('GET', KEYS[1])\n"                                          \
  "if e ~= ARGV[1] then\n"                                                          \
  "  if e ~= false and tonumber(e) > tonumber(ARGV[1]) then\n"                      \
  "    return redis.error_reply('FENCED epoch is ' .. e) end\n"                     \
  "  lost[#lost + 1] = 'epoch' end\n"                                               \
  "if redis.call('GET', KEYS[2]) ~= KEYS[3] then lost[#lost + 1] = 'logkey' end\n"  \
  "if redis.call('EXISTS', KEYS[3]) == 0 then lost[#lost + 1] = 'log stream' end\n" \
  "if ARGV[2] == '1' then\n"                                                        \
  "  local m = redis.call('HMGET', KEYS[4], 'snap', 'chunks', 'merged', 'deltas')\n" \
  "  if not m[1] then lost[#lost + 1] = 'meta'\n"                                   \
  "  else for k = 0, (tonumber(m[2]) or 0) - 1 do\n"                               \
  "    if redis.call('EXISTS', ARGV[3] .. m[1] .. ':' .. k) == 0 then\n"            \
  "      lost[#lost + 1] = 'snapshot chunks' break end end\n"                      \
  "    for k = tonumber(m[3]) or 0, (tonumber(m[4]) or 0) - 1 do\n"                \
  "    if redis.call('EXISTS', ARGV[3] .. m[1] .. ':d' .. k) == 0 then\n"           \
  "      lost[#lost + 1] = 'delta chunks' break end end end end\n"

/* On every (re)connection: claim back what was lost (a snapshot follows).
 * Returns OK, or CLAIMED and what was lost.  KEYS and ARGV: KEYS_CHECK's. */
static const char CLAIM_SCRIPT[] =
    KEYS_CHECK
    "if #lost == 0 then return 'OK' end\n"
    "redis.call('SET', KEYS[1], ARGV[1])\n"
    "if redis.call('EXISTS', KEYS[3]) == 0 then\n"
    "  redis.call('XGROUP', 'CREATE', KEYS[3], 'g', '$', 'MKSTREAM')\n"
    "  redis.call('XGROUP', 'DESTROY', KEYS[3], 'g') end\n"
    "redis.call('SET', KEYS[2], KEYS[3])\n"
    "return 'CLAIMED ' .. table.concat(lost, ', ')\n";

/* The heartbeat, written only while every key holds: how an idle stale
 * incarnation learns it is one, and a live one that Redis lost its keys
 * (LOST: it reconnects, claims them back and writes a full snapshot).
 * KEYS: KEYS_CHECK's, node.  ARGV: KEYS_CHECK's, payload, ttl ms. */
static const char HEARTBEAT_SCRIPT[] =
    KEYS_CHECK
    "if #lost > 0 then return redis.error_reply('LOST ' .. table.concat(lost, ', ')) end\n"
    "return redis.call('SET', KEYS[5], ARGV[4], 'PX', ARGV[5])\n";

static void link_connect(ps_link *l);
static void connect_to_primary(ps_link *l);

void ps_link_init(ps_link *l, uv_loop_t *loop, const ps_config *cfg, int index, uint64_t epoch,
                  const ps_shard_keys *k, int meta_expected, const ps_link_events *ev) {
  memset(l, 0, sizeof *l);
  l->loop = loop;
  l->cfg = cfg;
  l->k = k;
  l->index = index;
  l->epoch = epoch;
  snprintf(l->epoch_text, sizeof l->epoch_text, "%" PRIu64, epoch);
  l->ev = *ev;
  l->meta_expected = meta_expected;
  l->wait_replicas = ps_config_redis_replicas(cfg);
  l->at = cfg->redis;
  /* Reconnects never wait longer than one replication interval, so that a
   * Redis that is back is current again within two. */
  unsigned interval = (unsigned)cfg->replicate_interval_ms, cap = PS_LINK_BACKOFF_CAP_MS;
  cap = interval < cap ? (interval > 2 ? interval : 2) : cap;
  ps_backoff_init(&l->backoff, cap < 100 ? cap : 100, cap, 0);
  uv_timer_init(loop, &l->retry);
  l->retry.data = l;
  l->retry_open = 1;
}

redisAsyncContext *ps_link_ac(const ps_link *l) { return l->ac; }
int ps_link_up(const ps_link *l) { return l->state == PS_LINK_UP; }
int ps_link_fenced(const ps_link *l) { return l->state == PS_LINK_FENCED; }
int ps_link_busy(const ps_link *l) { return l->ac != NULL || l->resolving || l->retry_open; }

void ps_link_fence(ps_link *l, const char *why) {
  if (l->state == PS_LINK_FENCED)
    return;
  l->state = PS_LINK_FENCED;
  ps_log(PS_LOG_ERROR, "shard %d epoch %" PRIu64 " fenced out by Redis: %s", l->index, l->epoch,
         why);
  l->ev.fenced(l->ev.arg, why);
}

int ps_link_is_fenced(const redisReply *rep) {
  return rep != NULL && rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "FENCED", 6) == 0;
}

static void on_retry_timer(uv_timer_t *t) { link_connect(t->data); }

static void schedule_reconnect(ps_link *l) {
  if (l->closing || l->state == PS_LINK_FENCED)
    return;
  uv_timer_start(&l->retry, on_retry_timer, ps_backoff_next(&l->backoff), 0);
}

/* The connection is gone (lost, refused, or past its deadline).  The
 * owner's down comes last: it may free the link. */
static void went_down(ps_link *l, const char *why) {
  int was_up = l->state == PS_LINK_UP;
  l->ac = NULL;
  if (l->state != PS_LINK_FENCED)
    l->state = PS_LINK_DOWN;
  if (!l->closing && (was_up || !l->down_logged))
    ps_log(PS_LOG_WARN, "redis %s:%u: %s; serving on and reconnecting", l->at.host,
           l->at.port, why);
  l->down_logged = 1;
  schedule_reconnect(l);
  l->ev.down(l->ev.arg);
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  ps_link *l = ac->data;
  char why[256];
  snprintf(why, sizeof why, "%s", l->drop_why[0] ? l->drop_why
                                  : status == REDIS_OK ? "connection closed"
                                  : ac->errstr[0] ? ac->errstr : "connection lost");
  l->drop_why[0] = '\0';
  went_down(l, why);
}

static void on_connect(const redisAsyncContext *ac, int status) {
  ps_link *l = ac->data;
  if (status == REDIS_OK)
    return;  /* AUTH and CLAIM are already queued behind the connect */
  /* hiredis frees the context after this callback. */
  went_down(l, ac->errstr[0] ? ac->errstr : "cannot connect");
}

static void on_deadline(redisAsyncContext *ac, void *owner) {
  ps_link *l = owner;
  int connected = (ac->c.flags & REDIS_CONNECTED) != 0;
  char why[96];
  snprintf(why, sizeof why, "no answer within %" PRId64 " ms ([redis] timeout_ms)",
           l->cfg->redis_timeout_ms);
  if (connected) {
    /* Pending callbacks run with NULL replies, then on_disconnect. */
    snprintf(l->drop_why, sizeof l->drop_why, "%s", why);
    redisAsyncFree(ac);
  } else {
    redisAsyncFree(ac);
    went_down(l, why);
  }
}

static void on_claimed(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_link *l = priv;
  redisReply *rep = reply;
  if (rep == NULL)
    return;  /* disconnected again: on_disconnect handles it */
  if (ps_link_is_fenced(rep)) {
    ps_link_fence(l, rep->str);
    return;
  }
  ps_addr to;
  if (ps_redis_redirect(rep, &to) == 1) {
    /* The cluster serves the slot elsewhere: straight there next. */
    l->moved = 1;
    l->moved_to = to;
    snprintf(l->drop_why, sizeof l->drop_why, "%.150s (MOVED)", rep->str);
    redisAsyncDisconnect(l->ac);
    return;
  }
  if (rep->type == REDIS_REPLY_ERROR) {
    ps_log(PS_LOG_WARN, "redis: epoch check failed: %s", rep->str);
    redisAsyncDisconnect(l->ac);
    return;
  }
  l->state = PS_LINK_UP;
  ps_backoff_reset(&l->backoff);
  int claimed = (rep->type == REDIS_REPLY_STATUS || rep->type == REDIS_REPLY_STRING) &&
                strncmp(rep->str, "CLAIMED", 7) == 0;
  if (claimed)
    ps_log(PS_LOG_WARN, "redis %s:%u: Redis lost this shard's keys (%s: FLUSHALL, FLUSHDB, a "
           "failover to a node without them, or a DEL); claimed them back, writing a full "
           "snapshot from memory (acks wait for it)", l->at.host, l->at.port,
           rep->str[7] == ' ' ? rep->str + 8 : "?");
  else if (l->down_logged)
    ps_log(PS_LOG_INFO, "redis %s:%u: connected again; writing a full snapshot", l->at.host,
           l->at.port);
  if (claimed)
    l->meta_expected = 0;  /* whatever Redis held of this shard is gone */
  l->down_logged = 0;
  l->ev.up(l->ev.arg, claimed);
}

static void on_auth(redisAsyncContext *ac, void *reply, void *priv) {
  (void)priv;
  redisReply *rep = reply;
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR) {
    ps_log(PS_LOG_ERROR, "redis AUTH failed: %s", rep->str);
    redisAsyncDisconnect(ac);
  }
}

/* How long a WAIT waits: half the command deadline, so that a replica that
 * is slow is an answer ("too few"), not a connection past its deadline. */
static int64_t wait_ms(const ps_link *l) {
  return l->cfg->redis_timeout_ms / 2 > 0 ? l->cfg->redis_timeout_ms / 2 : 1;
}

int ps_link_wait_replicas(const ps_link *l) { return l->wait_replicas; }

int ps_link_send_wait(ps_link *l, redisAsyncContext *ac, redisCallbackFn *fn, void *arg) {
  return redisAsyncCommand(ac, fn, arg, "WAIT %d %" PRId64, l->wait_replicas, wait_ms(l)) ==
                 REDIS_OK
             ? 0
             : -1;
}

const char *ps_link_wait_failure(const ps_link *l, const redisReply *rep, char *why, size_t len) {
  if (rep == NULL)
    return "the connection to Redis was lost before the replicas confirmed it";
  if (rep->type == REDIS_REPLY_ERROR)
    return rep->str;
  if (rep->type != REDIS_REPLY_INTEGER)
    return "WAIT gave no count";
  if (rep->integer >= l->wait_replicas)
    return NULL;
  snprintf(why, len, "%lld of %d Redis replicas confirmed it within %" PRId64 " ms",
           (long long)rep->integer, l->wait_replicas, wait_ms(l));
  return why;
}

/* With Sentinels, where the primary is is asked on the loop's thread pool
 * (a Sentinel that does not answer must not stop the shard's loop). */
static void resolve_work(uv_work_t *w) {
  ps_link *l = w->data;
  l->resolve_eb = (ps_errbuf){0};
  ps_redis_primary(l->cfg, l->k->tag, l->cfg->redis_timeout_ms, &l->resolved, &l->resolve_eb);
}

static void after_resolve(uv_work_t *w, int status) {
  ps_link *l = w->data;
  l->resolving = 0;
  if (l->closing) {
    l->ev.released(l->ev.arg);
    return;
  }
  if (status != 0 || l->resolve_eb.code != 0) {
    if (!l->down_logged)
      ps_log(PS_LOG_WARN, "redis: %s; serving on and asking again",
             status != 0 ? "the Sentinel query was cancelled" : l->resolve_eb.msg);
    l->down_logged = 1;
    schedule_reconnect(l);
    return;
  }
  if ((strcmp(l->resolved.host, l->at.host) != 0 || l->resolved.port != l->at.port) &&
      l->cfg->ncluster > 0)
    ps_log(PS_LOG_INFO, "redis: the cluster names %s:%u as the primary of %s's slot",
           l->resolved.host, l->resolved.port, l->k->tag);
  else if (strcmp(l->resolved.host, l->at.host) != 0 || l->resolved.port != l->at.port)
    ps_log(PS_LOG_INFO, "redis: the Sentinels name %s:%u as the primary '%s'", l->resolved.host,
           l->resolved.port, l->cfg->redis_master_name);
  l->at = l->resolved;
  connect_to_primary(l);
}

static void link_connect(ps_link *l) {
  if (l->closing || l->ac != NULL || l->state == PS_LINK_FENCED || l->resolving)
    return;
  if (l->moved) {
    /* A MOVED reply named the node serving the slot now: go there. */
    l->moved = 0;
    l->at = l->moved_to;
    connect_to_primary(l);
    return;
  }
  if (l->cfg->nsentinels == 0 && l->cfg->ncluster == 0) {
    l->at = l->cfg->redis;
    connect_to_primary(l);
    return;
  }
  l->resolve.data = l;
  if (uv_queue_work(l->loop, &l->resolve, resolve_work, after_resolve) == 0)
    l->resolving = 1;
  else
    schedule_reconnect(l);
}

void ps_link_connect(ps_link *l) { link_connect(l); }

static void connect_to_primary(ps_link *l) {
  redisAsyncContext *ac = redisAsyncConnect(l->at.host, l->at.port);
  if (ac == NULL || ac->err) {
    if (ac)
      redisAsyncFree(ac);
    schedule_reconnect(l);
    return;
  }
  ac->data = l;
  if (ps_redis_uv_attach(ac, l->loop, (uint64_t)l->cfg->redis_timeout_ms, on_deadline, l) != 0) {
    redisAsyncFree(ac);
    schedule_reconnect(l);
    return;
  }
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  l->ac = ac;
  l->state = PS_LINK_CONNECTING;
  /* hiredis queues commands until the connection is up: AUTH and the epoch
   * claim go first, so every append after them is authenticated and
   * fenced, even those issued while connecting.  A password file that
   * cannot be read sends no AUTH: CLAIM's refusal (NOAUTH) is logged and
   * the connection retried. */
  ps_redis_auth auth;
  ps_errbuf eb = {0};
  if (ps_redis_auth_init(&auth, l->cfg, &eb) > 0)
    redisAsyncCommandArgv(ac, on_auth, NULL, auth.argc, auth.argv, NULL);
  ps_redis_auth_clear(&auth);
  const ps_shard_keys *k = l->k;
  redisAsyncCommand(ac, on_claimed, l, "EVAL %s 4 %s %s %s %s %s %s %s", CLAIM_SCRIPT, k->epoch,
                    k->logkey, k->log, k->meta, l->epoch_text, l->meta_expected ? "1" : "0",
                    k->snap_prefix);
}

void ps_link_check_role(ps_link *l, const redisReply *rep) {
  ps_addr to;
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "READONLY", 8) == 0)
    ps_link_drop(l, "it is a replica now (READONLY)");
  else if (ps_redis_redirect(rep, &to) == 1 && l->state == PS_LINK_UP) {
    char why[300];
    snprintf(why, sizeof why, "the cluster moved %.96s's slot to %.64s:%u (MOVED)", l->k->tag, to.host,
             to.port);
    l->moved = 1;
    l->moved_to = to;
    ps_link_drop(l, why);
  }
}

void ps_link_drop(ps_link *l, const char *why) {
  if (l->ac == NULL || l->state != PS_LINK_UP)
    return;
  snprintf(l->drop_why, sizeof l->drop_why, "%.199s", why);
  redisAsyncDisconnect(l->ac);
}

int ps_link_check_lost(ps_link *l, const redisReply *rep) {
  if (rep == NULL || rep->type != REDIS_REPLY_ERROR || strncmp(rep->str, "LOST", 4) != 0)
    return 0;
  char why[96];
  snprintf(why, sizeof why, "Redis lost this shard's %s", rep->str[4] == ' ' ? rep->str + 5 : "keys");
  ps_link_drop(l, why);
  return 1;
}

static void on_heartbeat(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_link *l = priv;
  redisReply *rep = reply;
  if (ps_link_is_fenced(rep))
    ps_link_fence(l, rep->str);
  else if (!ps_link_check_lost(l, rep))
    ps_link_check_role(l, rep);
}

void ps_link_heartbeat(ps_link *l, const char *payload) {
  if (l->ac == NULL || l->state != PS_LINK_UP)
    return;
  char ttl[24];
  snprintf(ttl, sizeof ttl, "%" PRId64, 3 * l->cfg->heartbeat_ms);
  const ps_shard_keys *k = l->k;
  const char *argv[] = {"EVAL",        HEARTBEAT_SCRIPT, "5",     k->epoch,
                        k->logkey,     k->log,           k->meta, k->node,
                        l->epoch_text, l->meta_expected ? "1" : "0", k->snap_prefix,
                        payload,       ttl};
  redisAsyncCommandArgv(l->ac, on_heartbeat, l, 13, argv, NULL);
}

static void on_retry_closed(uv_handle_t *h) {
  ps_link *l = h->data;
  l->retry_open = 0;
  l->ev.released(l->ev.arg);
}

void ps_link_close(ps_link *l) {
  l->closing = 1;
  uv_close((uv_handle_t *)&l->retry, on_retry_closed);
}

void ps_link_disconnect(ps_link *l) {
  if (l->ac != NULL)
    redisAsyncDisconnect(l->ac);
}
