/* The nemesis of `paramserv local`: kills, pauses and Redis write refusals on one seeded schedule, with their recovery times. */
#define _GNU_SOURCE /* memrchr */
#include "local/nemesis.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"

#define GAP_SPREAD 2.5       /* a gap between two faults' starts: gap_s .. 2.5 gap_s */
#define PAUSE_MIN_S 0.5      /* past [redis] timeout_ms (3 s), heartbeats and ... */
#define PAUSE_MAX_S 6.0      /* ... the chief's lease (5 s) for some */
#define REFUSE_MIN_S 1.0
#define REFUSE_MAX_S 4.0
#define EXCUSE_S 5.0         /* after a pause or a window, deaths are the fault's (ps_sup_excuse) */
#define MAX_FAULTS 4096
#define REDIS_TIMEOUT_US 300000

static const char *const kind_names[] = {"kill", "pause", "redis-errors"};

const char *ps_nemesis_kind_name(ps_nem_kind k) { return kind_names[k]; }

/* How Redis is made to refuse writes, each healed by its own setting. */
typedef enum refusal { REFUSE_NOREPLICAS = 0, REFUSE_OOM, REFUSE_NOPERM, NREFUSALS } refusal;
static const char *const refusal_names[] = {"NOREPLICAS", "OOM", "NOPERM"};

typedef struct fault {
  ps_nem_kind kind;
  int child;            /* index into sup->children; -1 for redis-errors */
  pid_t pid;            /* the process signalled */
  int starts;           /* the child's incarnations when it was hit */
  refusal how;
  double at, end_at;    /* injected; ended (SIGCONT, heal, or back for a kill); 0 = not yet */
  double planned;       /* how long a pause or a window was to last */
  double recovered_at;  /* 0 = not yet */
  int replaced;         /* recovered as a new incarnation (killed, or fenced and restarted) */
  int64_t chief_step;   /* the chief's progress step at the end (a paused chief) */
  double chief_time;
  uint64_t acks_at_end[PS_CONFIG_MAX_NODES]; /* per shard, when the fault ended */
  uint64_t worker_acks_at_end;                /* of the paused worker */
  uint64_t steps_at_end;                      /* ring mode: steps completed by any member */
} fault;

struct ps_nemesis {
  ps_sup *sup;
  const ps_config *cfg;
  const ps_progress *progress;
  unsigned kinds;
  unsigned bag;         /* kinds not yet injected this round (see start_fault) */
  int kill_redis;
  double gap_s;         /* the shortest gap between two faults' starts */
  ps_rng rng;
  double started, next_at;
  FILE *events;

  fault *faults;
  int nfaults;
  int paused[PS_SUP_MAX_CHILDREN]; /* the fault pausing each child, +1; 0 = none */
  int refusing;                    /* the open redis-errors fault, +1; 0 = none */
  int dropped;                     /* faults not recorded past MAX_FAULTS */

  /* Acks, read from the workers' histories as they grow. */
  int nworkers, nps;
  off_t hist_off[PS_CONFIG_MAX_NODES];
  uint64_t acks[PS_CONFIG_MAX_NODES];        /* per shard */
  uint64_t worker_acks[PS_CONFIG_MAX_NODES]; /* per worker */
  uint64_t total_acks;
  uint64_t total_steps;                      /* ring mode: `step` lines of every member */
  double last_ack_at;                        /* 0 until the first ack */
  /* The longest time without an ack while the nemesis was active; and of
   * such a gap, the longest part outside every fault window. */
  double stall, stall_at, stall_out, stall_out_at, stall_out_gap;
};

/* ------------------------------------------------------------------------ */
/* Events                                                                    */
/* ------------------------------------------------------------------------ */

static void say(ps_nemesis *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(ps_nemesis *n, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n->sup->say != NULL)
    n->sup->say(n->sup->say_arg, line);
}

static const char *target_name(const ps_nemesis *n, const fault *f) {
  return f->child >= 0 ? n->sup->children[f->child].file : "redis";
}

