/* `paramserv local`: a whole cluster on one machine -- redis-server, the
 * chief, the shards, the workers -- supervised, with a live progress line,
 * optional faults (src/local/nemesis.c) and a report at the end. */
#define _GNU_SOURCE /* nftw */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cmd/cli.h"
#include "cmd/cmd.h"
#include "cmd/preflight.h"
#include "common/config.h"
#include "common/metrics.h"
#include "common/timeutil.h"
#include "local/nemesis.h"
#include "local/runconf.h"
#include "local/progress.h"
#include "local/supervisor.h"
#include "recovery/checkpoint.h"

#define DEFAULT_DIR "paramserv-run"
#define TICK_MS 50
#define REDRAW_S 0.25        /* the live line on a terminal */
#define PLAIN_EVERY_S 5.0    /* the progress line when not a terminal */

static void local_usage(FILE *f) {
  fprintf(f,
      "usage: paramserv local [--config FILE] [--ps N] [--workers M] [--dir RUNDIR]\n"
      "                       [--last-step S] [--seed N] [--chaos] [--chaos-redis]\n"
      "                       [--nemesis LIST] [--fault-gap S] [--fresh]\n"
      "\n"
      "Run a whole cluster on this machine: its own redis-server, the chief, N shards and\n"
      "M workers, each a child process restarted when it dies, until the chief stops\n"
      "training at the step limit.  A live progress line shows the step, the latest\n"
      "evaluation, the speed and the restarts; the end prints a report.\n"
      "\n"
      "Each process but redis-server tells local when it serves as it tells systemd\n"
      "(sd_notify READY=1 to a NOTIFY_SOCKET of its own): a shard once it serves workers,\n"
      "a worker after its first pull, the chief once it leads with the shards' state\n"
      "restored.  Until then it is starting (RUNDIR/pids: name, pid, ready or starting);\n"
      "one still starting 30 s after its start is named with its last STATUS=, and at\n"
      "120 s the run stops (exit 1).\n"
      "\n"
      "  --config FILE   settings to train with (see systemd/cluster.conf); default: every\n"
      "                  setting's default.  local gives the run its own addresses (fresh\n"
      "                  127.0.0.1 ports), Redis, secret (unless FILE names one), checkpoint\n"
      "                  directory RUNDIR/checkpoints (unless FILE sets one) and replication\n"
      "                  mode log (unless FILE sets one); the chief initializes the shards.\n"
      "                  FILE with [redis] cluster: the run uses that Redis Cluster (and its\n"
      "                  user and password) and starts no redis-server; its keys of\n"
      "                  [cluster] id from an earlier run are restored, as a cluster's are\n"
      "  --ps N          shards (default: FILE's list, else 2)\n"
      "  --workers M     workers (default: FILE's list, else 2)\n"
      "  --dir RUNDIR    the run directory (default ./" DEFAULT_DIR "): cluster.conf, secret,\n"
      "                  logs/<process>.log, checkpoints/, pids, report.json (history/ and\n"
      "                  nemesis.jsonl with --nemesis), local.lock: one run per directory\n"
      "                  (a second one there exits 2, naming the first's PID)\n"
      "  --last-step S   train to global step S ([train] last_step)\n"
      "  --seed N        [model] seed, and the seed of the chaos schedule\n"
      "  --chaos         every 2-5 s, kill -9 a random shard, worker or the chief, and\n"
      "                  report each one's time to come back (= --nemesis kill)\n"
      "  --nemesis LIST  faults, every 2-5 s one of LIST (comma-separated) at random:\n"
      "                  kill (as --chaos), pause (SIGSTOP a shard, worker, the chief or\n"
      "                  redis-server for 0.5-6 s, then SIGCONT), redis-errors (Redis\n"
      "                  refuses writes for 1-4 s: NOREPLICAS, OOM or NOPERM, then heals);\n"
      "                  each fault's time to recover and the longest stall of the acks\n"
      "                  outside the faults are reported; the acks are read from [cluster]\n"
      "                  history_dir (default RUNDIR/history); RUNDIR/nemesis.jsonl holds\n"
      "                  one line per fault, its end and its recovery\n"
      "  --fault-gap S   a fault every S to 2.5 S seconds instead of 2-5 s (0.1..3600);\n"
      "                  every kind of the list comes once in each round of faults\n"
      "  --chaos-redis   let chaos kill redis-server too; Redis then keeps an append-only\n"
      "                  file in RUNDIR and comes back with its data (it costs about 40%%\n"
      "                  of the speed: without it, a killed Redis would come back empty)\n"
      "  --fresh         start over: delete RUNDIR's logs, checkpoints and report first\n"
      "                  (without it, a run directory of an earlier run is continued: the\n"
      "                  chief restores its latest checkpoint)\n"
      "  -h, --help      this help\n"
      "\n"
      "Ctrl-C or SIGTERM stops every process in order (workers, chief, shards, Redis;\n"
      "SIGKILL after 10 s); a second Ctrl-C kills them at once.  Nothing outlives local:\n"
      "its children get SIGKILL if it dies.\n"
      "Exit status: 0 the run reached its step limit, 1 failure (a process kept failing,\n"
      "or setup failed), 2 bad usage or a process that refused to go on (its exit 2: a\n"
      "restart would not change it, e.g. checkpoints none of which fits the model), 128 +\n"
      "the signal when stopped by one (130 SIGINT, 143 SIGTERM, 129 SIGHUP).\n");
}

