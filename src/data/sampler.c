/* Per-worker, per-epoch shuffled sample order that can be saved and restored (see sampler.h). */
#include "data/sampler.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"

/* floor(j * n / m) without overflowing j * n: n = q*m + r, so
 * j*n/m = j*q + j*r/m with j*r < m*m, small since m is an int. */
static size_t part_start(size_t n, int j, int m) {
  size_t q = n / (size_t)m, r = n % (size_t)m;
  return (size_t)j * q + (size_t)j * r / (size_t)m;
}

/* Fills s->perm[0, part) with this worker's part of epoch `epoch`.  Every
 * worker shuffles the whole range with the same generator so that the parts
 * agree; the buffer holds n_total entries for that. */
static void build_epoch(ps_sampler *s, uint64_t epoch) {
  size_t n = s->n_total;
  ps_rng r;
  ps_rng_seed(&r, ps_mix64(s->seed ^ ps_mix64(epoch)));
  for (size_t i = 0; i < n; i++)
    s->perm[i] = i;
  for (size_t i = n - 1; i > 0; i--) {
    size_t k = (size_t)ps_rng_below(&r, (uint64_t)i + 1);
    size_t t = s->perm[i];
    s->perm[i] = s->perm[k];
    s->perm[k] = t;
  }
  size_t start = part_start(n, s->worker, s->nworkers);
  memmove(s->perm, s->perm + start, s->part * sizeof *s->perm);
}

int ps_sampler_init(ps_sampler *s, size_t n_total, int worker, int nworkers, uint64_t seed) {
  memset(s, 0, sizeof *s);
  if (nworkers < 1 || worker < 0 || worker >= nworkers || n_total < (size_t)nworkers)
    return -EINVAL;
  if (n_total > SIZE_MAX / sizeof *s->perm)
    return -ENOMEM;
  /* Room for the whole permutation, not just the part, so that moving to
   * another epoch never allocates and ps_sampler_next cannot fail. */
  s->perm = malloc(n_total * sizeof *s->perm);
  if (s->perm == NULL)
    return -ENOMEM;
  s->n_total = n_total;
  s->worker = worker;
  s->nworkers = nworkers;
  s->seed = seed;
  s->part = part_start(n_total, worker + 1, nworkers) - part_start(n_total, worker, nworkers);
  /* Invariant kept from here on: perm holds the part of epoch pos.epoch. */
  build_epoch(s, 0);
  return 0;
}

void ps_sampler_close(ps_sampler *s) {
  if (s == NULL)
    return;
  free(s->perm);
  memset(s, 0, sizeof *s);
}

size_t ps_sampler_next(ps_sampler *s, size_t *out, size_t max) {
  if (max == 0)
    return 0;
  /* The next epoch is built only when asked for, so that a position saved
   * at the end of an epoch reads (e, part) and restores to the same place. */
  if (s->pos.offset >= s->part) {
    s->pos.epoch++;
    s->pos.offset = 0;
    build_epoch(s, s->pos.epoch);
  }
  size_t left = s->part - (size_t)s->pos.offset;
  size_t k = max < left ? max : left;
  memcpy(out, s->perm + s->pos.offset, k * sizeof *out);
  s->pos.offset += k;
  return k;
}

int ps_sampler_seek(ps_sampler *s, ps_data_pos pos) {
  if (pos.offset > s->part)
    return -EINVAL;
  if (pos.epoch != s->pos.epoch)
    build_epoch(s, pos.epoch);
  s->pos = pos;
  return 0;
}
