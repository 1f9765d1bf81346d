/* Requests that wait for their rows (a lazy restore, src/ps/TABLE.md "Lazy
 * loads"): a PULL or PUSH naming sparse keys the shard's tables do not
 * hold yet, and whose bucket is not in yet, waits while they are fetched
 * from Redis (ps_durable_fetch); every later PULL and PUSH of the same
 * connection waits behind it, so that a connection's frames are still
 * handled in order (a worker's pushes keep their sequence).  Copies of the
 * waiting frames are kept; they are handled, in order, through the
 * server's own dispatch once their rows are in. */
#ifndef PS_PS_ROWWAIT_H
#define PS_PS_ROWWAIT_H

#include <stdint.h>

#include "proto/proto.h"

typedef struct client client;
typedef struct server server;

/* How a frame that waited is handled: as on_frame would have, its payload
 * the waiting copy (freed after the call). */
typedef void ps_rowwait_dispatch_fn(client *cl, const ps_frame_header *h, const uint8_t *payload,
                                    const ps_msg *m);

/* Must this decoded frame of cl wait?  @return 1 (it waits: a copy kept,
 * its rows asked for), 0 (handle it now), -ENOMEM (the caller fails the
 * connection). */
int ps_rowwait_frame(client *cl, const ps_frame_header *h, const uint8_t *payload,
                     const ps_msg *m, ps_rowwait_dispatch_fn *dispatch);
/* cl's connection is gone: its waiting frames are dropped. */
void ps_rowwait_closed(client *cl);

#endif
