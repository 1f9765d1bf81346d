/* A lazy restore's rows (REDIS.md §7, src/ps/TABLE.md "Lazy loads"): while
 * the shard serves, every bucket's hash of the sparse tables' rows is read
 * in the background on the link, and the keys a request needs before their
 * bucket is in are fetched first (ps_rowload_fetch), each into the shard's
 * tables on the loop.  When every bucket is in, the tables are linked and
 * the load ends.  Private to src/replica (replica.c). */
#ifndef PS_REPLICA_ROWLOAD_H
#define PS_REPLICA_ROWLOAD_H

#include <stddef.h>

#include "ps/shard.h"
#include "replica/link.h"

typedef struct ps_rowload ps_rowload;

/* Called once the keys of a fetch are in the tables (or the load ended). */
typedef void ps_rowload_done_fn(void *arg);
/* The load cannot go on (a hash that does not decode, no memory): why. */
typedef void ps_rowload_failed_fn(void *arg, const char *why);

/* The load of `shard` (ps_shard_lazy) on `l`; it starts once the link is
 * up (ps_rowload_up).  NULL when out of memory. */
ps_rowload *ps_rowload_new(ps_link *l, ps_shard *shard, ps_rowload_failed_fn *failed,
                           void *arg);
/* The link is up: what is not in yet is asked for (again). */
void ps_rowload_up(ps_rowload *rl);
/* Bring keys[0..n) (ps_shard_lazy_missing's) in; done(arg) then, on the
 * loop, never before this returns.  @return 0, or -ENOMEM. */
int ps_rowload_fetch(ps_rowload *rl, const ps_shard_key *keys, size_t n, ps_rowload_done_fn *done,
                     void *arg);
/* Every callback still owed is called (done), the rest dropped.  After the
 * link's close. */
void ps_rowload_free(ps_rowload *rl);

#endif
