/* The state service (see state_service.h): one shard state's CUT, FETCH,
 * RESUME and LOAD, for the shard server and the ring member. */
#include "ps/state_service.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/log.h"
#include "common/timeutil.h"

/* Cut images kept at once, one per owner: beyond it the oldest goes. */
#define IMAGES_MAX 8

/* One CUT's copy. */
typedef struct image {
  ps_state_service *ss;
  const void *owner;            /* whose cut (state_service.h) */
  uint64_t fence, cut_id;       /* of the CUT that made it */
  ps_state_info info;
  float *buf;                   /* the copy; NULL when read through rd */
  uint64_t cap;                 /* floats allocated at buf */
  ps_shard_reader *rd;          /* a state with sparse tables: the cut, read FETCH by FETCH */
  int refs;                     /* the service's while current, + one per reply being written */
  uint64_t fetched;             /* floats FETCHed from the start, in order */
  int resumed;                  /* its RESUME came */
} image;

struct ps_state_service {
  ps_shard *shard;
  char name[64];                /* "shard 0", "member 2" */
  char kind[16];                /* its first word: "shard", "member" */
  uint64_t max_piece;           /* floats a FETCH or LOAD piece may carry */
  uint64_t fence;               /* the highest chief token seen */
  image *images[IMAGES_MAX];    /* each owner's current one, newest last */
  int nimages;
  float *spare;                 /* a copy buffer no image uses, kept for the next CUT */
  uint64_t spare_cap;
  uint64_t load_next;           /* a LOAD being received: the next piece's offset */
};

