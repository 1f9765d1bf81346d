/* The faults of `paramserv local --nemesis`: kill -9 of a process, SIGSTOP
 * and SIGCONT of one, and windows in which Redis refuses writes, injected
 * at random on one seeded schedule into the processes of a supervisor;
 * each fault's time to recover, and the longest stall of the acks outside
 * the faults, measured as the run goes.
 *
 * It lives beside the supervisor because the supervisor owns the
 * processes: it signals a pid only while that pid is the child it names
 * (never a pid that was reaped and reused), kills are recorded as kills,
 * not failures, and nothing is left stopped when the run ends (every pause
 * is resumed and every Redis window healed once faults stop).
 *
 * What it measures comes from the run's machine-readable files: the acks
 * from the workers' histories ([cluster] history_dir, scripts/check-history's
 * format), the chief's progress from its summaries (ps_progress), a
 * replaced process from the supervisor's readiness.  Each fault and its
 * end and recovery is one JSON line in RUNDIR/nemesis.jsonl. */
#ifndef PS_LOCAL_NEMESIS_H
#define PS_LOCAL_NEMESIS_H

#include <jansson.h>
#include <stdint.h>

#include "local/progress.h"
#include "local/supervisor.h"
#include "paramserv/error.h"

typedef enum ps_nem_kind {
  PS_NEM_KILL = 0,    /* kill -9 of a shard, worker or the chief (Redis with kill_redis) */
  PS_NEM_PAUSE,       /* SIGSTOP of a shard, worker, the chief or redis-server, then SIGCONT */
  PS_NEM_REDIS_ERRORS, /* Redis refuses writes (NOREPLICAS, OOM or NOPERM), then heals */
  PS_NEM_NKINDS
} ps_nem_kind;

#define PS_NEM_ALL ((1u << PS_NEM_NKINDS) - 1)

typedef struct ps_nemesis ps_nemesis;

/* The name of a kind as --nemesis spells it ("redis-errors"). */
const char *ps_nemesis_kind_name(ps_nem_kind k);

/* The default shortest gap between two faults, in seconds. */
#define PS_NEMESIS_GAP_S 2.0

/* Parse a --nemesis list ("kill,pause,redis-errors", any non-empty subset)
 * into a set of 1 << kind bits.  @return 0, or PS_EINVAL with a message
 * naming the unknown word. */
int ps_nemesis_parse(const char *list, unsigned *kinds, ps_errbuf *eb);

/* A nemesis over sup's children (sup, cfg and progress must outlive it):
 * `kinds` from ps_nemesis_parse, kill_redis lets kills pick redis-server,
 * `seed` names the schedule (the same seed draws the same sequence of
 * delays, kinds, targets and durations).  A fault starts every gap_s to
 * 2.5 gap_s seconds (<= 0: PS_NEMESIS_GAP_S), the first that long after the
 * first ps_nemesis_poll with `active` set; each round of faults has every
 * kind once.  Acks are read from cfg->history_dir (none measured when it is
 * empty); events go to RUNDIR/nemesis.jsonl, replaced.  @return NULL with a
 * message on failure. */
ps_nemesis *ps_nemesis_new(ps_sup *sup, const ps_config *cfg, const ps_progress *progress,
                           const char *rundir, unsigned kinds, int kill_redis, double gap_s,
                           uint64_t seed, ps_errbuf *eb);

/* Call after each ps_sup_poll.  While `active` (training, before the step
 * limit) faults are injected on schedule and ended when their time is up;
 * once it is 0, every fault still on is ended at once and no other starts.
 * Always reads the new acks and follows recoveries. */
void ps_nemesis_poll(ps_nemesis *n, double now, int active);

/* Say the report's lines (through the supervisor's say function) and add a
 * "nemesis" object to `report`: per kind the faults, their recovery times
 * and those that never recovered; the longest stall of the acks and its
 * part outside the fault windows. */
void ps_nemesis_report(ps_nemesis *n, json_t *report, double now);

/* Close the events file and free.  Call ps_nemesis_poll with active 0
 * first, while the supervisor's children still run, so that no fault is
 * left on.  NULL does nothing. */
void ps_nemesis_free(ps_nemesis *n);

#endif
