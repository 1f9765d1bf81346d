/* Internal to recovery/: the manifest, MANIFEST.json (FORMAT.md section 4),
 * which owns ps_ckpt: parsed and validated, opened from a checkpoint
 * directory and closed, and the names its fields use.  It sits on commit.c
 * alone (the directory's names, reading a file whole); building it from
 * what a write recorded is manifest_build.h's.  The public calls
 * (ps_ckpt_parse_manifest, ps_ckpt_open, ps_ckpt_close,
 * ps_ckpt_check_layout, ps_ckpt_filter_parse and _name) are declared in
 * recovery/checkpoint.h. */
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
 * model text (at most cap - 1 bytes), and its base (an incremental one's,
 * FORMAT.md 2.4; "" for a full one) into base (PS_CKPT_NAME_MAX bytes; NULL:
 * not asked), read without parsing the rest.  Only a
 * regular file is read (a FIFO is refused, never waited on).  @return 0, or
 * PS_ECORRUPT / -errno with a message naming the file. */
int ps__ckpt_manifest_model(const char *ckpt_dir, uint64_t *layout_hash, char *base, char *model, size_t cap,
                            ps_errbuf *eb);

/* Floats per shard slice: keeps every byte count of a shard file below 2^53,
 * so that JSON numbers carry them exactly. */
#define PS_CKPT_MAX_FLOATS ((uint64_t)1 << 48)

/* Is `model` (a ps_model_spec_format text) a built-in model's?  Then its
 * name ("mlp", "cnn") into name and its mlp hidden sizes ("256,128"; ""
 * for cnn) into hidden, as ps_model_spec_parse takes them.  @return 0, or
 * -1 for another model's text. */
int ps__ckpt_builtin_of(const char *model, char *name, size_t name_cap, char *hidden,
                        size_t hidden_cap);

/* A ps_consistency as the manifest names it ("async", "sync", "ssp");
 * "unknown" out of range. */
const char *ps__ckpt_consistency_name(int consistency);

#endif
