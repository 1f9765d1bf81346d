/* A parameter-server shard's state and its update rules, without I/O: the
 * slice of values, the optimizer slots, the version, the global step, the
 * exactly-once table and the sync-mode aggregation.  The server (server.c)
 * feeds it decoded requests. */
#ifndef PS_PS_SHARD_H
#define PS_PS_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "optim/optim.h"
#include "ps/state.h"
#include "ps/table.h"

/* Sparse tables a shard holds at most (one per categorical field). */
#define PS_SHARD_MAX_TABLES 64
/* A table's name ("C7"), with its NUL. */
#define PS_SHARD_TABLE_NAME_MAX 48

typedef struct ps_shard_opts {
  int index;                /* shard index; shard 0 keeps the global step */
  int nworkers;             /* worker indices are [0, nworkers) */
  size_t nfloats;           /* the slice's length */
  ps_optim optim;
  ps_sched sched;
  int consistency;          /* ps_consistency */
  int replicas_to_aggregate;  /* sync: gradients per step (>= 1) */
  int sync_sum;             /* sync: apply the sum of a step's pushes, not their mean */
  uint64_t last_step;       /* > 0: a push at this version or past it is STALE (the run's end) */
  /* Sparse tables (ps/table.h): this shard's part of each, the keys the
   * hash ring gives it (LAYOUT.md, section 6); their events are not
   * reported (on_event is not read).  table_lr: the rows' learning rate. */
  int ntables;
  ps_table_opts tables[PS_SHARD_MAX_TABLES];
  float table_lr[PS_SHARD_MAX_TABLES];
  /* The tables' names, for what the shard reports ("": table t is named
   * by its number). */
  char table_names[PS_SHARD_MAX_TABLES][PS_SHARD_TABLE_NAME_MAX];
} ps_shard_opts;

/* One entry of the shard's journal: a change of the state that a replay
 * must repeat to reach the same bytes.  Entries are numbered 1, 2, ... in
 * the order the shard made them; `n` is the journal count after the entry,
 * so a replay applies an entry only when n = its own count + 1 (REDIS.md
 * §4: the chain that makes a missing entry visible). */
typedef enum ps_journal_kind {
  PS_JOURNAL_PUSH = 'p',    /* a gradient applied (async, ssp) or summed (sync) */
  PS_JOURNAL_FLUSH = 'f',   /* sync: a partial step applied at the timeout */
  PS_JOURNAL_TARGET = 'r',  /* sync: the gradients a step waits for changed */
} ps_journal_kind;

typedef struct ps_journal {
  int kind;               /* ps_journal_kind */
  uint64_t n;             /* the journal count after this entry */
  uint64_t version;       /* the shard's version after it */
  uint32_t worker;        /* push: who, which incarnation, which sequence */
  uint64_t incarnation, seq;
  uint64_t step;          /* push: the global step it was computed at */
  int target;             /* target: the new count */
  const float *g;         /* push: the gradient, nfloats floats, borrowed */
  const void *sparse;     /* push: its sparse blocks (PROTOCOL.md, KV), borrowed */
  uint64_t sparse_bytes;  /* 0: none */
} ps_journal;

/* The state: opaque (shard.c defines it). */
typedef struct ps_shard ps_shard;

/* The options of shard `index` of the cluster in cfg (slice length from
 * `layout`, optimizer and schedule from [train]). */
#include "layout/layout.h"
ps_shard_opts ps_shard_opts_for(const ps_config *cfg, const ps_layout *layout, int index);

/* The sparse tables of model m (its embedding_bag layers) into o: each
 * shard holds a table of every one, for the keys the hash ring gives it;
 * the rows learn at their layer's lr, or [train] lr. */
#include "nn/model.h"
void ps_shard_opts_tables(ps_shard_opts *o, const ps_config *cfg, const ps_model *m);

/* A new state; values start as `initial` (copied) or zero when NULL, slots
 * at the optimizer's initial values.  @return it, or NULL out of memory. */
ps_shard *ps_shard_new(const ps_shard_opts *o, const float *initial);
void ps_shard_free(ps_shard *s);

/* What a shard was made with, and where it stands. */
const ps_shard_opts *ps_shard_options(const ps_shard *s);
uint64_t ps_shard_version(const ps_shard *s);
uint64_t ps_shard_global_step(const ps_shard *s);
uint64_t ps_shard_journal(const ps_shard *s);
/* The slice's values (nfloats), read-only: a ring member computes on them. */
const float *ps_shard_values(const ps_shard *s);
/* Set every value (nfloats, copied): a state made from the seed. */
void ps_shard_set_values(ps_shard *s, const float *values);

