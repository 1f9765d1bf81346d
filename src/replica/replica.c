/* A shard's run-time replication to Redis (see replica.h, REDIS.md).
 *
 * One hiredis async connection on the shard's loop (redis_uv.c), whose
 * life is one state machine: DOWN -> CONNECTING (AUTH and CLAIM queued
 * first) -> UP, back to DOWN on any loss or deadline, FENCED for good when
 * a newer incarnation took the shard.  Journal entries are appended in
 * order (and confirmed by WAIT with redis_replicas); snapshots are
 * snapshot.c's; the heartbeat and the workers' liveness are here.
 *
 * The durability frontier.  An entry is durable when a restore would reach
 * it: its append and every earlier one succeeded since the last switched
 * snapshot, or a snapshot covering it switched.  A failed append (an error
 * reply, the connection lost, a deadline) opens a hole: nothing after it
 * is durable until a snapshot that covers the hole switches.  A state that
 * Redis never held (a fresh start, a chief's LOAD) starts as a hole too.
 * Acknowledgements wait on this frontier (ps_replica_when_durable). */
#include "replica/replica.h"

#include <errno.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/backoff.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "replica/frontier.h"
#include "replica/keys.h"
#include "replica/redis_uv.h"
#include "replica/replica_internal.h"

/* One log append in flight: its XADD's answer, kept until its WAIT's. */
typedef struct append_req {
  struct ps_replica *r;
  uint64_t n;
  int waiting;              /* a WAIT follows the XADD */
  int fenced;               /* the XADD fenced this incarnation out */
  char failure[160];        /* the XADD's failure; "" when Redis stored it */
} append_req;

#define BACKOFF_CAP_MS 2000

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
  "  local m = redis.call('HMGET', KEYS[4], 'snap', 'chunks')\n"                    \
  "  if not m[1] then lost[#lost + 1] = 'meta'\n"                                   \
  "  else for k = 0, (tonumber(m[2]) or 0) - 1 do\n"                               \
  "    if redis.call('EXISTS', ARGV[3] .. m[1] .. ':' .. k) == 0 then\n"            \
  "      lost[#lost + 1] = 'snapshot chunks' break end end end end\n"

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


static void replica_connect(ps_replica *r);

int ps_replica_when_durable(ps_replica *r, uint64_t n, void (*done)(void *arg, int status),
                            void *arg) {
  if (r->state == RS_FENCED)
    return -EPERM;
  return ps_frontier_wait(&r->f, n, done, arg);
}

uint64_t ps_replica_nondurable(const ps_replica *r) { return r->f.nondurable; }

/* ------------------------------------------------------- connection */

void ps__replica_maybe_finish_close(ps_replica *r) {
  if (!r->closing || r->ac != NULL || r->job != NULL || r->handles_open > 0 || r->resolving)
    return;
  free(r->entry);
  void (*done)(void *) = r->close_done;
  void *arg = r->close_arg;
  free(r);
  if (done)
    done(arg);
}

static void on_handle_closed(uv_handle_t *h) {
  ps_replica *r = h->data;
  r->handles_open--;
  ps__replica_maybe_finish_close(r);
}

void ps__replica_fence(ps_replica *r, const char *why) {
  if (r->state == RS_FENCED)
    return;
  r->state = RS_FENCED;
  ps_log(PS_LOG_ERROR, "shard %d epoch %" PRIu64 " fenced out by Redis: %s", r->index, r->epoch,
         why);
  ps_frontier_cancel(&r->f, -EPERM);
  if (r->fenced)
    r->fenced(r->fenced_arg, why);
}

int ps__replica_is_fenced(const redisReply *rep) {
  return rep != NULL && rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "FENCED", 6) == 0;
}

static void on_retry_timer(uv_timer_t *t) { replica_connect(t->data); }

static void schedule_reconnect(ps_replica *r) {
  if (r->closing || r->state == RS_FENCED)
    return;
  uv_timer_start(&r->retry, on_retry_timer, ps_backoff_next(&r->backoff), 0);
}

