/* The durability frontier of a shard's journal (REDIS.md §9): which
 * entries a restore would reach, and the acknowledgements waiting for it.
 * Pure bookkeeping, no I/O: durable.c keeps it and feeds it what the
 * replica reports Redis answered. */
#ifndef PS_PS_FRONTIER_H
#define PS_PS_FRONTIER_H

#include <stdint.h>

/* What ps_frontier_wait says, and the status a waiter's done gets. */
enum {
  PS_DURABLE_QUEUED = 0,  /* done(arg, status) will run later */
  PS_DURABLE_NOW = 1,     /* durable: acknowledge */
  PS_DURABLE_NOT = 2,     /* degrade: Redis failed it; acknowledge, counted as non-durable */
};

typedef struct ps_frontier_waiter ps_frontier_waiter;

typedef struct ps_frontier {
  int degrade;            /* on_redis_failure = degrade */
  uint64_t durable_n;     /* entries up to here are durable ... */
  int have_durable;       /* ... once this is set */
  int hole;               /* an entry <= hole_max failed and no snapshot covers it */
  uint64_t hole_max;
  uint64_t last_ok_n;     /* newest entry Redis stored */
  uint64_t answered_n;    /* newest entry Redis answered, either way */
  ps_frontier_waiter *wq, *wq_tail;
  uint64_t waiting;       /* queued waiters */
  uint64_t nondurable;    /* acknowledged without being durable */
  int holding;            /* back-pressure: entries after hold_n wait, durable or not */
  uint64_t hold_n;
  char why[256];          /* sticky: why entries are not durable ("" when they are) */
  uint64_t why_since_ns;
} ps_frontier;

/* A frontier for a journal at count n.  durable: Redis holds the state at
 * n (a restore loaded it); otherwise nothing is durable until
 * ps_frontier_covered(f, >= n), and `why` says so.  nondurable: the count
 * carried over from the replica. */
void ps_frontier_init(ps_frontier *f, int degrade, int durable, uint64_t n, uint64_t nondurable);

/* Redis answered the append of entry n (answers come in the order of n):
 * stored when failure is NULL, else not (the reason, logged once per
 * failure window).  Runs the waiters this releases. */
void ps_frontier_answered(ps_frontier *f, uint64_t n, const char *failure);

/* A snapshot of the state at journal count n switched. */
void ps_frontier_covered(ps_frontier *f, uint64_t n);

/* Everything Redis held is gone (it lost its data): nothing after n is
 * durable until a snapshot covers n. */
void ps_frontier_lost(ps_frontier *f, uint64_t n, const char *why);

/* Wait for entry n: a PS_DURABLE_* code now (done is not called), or
 * PS_DURABLE_QUEUED and done(arg, status) later, with PS_DURABLE_NOW,
 * PS_DURABLE_NOT, or the status given to ps_frontier_cancel.  -ENOMEM
 * when it cannot queue.  Waiters must come in the order of n. */
int ps_frontier_wait(ps_frontier *f, uint64_t n, void (*done)(void *arg, int status), void *arg);

/* Back-pressure: from now on the waiters of entries after n wait even
 * once durable (or, degrade, answered), until ps_frontier_unhold. */
void ps_frontier_hold(ps_frontier *f, uint64_t n);
void ps_frontier_unhold(ps_frontier *f);

/* Run every queued waiter with `status` (a negative code). */
void ps_frontier_cancel(ps_frontier *f, int status);

#endif
