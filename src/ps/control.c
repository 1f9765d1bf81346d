/* The chief's requests to a shard (PROTOCOL.md, "The chief"): CUT copies
 * the whole state into an image and holds pushes until RESUME, so that the
 * chief's cut of all shards is taken while all are paused; FETCH reads the
 * image back in pieces while training goes on; LOAD gives an uninitialized
 * shard its first state; STOP ends the run.  Only the chief may send them,
 * and only with a fence token at least the highest this shard has seen.
 * CUT, FETCH, RESUME and LOAD are the state service's (state_service.h);
 * this file holds what is the shard server's own: the pushes held during a
 * cut, and STOP. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/notify.h"
#include "common/timeutil.h"
#include "ps/server_internal.h"

/* A push that came while a cut held pushes: applied at RESUME, in order. */
typedef struct held_push {
  struct held_push *next;
  client *cl;             /* holds a reference */
  uint64_t req;
  ps_msg_push p;          /* p.data and p.sparse.data point at the copy below */
  float data[];           /* the floats, then the sparse blocks */
} held_push;

/* Pushes flow again; the held ones wait for ps_control_drain. */
static ps_control_outcome resume(server *s, const char *why) {
  if (s->phase != PS_PHASE_HELD)
    return PS_CONTROL_NONE;
  s->phase = PS_PHASE_SERVING;
  int n = 0;
  for (const held_push *h = s->held; h != NULL; h = h->next)
    n++;
  ps_log(n > 0 || why[0] != 'R' ? PS_LOG_INFO : PS_LOG_DEBUG,
         "cut %" PRIu64 ": %s; %d held pushes to apply", s->cut_id, why, n);
  return PS_CONTROL_RESUMED;
}

void ps_control_drain(server *s, ps_control_apply_fn apply) {
  held_push *h = s->held;
  s->held = s->held_tail = NULL;
  while (h != NULL) {
    held_push *next = h->next;
    if (!h->cl->closed && s->phase != PS_PHASE_STOPPING)
      apply(h->cl, h->req, &h->p);
    client_unref(h->cl);
    free(h);
    h = next;
  }
}

int ps_control_hold_push(client *cl, uint64_t req, const ps_msg_push *p) {
  server *s = cl->srv;
  if (s->phase != PS_PHASE_HELD)
    return 0;
  held_push *h = malloc(sizeof *h + p->count * sizeof(float) + p->sparse.bytes);
  if (h == NULL) {
    ps_conn_fail(cl->conn, -ENOMEM, PS_ERROR_RETRY, "shard %d: out of memory holding a push",
                 s->index);
    return 1;
  }
  h->next = NULL;
  h->cl = cl;
  h->req = req;
  h->p = *p;
  memcpy(h->data, p->data, p->count * sizeof(float));
  h->p.data = (const uint8_t *)h->data;
  if (p->sparse.bytes > 0) {
    memcpy(h->data + p->count, p->sparse.data, p->sparse.bytes);
    h->p.sparse.data = (const uint8_t *)(h->data + p->count);
  }
  cl->refs++;
  if (s->held_tail)
    s->held_tail->next = h;
  else
    s->held = h;
  s->held_tail = h;
  return 1;
}

void ps_control_prepare(server *s) {
  if (s->cfg->checkpoint_every_steps == 0 && s->cfg->checkpoint_every_secs == 0)
    return;
  ps_state_service_prepare(s->state);
}

ps_control_outcome ps_control_tick(server *s, uint64_t now_ns) {
  if (s->phase == PS_PHASE_HELD && now_ns >= s->resume_at_ns)
    return resume(s, "no RESUME from the chief in time: resumed by itself");
  return PS_CONTROL_NONE;
}

void ps_control_free(server *s) {
  while (s->held != NULL) {
    held_push *h = s->held;
    s->held = h->next;
    client_unref(h->cl);
    free(h);
  }
  s->held_tail = NULL;
}

