/* The chief's lease in Redis: only the chief holding it acts.  A Lua
 * script takes it when free (SET PX) with a value naming the holder and a
 * fencing token (handed out at that moment, higher than every earlier
 * holder's) and renews it only while it still holds this value.  Nothing else frees it: a new chief
 * waits until the lease expires, unless its holder released it (a process
 * proves it is gone only by saying so; a host name and pid prove nothing
 * across PID namespaces and hosts).  Every chief frame carries the token
 * (PROTOCOL.md "Fencing"), and the checkpoint commit checks the lease
 * (ps_lease_check) before each step that others would see. */
#ifndef PS_CHIEF_LEASE_H
#define PS_CHIEF_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "replica/keys.h"

/* Written only by lease.c. */
typedef struct ps_lease {
  char key[PS_KEY_MAX];        /* {<cluster>}:chief */
  char epoch_key[PS_KEY_MAX];  /* {<cluster>}:epoch:chief:0: the tokens handed out so far */
  char who[200];      /* "host H pid P" */
  char value[256];    /* "token T host H pid P" while held; "" before */
  uint64_t token;     /* T: 0 before the lease was first taken */
  int64_t ms;         /* time to live */
} ps_lease;

/* Set up the lease of `cluster` for this process (not taken yet). */
void ps_lease_init(ps_lease *l, const char *cluster, int64_t ms);

/* Take or renew the lease on `redis` (a hiredis redisContext *).  Taking a
 * free lease hands out a new fencing token, higher than every earlier
 * holder's (one Lua script: the epoch key grows to max(itself + 1, now in
 * ms)), into l->token and l->value; renewing keeps them.  A lease that
 * lapsed and is taken again gets a new token.
 * @return 1: held by this process (its time to live restarted); 0: another
 * holds it (its value copied to holder); -1: Redis did not answer, or
 * answered with an error (its text copied to holder; the caller drops the
 * connection). */
int ps_lease_take(ps_lease *l, void *redis, char *holder, size_t holder_len);

/* Does this process still hold the lease?  One GET, no renewal.
 * @return 1 held, 0 not (the holder's value, or "nobody", in holder), -1
 * Redis did not answer (the caller must act as if it were lost). */
int ps_lease_check(const ps_lease *l, void *redis, char *holder, size_t holder_len);

/* A checkpoint commit's fence over the lease (ps_ckpt_owner.fence, with a
 * ps_lease_fence as arg): passes only while Redis confirms the lease is
 * still ours.  Each thread that commits checkpoints needs its own
 * registry (hiredis contexts are not shared between threads). */
typedef struct ps_lease_fence {
  const ps_lease *lease;
  struct ps_registry *reg;   /* its Redis connection (with a timeout) */
} ps_lease_fence;
int ps_lease_fence_check(void *arg, char *why, size_t len);

/* Give the lease up if this process still holds it (one Lua script: GET,
 * compare, DEL), so that a successor need not wait for it to expire.
 * @return 1 released, 0 not ours (any more), -1 Redis did not answer. */
int ps_lease_release(const ps_lease *l, void *redis);

#endif