typedef struct local_opts {
  const char *config, *dir;
  int64_t nps, nworkers, last_step, seed;
  int chaos_redis, fresh;
  unsigned nemesis; /* 1 << ps_nem_kind for each fault to inject */
  double gap_s;     /* --fault-gap; 0: the nemesis's default */
} local_opts;

/* The state of one run, shared by the loop, the display and the report. */
typedef struct run {
  local_opts o;
  ps_config cfg;
  char rundir[PS_CONFIG_PATH_MAX];
  char conf_path[PS_CONFIG_PATH_MAX + 32];
  char summary_path[PS_CONFIG_PATH_MAX];
  ps_sup sup;
  ps_progress sum;
  int tty;
  int line_shown;       /* the live line is on the screen */
  double started, last_plain;
  int64_t last_plain_step;
  ps_nemesis *nem;      /* NULL without --chaos or --nemesis */
} run;

/* ------------------------------------------------------------------------ */
/* Output                                                                    */
/* ------------------------------------------------------------------------ */

/* A plain line, above the live progress line when there is one. */
static void say_line(void *arg, const char *line) {
  run *r = arg;
  if (r->tty && r->line_shown) {
    fputs("\r\033[K", stdout);
    r->line_shown = 0;
  }
  printf("%s\n", line);
  fflush(stdout);
}

__attribute__((format(printf, 2, 3))) static void say(run *r, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  say_line(r, line);
}

static void progress_text(const run *r, char *buf, size_t len) {
  const ps_progress *s = &r->sum;
  size_t at = 0;
#define ADD(...) at += (size_t)snprintf(buf + at, at < len ? len - at : 0, __VA_ARGS__)
  if (!s->have_progress && !s->have_eval)
    ADD("starting");
  else if (r->cfg.last_step > 0)
    ADD("step %" PRId64 "/%" PRId64, s->step, r->cfg.last_step);
  else
    ADD("step %" PRId64, s->step);
  if (s->have_eval) {
    if (s->loss >= 0)
      ADD("  loss %.2f", s->loss);
    if (s->have_auc)
      ADD("  auc %.3f", s->auc);
    else
      ADD("  acc %.3f", s->accuracy);
  }
  if (s->have_progress && s->rate > 0) {
    ADD("  %.0f steps/s", s->rate);
    if (r->cfg.last_step > 0 && s->step < r->cfg.last_step)
      ADD("  ETA %.0fs", (double)(r->cfg.last_step - s->step) / s->rate);
  }
  ADD("  restarts %d", r->sup.restarts);
#undef ADD
}

static void show_progress(run *r, double now) {
  char line[256];
  if (r->tty) {
    progress_text(r, line, sizeof line);
    printf("\r\033[K%s", line);
    fflush(stdout);
    r->line_shown = 1;
  } else if (now - r->last_plain >= PLAIN_EVERY_S && r->sum.have_progress &&
             (r->sum.step != r->last_plain_step || r->last_plain == 0)) {
    progress_text(r, line, sizeof line);
    say(r, "%s", line);
    r->last_plain = now;
    r->last_plain_step = r->sum.step;
  }
}

/* The chief's events that the user wants to see as lines; its node_lost
 * and node_back say what local's own lines already say. */