static ps_control_outcome on_stop(client *cl, uint64_t req, const ps_msg_stop *st) {
  server *s = cl->srv;
  if (s->phase == PS_PHASE_DRAINING || s->phase == PS_PHASE_STOPPING) {
    /* Stopping already: a chief that asks again (one restarted after its
     * first STOP, or retrying) gets its answer rather than a wait. */
    ps_conn_send_pong(cl->conn, req, st->step);
    return PS_CONTROL_NONE;
  }
  ps_log(PS_LOG_INFO, "the chief ended the run at global step %" PRIu64 "; telling the workers",
         st->step);
  ps_msg m = {.type = PS_MSG_STOP};
  m.u.stop.fence = st->fence;
  m.u.stop.step = st->step;
  for (client *c = s->clients; c != NULL; c = c->next)
    if (c->state == C_READY && c->role == PS_ROLE_WORKER)
      ps_conn_send_msg(c->conn, &m, 0);
  ps_conn_send_pong(cl->conn, req, st->step);
  resume(s, "stopping");
  if (s->phase == PS_PHASE_SERVING)
    s->phase = PS_PHASE_DRAINING;  /* one with no state stops as it is */
  return PS_CONTROL_STOP;
}

/* What the state service's answer leaves for the server. */
static ps_control_outcome state_answer(client *cl, const ps_state_answer *a) {
  server *s = cl->srv;
  switch (a->outcome) {
  case PS_STATE_REFUSED:
    REFUSE(cl, a->code, a->flags, "%s", a->why);
    return PS_CONTROL_NONE;
  case PS_STATE_HOLD:
    if (s->phase == PS_PHASE_SERVING || s->phase == PS_PHASE_HELD) {
      s->phase = PS_PHASE_HELD;
      s->cut_id = a->cut_id;
      s->resume_at_ns = ps_now_ns() + (uint64_t)a->hold_ms * 1000000ULL;
    }
    return PS_CONTROL_NONE;
  case PS_STATE_RESUME:
    return resume(s, "RESUME");
  case PS_STATE_LOADED:
    s->phase = PS_PHASE_SERVING;
    ps_log(PS_LOG_INFO, "initialized by the chief: version %" PRIu64 ", global step %" PRIu64
           "; workers admitted", ps_shard_version(s->shard), ps_shard_global_step(s->shard));
    ps_notify_ready("shard %d serving from version %" PRIu64, s->index,
                    ps_shard_version(s->shard));
    ps_control_prepare(s);
    return PS_CONTROL_LOADED;
  default:
    return PS_CONTROL_NONE;
  }
}

ps_control_outcome ps_control_frame(client *cl, uint64_t req, const ps_msg *m) {
  server *s = cl->srv;
  if (cl->role != PS_ROLE_CHIEF) {
    REFUSE(cl, PS_EFORMAT, 0, "%s from a %s: only the chief sends it", ps_proto_type_name(m->type),
           ps_role_name(cl->role));
    return PS_CONTROL_NONE;
  }
  ps_state_answer a;
  if (ps_state_service_fence(s->state, m, &a) != 0) {
    REFUSE(cl, a.code, a.flags, "%s", a.why);
    return PS_CONTROL_NONE;
  }
  /* The history of chief actions, for the one-token-at-a-time check. */
  if (m->type == PS_MSG_CUT || m->type == PS_MSG_STOP ||
      (m->type == PS_MSG_LOAD && m->u.load.offset == 0)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ps_history_line(s->history, "chief %" PRIu64 " %s %lld", ps_proto_fence(m),
                    ps_proto_type_name(m->type), (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
  }
  if (m->type == PS_MSG_STOP)
    return on_stop(cl, req, &m->u.stop);
  if (m->type == PS_MSG_CUT && s->phase != PS_PHASE_WAITING && s->phase != PS_PHASE_SERVING &&
      s->phase != PS_PHASE_HELD) {
    REFUSE(cl, PS_EFORMAT, 0, "CUT of shard %d after the chief's STOP", s->index);
    return PS_CONTROL_NONE;
  }
  a = ps_state_service_frame(s->state, NULL, cl->conn, req, m, s->phase != PS_PHASE_WAITING);
  return state_answer(cl, &a);
}
