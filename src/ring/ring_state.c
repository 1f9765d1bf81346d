/* The ring's state service (see ring_internal.h): a member answers CUT,
 * FETCH, RESUME, PULL and LOAD from its replica as a shard answers them
 * (PROTOCOL.md, "The ring"), and fetches a peer's state the same way. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "ring/ring_internal.h"

void ring_serve_cut(link *l, uint64_t req, const ps_msg_cut *m) {
  ps_ring *r = l->r;
  free(l->img);
  l->info = ps_shard_state_info(r->state);
  l->img = malloc((l->info.image_floats ? l->info.image_floats : 1) * sizeof(float));
  if (l->img == NULL) {
    ring_refuse(l, -ENOMEM, "out of memory for a copy of %" PRIu64 " floats", l->info.image_floats);
    return;
  }
  ps_shard_state_write(r->state, l->img);
  l->cut_id = m->cut_id;
  ps_msg rep = {.type = PS_MSG_CUT_REPLY};
  rep.u.cut_reply.cut_id = m->cut_id;
  rep.u.cut_reply.state = l->info;
  ps_conn_send_msg(l->conn, &rep, req);
}

void ring_serve_fetch(link *l, uint64_t req, const ps_msg_fetch *m) {
  if (l->img == NULL || m->cut_id != l->cut_id || m->offset > l->info.image_floats ||
      m->count > l->info.image_floats - m->offset || m->count > (UINT32_MAX - 64) / 4) {
    ring_refuse(l, PS_EFORMAT,
                "FETCH of cut %" PRIu64 " floats %" PRIu64 "..+%" PRIu64
                ": expected a piece of the cut %" PRIu64 " of %" PRIu64 " floats",
                m->cut_id, m->offset, m->count, l->cut_id, l->info.image_floats);
    return;
  }
  ps_msg rep = {.type = PS_MSG_FETCH_REPLY};
  rep.u.fetch_reply =
      (ps_msg_fetch_reply){.cut_id = m->cut_id, .offset = m->offset, .count = m->count};
  uint8_t prefix[PS_PROTO_PREFIX_MAX];
  size_t plen = ps_proto_encode_prefix(&rep, req, prefix);
  ps_conn_send(l->conn, prefix, plen, l->img + m->offset, m->count * sizeof(float), NULL, NULL);
}

static void free_copy(void *arg, int status) {
  (void)status;
  free(arg);
}

/* The chief's evaluation reads the weights with a PULL: a copy of the
 * replica's values, written whenever the socket takes it. */
void ring_serve_pull(link *l, uint64_t req) {
  ps_ring *r = l->r;
  size_t n = ps_shard_options(r->state)->nfloats;
  float *copy = malloc((n ? n : 1) * sizeof *copy);
  if (copy == NULL) {
    ring_refuse(l, -ENOMEM, "out of memory for a copy of %zu floats", n);
    return;
  }
  memcpy(copy, ps_shard_values(r->state), n * sizeof *copy);
  ps_msg rep = {.type = PS_MSG_PULL_REPLY};
  rep.u.pull_reply = (ps_msg_pull_reply){.version = ps_shard_version(r->state),
                                         .global_step = ps_shard_global_step(r->state),
                                         .count = n};
  uint8_t prefix[PS_PROTO_PREFIX_MAX];
  size_t plen = ps_proto_encode_prefix(&rep, req, prefix);
  if (ps_conn_send(l->conn, prefix, plen, copy, n * sizeof *copy, free_copy, copy) != 0)
    free(copy);
}

/* The chief starts a ring none of whose members holds a state (a new
 * cluster, or every member restarted) from its checkpoint, or the seeded
 * initialization, as it starts a shard: LOAD pieces in order, each
 * answered by a PONG. */
void ring_serve_load(link *l, uint64_t req, const ps_msg_load *m) {
  ps_ring *r = l->r;
  char why[256];
  if (l->role != PS_ROLE_CHIEF) {
    ring_refuse(l, PS_EFORMAT, "LOAD from %s %d: only the chief loads a state",
                ps_role_name(l->role), l->rank);
    return;
  }
  if (!ring_fence_ok(l, m->fence))
    return;
  if (r->holds) {
    ring_refuse(l, PS_EFORMAT, "LOAD of member %d, which already holds a state at step %" PRIu64,
                r->rank, ps_shard_version(r->state));
    return;
  }
  if (ps_shard_state_check(r->state, &m->state, why, sizeof why) != 0) {
    ring_refuse(l, PS_ELAYOUT, "LOAD: %s", why);
    return;
  }
  if (m->offset == 0)
    r->load_next = 0;
  if (m->offset != r->load_next || m->count > ps_shard_options(r->state)->nfloats) {
    ring_refuse(l, PS_EFORMAT,
                "LOAD piece at float %" PRIu64 " of %" PRIu64 " floats, expected the piece at %" PRIu64,
                m->offset, m->count, r->load_next);
    return;
  }
  ps_shard_state_load_piece(r->state, &m->state, m->offset, m->data, m->count);
  r->load_next = m->offset + m->count;
  if (r->load_next == m->state.image_floats) {
    ps_shard_state_load_end(r->state, &m->state);
    r->load_next = 0;
    r->holds = r->loaded = 1;
    r->waiting = 0;
    ps_log(PS_LOG_INFO, "ring: loaded by the chief: step %" PRIu64, ps_shard_version(r->state));
  }
  ps_conn_send_pong(l->conn, req, m->offset + m->count);
}

