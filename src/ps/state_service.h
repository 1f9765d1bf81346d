/* The state service: CUT, FETCH, RESUME and LOAD over one shard state
 * (PROTOCOL.md, "The chief" and "The ring"), for a shard server and a ring
 * member alike.  It owns the fence (the highest chief token seen, and the
 * one check of it), the cut images (each a copy of the whole state, kept
 * while it is its requester's newest or a FETCH_REPLY pointing into it is
 * on the wire, so a later CUT never changes bytes being written), the
 * pre-touched copy buffer, and a LOAD in progress.  It answers on the
 * requester's connection; a refusal comes back to the caller, who closes
 * the connection its own way.  What the caller does about pushes (hold
 * them after a CUT, let them flow at RESUME) is the caller's: the service
 * only says so. */
#ifndef PS_PS_STATE_SERVICE_H
#define PS_PS_STATE_SERVICE_H

#include <stdint.h>

#include "net/conn.h"
#include "proto/proto.h"
#include "ps/shard.h"

typedef struct ps_state_service ps_state_service;

/* A service over `shard` (borrowed), named in messages as `name` ("shard
 * 0", "member 2"); a FETCH or LOAD piece carries at most max_piece floats.
 * @return NULL out of memory. */
ps_state_service *ps_state_service_new(ps_shard *shard, const char *name, uint64_t max_piece);
void ps_state_service_free(ps_state_service *ss);

/* Allocate and touch the copy buffer now (a first cut into fresh pages
 * would stall on every page fault); nothing when out of memory, nor for a
 * state with sparse tables (whose cuts each allocate their copy). */
void ps_state_service_prepare(ps_state_service *ss);

/* What a frame asks of the caller. */
typedef enum ps_state_outcome {
  PS_STATE_ANSWERED = 0,  /* answered; nothing else to do */
  PS_STATE_REFUSED,       /* refuse the requester: code, flags, why */
  PS_STATE_HOLD,          /* a CUT was answered: a shard holds pushes until RESUME or
                             hold_ms (the CUT's) ran out */
  PS_STATE_RESUME,        /* the RESUME of the newest cut: pushes may flow again */
  PS_STATE_LOADED,        /* the LOAD's last piece: the shard holds the chief's state */
} ps_state_outcome;

typedef struct ps_state_answer {
  ps_state_outcome outcome;
  int code;               /* REFUSED: the error */
  uint32_t flags;         /* REFUSED: PS_ERROR_RETRY when the requester may try again */
  uint32_t hold_ms;       /* HOLD: the CUT's */
  uint64_t cut_id;        /* HOLD, RESUME: the cut's */
  char why[512];          /* REFUSED: the reason, one line */
} ps_state_answer;

/* Start from `fence`, the newest chief token issued (read from Redis at
 * start), so a restarted shard refuses what its predecessor refused. */
void ps_state_service_set_fence(ps_state_service *ss, uint64_t fence);

/* The chief's fencing token of a frame: refused (PS_EFENCED) below the
 * highest seen; a higher one becomes it (said in the log).  Frames of the
 * chief only: a peer's fetch names its own epoch. */
int ps_state_service_fence(ps_state_service *ss, const ps_msg *m, ps_state_answer *a);

/* Answer a CUT, FETCH, RESUME or LOAD on c (request id req).  `owner`
 * names whose cut it is (a shard: NULL for all, the one newest cut; a ring
 * member: the link, one per requester): a CUT replaces the owner's image,
 * a FETCH and a RESUME concern it.  holds_state: the shard holds a state
 * (a CUT of none is refused, to be retried; a LOAD onto one is refused).
 * Every other frame type is refused. */
ps_state_answer ps_state_service_frame(ps_state_service *ss, const void *owner, ps_conn *c,
                                       uint64_t req, const ps_msg *m, int holds_state);

/* The owner is gone (its link closed): its image goes once no reply uses it. */
void ps_state_service_forget(ps_state_service *ss, const void *owner);

#endif
