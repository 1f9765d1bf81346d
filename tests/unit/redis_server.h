/* A private redis-server for a unit test, and what a test against it needs:
 * its own blocking connection to provoke and read Redis, and waits for an
 * event with a deadline (never a sleep that hopes).  The server listens on
 * 127.0.0.1 at a free port of 20000-49999, without persistence, in a
 * directory of its own; it answers PING before redis_server_start returns
 * and dies with the test process; a config naming it.  Include after
 * cmocka.h: the command helpers assert.  Includes tmpdir.h: the server's
 * directory is in the test's. */
#ifndef PS_TESTS_REDIS_SERVER_H
#define PS_TESTS_REDIS_SERVER_H

#include <dirent.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/config.h"
#include "common/log.h"
#include "tmpdir.h"

/* Bounds a hang only: every wait ends at its event, long before. */
#define REDIS_SERVER_DEADLINE_MS 20000

typedef struct redis_server {
  pid_t pid;          /* 0: not running */
  int port;
  char dir[256];      /* its working directory */
  char password[64];  /* --requirepass's, "" without */
} redis_server;

static inline uint64_t redis_server_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A connection to it, authenticated when it has a password; NULL when it
 * does not answer. */
static inline redisContext *redis_server_connect(const redis_server *s) {
  redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, (struct timeval){0, 500000});
  if (c == NULL || c->err) {
    redisFree(c);
    return NULL;
  }
  if (s->password[0]) {
    redisReply *r = redisCommand(c, "AUTH %s", s->password);
    int ok = r != NULL && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!ok) {
      redisFree(c);
      return NULL;
    }
  }
  return c;
}

/* Does our server answer at s->port?  INFO's process_id tells ours from
 * another test's that holds the port until our child finds it taken. */
static inline int redis_server_answers(const redis_server *s) {
  redisContext *c = redis_server_connect(s);
  if (c == NULL)
    return 0;
  redisReply *r = redisCommand(c, "INFO server");
  const char *p = r != NULL && r->type == REDIS_REPLY_STRING ? strstr(r->str, "process_id:")
                                                             : NULL;
  int ours = p != NULL && atol(p + strlen("process_id:")) == (long)s->pid;
  freeReplyObject(r);
  redisFree(c);
  return ours;
}

static inline void redis_server_rmdir(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  closedir(d);
  rmdir(dir);
}

/* Run redis-server on s->port in s->dir, with `extra` arguments, and wait
 * until it answers.  @return 0 answering; 1 it exited (the port is taken);
 * -1 no process, or silent past the deadline (killed). */
static inline int redis_server_spawn(redis_server *s, const char *const *extra) {
  char port[16];
  snprintf(port, sizeof port, "%d", s->port);
  /* A replica made of it syncs at once (Redis 7 waits 5 s for more). */
  const char *argv[32] = {"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--daemonize", "no", "--dir", s->dir,
                          "--repl-diskless-sync-delay", "0"};
  int argc = 15;
  for (int i = 0; extra != NULL && extra[i] != NULL && argc < 31; i++)
    argv[argc++] = extra[i];
  s->pid = fork();
  if (s->pid < 0) {
    s->pid = 0;
    return -1;
  }
  if (s->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  /* a crashed test leaves no server behind */
    if (freopen("/dev/null", "w", stdout) == NULL)
      _exit(127);
    execvp("redis-server", (char *const *)argv);
    _exit(127);
  }
  uint64_t end = redis_server_now_ms() + REDIS_SERVER_DEADLINE_MS;
  while (redis_server_now_ms() < end) {
    if (redis_server_answers(s))
      return 0;
    if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
      s->pid = 0;
      return 1;
    }
    usleep(5000);
  }
  kill(s->pid, SIGKILL);
  waitpid(s->pid, NULL, 0);
  s->pid = 0;
  return -1;
}

/* Start one in a new directory under `parent`, with `extra` arguments
 * (NULL-terminated, or NULL; "--requirepass", PW makes the helpers
 * authenticate).  A port found taken is replaced by another.
 * @return 0, or -1 (cmocka's setup rule). */
static inline int redis_server_start(redis_server *s, const char *parent,
                                     const char *const *extra) {
  static unsigned n;
  memset(s, 0, sizeof *s);
  snprintf(s->dir, sizeof s->dir, "%s/redis.%u", parent, n++);
  if (mkdir(s->dir, 0700) != 0)
    return -1;
  for (int i = 0; extra != NULL && extra[i] != NULL; i++)
    if (strcmp(extra[i], "--requirepass") == 0 && extra[i + 1] != NULL)
      snprintf(s->password, sizeof s->password, "%s", extra[i + 1]);
  unsigned seed = (unsigned)getpid() * 7919u ^ (unsigned)redis_server_now_ms();
  for (int attempt = 0; attempt < 20; attempt++) {
    s->port = 20000 + (int)((seed + (unsigned)attempt * 104729u) % 30000u);
    int rc = redis_server_spawn(s, extra);
    if (rc == 0)
      return 0;
    if (rc < 0)
      break;
  }
  redis_server_rmdir(s->dir);
  s->dir[0] = '\0';
  return -1;
}

