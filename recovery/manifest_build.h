/* Internal to recovery/: MANIFEST.json (FORMAT.md section 4) built from
 * what a checkpoint write recorded, over manifest.c's names (the filters,
 * the consistency modes, the built-in models), which read it back. */
#ifndef PS_RECOVERY_MANIFEST_BUILD_H
#define PS_RECOVERY_MANIFEST_BUILD_H

#include <stdint.h>

#include "data/idx.h"
#include "recovery/checkpoint.h"

/* What writing one shard file measured, for its manifest entry. */
typedef struct ps__ckpt_shard_rec {
  uint64_t raw;     /* uncompressed bytes */
  uint64_t stored;  /* bytes of the LZ4 frame */
  uint64_t xxh64;   /* of the unfiltered bytes */
  uint64_t state_xxh64;  /* of the state: the segments and the whole table section */
} ps__ckpt_shard_rec;

/* The manifest of the checkpoint `o` describes, its shard files measured by
 * recs (o->layout->nshards entries), written at unix time `wall`.
 * @return NUL-terminated JSON text the caller frees with free(), or NULL
 * when out of memory.  Nothing borrowed is kept. */
char *ps__ckpt_manifest_build(const ps_ckpt_write_opts *o, const ps__ckpt_shard_rec *recs,
                              double wall);

/* A normalization as the manifest writes it, {"divide", "mean", "std"},
 * then "comment" when not NULL; indented by `indent` spaces or on one line
 * (0).  @return text to free(), or NULL when out of memory. */
char *ps__ckpt_norm_text(const ps_data_norm *n, const char *comment, int indent);

#endif
