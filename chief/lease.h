/* The chief's lease in Redis: only the chief holding it acts.  SET NX PX
 * takes it with a value naming the holder and a fencing token (a number
 * that grows with every chief start); a Lua script renews it only while it
 * still holds this value. */
#ifndef PS_CHIEF_LEASE_H
#define PS_CHIEF_LEASE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_lease {
  char key[160];      /* {<cluster>}:chief */
  char value[256];    /* "token T host H pid P" */
  uint64_t token;
  int64_t ms;         /* time to live */
} ps_lease;

/* Set up the lease of `cluster` for this process (token, ms). */
void ps_lease_init(ps_lease *l, const char *cluster, uint64_t token, int64_t ms);

/* Take or renew the lease on `redis` (a hiredis redisContext *).
 * @return 1: held by this process (its time to live restarted); 0: another
 * holds it (its value copied to holder); -1: Redis did not answer (the
 * caller drops the connection). */
int ps_lease_take(const ps_lease *l, void *redis, char *holder, size_t holder_len);

/* Is `holder` (a lease value) a process of this host that no longer
 * exists?  Then its lease need not be waited out.  (A host name names one
 * PID namespace: the units and `paramserv local` run in the host's.) */
int ps_lease_holder_dead(const char *holder);

/* Take the lease from `holder` (its value, as ps_lease_take reported it)
 * if it still holds it.  @return 1 taken, 0 it changed meanwhile, -1 Redis
 * did not answer. */
int ps_lease_steal(const ps_lease *l, void *redis, const char *holder);

/* Give the lease up if this process still holds it. */
void ps_lease_release(const ps_lease *l, void *redis);

#endif