/* Start a server stopped by redis_server_halt again, empty, on its port
 * (and with its password): Redis restarted without persistence.
 * @return 0 or -1. */
static inline int redis_server_restart(redis_server *s) {
  const char *pw[] = {"--requirepass", s->password, NULL};
  return redis_server_spawn(s, s->password[0] ? pw : NULL) == 0 ? 0 : -1;
}

/* SIGTERM, and wait for it to exit (SIGKILL past the deadline); its
 * directory stays, for redis_server_restart.  Safe on one not running. */
static inline void redis_server_halt(redis_server *s) {
  if (s->pid <= 0)
    return;
  kill(s->pid, SIGTERM);
  uint64_t end = redis_server_now_ms() + REDIS_SERVER_DEADLINE_MS;
  while (waitpid(s->pid, NULL, WNOHANG) == 0) {
    if (redis_server_now_ms() > end) {
      kill(s->pid, SIGKILL);
      waitpid(s->pid, NULL, 0);
      break;
    }
    usleep(5000);
  }
  s->pid = 0;
}

/* Halt it and remove its directory.  Safe on one never started or already
 * stopped. */
static inline void redis_server_stop(redis_server *s) {
  redis_server_halt(s);
  if (s->dir[0])
    redis_server_rmdir(s->dir);
  s->dir[0] = '\0';
}

/* A test group's server and its own connection to it, in the test's
 * directory (tmpdir.h). */
static redis_server server;
static redisContext *redis;

/* cmocka's group setup: logs at errors only, the directory, the server
 * and the connection (*state is the tests' own).  @return 0, or -1 with
 * nothing left behind. */
static inline int redis_group_setup(void **state) {
  (void)state;
  ps_log_init("test", PS_LOG_ERROR);
  if (tmpdir_create("test_redis") != 0)
    return -1;
  if (redis_server_start(&server, tmp, NULL) == 0 && (redis = redis_server_connect(&server)) != NULL)
    return 0;
  redis_server_stop(&server);
  tmpdir_remove();
  return -1;
}

static inline int redis_group_teardown(void **state) {
  (void)state;
  redisFree(redis);
  redis = NULL;
  redis_server_stop(&server);
  return tmpdir_remove();
}

/* ------------------------------------------- the test's own commands */

/* A command that must not fail; its reply (free it with freeReplyObject). */
static inline redisReply *redis_vreply(redisContext *c, const char *fmt, va_list ap) {
  redisReply *r = redisvCommand(c, fmt, ap);
  if (r == NULL)
    fail_msg("redis: no reply: %s", c->errstr);
  if (r->type == REDIS_REPLY_ERROR)
    fail_msg("redis: %s", r->str);
  return r;
}

static inline void redis_ok(redisContext *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  freeReplyObject(redis_vreply(c, fmt, ap));
  va_end(ap);
}

/* An integer reply, or -1 for any other. */
static inline long long redis_int(redisContext *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redis_vreply(c, fmt, ap);
  va_end(ap);
  long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
  freeReplyObject(r);
  return v;
}

/* A string reply into out ("" for nil).  @return 1 string, 0 nil. */
static inline int redis_str(redisContext *c, char *out, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redis_vreply(c, fmt, ap);
  va_end(ap);
  int found = r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS;
  snprintf(out, len, "%s", found ? r->str : "");
  freeReplyObject(r);
  return found;
}

/* Write at `path` and load into cfg a cluster "test" (one shard, one
 * worker) whose [redis] address is this server, followed by `fmt`'s
 * lines: more of [redis] first, then any other sections. */
static inline void redis_server_config(const redis_server *s, const char *path, ps_config *cfg,
                                       const char *fmt, ...) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "[cluster]\nid = test\nps = 127.0.0.1:1\nworkers = 127.0.0.1:2\n"
          "[redis]\naddress = 127.0.0.1:%d\n",
          s->port);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  assert_int_equal(fclose(f), 0);
  ps_errbuf eb = {0};
  if (ps_config_load(path, cfg, &eb) != 0)
    fail_msg("config %s: %s", path, eb.msg);
}

/* ------------------------------------------------------------- waits */

/* Run `loop` (NULL: none, cond watches another thread or Redis) until
 * cond(arg), failing the test at the deadline: a hang. */
static inline void wait_until(uv_loop_t *loop, int (*cond)(void *), void *arg, const char *what) {
  uint64_t end = redis_server_now_ms() + REDIS_SERVER_DEADLINE_MS;
  while (!cond(arg)) {
    if (redis_server_now_ms() > end)
      fail_msg("no %s within %d ms", what, REDIS_SERVER_DEADLINE_MS);
    if (loop != NULL)
      uv_run(loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
}

/* A test's teardown: the loop closed, which fails while a handle is
 * left on it (a leak).  @return 0 or -1. */
static inline int loop_close_clean(uv_loop_t *loop) {
  if (uv_loop_close(loop) == 0)
    return 0;
  fprintf(stderr, "the loop still holds handles\n");
  return -1;
}

#endif
