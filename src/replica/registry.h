/* A process's own small records in Redis, written with short blocking
 * calls from a process without an event loop (the worker): its
 * incarnation epoch, its heartbeat, and a worker's data position.  Redis
 * being away never stops the caller: writes are skipped and retried. */
#ifndef PS_REPLICA_REGISTRY_H
#define PS_REPLICA_REGISTRY_H

#include <stdint.h>

#include "common/config.h"
#include "data/sampler.h"
#include "paramserv/error.h"

typedef struct ps_registry ps_registry;

/* Take a new epoch at `key` (opaque hiredis redisContext *): larger than
 * the key's value and than the current time in milliseconds, so epochs
 * keep growing even after Redis lost its data, and a new incarnation
 * always outranks one that ran before it.  @return 0 or a negative code
 * with a message. */
int ps_redis_new_epoch(void *redis_context, const char *key, uint64_t *epoch, ps_errbuf *eb);

/* For `role` ("worker", "ps", "chief") number `index`.  Connects lazily.
 * @return NULL on allocation failure. */
ps_registry *ps_registry_new(const ps_config *cfg, const char *role, int index);
void ps_registry_free(ps_registry *r);

/* A new incarnation: INCR {<cluster>}:epoch:<role>:<index>.  Waits for
 * Redis (logging what it waits for) until *stop becomes nonzero.
 * @return 0 or a negative code with a message. */
int ps_registry_new_epoch(ps_registry *r, volatile int *stop, uint64_t *epoch, ps_errbuf *eb);

/* The worker's saved data position and ssp clock (its pushes over all its
 * incarnations; 0 when the record has none: one written before the clock
 * was kept, or by the chief restoring a checkpoint).  @return 1 when a
 * record was found, 0 when none (or Redis is away). */
int ps_registry_load_pos(ps_registry *r, ps_data_pos *pos, uint64_t *clock);

/* The ssp clock written with the data position from the next save on. */
void ps_registry_set_clock(ps_registry *r, uint64_t clock);

/* Called once per training step: saves the data position with the clock
 * (ps_registry_set_clock; none when pos is NULL: the chief) at most every
 * 100 ms and refreshes the heartbeat every [worker] heartbeat_ms with TTL
 * three times that, payload "pid P host H incarnation I step S steps/s R".
 * force: save now (at exit). */
void ps_registry_tick(ps_registry *r, const ps_data_pos *pos, uint64_t step, double steps_per_s,
                      int force);

/* The connection (an opaque hiredis redisContext *), connected now if
 * needed (wait: even if the last attempt failed less than a second ago);
 * NULL while Redis is away.  After a NULL reply of a command on it, call
 * ps_registry_lost. */
void *ps_registry_redis(ps_registry *r, int wait);
const ps_config *ps_registry_config(const ps_registry *r);

/* A command on that connection (an opaque hiredis redisReply *, error
 * replies included; free it with freeReplyObject), or NULL when Redis is
 * away, not tried again for a second after a failed connect. */
void *ps_registry_command(ps_registry *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void ps_registry_lost(ps_registry *r, const char *why);

/* Which of the n workers' heartbeat keys exist (alive[j] 1 or 0), in one
 * MGET.  @return 0, or -1 (Redis away or refusing: alive untouched). */
int ps_registry_workers_alive(ps_registry *r, uint8_t *alive, int n);

/* Worker j's saved data position (1), none (0), or Redis away (-1). */
int ps_registry_get_pos(ps_registry *r, int worker, ps_data_pos *pos);
/* Save worker j's data position (the chief, restoring a checkpoint).
 * @return 0 or -1 (Redis away). */
int ps_registry_set_pos(ps_registry *r, int worker, const ps_data_pos *pos);

/* The run's end: `{<cluster>}:done` holds "<step>" (the chief ended the run
 * at [train] last_step) or "<step> nonfinite" (the NaN guard stopped it).
 * A process that starts after the end exits 0 at once instead of waiting
 * for a cluster that is gone.  get: 1 found (*step, *nonfinite set), 0 none,
 * -1 Redis away.  set / clear: 0 or -1. */
int ps_registry_get_done(ps_registry *r, uint64_t *step, int *nonfinite);
int ps_registry_set_done(ps_registry *r, uint64_t step, int nonfinite);
int ps_registry_clear_done(ps_registry *r);

/* Has the run of this config ended?  Yes after a NaN stop, and after an end
 * at a step this config's last_step does not exceed (a raised last_step
 * trains on).  Logs why when it has.  @return 1 or 0 (Redis away: 0). */
int ps_registry_run_ended(ps_registry *r);
/* A shard's start, in one round trip: run_ended's answer, and the newest
 * chief fencing token issued (the chief's epoch: chief/lease.c takes each
 * lease with a token above it and stores it there), which the shard goes
 * on from, refusing lower tokens as its predecessor did: *token_found 1
 * found (*token set), 0 none yet, -1 Redis away. */
int ps_registry_run_ended_token(ps_registry *r, uint64_t *token, int *token_found);

#endif