/* Pushes by outcome, over this process's life. */
typedef struct ps_shard_counts {
  uint64_t applied, duplicate, stale;
} ps_shard_counts;
ps_shard_counts ps_shard_get_counts(const ps_shard *s);
/* The newest incarnation of `worker` that pushed (0: none, or no such worker). */
uint64_t ps_shard_worker_incarnation(const ps_shard *s, uint32_t worker);
/* Sync: gradients summed into the step in progress, and how many complete it. */
int ps_shard_sync_pending(const ps_shard *s);
int ps_shard_sync_target(const ps_shard *s);

/* The result of a push. */
typedef enum ps_push_result {
  PS_SHARD_APPLIED = 0,  /* applied (async, ssp) or counted into the step (sync) */
  PS_SHARD_DUPLICATE,    /* (worker, incarnation, seq) was already applied */
  PS_SHARD_STALE,        /* sync: computed at another step; or past last_step; dropped */
  PS_SHARD_OLD_INCARNATION,  /* a newer incarnation of the worker pushed: refused */
} ps_push_result;

/* Apply one worker's gradient for the whole slice (g: nfloats floats, may
 * be unaligned: read with memcpy semantics) and for the rows of its sparse
 * blocks (`sparse`, `sparse_bytes`: KV blocks as PROTOCOL.md gives them,
 * checked by ps_shard_sparse_check; 0 bytes: none).  Exactly once: a push whose
 * seq is at most the last applied from the same (worker, incarnation) is a
 * DUPLICATE and changes nothing; a newer incarnation resets the worker's
 * sequence.  `step` is the global step the gradient was computed at; the
 * learning rate is the schedule's value at that step.  In sync mode, the
 * replicas_to_aggregate-th gradient of the current step applies their mean
 * and advances the version.  worker must be < nworkers.  On APPLIED, *out
 * (when not NULL) is the journal entry to log; its g points at `g`. */
ps_push_result ps_shard_push(ps_shard *s, uint32_t worker, uint64_t incarnation, uint64_t seq,
                             uint64_t step, const void *g, const void *sparse,
                             uint64_t sparse_bytes, ps_journal *out);

/* Do these sparse blocks (kind: PS_SPARSE_K of a PULL, PS_SPARSE_KV of a
 * PUSH; already accepted by the decoder) name only tables this shard holds,
 * each with its dim?  @return 0, or PS_ELAYOUT with one line in why. */
int ps_shard_sparse_check(const ps_shard *s, int kind, const void *sparse, uint64_t bytes,
                          char *why, size_t why_len);

/* The most bytes of sparse blocks a frame of this shard carries (a PUSH's
 * KV blocks, the largest) when each names at most `keys` keys per table
 * (a step's batch times the window: one key per field per sample). */
uint64_t ps_shard_sparse_max(const ps_shard_opts *o, uint64_t keys);

/* Sparse tables: how many, table t's dim, its rows' values for n keys into
 * out (n * dim floats; a key without a row reads its initial values; nothing
 * changes), and its figures. */
int ps_shard_ntables(const ps_shard *s);
uint32_t ps_shard_table_dim(const ps_shard *s, int t);
void ps_shard_table_pull(const ps_shard *s, int t, const uint64_t *keys, size_t n, float *out);
ps_table_stats ps_shard_table_stats(const ps_shard *s, int t);
/* Table t's name from the options ("C7"), or "" when they gave none. */
const char *ps_shard_table_name(const ps_shard *s, int t);
/* Table t, read-only (the iterator, ps_table_get): tools and tests. */
const ps_table *ps_shard_table(const ps_shard *s, int t);

/* Sync: apply the mean of the gradients gathered so far for this step, if
 * any: the timeout path, when workers are missing.  The steps after it are
 * complete with as many gradients as this one had, so the live workers go
 * on without waiting out the timeout again, until ps_shard_sync_set_target
 * (a worker is back).  @return 1 if applied, *out then the entry to log. */
int ps_shard_sync_flush(ps_shard *s, ps_journal *out);

/* Sync: wait for `target` gradients per step (1..replicas_to_aggregate).
 * @return 1 if it changed, *out then the entry to log. */
