/* The client as the chief uses it: control requests to every shard (STATS,
 * CUT, RESUME, FETCH, LOAD, STOP; PROTOCOL.md "The chief"), with the same
 * reconnects as a worker's pulls and pushes, and a deadline so that the
 * chief never blocks for long on a shard that is down. */
#ifndef PS_WORKER_CONTROL_H
#define PS_WORKER_CONTROL_H

#include <stdint.h>

#include "common/config.h"
#include "layout/layout.h"
#include "nn/model.h"
#include "paramserv/client.h"
#include "proto/proto.h"

/* A client of the cluster in config_path as `role` (ps_role) number
 * `index`; ps_client_new is ps_client_new_as(path, PS_ROLE_WORKER, index). */
ps_client *ps_client_new_as(const char *config_path, int role, int index, ps_errbuf *eb);

/* Every later call fails with -ETIMEDOUT when some shard has not answered
 * within ms milliseconds (0: wait for ever, the default); ps_client_deadline
 * says the one set. */
void ps_client_set_deadline(ps_client *c, int ms);
int ps_client_deadline(const ps_client *c);

/* Every CUT, RESUME, FETCH, LOAD and STOP this client sends from now on
 * carries `fence` (the chief's lease token, >= 1; PROTOCOL.md "Fencing"):
 * ps_client_request overwrites the fence of each request with it.  A shard
 * that has seen a higher token refuses the request: the call returns
 * PS_EFENCED. */
void ps_client_set_fence(ps_client *c, uint64_t fence);

/* Called for each reply, on the caller's thread, while the call runs.
 * Floats in the reply point into a buffer valid only during the call. */
typedef void (*ps_client_reply_fn)(void *arg, int shard, const ps_msg *reply);

/* Send reqs[i] to shard i for every i whose reqs[i].type is nonzero (an
 * array of nps messages), and wait for each reply (STATS_REPLY, CUT_REPLY,
 * FETCH_REPLY, or PONG for PING, RESUME, LOAD and STOP).  A LOAD's floats
 * are borrowed until the call returns.  A link that fails reconnects and
 * sends its request again.  @return 0, -ETIMEDOUT, or the error of a
 * shard's ERROR reply (ps_client_error says which). */
int ps_client_request(ps_client *c, const ps_msg *reqs, ps_client_reply_fn fn, void *arg);

/* Handshakes completed so far over all links: a change across a sequence of
 * calls means some shard was reconnected (perhaps a new incarnation). */
uint64_t ps_client_connects(const ps_client *c);

/* Point shard `shard`'s link at another address (a ring's chief, when the
 * member it reads stops answering); the link reconnects there. */
void ps_client_retarget(ps_client *c, int shard, const ps_addr *a);

const ps_layout *ps_client_layout(const ps_client *c);
const ps_model *ps_client_model(const ps_client *c);
const ps_config *ps_client_config(const ps_client *c);

#endif