static float *grow(float *buf, uint64_t *cap, uint64_t want) {
  if (want <= *cap && buf != NULL)
    return buf;
  free(buf);
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

ps_state_service *ps_state_service_new(ps_shard *shard, const char *name, uint64_t max_piece) {
  ps_state_service *ss = calloc(1, sizeof *ss);
  if (ss == NULL)
    return NULL;
  ss->shard = shard;
  ss->max_piece = max_piece;
  snprintf(ss->name, sizeof ss->name, "%s", name);
  snprintf(ss->kind, sizeof ss->kind, "%.*s", (int)strcspn(name, " "), name);
  return ss;
}

/* Drop one reference; the last one gives the buffer back as the spare
 * (or frees it when there is one already).  A state with sparse tables
 * keeps no spare: its image grows with the rows, so the next cut would
 * rarely fit it, and it would hold a second copy of every row between
 * cuts. */
static void image_unref(image *img) {
  if (img == NULL || --img->refs > 0)
    return;
  ps_state_service *ss = img->ss;
  ps_shard_reader_end(img->rd);
  if (ss != NULL && ss->spare == NULL && img->info.table_floats == 0 && img->buf != NULL) {
    ss->spare = img->buf;
    ss->spare_cap = img->cap;
  } else {
    free(img->buf);
  }
  free(img);
}

void ps_state_service_free(ps_state_service *ss) {
  if (ss == NULL)
    return;
  /* The loop has run out: no reply is being written any more. */
  for (int i = 0; i < ss->nimages; i++)
    image_unref(ss->images[i]);
  free(ss->spare);
  free(ss);
}

void ps_state_service_prepare(ps_state_service *ss) {
  ps_state_info in = ps_shard_state_info(ss->shard);
  /* Not for a state with sparse tables (image_unref keeps none either):
   * a copy of every row, allocated and touched here, would hold its memory
   * from the start until the first cut, and cost a restart about a second
   * per 750 MB. */
  if (in.table_floats > 0)
    return;
  ss->spare = grow(ss->spare, &ss->spare_cap, in.image_floats);
  if (ss->spare != NULL)
    memset(ss->spare, 0, (size_t)in.image_floats * sizeof(float));
}

static ps_state_answer refuse(int code, uint32_t flags, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ps_state_answer refuse(int code, uint32_t flags, const char *fmt, ...) {
  ps_state_answer a = {.outcome = PS_STATE_REFUSED, .code = code, .flags = flags};
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(a.why, sizeof a.why, fmt, ap);
  va_end(ap);
  return a;
}

void ps_state_service_set_fence(ps_state_service *ss, uint64_t fence) {
  if (fence > ss->fence)
    ss->fence = fence;
}

int ps_state_service_fence(ps_state_service *ss, const ps_msg *m, ps_state_answer *a) {
  /* A chief that lost its lease (paused, cut off) may still be running;
   * once a newer chief's token has been seen, it is refused. */
  uint64_t fence = ps_proto_fence(m);
  if (fence < ss->fence) {
    *a = refuse(PS_EFENCED, 0, "%s with fence token %" PRIu64 ", but this %s has seen token %"
                PRIu64 ": a newer chief holds the lease", ps_proto_type_name(m->type), fence,
                ss->kind, ss->fence);
    return PS_EFENCED;
  }
  if (fence > ss->fence) {
    if (ss->fence != 0)
      ps_log(PS_LOG_INFO, "chief fence token %" PRIu64 " -> %" PRIu64 ": a newer chief; frames "
             "with older tokens are refused from now on", ss->fence, fence);
    ss->fence = fence;
  }
  return 0;
}

/* owner's current image, or -1. */
static int find(const ps_state_service *ss, const void *owner) {
  for (int i = 0; i < ss->nimages; i++)
    if (ss->images[i]->owner == owner)
      return i;
  return -1;
}

static void drop(ps_state_service *ss, int i) {
  image_unref(ss->images[i]);
  memmove(&ss->images[i], &ss->images[i + 1], (size_t)(ss->nimages - i - 1) * sizeof(image *));
  ss->nimages--;
}

void ps_state_service_forget(ps_state_service *ss, const void *owner) {
  int i = find(ss, owner);
  if (i >= 0)
    drop(ss, i);
}

static ps_state_answer on_cut(ps_state_service *ss, const void *owner, ps_conn *c, uint64_t req,
                              const ps_msg_cut *m, int holds_state) {
  if (!holds_state)
    return refuse(PS_EFORMAT, PS_ERROR_RETRY, "CUT of %s, which holds no state yet", ss->name);
  if (ps_shard_lazy(ss->shard)) {
    uint64_t done, all;
    ps_shard_lazy_progress(ss->shard, &done, &all);
    return refuse(PS_EFORMAT, PS_ERROR_RETRY, "CUT of %s, which is still loading its tables' "
                  "rows from Redis (%" PRIu64 " of %" PRIu64 " buckets in)", ss->name, done, all);
  }
  ps_state_info in = ps_shard_state_info(ss->shard);
  uint64_t t0 = ps_now_ns();
  image *img = calloc(1, sizeof *img);
  if (img == NULL)
    return refuse(-ENOMEM, PS_ERROR_RETRY, "out of memory for a cut");
  *img = (image){.ss = ss, .owner = owner, .fence = m->fence, .cut_id = m->cut_id, .info = in,
                 .refs = 1};
  if (in.table_floats > 0) {
    /* Sparse tables: no copy of every row; the FETCHes read the cut
     * (ps_shard_reader) in order while the shard goes on. */
    if ((img->rd = ps_shard_reader_begin(ss->shard, &img->info)) == NULL) {
      free(img);
      return refuse(-ENOMEM, PS_ERROR_RETRY, "out of memory for a cut of %" PRIu64 " floats",
                    in.image_floats);
    }
    in = img->info;
  } else {
    /* A new image, in the spare buffer when there is one: an earlier
     * cut's buffer may still be on the wire in a FETCH_REPLY. */
    float *buf = grow(ss->spare, &ss->spare_cap, in.image_floats);
    if (buf == NULL) {
      free(img);
      return refuse(-ENOMEM, PS_ERROR_RETRY, "out of memory for a copy of %" PRIu64 " floats",
                    in.image_floats);
    }
    img->buf = buf;
    img->cap = ss->spare_cap;
    ss->spare = NULL;
    ss->spare_cap = 0;
    ps_shard_state_write(ss->shard, img->buf);
  }
  /* The owner's earlier cut goes; so does the oldest beyond the cap. */
  int i = find(ss, owner);
  if (i >= 0)
    drop(ss, i);
  else if (ss->nimages == IMAGES_MAX)
    drop(ss, 0);
  ss->images[ss->nimages++] = img;
  ps_msg rep = {.type = PS_MSG_CUT_REPLY};
  rep.u.cut_reply.cut_id = m->cut_id;
  rep.u.cut_reply.state = in;
  ps_conn_send_msg(c, &rep, req);
  ps_log(PS_LOG_DEBUG, "cut %" PRIu64 ": copied %" PRIu64 " floats at version %" PRIu64
         " in %.2f ms", m->cut_id, in.image_floats, in.version,
         (double)(ps_now_ns() - t0) * 1e-6);
  return (ps_state_answer){.outcome = PS_STATE_HOLD, .hold_ms = m->hold_ms, .cut_id = m->cut_id};
}

static void on_fetch_written(void *arg, int status) {
  (void)status;
  image_unref(arg);
}

/* A piece read from a cut's reader, kept until its reply is written. */
typedef struct piece {
  image *img;
  float floats[];
} piece;

static void on_piece_written(void *arg, int status) {
  (void)status;
  piece *p = arg;
  image_unref(p->img);
  free(p);
}

/* The owner's image i is no longer needed once it was fetched to its end
 * and resumed (a chief resumes first, a ring peer last): it goes (the
 * replies still being written keep its buffer), and a shard holds no copy
 * of its state between cuts. */
static void done_with(ps_state_service *ss, int i) {
  const image *img = ss->images[i];
  if (img->resumed && img->fetched == img->info.image_floats)
    drop(ss, i);
}

static ps_state_answer on_fetch(ps_state_service *ss, const void *owner, ps_conn *c,
                                uint64_t req, const ps_msg_fetch *f) {
  /* The cut id alone is not enough: two chiefs number their cuts alike. */
  int i = find(ss, owner);
  image *img = i >= 0 ? ss->images[i] : NULL;
  if (img == NULL)
    return refuse(PS_EFORMAT, 0, "FETCH of cut %" PRIu64 " (token %" PRIu64 "): this %s holds "
                  "no cut", f->cut_id, f->fence, ss->kind);
  if (f->cut_id != img->cut_id || f->fence != img->fence)
    return refuse(PS_EFORMAT, 0, "FETCH of cut %" PRIu64 " (token %" PRIu64 "): this %s holds "
                  "cut %" PRIu64 " of token %" PRIu64 " only", f->cut_id, f->fence, ss->kind,
                  img->cut_id, img->fence);
  uint64_t total = img->info.image_floats;
  if (f->offset > total || f->count > total - f->offset || f->count > ss->max_piece)
    return refuse(PS_EFORMAT, 0, "FETCH of floats %" PRIu64 "..+%" PRIu64 ": the copy holds %"
                  PRIu64 " and a piece is at most %" PRIu64, f->offset, f->count, total,
                  ss->max_piece);
  /* A cut read through its reader is read once, in order. */
  if (img->rd != NULL && f->offset != img->fetched)
    return refuse(PS_EFORMAT, 0, "FETCH of floats %" PRIu64 "..+%" PRIu64 ": this cut is read "
                  "once, in order: expected the piece at %" PRIu64, f->offset, f->count,
                  img->fetched);
  ps_msg m = {.type = PS_MSG_FETCH_REPLY};
  m.u.fetch_reply.cut_id = f->cut_id;
  m.u.fetch_reply.offset = f->offset;
  m.u.fetch_reply.count = f->count;
  uint8_t prefix[PS_PROTO_PREFIX_MAX];
  size_t plen = ps_proto_encode_prefix(&m, req, prefix);
  /* The image stays, unchanged, until this reply is written. */
  img->refs++;
  int sent;
  if (img->rd != NULL) {
    piece *p = malloc(sizeof *p + (size_t)(f->count ? f->count : 1) * sizeof(float));
    int rc = p == NULL ? -ENOMEM : ps_shard_reader_read(img->rd, p->floats, f->count);
    if (rc != 0) {
      free(p);
      image_unref(img);
      return refuse(-ENOMEM, 0, "FETCH of floats %" PRIu64 "..+%" PRIu64 ": out of memory for "
                    "the cut's rows", f->offset, f->count);
    }
    p->img = img;
    sent = ps_conn_send(c, prefix, plen, p->floats, f->count * sizeof(float), on_piece_written,
                        p);
    if (sent != 0)
      free(p);
  } else {
    sent = ps_conn_send(c, prefix, plen, img->buf + f->offset, f->count * sizeof(float),
                        on_fetch_written, img);
  }
  if (sent != 0) {
    image_unref(img);
    return (ps_state_answer){.outcome = PS_STATE_ANSWERED};
  }
  if (f->offset == img->fetched)
    img->fetched += f->count;
  done_with(ss, i);
  return (ps_state_answer){.outcome = PS_STATE_ANSWERED};
}

static ps_state_answer on_resume(ps_state_service *ss, const void *owner, ps_conn *c,
                                 uint64_t req, const ps_msg_resume *m) {
  /* The answer first: the chief's stall ends here, not after the held
   * pushes are applied.  The copy stays for the FETCHes (a chief resumes
   * before it fetches) until the last one. */
  ps_conn_send_pong(c, req, m->cut_id);
  int i = find(ss, owner);
  image *img = i >= 0 ? ss->images[i] : NULL;
  if (img != NULL && m->cut_id == img->cut_id && m->fence == img->fence) {
    img->resumed = 1;
    done_with(ss, i);
    return (ps_state_answer){.outcome = PS_STATE_RESUME, .cut_id = m->cut_id};
  }
  return (ps_state_answer){.outcome = PS_STATE_ANSWERED};
}

static ps_state_answer on_load(ps_state_service *ss, ps_conn *c, uint64_t req,
                               const ps_msg_load *l, int holds_state) {
  if (holds_state)
    return refuse(PS_EFORMAT, 0, "LOAD of %s, which already holds a state at version %" PRIu64,
                  ss->name, ps_shard_version(ss->shard));
  const ps_state_info *in = &l->state;
  char why[256];
  if (ps_shard_state_check(ss->shard, in, why, sizeof why) != 0)
    return refuse(PS_ELAYOUT, 0, "LOAD: %s", why);
  if (l->offset == 0)
    ss->load_next = 0;
  if (l->offset != ss->load_next || l->count > ss->max_piece ||
      l->count > in->image_floats - l->offset)
    return refuse(PS_EFORMAT, 0, "LOAD piece at float %" PRIu64 " of %" PRIu64 " floats, "
                  "expected the piece at %" PRIu64 " of at most %" PRIu64, l->offset, l->count,
                  ss->load_next, ss->max_piece);
  /* Straight into the state: it serves nobody until the last piece. */
  ps_shard_state_load_piece(ss->shard, in, l->offset, l->data, l->count);
  ss->load_next = l->offset + l->count;
  ps_state_answer a = {.outcome = PS_STATE_ANSWERED};
  if (ss->load_next == in->image_floats) {
    ps_errbuf eb = {0};
    ss->load_next = 0;
    if (ps_shard_state_load_end(ss->shard, in, &eb) != 0)
      return refuse(eb.code == -ENOMEM ? -ENOMEM : PS_EFORMAT, 0, "LOAD: %s", eb.msg);
    a.outcome = PS_STATE_LOADED;
  }
  ps_conn_send_pong(c, req, l->offset + l->count);
  return a;
}

ps_state_answer ps_state_service_frame(ps_state_service *ss, const void *owner, ps_conn *c,
                                       uint64_t req, const ps_msg *m, int holds_state) {
  switch (m->type) {
  case PS_MSG_CUT:
    return on_cut(ss, owner, c, req, &m->u.cut, holds_state);
  case PS_MSG_FETCH:
    return on_fetch(ss, owner, c, req, &m->u.fetch);
  case PS_MSG_RESUME:
    return on_resume(ss, owner, c, req, &m->u.resume);
  case PS_MSG_LOAD:
    return on_load(ss, c, req, &m->u.load, holds_state);
  default:
    return refuse(PS_EFORMAT, 0, "%s is not a state request", ps_proto_type_name(m->type));
  }
}
