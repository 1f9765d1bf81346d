/* `paramserv status`: one look at a cluster from its records in Redis
 * (src/replica/REDIS.md): every node's heartbeat, each shard's snapshot,
 * the chief's lease, and the newest checkpoint of [checkpoint] dir. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd/cli.h"
#include "cmd/cmd.h"
#include "common/config.h"
#include "common/log.h"
#include "recovery/checkpoint.h"
#include "replica/keys.h"

#define DEFAULT_CONFIG "/etc/paramserv/cluster.conf"

enum { NEVER_SEEN = 0, DOWN, UP };
static const char *const state_text[] = {"never seen", "down", "up"};
static const char *const state_json[] = {"never_seen", "down", "up"};

/* One row of the table, or the lease (state UP: held; incarnation: its
 * token).  have_* say which fields the records held. */
typedef struct row {
  const char *role;
  int index, state;
  char host[128];
  long long pid;
  uint64_t incarnation, step, version, lag, snap_version;
  uint64_t nondurable, held;  /* shards: acks without Redis over the run, acks waiting now */
  double rate, snap_time;
  int64_t ttl_ms;   /* the key's time to live; -1 unknown */
  int64_t age_ms;   /* since the last heartbeat; -1 unknown */
  int have_pid, have_inc, have_step, have_rate, have_version, have_lag, have_snap;
  int have_durability;
  char *tables;     /* shards with sparse tables: the heartbeat's "C1:ROWS:BYTES,..."; NULL none */
  const char *redis;  /* shards: the Redis node holding their records */
} row;

/* One sparse table's figures on one shard, from its heartbeat. */
typedef struct table_fig {
  char name[48];
  uint64_t rows, bytes;
} table_fig;

/* The heartbeat's "tables" value: "NAME:ROWS:BYTES" items joined by ','.
 * @return the items read into out (at most max); a malformed item ends it. */
static int parse_tables(const char *text, table_fig *out, int max) {
  int n = 0;
  for (const char *p = text; p != NULL && *p != '\0' && n < max;) {
    const char *end = strchr(p, ','), *c1 = strchr(p, ':');
    size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
    if (c1 == NULL || c1 > p + len || (size_t)(c1 - p) >= sizeof out[n].name)
      break;
    char *after;
    out[n].rows = strtoull(c1 + 1, &after, 10);
    if (*after != ':')
      break;
    out[n].bytes = strtoull(after + 1, &after, 10);
    if (after != p + len)
      break;
    snprintf(out[n].name, sizeof out[n].name, "%.*s", (int)(c1 - p), p);
    n++;
    p = end != NULL ? end + 1 : NULL;
  }
  return n;
}

/* ------------------------------------------------------------------ Redis */

/* A connection per hash tag's node: with [redis] cluster the shards'
 * records live on the nodes serving their tags' slots; otherwise every tag
 * has the one primary, and one connection serves them all. */
typedef struct node_conn {
  char tag[PS_KEY_MAX];
  char addr[300];
  redisContext *c;
} node_conn;
static node_conn conns[2 + PS_CONFIG_MAX_NODES];
static int nconns;
static const ps_config *st_cfg;
/* Ring mode: the current view as Redis holds it, "<epoch> <members>" ("" none). */
static char ring_view[300];

static void close_redis(void) {
  for (int i = 0; i < nconns; i++)
    if (i == 0 || conns[i].c != conns[0].c)
      redisFree(conns[i].c);
  nconns = 0;
}

/* The connection for `tag`'s records (opened at its first use).  Redis
 * unreachable: one error line and exit 1. */
