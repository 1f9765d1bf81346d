/* The pre-flight checks of a config (preflight.h), one line each. */
#include "cmd/preflight.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/cli.h"
#include "common/config.h"
#include "data/criteo.h"
#include "data/idx.h"
#include "data/npy.h"
#include "layout/layout.h"
#include "nn/modelfile.h"
#include "nn/model.h"
#include "recovery/checkpoint.h"
#include "replica/keys.h"

typedef struct tally {
  int errors;     /* a file or setting: what a restart would not change */
} tally;

static int quiet;  /* errors only, as paramserv: error: lines on stderr */

static void say(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const char *level, const char *fmt, ...) {
  if (quiet && strcmp(level, "error") != 0)
    return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (quiet) {
    ps_cmd_error("%s", msg);
    return;
  }
  for (char *p = msg; *p; p++)
    if (*p == '\n')
      *p = ' ';
  printf("%s: %s\n", level, msg);
}

/* The secret: readable, mode 600 (ps_config_read_secret), and owned by the
 * user this runs as, as the runbook says (chown paramserv:paramserv). */
static void check_secret(const ps_config *cfg, tally *t) {
  uint8_t secret[4096];
  ps_errbuf eb = {0};
  int n = ps_config_read_secret(cfg, secret, sizeof secret, &eb);
  explicit_bzero(secret, sizeof secret);
  if (n < 0) {
    say("error", "%s", eb.msg);
    t->errors++;
    return;
  }
  char path[2 * PS_CONFIG_PATH_MAX];
  ps_config_file_path(cfg, cfg->secret_file, path, sizeof path);
  struct stat sb;
  if (stat(path, &sb) == 0 && sb.st_uid != geteuid()) {
    say("warn", "secret %s is owned by uid %u, not by this user (uid %u): the units run as "
        "paramserv (chown paramserv:paramserv %s)", path, (unsigned)sb.st_uid,
        (unsigned)geteuid(), path);
    return;
  }
  say("ok", "secret %s: %d bytes, mode 600, owned by this user", path, n);
}

static void check_model(const ps_config *cfg, tally *t) {
  ps_model model;
  ps_layout layout;
  ps_errbuf eb = {0};
  if (ps_layout_for_cluster(cfg, &model, &layout, &eb) != 0) {
    say("error", "%s", eb.msg);
    t->errors++;
    return;
  }
  char desc[PS_MODEL_DESC_MAX];
  size_t floats = 0;
  for (int i = 0; i < layout.nshards; i++)
    floats += layout.shard_floats[i];
  say("ok", "model %s: %zu floats (%.1f MB) on %d shard%s, layout %016" PRIx64,
      ps_model_spec_format(&model.spec, desc, sizeof desc), floats, (double)floats * 4e-6,
      layout.nshards, layout.nshards == 1 ? "" : "s", layout.hash);
  ps_layout_close(&layout);
  ps_model_close(&model);
}

/* [data] format = npy: each directory loads (every check of NPY.md) and
 * the model takes its samples and labels. */
static void check_npy(const ps_config *cfg, tally *t) {
  const char *dirs[2] = {cfg->train_data, cfg->test_data}, *keys[2] = {"train", "test"};
  ps_model model;
  ps_errbuf eb = {0};
  /* A model that does not build is check_model's error. */
  int have_model = ps_model_for_config(cfg, &model, &eb) == 0;
  for (int i = 0; i < 2; i++) {
    char path[PS_CONFIG_PATH_MAX];
    ps_dataset ds;
    if (dirs[i][0] == '\0')
      continue;
    ps_config_file_path(cfg, dirs[i], path, sizeof path);
    if (ps_npy_load(path, &ds, &eb) != 0) {
      say("error", "[data] %s: %s", keys[i], eb.msg);
      t->errors++;
      continue;
    }
    if (have_model && ps_model_check_inputs(&model, ds.dim, ds.classes, &eb) != 0) {
      say("error", "[data] %s %s: %s", keys[i], path, eb.msg);
      t->errors++;
    } else if (i == 0 && ds.n < (size_t)cfg->nworkers) {
      say("error", "[data] train %s: %zu samples, fewer than the %d workers: expected at least "
          "one a worker", path, ds.n, cfg->nworkers);
      t->errors++;
    } else {
      say("ok", "[data] %s %s: npy, %zu samples of %zu floats, labels 0..%d", keys[i], path,
          ds.n, ds.dim, ds.classes - 1);
    }
    ps_dataset_close(&ds);
  }
  if (have_model)
    ps_model_close(&model);
}

