/* A parameter-server shard's state and update rules (see shard.h). */
#include "ps/shard.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static float *alloc_floats(size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, 64, (n ? n : 1) * sizeof(float)) != 0)
    return NULL;
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

int ps_shard_sync_flush(ps_shard *s) {
  if (s->accum_count == 0)
    return 0;
  s->target = s->accum_count;
  sync_apply(s);
  return 1;
}

void ps_shard_sync_reset_target(ps_shard *s) { s->target = s->o.replicas_to_aggregate; }

ps_push_result ps_shard_push(ps_shard *s, uint32_t worker, uint64_t incarnation, uint64_t seq,
                             uint64_t step, const void *g) {
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
  return PS_SHARD_APPLIED;
}