static node_conn *conn_for(const char *tag) {
  for (int i = 0; i < nconns; i++)
    if (strcmp(conns[i].tag, tag) == 0)
      return &conns[i];
  node_conn *n = &conns[nconns];
  snprintf(n->tag, sizeof n->tag, "%s", tag);
  if (st_cfg->ncluster == 0 && nconns > 0) {
    /* One Redis (or the Sentinels' one primary): the first connection. */
    snprintf(n->addr, sizeof n->addr, "%s", conns[0].addr);
    n->c = conns[0].c;
    nconns++;
    return n;
  }
  const ps_config *cfg = st_cfg;
  const char *source = cfg->ncluster > 0     ? "the node of the Redis Cluster serving its slot"
                       : cfg->nsentinels > 0 ? "the primary the Sentinels name"
                                             : "address";
  ps_errbuf eb = {0};
  ps_addr at;
  if (ps_redis_primary(cfg, tag, cfg->redis_timeout_ms, &at, &eb) != 0) {
    ps_cmd_error("status: redis: %s ([redis] %s in %s)", eb.msg,
                 cfg->ncluster > 0 ? "cluster" : "sentinels", cfg->path);
    close_redis();
    exit(1);
  }
  ps_addr_format(&at, n->addr, sizeof n->addr);
  n->c = ps_redis_connect_to(cfg, tag, &at, cfg->redis_timeout_ms, &eb);
  if (n->c == NULL) {
    /* eb.msg is "redis <address>: <why>". */
    const char *why = strstr(eb.msg, ": ");
    why = why != NULL ? why + 2 : eb.msg;
    if (eb.code == -EACCES)
      ps_cmd_error("status: redis %s ([redis] in %s): %s", n->addr, cfg->path, why);
    else
      ps_cmd_error("status: redis %s ([redis] %s in %s, for %s) unreachable: %s", n->addr,
                   source, cfg->path, tag, why);
    close_redis();
    exit(1);
  }
  nconns++;
  return n;
}

/* A key's hash tag: "{...}" at its start. */
static void tag_of(const char *key, char tag[PS_KEY_MAX]) {
  const char *end = strchr(key, '}');
  size_t len = key[0] == '{' && end != NULL ? (size_t)(end - key) + 1 : 0;
  snprintf(tag, PS_KEY_MAX, "%.*s", (int)len, key);
}

/* A command's reply, on the connection to the node holding `key`.  No
 * reply (Redis gone) or an error reply (NOAUTH, NOPERM, WRONGTYPE): one
 * error line and exit 1, since a status built on records it could not
 * read would mislead. */
static redisReply *q(const char *key, const char *fmt, ...) {
  char tag[PS_KEY_MAX];
  tag_of(key, tag);
  node_conn *n = conn_for(tag);
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(n->c, fmt, ap);
  va_end(ap);
  if (r != NULL && r->type != REDIS_REPLY_ERROR)
    return r;
  ps_cmd_error("status: redis %s: reading %s: %s", n->addr, key,
               r != NULL ? r->str : n->c->errstr[0] ? n->c->errstr : "no reply");
  close_redis();
  exit(1);
}

/* The node holding tag's records ("" before they were read). */
static const char *node_of(const char *tag) {
  for (int i = 0; i < nconns; i++)
    if (strcmp(conns[i].tag, tag) == 0)
      return conns[i].addr;
  return "";
}

/* GET and PTTL of a key, in one step.  @return 1 with the value in buf
 * and *ttl_ms its time to live (-1: none), or 0 when absent. */
static int get_ttl(const char *key, char *buf, size_t len, int64_t *ttl_ms) {
  redisReply *r = q(key, "EVAL %s 1 %s",
                    "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}", key);
  int found = r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
              r->element[0]->type == REDIS_REPLY_STRING;
  if (found) {
    snprintf(buf, len, "%s", r->element[0]->str);
    redisReply *t = r->element[1];
    *ttl_ms = t->type == REDIS_REPLY_INTEGER && t->integer >= 0 ? t->integer : -1;
  }
  freeReplyObject(r);
  return found;
}

/* ---------------------------------------------------------- the records */

/* Heartbeat payloads are "key value" pairs: "pid P host H incarnation E
 * step S steps/s R" (workers, chief) or "... version V lag L nondurable D
 * held K" (shards);
 * the lease's is "token T host H pid P". */
