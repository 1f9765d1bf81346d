/* The checkpoint format (recovery/FORMAT.md, version 3): writing a
 * consistent cut of every shard's state into DIR/ckpt-<step>/ with a
 * crash-safe commit, reading and verifying it back, finding the newest
 * valid one, and retention.  The public face of recovery/'s checkpoints;
 * its calls are implemented in layers, each calling only those below it:
 * commit.c (the file system: names, crash-safe writes, the commit, the
 * index), manifest.c (ps_ckpt: MANIFEST.json parsed, opened) and
 * manifest_build.c (MANIFEST.json built), shardfile.c (shard files
 * written, read and verified), model.c (the model a checkpoint is of),
 * tables.c (the shard files' table sections checked and read, on
 * shardfile.c and model.c; relayout.h lays a checkpoint out again for
 * another shard count on them), checkpoint.c on them all (a write, the
 * listing, the newest valid one, retention), and chain.c on checkpoint.c
 * (incremental checkpoints written, and compacted; their delta sections:
 * delta.h).  Each section below names its file. */
#ifndef PS_RECOVERY_CHECKPOINT_H
#define PS_RECOVERY_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "data/idx.h"
#include "data/sampler.h"
#include "layout/hashring.h"
#include "layout/layout.h"
#include "nn/model.h"
#include "optim/optim.h"
#include "paramserv/error.h"
#include "paramserv/vartable.h"
#include "ps/state.h"
#include "ps/tsec.h"

/* The newest version this build writes (an incremental checkpoint; a
 * full one is PS_CKPT_FORMAT_VERSION_FULL, which older builds read); it
 * reads every version from PS_CKPT_FORMAT_VERSION_MIN up to it (FORMAT.md
 * section 9). */
#define PS_CKPT_FORMAT_VERSION 3
#define PS_CKPT_FORMAT_VERSION_FULL 2
#define PS_CKPT_FORMAT_VERSION_MIN 1

/* "ckpt-" + at least 9 digits + NUL fits. */
#define PS_CKPT_NAME_MAX 32

/* Test-only: when this environment variable names a stage of the commit
 * (shards, manifest, rename, index, retain; FORMAT.md section 5), the
 * writer kills its own process with SIGKILL at that point. */
#define PS_CKPT_CRASH_ENV "PS_CKPT_CRASH_AT"

/* The byte filter applied to a shard file before LZ4 (FORMAT.md 2.2);
 * its names are the manifest's (manifest.c). */
typedef enum ps_ckpt_filter {
  PS_CKPT_FILTER_NONE = 0,
  PS_CKPT_FILTER_SHUFFLE,  /* the 4 bytes of each float grouped plane by plane */
} ps_ckpt_filter;

/* "none" | "shuffle", exactly.  @return 0, or PS_EUSAGE leaving *out. */
int ps_ckpt_filter_parse(const char *name, ps_ckpt_filter *out);
/* A static string; "unknown" for a value outside the enum. */
const char *ps_ckpt_filter_name(ps_ckpt_filter f);

/* Who writes a checkpoint directory: the token its temporaries are named
 * with, and the fence that must pass immediately before each step readers
 * would see (FORMAT.md sections 1 and 5). */
typedef struct ps_ckpt_owner {
  uint64_t token;   /* the chief's fencing token (lease); 0: none (tests, tools) */
  /* Called right before the rename into place, before the index is
   * rewritten, and before each deletion (retention and leftovers), on the
   * writer's thread.  @return 0 to go on, or nonzero with a reason in why
   * (one line): that step and every later one are skipped.  NULL: none. */
  int (*fence)(void *arg, char *why, size_t len);
  void *fence_arg;
} ps_ckpt_owner;

/* ------------------------------------------------------------------ */
/* Writing (checkpoint.c; the shard files: shardfile.c)               */
/* ------------------------------------------------------------------ */

/* One shard's state at the cut, as the chief gathered it: its state image
 * (ps/state.h).  The pointer is borrowed: it must stay valid for the
 * duration of ps_ckpt_write only. */
