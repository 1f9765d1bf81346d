/* Exporting a checkpoint's variables to the formats other tools read:
 * one safetensors file, or one NumPy .npy file per variable. */
#ifndef PS_RECOVERY_EXPORT_H
#define PS_RECOVERY_EXPORT_H

#include "paramserv/error.h"
#include "recovery/checkpoint.h"

/* Reassemble every variable of `c` from its shard files (each verified as
 * ps_ckpt_read_shard does) and write them, in manifest order, as
 *   "safetensors": one file `out` (written to out.tmp, fsynced, renamed);
 *                  dtype F32, the shapes of the manifest, and __metadata__
 *                  naming the checkpoint (step, model, layout hash, ...);
 *   "npy":         a directory `out` (created if missing) holding
 *                  <name>.npy per variable, NPY format 1.0, '<f4', C order.
 * Only the values are exported, not the optimizer slots.
 * @return 0; PS_EUSAGE for another format, or a variable name that cannot
 * be a file name ("npy": empty, ".", "..", or containing '/') or is
 * reserved ("safetensors": "__metadata__"); the shard files' errors
 * (ps_ckpt_read_shard); -errno from writing; -ENOMEM.  The message names
 * the path.  Nothing is kept after the call; a failed export can leave a
 * partial npy directory (never a partial safetensors file). */
int ps_ckpt_export(const ps_ckpt *c, const char *format, const char *out, ps_errbuf *eb);

/* The same from an arena already in memory (c->total_floats floats, the
 * caller's): what ps_ckpt_export does after reading the shards. */
int ps_ckpt_export_safetensors(const ps_ckpt *c, const float *arena, const char *path,
                               ps_errbuf *eb);
int ps_ckpt_export_npy(const ps_ckpt *c, const float *arena, const char *dir, ps_errbuf *eb);

#endif
