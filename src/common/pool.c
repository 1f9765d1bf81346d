/* A fork-join thread pool (see pool.h). */
#include "common/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct ps_pool {
  int n;
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t start, done;
  unsigned long generation;  /* bumped per run; workers wait for a change */
  int pending;               /* workers still running this generation */
  int stop;
  ps_pool_fn fn;
  void *arg;
};

typedef struct worker_arg {
  ps_pool *pool;
  int tid;
} worker_arg;

static void *worker_main(void *p) {
  worker_arg wa = *(worker_arg *)p;
  free(p);
  ps_pool *pool = wa.pool;
  unsigned long seen = 0;
  pthread_mutex_lock(&pool->mu);
  for (;;) {
    while (!pool->stop && pool->generation == seen)
      pthread_cond_wait(&pool->start, &pool->mu);
    if (pool->stop)
      break;
    seen = pool->generation;
    ps_pool_fn fn = pool->fn;
    void *arg = pool->arg;
    pthread_mutex_unlock(&pool->mu);
    fn(arg, wa.tid, pool->n);
    pthread_mutex_lock(&pool->mu);
    if (--pool->pending == 0)
      pthread_cond_signal(&pool->done);
  }
  pthread_mutex_unlock(&pool->mu);
  return NULL;
}

ps_pool *ps_pool_new(int nthreads) {
  if (nthreads < 1)
    return NULL;
  ps_pool *p = calloc(1, sizeof *p);
  if (p == NULL)
    return NULL;
  p->threads = calloc((size_t)nthreads, sizeof *p->threads);
  if (p->threads == NULL) {
    free(p);
    return NULL;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->start, NULL);
  pthread_cond_init(&p->done, NULL);
  p->n = 1;
  for (int t = 1; t < nthreads; t++) {
    worker_arg *wa = malloc(sizeof *wa);
    if (wa == NULL)
      break;
    wa->pool = p;
    wa->tid = t;
    if (pthread_create(&p->threads[t], NULL, worker_main, wa) != 0) {
      free(wa);
      break;
    }
    p->n++;
  }
  if (p->n != nthreads) {
    ps_pool_free(p);
    return NULL;
  }
  return p;
}

void ps_pool_run(ps_pool *p, ps_pool_fn fn, void *arg) {
  if (p->n > 1) {
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
  }
  fn(arg, 0, p->n);
  if (p->n > 1) {
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
      pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
}

int ps_pool_size(const ps_pool *p) { return p->n; }

void ps_pool_free(ps_pool *p) {
  if (p == NULL)
    return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->mu);
  for (int t = 1; t < p->n; t++)
    pthread_join(p->threads[t], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->start);
  pthread_cond_destroy(&p->done);
  free(p->threads);
  free(p);
}

typedef struct for_job {
  int n;
  ps_pool_item_fn fn;
  void *arg;
} for_job;

static void for_run(void *arg, int tid, int nthreads) {
  for_job *j = arg;
  for (int k = tid; k < j->n; k += nthreads)
    j->fn(j->arg, k);
}

void ps_pool_for(int n, ps_pool_item_fn fn, void *arg) {
  for_job j = {n, fn, arg};
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int nthreads = cores < n ? (int)cores : n;
  ps_pool *p = nthreads > 1 ? ps_pool_new(nthreads) : NULL;
  if (p == NULL) {
    for_run(&j, 0, 1);
    return;
  }
  ps_pool_run(p, for_run, &j);
  ps_pool_free(p);
}