typedef struct ps_ckpt_shard_state {
  size_t nfloats;          /* the slice's length */
  ps_state_info info;      /* the image's fields */
  const float *img;        /* info.image_floats floats */
  /* An incremental checkpoint (ps_ckpt_write_opts.base): the delta section
   * (recovery/delta.h) the file holds in place of the image's table
   * section; NULL otherwise. */
  const void *delta;
  uint64_t delta_bytes;    /* a multiple of 4 */
  uint64_t base_xxh64;     /* the state the delta applies to: the base's state_xxh64 */
} ps_ckpt_shard_state;

/* Everything a checkpoint records.  Borrowed pointers, valid for the call. */
typedef struct ps_ckpt_write_opts {
  uint64_t step;                  /* the global step of the cut; names the directory */
  double wall_time;               /* unix seconds; 0 = now */
  const char *cluster_id;         /* at most 63 bytes */
  const char *model;              /* ps_model_spec_format text, at most 127 bytes */
  const ps_vartable *vars;        /* the table the layout was built from */
  const ps_layout *layout;        /* its hash is recorded */
  ps_optim optim;
  int consistency;                /* ps_consistency */
  ps_ckpt_filter filter;
  const ps_ckpt_shard_state *shards;  /* layout->nshards entries, by shard index */
  int nworkers;
  const ps_data_pos *data_pos;    /* nworkers entries (NULL when nworkers is 0) */
  uint64_t global_step;
  /* What the model is (FORMAT.md 4.1 `network`, `builtin`,
   * `normalization`): its layers, NULL for a model of variables only (the
   * manifest then says null); and the normalization its inputs get, NULL
   * for none (null). */
  const ps_model_spec *network;
  const ps_data_norm *norm;
  /* An incremental checkpoint: the name of the checkpoint before it in
   * `dir`, whose state each shard's delta section applies to (FORMAT.md
   * 2.4); NULL: a full one.  ps_ckpt_chain_write sets it. */
  const char *base;
  /* Retention applied after the commit (ps_ckpt_retain). */
  int64_t max_to_keep;            /* newest checkpoints kept; 0 = all */
  double keep_every_n_hours;      /* 0 = off */
  const ps_ckpt_owner *owner;     /* NULL: token 0, no fence */
} ps_ckpt_write_opts;

/* What a write did, for logs, summaries and benchmarks. */
typedef struct ps_ckpt_write_stats {
  char name[PS_CKPT_NAME_MAX];    /* "ckpt-000000400" */
  uint64_t raw_bytes;             /* uncompressed bytes of every shard file */
  uint64_t stored_bytes;          /* compressed bytes of every shard file */
  double compress_s;              /* filtering, compressing, hashing and writing the files */
  double sync_s;                  /* fsyncs, renames and the index */
  double total_s;
  /* ps_ckpt_chain_write: an incremental checkpoint (on `base`), and over
   * every shard's tables the entries, those written as changed (and their
   * bytes as a full section holds them) and the keys deleted. */
  int incremental;
  char base[PS_CKPT_NAME_MAX];
  uint64_t entries, changed, changed_bytes, deleted;
  uint64_t delta_bytes;           /* the delta sections' (raw: part of raw_bytes) */
} ps_ckpt_write_stats;

/* Write the checkpoint o->step into `dir` (created if missing, with its
 * parents) and commit it (FORMAT.md section 5): every file into
 * DIR/.tmp-ckpt-<step>-<token>-<pid>/ (o->owner's token), fsync each,
 * fsync that directory, then, if o->owner's fence passes, rename it
 * to DIR/ckpt-<step> (an existing ckpt-<step> is swapped out atomically and
 * removed), fsync DIR; then retention protecting the new checkpoint
 * (ps_ckpt_retain), which rewrites the index.  A crash at any point leaves
 * the previous checkpoints and possibly the new one, complete; the index
 * never names a missing directory.  Meant for one writer per directory (the
 * chief's lease); it may run on any thread.
 * @return 0 once committed (a failure to rewrite the index or to prune after
 * that is logged as a warning: the checkpoint stands, and find_latest finds
 * it unlisted); PS_EUSAGE (inconsistent opts: shard sizes that differ from
 * the layout, nslots that differ from the optimizer, too-long strings);
 * -errno (a file system step failed); -ENOMEM; PS_EFENCED (the fence
 * refused the rename: nothing was committed).  On error the message in eb
 * names the step and the path, one error line is logged, the temporary
 * directory is removed and the directory holds what it held before.
 * `st` may be NULL; nothing the call borrowed is kept. */
