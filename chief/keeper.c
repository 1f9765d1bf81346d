/* The lease keeper (see keeper.h). */
#include "chief/keeper.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "replica/registry.h"

/* Mark the lease lost, once, with why. */
static void lose(ps_lease_keeper *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lose(ps_lease_keeper *k, const char *fmt, ...) {
  pthread_mutex_lock(&k->mu);
  if (!k->lost) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->why, sizeof k->why, fmt, ap);
    va_end(ap);
    k->lost = 1;
  }
  pthread_mutex_unlock(&k->mu);
}

#define KEEPER_RETRY_NS (100 * 1000000ULL)

static void *keeper_main(void *arg) {
  ps_lease_keeper *k = arg;
  uint64_t third_ns = (uint64_t)k->lease.ms * 1000000ULL / 3;
  /* After a failed renewal, the next try comes soon: a Redis that refused
   * or did not answer for a second or two (paused, failing over, out of
   * memory) must find the lease renewed before it runs out, not a third
   * of the lease later. */
  uint64_t retry_ns = third_ns < KEEPER_RETRY_NS ? third_ns : KEEPER_RETRY_NS;
  uint64_t ok_ns = ps_now_ns();
  uint64_t token = k->lease.token;
  int said_away = 0;
  for (;;) {
    /* Sleep a third of the lease (after a failure, retry_ns), or until
     * told to stop: on the monotonic clock (the condition variable's),
     * which a step of the wall clock does not move. */
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + (said_away ? retry_ns : third_ns);
    until.tv_sec += (time_t)(ns / 1000000000ULL);
    until.tv_nsec = (long)(ns % 1000000000ULL);
    pthread_mutex_lock(&k->mu);
    while (!k->stop && !k->lost &&
           pthread_cond_timedwait(&k->cv, &k->mu, &until) != ETIMEDOUT) {
    }
    int done = k->stop || k->lost;
    pthread_mutex_unlock(&k->mu);
    if (done)
      return NULL;

    void *c = ps_registry_redis(k->reg, 1);
    char holder[256] = "";
    int rc = c != NULL ? ps_lease_take(&k->lease, c, holder, sizeof holder) : -1;
    uint64_t now = ps_now_ns();
    if (rc == 1 && k->lease.token != token) {
      /* It was free again, and this take gave it a new token: give that
       * back, so that the restart takes it at once.  Another chief may have
       * acted meanwhile: this one exits and its restart reads the cluster
       * again. */
      ps_lease_release(&k->lease, c);
      double since = (double)(now - ok_ns) * 1e-9;
      if (since * 1000.0 < (double)k->lease.ms)
        lose(k, "the lease %s was gone from Redis %.1f s after its last renewal, before its %"
             PRId64 " ms ran out: Redis lost it (FLUSHALL, FLUSHDB, a failover to a node "
             "without it); restarting reads the cluster again", k->lease.key, since, k->lease.ms);
      else
        lose(k, "the lease %s lapsed before it was renewed (token %" PRIu64 ", %.1f s since its "
             "last renewal)", k->lease.key, token, since);
    } else if (rc == 1) {
      ok_ns = now;
      if (said_away)
        ps_log(PS_LOG_INFO, "lease %s: renewed again", k->lease.key);
      said_away = 0;
    } else if (rc == 0) {
      lose(k, "lost the lease %s to another chief (%s)", k->lease.key, holder);
    } else {
      const char *why = holder[0] ? holder : c != NULL ? "no reply" : "no connection";
      if (c != NULL)
        ps_registry_lost(k->reg, "lease renewal failed");
      if (!said_away)
        ps_log(PS_LOG_WARN, "lease %s: renewal failed (Redis: %s); retrying until %" PRId64
               " ms after the last renewal", k->lease.key, why, k->lease.ms);
      said_away = 1;
      if (now - ok_ns > (uint64_t)k->lease.ms * 1000000ULL)
        lose(k, "Redis has not confirmed the lease %s for %" PRId64 " ms (last: %s): another "
             "chief may hold it now", k->lease.key, k->lease.ms, why);
    }
  }
}

int ps_lease_keeper_start(ps_lease_keeper *k, const ps_config *cfg, const ps_lease *held) {
  memset(k, 0, sizeof *k);
  k->lease = *held;
  k->reg = ps_registry_new(cfg, "chief", 0);
  if (k->reg == NULL)
    return -1;
  pthread_mutex_init(&k->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&k->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&k->thread, NULL, keeper_main, k) != 0) {
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    ps_registry_free(k->reg);
    k->reg = NULL;
    return -1;
  }
  k->started = 1;
  return 0;
}

int ps_lease_keeper_check(ps_lease_keeper *k, char *why, size_t len) {
  if (!k->started)
    return 0;  /* not renewing (yet, or any more): nothing to say */
  pthread_mutex_lock(&k->mu);
  int lost = k->lost;
  if (lost)
    snprintf(why, len, "%s", k->why);
  pthread_mutex_unlock(&k->mu);
  return lost ? -1 : 0;
}

void ps_lease_keeper_stop(ps_lease_keeper *k) {
  if (!k->started)
    return;
  pthread_mutex_lock(&k->mu);
  k->stop = 1;
  pthread_cond_signal(&k->cv);
  pthread_mutex_unlock(&k->mu);
  pthread_join(k->thread, NULL);
  pthread_cond_destroy(&k->cv);
  pthread_mutex_destroy(&k->mu);
  ps_registry_free(k->reg);
  k->reg = NULL;
  k->started = 0;
}
