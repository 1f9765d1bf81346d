/* A parameter-server shard's state and update rules (see shard.h). */
#include "ps/shard.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/endian.h"
#include "paramserv/error.h"

ps_shard_opts ps_shard_opts_for(const ps_config *cfg, const ps_layout *layout, int index) {
  ps_shard_opts so = {.index = index, .nworkers = cfg->nworkers,
                      .nfloats = layout->shard_floats[index],
                      .consistency = cfg->consistency,
                      .replicas_to_aggregate = cfg->replicas_to_aggregate > 0
                                                   ? (int)cfg->replicas_to_aggregate
                                                   : cfg->nworkers};
  so.optim = ps_optim_default(PS_OPTIM_ADAM, (float)cfg->lr);
  ps_optim_parse(cfg->optimizer, &so.optim);
  so.optim.lr = (float)cfg->lr;
  so.optim.momentum = (float)cfg->momentum;
  so.optim.weight_decay = (float)cfg->weight_decay;
  ps_sched_parse(cfg->schedule, &so.sched);
  so.sched.total = cfg->last_step > 0 ? (uint64_t)cfg->last_step : 0;
  return so;
}

static float *alloc_floats(size_t n) {
  void *p = NULL;
  size_t bytes = (n ? n : 1) * sizeof(float);
  /* Large slices on huge pages where the kernel gives them on request: the
   * optimizer's passes and a checkpoint's copy take fewer TLB misses. */
  int huge = bytes >= (4u << 20);
  if (posix_memalign(&p, huge ? 2u << 20 : 64, bytes) != 0)
    return NULL;
  if (huge)
    madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void ps_shard_close(ps_shard *s) {
  if (s == NULL)
    return;
  free(s->values);
  for (int i = 0; i < PS_OPTIM_MAX_SLOTS; i++)
    free(s->slots[i]);
  free(s->accum);
  free(s->once);
  memset(s, 0, sizeof *s);
}

int ps_shard_init(ps_shard *s, const ps_shard_opts *o, const float *initial) {
  memset(s, 0, sizeof *s);
  s->o = *o;
  if (s->o.replicas_to_aggregate < 1)
    s->o.replicas_to_aggregate = 1;
  s->target = s->o.replicas_to_aggregate;
  s->values = alloc_floats(o->nfloats);
  s->once = calloc((size_t)(o->nworkers > 0 ? o->nworkers : 1), sizeof *s->once);
  int failed = s->values == NULL || s->once == NULL;
  for (int i = 0; i < ps_optim_nslots(o->optim.kind) && !failed; i++) {
    s->slots[i] = alloc_floats(o->nfloats);
    failed = s->slots[i] == NULL;
    for (size_t j = 0; !failed && j < o->nfloats; j++)
      s->slots[i][j] = ps_optim_slot_init(&o->optim, i);
  }
  if (!failed && o->consistency == PS_CONSISTENCY_SYNC) {
    s->accum = alloc_floats(o->nfloats);
    failed = s->accum == NULL;
    if (!failed)
      memset(s->accum, 0, o->nfloats * sizeof(float));
  }
  if (failed) {
    ps_shard_close(s);
    return -ENOMEM;
  }
  if (initial != NULL)
    memcpy(s->values, initial, o->nfloats * sizeof(float));
  else
    memset(s->values, 0, o->nfloats * sizeof(float));
  return 0;
}

static void apply(ps_shard *s, const float *g, uint64_t step) {
  float lr = ps_sched_lr(&s->o.sched, s->o.optim.lr, step);
  ps_optim_apply(&s->o.optim, lr, s->version + 1, s->values, g, s->slots, s->o.nfloats);
  s->version++;
  if (s->o.index == 0)
    s->global_step = s->version;
}

static void sync_apply(ps_shard *s) {
  float inv = 1.0f / (float)s->accum_count;
  for (size_t i = 0; i < s->o.nfloats; i++)
    s->accum[i] *= inv;
  apply(s, s->accum, s->version);
  memset(s->accum, 0, s->o.nfloats * sizeof(float));
  s->accum_count = 0;
}

/* The next journal entry: numbered, stamped with the version it leads to. */
static void journal(ps_shard *s, ps_journal *out, ps_journal e) {
  e.n = ++s->journal;
  e.version = s->version;
  if (out != NULL)
    *out = e;
}

int ps_shard_sync_flush(ps_shard *s, ps_journal *out) {
  if (s->accum_count == 0)
    return 0;
  s->target = s->accum_count;
  sync_apply(s);
  journal(s, out, (ps_journal){.kind = PS_JOURNAL_FLUSH});
  return 1;
}

int ps_shard_sync_set_target(ps_shard *s, int target, ps_journal *out) {
  if (target < 1)
    target = 1;
  if (target > s->o.replicas_to_aggregate)
    target = s->o.replicas_to_aggregate;
  if (target == s->target)
    return 0;
  s->target = target;
  /* A step that already holds enough gradients completes now. */
  if (s->accum_count >= s->target)
    sync_apply(s);
  journal(s, out, (ps_journal){.kind = PS_JOURNAL_TARGET, .target = target});
  return 1;
}

ps_push_result ps_shard_push(ps_shard *s, uint32_t worker, uint64_t incarnation, uint64_t seq,
                             uint64_t step, const void *g, ps_journal *out) {
  ps_once *once = &s->once[worker];
  if (incarnation < once->incarnation)
    return PS_SHARD_OLD_INCARNATION;
  if (incarnation == once->incarnation && seq <= once->last_seq) {
    s->pushes_duplicate++;
    return PS_SHARD_DUPLICATE;
  }
  if (s->o.consistency == PS_CONSISTENCY_SYNC && step != s->version) {
    /* Computed on weights of another step: averaging it in would mix two
     * steps' gradients.  It still counts as seen for exactly-once. */
    once->incarnation = incarnation;
    once->last_seq = seq;
    s->pushes_stale++;
    return PS_SHARD_STALE;
  }
  once->incarnation = incarnation;
  once->last_seq = seq;
  if (step > s->global_step)
    s->global_step = step;
  /* The payload sits 16-byte aligned in the read buffer (net/conn.c), so
   * it can be read as floats in place. */
  const float *grad = g;
  if (s->o.consistency == PS_CONSISTENCY_SYNC) {
    for (size_t i = 0; i < s->o.nfloats; i++)
      s->accum[i] += grad[i];
    if (++s->accum_count >= s->target)
      sync_apply(s);
  } else {
    apply(s, grad, step);
  }
  s->pushes_applied++;
  journal(s, out, (ps_journal){.kind = PS_JOURNAL_PUSH, .worker = worker,
                               .incarnation = incarnation, .seq = seq, .step = step, .g = grad});
  return PS_SHARD_APPLIED;
}

int ps_shard_replay(ps_shard *s, const ps_journal *e) {
  if (e->n != s->journal + 1)
    return 1;
  switch (e->kind) {
  case PS_JOURNAL_PUSH:
    if (e->worker >= (uint32_t)s->o.nworkers)
      return PS_ECORRUPT;
    /* A push the exactly-once table already holds was logged only once, so
     * it cannot come back here; whatever it returns, the entry is used. */
    if (ps_shard_push(s, e->worker, e->incarnation, e->seq, e->step, e->g, NULL) !=
        PS_SHARD_APPLIED)
      s->journal++;
    return 0;
  case PS_JOURNAL_FLUSH:
    if (!ps_shard_sync_flush(s, NULL))
      s->journal++;
    return 0;
  case PS_JOURNAL_TARGET:
    if (!ps_shard_sync_set_target(s, e->target, NULL))
      s->journal++;
    return 0;
  default:
    s->journal++;  /* a kind this version does not know changes nothing it holds */
    return 0;
  }
}

/* ------------------------------------------------------------ images */

uint64_t ps_shard_image_floats(size_t n, int nslots, int has_accum, int nonce) {
  return (uint64_t)n * (uint64_t)(1 + nslots + has_accum) + 4 * (uint64_t)nonce;
}

ps_shard_image_info ps_shard_image_info_of(const ps_shard *s) {
  ps_shard_image_info in = {
      .version = s->version,
      .global_step = s->global_step,
      .nslots = ps_optim_nslots(s->o.optim.kind),
      .has_accum = s->accum != NULL,
      .accum_count = s->accum_count,
      .target = s->target,
      .nonce = s->o.nworkers,
  };
  in.image_floats = ps_shard_image_floats(s->o.nfloats, in.nslots, in.has_accum, in.nonce);
  return in;
}

void ps_shard_image_write(const ps_shard *s, float *img) {
  size_t n = s->o.nfloats;
  memcpy(img, s->values, n * sizeof(float));
  img += n;
  for (int i = 0; i < ps_optim_nslots(s->o.optim.kind); i++, img += n)
    memcpy(img, s->slots[i], n * sizeof(float));
  if (s->accum != NULL) {
    memcpy(img, s->accum, n * sizeof(float));
    img += n;
  }
  uint8_t *rows = (uint8_t *)img;
  for (int j = 0; j < s->o.nworkers; j++) {
    ps_put_le64(rows + 16 * j, s->once[j].incarnation);
    ps_put_le64(rows + 16 * j + 8, s->once[j].last_seq);
  }
}

int ps_shard_image_check(const ps_shard *s, const ps_shard_image_info *info, char *why,
                         size_t why_len) {
  ps_shard_image_info mine = ps_shard_image_info_of(s);
  if (info->nslots == mine.nslots && info->has_accum == mine.has_accum &&
      info->image_floats == ps_shard_image_floats(s->o.nfloats, info->nslots, info->has_accum,
                                                  info->nonce) &&
      info->nonce >= 0)
    return 0;
  snprintf(why, why_len,
           "state of %" PRIu64 " floats with %d slots, accumulator %d and %d exactly-once rows; "
           "this shard holds %zu floats with %d slots and accumulator %d",
           info->image_floats, info->nslots, info->has_accum, info->nonce, s->o.nfloats,
           mine.nslots, mine.has_accum);
  return PS_ELAYOUT;
}

void ps_shard_image_load(ps_shard *s, const ps_shard_image_info *info, const float *img) {
  size_t n = s->o.nfloats;
  memcpy(s->values, img, n * sizeof(float));
  img += n;
  for (int i = 0; i < info->nslots; i++, img += n)
    memcpy(s->slots[i], img, n * sizeof(float));
  if (info->has_accum) {
    memcpy(s->accum, img, n * sizeof(float));
    img += n;
  }
  s->accum_count = info->accum_count;
  s->target = info->target > 0 ? info->target : s->o.replicas_to_aggregate;
  s->version = info->version;
  s->global_step = info->global_step;
  /* Rows for workers this cluster does not have are dropped; workers the
   * image lacks start with none. */
  const uint8_t *rows = (const uint8_t *)img;
  for (int j = 0; j < s->o.nworkers; j++) {
    s->once[j] = (ps_once){0};
    if (j < info->nonce) {
      s->once[j].incarnation = ps_get_le64(rows + 16 * j);
      s->once[j].last_seq = ps_get_le64(rows + 16 * j + 8);
    }
  }
}

void ps_shard_set_journal(ps_shard *s, uint64_t n) { s->journal = n; }
