/* Supervision of the processes of a `paramserv local` run: start, watch, restart, stop in order. */
#include "local/supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chief/chief.h"
#include "common/notify.h"
#include "common/timeutil.h"

#define RESTART_DELAY_S 0.2
#define FAIL_LIMIT 5        /* deaths of one child ...    */
#define FAIL_WINDOW_S 30.0  /* ... within this long stop the run */
#define DRAIN_S 10.0        /* after the chief's exit 0, for the others to exit */
#define STOP_S 10.0         /* after SIGTERM, before SIGKILL */
#define UNREADY_S 2.0       /* drain: SIGTERM to SIGKILL for one not back yet */
#define NODES_DONE_S 2.0    /* shards and workers all done, the chief not */
#define STAGE_S 3.0         /* one group's SIGTERM before the next group's */
#define REDIS_WAIT_S 10.0
#define READY_WARN_S 30.0   /* not ready this long after its start: said once */
#define READY_LIMIT_S 120.0 /* ... and this long: the run stops */
#define REDIS_BIN "/usr/bin/redis-server"

static const char *const role_names[] = {"redis", "chief", "ps", "worker"};

const char *ps_sup_role_name(ps_sup_role r) { return role_names[r]; }

static int running(const ps_sup_child *c) { return c->state == PS_SUP_RUNNING; }

__attribute__((format(printf, 2, 3))) static void say(ps_sup *s, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (s->say != NULL)
    s->say(s->say_arg, line);
}

/* ------------------------------------------------------------------------ */
/* Set-up                                                                    */
/* ------------------------------------------------------------------------ */

static ps_sup_child *add_child(ps_sup *s, ps_sup_role role, int index) {
  ps_sup_child *c = &s->children[s->nchildren++];
  memset(c, 0, sizeof *c);
  c->role = role;
  c->index = index;
  if (role == PS_SUP_PS || role == PS_SUP_WORKER) {
    snprintf(c->name, sizeof c->name, "%s %d", role_names[role], index);
    snprintf(c->file, sizeof c->file, "%s-%d", role_names[role], index);
  } else {
    snprintf(c->name, sizeof c->name, "%s", role_names[role]);
    snprintf(c->file, sizeof c->file, "%s", role_names[role]);
  }
  char file[sizeof c->file];
  memcpy(file, c->file, sizeof file);
  snprintf(c->log_path, sizeof c->log_path, "%s/logs/%s.log", s->rundir, file);
  c->notify_fd = -1;
  return c;
}

/* The child's NOTIFY_SOCKET, held for the whole run: every incarnation
 * sends to the same name, and the sender's pid tells which one sent. */
static int open_notify(ps_sup_child *c, ps_errbuf *eb) {
  snprintf(c->notify_addr, sizeof c->notify_addr, "@paramserv-local/%ld/%s", (long)getpid(),
           c->file);
  int fd = ps_notify_listen(c->notify_addr + 1);
  if (fd < 0)
    return ps_err_set(eb, fd, "%s: cannot bind the notify socket %s: %s", c->name, c->notify_addr,
                      strerror(-fd));
  c->notify_fd = fd;
  return 0;
}

int ps_sup_init(ps_sup *s, const ps_config *cfg, const char *config_path, const char *rundir,
                ps_sup_say_fn sayfn, void *arg, ps_errbuf *eb) {
  memset(s, 0, sizeof *s);
  s->cfg = cfg;
  s->say = sayfn;
  s->say_arg = arg;
  snprintf(s->rundir, sizeof s->rundir, "%s", rundir);
  snprintf(s->config_path, sizeof s->config_path, "%s", config_path);
  /* The children run this very binary, even if the file is replaced
   * (rebuilt) while the run goes on. */
  snprintf(s->exe, sizeof s->exe, "/proc/self/exe");
  char logs[PS_CONFIG_PATH_MAX + 8];
  snprintf(logs, sizeof logs, "%s/logs", rundir);
  if (mkdir(logs, 0755) != 0 && errno != EEXIST)
    return ps_err_set(eb, -errno, "%s: cannot create: %s", logs, strerror(errno));
  if (cfg->ncluster == 0)  /* else the config's Redis Cluster, not the run's */
    add_child(s, PS_SUP_REDIS, 0);
  add_child(s, PS_SUP_CHIEF, 0);
  for (int i = 0; i < cfg->nps; i++)
    add_child(s, PS_SUP_PS, i);
  for (int i = 0; i < cfg->nworkers; i++)
    add_child(s, PS_SUP_WORKER, i);
  for (int i = 0; i < s->nchildren; i++)
    if (s->children[i].role != PS_SUP_REDIS && open_notify(&s->children[i], eb) != 0) {
      ps_sup_close(s);
      return eb->code;
    }
  return 0;
}