int ps_ckpt_write(const char *dir, const ps_ckpt_write_opts *o, ps_ckpt_write_stats *st,
                  ps_errbuf *eb);

/* Incremental checkpoints (FORMAT.md 2.4; chain.c): a writer that keeps, between
 * its checkpoints, an index of each shard's table section as it last wrote
 * it (per entry its key and a hash of its bytes), and writes the next one
 * as what changed since (recovery/delta.h), a full one every full_every
 * (1: always full).  tables: the model's tables as the sections hold them
 * (dim and optimizer slots, in table order); sync: the sections end with
 * the open step's rows.  @return 0, PS_EUSAGE (full_every < 1, too many
 * tables), -ENOMEM. */
typedef struct ps_ckpt_chain ps_ckpt_chain;
int ps_ckpt_chain_new(int full_every, const ps_tsec_table *tables, int ntables, int sync,
                      ps_ckpt_chain **out);
void ps_ckpt_chain_free(ps_ckpt_chain *ch);

/* ps_ckpt_write of o (o->base ignored), incremental on the chain's last
 * checkpoint when there is one (written by this chain, of as many shards,
 * an older step, its manifest still in `dir`) and fewer than full_every -
 * 1 incremental ones follow the last full one; a model without tables is
 * always written whole.  Each shard's section is indexed either way; on
 * success the chain moves on to this checkpoint, on failure it is left as
 * it was.  st (may be NULL) gets ps_ckpt_write's figures and the delta's.
 * @return as ps_ckpt_write, or PS_ECORRUPT (a section that does not parse
 * with the chain's tables). */
int ps_ckpt_chain_write(ps_ckpt_chain *ch, const char *dir, const ps_ckpt_write_opts *o,
                        ps_ckpt_write_stats *st, ps_errbuf *eb);

/* ------------------------------------------------------------------ */
/* Reading: the manifest (manifest.c), the model it is of (model.c),  */
/* the shard files (shardfile.c)                                      */
/* ------------------------------------------------------------------ */

/* One contiguous run of a variable held by one shard (a layout part). */
typedef struct ps_ckpt_part {
  int shard;
  size_t start;      /* first element of the variable */
  size_t count;
  size_t shard_off;  /* offset in the shard's values, in floats */
} ps_ckpt_part;

typedef struct ps_ckpt_var {
  char name[PS_VAR_NAME_MAX];
  int ndim;
  uint32_t shape[PS_VAR_MAX_DIMS];
  size_t offset;           /* in the full arena, in floats */
  size_t count;            /* product of shape */
  int nparts;
  ps_ckpt_part *parts;     /* by start; owned by the ps_ckpt */
} ps_ckpt_var;

typedef struct ps_ckpt_shard {
  int index;
  char file[PS_CKPT_NAME_MAX];   /* "shard-<index>.lz4" */
  size_t floats;                 /* the slice's length */
  ps_state_info info;            /* its fixed fields (image_floats for `floats`) */
  ps_once *once;                 /* info.nonce rows, owned by the ps_ckpt */
  uint64_t compressed_size, uncompressed_size, xxh64;
  uint64_t delta_floats;         /* an incremental checkpoint: its file's delta section, */
  uint64_t base_xxh64;           /* the state of its base's shard it applies to */
  /* XXH64 of the shard's state, its segments and whole table section (a
   * full checkpoint's is its xxh64; a chain's, the state put together). */
  uint64_t state_xxh64;
} ps_ckpt_shard;

