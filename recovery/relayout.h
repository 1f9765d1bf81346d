/* A checkpoint restored into a cluster of another layout: another number
 * of shards, or other [layout] settings, of the same model (FORMAT.md
 * section 8, "Another number of shards").  Every shard file is read once
 * (and verified as it is read); then each shard of the new layout gets its
 * state image: its dense parts cut out of the whole variables (values and
 * each optimizer slot), and the sparse rows and pending keys the hash ring
 * of the new shard count gives it, with their optimizer slots, counts and
 * stamps, in the order of their stamps (the order a shard's tables keep).
 * The images are what recovery/plan.c hands the chief to LOAD. */
#ifndef PS_RECOVERY_RELAYOUT_H
#define PS_RECOVERY_RELAYOUT_H

#include <stdint.h>

#include "layout/layout.h"
#include "paramserv/error.h"
#include "paramserv/vartable.h"
#include "ps/shard.h"
#include "recovery/checkpoint.h"

typedef struct ps_relayout ps_relayout;

/* What a relayout moves: entries over every table, and of them those whose
 * shard index changes (a row of old shard 1 that the new ring gives shard
 * 1 stays; given shard 2, it moved). */
typedef struct ps_relayout_stats {
  int from_shards, to_shards;
  uint64_t rows, rows_moved;
  uint64_t pending, pending_moved;
} ps_relayout_stats;

/* Read every shard file of c (each verified as ps_ckpt_read_shard does) for
 * a cluster of `layout` built from `vars`.  c must stay open while the
 * relayout is used.  @return 0; PS_ELAYOUT with one line naming the
 * checkpoint when it cannot be laid out again: other variables
 * (ps_ckpt_check_vars), a sync step open in a shard (gradients summed for
 * it: a cut between steps restores into another shard count); the
 * reading's errors (a damaged file: PS_ECORRUPT, -errno); -ENOMEM.  st (may
 * be NULL) gets the counts.  Free with ps_relayout_close. */
int ps_relayout_open(const ps_ckpt *c, const ps_vartable *vars, const ps_layout *layout,
                     ps_relayout **out, ps_relayout_stats *st, ps_errbuf *eb);

/* Shard so->index's state image under the new layout (so: that shard's
 * options, ps_shard_opts_for): *img malloc'd, *info describing it.  Its
 * version and global step are the largest of the checkpoint's shards (its
 * slice holds updates of each), its exactly-once rows empty (a push of the
 * old layout cannot be replayed into the new one: its sizes differ).  May
 * run on several threads at once.  @return 0; PS_ELAYOUT (the shard's
 * optimizer slots, accumulator or tables differ from the checkpoint's);
 * -ENOMEM. */
int ps_relayout_image(const ps_relayout *r, const ps_shard_opts *so, float **img,
                      ps_state_info *info, ps_errbuf *eb);

/* NULL does nothing. */
void ps_relayout_close(ps_relayout *r);

#endif
