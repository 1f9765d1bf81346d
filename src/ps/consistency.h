/* A shard's consistency rules: when a worker's PULL is answered (sync: once
 * the step it asks for is applied; ssp: once the slowest live worker is
 * within the staleness bound), and how many gradients a sync step waits for
 * when workers go missing and come back.  Private to src/ps/; the server
 * (server.c) calls it at each event, and it alone writes the state below. */
#ifndef PS_PS_CONSISTENCY_H
#define PS_PS_CONSISTENCY_H

#include <stdint.h>

#include "common/config.h"
#include "ps/shard.h"

struct server;
struct client;

/* One connection's pull and clock. */
typedef struct ps_cons_pull {
  int held;               /* a PULL waits for its condition */
  uint64_t req, step;     /* its request id and the step it asks for */
  int has_clock;
  uint64_t clock;         /* ssp: steps the worker has completed */
} ps_cons_pull;

/* The shard's side (in struct server). */
typedef struct ps_cons {
  uint64_t sync_started_ns;             /* when the current step's first gradient came */
  uint8_t silent[PS_CONFIG_MAX_NODES];  /* workers whose heartbeat lapsed */
  /* sync: workers that missed a step the timeout applied without them, and
   * have not pushed, said HELLO or heart-beaten again since. */
  uint8_t dropped[PS_CONFIG_MAX_NODES];
  /* sync: workers whose gradient is in the sum of the step at `counted_v`. */
  uint8_t counted[PS_CONFIG_MAX_NODES];
  uint64_t counted_v;
} ps_cons;

/* A PULL asking for `step` (ssp: the worker's clock): answered now when its
 * condition holds, else held until it does.  A new clock may release
 * others' held pulls. */
void ps_consistency_pull(struct client *cl, uint64_t req, uint64_t step);

/* Sync: after ps_shard_push returned r for a push of cl's worker (the
 * version was `before`).  A worker left out of the count that pushes again
 * is counted again; a step that has every gradient it can get is applied;
 * held pulls of a finished step are answered. */
void ps_consistency_pushed(struct client *cl, ps_push_result r, uint64_t before);

/* A worker said HELLO: it is counted again (sync). */
void ps_consistency_joined(struct client *cl);

/* A connection closed: ssp pulls it held back may go. */
void ps_consistency_closed(struct server *s);

/* Every tick: the sync timeout (a step that waited sync_timeout_ms for
 * missing workers is applied with the gradients it has). */
void ps_consistency_tick(struct server *s, uint64_t now_ns);

/* Watch the workers' heartbeats in Redis (sync and ssp; once replicating). */
void ps_consistency_watch(struct server *s);

#endif
