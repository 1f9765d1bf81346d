/* Internal to recovery/: writing a checkpoint's shard files (FORMAT.md
 * section 2).  Reading and verifying them back is public:
 * ps_ckpt_read_shard, ps_ckpt_verify, ps_ckpt_verify_remembered and
 * ps_ckpt_read_values in recovery/checkpoint.h, implemented in shardfile.c
 * over the manifest (manifest.c) and the file-system layer (commit.c). */
#ifndef PS_RECOVERY_SHARDFILE_H
#define PS_RECOVERY_SHARDFILE_H

#include "paramserv/error.h"
#include "recovery/checkpoint.h"
#include "recovery/manifest_build.h"

/* Write o's shard files into the temporary checkpoint directory tmp,
 * shard-<i>.lz4 each, side by side on the thread pool: each filtered
 * (o->filter), LZ4-framed, hashed and fsynced, and measured into recs[i]
 * (o->layout->nshards entries).  @return 0, or the failure of the lowest
 * shard that failed (in *eb). */
int ps__ckpt_write_shards(const char *tmp, const ps_ckpt_write_opts *o, ps__ckpt_shard_rec *recs,
                          ps_errbuf *eb);

/* The checkpoint directory `path` was just committed from memory and
 * synced: ps_ckpt_verify_remembered takes it as verified while its files
 * are unchanged. */
void ps__ckpt_note_written(const char *path);

#endif