/* A parsed manifest.  Every array is owned; free with ps_ckpt_close. */
typedef struct ps_ckpt {
  char *path;                    /* the checkpoint directory as opened; NULL when parsed from memory */
  char name[PS_CKPT_NAME_MAX];   /* its last component, e.g. "ckpt-000000400" ("" from memory) */
  int format_version;
  char base[PS_CKPT_NAME_MAX];   /* an incremental checkpoint's base (version 3); "" full */
  uint64_t step, global_step;
  double wall_time;
  char cluster_id[64];
  uint64_t layout_hash;
  char model[128];
  /* What the model is: version 2 manifests say it (FORMAT.md 4.1); for a
   * version 1 manifest has_network and has_norm are 0 (ps_ckpt_model
   * derives what it can). */
  int has_network;               /* `network` is not null */
  ps_model_spec network;         /* its layers, checked; desc is `model` */
  char builtin[8];               /* `builtin.name`: "mlp", "cnn", or "" when null */
  char builtin_hidden[128];      /* `builtin.hidden` ("256,128"), "" for none */
  int has_norm;                  /* `normalization` is not null */
  ps_data_norm norm;
  ps_optim optim;
  int consistency;               /* ps_consistency */
  ps_ckpt_filter filter;
  int nvars;
  ps_ckpt_var *vars;             /* in arena order */
  size_t total_floats;           /* the full arena: sum of the variables' counts */
  int nshards;
  ps_ckpt_shard *shards;         /* by index */
  int nworkers;
  ps_data_pos *data_pos;         /* nworkers entries */
} ps_ckpt;

/* Parse and validate MANIFEST.json text (len bytes, no NUL needed) into
 * *out.  Every field of FORMAT.md section 4 must be present and well typed,
 * and the variables' parts must tile both the variables and the shards.
 * @return 0; PS_EVERSION for a format_version outside
 * [PS_CKPT_FORMAT_VERSION_MIN, PS_CKPT_FORMAT_VERSION] (the message names
 * both); PS_ECORRUPT for anything
 * else, the message naming the field ("shards[1].xxh64: expected 16 hex
 * digits"); -ENOMEM.  On error *out is left empty (ps_ckpt_close on it is
 * harmless).  `json` is not kept. */
int ps_ckpt_parse_manifest(const char *json, size_t len, ps_ckpt *out, ps_errbuf *eb);

/* Read DIR/ckpt-<step>/MANIFEST.json (`path` is the checkpoint directory)
 * and parse it.  Checks nothing of the shard files (ps_ckpt_verify does).
 * @return as ps_ckpt_parse_manifest, or -errno when the manifest cannot be
 * read; messages start with the manifest's path.  Free with ps_ckpt_close. */
int ps_ckpt_open(ps_ckpt *c, const char *path, ps_errbuf *eb);

/* Free everything *c owns and leave it empty; NULL does nothing. */
void ps_ckpt_close(ps_ckpt *c);

/* Build the model checkpoint c is of (free with ps_model_close) and give
 * the normalization its inputs get: from the manifest's `network` and
 * `normalization` (version 2); for a version 1 manifest, from a built-in's
 * `model` text ("mlp 784-256-128-10") or else from model_file, and the one
 * normalization version 1 writers applied (PS_DATA_NORM).  model_file
 * (NULL: none) given for a checkpoint that holds its network must be that
 * network.  The model's variables must be the manifest's (names, shapes,
 * order).  @return 0, or PS_EUSAGE / -errno with one line naming the
 * checkpoint: no layers (a variables model), a version 1 checkpoint of a
 * model file without model_file, another model, other variables. */
int ps_ckpt_model(const ps_ckpt *c, const char *model_file, ps_model *m, ps_data_norm *norm,
                  ps_errbuf *eb);

/* Are t's variables the checkpoint's: the same names and shapes, in the
 * same order?  @return 0, or PS_EUSAGE with one line naming the first that
 * differs. */
int ps_ckpt_check_vars(const ps_ckpt *c, const ps_vartable *t, ps_errbuf *eb);

/* Is this checkpoint of the running cluster's model and placement?
 * @return 0, or PS_ELAYOUT with a message naming both sides (model text and
 * layout hash of the checkpoint and of the cluster). */
int ps_ckpt_check_layout(const ps_ckpt *c, uint64_t layout_hash, const char *model,
                         ps_errbuf *eb);

/* One shard file, decompressed and unfiltered: its values, then each slot,
 * then the accumulator, each `floats` long, in one owned buffer. */