static void check_data(const ps_config *cfg, tally *t) {
  static const char *const splits[] = {"train", "t10k"};
  if (cfg->data_format == PS_DATA_NPY) {
    check_npy(cfg, t);
    return;
  }
  if (cfg->data_format == PS_DATA_CRITEO) {
    const char *files[2] = {cfg->train_data, cfg->test_data}, *keys[2] = {"train", "test"};
    for (int i = 0; i < 2; i++) {
      char path[PS_CONFIG_PATH_MAX];
      ps_criteo *rd = NULL;
      ps_errbuf eb = {0};
      if (files[i][0] == '\0')
        continue;
      ps_config_file_path(cfg, files[i], path, sizeof path);
      /* The first batch parses: the format, not every line (a count would
       * read the whole file). */
      float label[16], dense[16 * PS_CRITEO_NDENSE];
      uint64_t keys16[16 * PS_CRITEO_NSPARSE];
      if (ps_criteo_open(&rd, path, 0, 1, &eb) != 0 ||
          ps_criteo_next(rd, 16, label, dense, keys16, &eb) < 0) {
        say("error", "[data] %s: %s", keys[i], eb.msg);
        t->errors++;
      } else {
        say("ok", "[data] %s %s: Criteo format", keys[i], path);
      }
      ps_criteo_close(rd);
    }
    return;
  }
  for (int i = 0; i < 2; i++) {
    ps_dataset ds;
    ps_errbuf eb = {0};
    if (ps_dataset_load(cfg->data_dir, splits[i], &ds, &eb) != 0) {
      say("error", "[model] data_dir: %s", eb.msg);
      t->errors++;
      continue;
    }
    say("ok", "[model] data_dir %s: %s set, %zu images of %ux%u", cfg->data_dir, splits[i],
        ds.n, (unsigned)ds.rows, (unsigned)ds.cols);
    ps_dataset_close(&ds);
  }
}

/* The checkpoint directory: writable (created on the chief's start if
 * missing: then its nearest existing parent must be), and what it holds. */
static void check_ckpt_dir(const ps_config *cfg, tally *t) {
  const char *dir = cfg->checkpoint_dir;
  struct stat sb;
  ps_errbuf eb = {0};
  if (stat(dir, &sb) != 0) {
    char up[PS_CONFIG_PATH_MAX];
    snprintf(up, sizeof up, "%s", dir);
    for (char *s = strrchr(up, '/'); ; s = strrchr(up, '/')) {
      if (s == NULL) {
        snprintf(up, sizeof up, ".");
        break;
      }
      if (s == up) {
        up[1] = '\0';
        break;
      }
      *s = '\0';
      if (stat(up, &sb) == 0)
        break;
    }
    if (access(up, W_OK) != 0) {
      say("error", "[checkpoint] dir %s: missing, and %s is not writable by this user (%s): "
          "expected a directory the chief can create", dir, up, strerror(errno));
      t->errors++;
    } else {
      say("ok", "[checkpoint] dir %s: missing; the chief creates it (in %s)", dir, up);
    }
    return;
  }
  if (ps_ckpt_dir_writable(dir, &eb) != 0) {
    say("error", "[checkpoint] dir: %s", eb.msg);
    t->errors++;
    return;
  }
  ps_ckpt_entry *list = NULL;
  int n = ps_ckpt_list(dir, &list, &eb);
  if (n < 0) {
    say("error", "[checkpoint] dir: %s", eb.msg);
    t->errors++;
  } else if (n == 0) {
    say("ok", "[checkpoint] dir %s: writable, no checkpoints (a run starts from the seed)", dir);
  } else {
    say("ok", "[checkpoint] dir %s: writable, %d checkpoint%s, the newest %s", dir, n,
        n == 1 ? "" : "s", list[n - 1].name);
  }
  free(list);
}

/* Each shard's address (each member's in ring mode): free here, in use
 * (a process listens there: a shard of this cluster running?), or not this
 * machine's (another machine's shard). */
void ps_preflight_ports(const ps_config *cfg) {
  int ring = cfg->mode == PS_MODE_RING;
  int n = ring ? cfg->nworkers : cfg->nps;
  const ps_addr *list = ring ? cfg->workers : cfg->ps;
  for (int i = 0; i < n; i++) {
    const ps_addr *a = &list[i];
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)a->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res = NULL;
    int gai = getaddrinfo(a->host, port, &hints, &res);
    if (gai != 0) {
      say("warn", "%s %d, %s:%u: the name does not resolve here: %s", ring ? "member" : "shard",
          i, a->host, (unsigned)a->port, gai_strerror(gai));
      continue;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), e = 0;
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, res->ai_addr, res->ai_addrlen) != 0)
      e = errno;
    if (fd >= 0)
      close(fd);
    freeaddrinfo(res);
    const char *what = e == 0               ? "free on this machine"
                       : e == EADDRINUSE    ? "in use here: a process listens there (a shard "
                                              "of this cluster running, or another program)"
                       : e == EADDRNOTAVAIL ? "not an address of this machine (another "
                                              "machine's)"
                                            : strerror(e);
    say(e == EADDRINUSE ? "warn" : "ok", "%s %d, %s:%u: %s", ring ? "member" : "shard", i,
        a->host, (unsigned)a->port, what);
  }
}