void ps_sup_close(ps_sup *s) {
  for (int i = 0; i < s->nchildren; i++)
    if (s->children[i].notify_fd >= 0) {
      close(s->children[i].notify_fd);
      s->children[i].notify_fd = -1;
    }
  for (int r = 0; r < PS_SUP_NROLES; r++) {
    free(s->recovery[r]);
    s->recovery[r] = NULL;
  }
}

/* ------------------------------------------------------------------------ */
/* Logs                                                                      */
/* ------------------------------------------------------------------------ */

/* Backwards over text[0..n): the last line the child wrote itself (not
 * local's), with errors_only the last of its errors, copied into buf.
 * @return 1 when there is one. */
static int last_own_line(const char *text, size_t n, int errors_only, char *buf, size_t len) {
  static const char error[] = ": error: ";
  size_t end = n;
  while (end > 0) {
    while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == '\r'))
      end--;
    size_t start = end;
    while (start > 0 && text[start - 1] != '\n')
      start--;
    int is_error = 0;
    for (size_t i = start; errors_only && !is_error && i + sizeof error - 1 <= end; i++)
      is_error = memcmp(text + i, error, sizeof error - 1) == 0;
    if (start < end && strncmp(text + start, "local: ", 7) != 0 && (!errors_only || is_error)) {
      snprintf(buf, len, "%.*s", (int)(end - start), text + start);
      return 1;
    }
    end = start;
  }
  return 0;
}

