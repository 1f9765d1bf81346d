/* A shard's consistency rules: held pulls, the slowest clock, the sync
 * step's target (see consistency.h). */
#include "ps/consistency.h"

#include <inttypes.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "ps/server_internal.h"

/* ----------------------------------------------------------- held pulls */

/* The smallest clock among live workers that have pulled at least once.
 * Live: connected, and (with Redis) heart-beating, so that a worker that
 * hangs with its connection open does not hold the others forever. */
static int min_clock(const server *s, uint64_t *out) {
  int found = 0;
  for (const client *c = s->clients; c != NULL; c = c->next)
    if (c->state == C_READY && c->role == PS_ROLE_WORKER && c->pull.has_clock &&
        !s->cons.silent[c->index] && (!found || c->pull.clock < *out)) {
      *out = c->pull.clock;
      found = 1;
    }
  return found;
}

static int pull_ready(const server *s, const client *cl) {
  switch (s->cfg->consistency) {
  case PS_CONSISTENCY_SYNC:
    return s->shard.version >= cl->pull.step;
  case PS_CONSISTENCY_SSP: {
    uint64_t lo = 0;
    if (!min_clock(s, &lo))
      return 1;
    return cl->pull.step <= lo + (uint64_t)s->cfg->staleness;
  }
  default:
    return 1;
  }
}

/* Answer every held pull whose condition now holds. */
static void release_pulls(server *s) {
  for (client *c = s->clients; c != NULL; c = c->next)
    if (c->pull.held && pull_ready(s, c)) {
      c->pull.held = 0;
      ps_server_pull_reply(c, c->pull.req);
    }
}

void ps_consistency_pull(client *cl, uint64_t req, uint64_t step) {
  server *s = cl->srv;
  if (s->cfg->consistency == PS_CONSISTENCY_SSP && cl->role == PS_ROLE_WORKER) {
    cl->pull.clock = step;
    cl->pull.has_clock = 1;
  }
  cl->pull.req = req;
  cl->pull.step = step;
  if (cl->role != PS_ROLE_WORKER || pull_ready(s, cl))
    ps_server_pull_reply(cl, req);
  else
    cl->pull.held = 1;
  /* A new clock may let others through. */
  if (s->cfg->consistency == PS_CONSISTENCY_SSP)
    release_pulls(s);
}

void ps_consistency_closed(server *s) {
  /* A worker that is gone no longer holds the slowest clock. */
  if (s->cfg->consistency == PS_CONSISTENCY_SSP)
    release_pulls(s);
}

/* ---------------------------------------------------------- sync target */

/* Append a sync event (flush or target reset) to the log, where replay
 * re-applies it at the same place among the pushes. */
static void log_event(server *s, int kind) {
  if (s->replica != NULL && s->cfg->replication == PS_REPLICATION_LOG)
    ps_replica_log(s->replica, &(ps_log_entry){.kind = kind, .v = s->shard.version}, NULL, NULL);
}

/* Gradients the current step still waits for: the timeout runs from the
 * step's first one. */
static void sync_progress(server *s) {
  if (s->shard.accum_count > 0 && s->cons.sync_started_ns == 0)
    s->cons.sync_started_ns = ps_now_ns();
  if (s->shard.accum_count == 0)
    s->cons.sync_started_ns = 0;
}

void ps_consistency_pushed(client *cl, ps_push_result r, uint64_t before) {
  server *s = cl->srv;
  (void)r;
  if (s->cfg->consistency != PS_CONSISTENCY_SYNC)
    return;
  sync_progress(s);
  if (s->shard.version != before)
    release_pulls(s);
}

void ps_consistency_joined(client *cl) {
  server *s = cl->srv;
  if (cl->role != PS_ROLE_WORKER || s->shard.target >= s->shard.o.replicas_to_aggregate)
    return;
  /* A worker is back: sync steps wait for the full count again. */
  ps_shard_sync_reset_target(&s->shard);
  log_event(s, PS_LOG_RESET);
  ps_log(PS_LOG_INFO, "sync: worker %u joined; steps wait for %d gradients again", cl->index,
         s->shard.target);
}

void ps_consistency_tick(server *s, uint64_t now) {
  if (s->cfg->consistency != PS_CONSISTENCY_SYNC || s->cons.sync_started_ns == 0 ||
      now - s->cons.sync_started_ns <= (uint64_t)s->cfg->sync_timeout_ms * 1000000ULL)
    return;
  int have = s->shard.accum_count;
  if (!ps_shard_sync_flush(&s->shard))
    return;
  log_event(s, PS_LOG_FLUSH);
  if (s->replica != NULL)
    ps_replica_updated(s->replica);
  ps_log(PS_LOG_WARN,
         "step %" PRIu64 ": %d of %d gradients after %" PRId64 " ms; applied them without the "
         "missing workers, and go on with %d per step until a worker joins",
         s->shard.version - 1, have, s->shard.o.replicas_to_aggregate, s->cfg->sync_timeout_ms,
         have);
  s->cons.sync_started_ns = 0;
  release_pulls(s);
}

/* ----------------------------------------------------------- heartbeats */

static void on_workers_alive(void *arg, const uint8_t *alive, int n) {
  server *s = arg;
  int changed = 0;
  for (int j = 0; j < n && j < PS_CONFIG_MAX_NODES; j++) {
    /* A worker that has not beaten yet (starting) has no clock either:
     * min_clock skips it for that reason already. */
    uint8_t silent = !alive[j];
    if (silent == s->cons.silent[j])
      continue;
    s->cons.silent[j] = silent;
    changed = 1;
    for (client *c = s->clients; c != NULL; c = c->next)
      if (c->state == C_READY && c->role == PS_ROLE_WORKER && c->index == (uint32_t)j) {
        ps_log(PS_LOG_INFO, "%s: heartbeat %s", c->name,
               silent ? "lapsed: the others do not wait for it" : "back");
        break;
      }
  }
  if (changed && s->cfg->consistency == PS_CONSISTENCY_SSP)
    release_pulls(s);
}

void ps_consistency_watch(server *s) {
  if (s->cfg->consistency == PS_CONSISTENCY_SSP)
    ps_replica_watch_workers(s->replica, on_workers_alive, s);
}