int ring_fence_ok(link *l, uint64_t fence) {
  ps_ring *r = l->r;
  if (l->role != PS_ROLE_CHIEF)
    return 1;
  if (fence < r->fence) {
    ring_refuse(l, -ESTALE, "fencing token %" PRIu64 ", this member has seen %" PRIu64, fence,
                r->fence);
    return 0;
  }
  r->fence = fence;
  return 1;
}

static void fetch_next(link *l) {
  ps_ring *r = l->r;
  if (r->fetch_off == r->fetch_info.image_floats) {
    ps_msg m = {.type = PS_MSG_RESUME};
    m.u.resume = (ps_msg_resume){.fence = r->epoch ? r->epoch : 1, .cut_id = r->epoch};
    ps_conn_send_msg(l->conn, &m, 0);
    r->fetching = 0;
    return;
  }
  uint64_t left = r->fetch_info.image_floats - r->fetch_off;
  ps_msg m = {.type = PS_MSG_FETCH};
  m.u.fetch = (ps_msg_fetch){.fence = r->epoch ? r->epoch : 1,
                             .cut_id = r->epoch,
                             .offset = r->fetch_off,
                             .count = left < FETCH_FLOATS ? left : FETCH_FLOATS};
  ps_conn_send_msg(l->conn, &m, 0);
}

void ring_fetch_begin(link *l) {
  ps_ring *r = l->r;
  ps_msg c = {.type = PS_MSG_CUT};
  c.u.cut = (ps_msg_cut){.fence = r->epoch ? r->epoch : 1, .cut_id = r->epoch};
  ps_conn_send_msg(l->conn, &c, 0);
}

int ring_fetch_reply(link *l, const ps_msg *m) {
  ps_ring *r = l->r;
  char why[300];
  if (m->type == PS_MSG_CUT_REPLY && r->fetch_img == NULL) {
    r->fetch_info = m->u.cut_reply.state;
    if (ps_shard_state_check(r->state, &r->fetch_info, why, sizeof why) != 0) {
      ring_fail(r, l->rank, "member %d's state: %s", l->rank, why);
      return 1;
    }
    r->fetch_img =
        malloc((r->fetch_info.image_floats ? r->fetch_info.image_floats : 1) * sizeof(float));
    if (r->fetch_img == NULL) {
      ring_fail(r, -1, "out of memory for a state of %" PRIu64 " floats",
                r->fetch_info.image_floats);
      return 1;
    }
    r->fetch_off = 0;
    fetch_next(l);
    return 1;
  }
  if (m->type == PS_MSG_FETCH_REPLY && r->fetch_img != NULL &&
      m->u.fetch_reply.offset == r->fetch_off &&
      m->u.fetch_reply.count <= r->fetch_info.image_floats - r->fetch_off &&
      m->u.fetch_reply.count > 0) {
    memcpy(r->fetch_img + r->fetch_off, m->u.fetch_reply.data, m->u.fetch_reply.count * 4);
    r->fetch_off += m->u.fetch_reply.count;
    r->progress_ns = ps_now_ns();
    fetch_next(l);
    return 1;
  }
  return 0;
}

static int fetch_done(const ps_ring *r) { return r->fetching != 1; }

int ps_ring_fetch_state(ps_ring *r, int rank, ps_errbuf *eb) {
  r->fetching = 1;
  r->fetch_off = 0;
  free(r->fetch_img);
  r->fetch_img = NULL;
  r->progress_ns = ps_now_ns();
  r->fetch = ring_dial(r, K_FETCH, rank);
  int rc = ring_run_until(r, fetch_done);
  if (r->fetch != NULL) {
    link *l = r->fetch;
    r->fetch = NULL; /* so that its closing breaks nothing later */
    ps_conn_close(l->conn);
  }
  if (rc != 0) {
    r->fetching = 0;
    return rc;
  }
  if (r->fetching != 0 || r->fetch_img == NULL) {
    r->fetching = 0;
    return ps_err_set(eb, -EPIPE, "%s", r->why);
  }
  ps_shard_state_load(r->state, &r->fetch_info, r->fetch_img);
  free(r->fetch_img);
  r->fetch_img = NULL;
  return 0;
}

void ps_ring_set_holds(ps_ring *r, int holds, int waiting) {
  r->holds = holds;
  r->waiting = waiting;
}

int ps_ring_take_loaded(ps_ring *r) {
  int l = r->loaded;
  r->loaded = 0;
  return l;
}
