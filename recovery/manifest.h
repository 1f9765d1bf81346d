/* Internal to recovery/: the manifest, MANIFEST.json (FORMAT.md section 4),
 * which owns ps_ckpt: built from what a write recorded, parsed and
 * validated, opened from a checkpoint directory and closed, its filter
 * names.  It sits on commit.c alone (the directory's names, reading a
 * file whole).  The public calls (ps_ckpt_parse_manifest, ps_ckpt_open,
 * ps_ckpt_close, ps_ckpt_check_layout, ps_ckpt_filter_parse and _name) are
 * declared in recovery/checkpoint.h. */
#ifndef PS_RECOVERY_MANIFEST_H
#define PS_RECOVERY_MANIFEST_H

#include <stdint.h>

#include "recovery/checkpoint.h"

#define MANIFEST_FILE "MANIFEST.json"
/* A manifest larger than this is refused before it is read. */
#define MANIFEST_MAX ((size_t)256 << 20)

/* Open checkpoint directory ckpt_dir's manifest for reading: its path into
 * mpath, its size into *size.  Only a regular file of at most MANIFEST_MAX
 * bytes is opened (O_NONBLOCK: a FIFO is refused, never waited on).
 * @return the descriptor, or PS_ECORRUPT / -errno with a message naming it. */
int ps__ckpt_manifest_fd(const char *ckpt_dir, char *mpath, size_t cap, size_t *size,
                         ps_errbuf *eb);

/* The model a checkpoint directory's manifest names: its layout hash and
 * model text (at most cap - 1 bytes), read without parsing the rest.  Only a
 * regular file is read (a FIFO is refused, never waited on).  @return 0, or
 * PS_ECORRUPT / -errno with a message naming the file. */
int ps__ckpt_manifest_model(const char *ckpt_dir, uint64_t *layout_hash, char *model, size_t cap,
                            ps_errbuf *eb);

/* Floats per shard slice: keeps every byte count of a shard file below 2^53,
 * so that JSON numbers carry them exactly. */
#define PS_CKPT_MAX_FLOATS ((uint64_t)1 << 48)

/* What writing one shard file measured, for its manifest entry. */
typedef struct ps__ckpt_shard_rec {
  uint64_t raw;     /* uncompressed bytes */
  uint64_t stored;  /* bytes of the LZ4 frame */
  uint64_t xxh64;   /* of the unfiltered bytes */
} ps__ckpt_shard_rec;

/* The manifest of the checkpoint `o` describes, its shard files measured by
 * recs (o->layout->nshards entries), written at unix time `wall`.
 * @return NUL-terminated JSON text the caller frees with free(), or NULL
 * when out of memory.  Nothing borrowed is kept. */
char *ps__ckpt_manifest_build(const ps_ckpt_write_opts *o, const ps__ckpt_shard_rec *recs,
                              double wall);

/* Is `model` (a ps_model_spec_format text) a built-in model's?  Then its
 * name ("mlp", "cnn") into name and its mlp hidden sizes ("256,128"; ""
 * for cnn) into hidden, as ps_model_spec_parse takes them.  @return 0, or
 * -1 for another model's text. */
int ps__ckpt_builtin_of(const char *model, char *name, size_t name_cap, char *hidden,
                        size_t hidden_cap);

/* A normalization as the manifest writes it, {"divide", "mean", "std"},
 * then "comment" when not NULL; indented by `indent` spaces or on one line
 * (0).  @return text to free(), or NULL when out of memory. */
char *ps__ckpt_norm_text(const ps_data_norm *n, const char *comment, int indent);

#endif
