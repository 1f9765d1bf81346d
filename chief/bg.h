/* One job at a time on a thread of its own: the chief's checkpoint writer
 * and its evaluator.  The chief has no libuv loop of its own (the client
 * runs one per call), so its background work runs on plain threads. */
#ifndef PS_CHIEF_BG_H
#define PS_CHIEF_BG_H

#include <pthread.h>
#include <stdatomic.h>

typedef struct ps_bg {
  pthread_t t;
  atomic_int state;  /* 0 idle, 1 running, 2 finished (to be joined) */
  void *(*fn)(void *);
  void *job;
} ps_bg;

/* Run fn(job) on a new thread.  @return 0, or -1 when no thread could be
 * made (the caller runs the job itself). */
int ps_bg_start(ps_bg *b, void *(*fn)(void *), void *job);

/* The finished job, joined, or NULL while idle or running. */
void *ps_bg_finished(ps_bg *b);

/* Running, or finished and not yet taken by ps_bg_finished. */
int ps_bg_busy(ps_bg *b);

#endif