static void parse_payload(row *w, const char *payload) {
  char buf[8192], *save = NULL;
  snprintf(buf, sizeof buf, "%s", payload);
  for (char *k = strtok_r(buf, " ", &save); k != NULL; k = strtok_r(NULL, " ", &save)) {
    char *v = strtok_r(NULL, " ", &save);
    if (v == NULL)
      break;
    if (strcmp(k, "host") == 0)
      snprintf(w->host, sizeof w->host, "%s", v);
    else if (strcmp(k, "pid") == 0)
      w->pid = strtoll(v, NULL, 10), w->have_pid = 1;
    else if (strcmp(k, "incarnation") == 0 || strcmp(k, "token") == 0)
      w->incarnation = strtoull(v, NULL, 10), w->have_inc = 1;
    else if (strcmp(k, "step") == 0)
      w->step = strtoull(v, NULL, 10), w->have_step = 1;
    else if (strcmp(k, "steps/s") == 0)
      w->rate = strtod(v, NULL), w->have_rate = 1;
    else if (strcmp(k, "version") == 0)
      w->version = strtoull(v, NULL, 10), w->have_version = 1;
    else if (strcmp(k, "lag") == 0)
      w->lag = strtoull(v, NULL, 10), w->have_lag = 1;
    else if (strcmp(k, "nondurable") == 0)
      w->nondurable = strtoull(v, NULL, 10), w->have_durability = 1;
    else if (strcmp(k, "held") == 0)
      w->held = strtoull(v, NULL, 10);
    else if (strcmp(k, "tables") == 0 && w->tables == NULL)
      w->tables = strdup(v);
  }
}

/* Fill a row from its heartbeat key and its epoch key (REDIS.md §1). */
static void read_node(const ps_config *cfg, row *w) {
  char node[PS_KEY_MAX], epoch[PS_KEY_MAX], v[8192];
  if (strcmp(w->role, "ps") == 0) {
    ps_shard_keys k;
    ps_shard_keys_init(&k, cfg->cluster_id, w->index);
    snprintf(node, sizeof node, "%s", k.node);
    snprintf(epoch, sizeof epoch, "%s", k.epoch);
  } else {
    ps_key_node(node, cfg->cluster_id, w->role, w->index);
    ps_key_epoch(epoch, cfg->cluster_id, w->role, w->index);
  }
  w->age_ms = -1;
  if (get_ttl(node, v, sizeof v, &w->ttl_ms)) {
    w->state = UP;
    parse_payload(w, v);
    if (w->ttl_ms >= 0)
      w->age_ms = w->ttl_ms < 3 * cfg->heartbeat_ms ? 3 * cfg->heartbeat_ms - w->ttl_ms : 0;
  } else if (get_ttl(epoch, v, sizeof v, &w->ttl_ms)) {
    w->state = DOWN;
    w->incarnation = strtoull(v, NULL, 10);   /* the newest incarnation it took */
    w->have_inc = 1;
  }
}

static void read_snapshot(const ps_config *cfg, row *w) {
  ps_shard_keys k;
  ps_shard_keys_init(&k, cfg->cluster_id, w->index);
  redisReply *r = q(k.meta, "HMGET %s version time", k.meta);
  if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
      r->element[0]->type == REDIS_REPLY_STRING) {
    w->have_snap = 1;
    w->snap_version = strtoull(r->element[0]->str, NULL, 10);
    if (r->element[1]->type == REDIS_REPLY_STRING)
      w->snap_time = strtod(r->element[1]->str, NULL);
  }
  freeReplyObject(r);
}

static void read_lease(const ps_config *cfg, row *l) {
  char key[PS_KEY_MAX], v[512];
  ps_key_chief_lease(key, cfg->cluster_id);
  *l = (row){.role = "lease", .ttl_ms = -1, .age_ms = -1};
  if (get_ttl(key, v, sizeof v, &l->ttl_ms)) {
    l->state = UP;
    parse_payload(l, v);
  }
}

/* ----------------------------------------------------------- checkpoint */

