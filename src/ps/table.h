/* A shard's sparse embedding table: 64-bit keys, one row per distinct key,
 * each row with its own optimizer slots and update count; admission by
 * count, eviction by idleness and by a row cap.  In memory only, no I/O.
 * The rules are in src/ps/TABLE.md. */
#ifndef PS_PS_TABLE_H
#define PS_PS_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "optim/optim.h"
#include "paramserv/error.h"

#define PS_TABLE_MAX_DIM 65536

/* How a row that was never pushed reads: a pure function of (seed, table
 * id, key) and this. */
typedef enum ps_table_init_kind {
  PS_TABLE_INIT_ZEROS = 0,
  PS_TABLE_INIT_NORMAL,   /* scale = stddev (mean 0) */
  PS_TABLE_INIT_UNIFORM,  /* in [-scale, scale) */
} ps_table_init_kind;

typedef struct ps_table_init {
  ps_table_init_kind kind;
  float scale;            /* > 0 and finite for normal and uniform; not read for zeros */
} ps_table_init;

/* What the table reports to its event callback, in the order it happens. */
typedef enum ps_table_event {
  PS_TABLE_ADMIT = 'a',   /* a row was created (its first gradient follows) */
  PS_TABLE_EXPIRE = 'x',  /* a row was evicted by ps_table_expire (idle_steps) */
  PS_TABLE_EVICT = 'e',   /* a row was evicted to make room (max_rows) */
} ps_table_event;

/* Called for every event, synchronously, inside the call that caused it.
 * It must not call into the table. */
typedef void ps_table_event_fn(void *arg, ps_table_event kind, uint64_t key);

typedef struct ps_table_opts {
  uint32_t dim;           /* floats per row, 1..PS_TABLE_MAX_DIM */
  ps_optim optim;         /* sgd (0 slots), momentum (1), adagrad (1), adam (2); o.lr not read */
  uint64_t seed;          /* the cluster's seed */
  uint32_t table_id;      /* which table (categorical field) */
  ps_table_init init;
  uint32_t admit_after;   /* a key becomes a row on its N-th push; 0 and 1: on the first */
  uint64_t idle_steps;    /* ps_table_expire evicts rows untouched this long; 0: never */
  uint32_t max_rows;      /* a new row past this many evicts the least recently touched; 0: no cap */
  uint32_t max_pending;   /* keys counted toward admission, at most; 0: 1048576 */
  ps_table_event_fn *on_event;  /* may be NULL */
  void *event_arg;
} ps_table_opts;

typedef struct ps_table ps_table;

/* A new, empty table.  o is copied.  @return 0 and *out, or PS_ECONFIG
 * (message in eb, naming the table and the option) for a bad option, or
 * -ENOMEM.  Free it with ps_table_free. */
int ps_table_new(const ps_table_opts *o, ps_table **out, ps_errbuf *eb);
void ps_table_free(ps_table *t);

const ps_table_opts *ps_table_options(const ps_table *t);

/* The initial values of `key`'s row (dim floats into out): what a table
 * with these options reads for a key it holds no row for.  Same result on
 * every machine. */
void ps_table_init_row(const ps_table_opts *o, uint64_t key, float *out);

/* Read n rows into out (n * dim floats, row i at out + i * dim).  A key
 * with no row reads its initial values.  Changes nothing: no row is
 * created, no occurrence counted, no row's last touch refreshed, so pulls
 * may run concurrently with each other (not with a change). */
void ps_table_pull(const ps_table *t, const uint64_t *keys, size_t n, float *out);

/* Apply one push: grads has n * dim floats, row i's gradient at
 * grads + i * dim.  The keys must be distinct (a worker sums a key's
 * gradients before it sends them).  In key order: a key with a row has its
 * gradient applied (the row's own update count is adam's t); a key without
 * one counts one occurrence and is admitted on its admit_after-th (created
 * from its initial values, then updated), or else its gradient is dropped.
 * `step` is the global step the push was made at (see TABLE.md for how it
 * stamps rows); lr the learning rate for it.
 * @return 0; or PS_EFORMAT (a key repeated: message in eb) or -ENOMEM, and
 * then nothing changed and no event was reported. */
int ps_table_push(ps_table *t, const uint64_t *keys, const float *grads, size_t n, float lr,
                  uint64_t step, ps_errbuf *eb);

/* Evict every row last touched at least idle_steps before `step` (oldest
 * first, each reported as PS_TABLE_EXPIRE), and forget the occurrence
 * counts of keys not seen for as long.  Nothing when idle_steps is 0.
 * @return the rows evicted. */
size_t ps_table_expire(ps_table *t, uint64_t step);

/* Remove `key`'s row or its pending count, reporting nothing (the caller
 * decided it: a replayed eviction, a key moved to another shard).
 * @return 1 if there was one, 0 if not. */
