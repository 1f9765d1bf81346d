/* Which training samples a worker reads, in what order, and where it is. */
#ifndef PS_DATA_SAMPLER_H
#define PS_DATA_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

/* A worker's place in its sample stream, small enough to save anywhere
 * (Redis, a checkpoint manifest) and restore, so a restarted worker goes on
 * where it was instead of starting its epoch over. */
typedef struct ps_data_pos {
  uint64_t epoch;   /* 0-based epoch number */
  uint64_t offset;  /* samples of this worker's part already handed out in this epoch */
} ps_data_pos;

/* Worker `worker` of `nworkers` over `n_total` samples.  Each epoch e, the
 * whole index range is permuted with a generator seeded by (seed, e); worker j
 * takes the contiguous part [j*n/M, (j+1)*n/M) of that permutation, so the
 * workers' parts are disjoint within an epoch and reshuffled every epoch. */
typedef struct ps_sampler {
  size_t n_total;
  int worker, nworkers;
  uint64_t seed;
  size_t *perm;     /* [0, part): this worker's part of epoch pos.epoch; room for n_total; owned */
  size_t part;      /* its length */
  ps_data_pos pos;
} ps_sampler;

/* @return 0, or -EINVAL for nworkers < 1, worker outside [0, nworkers),
 * n_total < nworkers; -ENOMEM.  Starts at epoch 0, offset 0.  Allocates
 * n_total indices (the whole permutation is built to cut this worker's part
 * from it).  On failure *s is zeroed.  Free with ps_sampler_close, which
 * accepts NULL and a zeroed sampler. */
int ps_sampler_init(ps_sampler *s, size_t n_total, int worker, int nworkers, uint64_t seed);
void ps_sampler_close(ps_sampler *s);

/* Hand out up to `max` next sample indices of the current epoch into `out`
 * (room for `max` entries, owned by the caller).  Returns how many: fewer
 * than max only at the end of an epoch, 0 only when max is 0.  When the epoch
 * is exhausted, the next call starts the next epoch (pos becomes (e+1, 0)
 * then, not before).  Never fails: the buffer for every epoch is allocated
 * by ps_sampler_init. */
size_t ps_sampler_next(ps_sampler *s, size_t *out, size_t max);

/* Jump to `pos` (as saved from s->pos, possibly by another process with the
 * same n_total, worker, nworkers and seed): the following ps_sampler_next
 * calls hand out exactly what the saved sampler would have.  Rebuilds the
 * permutation when the epoch differs, O(n_total).  @return 0 or -EINVAL when
 * pos.offset exceeds the part size. */
int ps_sampler_seek(ps_sampler *s, ps_data_pos pos);

/* Samples in this worker's part of every epoch. */
static inline size_t ps_sampler_part_size(const ps_sampler *s) { return s->part; }

#endif