int ps_preflight_redis(const ps_config *cfg) {
  ps_errbuf eb = {0};
  char at[300];
  ps_addr_format(&cfg->redis, at, sizeof at);
  char tag[PS_KEY_MAX];
  ps_cluster_tag(tag, cfg->cluster_id);
  redisContext *c = ps_redis_connect(cfg, tag, cfg->redis_timeout_ms, &eb);
  if (c == NULL) {
    if (eb.code == -EACCES) {
      say("error", "%s", eb.msg);
      return 1;
    }
    say("error", "redis: nothing answers: %s; %s", eb.msg,
        ps_redis_running_here() ? "a redis-server runs on this machine: is [redis] address its "
                                "address and port?"
                              : "no redis-server runs on this machine (systemctl start "
                                "redis-server, or [redis] address names another machine's)");
    return 1;
  }
  if (c->tcp.host != NULL)  /* the node the Sentinels or the cluster named */
    snprintf(at, sizeof at, "%s:%d", c->tcp.host, c->tcp.port);
  for (int i = 0; i < cfg->nps && cfg->ncluster > 0; i++) {
    ps_shard_keys k;
    ps_shard_keys_init(&k, cfg->cluster_id, i);
    ps_addr node;
    char a[300];
    if (ps_redis_primary(cfg, k.tag, cfg->redis_timeout_ms, &node, &eb) != 0) {
      say("error", "redis cluster: shard %d: %s", i, eb.msg);
      redisFree(c);
      return 1;
    }
    say("ok", "redis cluster: shard %d's keys (%s) on the primary %s", i, k.tag,
        ps_addr_format(&node, a, sizeof a));
  }
  redisReply *r = redisCommand(c, "CONFIG GET *");
  if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
    say("warn", "redis %s answers, but its settings cannot be read (CONFIG GET: %s): "
        "persistence not checked", at,
        r == NULL ? c->errstr : r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    freeReplyObject(r);
    redisFree(c);
    return 0;
  }
  const char *aof = "?", *save = "?", *policy = "?", *maxmem = "0";
  for (size_t i = 0; i + 1 < r->elements; i += 2) {
    const char *k = r->element[i]->str, *v = r->element[i + 1]->str;
    if (k == NULL || v == NULL)
      continue;
    if (strcmp(k, "appendonly") == 0)
      aof = v;
    else if (strcmp(k, "save") == 0)
      save = v;
    else if (strcmp(k, "maxmemory-policy") == 0)
      policy = v;
    else if (strcmp(k, "maxmemory") == 0)
      maxmem = v;
  }
  say("ok", "redis %s answers (appendonly %s, save '%s', maxmemory %s, maxmemory-policy %s)", at,
      aof, save, maxmem, policy);
  if (strcmp(aof, "yes") != 0 && save[0] == '\0')
    say("warn", "redis %s keeps its data in memory only (appendonly no, save ''): a restart of "
        "Redis empties it; the shards then write their states again and the chief its records, "
        "but a shard killed while Redis is down restores from the last checkpoint", at);
  if (strcmp(maxmem, "0") != 0 && strcmp(policy, "noeviction") != 0)
    say("warn", "redis %s evicts keys when full (maxmemory-policy %s): set noeviction, so that "
        "a full Redis refuses writes (which the shards wait out) instead of dropping replicas",
        at, policy);
  freeReplyObject(r);
  redisFree(c);
  return 0;
}

int ps_preflight_config(const char *path, ps_config *cfg) {
  ps_errbuf eb = {0};
  if (ps_config_load(path, cfg, &eb) != 0) {
    say("error", "%s", eb.msg);
    return 2;
  }
  say("ok", "config %s: cluster %s, %d shard%s, %d worker%s", path, cfg->cluster_id, cfg->nps,
      cfg->nps == 1 ? "" : "s", cfg->nworkers, cfg->nworkers == 1 ? "" : "s");
  return 0;
}

int ps_preflight_files(const ps_config *cfg, int errors_only) {
  tally t = {0};
  quiet = errors_only;
  check_secret(cfg, &t);
  check_model(cfg, &t);
  /* paramserv local checks an IDX or Criteo data set's place itself; npy
   * data is read here, so that a bad file is one line before any child. */
  if (!errors_only || cfg->data_format == PS_DATA_NPY)
    check_data(cfg, &t);
  check_ckpt_dir(cfg, &t);
  quiet = 0;
  return t.errors;
}