/* One line of RUNDIR/nemesis.jsonl: {"t", "fault", "kind", "target", "event", ...}. */
static void event(ps_nemesis *n, const fault *f, const char *what, double now, double secs) {
  if (n->events == NULL)
    return;
  json_t *o = json_pack("{s:f, s:i, s:s, s:s, s:s}", "t", now - n->started, "fault",
                        (int)(f - n->faults), "kind", kind_names[f->kind], "target",
                        target_name(n, f), "event", what);
  if (o == NULL)
    return;
  if (f->pid > 0)
    json_object_set_new(o, "pid", json_integer(f->pid));
  if (f->kind == PS_NEM_REDIS_ERRORS)
    json_object_set_new(o, "how", json_string(refusal_names[f->how]));
  if (secs >= 0)
    json_object_set_new(o, "secs", json_real(secs));
  char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
  json_decref(o);
  if (s != NULL) {
    fprintf(n->events, "%s\n", s);
    fflush(n->events);
    free(s);
  }
}

/* ------------------------------------------------------------------------ */
/* Set-up                                                                    */
/* ------------------------------------------------------------------------ */

int ps_nemesis_parse(const char *list, unsigned *kinds, ps_errbuf *eb) {
  *kinds = 0;
  const char *p = list;
  for (;;) {
    size_t len = strcspn(p, ",");
    int k = 0;
    while (k < PS_NEM_NKINDS && !(strlen(kind_names[k]) == len && strncmp(p, kind_names[k], len) == 0))
      k++;
    if (k == PS_NEM_NKINDS)
      return ps_err_set(eb, PS_EUSAGE, "--nemesis %s: unknown fault '%.*s': expected a list of "
                        "kill, pause, redis-errors", list, (int)len, p);
    *kinds |= 1u << k;
    if (p[len] == '\0')
      return 0;
    p += len + 1;
  }
}