/* The connection is gone (lost, refused, or past its deadline). */
static void went_down(ps_replica *r, const char *why) {
  int was_up = r->state == RS_UP;
  r->ac = NULL;
  if (r->state != RS_FENCED)
    r->state = RS_DOWN;
  if (!r->closing && (was_up || !r->down_logged))
    ps_log(PS_LOG_WARN, "redis %s:%u: %s; serving on and reconnecting", r->at.host,
           r->at.port, why);
  r->down_logged = 1;
  r->need_full = 1;
  if (r->closing)
    ps__replica_maybe_finish_close(r);
  else
    schedule_reconnect(r);
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  ps_replica *r = ac->data;
  char why[128];
  snprintf(why, sizeof why, "%s", r->drop_why[0] ? r->drop_why
                                  : status == REDIS_OK ? "connection closed"
                                  : ac->errstr[0] ? ac->errstr : "connection lost");
  r->drop_why[0] = '\0';
  went_down(r, why);
}

static void on_connect(const redisAsyncContext *ac, int status) {
  ps_replica *r = ac->data;
  if (status == REDIS_OK)
    return;  /* AUTH and CLAIM are already queued behind the connect */
  /* hiredis frees the context after this callback. */
  went_down(r, ac->errstr[0] ? ac->errstr : "cannot connect");
}

static void on_deadline(redisAsyncContext *ac, void *owner) {
  ps_replica *r = owner;
  int connected = (ac->c.flags & REDIS_CONNECTED) != 0;
  char why[96];
  snprintf(why, sizeof why, "no answer within %" PRId64 " ms ([redis] timeout_ms)",
           r->cfg->redis_timeout_ms);
  if (connected) {
    /* Pending callbacks run with NULL replies, then on_disconnect. */
    snprintf(r->drop_why, sizeof r->drop_why, "%s", why);
    redisAsyncFree(ac);
  } else {
    redisAsyncFree(ac);
    went_down(r, why);
  }
}

static void on_claimed(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_replica *r = priv;
  redisReply *rep = reply;
  if (rep == NULL)
    return;  /* disconnected again: on_disconnect handles it */
  if (ps__replica_is_fenced(rep)) {
    ps__replica_fence(r, rep->str);
    return;
  }
  if (rep->type == REDIS_REPLY_ERROR) {
    ps_log(PS_LOG_WARN, "redis: epoch check failed: %s", rep->str);
    redisAsyncDisconnect(r->ac);
    return;
  }
  r->state = RS_UP;
  ps_backoff_reset(&r->backoff);
  int claimed = (rep->type == REDIS_REPLY_STATUS || rep->type == REDIS_REPLY_STRING) &&
                strncmp(rep->str, "CLAIMED", 7) == 0;
  if (claimed)
    ps_log(PS_LOG_WARN, "redis %s:%u: Redis lost this shard's keys (%s: FLUSHALL, FLUSHDB, a "
           "failover to a node without them, or a DEL); claimed them back, writing a full "
           "snapshot from memory (acks wait for it)", r->at.host, r->at.port,
           rep->str[7] == ' ' ? rep->str + 8 : "?");
  else if (r->down_logged)
    ps_log(PS_LOG_INFO, "redis %s:%u: connected again; writing a full snapshot", r->at.host,
           r->at.port);
  if (claimed) {
    /* Whatever Redis held of this shard is gone: nothing is durable until
     * a new snapshot switches. */
    ps_frontier_lost(&r->f, ps_shard_journal(r->shard), "Redis lost this shard's keys");
    r->snap_version = 0;
    r->meta_expected = 0;
  }
  r->down_logged = 0;
  r->snap_next_ns = 0;  /* a new connection: try at once */
  ps__replica_snapshot_start(r);
}

static void on_auth(redisAsyncContext *ac, void *reply, void *priv) {
  (void)priv;
  redisReply *rep = reply;
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR) {
    ps_log(PS_LOG_ERROR, "redis AUTH failed: %s", rep->str);
    redisAsyncDisconnect(ac);
  }
}

static void connect_to_primary(ps_replica *r);

/* How long a WAIT waits: half the command deadline, so that a replica that
 * is slow is an answer ("too few"), not a connection past its deadline. */
