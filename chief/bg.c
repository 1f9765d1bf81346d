/* One background job at a time (see bg.h). */
#include "chief/bg.h"

static void *bg_main(void *arg) {
  ps_bg *b = arg;
  b->fn(b->job);
  atomic_store(&b->state, 2);
  return NULL;
}

int ps_bg_start(ps_bg *b, void *(*fn)(void *), void *job) {
  b->fn = fn;
  b->job = job;
  atomic_store(&b->state, 1);
  if (pthread_create(&b->t, NULL, bg_main, b) != 0) {
    atomic_store(&b->state, 0);
    return -1;
  }
  return 0;
}

void *ps_bg_finished(ps_bg *b) {
  if (atomic_load(&b->state) != 2)
    return NULL;
  pthread_join(b->t, NULL);
  atomic_store(&b->state, 0);
  return b->job;
}

int ps_bg_busy(ps_bg *b) { return atomic_load(&b->state) != 0; }
