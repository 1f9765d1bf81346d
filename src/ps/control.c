/* The chief's requests to a shard (PROTOCOL.md, "The chief"): CUT copies
 * the whole state into an image and holds pushes until RESUME, so that the
 * chief's cut of all shards is taken while all are paused; FETCH reads the
 * image back in pieces while training goes on; LOAD gives an uninitialized
 * shard its first state; STOP ends the run.  Only the chief may send them,
 * and only with a fence token at least the highest this shard has seen. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include "common/notify.h"
#include "common/timeutil.h"
#include "ps/server_internal.h"

/* One CUT's copy.  It lives while it is the shard's newest cut or a
 * FETCH_REPLY that points into it is being written, so that a later CUT
 * never changes the bytes of a reply on the wire: that CUT copies into
 * another buffer (PROTOCOL.md, "The cut image"). */
typedef struct cut_image {
  server *srv;
  uint64_t fence, cut_id;       /* of the CUT that made it */
  ps_state_info info;
  float *buf;
  uint64_t cap;                 /* floats allocated at buf */
  int refs;                     /* the server's while newest, + one per reply being written */
} cut_image;

/* A push that came while a cut held pushes: applied at RESUME, in order. */
typedef struct held_push {
  struct held_push *next;
  client *cl;             /* holds a reference */
  uint64_t req;
  ps_msg_push p;          /* p.data points at the copy below */
  float data[];
} held_push;

static float *grow(float *img, uint64_t *cap, uint64_t want) {
  if (want <= *cap && img != NULL)
    return img;
  free(img);
  *cap = 0;
  void *p = NULL;
  size_t bytes = (size_t)(want ? want : 1) * sizeof(float);
  /* 2 MiB aligned, and huge pages where the kernel gives them on request:
   * a copy of hundreds of megabytes then takes far fewer TLB misses. */
  if (posix_memalign(&p, 2u << 20, bytes) != 0)
    return NULL;
  madvise(p, bytes, MADV_HUGEPAGE);
  *cap = want;
  return p;
}

/* Pushes flow again; the held ones wait for ps_control_drain. */
static ps_control_outcome resume(server *s, const char *why) {
  if (s->phase != PS_PHASE_HELD)
    return PS_CONTROL_NONE;
  s->phase = PS_PHASE_SERVING;
  int n = 0;
  for (const held_push *h = s->held; h != NULL; h = h->next)
    n++;
  ps_log(n > 0 || why[0] != 'R' ? PS_LOG_INFO : PS_LOG_DEBUG,
         "cut %" PRIu64 ": %s; %d held pushes to apply", s->cut != NULL ? s->cut->cut_id : 0, why,
         n);
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
  held_push *h = malloc(sizeof *h + p->count * sizeof(float));
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
  cl->refs++;
  if (s->held_tail)
    s->held_tail->next = h;
  else
    s->held = h;
  s->held_tail = h;
  return 1;
}

/* Drop one reference; the last one gives the buffer back as the spare
 * (or frees it when there is one already). */
static void image_unref(cut_image *img) {
  if (img == NULL || --img->refs > 0)
    return;
  server *s = img->srv;
  if (s->spare == NULL) {
    s->spare = img->buf;
    s->spare_cap = img->cap;
  } else {
    free(img->buf);
  }
  free(img);
}

static void on_fetch_written(void *arg, int status) {
  (void)status;
  image_unref(arg);
}

void ps_control_prepare(server *s) {
  if (s->cfg->checkpoint_every_steps == 0 && s->cfg->checkpoint_every_secs == 0)
    return;
  /* The copy buffer, allocated and touched now: a first cut into fresh
   * pages would stall on every page fault. */
  ps_state_info in = ps_shard_state_info(s->shard);
  s->spare = grow(s->spare, &s->spare_cap, in.image_floats);
  if (s->spare != NULL)
    memset(s->spare, 0, (size_t)in.image_floats * sizeof(float));
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
  /* The loop has run out: no reply is being written any more. */
  image_unref(s->cut);
  s->cut = NULL;
  free(s->spare);
  s->spare = NULL;
  s->spare_cap = 0;
}

static void send_pong(client *cl, uint64_t req, uint64_t token) {
  ps_conn_send_pong(cl->conn, req, token);
}

