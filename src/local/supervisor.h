/* The processes of a `paramserv local` run: redis-server, the chief, the
 * shards and the workers as children of one supervisor that restarts the
 * ones that die, tells when each is back, and stops them in order.
 *
 * Readiness comes from the sd_notify protocol, as under systemd: each
 * child but redis-server gets NOTIFY_SOCKET=@paramserv-local/<pid>/<file>,
 * a datagram socket of its own that the supervisor holds for the whole run
 * (the same name for every incarnation), and is ready once the incarnation
 * itself (the sender's pid, SCM_CREDENTIALS) sent READY=1: a shard when it
 * serves workers, a worker after its first pull, the chief when it leads
 * with every shard holding its state.  Its last STATUS= tells what one that
 * is not ready waits for.
 *
 * Single-threaded and poll-driven: the caller blocks SIGCHLD (and the
 * signals it handles itself), then calls ps_sup_poll() every few tens of
 * milliseconds; every child runs with SIGKILL as its parent-death signal,
 * so that nothing outlives a supervisor that is killed. */
#ifndef PS_LOCAL_SUPERVISOR_H
#define PS_LOCAL_SUPERVISOR_H

#include <stdint.h>
#include <sys/types.h>

#include "common/config.h"
#include "paramserv/error.h"

typedef enum ps_sup_role {
  PS_SUP_REDIS = 0,
  PS_SUP_CHIEF,
  PS_SUP_PS,
  PS_SUP_WORKER,
  PS_SUP_NROLES
} ps_sup_role;

typedef enum ps_sup_state {
  PS_SUP_IDLE = 0, /* not started yet */
  PS_SUP_RUNNING,
  PS_SUP_WAITING,  /* died; starts again at restart_at */
  PS_SUP_DONE,     /* exited, not to be restarted */
} ps_sup_state;

typedef enum ps_sup_phase {
  PS_SUP_RUN = 0, /* training: children that die come back */
  PS_SUP_DRAIN,   /* the chief finished: the others exit by themselves */
  PS_SUP_STOP,    /* stopping everything, in order */
  PS_SUP_OVER,    /* nothing is left running */
} ps_sup_phase;

#define PS_SUP_MAX_CHILDREN (2 + 2 * PS_CONFIG_MAX_NODES)

typedef struct ps_sup_child {
  ps_sup_role role;
  int index;              /* shard or worker index; 0 for redis and the chief */
  char name[24];          /* "ps 1", as the user reads it */
  char file[24];          /* "ps-1": the log's name and the pids file's key */
  char log_path[PS_CONFIG_PATH_MAX + 64];
  pid_t pid;              /* 0 when not running */
  ps_sup_state state;
  int ready;              /* this incarnation serves (see ps_sup_poll) */
  int ready_sent;         /* this incarnation sent READY=1 */
  int unready_said;       /* this incarnation was said to be slow to get ready */
  int notify_fd;          /* its NOTIFY_SOCKET; -1 for redis (ready: answers PING) */
  char notify_addr[64];   /* "@paramserv-local/<pid>/ps-1" */
  char status_text[512];  /* this incarnation's last STATUS= ("" none yet) */
  int starts;             /* incarnations started */
  int kills;              /* ps_sup_kill calls */
  int status;             /* the last wait status */
  double started_at, restart_at;
  double down_at;         /* > 0 while coming back: when it was killed or found dead */
  int down_by_kill;       /* the current death was ps_sup_kill's */
  int term_sent;
  double failures[8];     /* times of the latest deaths not caused by ps_sup_kill */
  int nfailures;
} ps_sup_child;

/* Called for each line the supervisor has to say ("local: ps 1 back after
 * 0.31 s"); the line has no newline and is valid during the call. */
typedef void (*ps_sup_say_fn)(void *arg, const char *line);

