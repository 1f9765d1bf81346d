/* The chief's lease, renewed by a thread of its own: whatever the chief's
 * main thread is doing (a restore reading a large checkpoint, a cut, an
 * evaluation), the lease is renewed every third of its time to live on a
 * Redis connection of the keeper's own, and every 100 ms after a renewal
 * failed until one succeeds.  The main thread asks, before each
 * action others would see, whether the lease is still held. */
#ifndef PS_CHIEF_KEEPER_H
#define PS_CHIEF_KEEPER_H

#include <pthread.h>
#include <stdint.h>

#include "chief/lease.h"
#include "common/config.h"

typedef struct ps_lease_keeper {
  pthread_t thread;
  ps_lease lease;            /* the keeper's own copy of the held lease */
  struct ps_registry *reg;   /* its own Redis connection */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;                  /* under mu */
  int lost;                  /* under mu: 1 once the lease is not ours */
  char why[512];             /* under mu: why, one line */
  int started;
} ps_lease_keeper;

/* Start renewing `held` (taken by ps_lease_take on this process's behalf).
 * @return 0, or -1 when no thread or connection could be made. */
int ps_lease_keeper_start(ps_lease_keeper *k, const ps_config *cfg, const ps_lease *held);

/* 0 while the lease is held; -1 once it is not (lapsed, taken by another
 * chief, or unconfirmed by Redis for its whole time to live), with the
 * reason in why. */
int ps_lease_keeper_check(ps_lease_keeper *k, char *why, size_t len);

/* Stop renewing (joins the thread); safe on a keeper never started. */
void ps_lease_keeper_stop(ps_lease_keeper *k);

#endif