int ps_table_remove(ps_table *t, uint64_t key);

/* One entry of the table: a row, or a key counted toward admission. */
typedef struct ps_table_entry {
  int pending;            /* 0: a row; 1: a pending key (values and slots NULL) */
  uint64_t key;
  uint64_t count;         /* row: updates applied (adam's t); pending: occurrences seen */
  uint64_t last_step;     /* the step it was last touched at (TABLE.md: stamps) */
  const float *values;    /* row: dim floats */
  const float *slots[PS_OPTIM_MAX_SLOTS];  /* row: ps_optim_nslots of dim floats each */
} ps_table_entry;

/* Look one key up.  @return 1 and *out, or 0 when the table holds nothing
 * for it.  The pointers in *out are valid until the table next changes. */
int ps_table_get(const ps_table *t, uint64_t key, ps_table_entry *out);

/* Every entry: the rows from least to most recently touched, then the
 * pending keys in the same order.  The order depends only on the history
 * of calls, and putting the entries into an empty table in this order
 * (ps_table_put) gives a table that behaves the same from then on.  The
 * table must not change between ps_table_iter_init and the last
 * ps_table_iter_next; the pointers of each entry live as long. */
typedef struct ps_table_iter {
  int pending;
  uint32_t next;
} ps_table_iter;

void ps_table_iter_init(const ps_table *t, ps_table_iter *it);
/* @return 1 and the next entry in *out, or 0 at the end. */
int ps_table_iter_next(const ps_table *t, ps_table_iter *it, ps_table_entry *out);

/* Restore one entry exactly (values, slots, count and last_step copied),
 * replacing whatever the table holds for its key, and placed among the
 * others by last_step (after those of the same step).  Reports no
 * admission; past max_rows (or max_pending) the least recently touched
 * row is evicted and reported as on a push (a pending key forgotten).
 * @return 0; or PS_EFORMAT (eb: a row without values or slots, a pending
 * count not in 1..admit_after-1) or -ENOMEM, and then nothing changed. */
int ps_table_put(ps_table *t, const ps_table_entry *e, ps_errbuf *eb);

/* A restore's entry into a table it fills in order: as ps_table_put, but
 * the key must be new to the table (one lookup instead of a removal):
 * PS_ECORRUPT naming it when the table already holds it. */
int ps_table_load(ps_table *t, const ps_table_entry *e, ps_errbuf *eb);

/* A restore whose entries come in any order (a copy kept by key, TABLE.md
 * "Changes"), each with its rank: its place in its list when it was
 * stored, growing from least to most recently touched.  Into an empty
 * table, every entry through ps_table_load_ranked (refused as
 * ps_table_load refuses), then ps_table_link_ranked once: the table then
 * holds the lists a load in rank order would, and its changes start
 * empty, the copy holding what it holds (less what caps lowered since
 * evict, which are changes).  @return 0, or as ps_table_load; link:
 * 0 or -ENOMEM (free the table). */
int ps_table_load_ranked(ps_table *t, const ps_table_entry *e, uint64_t rank, ps_errbuf *eb);
int ps_table_link_ranked(ps_table *t);

/* A lazy restore (TABLE.md "Lazy loads"): the table serves while its
 * entries still come in from the copy, in any order.  Into an empty table
 * with no max_rows, idle_steps or admission count (nothing of it evicts:
 * the least recently touched may not be loaded yet), ps_table_lazy_begin
 * with the newest stamp of each list in the copy (rows, pending keys: no
 * touch is stamped below it); then, while the table serves, each entry
 * through ps_table_load_lazy with its rank (skipped, @return 1, when the
 * table holds its key: loaded already, or admitted since), and once every
 * one is in, ps_table_lazy_end.  A loaded entry touched before the end
 * goes to the tail as any touched entry; the end puts the others before
 * every touched one, by rank.  The table then is what a full load, then
 * the same calls, make, and its changes are the touches since the begin.
 * Walks of all wait for the end (ps_table_walk_begin gives NULL).
 * @return 0; lazy_begin -EINVAL (the table may evict, or is not empty);
 * load_lazy 1, or as ps_table_load; lazy_end 0 or -ENOMEM. */
int ps_table_lazy_begin(ps_table *t, uint64_t rows_step, uint64_t pending_step);
int ps_table_load_lazy(ps_table *t, const ps_table_entry *e, uint64_t rank, ps_errbuf *eb);
int ps_table_lazy_end(ps_table *t);
/* The newest stamp of each list (its tail's; 0 when empty): a lazy load's
 * floors. */
void ps_table_newest(const ps_table *t, uint64_t *rows_step, uint64_t *pending_step);
/* Entries loaded and not linked yet (0: none, or the end came). */
uint64_t ps_table_lazy_left(const ps_table *t);