typedef struct ps_ckpt_shard_data {
  float *buf;                            /* owned; the pointers below point into it */
  size_t nfloats;                        /* floats in buf */
  float *values;
  float *slots[PS_OPTIM_MAX_SLOTS];      /* NULL past nslots */
  float *accum;                          /* NULL without has_accum */
  float *tables;                         /* the sparse tables' section (FORMAT.md 2.1) */
  size_t table_bytes;                    /* its bytes: 0 for a model without tables */
} ps_ckpt_shard_data;

/* Read shard i's file: its size must be the manifest's compressed size, the
 * LZ4 frame must decode (content checksum included) to exactly the
 * uncompressed size, and the XXH64 of the unfiltered bytes must be the
 * manifest's.  @return 0, -errno (cannot open or read, e.g. -ENOENT for a
 * missing file), PS_ECORRUPT ("size mismatch", "lz4 frame: ...",
 * "xxh64 mismatch (file X, manifest Y)"), -ENOMEM, -EINVAL (i out of
 * range); messages start with the file's path.  On success *out owns a
 * buffer the caller frees with ps_ckpt_shard_data_close; on error *out is
 * empty. */
int ps_ckpt_read_shard(const ps_ckpt *c, int i, ps_ckpt_shard_data *out, ps_errbuf *eb);

/* Read shard i's state as ps_ckpt_read_shard does, into dst: room for its
 * segments and its `table_floats` (a full checkpoint's uncompressed size),
 * which is the shard's state image without its exactly-once rows
 * (ps/state.h).  An incremental checkpoint's (a `base`) is put together
 * from its base's, read the same way, and its delta section, every file of
 * the chain verified; an error names the checkpoint whose base failed.  On
 * error dst holds garbage. */
int ps_ckpt_read_shard_into(const ps_ckpt *c, int i, float *dst, ps_errbuf *eb);

/* Free d->buf and zero *d; NULL does nothing. */
void ps_ckpt_shard_data_close(ps_ckpt_shard_data *d);

/* Reassemble the full arena of values (c->total_floats floats, caller
 * owned) from every shard file, reading each as ps_ckpt_read_shard does.
 * @return 0 or its errors. */
int ps_ckpt_read_values(const ps_ckpt *c, float *arena, ps_errbuf *eb);

/* ps_ckpt_read_values, handing each shard file's data to fn (NULL: none)
 * as it is read, before it is freed: a reader that needs more of the files
 * (the export: the table sections) reads each once.  fn's nonzero return
 * (with its message in eb) stops it. */
typedef int ps_ckpt_shard_fn(void *arg, int i, const ps_ckpt_shard_data *d, ps_errbuf *eb);
int ps_ckpt_read_values_each(const ps_ckpt *c, float *arena, ps_ckpt_shard_fn *fn, void *arg,
                             ps_errbuf *eb);

/* Check every shard file (size, LZ4 frame and its content checksum, size
 * after decompression, XXH64).  @return 0 or the first file's error, as
 * ps_ckpt_read_shard. */
int ps_ckpt_verify(const ps_ckpt *c, ps_errbuf *eb);

/* ps_ckpt_verify, remembered by this process: a checkpoint whose files (the
 * manifest and every shard file: device, inode, size, modification time)
 * are unchanged since this process verified it or wrote it is not read
 * again, and its earlier answer (0, or the error and its message) is given.
 * *fresh (may be NULL) is 1 when it was read now.  A bit flipped by the
 * disk under unchanged metadata is not seen, nor, for an incremental
 * checkpoint, a change to its chain's files after it was asked (retention,
 * its one user, keeps a kept checkpoint's chain whatever it finds); restores
 * use ps_ckpt_verify. */
int ps_ckpt_verify_remembered(const ps_ckpt *c, ps_errbuf *eb, int *fresh);

/* Fold incremental checkpoint c's chain into a full checkpoint of the same
 * step, name and time, written in its place (ps_ckpt_write's commit, no
 * retention): every shard's state put together (and verified) as a restore
 * reads it.  Those that build on c still do: they name its state, which is
 * the same.  Meant for a directory no chief is writing into at the same
 * time.  @return 0; PS_EUSAGE (c is full already); ps_ckpt_read_shard's,
 * ps_ckpt_model's and ps_ckpt_write's errors. */
int ps_ckpt_compact(const ps_ckpt *c, ps_ckpt_write_stats *st, ps_errbuf *eb);