static void on_cut(client *cl, uint64_t req, const ps_msg_cut *c) {
  server *s = cl->srv;
  if (s->phase == PS_PHASE_WAITING) {
    REFUSE(cl, PS_EFORMAT, PS_ERROR_RETRY, "CUT of shard %d, which holds no state yet", s->index);
    return;
  }
  if (s->phase != PS_PHASE_SERVING && s->phase != PS_PHASE_HELD) {
    REFUSE(cl, PS_EFORMAT, 0, "CUT of shard %d after the chief's STOP", s->index);
    return;
  }
  ps_state_info in = ps_shard_state_info(s->shard);
  /* A new image, in the spare buffer when there is one: the previous cut's
   * buffer may still be on the wire in a FETCH_REPLY. */
  cut_image *img = calloc(1, sizeof *img);
  float *buf = img != NULL ? grow(s->spare, &s->spare_cap, in.image_floats) : NULL;
  if (buf == NULL) {
    free(img);
    REFUSE(cl, -ENOMEM, PS_ERROR_RETRY, "out of memory for a copy of %" PRIu64 " floats",
           in.image_floats);
    return;
  }
  *img = (cut_image){.srv = s, .fence = c->fence, .cut_id = c->cut_id, .info = in,
                     .buf = buf, .cap = s->spare_cap, .refs = 1};
  s->spare = NULL;
  s->spare_cap = 0;
  uint64_t t0 = ps_now_ns();
  ps_shard_state_write(s->shard, img->buf);
  image_unref(s->cut);
  s->cut = img;
  s->phase = PS_PHASE_HELD;
  s->resume_at_ns = ps_now_ns() + (uint64_t)c->hold_ms * 1000000ULL;
  ps_msg m = {.type = PS_MSG_CUT_REPLY};
  m.u.cut_reply.cut_id = c->cut_id;
  m.u.cut_reply.state = in;
  ps_conn_send_msg(cl->conn, &m, req);
  ps_log(PS_LOG_DEBUG, "cut %" PRIu64 ": copied %" PRIu64 " floats at version %" PRIu64
         " in %.2f ms; holding pushes", c->cut_id, in.image_floats, in.version,
         (double)(ps_now_ns() - t0) * 1e-6);
}

static void on_fetch(client *cl, uint64_t req, const ps_msg_fetch *f) {
  server *s = cl->srv;
  cut_image *img = s->cut;
  /* The cut id alone is not enough: two chiefs number their cuts alike. */
  if (img == NULL || f->cut_id != img->cut_id || f->fence != img->fence) {
    if (img == NULL)
      REFUSE(cl, PS_EFORMAT, 0, "FETCH of cut %" PRIu64 " (token %" PRIu64 "): this shard holds "
             "no cut", f->cut_id, f->fence);
    else
      REFUSE(cl, PS_EFORMAT, 0, "FETCH of cut %" PRIu64 " (token %" PRIu64 "): this shard holds "
             "cut %" PRIu64 " of token %" PRIu64 " only", f->cut_id, f->fence, img->cut_id,
             img->fence);
    return;
  }
  uint64_t total = img->info.image_floats;
  size_t piece = ps_shard_options(s->shard)->nfloats;
  if (f->offset > total || f->count > total - f->offset || f->count > piece) {
    REFUSE(cl, PS_EFORMAT, 0,
           "FETCH of floats %" PRIu64 "..+%" PRIu64 ": the copy holds %" PRIu64
           " and a piece is at most %zu",
           f->offset, f->count, total, piece);
    return;
  }
  ps_msg m = {.type = PS_MSG_FETCH_REPLY};
  m.u.fetch_reply.cut_id = f->cut_id;
  m.u.fetch_reply.offset = f->offset;
  m.u.fetch_reply.count = f->count;
  uint8_t prefix[PS_PROTO_PREFIX_MAX];
  size_t plen = ps_proto_encode_prefix(&m, req, prefix);
  /* The image stays, unchanged, until this reply is written. */
  img->refs++;
  if (ps_conn_send(cl->conn, prefix, plen, img->buf + f->offset, f->count * sizeof(float),
                   on_fetch_written, img) != 0)
    image_unref(img);
}

