/* The client side of a ring member's state fetch (see ring_internal.h): a
 * member that holds no state takes a peer's as the chief takes a shard's,
 * CUT then FETCH pieces then RESUME (PROTOCOL.md, "The ring"); the peer
 * answers through its state service (src/ps/state_service.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "ring/ring_internal.h"

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

static void fetch_begin(link *l) {
  ps_ring *r = l->r;
  ps_msg c = {.type = PS_MSG_CUT};
  c.u.cut = (ps_msg_cut){.fence = r->epoch ? r->epoch : 1, .cut_id = r->epoch};
  ps_conn_send_msg(l->conn, &c, 0);
}

static int fetch_reply(link *l, const ps_msg *m) {
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
  if (r->fetch != NULL) {
    r->fetch->fetch_ready = fetch_begin;
    r->fetch->fetch_reply = fetch_reply;
  }
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
  int rc2 = ps_shard_state_load(r->state, &r->fetch_info, r->fetch_img, eb);
  free(r->fetch_img);
  r->fetch_img = NULL;
  return rc2;
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