int ps_shard_sync_set_target(ps_shard *s, int target, ps_journal *out);

/* Replay one logged entry through the same rules.  @return 0 applied, 1
 * not applied because it does not follow this state (e->n is not
 * journal + 1: covered by the snapshot, or after a missing entry), or
 * PS_ECORRUPT for a push whose worker is out of range. */
int ps_shard_replay(ps_shard *s, const ps_journal *e);

/* ------------------------------------------------------------------ */
/* The state as an image (ps/state.h), for the chief's cuts and loads,  */
/* the Redis snapshot and the checkpoint.                               */
/* ------------------------------------------------------------------ */

/* The fields of an image of a fresh shard made with o (version 0, no
 * gradients summed, the configured sync target, one row per worker): the
 * shape every image this shard loads must have. */
ps_state_info ps_shard_state_shape(const ps_shard_opts *o);

/* The fields of an image of this shard's current state. */
ps_state_info ps_shard_state_info(const ps_shard *s);

/* Copy the whole state into img (ps_shard_state_info(s).image_floats
 * floats). */
void ps_shard_state_write(const ps_shard *s, float *img);

/* The state image as it is now, read piece by piece later while the shard
 * goes on changing: the same floats ps_shard_state_write would write now,
 * without a copy of the tables (their walks, TABLE.md "Walks"; the rest is
 * copied now; with 4 walks of a table open already, the whole image is
 * copied now instead).  *info: the image's.  NULL when out of memory.
 * End it before the shard is freed; while one is open the state cannot be
 * replaced (a LOAD is refused). */
typedef struct ps_shard_reader ps_shard_reader;
ps_shard_reader *ps_shard_reader_begin(ps_shard *s, ps_state_info *info);
/* The next count floats of the image into out.  @return 0; -ENOMEM (a
 * walk could not save an entry: this reader cannot go on), -EINVAL (past
 * the image's end). */
int ps_shard_reader_read(ps_shard_reader *r, float *out, uint64_t count);
void ps_shard_reader_end(ps_shard_reader *r);

/* A cut for a store that keeps the tables' rows by key (src/replica
 * REDIS.md, format 5): the image as ps_shard_reader_begin gives it but
 * with every table's head empty (0 rows, 0 pending keys: *info is that
 * image's), and each table's change walk (TABLE.md "Changes": of all its
 * entries when `all` or when its changes are lost, else those since the
 * previous cut), grouped by bucket of `bits` (ps_table_bucket).  Read the
 * image with ps_shard_reader_read, the changes with ps_shard_reader_change;
 * a cut that was not stored is undone (ps_shard_reader_undo) before its
 * end, so that the next one carries its changes.  NULL when out of memory
 * or every walk of a table is taken (nothing taken). */
ps_shard_reader *ps_shard_reader_begin_changes(ps_shard *s, ps_state_info *info, int all,
                                               unsigned bits);
/* Whether the cut is of every entry (asked, or a table's changes lost). */
int ps_shard_reader_all(const ps_shard_reader *r);
/* Table t as the cut was made: its rows and pending keys, and what its
 * change walk carries (entries changed, keys removed). */
typedef struct ps_shard_cut_counts {
  uint64_t rows, pending;
  uint64_t rows_newest, pending_newest;  /* each list's newest stamp (ps_table_newest) */
  uint64_t changed_rows, changed_pending, removed;
} ps_shard_cut_counts;
ps_shard_cut_counts ps_shard_reader_table_counts(const ps_shard_reader *r, int t);

/* One change of a cut: table `table`'s key removed (e.key only), or its
 * entry as the cut was made, with its place among the walk's entries of
 * its list (ps_table_walk_place: those changed since the previous cut
 * follow every other entry in the list, so a copy ranks them after every
 * rank it holds).  Per table, its removals by bucket, then its rows
 * by bucket, then its pending keys by bucket. */
typedef struct ps_shard_change {
  int table;
  int removed;
  uint32_t bucket;
  uint64_t place;
  ps_table_entry e;     /* its values and slots valid until the next call or a change */
} ps_shard_change;
/* @return 1 and the next change in *c, 0 at the end, -ENOMEM (the cut
 * cannot go on: undo it). */
int ps_shard_reader_change(ps_shard_reader *r, ps_shard_change *c);
/* The cut was not stored: its changes go back to the next cut.  @return 0,
 * or -ENOMEM (the next cut of that table is one of all). */
