/* The ring's transport ([cluster] mode = ring; README.md in this
 * directory): each member listens on its [cluster] workers address, dials
 * its successor in the current view, and all-reduces a vector with its
 * predecessor and successor in pipelined pieces (scatter-reduce, then
 * all-gather).  The same listener serves the member's state, the shard
 * image of its replica, to a peer that rejoins and to the chief (CUT,
 * FETCH, RESUME as a shard answers them).  Frames, framing and HELLO's
 * authentication are the shards' (src/proto/PROTOCOL.md, "The ring").
 *
 * Synchronous, like the client: each call runs the ring's own libuv loop
 * until it is done, and between calls nothing is read (peers' frames wait
 * in the kernel, or in the ring's queue when they came early). */
#ifndef PS_RING_RING_H
#define PS_RING_RING_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "paramserv/error.h"
#include "ps/shard.h"

typedef struct ps_ring ps_ring;

/* Member `rank` of cfg's workers, incarnation `incarnation`, serving
 * `state` (the replica; the ring reads it only inside its calls).  Listens
 * at once.  @return NULL with a one-line reason (the address is not this
 * host's, the secret is unreadable). */
ps_ring *ps_ring_new(const ps_config *cfg, int rank, uint64_t incarnation, uint64_t layout_hash,
                     ps_shard *state, ps_errbuf *eb);
void ps_ring_free(ps_ring *r);

/* How long a member may go without a piece of a step (or of a state it
 * fetches) before it gives the view up: [cluster] peer_timeout_ms plus
 * [redis] timeout_ms, since a peer may spend one Redis command's deadline
 * between two steps (its heartbeat, its data position) without being dead. */
static inline int64_t ps_ring_timeout_ms(const ps_config *cfg) {
  return cfg->peer_timeout_ms + cfg->redis_timeout_ms;
}

/* Calls return -EINTR soon after *flag becomes nonzero. */
void ps_ring_set_stop_flag(ps_ring *r, volatile sig_atomic_t *flag);

/* Call fn(arg) about every 100 ms while a call waits (the member's
 * heartbeat: a wait for a silent peer must not look like this member's
 * death). */
void ps_ring_set_idle(ps_ring *r, void (*fn)(void *arg), void *arg);

/* Enter view `epoch` of `n` members (ranks, ascending, this one among
 * them): the successor link and every link of an older view are closed,
 * pieces queued for older views dropped. */
void ps_ring_set_view(ps_ring *r, uint64_t epoch, const int *members, int n);

/* Sum buf[0..n) over the view's members for `step`, in place: every member
 * ends with the same bytes.  @return 0; -EINTR (stop flag); PS_ESTOPPED
 * (the chief's STOP: ps_ring_stop_step); or -EPIPE with ps_ring_error and
 * ps_ring_suspect: the view broke (a member closed or went silent past
 * ps_ring_timeout_ms, or a peer dials for a newer view), buf's
 * contents are then undefined. */
int ps_ring_allreduce(ps_ring *r, float *buf, size_t n, uint64_t step);

/* Answer peers for about `ms` milliseconds (while waiting for a view). */
void ps_ring_serve(ps_ring *r, int ms);

/* Replace `state` by member `rank`'s (CUT, FETCH in pieces, RESUME), and
 * with it this member's step.  @return 0, -EINTR, or -EPIPE with a
 * message in eb (the member closed, went silent, or refused). */
int ps_ring_fetch_state(ps_ring *r, int rank, ps_errbuf *eb);

/* Does the replica hold a state (seeded by itself, fetched, or loaded),
 * and is this member waiting because no member of its view holds one?
 * STATS reports INITIALIZED unless waiting; a LOAD (the chief's restore)
 * is taken only while it holds none. */
void ps_ring_set_holds(ps_ring *r, int holds, int waiting);
/* 1 once after a LOAD completed (the replica then holds the chief's state). */
int ps_ring_take_loaded(ps_ring *r);

/* The rank whose link failed in the last broken call, or -1 (a silence or
 * a newer view: nobody to blame). */
int ps_ring_suspect(const ps_ring *r);
/* Members in the current view. */
int ps_ring_size(const ps_ring *r);
/* The newest view epoch a peer has dialed for (0: none newer). */
uint64_t ps_ring_newer_epoch(const ps_ring *r);
const char *ps_ring_error(const ps_ring *r);
/* The step the chief's STOP named (0: none came). */
uint64_t ps_ring_stop_step(const ps_ring *r);
uint64_t ps_ring_bytes(const ps_ring *r, uint64_t *in);

#endif