static void on_event(void *arg, const char *event, int64_t step, json_t *obj) {
  run *r = arg;
  if (strcmp(event, "restore") == 0) {
    /* A fresh run's seeded initialization is no news. */
    const char *src = json_string_value(json_object_get(obj, "source"));
    json_t *shard = json_object_get(obj, "shard");
    if (src == NULL || strcmp(src, "init") == 0)
      return;
    if (json_is_integer(shard))
      say(r, "local: chief: shard %d restored from %s at step %" PRId64,
          (int)json_integer_value(shard), src, step);
    else
      say(r, "local: chief: every shard holds its state (%s) at step %" PRId64, src, step);
  } else if (strcmp(event, "checkpoint") == 0) {
    const char *name = json_string_value(json_object_get(obj, "name"));
    json_t *stall = json_object_get(obj, "stall_ms");
    say(r, "local: chief: checkpoint %s at step %" PRId64 " (training paused %.1f ms)",
        name ? name : "?", step, json_is_number(stall) ? json_number_value(stall) : 0.0);
  } else if (strcmp(event, "nan") == 0) {
    say(r, "local: chief: non-finite loss or weights at step %" PRId64, step);
  }
}

/* ------------------------------------------------------------------------ */
/* The run directory and its config                                          */
/* ------------------------------------------------------------------------ */

static int mkdirs(const char *path) {
  char buf[PS_CONFIG_PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return -errno;
    *p = '/';
  }
  return mkdir(buf, 0755) != 0 && errno != EEXIST ? -errno : 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

#define CONF_MARK "# Written by `paramserv local`"

/* --fresh: what an earlier run left in the directory -- only in a run
 * directory (its cluster.conf written by local), never in one that
 * happens to hold a "logs" or "checkpoints" of its own. */
static int clear_rundir(const char *dir) {
  static const char *const names[] = {"logs", "checkpoints", "pids", "report.json",
                                      "cluster.conf", "dump.rdb", "appendonlydir",
                                      "history", "nemesis.jsonl", "metrics-targets.json",
                                      NULL};
  char path[PS_CONFIG_PATH_MAX + 32], head[64] = "";
  snprintf(path, sizeof path, "%s/cluster.conf", dir);
  FILE *f = fopen(path, "re");
  if (f == NULL) {
    for (int i = 0; names[i] != NULL; i++) {
      snprintf(path, sizeof path, "%s/%s", dir, names[i]);
      if (access(path, F_OK) == 0) {
        ps_cmd_error("--fresh: %s is not a run directory of paramserv local (no cluster.conf "
                     "written by it) but holds %s: expected a new or an earlier run's directory",
                     dir, names[i]);
        return -1;
      }
    }
    return 0;
  }
  int ours = fgets(head, sizeof head, f) != NULL && strncmp(head, CONF_MARK, strlen(CONF_MARK)) == 0;
  fclose(f);
  if (!ours) {
    ps_cmd_error("--fresh: %s/cluster.conf was not written by paramserv local: expected a new or "
                 "an earlier run's directory", dir);
    return -1;
  }
  for (int i = 0; names[i] != NULL; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  }
  return 0;
}

/* An executable `name` in a directory of $PATH (the supervisor runs
 * redis-server through execvp when /usr/bin has none). */
static int in_path(const char *name) {
  const char *path = getenv("PATH");
  char buf[PS_CONFIG_PATH_MAX + 64];
  for (const char *p = path ? path : ""; *p != '\0';) {
    size_t n = strcspn(p, ":");
    snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, name);
    if (n > 0 && access(buf, X_OK) == 0)
      return 1;
    p += n + (p[n] == ':');
  }
  return 0;
}

/* One run per directory: a second run would mix its logs, checkpoints and
 * Redis into the first's.  A POSIX record lock on DIR/local.lock, held
 * while this process lives (the children do not inherit it); the file holds
 * the PID for a reader, and F_GETLK names the holder's.  Returns the open
 * descriptor, kept for the run, or -1 after the one-line error. */