typedef struct ckpt_info {
  int readable;            /* 0: the directory cannot be read here */
  char why[512];           /* when not readable */
  int found;
  ps_ckpt_entry latest;
} ckpt_info;

/* The newest checkpoint whose directory exists (by step, as the chief's
 * restore looks first). */
static void read_ckpt(const char *dir, ckpt_info *ci) {
  memset(ci, 0, sizeof *ci);
  DIR *d = opendir(dir);
  if (d == NULL) {
    snprintf(ci->why, sizeof ci->why, "%s", strerror(errno));
    return;
  }
  closedir(d);
  ps_ckpt_entry *e = NULL;
  ps_errbuf eb = {0};
  int n = ps_ckpt_list(dir, &e, &eb);
  if (n < 0) {
    snprintf(ci->why, sizeof ci->why, "%s", eb.msg);
    return;
  }
  ci->readable = 1;
  for (int i = 0; i < n; i++)
    if (e[i].on_disk) {
      ci->latest = e[i];
      ci->found = 1;
    }
  free(e);
}

/* ---------------------------------------------------------------- output */

/* One token: "0.4s", "3m05s", "2h10m", "1.5d". */
static const char *age_text(double s, char *buf, size_t len) {
  if (s < 0)
    snprintf(buf, len, "?");
  else if (s < 60)
    snprintf(buf, len, "%.1fs", s);
  else if (s < 3600)
    snprintf(buf, len, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else if (s < 86400)
    snprintf(buf, len, "%dh%02dm", (int)(s / 3600), (int)s % 3600 / 60);
  else
    snprintf(buf, len, "%.1fd", s / 86400);
  return buf;
}

/* A model with sparse tables: each table's rows and memory on each shard
 * whose heartbeat says them ("-": a shard down, or one that did not), and
 * over every shard that did; one line per table, in the model's order. */
static void print_tables(const row *rows, int n) {
  static table_fig figs[PS_CONFIG_MAX_NODES][64];
  int nfig[PS_CONFIG_MAX_NODES] = {0}, first = -1, nps = 0;
  const row *ps[PS_CONFIG_MAX_NODES];
  for (int i = 0; i < n && nps < PS_CONFIG_MAX_NODES; i++) {
    if (strcmp(rows[i].role, "ps") != 0)
      continue;
    if (rows[i].tables != NULL && rows[i].state == UP)
      nfig[nps] = parse_tables(rows[i].tables, figs[nps], 64);
    if (nfig[nps] > 0 && first < 0)
      first = nps;
    ps[nps++] = &rows[i];
  }
  if (first < 0)
    return;
  printf("\nsparse tables (rows / memory, from each shard's heartbeat):\n%-12s", "TABLE");
  for (int j = 0; j < nps; j++) {
    char h[24];
    snprintf(h, sizeof h, "ps %d", ps[j]->index);
    printf(" %22s", h);
  }
  printf(" %22s\n", "ALL");
  for (int t = 0; t < nfig[first]; t++) {
    const char *name = figs[first][t].name;
    uint64_t rows_all = 0, bytes_all = 0;
    printf("%-12s", name);
    for (int j = 0; j < nps; j++) {
      const table_fig *f = NULL;
      for (int k = 0; k < nfig[j] && f == NULL; k++)
        if (strcmp(figs[j][k].name, name) == 0)
          f = &figs[j][k];
      char cell[48] = "-", b[24];
      if (f != NULL) {
        snprintf(cell, sizeof cell, "%" PRIu64 " / %s", f->rows,
                 ps_cmd_human_bytes(f->bytes, b, sizeof b));
        rows_all += f->rows;
        bytes_all += f->bytes;
      }
      printf(" %22s", cell);
    }
    char cell[48], b[24];
    snprintf(cell, sizeof cell, "%" PRIu64 " / %s", rows_all, ps_cmd_human_bytes(bytes_all, b, sizeof b));
    printf(" %22s\n", cell);
  }
}

#define U64(have, v, buf) \
  ((have) ? (snprintf(buf, sizeof buf, "%" PRIu64, (uint64_t)(v)), buf) : "-")

static void print_table(const ps_config *cfg, const row *rows, int n, const row *l,
                        const ckpt_info *ci, double now) {
  printf("cluster %s, redis %s, heartbeat TTL %" PRId64 " ms\n\n", cfg->cluster_id, conns[0].addr,
         3 * cfg->heartbeat_ms);
  printf("%-6s %3s  %-10s %-16s %7s  %-14s %7s %9s %8s %9s %6s %9s %5s %10s\n", "ROLE", "IDX",
         "STATE", "HOST", "PID", "INCARNATION", "AGE", "STEP", "STEPS/S", "VERSION", "LAG",
         "SNAPSHOT", "HELD", "NONDURABLE");
  for (int i = 0; i < n; i++) {
    const row *w = &rows[i];
    char pid[24], inc[24], age[32], step[24], rate[24], ver[24], lag[24], snap[24], held[24],
        nond[24];
    if (w->have_pid)
      snprintf(pid, sizeof pid, "%lld", w->pid);
    if (w->age_ms >= 0)
      age_text(w->age_ms / 1e3, age, sizeof age);
    if (w->have_rate)
      snprintf(rate, sizeof rate, "%.1f", w->rate);
    printf("%-6s %3d  %-10s %-16s %7s  %-14s %7s %9s %8s %9s %6s %9s %5s %10s\n", w->role,
           w->index,
           state_text[w->state], w->host[0] ? w->host : "-", w->have_pid ? pid : "-",
           U64(w->have_inc, w->incarnation, inc), w->age_ms >= 0 ? age : "-",
           U64(w->have_step, w->step, step), w->have_rate ? rate : "-",
           U64(w->have_version, w->version, ver), U64(w->have_lag, w->lag, lag),
           U64(w->have_snap, w->snap_version, snap), U64(w->have_durability, w->held, held),
           U64(w->have_durability, w->nondurable, nond));
  }
  print_tables(rows, n);
  printf("\n");
  char t[32];
  if (cfg->nsentinels > 0)
    printf("redis: primary %s, named by the Sentinels of '%s' (%d configured)\n", conns[0].addr,
           cfg->redis_master_name, cfg->nsentinels);
  if (cfg->ncluster > 0) {
    printf("redis cluster (%d nodes configured): the cluster's records on %s", cfg->ncluster,
           conns[0].addr);
    for (int i = 0; i < n; i++)
      if (strcmp(rows[i].role, "ps") == 0)
        printf("; ps %d on %s", rows[i].index, rows[i].redis);
    printf("\n");
  }
  if (cfg->mode == PS_MODE_RING)
    printf("ring view: %s\n", ring_view[0] ? ring_view : "none yet");
  if (l->state == UP)
    printf("chief lease: token %" PRIu64 ", host %s, pid %lld, %s left\n", l->incarnation,
           l->host[0] ? l->host : "?", l->pid, age_text(l->ttl_ms / 1e3, t, sizeof t));
  else
    printf("chief lease: none\n");
  if (!ci->readable)
    printf("latest checkpoint: %s: not readable here (%s)\n", cfg->checkpoint_dir, ci->why);
  else if (!ci->found)
    printf("latest checkpoint: none in %s\n", cfg->checkpoint_dir);
  else
    printf("latest checkpoint: %s/%s, step %" PRIu64 ", %s old\n", cfg->checkpoint_dir,
           ci->latest.name, ci->latest.step, age_text(now - ci->latest.time, t, sizeof t));
}

/* A number, or NULL: json_pack's "o?" turns NULL into null. */
static json_t *jint(int have, int64_t v) { return have ? json_integer((json_int_t)v) : NULL; }
static json_t *jreal(int have, double v) { return have ? json_real(v) : NULL; }

static int print_json(const ps_config *cfg, const row *rows, int n, const row *l,
                      const ckpt_info *ci, double now) {
  json_t *nodes = json_array();
  for (int i = 0; i < n; i++) {
    const row *w = &rows[i];
    json_t *o = json_pack("{s:s, s:i, s:s, s:o?, s:o?, s:o?, s:o?, s:o?}", "role", w->role,
                          "index", w->index, "state", state_json[w->state], "host",
                          w->host[0] ? json_string(w->host) : NULL, "pid",
                          jint(w->have_pid, w->pid), "incarnation",
                          jint(w->have_inc, (int64_t)w->incarnation), "heartbeat_age_ms",
                          jint(w->age_ms >= 0, w->age_ms), "step",
                          jint(w->have_step, (int64_t)w->step));
    if (strcmp(w->role, "ps") != 0)
      json_object_set_new(o, "steps_per_s", w->have_rate ? json_real(w->rate) : json_null());
    else
      json_object_update_new(o, json_pack("{s:o?, s:o?, s:o?, s:o?}", "version",
                                      jint(w->have_version, (int64_t)w->version), "lag",
                                      jint(w->have_lag, (int64_t)w->lag), "snapshot_version",
                                      jint(w->have_snap, (int64_t)w->snap_version),
                                      "snapshot_time",
                                      jreal(w->have_snap && w->snap_time > 0, w->snap_time)));
    if (strcmp(w->role, "ps") == 0)
      json_object_update_new(o, json_pack("{s:s, s:o?, s:o?}", "redis", w->redis, "acks_held",
                                          jint(w->have_durability, (int64_t)w->held),
                                          "nondurable",
                                          jint(w->have_durability, (int64_t)w->nondurable)));
    if (strcmp(w->role, "ps") == 0) {
      /* The sparse tables' figures, null without them (or down). */
      static table_fig figs[64];
      int nf = w->tables != NULL && w->state == UP ? parse_tables(w->tables, figs, 64) : 0;
      json_t *tj = nf > 0 ? json_array() : NULL;
      for (int t = 0; t < nf; t++)
        json_array_append_new(tj, json_pack("{s:s, s:I, s:I}", "name", figs[t].name, "rows",
                                            (json_int_t)figs[t].rows, "bytes",
                                            (json_int_t)figs[t].bytes));
      json_object_set_new(o, "tables", tj != NULL ? tj : json_null());
    }
    json_array_append_new(nodes, o);
  }
  json_t *lj = l->state != UP ? NULL
               : json_pack("{s:I, s:s, s:I, s:o?}", "token", (json_int_t)l->incarnation, "host",
                           l->host, "pid", (json_int_t)l->pid, "ttl_ms",
                           jint(l->ttl_ms >= 0, l->ttl_ms));
  json_t *latest = !ci->found ? NULL
                   : json_pack("{s:s, s:I, s:f, s:f}", "name", ci->latest.name, "step",
                               (json_int_t)ci->latest.step, "time", ci->latest.time, "age_s",
                               now - ci->latest.time);
  json_t *cj = json_pack("{s:s, s:b, s:o?}", "dir", cfg->checkpoint_dir, "readable",
                         ci->readable, "latest", latest);
  if (!ci->readable)
    json_object_set_new(cj, "error", json_string(ci->why));
  json_t *j = json_pack("{s:s, s:s, s:f, s:I, s:o, s:o?, s:o}", "cluster", cfg->cluster_id,
                        "redis", conns[0].addr, "time", now, "heartbeat_ttl_ms",
                        (json_int_t)(3 * cfg->heartbeat_ms), "nodes", nodes, "chief_lease", lj,
                        "checkpoint", cj);
  if (j != NULL && cfg->mode == PS_MODE_RING)
    json_object_set_new(j, "ring_view", ring_view[0] ? json_string(ring_view) : json_null());
  int rc = j != NULL ? json_dumpf(j, stdout, JSON_INDENT(2)) : -1;
  printf("\n");
  json_decref(j);
  return rc == 0 ? 0 : 1;
}

/* ------------------------------------------------------------------ verb */

static void usage(FILE *f) {
  fprintf(f,
          "usage: paramserv status [--config FILE] [--json]\n"
          "\n"
          "Show the cluster of FILE as its records in Redis describe it (src/replica/REDIS.md):\n"
          "one row per node (the chief, every shard, every worker) with its state, host, pid,\n"
          "incarnation, AGE of its last heartbeat, its step, and steps/s (workers, chief),\n"
          "version, replication lag and snapshot version (shards); for a model with sparse\n"
          "tables, each table's rows and memory on each shard (from its heartbeat); then the\n"
          "chief's lease and the newest checkpoint of [checkpoint] dir.\n"
          "\n"
          "A node is up while its heartbeat key lives (TTL 3 x [worker] heartbeat_ms), down\n"
          "once it expired, \"never seen\" when it never took an incarnation.\n"
          "\n"
          "  --config FILE   the cluster's config file (default " DEFAULT_CONFIG ")\n"
          "  --json          the same as one JSON object (state: up, down, never_seen;\n"
          "                  unknown values are null)\n"
          "  -h, --help      this help\n"
          "\n"
          "Exit status: 0 shown (whatever the nodes' states), 1 the config or Redis cannot be\n"
          "read, 2 bad usage.\n");
}

int ps_cmd_status(int argc, char **argv) {
  static const struct option longopts[] = {
      {"config", required_argument, 0, 'c'},
      {"json", no_argument, 0, 'j'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  const char *config = DEFAULT_CONFIG;
  int as_json = 0;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'c': config = optarg; break;
    case 'j': as_json = 1; break;
    case 'h': usage(stdout); return 0;
    default:
      return ps_cmd_bad_option(c, argv, "status");
    }
  }
  if (ps_cmd_no_operands(argc, argv, "status") != 0)
    return 2;
  ps_log_init("status", PS_LOG_WARN);
  static ps_config cfg;
  int rc = ps_cmd_load_config(config, &cfg, 0);
  if (rc != 0)
    return rc;
  st_cfg = &cfg;
  char ctag[PS_KEY_MAX];
  ps_cluster_tag(ctag, cfg.cluster_id);
  conn_for(ctag);

  static row rows[1 + 2 * PS_CONFIG_MAX_NODES];
  int n = 0;
  rows[n++] = (row){.role = "chief", .index = 0};
  for (int i = 0; i < cfg.nps; i++)
    rows[n++] = (row){.role = "ps", .index = i};
  for (int j = 0; j < cfg.nworkers; j++)
    rows[n++] = (row){.role = "worker", .index = j};
  for (int i = 0; i < n; i++) {
    read_node(&cfg, &rows[i]);
    if (strcmp(rows[i].role, "ps") == 0) {
      read_snapshot(&cfg, &rows[i]);
      ps_shard_keys k;
      ps_shard_keys_init(&k, cfg.cluster_id, rows[i].index);
      rows[i].redis = node_of(k.tag);
    }
  }
  row l;
  read_lease(&cfg, &l);
  if (cfg.mode == PS_MODE_RING) {
    char key[PS_KEY_MAX];
    ps_key_ring_view(key, cfg.cluster_id);
    redisReply *r = q(key, "GET %s", key);
    if (r->type == REDIS_REPLY_STRING)
      snprintf(ring_view, sizeof ring_view, "%s", r->str);
    freeReplyObject(r);
  }
  ckpt_info ci;
  read_ckpt(cfg.checkpoint_dir, &ci);

  struct timespec ts;   /* wall time: checkpoint times are unix seconds */
  clock_gettime(CLOCK_REALTIME, &ts);
  double now = (double)ts.tv_sec + ts.tv_nsec / 1e9;
  if (as_json)
    rc = print_json(&cfg, rows, n, &l, &ci, now);
  else
    print_table(&cfg, rows, n, &l, &ci, now);
  close_redis();
  for (int i = 0; i < n; i++)
    free(rows[i].tables);
  return rc;
}
