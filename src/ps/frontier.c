/* The durability frontier of a shard's journal (see frontier.h).
 *
 * An entry is durable when a restore would reach it: its append and every
 * earlier one succeeded since the last switched snapshot, or a snapshot
 * covering it switched.  A failed append opens a hole: nothing after it is
 * durable until a snapshot that covers the hole switches (the replay stops
 * being able to chain past a missing entry, restore.c).  Waiters are
 * released in order, as the frontier moves. */
#include "ps/frontier.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"

struct ps_frontier_waiter {
  ps_frontier_waiter *next;
  uint64_t n;
  void (*done)(void *, int);
  void *arg;
};

void ps_frontier_init(ps_frontier *f, int degrade, int durable, uint64_t n, uint64_t nondurable) {
  memset(f, 0, sizeof *f);
  f->degrade = degrade;
  f->nondurable = nondurable;
  f->last_ok_n = f->answered_n = n;
  if (durable) {
    f->durable_n = n;
    f->have_durable = 1;
  } else {
    ps_frontier_lost(f, n, "Redis holds no snapshot of this state yet");
  }
}

static int status_of(const ps_frontier *f, uint64_t n) {
  if (f->holding && n > f->hold_n)
    return PS_DURABLE_QUEUED;
  if (f->have_durable && n <= f->durable_n)
    return PS_DURABLE_NOW;
  if (f->degrade && n <= f->answered_n)
    return PS_DURABLE_NOT;
  return PS_DURABLE_QUEUED;
}

static void release(ps_frontier *f) {
  while (f->wq != NULL) {
    ps_frontier_waiter *w = f->wq;
    int status = status_of(f, w->n);
    if (status == PS_DURABLE_QUEUED)
      break;
    f->wq = w->next;
    if (f->wq == NULL)
      f->wq_tail = NULL;
    f->waiting--;
    if (status == PS_DURABLE_NOT)
      f->nondurable++;
    w->done(w->arg, status);
    free(w);
  }
}

void ps_frontier_answered(ps_frontier *f, uint64_t n, const char *failure) {
  if (n > f->answered_n)
    f->answered_n = n;
  if (failure == NULL) {
    if (n > f->last_ok_n)
      f->last_ok_n = n;
    if (!f->hole) {
      f->durable_n = n;
      f->have_durable = 1;
    }
  } else {
    if (f->why[0] == '\0') {
      snprintf(f->why, sizeof f->why, "%s", failure);
      f->why_since_ns = ps_now_ns();
      ps_log(PS_LOG_WARN, "redis: journal entry %" PRIu64 " not stored: %s; %s", n, failure,
             f->degrade ? "acknowledging without it (on_redis_failure = degrade; counted)"
                        : "holding acknowledgements until a snapshot covers it "
                          "(on_redis_failure = block)");
    }
    f->hole = 1;
    if (n > f->hole_max)
      f->hole_max = n;
  }
  release(f);
}

void ps_frontier_covered(ps_frontier *f, uint64_t n) {
  if (!f->have_durable || n > f->durable_n)
    f->durable_n = n;
  f->have_durable = 1;
  if (f->hole && n >= f->hole_max) {
    /* No failure after n: what Redis stored after the cut is durable too. */
    f->hole = 0;
    if (f->last_ok_n > f->durable_n)
      f->durable_n = f->last_ok_n;
    double secs = (double)(ps_now_ns() - f->why_since_ns) * 1e-9;
    if (f->why[0] != '\0')
      ps_log(f->waiting > 0 || secs >= 1 ? PS_LOG_INFO : PS_LOG_DEBUG, "redis: the journal is durable again at entry %" PRIu64 " after %.1f s "
             "(%s); %" PRIu64 " acknowledgements were held", f->durable_n,
             secs, f->why, f->waiting);
    f->why[0] = '\0';
  }
  release(f);
}

void ps_frontier_lost(ps_frontier *f, uint64_t n, const char *why) {
  f->hole = 1;
  if (n > f->hole_max)
    f->hole_max = n;
  if (f->why[0] == '\0') {
    snprintf(f->why, sizeof f->why, "%s", why);
    f->why_since_ns = ps_now_ns();
  }
}

void ps_frontier_hold(ps_frontier *f, uint64_t n) {
  f->holding = 1;
  f->hold_n = n;
}

void ps_frontier_unhold(ps_frontier *f) {
  f->holding = 0;
  release(f);
}

int ps_frontier_wait(ps_frontier *f, uint64_t n, void (*done)(void *arg, int status), void *arg) {
  int status = f->wq == NULL ? status_of(f, n) : PS_DURABLE_QUEUED;
  if (status == PS_DURABLE_NOT)
    f->nondurable++;
  if (status != PS_DURABLE_QUEUED)
    return status;
  ps_frontier_waiter *w = malloc(sizeof *w);
  if (w == NULL)
    return -ENOMEM;
  *w = (ps_frontier_waiter){NULL, n, done, arg};
  if (f->wq_tail != NULL)
    f->wq_tail->next = w;
  else
    f->wq = w;
  f->wq_tail = w;
  f->waiting++;
  return PS_DURABLE_QUEUED;
}

void ps_frontier_cancel(ps_frontier *f, int status) {
  while (f->wq != NULL) {
    ps_frontier_waiter *w = f->wq;
    f->wq = w->next;
    f->waiting--;
    w->done(w->arg, status);
    free(w);
  }
  f->wq_tail = NULL;
}
