/* Exporting a checkpoint's variables to the formats other tools read:
 * one safetensors file, or one NumPy .npy file per variable (and per
 * sparse table its keys, values and slots). */
#ifndef PS_RECOVERY_EXPORT_H
#define PS_RECOVERY_EXPORT_H

#include "paramserv/error.h"
#include "recovery/checkpoint.h"

/* The files an npy export writes beside the arrays. */
#define PS_EXPORT_MODEL_FILE "model.json"
#define PS_EXPORT_NORM_FILE "normalization.json"

/* Reassemble every variable of `c` from its shard files (each verified as
 * ps_ckpt_read_shard does) and write them, in manifest order, as
 *   "safetensors": one file `out` (written to out.tmp, fsynced, renamed);
 *                  dtype F32, the shapes of the manifest, and __metadata__
 *                  naming the checkpoint (step, model, layout hash, ...)
 *                  and holding what the model is: paramserv.network (the
 *                  model file) and paramserv.normalization, JSON texts;
 *   "npy":         a directory `out` (created if missing) holding
 *                  <name>.npy per variable, NPY format 1.0, '<f4', C order,
 *                  and beside them model.json (the model file,
 *                  src/nn/MODELFILE.md) and normalization.json; for a model
 *                  with sparse tables, per table <table>.keys.npy ('<u8',
 *                  rows), <table>.values.npy ('<f4', rows x dim) and, when
 *                  its optimizer has slots, <table>.slots.npy ('<f4', rows x
 *                  nslots x dim): the rows of every shard together, by key
 *                  ascending, each file's section checked as `ckpt verify`
 *                  checks it (ps_ckpt_shard_tables); pending keys are not
 *                  rows and are not written.
 * The model file and normalization come from ps_ckpt_model: none for a
 * model of variables only, or a version 1 checkpoint of a model file.
 * `out` must not exist, or be an empty directory (npy), unless `force`:
 * then a file is replaced, a directory written into (files of the same
 * names replaced, others left).  note (NULL: not wanted) gets what was
 * written beside the arrays, or why nothing was.
 * The variables' values are exported, not their optimizer slots; the
 * safetensors file holds no sparse tables (note says so).
 * @return 0; -EEXIST (out exists, not empty), -EISDIR, -ENOTDIR (out of
 * the wrong kind), before anything is read or written; PS_EUSAGE for
 * another format, or a variable name that cannot be a file name ("npy":
 * empty, ".", "..", or containing '/') or is reserved ("safetensors":
 * "__metadata__"), or tables whose files would be another array's ("npy":
 * two tables of one name, a variable named <table>.keys), before anything
 * is written; the shard files' errors (ps_ckpt_read_shard) and their table
 * sections' (ps_ckpt_shard_tables); -errno from writing; -ENOMEM.  The
 * message names the path.  Nothing is kept
 * after the call; a failed export can leave a partial npy directory (never
 * a partial safetensors file). */
int ps_ckpt_export(const ps_ckpt *c, const char *format, const char *out, int force,
                   char *note, size_t note_len, ps_errbuf *eb);

#endif