typedef struct ps_sup {
  const ps_config *cfg;
  char rundir[PS_CONFIG_PATH_MAX];
  char config_path[PS_CONFIG_PATH_MAX + 32];
  char exe[PS_CONFIG_PATH_MAX];
  int nchildren;
  ps_sup_child children[PS_SUP_MAX_CHILDREN]; /* redis, chief, shards, workers */
  ps_sup_phase phase;
  double phase_at;
  double nodes_done_at; /* when every shard and worker had exited 0 */
  int stage;          /* PS_SUP_STOP: the group being stopped (workers, chief, shards, redis) */
  double stage_at;
  int result;         /* the run's exit status, once the phase is STOP or OVER */
  char why[640];      /* why a run that failed stopped */
  int restarts;       /* all children, all roles */
  double *recovery[PS_SUP_NROLES]; /* seconds from a death to "back", per role */
  size_t nrecovery[PS_SUP_NROLES], caprecovery[PS_SUP_NROLES];
  ps_sup_say_fn say;
  void *say_arg;
  int redis_aof;      /* Redis keeps an append-only file (set after ps_sup_init) */
  double excused_until; /* deaths before this are not failures (ps_sup_excuse) */
} ps_sup;

/* Set up (nothing starts but the children's notify sockets): cfg (which
 * must outlive s) is the run's config, already written to config_path;
 * logs go to RUNDIR/logs/<file>.log.  @return 0 or a negative code with a
 * message (then nothing is left open). */
int ps_sup_init(ps_sup *s, const ps_config *cfg, const char *config_path, const char *rundir,
                ps_sup_say_fn say, void *arg, ps_errbuf *eb);

/* Start redis-server and wait (up to 10 s) for its PING (none with a
 * config naming a Redis Cluster: that one is the config's), then the
 * chief, the shards and the workers.  @return 0, or a negative code with a
 * message (then whatever started has been stopped). */
int ps_sup_start(ps_sup *s, ps_errbuf *eb);

/* Reap the children that exited and restart (after 200 ms) those that
 * died, except in the drain and stop phases; read the children's notify
 * sockets and mark children ready (redis: answers PING; the others: sent
 * READY=1) and say when one is back; say once when one is not ready 30 s
 * after its start (with its last STATUS= and log line), and stop the run
 * with status 1 when one is not ready 120 s after its start; advance the
 * phases: the chief's exit 0 drains the run (10 s for the others to exit
 * by themselves, then they are stopped), as does every shard and worker
 * exiting 0 (the chief stopped them and died before its own exit); 5
 * failures of one child within 30 s, or the chief's exit 3 (non-finite
 * weights), stop the run with status 1. */
void ps_sup_poll(ps_sup *s, double now);

/* Stop every child in order -- workers, chief, shards, redis -- each
 * group with SIGTERM, the next when the group has exited or after 3 s;
 * whatever runs 10 s after the call gets SIGKILL.  The run's status
 * becomes `result` (unless a stop is already under way). */
void ps_sup_stop(ps_sup *s, double now, int result, const char *why);

/* SIGKILL every running child at once (a second Ctrl-C). */
void ps_sup_kill_all(ps_sup *s);

/* Faults are injected until `until` (ps_now_s time): children that die
 * before then are restarted as always but not counted toward the failure
 * limit of ps_sup_poll.  A later `until` than the current one extends it. */
void ps_sup_excuse(ps_sup *s, double until);

/* kill -9 one child (chaos); it comes back through supervision and the
 * time until it is back is recorded.  @return 0 or -errno. */
int ps_sup_kill(ps_sup *s, ps_sup_child *c, double now);

/* The last line of a child's log (without the supervisor's own lines),
 * into buf[len]; "" when there is none.  @return buf. */
const char *ps_sup_last_line(const ps_sup_child *c, char *buf, size_t len);

/* Write RUNDIR/pids: "name pid state" for the supervisor ("local", always
 * ready) and every running child, state "ready" once the incarnation is
 * ready (see ps_sup_poll), else "starting"; replaced atomically at every
 * start, exit and readiness. */
void ps_sup_write_pids(const ps_sup *s);

const char *ps_sup_role_name(ps_sup_role r);

/* Close and free what ps_sup_init opened and allocated. */
void ps_sup_close(ps_sup *s);

#endif
