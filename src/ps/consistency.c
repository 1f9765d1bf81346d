/* A shard's consistency rules: held pulls, the slowest clock, the sync
 * step's target (see consistency.h). */
#include "ps/consistency.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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
    return ps_shard_version(s->shard) >= cl->pull.step;
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
    if (c->state == C_READY && c->pull.held && pull_ready(s, c)) {
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

/* Gradients the current step still waits for: the timeout runs from the
 * step's first one. */
static void sync_progress(server *s) {
  if (ps_shard_sync_pending(s->shard) > 0 && s->cons.sync_started_ns == 0)
    s->cons.sync_started_ns = ps_now_ns();
  if (ps_shard_sync_pending(s->shard) == 0)
    s->cons.sync_started_ns = 0;
}

/* counted[] describes the step at the shard's version: a new step starts
 * with none. */
static void counted_now(server *s) {
  if (s->cons.counted_v != ps_shard_version(s->shard)) {
    memset(s->cons.counted, 0, sizeof s->cons.counted);
    s->cons.counted_v = ps_shard_version(s->shard);
  }
}

/* Workers a step can expect a gradient from: those not dropped. */
static int expected(const server *s) {
  int n = 0;
  for (int j = 0; j < s->cfg->nworkers; j++)
    n += !s->cons.dropped[j];
  return n;
}

/* Apply the step with the gradients it has (ps_shard_sync_flush: the
 * following steps then complete with as many).  The workers whose gradient
 * it lacks are dropped until they show up again. */
static void sync_flush(server *s, const char *why) {
  counted_now(s);
  int have = ps_shard_sync_pending(s->shard);
  ps_journal e;
  if (!ps_shard_sync_flush(s->shard, &e))
    return;
  for (int j = 0; j < s->cfg->nworkers; j++)
    if (!s->cons.counted[j])
      s->cons.dropped[j] = 1;
  ps_durable_journal(s->durable, &e);
  ps_durable_updated(s->durable);
  ps_log(PS_LOG_WARN,
         "step %" PRIu64 ": %d of %d gradients %s; applied them without the missing workers, "
         "and go on with %d per step until one of them is back",
         ps_shard_version(s->shard) - 1, have, ps_shard_options(s->shard)->replicas_to_aggregate,
         why, have);
  s->cons.sync_started_ns = 0;
  release_pulls(s);
}

/* A step that has a gradient from every worker not dropped, but fewer than
 * its target (raised again while another worker is still missing), needs
 * not wait out the timeout: it is applied now.  Logged as a flush, so
 * replay applies it at the same place. */
static void sync_complete_early(server *s) {
  counted_now(s);
  int pending = ps_shard_sync_pending(s->shard);
  if (pending == 0 || pending >= ps_shard_sync_target(s->shard))
    return;
  for (int j = 0; j < s->cfg->nworkers; j++)
    if (!s->cons.dropped[j] && !s->cons.counted[j])
      return;
  sync_flush(s, "from every worker not missing");
}

/* Worker j showed itself (`how`): it is counted again.  When the target
 * is below the gradients the workers not dropped can give (capped at
 * replicas_to_aggregate), steps wait for the full count again; with
 * workers still missing, sync_complete_early then brings the count down
 * to the workers present without waiting out a timeout.  Both are log
 * journal entries (target, flush) that replay re-applies in order. */
static void worker_back(server *s, uint32_t j, const char *how) {
  if (s->cfg->consistency != PS_CONSISTENCY_SYNC || j >= (uint32_t)s->cfg->nworkers)
    return;
  s->cons.dropped[j] = 0;
  int want = expected(s);
  if (want > ps_shard_options(s->shard)->replicas_to_aggregate)
    want = ps_shard_options(s->shard)->replicas_to_aggregate;
  if (ps_shard_sync_target(s->shard) >= want)
    return;
  ps_journal e;
  if (!ps_shard_sync_set_target(s->shard, ps_shard_options(s->shard)->replicas_to_aggregate, &e))
    return;
  ps_durable_journal(s->durable, &e);
  ps_log(PS_LOG_INFO, "sync: worker %u %s; steps wait for %d gradients again", j, how,
         ps_shard_sync_target(s->shard));
  sync_complete_early(s);
}

void ps_consistency_pushed(client *cl, ps_push_result r, uint64_t before) {
  server *s = cl->srv;
  if (s->cfg->consistency != PS_CONSISTENCY_SYNC)
    return;
  if (r == PS_SHARD_APPLIED && ps_shard_version(s->shard) == before) {
    counted_now(s);
    s->cons.counted[cl->index] = 1;
  }
  /* Any push, even a stale one, says the worker is back. */
  worker_back(s, cl->index, "pushes again");
  sync_complete_early(s);
  sync_progress(s);
  if (ps_shard_version(s->shard) != before)
    release_pulls(s);
}

void ps_consistency_joined(client *cl) {
  if (cl->role == PS_ROLE_WORKER)
    worker_back(cl->srv, cl->index, "connected");
}

void ps_consistency_tick(server *s, uint64_t now) {
  if (s->cfg->consistency != PS_CONSISTENCY_SYNC || s->cons.sync_started_ns == 0 ||
      now - s->cons.sync_started_ns <= (uint64_t)s->cfg->sync_timeout_ms * 1000000ULL)
    return;
  char why[64];
  snprintf(why, sizeof why, "after %" PRId64 " ms", s->cfg->sync_timeout_ms);
  sync_flush(s, why);
}

/* ----------------------------------------------------------- heartbeats */

static void on_workers_alive(void *arg, const uint8_t *alive, int n) {
  server *s = arg;
  int changed = 0;
  uint8_t was[PS_CONFIG_MAX_NODES];
  memcpy(was, s->cons.silent, sizeof was);
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
               !silent ? "back"
               : s->cfg->consistency == PS_CONSISTENCY_SSP ? "lapsed: the others do not wait for it"
                                                           : "lapsed");
        break;
      }
  }
  for (int j = 0; j < n && j < PS_CONFIG_MAX_NODES; j++)
    if (was[j] && !s->cons.silent[j])
      worker_back(s, (uint32_t)j, "heart-beats again");
  if (changed && s->cfg->consistency == PS_CONSISTENCY_SSP)
    release_pulls(s);
}

void ps_consistency_watch(server *s) {
  if (s->cfg->consistency != PS_CONSISTENCY_ASYNC)
    ps_durable_watch_workers(s->durable, on_workers_alive, s);
}