int ps_shard_reader_undo(ps_shard_reader *r);
/* About the bytes of rows the next change cut would carry: a snapshot's
 * cost, against the log it trims. */
uint64_t ps_shard_changes_bytes(const ps_shard *s);

/* Restoring from a store kept by key: after ps_shard_state_load_end
 * loaded an image with empty tables, room for table t's rows and pending
 * keys (@return 0 or -ENOMEM), each entry with its rank in any order
 * (ps_table_load_ranked: @return 0, PS_ECORRUPT with eb, -ENOMEM), then
 * the lists linked once (@return 0 or -ENOMEM). */
int ps_shard_rows_reserve(ps_shard *s, int t, uint64_t rows, uint64_t pending);
int ps_shard_row_load(ps_shard *s, int t, const ps_table_entry *e, uint64_t rank,
                      ps_errbuf *eb);
int ps_shard_rows_link(ps_shard *s);

/* A lazy restore from a store kept by key (TABLE.md "Lazy loads"): the
 * shard serves while its tables' entries come in, bucket by bucket (of
 * `bits`), or key by key on first touch.  After ps_shard_state_load_end
 * loaded an image with empty tables, ps_shard_lazy_begin with each table's
 * newest stamps (newest[t][0] rows, [1] pending keys): -EINVAL when a
 * table may evict (then load it whole), -ENOMEM.  Each entry goes in with
 * ps_shard_lazy_entry (as ps_table_load_lazy: 1 when the table holds its
 * key); ps_shard_lazy_bucket says a bucket's entries are all in; when
 * every bucket is, the tables are linked and the load ends (@return 1,
 * else 0; -ENOMEM).  ps_shard_lazy: 1 while it goes on. */
int ps_shard_lazy_begin(ps_shard *s, unsigned bits, const uint64_t (*newest)[2]);
int ps_shard_lazy_entry(ps_shard *s, int t, const ps_table_entry *e, uint64_t rank,
                        ps_errbuf *eb);
int ps_shard_lazy_bucket(ps_shard *s, uint32_t bucket);
int ps_shard_lazy(const ps_shard *s);
/* Buckets whose entries are all in, of all of them. */
void ps_shard_lazy_progress(const ps_shard *s, uint64_t *done, uint64_t *all);

/* A key a request needs that a lazy load has not brought yet. */
typedef struct ps_shard_key {
  uint32_t table, bucket;
  uint64_t key;
} ps_shard_key;
/* The keys of these sparse blocks of `kind` (a PULL's K or bag blocks, a
 * PUSH's KV blocks; checked) that the tables do not hold and whose bucket is not in
 * yet, into *out (grown: *cap entries).  @return how many (0 when none, or
 * no lazy load), or -ENOMEM. */
long ps_shard_lazy_missing(const ps_shard *s, int kind, const void *sparse, uint64_t bytes,
                           ps_shard_key **out, size_t *cap);

/* Does `info` describe an image this shard can load (ps_state_check against
 * its shape)?  @return 0, or PS_ELAYOUT with a message naming what differs. */
int ps_shard_state_check(const ps_shard *s, const ps_state_info *info, char *why,
                         size_t why_len);

/* Replace the state with the image (checked by ps_shard_state_check): values,
 * slots, accumulator, version, global step, exactly-once table and sparse
 * tables.  @return 0, or PS_ECORRUPT (a table section that does not parse:
 * eb says where) or -ENOMEM, the state then not one to serve. */
int ps_shard_state_load(ps_shard *s, const ps_state_info *info, const float *img,
                        ps_errbuf *eb);

/* The same, piece by piece, so that a large image never needs a second
 * copy in memory: floats [off, off + count) of the image go straight into
 * the state; when every piece is in (any order), ps_shard_state_load_end
 * sets the fixed fields and decodes the rows.  Until then the state is
 * not one to serve.  The pieces must lie inside info->image_floats. */
void ps_shard_state_load_piece(ps_shard *s, const ps_state_info *info, uint64_t off,
                               const void *src, uint64_t count);
int ps_shard_state_load_end(ps_shard *s, const ps_state_info *info, ps_errbuf *eb);

/* The journal count of a state loaded from a replica (the image does not
 * carry it: a checkpoint's state starts a journal of its own). */
void ps_shard_set_journal(ps_shard *s, uint64_t n);

#endif