static int64_t wait_ms(const ps_replica *r) {
  return r->cfg->redis_timeout_ms / 2 > 0 ? r->cfg->redis_timeout_ms / 2 : 1;
}

int ps__replica_send_wait(ps_replica *r, redisAsyncContext *ac, redisCallbackFn *fn, void *arg) {
  return redisAsyncCommand(ac, fn, arg, "WAIT %d %" PRId64, r->wait_replicas, wait_ms(r)) ==
                 REDIS_OK
             ? 0
             : -1;
}

const char *ps__replica_wait_failure(const ps_replica *r, const redisReply *rep, char *why,
                                     size_t len) {
  if (rep == NULL)
    return "the connection to Redis was lost before the replicas confirmed it";
  if (rep->type == REDIS_REPLY_ERROR)
    return rep->str;
  if (rep->type != REDIS_REPLY_INTEGER)
    return "WAIT gave no count";
  if (rep->integer >= r->wait_replicas)
    return NULL;
  snprintf(why, len, "%lld of %d Redis replicas confirmed it within %" PRId64 " ms",
           (long long)rep->integer, r->wait_replicas, wait_ms(r));
  return why;
}

/* With Sentinels, where the primary is is asked on the loop's thread pool
 * (a Sentinel that does not answer must not stop the shard's loop). */
static void resolve_work(uv_work_t *w) {
  ps_replica *r = w->data;
  r->resolve_eb = (ps_errbuf){0};
  ps_redis_primary(r->cfg, r->cfg->redis_timeout_ms, &r->resolved, &r->resolve_eb);
}

static void after_resolve(uv_work_t *w, int status) {
  ps_replica *r = w->data;
  r->resolving = 0;
  if (r->closing) {
    ps__replica_maybe_finish_close(r);
    return;
  }
  if (status != 0 || r->resolve_eb.code != 0) {
    if (!r->down_logged)
      ps_log(PS_LOG_WARN, "redis: %s; serving on and asking again",
             status != 0 ? "the Sentinel query was cancelled" : r->resolve_eb.msg);
    r->down_logged = 1;
    schedule_reconnect(r);
    return;
  }
  if (strcmp(r->resolved.host, r->at.host) != 0 || r->resolved.port != r->at.port)
    ps_log(PS_LOG_INFO, "redis: the Sentinels name %s:%u as the primary '%s'", r->resolved.host,
           r->resolved.port, r->cfg->redis_master_name);
  r->at = r->resolved;
  connect_to_primary(r);
}

static void replica_connect(ps_replica *r) {
  if (r->closing || r->ac != NULL || r->state == RS_FENCED || r->resolving)
    return;
  if (r->cfg->nsentinels == 0) {
    r->at = r->cfg->redis;
    connect_to_primary(r);
    return;
  }
  r->resolve.data = r;
  if (uv_queue_work(r->loop, &r->resolve, resolve_work, after_resolve) == 0)
    r->resolving = 1;
  else
    schedule_reconnect(r);
}

static void connect_to_primary(ps_replica *r) {
  redisAsyncContext *ac = redisAsyncConnect(r->at.host, r->at.port);
  if (ac == NULL || ac->err) {
    if (ac)
      redisAsyncFree(ac);
    schedule_reconnect(r);
    return;
  }
  ac->data = r;
  if (ps_redis_uv_attach(ac, r->loop, (uint64_t)r->cfg->redis_timeout_ms, on_deadline, r) != 0) {
    redisAsyncFree(ac);
    schedule_reconnect(r);
    return;
  }
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  r->ac = ac;
  r->state = RS_CONNECTING;
  /* hiredis queues commands until the connection is up: AUTH and the epoch
   * claim go first, so every append after them is authenticated and
   * fenced, even those issued while connecting.  A password file that
   * cannot be read sends no AUTH: CLAIM's refusal (NOAUTH) is logged and
   * the connection retried. */
  ps_redis_auth auth;
  ps_errbuf eb = {0};
  if (ps_redis_auth_init(&auth, r->cfg, &eb) > 0)
    redisAsyncCommandArgv(ac, on_auth, NULL, auth.argc, auth.argv, NULL);
  ps_redis_auth_clear(&auth);
  redisAsyncCommand(ac, on_claimed, r, "EVAL %s 4 %s %s %s %s %s %s %s", CLAIM_SCRIPT,
                    r->k.epoch, r->k.logkey, r->k.log, r->k.meta, r->epoch_text,
                    r->meta_expected ? "1" : "0", r->k.snap_prefix);
}