static int lock_rundir(const char *dir) {
  char path[PS_CONFIG_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/local.lock", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    ps_cmd_error("--dir %s: cannot open %s: %s", dir, path, strerror(errno));
    return -1;
  }
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  if (fcntl(fd, F_SETLK, &fl) != 0) {
    int e = errno;
    struct flock who = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if ((e == EACCES || e == EAGAIN) && fcntl(fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK)
      ps_cmd_error("--dir %s: another paramserv local (PID %ld) is running there: expected one "
                   "run per directory (stop it, or use another --dir)",
                   dir, (long)who.l_pid);
    else
      ps_cmd_error("--dir %s: cannot lock %s: %s", dir, path, strerror(e));
    close(fd);
    return -1;
  }
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
    ps_cmd_error("--dir %s: cannot write %s: %s", dir, path, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

static int dir_has_checkpoints(const char *dir) {
  ps_ckpt_entry *list = NULL;
  int n = ps_ckpt_list(dir, &list, NULL);
  free(list);
  return n > 0;
}

static int setup(run *r) {
  ps_errbuf eb = {0};
  const char *dir = r->o.dir != NULL ? r->o.dir : DEFAULT_DIR;
  int rc = mkdirs(dir);
  if (rc != 0) {
    ps_cmd_error("--dir %s: cannot create: %s", dir, strerror(-rc));
    return 2;
  }
  char *real = realpath(dir, NULL);
  if (real == NULL || strlen(real) >= sizeof r->rundir - 64) {
    ps_cmd_error("--dir %s: %s", dir, real == NULL ? strerror(errno) : "path too long");
    free(real);
    return 2;
  }
  snprintf(r->rundir, sizeof r->rundir, "%s", real);
  free(real);
  if (lock_rundir(r->rundir) < 0)
    return 2;
  if (r->o.fresh && clear_rundir(r->rundir) != 0)
    return 2;

  ps_runconf_opts ro = {.user_path = r->o.config, .rundir = r->rundir,
                        .nps = (int)r->o.nps, .nworkers = (int)r->o.nworkers,
                        .last_step = r->o.last_step, .seed = r->o.seed};
  if (ps_runconf_make(&ro, &r->cfg, &eb) != 0) {
    ps_cmd_error("%s", eb.msg);
    return 2;
  }  if (r->cfg.ncluster == 0 && access("/usr/bin/redis-server", X_OK) != 0 &&
      !in_path("redis-server")) {
    ps_cmd_error("redis-server: not found: expected Debian's /usr/bin/redis-server (`make deps` "
                 "installs it)");
    return 2;
  }
  if (r->cfg.ncluster > 0 && r->o.chaos_redis) {
    ps_cmd_error("--chaos-redis with [redis] cluster in %s: expected no --chaos-redis (the "
                 "Redis Cluster is the config's, not the run's to kill)", r->o.config);
    return 2;
  }
  if (r->cfg.ncluster > 0 && (r->o.nemesis & (1u << PS_NEM_REDIS_ERRORS))) {
    ps_cmd_error("--nemesis redis-errors with [redis] cluster in %s: expected kill or pause (the "
                 "Redis Cluster is the config's, not the run's to make refuse writes)",
                 r->o.config);
    return 2;
  }

  /* The nemesis reads the acks from the workers' histories. */
  if (r->o.nemesis != 0 && r->cfg.history_dir[0] == '\0')
    snprintf(r->cfg.history_dir, sizeof r->cfg.history_dir, "%.*s/history",
             (int)sizeof r->cfg.history_dir - 16, r->rundir);
  struct stat sb;
  if (r->cfg.data_format == PS_DATA_CRITEO) {
    char path[PS_CONFIG_PATH_MAX];
    ps_config_file_path(&r->cfg, r->cfg.train_data, path, sizeof path);
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
      ps_cmd_error("[data] train %s: %s: expected a Criteo-format file (scripts/gen-ctr writes "
                   "one)", path, stat(path, &sb) != 0 ? strerror(errno) : "not a regular file");
      return 2;
    }
  } else if (r->cfg.data_format == PS_DATA_IDX &&
             (stat(r->cfg.data_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
    ps_cmd_error("[model] data_dir %s: %s: expected the Fashion-MNIST IDX files (`make deps` "
                 "installs Debian's dataset-fashion-mnist)",
                 r->cfg.data_dir, stat(r->cfg.data_dir, &sb) != 0 ? strerror(errno)
                                                                  : "not a directory");
    return 2;
  }
  if ((rc = mkdirs(r->cfg.checkpoint_dir)) != 0) {
    ps_cmd_error("[checkpoint] dir %s: cannot create: %s", r->cfg.checkpoint_dir, strerror(-rc));
    return 2;
  }
  snprintf(r->conf_path, sizeof r->conf_path, "%s/cluster.conf", r->rundir);
  if (ps_runconf_write(&r->cfg, r->conf_path, &eb) != 0) {
    ps_cmd_error("%s", eb.msg);
    return 2;
  }
  /* paramserv check's checks of the secret (written by ps_runconf_write
   * when the run makes its own), the model, the checkpoint directory and
   * npy data (every file read, and the model fitting it): what would
   * otherwise fail in a child, restarted. */
  if (ps_preflight_files(&r->cfg, 1) != 0)
    return 2;
  if (r->cfg.history_dir[0] != '\0' && (rc = mkdirs(r->cfg.history_dir)) != 0) {
    ps_cmd_error("[cluster] history_dir %s: cannot create: %s", r->cfg.history_dir, strerror(-rc));
    return 2;
  }
  if (r->cfg.summary_file[0] != '\0')
    snprintf(r->summary_path, sizeof r->summary_path, "%s", r->cfg.summary_file);
  else
    snprintf(r->summary_path, sizeof r->summary_path, "%.*s/summaries.jsonl",
             (int)sizeof r->summary_path - 20, r->cfg.checkpoint_dir);
  return 0;
}

/* Prometheus's file_sd targets of the run's processes, one entry per
 * process labelled with its role and index (the same labels its series
 * carry: scrape with honor_labels: true), written to a temporary name and
 * renamed, as Prometheus rereads the file when it changes. */
static int write_targets(run *r) {
  if (r->cfg.metrics_listen.port == 0)
    return 0;
  json_t *list = json_array();
  int n = 1 + r->cfg.nps + r->cfg.nworkers;
  for (int i = 0; i < n && list != NULL; i++) {
    const char *role = i == 0 ? "chief" : i <= r->cfg.nps ? "ps" : "worker";
    int index = i == 0 ? 0 : i <= r->cfg.nps ? i - 1 : i - 1 - r->cfg.nps;
    ps_addr a;
    char at[300], ix[16];
    ps_metrics_addr(&r->cfg, role, index, &a);
    ps_addr_format(&a, at, sizeof at);
    snprintf(ix, sizeof ix, "%d", index);
    json_array_append_new(list, json_pack("{s:[s], s:{s:s, s:s}}", "targets", at, "labels", "role",
                                          role, "index", ix));
  }
  char path[PS_CONFIG_PATH_MAX + 32], tmp[PS_CONFIG_PATH_MAX + 40];
  snprintf(path, sizeof path, "%s/metrics-targets.json", r->rundir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int rc = list != NULL && json_dump_file(list, tmp, JSON_INDENT(2)) == 0 ? rename(tmp, path) : -1;
  json_decref(list);
  if (rc != 0) {
    ps_cmd_error("%s: cannot write: %s", path, strerror(errno));
    return 1;
  }
  char at[300];
  ps_addr_format(&r->cfg.metrics_listen, at, sizeof at);
  say(r, "local: metrics: http://%s/metrics and the next %d ports (the chief, then %d shards, "
      "then %d workers); Prometheus targets: %s", at, n - 1, r->cfg.nps, r->cfg.nworkers, path);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The report                                                                */
/* ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Worker 0's last "final test_acc A" line, when the chief logged no
 * evaluation. */
static int worker_accuracy(const run *r, double *acc) {
  char path[PS_CONFIG_PATH_MAX + 32], line[512];
  snprintf(path, sizeof path, "%s/logs/worker-0.log", r->rundir);
  FILE *f = fopen(path, "re");
  int found = 0;
  if (f == NULL)
    return 0;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "final test_acc %lf", acc) == 1)
      found = 1;
  fclose(f);
  return found;
}

static void latest_checkpoint(const run *r, char *buf, size_t len) {
  ps_ckpt_entry *list = NULL;
  int n = ps_ckpt_list(r->cfg.checkpoint_dir, &list, NULL);
  buf[0] = '\0';
  for (int i = 0; i < n; i++)
    if (list[i].on_disk)
      snprintf(buf, len, "%s", list[i].name);
  free(list);
}

static void report(run *r, int status, double now) {
  ps_sup *s = &r->sup;
  ps_progress *sum = &r->sum;
  json_t *j = json_object();
  double secs = now - r->started;
  json_object_set_new(j, "status", json_integer(status));
  json_object_set_new(j, "seconds", json_real(secs));
  json_object_set_new(j, "last_step", json_integer(r->cfg.last_step));
  json_object_set_new(j, "step", json_integer(sum->step));
  json_object_set_new(j, "chaos", json_boolean(r->nem != NULL));
  json_object_set_new(j, "seed", json_integer(r->cfg.seed));

  char line[1024];
  double acc = 0;
  if (sum->have_eval && sum->have_auc) {
    snprintf(line, sizeof line, "test AUC %.4f at step %" PRId64, sum->auc, sum->eval_step);
    json_object_set_new(j, "auc", json_real(sum->auc));
    json_object_set_new(j, "accuracy_step", json_integer(sum->eval_step));
    json_object_set_new(j, "loss", json_real(sum->loss));
  } else if (sum->have_eval) {
    snprintf(line, sizeof line, "test accuracy %.4f at step %" PRId64, sum->accuracy,
             sum->eval_step);
    json_object_set_new(j, "accuracy", json_real(sum->accuracy));
    json_object_set_new(j, "accuracy_step", json_integer(sum->eval_step));
    if (sum->loss >= 0)
      json_object_set_new(j, "loss", json_real(sum->loss));
  } else if (worker_accuracy(r, &acc)) {
    snprintf(line, sizeof line, "test accuracy %.4f (worker 0's final evaluation)", acc);
    json_object_set_new(j, "accuracy", json_real(acc));
  } else {
    snprintf(line, sizeof line, "no evaluation");
  }
  char of[32] = "";
  if (r->cfg.last_step > 0)
    snprintf(of, sizeof of, "/%" PRId64, r->cfg.last_step);
  say(r, "local: %s after %.1f s: step %" PRId64 "%s, %s", status == 0 ? "done" : "stopped",
      secs, sum->step, of, line);

  /* The faults, then every death's time to come back per role. */
  if (r->nem != NULL)
    ps_nemesis_report(r->nem, j, now);
  json_t *rec = json_object();
  int any = 0;
  for (int role = 0; role < PS_SUP_NROLES; role++)
    any |= s->nrecovery[role] > 0;
  if (any)
    say(r, "local: time from a death (killed or failed) to back, per role:");
  for (int role = 0; role < PS_SUP_NROLES; role++) {
    const char *name = ps_sup_role_name((ps_sup_role)role);
    json_t *times = json_array();
    size_t n = s->nrecovery[role];
    for (size_t i = 0; i < n; i++)
      json_array_append_new(times, json_real(s->recovery[role][i]));
    json_object_set_new(rec, name, times);
    if (n > 0) {
      double max = 0;
      for (size_t i = 0; i < n; i++)
        max = fmax(max, s->recovery[role][i]);
      say(r, "local:   %-6s %3zu back: median %.2f s, max %.2f s", name, n,
          median(s->recovery[role], n), max);
    }
  }
  json_object_set_new(j, "recovery_s", rec);

  json_t *restarts = json_object();
  char list[512] = "";
  size_t at = 0;
  for (int i = 0; i < s->nchildren; i++) {
    ps_sup_child *c = &s->children[i];
    int n = c->starts > 0 ? c->starts - 1 : 0;
    json_object_set_new(restarts, c->file, json_integer(n));
    if (n > 0 && at < sizeof list)
      at += (size_t)snprintf(list + at, sizeof list - at, "%s%s %d", at ? ", " : "", c->name, n);
  }
  json_object_set_new(j, "restarts", restarts);
  say(r, "local: restarts: %d%s%s%s", s->restarts, at ? " (" : "", list, at ? ")" : "");

  if (sum->have_progress) {
    json_object_set_new(j, "max_progress_gap_s", json_real(sum->max_gap));
    json_object_set_new(j, "max_progress_gap_step", json_integer(sum->max_gap_step));
  }
  char ckpt[PS_CKPT_NAME_MAX + 1];
  latest_checkpoint(r, ckpt, sizeof ckpt);
  json_object_set_new(j, "checkpoint_dir", json_string(r->cfg.checkpoint_dir));
  json_object_set_new(j, "latest_checkpoint", json_string(ckpt));
  json_object_set_new(j, "summary_file", json_string(r->summary_path));
  json_object_set_new(j, "run_dir", json_string(r->rundir));
  if (s->why[0])
    json_object_set_new(j, "error", json_string(s->why));
  say(r, "local: checkpoints: %s%s%s%s", r->cfg.checkpoint_dir, ckpt[0] ? " (latest " : "", ckpt,
      ckpt[0] ? ")" : " (none written)");
  say(r, "local: logs: %s/logs; summaries: %s; report: %s/report.json", r->rundir,
      r->summary_path, r->rundir);

  char path[PS_CONFIG_PATH_MAX + 32], tmp[PS_CONFIG_PATH_MAX + 40];
  snprintf(path, sizeof path, "%s/report.json", r->rundir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (json_dump_file(j, tmp, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) == 0)
    rename(tmp, path);
  json_decref(j);
}

/* ------------------------------------------------------------------------ */
/* The verb                                                                  */
/* ------------------------------------------------------------------------ */

static int parse_args(int argc, char **argv, local_opts *o) {
  enum { O_CONFIG = 1, O_PS, O_WORKERS, O_CHAOS, O_CHAOS_REDIS, O_DIR, O_LAST, O_SEED, O_FRESH,
         O_NEMESIS, O_GAP };
  static const struct option longopts[] = {
      {"config", required_argument, 0, O_CONFIG},  {"ps", required_argument, 0, O_PS},
      {"workers", required_argument, 0, O_WORKERS}, {"chaos", no_argument, 0, O_CHAOS},
      {"chaos-redis", no_argument, 0, O_CHAOS_REDIS}, {"dir", required_argument, 0, O_DIR},
      {"last-step", required_argument, 0, O_LAST}, {"seed", required_argument, 0, O_SEED},
      {"fresh", no_argument, 0, O_FRESH},           {"help", no_argument, 0, 'h'},
      {"nemesis", required_argument, 0, O_NEMESIS}, {"fault-gap", required_argument, 0, O_GAP},
      {0, 0, 0, 0},
  };
  *o = (local_opts){.last_step = -1, .seed = -1};
  opterr = 0;
  optind = 1;
  int c, rc = 0;
  while (rc == 0 && (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case O_CONFIG: o->config = optarg; break;
    case O_PS: rc = ps_cmd_flag_i64("ps", optarg, 1, PS_CONFIG_MAX_NODES, &o->nps); break;
    case O_WORKERS:
      rc = ps_cmd_flag_i64("workers", optarg, 1, PS_CONFIG_MAX_NODES, &o->nworkers);
      break;
    case O_CHAOS: o->nemesis |= 1u << PS_NEM_KILL; break;
    case O_CHAOS_REDIS:
      o->nemesis |= 1u << PS_NEM_KILL;
      o->chaos_redis = 1;
      break;
    case O_NEMESIS: {
      unsigned kinds;
      ps_errbuf eb = {0};
      if (ps_nemesis_parse(optarg, &kinds, &eb) != 0) {
        ps_cmd_error("%s", eb.msg);
        return -1;
      }
      o->nemesis |= kinds;
      break;
    }
    case O_GAP: rc = ps_cmd_flag_double("fault-gap", optarg, 0.1, 3600, &o->gap_s); break;
    case O_DIR: o->dir = optarg; break;
    case O_LAST: rc = ps_cmd_flag_i64("last-step", optarg, 0, INT64_C(1) << 62, &o->last_step); break;
    case O_SEED: rc = ps_cmd_flag_i64("seed", optarg, 0, INT64_C(1) << 62, &o->seed); break;
    case O_FRESH: o->fresh = 1; break;
    case 'h': local_usage(stdout); return 1;
    default:
      ps_cmd_bad_option(c, argv, "local");
      return -1;
    }
  }
  if (rc != 0)
    return -1;
  if (ps_cmd_no_operands(argc, argv, "local") != 0)
    return -1;
  if (o->dir != NULL && o->dir[0] == '\0') {
    ps_cmd_error("--dir '': expected a directory");
    return -1;
  }
  if (o->gap_s > 0 && o->nemesis == 0) {
    ps_cmd_error("--fault-gap without faults: add --chaos or --nemesis LIST");
    return -1;
  }
  return 0;
}

int ps_cmd_local(int argc, char **argv) {
  static run r;
  memset(&r, 0, sizeof r);
  int rc = parse_args(argc, argv, &r.o);
  if (rc != 0)
    return rc > 0 ? 0 : 2;
  if ((rc = setup(&r)) != 0)
    return rc;

  /* The signals come through sigtimedwait in the loop, never to handlers. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigprocmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  r.tty = isatty(1);
  r.started = ps_now_s();
  ps_progress_init(&r.sum, r.summary_path, 0);
  ps_errbuf eb = {0};
  if (ps_sup_init(&r.sup, &r.cfg, r.conf_path, r.rundir, say_line, &r, &eb) != 0) {
    ps_cmd_error("%s", eb.msg);
    return 1;
  }
  r.sup.redis_aof = r.o.chaos_redis;
  char faults[64] = "";
  if (r.o.nemesis != 0) {
    r.nem = ps_nemesis_new(&r.sup, &r.cfg, &r.sum, r.rundir, r.o.nemesis, r.o.chaos_redis,
                           r.o.gap_s, (uint64_t)r.cfg.seed, &eb);
    if (r.nem == NULL) {
      ps_cmd_error("%s", eb.msg);
      ps_sup_close(&r.sup);
      return 1;
    }
    size_t at = (size_t)snprintf(faults, sizeof faults, "; faults:");
    for (int k = 0; k < PS_NEM_NKINDS; k++)
      if (r.o.nemesis & (1u << k) && at < sizeof faults)
        at += (size_t)snprintf(faults + at, sizeof faults - at, " %s%s",
                               ps_nemesis_kind_name((ps_nem_kind)k),
                               k == PS_NEM_KILL && r.o.chaos_redis ? " (Redis too)" : "");
  }
  if (dir_has_checkpoints(r.cfg.checkpoint_dir))
    say(&r, "local: %s holds checkpoints of an earlier run: the chief restores the latest "
        "(--fresh starts over)", r.cfg.checkpoint_dir);
  char last[32] = "no step limit";
  if (r.cfg.last_step > 0)
    snprintf(last, sizeof last, "last step %" PRId64, r.cfg.last_step);
  static const char *const repl[] = {"off", "snapshot", "log"};
  char redis[PS_CONFIG_PATH_MAX];
  if (r.cfg.ncluster > 0) {
    char a[300];
    snprintf(redis, sizeof redis, "the Redis Cluster of %s (%s, ...)", r.o.config,
             ps_addr_format(&r.cfg.redis_cluster[0], a, sizeof a));
  } else {
    snprintf(redis, sizeof redis, "redis on port %u", (unsigned)r.cfg.redis.port);
  }
  say(&r, "local: run directory %s: %s, the chief, %d shard%s, %d worker%s; %s, "
      "replication %s%s", r.rundir, redis, r.cfg.nps,
      r.cfg.nps == 1 ? "" : "s", r.cfg.nworkers, r.cfg.nworkers == 1 ? "" : "s", last,
      repl[r.cfg.replication], faults);
  if (write_targets(&r) != 0) {
    ps_nemesis_free(r.nem);
    ps_sup_close(&r.sup);
    return 1;
  }
  if (ps_sup_start(&r.sup, &eb) != 0) {
    ps_cmd_error("%s", eb.msg);
    ps_nemesis_free(r.nem);
    ps_sup_close(&r.sup);
    return 1;
  }

  int signalled = 0;
  double last_draw = 0;
  while (r.sup.phase != PS_SUP_OVER) {
    struct timespec ts = {0, TICK_MS * 1000000L};
    siginfo_t info;
    int sig = sigtimedwait(&set, &info, &ts);
    double now = ps_now_s();
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (signalled) {
        say(&r, "local: %s again: killing every process", strsignal(sig));
        ps_sup_kill_all(&r.sup);
      } else {
        signalled = sig;
        say(&r, "local: %s: stopping every process (workers, chief, shards, Redis)",
            strsignal(sig));
        ps_sup_stop(&r.sup, now, 128 + sig, NULL);
      }
    }
    /* The summaries first: a chief's last lines are told before its exit. */
    ps_progress_poll(&r.sum, on_event, &r);
    ps_sup_poll(&r.sup, now);
    /* No faults once the chief reached the step limit: its final
     * checkpoint, evaluation and stop are the run's end, not a fault test;
     * then, or when the run stops, every pause and Redis window ends. */
    if (r.nem != NULL)
      ps_nemesis_poll(r.nem, now,
                      r.sup.phase == PS_SUP_RUN && !r.sum.stopped &&
                          (r.cfg.last_step == 0 || r.sum.step < r.cfg.last_step));
    if (now - last_draw >= REDRAW_S) {
      if (r.sup.phase != PS_SUP_OVER)
        show_progress(&r, now);
      last_draw = now;
    }
  }
  ps_progress_poll(&r.sum, on_event, &r);
  if (r.tty && r.line_shown) {
    fputs("\r\033[K", stdout);
    r.line_shown = 0;
  }
  int status = r.sup.result;
  if (r.sup.why[0])
    say(&r, "local: %s", r.sup.why);
  report(&r, status, ps_now_s());
  ps_nemesis_free(r.nem);
  ps_sup_write_pids(&r.sup);
  ps_sup_close(&r.sup);
  return status;
}
