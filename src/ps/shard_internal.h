/* The shard's state, for the modules of src/ps only (server.c, control.c,
 * consistency.c embed and read it); everyone else goes through shard.h. */
#ifndef PS_PS_SHARD_INTERNAL_H
#define PS_PS_SHARD_INTERNAL_H

#include "ps/shard.h"

struct ps_shard {
  ps_shard_opts o;
  float *values;                      /* nfloats */
  float *slots[PS_OPTIM_MAX_SLOTS];   /* ps_optim_nslots(kind) of nfloats */
  float *accum;                       /* sync: the sum of this step's gradients */
  int accum_count;
  int target;             /* sync: gradients that complete a step (see ps_shard_sync_flush) */
  uint64_t version;       /* updates applied to the slice */
  uint64_t global_step;   /* shard 0: its version; others: the newest seen */
  uint64_t journal;       /* entries made so far (ps_journal.n of the last) */
  ps_once *once;          /* nworkers entries */
  uint64_t pushes_applied, pushes_duplicate, pushes_stale;
};

/* Make or free a state in place (ps_shard_new and ps_shard_free allocate
 * the struct too).  @return 0 or -ENOMEM. */
int ps_shard_init(ps_shard *s, const ps_shard_opts *o, const float *initial);
void ps_shard_close(ps_shard *s);

#endif