/* ------------------------------------------------------------ the log */

/* A READONLY reply: this server was made a replica (a failover): find the
 * primary again. */
void ps__replica_check_readonly(ps_replica *r, const redisReply *rep) {
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "READONLY", 8) == 0)
    ps__replica_drop(r, "it is a replica now (READONLY)");
}

void ps__replica_drop(ps_replica *r, const char *why) {
  if (r->ac == NULL || r->state != RS_UP)
    return;
  snprintf(r->drop_why, sizeof r->drop_why, "%s", why);
  redisAsyncDisconnect(r->ac);
}

int ps__replica_check_lost(ps_replica *r, const redisReply *rep) {
  if (rep == NULL || rep->type != REDIS_REPLY_ERROR || strncmp(rep->str, "LOST", 4) != 0)
    return 0;
  char why[96];
  snprintf(why, sizeof why, "Redis lost this shard's %s", rep->str[4] == ' ' ? rep->str + 5 : "keys");
  ps__replica_drop(r, why);
  return 1;
}

static void on_appended(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  append_req *q = priv;
  ps_replica *r = q->r;
  redisReply *rep = reply;
  if (rep != NULL && rep->type == REDIS_REPLY_NIL) {
    /* NOMKSTREAM found no stream: a newer incarnation took it over, or
     * Redis lost it.  The reconnection's claim tells which (FENCED, or
     * CLAIMED and a full snapshot). */
    snprintf(q->failure, sizeof q->failure, "the log stream %.120s is gone", r->k.log);
    ps__replica_drop(r, "the log stream is gone (a newer incarnation, or Redis lost it): checking");
  } else if (ps__replica_is_fenced(rep)) {
    q->fenced = 1;
    ps__replica_fence(r, rep->str);
  } else if (rep == NULL) {
    snprintf(q->failure, sizeof q->failure, "the connection to Redis was lost");
  } else if (rep->type == REDIS_REPLY_ERROR) {
    snprintf(q->failure, sizeof q->failure, "%s", rep->str);
    ps__replica_check_readonly(r, rep);
  }
  if (q->waiting)
    return;  /* on_waited answers */
  if (!q->fenced)
    ps_frontier_answered(&r->f, q->n, q->failure[0] ? q->failure : NULL);
  free(q);
}

/* The WAIT after an append: the entry is durable once the primary and
 * wait_replicas replicas hold it (REDIS.md, "Sentinel"). */
static void on_waited(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  append_req *q = priv;
  char why[200];
  if (!q->fenced)
    ps_frontier_answered(&q->r->f, q->n,
                         q->failure[0] ? q->failure
                                       : ps__replica_wait_failure(q->r, reply, why, sizeof why));
  free(q);
}

/* The XADD of an entry is written as RESP around its gradient: the
 * gradient is copied into r->entry after room for the command's head, the
 * head goes just before it, and hiredis copies the whole into its output
 * buffer.  redisAsyncCommandArgv makes as many copies, but formats each
 * command into a fresh buffer: on the mlp 1250 (4 MB entries) that was
 * about 6% fewer samples/s (median of 12 alternating runs, log mode). */
#define XADD_HEAD_MAX 1024