ps_nemesis *ps_nemesis_new(ps_sup *sup, const ps_config *cfg, const ps_progress *progress,
                           const char *rundir, unsigned kinds, int kill_redis, double gap_s,
                           uint64_t seed, ps_errbuf *eb) {
  ps_nemesis *n = calloc(1, sizeof *n);
  fault *faults = calloc(MAX_FAULTS, sizeof *faults);
  if (n == NULL || faults == NULL) {
    free(n);
    free(faults);
    ps_err_set(eb, -ENOMEM, "nemesis: out of memory");
    return NULL;
  }
  n->sup = sup;
  n->cfg = cfg;
  n->progress = progress;
  n->kinds = kinds;
  n->kill_redis = kill_redis;
  n->gap_s = gap_s > 0 ? gap_s : PS_NEMESIS_GAP_S;
  n->faults = faults;
  n->nworkers = cfg->nworkers;
  n->nps = cfg->nps;
  ps_rng_seed(&n->rng, seed ^ 0x6e656d65736973ULL);
  char path[PS_CONFIG_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/nemesis.jsonl", rundir);
  n->events = fopen(path, "we");
  if (n->events == NULL) {
    ps_err_set(eb, -errno, "%s: cannot create: %s", path, strerror(errno));
    free(faults);
    free(n);
    return NULL;
  }
  return n;
}

/* ------------------------------------------------------------------------ */
/* Acks                                                                      */
/* ------------------------------------------------------------------------ */

/* The ack lines appended to each worker's history since the last call
 * ("ack <shard> ..."), counted per shard and per worker. */
static int read_acks(ps_nemesis *n) {
  if (n->cfg->history_dir[0] == '\0')
    return 0;
  int any = 0;
  char buf[65536 + 1];
  for (int w = 0; w < n->nworkers; w++) {
    char path[PS_CONFIG_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/worker-%d.history", n->cfg->history_dir, w);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    for (;;) {
      ssize_t got = pread(fd, buf, sizeof buf - 1, n->hist_off[w]);
      if (got <= 0)
        break;
      buf[got] = '\0';
      char *last = memrchr(buf, '\n', (size_t)got);
      if (last == NULL) /* a partial line: read it when it is whole */
        break;
      last[1] = '\0';
      for (char *line = buf; *line != '\0';) {
        char *nl = strchr(line, '\n');
        *nl = '\0';
        int shard;
        if (sscanf(line, "ack %d ", &shard) == 1 && shard >= 0 && shard < n->nps) {
          n->acks[shard]++;
          n->worker_acks[w]++;
          n->total_acks++;
          any = 1;
        } else if (strncmp(line, "step ", 5) == 0) {
          /* A ring member's completed step: its progress, as an ack is. */
          n->worker_acks[w]++;
          n->total_steps++;
          any = 1;
        }
        line = nl + 1;
      }
      n->hist_off[w] += last + 1 - buf;
    }
    close(fd);
  }
  return any;
}

/* How much of [a, b] lies in no fault window (a kill: death to back; a
 * pause: SIGSTOP to SIGCONT; redis-errors: refusal to heal; one still on
 * reaches b). */
static double uncovered(const ps_nemesis *n, double a, double b) {
  /* The windows that meet [a, b], clipped and sorted by start; there are
   * few faults per gap, so an insertion sort is enough. */
  static double lo[MAX_FAULTS], hi[MAX_FAULTS];
  int k = 0;
  for (int i = n->nfaults - 1; i >= 0; i--) {
    const fault *f = &n->faults[i];
    double e = f->end_at > 0 ? f->end_at : b;
    if (f->at >= b || e <= a)
      continue;
    double s = fmax(f->at, a);
    e = fmin(e, b);
    int j = k++;
    while (j > 0 && lo[j - 1] > s) {
      lo[j] = lo[j - 1];
      hi[j] = hi[j - 1];
      j--;
    }
    lo[j] = s;
    hi[j] = e;
  }
  double covered = 0, upto = a;
  for (int i = 0; i < k; i++) {
    if (hi[i] <= upto)
      continue;
    covered += hi[i] - fmax(lo[i], upto);
    upto = hi[i];
  }
  return (b - a) - covered;
}

static void track_stall(ps_nemesis *n, double now, int got_acks, int active) {
  if (!got_acks)
    return;
  /* Stalls count from the first ack while faults are on; the start-up and
   * the end (workers done at the step limit) are no stall. */
  if (n->last_ack_at > 0 && active) {
    double gap = now - n->last_ack_at, out = uncovered(n, n->last_ack_at, now);
    if (gap > n->stall) {
      n->stall = gap;
      n->stall_at = n->last_ack_at - n->started;
    }
    if (out > n->stall_out) {
      n->stall_out = out;
      n->stall_out_gap = gap;
      n->stall_out_at = n->last_ack_at - n->started;
    }
  }
  n->last_ack_at = now;
}

/* ------------------------------------------------------------------------ */
/* Redis                                                                     */
/* ------------------------------------------------------------------------ */

/* Run the commands (NULL-terminated list of format strings without
 * arguments) on the run's Redis.  @return 0 when each answered without an
 * error. */
static int redis_run(const ps_nemesis *n, const char *const *cmds) {
  struct timeval tv = {0, REDIS_TIMEOUT_US};
  redisContext *r = redisConnectWithTimeout("127.0.0.1", n->cfg->redis.port, tv);
  int ok = r != NULL && r->err == 0;
  if (ok)
    redisSetTimeout(r, tv);
  for (int i = 0; ok && cmds[i] != NULL; i++) {
    redisReply *rep = redisCommand(r, cmds[i]);
    ok = rep != NULL && rep->type != REDIS_REPLY_ERROR;
    freeReplyObject(rep);
  }
  redisFree(r);
  return ok ? 0 : -1;
}

static int refuse(const ps_nemesis *n, refusal how) {
  static const char *const noreplicas[] = {"CONFIG SET min-replicas-to-write 1", NULL};
  static const char *const oom[] = {"CONFIG SET maxmemory-policy noeviction",
                                    "CONFIG SET maxmemory 1", NULL};
  static const char *const noperm[] = {"ACL SETUSER default -xadd -set", NULL};
  static const char *const *const cmds[] = {noreplicas, oom, noperm};
  return redis_run(n, cmds[how]);
}

static int heal(const ps_nemesis *n, refusal how) {
  static const char *const noreplicas[] = {"CONFIG SET min-replicas-to-write 0", NULL};
  static const char *const oom[] = {"CONFIG SET maxmemory 0", NULL};
  static const char *const noperm[] = {"ACL SETUSER default +xadd +set", NULL};
  static const char *const *const cmds[] = {noreplicas, oom, noperm};
  return redis_run(n, cmds[how]);
}

/* ------------------------------------------------------------------------ */
/* Faults                                                                    */
/* ------------------------------------------------------------------------ */

static ps_sup_child *redis_child(ps_nemesis *n) {
  for (int i = 0; i < n->sup->nchildren; i++)
    if (n->sup->children[i].role == PS_SUP_REDIS)
      return &n->sup->children[i];
  return NULL;
}

/* The child still runs the incarnation the fault hit. */
static int same_process(const ps_nemesis *n, const fault *f) {
  const ps_sup_child *c = &n->sup->children[f->child];
  return c->state == PS_SUP_RUNNING && c->pid == f->pid && c->starts == f->starts;
}

static int eligible(const ps_nemesis *n, ps_nem_kind kind, const ps_sup_child *c) {
  if (c->state != PS_SUP_RUNNING || !c->ready || n->paused[c - n->sup->children])
    return 0;
  if (c->role != PS_SUP_REDIS)
    return 1;
  /* Redis: killed only with kill_redis; never while a window is open
   * (its settings would be lost, or could not be healed while stopped). */
  return !n->refusing && (kind == PS_NEM_PAUSE || (kind == PS_NEM_KILL && n->kill_redis));
}

static void snapshot_acks(ps_nemesis *n, fault *f) {
  memcpy(f->acks_at_end, n->acks, sizeof f->acks_at_end);
  if (f->child >= 0 && n->sup->children[f->child].role == PS_SUP_WORKER)
    f->worker_acks_at_end = n->worker_acks[n->sup->children[f->child].index];
  f->steps_at_end = n->total_steps;
  f->chief_step = n->progress->step;
  f->chief_time = n->progress->progress_time;
}

static void end_fault(ps_nemesis *n, fault *f, double now) {
  if (f->kind == PS_NEM_PAUSE) {
    /* Only the process that was stopped: a pid reaped since (SIGKILL at
     * the end of a stop) may belong to another process by now. */
    if (same_process(n, f))
      kill(f->pid, SIGCONT);
    n->paused[f->child] = 0;
    ps_sup_excuse(n->sup, now + EXCUSE_S); /* a resumed chief past its lease exits */
    f->end_at = now;
    snapshot_acks(n, f);
    event(n, f, "resumed", now, now - f->at);
  } else if (f->kind == PS_NEM_REDIS_ERRORS) {
    ps_sup_child *r = redis_child(n);
    /* A stopped or restarting Redis cannot be healed now: again at the
     * next poll.  A restarted one has forgotten the setting anyway. */
    if (r != NULL && r->state == PS_SUP_RUNNING && heal(n, f->how) != 0 &&
        now - f->at < f->planned + 30)
      return;
    n->refusing = 0;
    ps_sup_excuse(n->sup, now + EXCUSE_S);
    f->end_at = now;
    snapshot_acks(n, f);
    event(n, f, "healed", now, now - f->at);
  }
}

static void start_fault(ps_nemesis *n, double now) {
  /* Four draws per slot, whatever happens: the same seed gives the same
   * sequence of delays, kinds, targets and durations. */
  double u_gap = ps_rng_uniform(&n->rng), u_kind = ps_rng_uniform(&n->rng);
  double u_target = ps_rng_uniform(&n->rng), u_len = ps_rng_uniform(&n->rng);
  n->next_at = now + n->gap_s * (1 + (GAP_SPREAD - 1) * u_gap);

  /* Kinds come out of a bag: each round injects every enabled kind once,
   * in an order the seed decides, so even a short run meets all of them.
   * A kind that cannot be injected now stays in the bag. */
  if ((n->bag & n->kinds) == 0)
    n->bag = n->kinds;
  ps_nem_kind enabled[PS_NEM_NKINDS];
  int nk = 0;
  for (int k = 0; k < PS_NEM_NKINDS; k++)
    if (n->bag & n->kinds & (1u << k))
      enabled[nk++] = (ps_nem_kind)k;
  if (nk == 0)
    return;
  ps_nem_kind kind = enabled[(int)(u_kind * nk)];
  if (n->nfaults == MAX_FAULTS) {
    n->dropped++;
    return;
  }
  fault *f = &n->faults[n->nfaults];
  memset(f, 0, sizeof *f);
  f->kind = kind;
  f->at = now;
  f->child = -1;

  if (kind == PS_NEM_REDIS_ERRORS) {
    ps_sup_child *r = redis_child(n);
    if (r == NULL)
      n->bag &= ~(1u << kind);  /* a Redis of its own: never */
    if (n->refusing || r == NULL || !eligible(n, PS_NEM_PAUSE, r))
      return;
    f->how = (refusal)(int)(u_target * NREFUSALS);
    f->planned = REFUSE_MIN_S + (REFUSE_MAX_S - REFUSE_MIN_S) * u_len;
    if (refuse(n, f->how) != 0) {
      heal(n, f->how); /* half of OOM's pair may have passed */
      return;
    }
    n->refusing = ++n->nfaults;
    n->bag &= ~(1u << kind);
    ps_sup_excuse(n->sup, now + f->planned + EXCUSE_S);
    event(n, f, "refusing", now, f->planned);
    say(n, "local: nemesis: Redis refuses writes (%s) for %.1f s", refusal_names[f->how],
        f->planned);
    return;
  }

  int pick[PS_SUP_MAX_CHILDREN], np = 0;
  for (int i = 0; i < n->sup->nchildren; i++)
    if (eligible(n, kind, &n->sup->children[i]))
      pick[np++] = i;
  if (np == 0)
    return;
  f->child = pick[(int)(u_target * np)];
  ps_sup_child *c = &n->sup->children[f->child];
  f->pid = c->pid;
  f->starts = c->starts;
  if (kind == PS_NEM_KILL) {
    if (ps_sup_kill(n->sup, c, now) != 0)
      return;
    n->nfaults++;
    n->bag &= ~(1u << kind);
    event(n, f, "killed", now, -1);
    say(n, "local: killed %s (pid %ld, chaos)", c->name, (long)f->pid);
  } else {
    f->planned = PAUSE_MIN_S + (PAUSE_MAX_S - PAUSE_MIN_S) * u_len;
    if (kill(c->pid, SIGSTOP) != 0)
      return;
    n->paused[f->child] = ++n->nfaults;
    n->bag &= ~(1u << kind);
    ps_sup_excuse(n->sup, now + f->planned + EXCUSE_S);
    event(n, f, "stopped", now, f->planned);
    say(n, "local: nemesis: paused %s (pid %ld) for %.1f s", c->name, (long)f->pid, f->planned);
  }
}

/* Has the fault's target made progress since the fault ended? */
static int recovered(const ps_nemesis *n, const fault *f) {
  const ps_sup_child *c = f->child >= 0 ? &n->sup->children[f->child] : NULL;
  /* Replaced: a new incarnation serves (a kill's "back"; or a paused
   * process that found itself fenced, exited and was restarted). */
  if (c != NULL && c->starts > f->starts && c->state == PS_SUP_RUNNING && c->ready)
    return 1;
  if (f->kind == PS_NEM_KILL || f->end_at == 0)
    return 0;
  if (c != NULL && c->role == PS_SUP_WORKER)
    return n->worker_acks[c->index] > f->worker_acks_at_end;
  if (c != NULL && c->role == PS_SUP_PS)
    return n->acks[c->index] > f->acks_at_end[c->index];
  if (c != NULL && c->role == PS_SUP_CHIEF)
    return n->progress->progress_time > f->chief_time && n->progress->step > f->chief_step;
  /* Redis (paused or refusing): acks flow again from every shard; in ring
   * mode (no shards), the ring completes a step again. */
  if (n->nps == 0)
    return n->total_steps > f->steps_at_end;
  for (int i = 0; i < n->nps; i++)
    if (n->acks[i] <= f->acks_at_end[i])
      return 0;
  return 1;
}

void ps_nemesis_poll(ps_nemesis *n, double now, int active) {
  if (n->started == 0)
    n->started = now;
  int got = read_acks(n);
  track_stall(n, now, got, active);
  if (active && n->next_at == 0)
    n->next_at = now + n->gap_s * (1 + (GAP_SPREAD - 1) * ps_rng_uniform(&n->rng));

  for (int i = 0; i < n->nfaults; i++) {
    fault *f = &n->faults[i];
    if (f->end_at == 0 && f->kind != PS_NEM_KILL && (!active || now - f->at >= f->planned))
      end_fault(n, f, now);
    if (f->recovered_at == 0 && recovered(n, f)) {
      f->recovered_at = now;
      f->replaced = f->child >= 0 && n->sup->children[f->child].starts > f->starts;
      if (f->kind == PS_NEM_KILL)
        f->end_at = now; /* a kill's window is death to back */
      event(n, f, "recovered", now, now - (f->kind == PS_NEM_KILL ? f->at : f->end_at));
    }
  }
  if (active && now >= n->next_at)
    start_fault(n, now);
}

/* ------------------------------------------------------------------------ */
/* The report                                                                */
/* ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void ps_nemesis_report(ps_nemesis *n, json_t *report, double now) {
  json_t *o = json_object(), *kinds = json_object();
  static double secs[MAX_FAULTS];
  say(n, "local: faults: %d; time to recover (kill: death to back; pause: SIGCONT to the "
      "process's progress; redis-errors: heal to acks from every shard):", n->nfaults);
  for (int k = 0; k < PS_NEM_NKINDS; k++) {
    if (!(n->kinds & (1u << k)))
      continue;
    int count = 0, pending = 0, replaced = 0, by_role[PS_SUP_NROLES] = {0};
    size_t ns = 0;
    json_t *times = json_array();
    for (int i = 0; i < n->nfaults; i++) {
      const fault *f = &n->faults[i];
      if (f->kind != (ps_nem_kind)k)
        continue;
      count++;
      by_role[f->child >= 0 ? n->sup->children[f->child].role : PS_SUP_REDIS]++;
      if (f->recovered_at > 0) {
        replaced += f->replaced;
        secs[ns] = f->recovered_at - (k == PS_NEM_KILL ? f->at : f->end_at);
        json_array_append_new(times, json_real(secs[ns]));
        ns++;
      } else {
        pending++;
      }
    }
    qsort(secs, ns, sizeof secs[0], cmp_double);
    double med = ns == 0 ? 0 : ns % 2 ? secs[ns / 2] : 0.5 * (secs[ns / 2 - 1] + secs[ns / 2]);
    double max = ns == 0 ? 0 : secs[ns - 1];
    json_t *roles = json_object();
    char list[160] = "";
    size_t at = 0;
    for (int r = 0; r < PS_SUP_NROLES; r++) {
      json_object_set_new(roles, ps_sup_role_name((ps_sup_role)r), json_integer(by_role[r]));
      if (by_role[r] > 0 && at < sizeof list)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s %d", at ? ", " : "",
                               ps_sup_role_name((ps_sup_role)r), by_role[r]);
    }
    json_t *kj = json_pack("{s:i, s:o, s:o, s:i, s:i, s:f, s:f}", "count", count, "by_role",
                           roles, "recovery_s", times, "not_recovered", pending, "replaced",
                           replaced, "median_s", med, "max_s", max);
    json_object_set_new(kinds, kind_names[k], kj);
    char how[64] = "";
    if (k != PS_NEM_KILL && replaced > 0)
      snprintf(how, sizeof how, " (%d as a new incarnation)", replaced);
    say(n, "local:   %-12s %3d (%s): recovered %zu%s, median %.2f s, max %.2f s%s", kind_names[k],
        count, at ? list : "none", ns, how, med, max,
        pending ? "; the rest not before the run ended" : "");
  }
  /* A stall still going on at the end is no stall: the run ended. */
  json_object_set_new(o, "kinds", kinds);
  json_object_set_new(o, "faults", json_integer(n->nfaults));
  json_object_set_new(o, "acks", json_integer((json_int_t)n->total_acks));
  json_object_set_new(o, "longest_stall_s", json_real(n->stall));
  json_object_set_new(o, "longest_stall_at_s", json_real(n->stall_at));
  json_object_set_new(o, "longest_stall_outside_s", json_real(n->stall_out));
  json_object_set_new(o, "longest_stall_outside_gap_s", json_real(n->stall_out_gap));
  json_object_set_new(o, "longest_stall_outside_at_s", json_real(n->stall_out_at));
  json_object_set_new(o, "seconds", json_real(now - n->started));
  if (n->cfg->history_dir[0] != '\0') {
    say(n, "local: longest time without an ack: %.2f s (from %.1f s into the run); outside "
        "fault windows: %.2f s (of a %.2f s gap from %.1f s)", n->stall, n->stall_at, n->stall_out,
        n->stall_out_gap, n->stall_out_at);
  }
  json_object_set_new(report, "nemesis", o);
}

void ps_nemesis_free(ps_nemesis *n) {
  if (n == NULL)
    return;
  if (n->events != NULL)
    fclose(n->events);
  free(n->faults);
  free(n);
}
