/* hiredis's async API on a libuv loop, with a deadline: a connection whose
 * connect, or whose oldest command, waits longer than the deadline with
 * nothing read is handed to the owner as timed out, so a silent network
 * drop or a stopped Redis is noticed within a bounded time. */
#ifndef PS_REPLICA_REDIS_UV_H
#define PS_REPLICA_REDIS_UV_H

#include <hiredis/async.h>
#include <stdint.h>
#include <uv.h>

/* Called from a loop timer when `ac` passed its deadline.  The owner must
 * end the connection with redisAsyncFree(ac) before returning: hiredis then
 * runs every pending callback with a NULL reply, and the disconnect
 * callback when the connection had been established (a connect that never
 * completed gets neither: the owner handles it here). */
typedef void (*ps_redis_uv_timeout_fn)(redisAsyncContext *ac, void *owner);

/* Attach `ac` (just created by redisAsyncConnect, ac->c.fd set) to `loop`:
 * its reads and writes run on the loop, a hang-up or a poll error goes to
 * hiredis's read path (which then sees the socket's error and disconnects:
 * hiredis 0.14's own adapter ignores those), the socket gets TCP keepalive
 * and TCP_USER_TIMEOUT of `timeout_ms`, and the deadline above is checked
 * every quarter of `timeout_ms`.  Everything attached is released by
 * hiredis's cleanup hook when the context is freed.  @return 0, or -1 (the
 * caller frees ac). */
int ps_redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop, uint64_t timeout_ms,
                       ps_redis_uv_timeout_fn on_timeout, void *owner);

#endif