/* Format and send one entry's XADD (and its WAIT). */
static void append_now(ps_replica *r, const ps_journal *e) {
  if (r->state == RS_FENCED)
    return;
  if (r->state != RS_UP || r->closing) {
    ps_frontier_answered(&r->f, e->n, "Redis is not connected");
    return;
  }
  size_t raw = e->kind == PS_JOURNAL_PUSH ? ps_shard_options(r->shard)->nfloats * sizeof(float) : 0;
  size_t need = XADD_HEAD_MAX + raw + 2;
  if (need > r->entry_cap) {
    char *p = realloc(r->entry, need);
    if (p == NULL) {
      ps_frontier_answered(&r->f, e->n, "out of memory for the entry");
      return;
    }
    r->entry = p;
    r->entry_cap = need;
  }
  /* The gradient goes in as it is: LZ4 saved 7-9% of a gradient's bytes
   * (and 1-3% of a state's) for more CPU than sending them costs. */
  char *g = r->entry + XADD_HEAD_MAX;
  if (raw > 0)
    memcpy(g, e->g, raw);
  append_req *q = malloc(sizeof *q);
  if (q == NULL) {
    ps_frontier_answered(&r->f, e->n, "out of memory");
    return;
  }
  *q = (append_req){.r = r, .n = e->n};
  char id[48], ks[2] = {(char)e->kind, 0}, ws[16], is[24], ss[24], ts[24];
  snprintf(id, sizeof id, "%" PRIu64 "-%" PRIu64, r->epoch, e->n);
  snprintf(ws, sizeof ws, "%u", e->worker);
  snprintf(is, sizeof is, "%" PRIu64, e->incarnation);
  snprintf(ss, sizeof ss, "%" PRIu64, e->seq);
  snprintf(ts, sizeof ts, "%" PRIu64,
           e->kind == PS_JOURNAL_TARGET ? (uint64_t)e->target : e->step);
  const char *argv[15] = {"XADD", r->k.log, "NOMKSTREAM", id, "k", ks, "w", ws, "i", is,
                          "s", ss, "t", ts, "v"};
  /* At most about 470 bytes besides the key (PS_KEY_MAX): never too long,
   * but a truncated head is refused rather than written past. */
  char head[XADD_HEAD_MAX];
  size_t hl = (size_t)snprintf(head, sizeof head, "*16\r\n");
  for (int i = 0; i < 15 && hl < sizeof head; i++)
    hl += (size_t)snprintf(head + hl, sizeof head - hl, "$%zu\r\n%s\r\n", strlen(argv[i]), argv[i]);
  if (hl < sizeof head)
    hl += (size_t)snprintf(head + hl, sizeof head - hl, "$%zu\r\n", raw);
  if (hl >= sizeof head) {
    free(q);
    ps_frontier_answered(&r->f, e->n, "the XADD's head is too long");
    return;
  }
  memcpy(g - hl, head, hl);
  memcpy(g + raw, "\r\n", 2);
  if (redisAsyncFormattedCommand(r->ac, on_appended, q, g - hl, hl + raw + 2) != REDIS_OK) {
    free(q);
    ps_frontier_answered(&r->f, e->n, "hiredis refused the command");
    return;
  }
  if (r->wait_replicas > 0 && ps__replica_send_wait(r, r->ac, on_waited, q) == 0)
    q->waiting = 1;
}

void ps_replica_flush(ps_replica *r) {
  if (!r->has_later)
    return;
  r->has_later = 0;
  append_now(r, &r->later);
}

void ps_replica_append(ps_replica *r, const ps_journal *e) {
  ps_replica_flush(r);
  append_now(r, e);
}

int ps_replica_append_later(ps_replica *r, const ps_journal *e) {
  ps_replica_flush(r);
  if (r->state != RS_UP || r->closing || e->g == NULL) {
    append_now(r, e);
    return 0;
  }
  r->later = *e;
  r->has_later = 1;
  return 1;
}

/* ------------------------------------------------- heartbeat, timers */

static void on_heartbeat(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  ps_replica *r = priv;
  redisReply *rep = reply;
  if (ps__replica_is_fenced(rep))
    ps__replica_fence(r, rep->str);
  else
    ps__replica_check_lost(r, rep);
}