/* ------------------------------------------------------------------ */
/* The sparse tables: each shard file's table section (tables.c)      */
/* ------------------------------------------------------------------ */

/* What reading a checkpoint's table sections takes: each table of its
 * model as the section holds it (dim, optimizer slots, name), and the hash
 * ring of its shards, which says which shard holds each key. */
typedef struct ps_ckpt_tables {
  int ntables;
  ps_tsec_table t[PS_MODEL_MAX_TABLES];          /* names point into `names` */
  char names[PS_MODEL_MAX_TABLES][PS_MODEL_NAME_MAX + 8];
  ps_hashring ring;                              /* c->nshards shards, PS_HASHRING_VNODES */
} ps_ckpt_tables;

/* The tables of c's model, from its network (ps_ckpt_model).  A checkpoint
 * none of whose shard files holds a table section needs no model: 0
 * tables.  @return 0; PS_ECORRUPT for sections in a checkpoint whose
 * manifest has no network (null: no tables); ps_ckpt_model's errors;
 * -ENOMEM.  Free with ps_ckpt_tables_close (harmless on a failed open). */
int ps_ckpt_tables_open(const ps_ckpt *c, ps_ckpt_tables *tt, ps_errbuf *eb);
void ps_ckpt_tables_close(ps_ckpt_tables *tt);

/* Called for each row (not a pending key) of a checked section, in section
 * order; its pointers are valid for the call.  @return 0, or nonzero with a
 * message in eb to stop. */
typedef int ps_ckpt_row_fn(void *arg, int table, const ps_table_entry *row, ps_errbuf *eb);

/* Check shard i's table section (d: its file as ps_ckpt_read_shard read
 * it) entry by entry: it parses to its end with every table's dim and
 * slots (ps_tsec_walk); every key, row or pending, appears once in its
 * table; every key is shard i's by the hash ring of c->nshards shards
 * (LAYOUT.md section 6).  A section of 0 bytes is empty tables, as a shard
 * loads it.  fn (NULL: none) gets each row.  @return 0, PS_ECORRUPT with
 * one line: "<checkpoint>/shard-1.lz4: sparse table 2 (C3), entry 17: key
 * 9 is shard 0's by the hash ring of 2 shards, expected shard 1's", -ENOMEM,
 * or fn's code. */
int ps_ckpt_shard_tables(const ps_ckpt *c, const ps_ckpt_tables *tt, int i,
                         const ps_ckpt_shard_data *d, ps_ckpt_row_fn *fn, void *arg,
                         ps_errbuf *eb);

/* What a check of every section found. */
typedef struct ps_ckpt_tables_stats {
  int ntables;
  uint64_t rows, pending;   /* over every table and shard */
} ps_ckpt_tables_stats;

/* ps_ckpt_verify, and every shard's table section checked as
 * ps_ckpt_shard_tables does, each file read once: what `paramserv ckpt
 * verify` runs.  st may be NULL.  @return 0, or the first error of either. */
int ps_ckpt_verify_tables(const ps_ckpt *c, ps_ckpt_tables_stats *st, ps_errbuf *eb);

/* ------------------------------------------------------------------ */
/* The directory: listing, fallback, retention (checkpoint.c); the    */
/* probe and setting aside (commit.c)                                 */
/* ------------------------------------------------------------------ */

/* One checkpoint of a directory. */
typedef struct ps_ckpt_entry {
  char name[PS_CKPT_NAME_MAX];
  uint64_t step;
  double time;       /* unix seconds: the index's, else the manifest's, else the directory's mtime */
  int in_index;      /* listed in DIR/checkpoint */
  int on_disk;       /* its directory exists */
  int latest;        /* the index's latest */
} ps_ckpt_entry;

/* Every checkpoint the index lists or the directory holds, by step
 * ascending.  A missing `dir` has none.  @return the count (>= 0) with
 * *out a malloc'd array the caller frees with free() (NULL when 0), or
 * -errno / -ENOMEM with a message. */
int ps_ckpt_list(const char *dir, ps_ckpt_entry **out, ps_errbuf *eb);