static ps_control_outcome on_load(client *cl, uint64_t req, const ps_msg_load *l) {
  server *s = cl->srv;
  if (s->phase != PS_PHASE_WAITING) {
    REFUSE(cl, PS_EFORMAT, 0, "LOAD of shard %d, which already holds a state at version %" PRIu64,
           s->index, ps_shard_version(s->shard));
    return PS_CONTROL_NONE;
  }
  const ps_state_info *in = &l->state;
  char why[256];
  if (ps_shard_state_check(s->shard, in, why, sizeof why) != 0) {
    REFUSE(cl, PS_ELAYOUT, 0, "LOAD: %s", why);
    return PS_CONTROL_NONE;
  }
  if (l->offset == 0)
    s->load_next = 0;
  if (l->offset != s->load_next || l->count > ps_shard_options(s->shard)->nfloats) {
    REFUSE(cl, PS_EFORMAT, 0, "LOAD piece at float %" PRIu64 " of %" PRIu64
           " floats, expected the piece at %" PRIu64 " of at most %zu",
           l->offset, l->count, s->load_next, ps_shard_options(s->shard)->nfloats);
    return PS_CONTROL_NONE;
  }
  /* Straight into the state: it serves nobody until the last piece. */
  ps_shard_state_load_piece(s->shard, in, l->offset, l->data, l->count);
  s->load_next = l->offset + l->count;
  if (s->load_next == in->image_floats) {
    ps_shard_state_load_end(s->shard, in);
    s->load_next = 0;
    s->phase = PS_PHASE_SERVING;
    ps_log(PS_LOG_INFO, "initialized by the chief: version %" PRIu64 ", global step %" PRIu64
           "; workers admitted", ps_shard_version(s->shard), ps_shard_global_step(s->shard));
    ps_notify_ready("shard %d serving from version %" PRIu64, s->index, ps_shard_version(s->shard));
    ps_control_prepare(s);
    send_pong(cl, req, l->offset + l->count);
    return PS_CONTROL_LOADED;
  }
  send_pong(cl, req, l->offset + l->count);
  return PS_CONTROL_NONE;
}

static ps_control_outcome on_stop(client *cl, uint64_t req, const ps_msg_stop *st) {
  server *s = cl->srv;
  if (s->phase == PS_PHASE_DRAINING || s->phase == PS_PHASE_STOPPING)
    return PS_CONTROL_NONE;
  ps_log(PS_LOG_INFO, "the chief ended the run at global step %" PRIu64 "; telling the workers",
         st->step);
  ps_msg m = {.type = PS_MSG_STOP};
  m.u.stop.fence = st->fence;
  m.u.stop.step = st->step;
  for (client *c = s->clients; c != NULL; c = c->next)
    if (c->state == C_READY && c->role == PS_ROLE_WORKER)
      ps_conn_send_msg(c->conn, &m, 0);
  send_pong(cl, req, st->step);
  resume(s, "stopping");
  if (s->phase == PS_PHASE_SERVING)
    s->phase = PS_PHASE_DRAINING;  /* one with no state stops as it is */
  return PS_CONTROL_STOP;
}

ps_control_outcome ps_control_frame(client *cl, uint64_t req, const ps_msg *m) {
  server *s = cl->srv;
  if (cl->role != PS_ROLE_CHIEF) {
    REFUSE(cl, PS_EFORMAT, 0, "%s from a %s: only the chief sends it", ps_proto_type_name(m->type),
           ps_role_name(cl->role));
    return PS_CONTROL_NONE;
  }
  /* Fencing: a chief that lost its lease (paused, cut off) may still be
   * running; once a newer chief's token has been seen, it is refused. */
  uint64_t fence = ps_proto_fence(m);
  if (fence < s->fence) {
    REFUSE(cl, PS_EFENCED, 0, "%s with fence token %" PRIu64 ", but this shard has seen token %"
           PRIu64 ": a newer chief holds the lease", ps_proto_type_name(m->type), fence, s->fence);
    return PS_CONTROL_NONE;
  }
  if (fence > s->fence) {
    if (s->fence != 0)
      ps_log(PS_LOG_INFO, "chief fence token %" PRIu64 " -> %" PRIu64 ": a newer chief; frames "
             "with older tokens are refused from now on", s->fence, fence);
    s->fence = fence;
  }
  /* The history of chief actions, for the one-token-at-a-time check. */
  if (m->type == PS_MSG_CUT || m->type == PS_MSG_STOP ||
      (m->type == PS_MSG_LOAD && m->u.load.offset == 0)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ps_history_line(s->history, "chief %" PRIu64 " %s %lld", fence, ps_proto_type_name(m->type),
                    (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
  }
  switch (m->type) {
  case PS_MSG_CUT:
    on_cut(cl, req, &m->u.cut);
    break;
  case PS_MSG_RESUME:
    /* The answer first: the chief's stall ends here, not after the held
     * pushes are applied. */
    send_pong(cl, req, m->u.resume.cut_id);
    if (s->cut != NULL && m->u.resume.cut_id == s->cut->cut_id && fence == s->cut->fence)
      return resume(s, "RESUME");
    break;
  case PS_MSG_FETCH:
    on_fetch(cl, req, &m->u.fetch);
    break;
  case PS_MSG_LOAD:
    return on_load(cl, req, &m->u.load);
  case PS_MSG_STOP:
    return on_stop(cl, req, &m->u.stop);
  default:
    break;
  }
  return PS_CONTROL_NONE;
}