const char *ps_sup_last_line(const ps_sup_child *c, char *buf, size_t len) {
  char tail[4096 + 1];
  buf[0] = '\0';
  int fd = open(c->log_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return buf;
  off_t size = lseek(fd, 0, SEEK_END), from = size > 4096 ? size - 4096 : 0;
  ssize_t n = pread(fd, tail, 4096, from);
  close(fd);
  if (n <= 0)
    return buf;
  tail[n] = '\0';
  /* A refusal's error is followed by the lease's release: the error first. */
  if (!last_own_line(tail, (size_t)n, 1, buf, len))
    last_own_line(tail, (size_t)n, 0, buf, len);
  return buf;
}

void ps_sup_write_pids(const ps_sup *s) {
  char path[PS_CONFIG_PATH_MAX + 16], tmp[PS_CONFIG_PATH_MAX + 24];
  snprintf(path, sizeof path, "%s/pids", s->rundir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "we");
  if (f == NULL)
    return;
  fprintf(f, "local %ld ready\n", (long)getpid());
  for (int i = 0; i < s->nchildren; i++)
    if (s->children[i].pid > 0)
      fprintf(f, "%s %ld %s\n", s->children[i].file, (long)s->children[i].pid,
              s->children[i].ready ? "ready" : "starting");
  if (fclose(f) == 0)
    rename(tmp, path);
  else
    unlink(tmp);
}

/* ------------------------------------------------------------------------ */
/* Starting a child                                                          */
/* ------------------------------------------------------------------------ */

static int spawn(ps_sup *s, ps_sup_child *c, double now) {
  char port[8], index[16];
  const char *argv[24];
  int k = 0;
  if (c->role == PS_SUP_REDIS) {
    snprintf(port, sizeof port, "%u", (unsigned)s->cfg->redis.port);
    argv[k++] = access(REDIS_BIN, X_OK) == 0 ? REDIS_BIN : "redis-server";
    /* With an append-only file in the run directory Redis writes each
     * command to it before it answers, so a redis-server killed and
     * restarted comes back with every acknowledged write.  It costs about
     * 40% of the training speed under replication log (every gradient goes
     * to disk too), so only runs that kill Redis on purpose keep one. */
    const char *args[] = {"--port", port, "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", s->redis_aof ? "yes" : "no", "--appendfsync",
                          "everysec", "--dir", s->rundir, "--logfile", "", "--daemonize", "no",
                          NULL};
    for (int i = 0; args[i] != NULL; i++)
      argv[k++] = args[i];
  } else {
    argv[k++] = "paramserv";
    argv[k++] = role_names[c->role];
    argv[k++] = "--config";
    argv[k++] = s->config_path;
    if (c->role != PS_SUP_CHIEF) {
      snprintf(index, sizeof index, "%d", c->index);
      argv[k++] = "--index";
      argv[k++] = index;
    }
  }
  argv[k] = NULL;

  int fd = open(c->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    return -errno;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  if (pid == 0) {
    /* Its own process group: a Ctrl-C on the terminal reaches the
     * supervisor only, which stops the children in order. */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127); /* the supervisor died before the line above */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    /* Its readiness goes to the supervisor, never to a systemd that may
     * supervise `paramserv local` itself; the watchdog is local's alone. */
    if (c->notify_fd >= 0)
      setenv("NOTIFY_SOCKET", c->notify_addr, 1);
    else
      unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0)
      dup2(null, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    char line[128];
    int n = snprintf(line, sizeof line, "local: %s starts (pid %ld, start %d)\n", c->name,
                     (long)getpid(), c->starts + 1);
    if (write(2, line, (size_t)n) < 0) {
      /* nothing to do: the log is what we would report to */
    }
    if (c->role == PS_SUP_REDIS)
      execvp(argv[0], (char *const *)argv);
    else
      execv(s->exe, (char *const *)argv);
    n = snprintf(line, sizeof line, "local: cannot run %s: %s\n", argv[0], strerror(errno));
    if (write(2, line, (size_t)n) < 0) {
    }
    _exit(127);
  }
  close(fd);
  c->pid = pid;
  c->state = PS_SUP_RUNNING;
  c->ready = 0;
  c->ready_sent = 0;
  c->unready_said = 0;
  c->status_text[0] = '\0';
  c->term_sent = 0;
  c->started_at = now;
  if (c->starts++ > 0)
    s->restarts++;
  ps_sup_write_pids(s);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Readiness                                                                 */
/* ------------------------------------------------------------------------ */

static int redis_ping(const ps_sup *s) {
  struct timeval tv = {0, 200000};
  redisContext *r = redisConnectWithTimeout("127.0.0.1", s->cfg->redis.port, tv);
  int ok = 0;
  if (r != NULL && r->err == 0) {
    redisSetTimeout(r, tv);
    redisReply *reply = redisCommand(r, "PING");
    ok = reply != NULL && reply->type == REDIS_REPLY_STATUS && strcmp(reply->str, "PONG") == 0;
    freeReplyObject(reply);
  }
  redisFree(r);
  return ok;
}

/* What the child's running incarnation sent since the last call: datagrams
 * of earlier incarnations (queued before they died) and of any other
 * process (one of its own children that inherited NOTIFY_SOCKET) are
 * dropped. */
static void read_notify(ps_sup_child *c) {
  ps_notify_msg m;
  while (c->notify_fd >= 0 && ps_notify_recv(c->notify_fd, &m) == 1) {
    if (!running(c) || m.pid != (long)c->pid)
      continue;
    if (m.has_status)
      snprintf(c->status_text, sizeof c->status_text, "%s", m.status);
    if (m.ready)
      c->ready_sent = 1;
  }
}

static int is_ready(const ps_sup *s, const ps_sup_child *c) {
  return c->role == PS_SUP_REDIS ? redis_ping(s) : c->ready_sent;
}

/* One that is not ready READY_WARN_S after its start is said once, with
 * what it last said it does; at READY_LIMIT_S the run stops: nothing in a
 * run on one machine waits that long for another, so it hangs. */
static void check_unready(ps_sup *s, ps_sup_child *c, double now) {
  double up = now - c->started_at;
  if (up < READY_WARN_S || (c->unready_said && up < READY_LIMIT_S))
    return;
  char last[400], what[1100];
  snprintf(what, sizeof what, "%s (pid %ld) is not ready %.0f s after its start (%s); its "
           "status: %s; its last line: %s", c->name, (long)c->pid, up,
           c->role == PS_SUP_REDIS ? "no answer to PING" : "no READY=1",
           c->status_text[0] ? c->status_text : "(none sent)",
           ps_sup_last_line(c, last, sizeof last)[0] ? last : "(none)");
  if (up >= READY_LIMIT_S) {
    ps_sup_stop(s, now, 1, what);
  } else {
    say(s, "local: %s", what);
    c->unready_said = 1;
  }
}

static void record_recovery(ps_sup *s, ps_sup_role r, double secs) {
  if (s->nrecovery[r] == s->caprecovery[r]) {
    size_t cap = s->caprecovery[r] ? 2 * s->caprecovery[r] : 16;
    double *more = realloc(s->recovery[r], cap * sizeof *more);
    if (more == NULL)
      return;
    s->recovery[r] = more;
    s->caprecovery[r] = cap;
  }
  s->recovery[r][s->nrecovery[r]++] = secs;
}

/* ------------------------------------------------------------------------ */
/* Deaths                                                                    */
/* ------------------------------------------------------------------------ */

static void describe_status(int st, char *buf, size_t len) {
  if (WIFEXITED(st))
    snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    snprintf(buf, len, "stopped (status 0x%x)", st);
}

static int all_done(const ps_sup *s, ps_sup_role role) {
  for (int i = 0; i < s->nchildren; i++)
    if (s->children[i].role == role && s->children[i].state != PS_SUP_DONE)
      return 0;
  return 1;
}

static void on_exit_status(ps_sup *s, ps_sup_child *c, int st, double now) {
  char what[96], last[400];
  pid_t pid = c->pid;
  c->pid = 0;
  c->status = st;
  c->ready = 0;
  describe_status(st, what, sizeof what);
  if (s->phase != PS_SUP_RUN) {
    c->state = PS_SUP_DONE;
    /* After the chief's exit 0 the others are expected to exit 0 too. */
    if (s->phase == PS_SUP_DRAIN && !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !c->term_sent)
      say(s, "local: %s %s after the chief finished: %s", c->name, what,
          ps_sup_last_line(c, last, sizeof last));
    return;
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0 && c->role != PS_SUP_REDIS) {
    c->state = PS_SUP_DONE;
    c->down_at = 0;
    if (c->role == PS_SUP_CHIEF) {
      s->phase = PS_SUP_DRAIN;
      s->phase_at = now;
      say(s, "local: the chief finished; waiting for the others to exit");
    } else if (all_done(s, PS_SUP_PS) && all_done(s, PS_SUP_WORKER)) {
      s->nodes_done_at = now; /* see ps_sup_poll */
    }
    return;
  }
  if (c->role == PS_SUP_CHIEF && WIFEXITED(st) && WEXITSTATUS(st) == PS_CHIEF_NONFINITE) {
    /* Restarting would restore the same weights: the run cannot go on. */
    char why[640];
    snprintf(why, sizeof why, "the chief stopped the run: %s",
             ps_sup_last_line(c, last, sizeof last));
    c->state = PS_SUP_DONE;
    ps_sup_stop(s, now, 1, why);
    return;
  }
  if (c->role != PS_SUP_REDIS && WIFEXITED(st) && WEXITSTATUS(st) == 2) {
    /* Bad usage or a device that is not there (src/cmd/cmd.h): a restart
     * would get the same answer, so the units do not restart it either
     * (RestartPreventExitStatus=2). */
    char why[640];
    snprintf(why, sizeof why, "%s %s, which a restart would not change: %s", c->name, what,
             ps_sup_last_line(c, last, sizeof last));
    c->state = PS_SUP_DONE;
    ps_sup_stop(s, now, 2, why);
    return;
  }
  if (!c->down_by_kill) {
    say(s, "local: %s (pid %ld) %s: %s", c->name, (long)pid, what,
        ps_sup_last_line(c, last, sizeof last));
    if (c->down_at == 0) /* not back since an earlier death: time from that one */
      c->down_at = now;
    /* A child that keeps failing on its own would fail forever; one that
     * fails while a fault is injected (a chief that cannot renew its lease
     * while Redis refuses writes) is not failing on its own. */
    if (now >= s->excused_until) {
      if (c->nfailures == FAIL_LIMIT) {
        memmove(c->failures, c->failures + 1, (FAIL_LIMIT - 1) * sizeof c->failures[0]);
        c->nfailures--;
      }
      c->failures[c->nfailures++] = now;
    }
    if (c->nfailures == FAIL_LIMIT && now - c->failures[0] <= FAIL_WINDOW_S) {
      char why[640];
      snprintf(why, sizeof why, "%s failed %d times within %.0f s; its last line: %s", c->name,
               FAIL_LIMIT, FAIL_WINDOW_S, last[0] ? last : "(none)");
      c->state = PS_SUP_DONE;
      ps_sup_stop(s, now, 1, why);
      return;
    }
  }
  c->down_by_kill = 0;
  c->state = PS_SUP_WAITING;
  c->restart_at = now + RESTART_DELAY_S;
}

static void reap(ps_sup *s, double now) {
  int st, any = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    for (int i = 0; i < s->nchildren; i++)
      if (s->children[i].pid == pid) {
        on_exit_status(s, &s->children[i], st, now);
        any = 1;
        break;
      }
  }
  if (any)
    ps_sup_write_pids(s);
}

/* ------------------------------------------------------------------------ */
/* Stopping                                                                  */
/* ------------------------------------------------------------------------ */

/* The order of a stop: workers first (they would only retry dead shards),
 * the chief, the shards (their last snapshot goes to Redis), Redis. */
static const ps_sup_role stop_order[] = {PS_SUP_WORKER, PS_SUP_CHIEF, PS_SUP_PS, PS_SUP_REDIS};
#define NSTAGES ((int)(sizeof stop_order / sizeof stop_order[0]))

static int group_running(const ps_sup *s, ps_sup_role role) {
  for (int i = 0; i < s->nchildren; i++)
    if (s->children[i].role == role && running(&s->children[i]))
      return 1;
  return 0;
}

static void term_group(ps_sup *s, ps_sup_role role) {
  for (int i = 0; i < s->nchildren; i++) {
    ps_sup_child *c = &s->children[i];
    if (c->role == role && running(c) && !c->term_sent) {
      kill(c->pid, SIGTERM);
      c->term_sent = 1;
    }
  }
}

void ps_sup_stop(ps_sup *s, double now, int result, const char *why) {
  if (s->phase == PS_SUP_STOP || s->phase == PS_SUP_OVER)
    return;
  s->phase = PS_SUP_STOP;
  s->phase_at = now;
  s->result = result;
  if (why != NULL)
    snprintf(s->why, sizeof s->why, "%s", why);
  for (int i = 0; i < s->nchildren; i++)
    if (s->children[i].state == PS_SUP_WAITING || s->children[i].state == PS_SUP_IDLE)
      s->children[i].state = PS_SUP_DONE;
  s->stage = 0;
  s->stage_at = now;
  term_group(s, stop_order[0]);
}

void ps_sup_kill_all(ps_sup *s) {
  for (int i = 0; i < s->nchildren; i++)
    if (running(&s->children[i]))
      kill(s->children[i].pid, SIGKILL);
}

/* How long a stage's SIGTERM has before the next stage's: the chief's
 * final checkpoint ([checkpoint] on_stop_secs) needs the shards up. */
static double stage_s(const ps_sup *s, ps_sup_role role) {
  return STAGE_S + (role == PS_SUP_CHIEF ? (double)s->cfg->checkpoint_on_stop_secs : 0.0);
}

static void advance_stop(ps_sup *s, double now) {
  while (s->stage < NSTAGES &&
         (!group_running(s, stop_order[s->stage]) ||
          now - s->stage_at >= stage_s(s, stop_order[s->stage]))) {
    if (++s->stage < NSTAGES) {
      s->stage_at = now;
      term_group(s, stop_order[s->stage]);
    }
  }
  int any = 0;
  for (int i = 0; i < s->nchildren; i++)
    any |= running(&s->children[i]);
  double stop_s = STOP_S + (double)s->cfg->checkpoint_on_stop_secs;
  if (any && now - s->phase_at >= stop_s) {
    for (int i = 0; i < s->nchildren; i++)
      if (running(&s->children[i]) && s->children[i].term_sent != 2) {
        say(s, "local: %s (pid %ld) still running %.0f s after SIGTERM: SIGKILL",
            s->children[i].name, (long)s->children[i].pid, stop_s);
        kill(s->children[i].pid, SIGKILL);
        s->children[i].term_sent = 2;
      }
  }
  if (!any && s->stage >= NSTAGES)
    s->phase = PS_SUP_OVER;
}

/* ------------------------------------------------------------------------ */
/* The loop's work                                                           */
/* ------------------------------------------------------------------------ */

void ps_sup_excuse(ps_sup *s, double until) {
  if (until > s->excused_until)
    s->excused_until = until;
}

int ps_sup_kill(ps_sup *s, ps_sup_child *c, double now) {
  (void)s;
  if (!running(c))
    return -ESRCH;
  if (kill(c->pid, SIGKILL) != 0)
    return -errno;
  c->kills++;
  c->down_by_kill = 1;
  c->down_at = now;
  return 0;
}

void ps_sup_poll(ps_sup *s, double now) {
  reap(s, now);
  if (s->phase == PS_SUP_RUN) {
    for (int i = 0; i < s->nchildren; i++) {
      ps_sup_child *c = &s->children[i];
      if (c->state == PS_SUP_WAITING && now >= c->restart_at) {
        int rc = spawn(s, c, now);
        if (rc != 0) {
          char why[256];
          snprintf(why, sizeof why, "cannot start %s: %s", c->name, strerror(-rc));
          ps_sup_stop(s, now, 1, why);
          break;
        }
      }
    }
  }
  for (int i = 0; i < s->nchildren; i++) {
    ps_sup_child *c = &s->children[i];
    read_notify(c);
    if (!running(c) || c->ready || s->phase == PS_SUP_STOP)
      continue;
    if (!is_ready(s, c)) {
      if (s->phase == PS_SUP_RUN)
        check_unready(s, c, now);
      continue;
    }
    c->ready = 1;
    ps_sup_write_pids(s);
    if (c->down_at > 0) {
      double secs = now - c->down_at;
      record_recovery(s, c->role, secs);
      say(s, "local: %s back after %.2f s", c->name, secs);
      c->down_at = 0;
    }
  }
  if (s->phase == PS_SUP_RUN && s->nodes_done_at > 0 && now - s->nodes_done_at >= NODES_DONE_S) {
    /* Every shard and worker exited 0: the chief stopped them.  A chief
     * that died before its own exit 0 and came back would wait for the
     * shards forever. */
    say(s, "local: every shard and worker finished; stopping the chief");
    ps_sup_stop(s, now, 0, NULL);
  }
  if (s->phase == PS_SUP_DRAIN) {
    int others = 0;
    for (int i = 0; i < s->nchildren; i++) {
      ps_sup_child *c = &s->children[i];
      if (c->state == PS_SUP_WAITING)
        c->state = PS_SUP_DONE;
      /* One that was still coming back when the run ended (a worker
       * restarted just before the chief's stop) has nothing to finish and
       * may wait for shards that are gone: SIGTERM, then SIGKILL. */
      if (c->role != PS_SUP_REDIS && running(c) && !c->ready) {
        if (!c->term_sent) {
          say(s, "local: %s was still coming back when the run ended: stopping it", c->name);
          kill(c->pid, SIGTERM);
          c->term_sent = 1;
        } else if (now - s->phase_at >= UNREADY_S && c->term_sent != 2) {
          kill(c->pid, SIGKILL);
          c->term_sent = 2;
        }
      }
      others += c->role != PS_SUP_REDIS && running(c);
    }
    if (others == 0) {
      ps_sup_stop(s, now, 0, NULL);
    } else if (now - s->phase_at >= DRAIN_S) {
      say(s, "local: %d process%s still running %.0f s after the chief finished: stopping them",
          others, others == 1 ? "" : "es", DRAIN_S);
      ps_sup_stop(s, now, 0, NULL);
    }
  }
  if (s->phase == PS_SUP_STOP)
    advance_stop(s, now);
}

int ps_sup_start(ps_sup *s, ps_errbuf *eb) {
  double now = ps_now_s();
  ps_sup_child *redis = &s->children[0];
  int rc = 0, first = redis->role == PS_SUP_REDIS ? 1 : 0;
  if (first && (rc = spawn(s, redis, now)) != 0)
    return ps_err_set(eb, rc, "cannot start redis-server: %s", strerror(-rc));
  while (first && !redis_ping(s)) {
    int st;
    char last[400];
    if (waitpid(redis->pid, &st, WNOHANG) == redis->pid) {
      redis->pid = 0;
      redis->state = PS_SUP_DONE;
      return ps_err_set(eb, -ECHILD, "redis-server on port %u exited at start: %s",
                        (unsigned)s->cfg->redis.port, ps_sup_last_line(redis, last, sizeof last));
    }
    if (ps_now_s() - now > REDIS_WAIT_S) {
      kill(redis->pid, SIGKILL);
      waitpid(redis->pid, &st, 0);
      redis->pid = 0;
      redis->state = PS_SUP_DONE;
      return ps_err_set(eb, -ETIMEDOUT, "redis-server on port %u did not answer PING within %.0f s",
                        (unsigned)s->cfg->redis.port, REDIS_WAIT_S);
    }
    usleep(20000);
  }
  if (first)
    redis->ready = 1;
  now = ps_now_s();
  for (int i = first; i < s->nchildren; i++) {
    ps_sup_child *c = &s->children[i];
    if ((rc = spawn(s, c, now)) != 0) {
      ps_err_set(eb, rc, "cannot start %s: %s", c->name, strerror(-rc));
      ps_sup_kill_all(s);
      for (int j = 0; j < s->nchildren; j++)
        if (s->children[j].pid > 0)
          waitpid(s->children[j].pid, NULL, 0);
      return rc;
    }
  }
  return 0;
}