/* Find the newest valid checkpoint in `dir`: candidates are the index's
 * entries and any ckpt-* directory it does not list, newest step first;
 * each is opened, checked against (layout_hash, model) unless model is NULL,
 * and verified (ps_ckpt_verify).  A candidate that fails gets one warning
 * line (ps_log) naming it, the reason and "falling back to ckpt-<prev>" (or
 * "no older checkpoint").  @return 1 with the newest valid one in *out
 * (free with ps_ckpt_close), 0 when there is none (missing dir included;
 * *out empty), or -errno when the directory cannot be read. */
int ps_ckpt_find_latest(const char *dir, uint64_t layout_hash, const char *model, ps_ckpt *out,
                        ps_errbuf *eb);

/* The candidates a search skipped (on disk, but another model's, damaged
 * or unreadable): all of them newer than the one it found, if any. */
typedef struct ps_ckpt_skipped {
  int n;
  uint64_t below;                    /* found: its step (the skipped are above it) */
  char newest[PS_CKPT_NAME_MAX];     /* the newest skipped, and why */
  char why[sizeof(((ps_errbuf *)0)->msg)];
} ps_ckpt_skipped;

/* A candidate's content check: 0 accepts it, anything else rejects it with
 * the reason in *why. */
typedef int (*ps_ckpt_accept_fn)(const ps_ckpt *c, void *arg, ps_errbuf *why);

/* ps_ckpt_find_latest with `accept` in place of ps_ckpt_verify and of its
 * layout check: a candidate of another `model` text is passed over (with
 * PS_ELAYOUT naming both sides, as ps_ckpt_check_layout), one of this
 * model is accept's to judge, whatever its layout (the chief lays one of
 * another shard count out again: relayout.h).  A reader that must
 * decompress the shard files anyway verifies them as it does, and keeps
 * what it read. */
int ps_ckpt_find_latest_with(const char *dir, uint64_t layout_hash, const char *model,
                             ps_ckpt_accept_fn accept, void *arg, ps_ckpt *out,
                             ps_ckpt_skipped *skipped, ps_errbuf *eb);

/* Whether this process can write checkpoints into dir: created if
 * missing (with its parents), then a probe file created, written, synced
 * and removed.  @return 0, or -errno with a message naming the path. */
int ps_ckpt_dir_writable(const char *dir, ps_errbuf *eb);

/* Move checkpoint `name` out of dir's way into DIR/unusable/ (created;
 * an existing one of that name gets a numbered suffix), never deleting
 * anything; the index forgets it at the next retention.  @return 0, or
 * -errno with a message. */
int ps_ckpt_set_aside(const char *dir, const char *name, ps_errbuf *eb);

/* Retention: keep the max_to_keep newest valid checkpoints (by step, then
 * time; 0 = all; valid: ps_ckpt_verify_remembered accepts it), plus, with keep_every_n_hours > 0, the oldest checkpoint of each
 * window [k * h, (k + 1) * h) of unix time, and always `protect` (a
 * checkpoint name or NULL: the one the chief restored from).  With `model`
 * not NULL only the checkpoints of that model count, whatever their layout
 * (one of another shard count restores into this cluster): one whose
 * manifest names another model, or cannot be read, is never deleted, never
 * counts as newer and is never the index's latest (NULL: every checkpoint
 * counts).  A damaged one (its files do not read back) is never deleted
 * and never counts as newer either; it is said once per process.  The index is rewritten to list
 * exactly the kept ones (latest: the newest) before the others are deleted;
 * temporary entries (.tmp-ckpt-*, .old-ckpt-*, checkpoint.tmp-*) are
 * removed when they are `owner`'s own or of an older token (FORMAT.md
 * section 6; NULL owner: token 0).  owner's fence runs before the leftovers
 * are removed, before the index is rewritten and before each deletion.
 * Must not run while a ps_ckpt_write of the same owner on the same
 * directory is in progress.  @return 0, PS_EFENCED (the fence refused: what
 * was not done yet is left as it was), or -errno with a message (the first
 * failure; it goes on with the rest). */
int ps_ckpt_retain(const char *dir, const char *model, int64_t max_to_keep,
                   double keep_every_n_hours, const char *protect, const ps_ckpt_owner *owner,
                   ps_errbuf *eb);

#endif
