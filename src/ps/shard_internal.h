/* The shard's state (shard.c), shared with the file that reads it later
 * (shard_read.c).  Nothing outside these two includes it. */
#ifndef PS_PS_SHARD_INTERNAL_H
#define PS_PS_SHARD_INTERNAL_H

#include <stdint.h>

#include "ps/shard.h"
#include "ps/state.h"

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
  ps_shard_counts counts;
  ps_table *tables[PS_SHARD_MAX_TABLES];  /* o.ntables */
  uint64_t *keys;         /* a block's keys, aligned (the wire's are not) */
  size_t keys_cap;
  /* sync: the open step's sparse blocks, each pushed section as its u64
   * length and its bytes, applied (summed per key) when the step is. */
  uint8_t *sync_rows;
  size_t sync_rows_len, sync_rows_cap;
  uint64_t *lazy_done;    /* a lazy load: its buckets all in (NULL: none going on) */
  unsigned lazy_bits;
  uint64_t lazy_left;     /* buckets not all in */
  uint8_t *tsec;          /* a LOAD's table section, until load_end parses it */
  uint64_t tsec_bytes;
  int tsec_failed;        /* no room for it */
};

/* Sync with tables: the image's table section ends with the open step's
 * rows (their length, then them). */
int ps_shard_has_sync_rows(const ps_shard_opts *o);
/* That tail at p (8 + sync_rows_len bytes; nothing without it).  @return
 * its end. */
uint8_t *ps_shard_sync_tail_write(const ps_shard *s, uint8_t *p);
/* The image up to its table section: the segments and the exactly-once
 * rows. */
void ps_shard_head_write(const ps_shard *s, const ps_state_info *in, float *img);

#endif