/* Room for `rows` rows and `pending` pending keys, so that filling the
 * table to there never grows its maps on the way.  @return 0 or -ENOMEM. */
int ps_table_reserve(ps_table *t, uint64_t rows, uint64_t pending);

/* A walk: the table's entries as they were when it began (rows, then
 * pending keys, each in ps_table_iter order), read one by one while the
 * table goes on changing, without a copy of the table (TABLE.md, "Walks"):
 * an entry that changes or goes before the walk read it is saved first.
 * At most 4 walks of one table are open at once. */
typedef struct ps_table_walk ps_table_walk;

/* Begin one: NULL when 4 are open already, or out of memory. */
ps_table_walk *ps_table_walk_begin(ps_table *t);
/* Its rows and pending keys. */
void ps_table_walk_counts(const ps_table_walk *w, uint64_t *rows, uint64_t *pending);
/* @return 1 and the next entry in *out (its values and slots valid until
 * the table changes or the next call), 0 at the end, or -ENOMEM when a
 * save found no memory (the walk cannot go on: end it). */
int ps_table_walk_next(ps_table_walk *w, ps_table_entry *out);
/* Before a walk's first read: give its rows, then its pending keys,
 * bucket by bucket (ps_table_bucket with `bits`, at most 24), each bucket
 * in list order.  @return 0, -EINVAL (read already, or bits past 24) or
 * -ENOMEM (the walk unchanged). */
int ps_table_walk_group(ps_table_walk *w, unsigned bits);
/* Key's bucket of 2^bits in table t: the top bits of XXH3_64bits of the
 * key's 8 bytes (little-endian) seeded by the table id. */
uint32_t ps_table_bucket(const ps_table *t, uint64_t key, unsigned bits);
/* The place in its list (0: the least recently touched) of the entry the
 * walk gave last, as the walk began: a rank for ps_table_load_ranked. */
uint64_t ps_table_walk_place(const ps_table_walk *w);
/* Entries saved so far: what the walk costs beyond its 8 bytes a row. */
uint64_t ps_table_walk_saved(const ps_table_walk *w);
/* End it (NULL: nothing); ps_table_free ends an open one. */
void ps_table_walk_end(ps_table_walk *w);
/* Whether a walk of t is open. */
int ps_table_walking(const ps_table *t);

/* Changes (TABLE.md, "Changes"): a change walk reads, as a walk does, the
 * entries added or touched since the previous change walk began (rows,
 * then pending keys, each in ps_table_iter order; every entry when `all`),
 * and holds the keys whose row or pending key was removed in that interval
 * (evicted, expired, forgotten, admitted out of pending, or by
 * ps_table_remove: some may be held again, and the walk then has their
 * entry).  Beginning one starts the next interval.  A writer that keeps
 * a copy of the table elsewhere stores the removals, then the entries, and
 * the copy equals the table as the walk began.  It takes one of the 4
 * places of walks; end it with ps_table_walk_end.  NULL as
 * ps_table_walk_begin. */
ps_table_walk *ps_table_changes_begin(ps_table *t, int all);
/* The change walk's removed keys, of rows and of pending keys (none for a
 * walk of all); valid until the walk ends. */
void ps_table_changes_removed(const ps_table_walk *w, const uint64_t **rows, size_t *nrows,
                              const uint64_t **pending, size_t *npending);
/* The change walk was not stored: the next change walk has its entries
 * (those still held) and its removals again; after a walk of all the next
 * must be one of all (ps_table_changes_lost).  Before ps_table_walk_end.
 * @return 0 or -ENOMEM (then ps_table_changes_lost is 1). */
int ps_table_changes_undo(ps_table_walk *w);
/* Start a new interval with no changes recorded: the table as it is now
 * is what the writer's copy holds. */
void ps_table_changes_reset(ps_table *t);
/* The changes recorded so far in this interval: entries added or touched,
 * and keys removed (what the next change walk would carry, but for a walk
 * of all). */
void ps_table_changes_count(const ps_table *t, uint64_t *entries, uint64_t *removed);
/* 1 when the changes recorded are not all of them (no walk of all yet, a
 * removal found no memory, or a walk of all was undone): the next change
 * walk must be one of all. */
int ps_table_changes_lost(const ps_table *t);

typedef struct ps_table_stats {
  uint64_t rows, pending;    /* held now */
  uint64_t admitted;         /* rows created by pushes */
  uint64_t expired, evicted; /* rows evicted by expire, by max_rows */
  uint64_t forgotten;        /* pending counts dropped (max_pending, idle) */
  uint64_t dropped;          /* gradients dropped for keys not admitted yet */
  uint64_t bytes;            /* memory held by the table */
} ps_table_stats;

/* The counters are over this object's life: ps_table_put does not move them. */
ps_table_stats ps_table_get_stats(const ps_table *t);

#endif