static void heartbeat(ps_replica *r) {
  char payload[320], host[128] = "?", ttl[24];
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  snprintf(payload, sizeof payload,
           "pid %d host %s incarnation %" PRIu64 " step %" PRIu64 " version %" PRIu64
           " lag %" PRIu64 " nondurable %" PRIu64 " held %" PRIu64,
           (int)getpid(), host, r->epoch, ps_shard_global_step(r->shard),
           ps_shard_version(r->shard), ps_replica_lag(r), r->f.nondurable, r->f.waiting);
  snprintf(ttl, sizeof ttl, "%" PRId64, 3 * r->cfg->heartbeat_ms);
  const char *argv[] = {"EVAL",        HEARTBEAT_SCRIPT, "5",     r->k.epoch,
                        r->k.logkey,   r->k.log,         r->k.meta, r->k.node,
                        r->epoch_text, r->meta_expected ? "1" : "0", r->k.snap_prefix,
                        payload,       ttl};
  redisAsyncCommandArgv(r->ac, on_heartbeat, r, 13, argv, NULL);
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
  char keys_buf[PS_CONFIG_MAX_NODES][PS_KEY_MAX];
  argv[0] = "MGET";
  for (int j = 0; j < n; j++) {
    ps_key_node(keys_buf[j], r->cfg->cluster_id, "worker", j);
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
  uint64_t now = ps_now_ns();
  if (r->updates > 0 || r->need_full || r->f.hole)
    ps__replica_snapshot_start(r);
  if (r->state == RS_UP && now - r->last_hb_ns >= (uint64_t)r->cfg->heartbeat_ms * 1000000ULL) {
    r->last_hb_ns = now;
    heartbeat(r);
    if (r->alive_fn != NULL)
      watch_workers(r);
  }
}

void ps_replica_updated(ps_replica *r) {
  if (++r->updates >= (uint64_t)r->cfg->replicate_every_updates)
    ps__replica_snapshot_start(r);
}

uint64_t ps_replica_lag(const ps_replica *r) {
  return ps_shard_version(r->shard) - r->snap_version;
}

double ps_replica_lag_seconds(const ps_replica *r) {
  if (ps_replica_lag(r) == 0)
    return 0;
  /* With no snapshot of this run yet, the lag began when the process did
   * (the restored snapshot's own age is not known here). */
  uint64_t since = r->snap_taken_ns != 0 ? r->snap_taken_ns : r->started_ns;
  return (double)(ps_now_ns() - since) * 1e-9;
}

uint64_t ps_replica_acks_waiting(const ps_replica *r) { return r->f.waiting; }

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
  r->started_ns = ps_now_ns();
  /* What the restore loaded and replayed is in Redis; a state Redis never
   * held (fresh, or a chief's LOAD) is durable only once its first
   * snapshot switches. */
  ps_frontier_init(&r->f, cfg->on_redis_failure == PS_REDIS_FAILURE_DEGRADE, restored->loaded,
                   ps_shard_journal(shard), restored->nondurable);
  if (restored->loaded) {
    r->snap_version = restored->snap_version;
    r->meta_expected = 1;
  }
  r->need_full = 1;  /* the first snapshot records this incarnation's start */
  r->wait_replicas = ps_config_redis_replicas(cfg);
  r->at = cfg->redis;
  snprintf(r->epoch_text, sizeof r->epoch_text, "%" PRIu64, r->epoch);
  ps_shard_keys_init(&r->k, cfg->cluster_id, index);
  ps_shard_keys_log(&r->k, r->epoch);
  /* Reconnects never wait longer than one replication interval, so that a
   * Redis that is back is current again within two. */
  unsigned interval = (unsigned)cfg->replicate_interval_ms, cap = BACKOFF_CAP_MS;
  cap = interval < cap ? (interval > 2 ? interval : 2) : cap;
  ps_backoff_init(&r->backoff, cap < 100 ? cap : 100, cap, 0);
  ps_backoff_init(&r->snap_backoff, interval, BACKOFF_CAP_MS, 0);
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
  ps_replica_flush(r);
  r->closing = 1;
  r->close_done = done;
  r->close_arg = arg;
  ps_frontier_cancel(&r->f, -ECANCELED);
  uv_close((uv_handle_t *)&r->retry, on_handle_closed);
  uv_close((uv_handle_t *)&r->interval, on_handle_closed);
  /* A snapshot in flight is finished, and a clean stop loses nothing even
   * in `snapshot` mode. */
  if (r->job == NULL)
    ps__replica_snapshots_close(r);
}
