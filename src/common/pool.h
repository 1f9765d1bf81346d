/* A fork-join thread pool: run one function on every thread and wait. */
#ifndef PS_COMMON_POOL_H
#define PS_COMMON_POOL_H

typedef struct ps_pool ps_pool;

/* fn(arg, tid, nthreads) runs once on each of nthreads threads. */
typedef void (*ps_pool_fn)(void *arg, int tid, int nthreads);

/* Start a pool of `nthreads` (>= 1); the caller's thread is thread 0, so
 * nthreads - 1 threads are created.  @return NULL on failure. */
ps_pool *ps_pool_new(int nthreads);

/* Run fn on every thread of the pool and return when all have returned.
 * Not reentrant: one run at a time, from the thread that created the pool. */
void ps_pool_run(ps_pool *p, ps_pool_fn fn, void *arg);

int ps_pool_size(const ps_pool *p);

/* Stop and join the threads.  ps_pool_free(NULL) does nothing. */
void ps_pool_free(ps_pool *p);

/* fn(arg, k) for every k in [0, n), on up to min(n, online cores)
 * threads of a pool made for this call (the caller's thread alone when
 * none can be made); returns when every call has returned. */
typedef void (*ps_pool_item_fn)(void *arg, int k);
void ps_pool_for(int n, ps_pool_item_fn fn, void *arg);

#endif
