/* Placement of a model's variable table onto N parameter-server shards:
 * which contiguous part of which variable each shard holds, identical in
 * every process that builds it from the same inputs. */
#ifndef PS_LAYOUT_LAYOUT_H
#define PS_LAYOUT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "nn/model.h"
#include "paramserv/error.h"
#include "paramserv/vartable.h"

#define PS_LAYOUT_MAX_SHARDS 256

typedef enum ps_layout_strategy {
  PS_LAYOUT_ROUND_ROBIN = 0,  /* part i onto shard i % N, in table order */
  PS_LAYOUT_GREEDY,           /* largest part first onto the lightest shard */
} ps_layout_strategy;

/* One contiguous run of one variable, held by one shard. */
typedef struct ps_part {
  int var;           /* index in the variable table */
  size_t start;      /* first element of the variable in this part */
  size_t count;      /* elements */
  int shard;
  size_t shard_off;  /* offset of the part in its shard's slice, in floats */
} ps_part;

typedef struct ps_layout {
  int nshards;
  int nparts;
  ps_part *parts;        /* sorted by (var, start); owned */
  size_t *shard_floats;  /* nshards entries: floats in each shard's slice; owned */
  size_t split_floats;   /* the split threshold used, in floats (0: never split) */
  uint64_t hash;         /* identifies model + placement, see ps_layout_build */
} ps_layout;

/* Place `t` on `nshards` shards.
 *
 * Splitting: a variable of more than split_bytes bytes is cut into the
 * fewest contiguous parts of at most split_bytes each, of sizes differing
 * by at most one element; split_bytes is used rounded down to whole
 * floats.  split_bytes == 0 never splits; split_bytes == SIZE_MAX means
 * "auto": never for one shard, else total bytes / (16 * nshards), rounded up to a multiple of 4 bytes
 * (no part is more than 1/16 of a shard's fair share; greedy puts the
 * largest shard at most one part above the mean, so within about 6% of
 * even; a quarter, the first choice, left the default mlp at 1.12 on 3
 * shards).  1 to 3 bytes cannot hold a float: PS_ELAYOUT.
 * Then the parts are placed by `strategy`; greedy breaks ties by the
 * lowest shard index and orders equal-size parts by (var, start), so the
 * result is deterministic.  Within a shard, parts are laid out in
 * (var, start) order.
 *
 * The hash is XXH64 over `model_desc` (e.g. "mlp 784-256-128-10"; NULL is
 * ""), nshards, and every part's (variable name, shape, start, count,
 * shard): two processes agree on the hash iff they agree on model and
 * placement.  The exact bytes are in src/layout/LAYOUT.md.
 *
 * @return 0, or PS_ELAYOUT (nshards outside [1, PS_LAYOUT_MAX_SHARDS], more
 * shards than parts so that a shard would hold nothing, split_bytes of 1 to
 * 3, an unknown strategy), -ENOMEM; message in eb.  On error *out is left
 * empty (closing it is harmless).  `t` need not outlive the layout.  Free
 * with ps_layout_close; ps_layout_close(NULL) does nothing. */
int ps_layout_build(const ps_vartable *t, const char *model_desc, int nshards,
                    ps_layout_strategy strategy, size_t split_bytes, ps_layout *out,
                    ps_errbuf *eb);

void ps_layout_close(ps_layout *l);

/* The cluster's model and its layout, from the config's [model], [layout]
 * and shard count: what every process of a cluster builds the same way.
 * In ring mode, one shard holding every variable whole (LAYOUT.md, §5).
 * @return 0, or a negative code with a message naming the config file and
 * section; nothing is left allocated then.  Free with ps_layout_close and
 * ps_model_close. */
int ps_layout_for_cluster(const ps_config *cfg, ps_model *model, ps_layout *layout,
                          ps_errbuf *eb);

/* "round-robin" | "greedy", exactly.  @return 0, or PS_EUSAGE (also for
 * NULL) leaving *out untouched.  The name is static; "unknown" for a value
 * outside the enum. */
int ps_layout_strategy_parse(const char *name, ps_layout_strategy *out);
const char *ps_layout_strategy_name(ps_layout_strategy s);

/* Copy shard `shard`'s parts out of the full arena (t->total floats) into
 * its slice (shard_floats[shard] floats), and back.  The caller owns both
 * buffers; `t` must be the table the layout was built from. */
void ps_layout_gather(const ps_layout *l, const ps_vartable *t, int shard, const float *arena,
                      float *slice);
void ps_layout_scatter(const ps_layout *l, const ps_vartable *t, int shard, const float *slice,
                       float *arena);

/* Fill shard `shard`'s slice with the variables' seeded initial values
 * (ps_vartable_init_values), without building the whole arena. */
void ps_layout_init_slice(const ps_layout *l, const ps_vartable *t, int shard, uint64_t seed,
                          float *slice);

/* max / mean of the shards' sizes in bytes (1.0 = perfectly even). */
double ps_layout_imbalance(const ps_layout *l);

#endif
