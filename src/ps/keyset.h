/* A keyset: the records of one of a sparse table's two sets (its rows, its
 * pending keys), found by key through an open-addressing map, kept in an
 * arena of fixed blocks, on a list from least to most recently touched;
 * and the per-keyset side of the table's walks.  Only src/ps/table.c uses
 * it: TABLE.md gives the structure and its rules. */
#ifndef PS_PS_KEYSET_H
#define PS_PS_KEYSET_H

#include <stddef.h>
#include <stdint.h>

#define PS_KS_LINKED UINT64_MAX
#define PS_KS_NONE UINT32_MAX
#define PS_KS_WALKS 4            /* walks of one table open at once */

/* Every record starts with this; a row's floats follow it. */
typedef struct ps_ks_rec {
  uint64_t key;
  uint64_t step;          /* last touch */
  uint64_t count;         /* row: updates applied; pending: occurrences */
  uint32_t prev, next;    /* the list; `next` also chains free records */
} ps_ks_rec;

/* A map slot.  The tag is the key's hash (its low 32 bits): it gives the
 * home slot without reading the record, and rules out most records that
 * are not the key without a cache miss. */
typedef struct ps_ks_slot {
  uint32_t rec;           /* PS_KS_NONE: empty */
  uint32_t tag;
} ps_ks_slot;

/* An open walk's view of one keyset (TABLE.md, "Walks"). */
typedef struct ps_ks_walk {
  uint32_t *order;        /* the records in list order when the walk began */
  uint32_t n, next;       /* order[next] is read next */
  uint32_t nrec;          /* records [0, nrec) were handed out when it began */
  uint64_t *unread;       /* bit i: record i is in order, not read, its bytes still the walk's */
  uint32_t *saved;        /* record i's bytes as the walk began: 1 + its place in bytes; 0 none */
  char *bytes;            /* the saved records, rec_bytes each */
  size_t nsaved, cap;
  int spoilt;             /* a save found no memory: the walk cannot go on */
  int all;                /* a change walk of every record */
  uint32_t *place;        /* grouped (ps_ks_walk_group): order[k]'s place in the list; else NULL */
  uint64_t *removed;      /* a change walk: the keys removed before it began */
  size_t nremoved;
} ps_ks_walk;

typedef struct ps_keyset {
  size_t rec_bytes;       /* a multiple of 8 */
  unsigned shift;         /* records per block: 1 << shift */
  char **blocks;
  uint32_t nblocks, cap_blocks;
  uint32_t used;          /* records [0, used) were handed out at least once */
  uint32_t free_head, nfree;
  uint32_t live;
  uint32_t head, tail;    /* head: least recently touched */
  ps_ks_slot *slots;      /* nslots, a power of two; NULL before the first record */
  size_t nslots;
  ps_ks_walk *walks[PS_KS_WALKS];  /* the open walks (NULL: a free place) */
  /* Changes since the last change walk began (TABLE.md, "Changes"). */
  uint64_t *changed;      /* bit i: record i was added or touched */
  size_t changed_words;
  uint32_t nchanged;      /* bits set */
  uint64_t *removed;      /* keys of the records deleted */
  size_t nremoved, cap_removed;
  int tracking;           /* a change walk began: removals are recorded */
  /* A ranked load in progress (ps_ks_add_ranked): each record's rank, and
   * the records added, not yet on the list. */
  uint64_t *ranks;        /* a ranked load's record i: its rank; PS_KS_LINKED once linked */
  size_t ranks_cap;
  uint32_t nranked;       /* records loaded ranked, not linked yet */
  uint64_t floor_step;    /* a lazy load: no touch stamps below the loaded records' newest */
  uint32_t *unlinked;
  size_t nunlinked, cap_unlinked;
  int removed_lost;       /* a removal found no memory to be recorded */
} ps_keyset;

static inline ps_ks_rec *ps_ks_at(const ps_keyset *ks, uint32_t i) {
  return (ps_ks_rec *)(ks->blocks[i >> ks->shift] + (size_t)(i & ((1u << ks->shift) - 1)) * ks->rec_bytes);
}

/* An empty keyset of records of rec_bytes (a multiple of 8, at least
 * sizeof(ps_ks_rec)); ps_ks_close frees what it holds. */
void ps_ks_init(ps_keyset *ks, size_t rec_bytes);
void ps_ks_close(ps_keyset *ks);
/* The memory it holds: its blocks (whole), the block array, the map and
 * the changes (bitmap, removed keys). */
uint64_t ps_ks_bytes(const ps_keyset *ks);
/* key's record, or PS_KS_NONE. */
uint32_t ps_ks_find(const ps_keyset *ks, uint64_t key);
/* Make room for `target` live records: the map at most 3/4 full, and
 * enough records free or in allocated blocks.  Nothing else changes, so a
 * caller reserves before it starts a change it must finish. */
int ps_ks_reserve(ps_keyset *ks, uint64_t target);
/* Record i's bytes are about to change or the record to go: each open
 * walk that has not read it yet keeps them first. */
void ps_ks_keep(ps_keyset *ks, uint32_t i);
/* Record i touched at `step`: kept for the walks, stamped, moved to the
 * list's tail. */
void ps_ks_touch(ps_keyset *ks, uint32_t i, uint64_t step);
/* A new record for `key` (reserved before), last touched at `step`
 * (placed by it, not stamped), count 0; its payload is the caller's. */
uint32_t ps_ks_add(ps_keyset *ks, uint64_t key, uint64_t step);
/* A ranked load's record for `key` (reserved before; the keyset holds no
 * linked record yet): as ps_ks_add, but off the list until
 * ps_ks_link_ranked, which places the ranked records in rank order.
 * @return its index, or PS_KS_NONE when out of memory (nothing added). */
uint32_t ps_ks_add_ranked(ps_keyset *ks, uint64_t key, uint64_t step, uint64_t rank);
/* Put the ranked records on the list, lowest rank first, and forget their
 * ranks.  @return 0 or -ENOMEM (then nothing is linked; free the keyset). */
int ps_ks_link_ranked(ps_keyset *ks);
/* Start a new interval of changes with none recorded: the keyset as it is
 * now is what a copy holds (a restore from that copy). */
void ps_ks_changes_reset(ps_keyset *ks);

/* Take record i out of the map (backward shift: no tombstones, so probe
 * lengths never grow with deletions) and the list, and free it. */
void ps_ks_del(ps_keyset *ks, uint32_t i);
/* The step a touch at `step` records: never older than the newest touch
 * in the keyset, so the list stays ordered by step (TABLE.md: stamps). */
uint64_t ps_ks_stamp(const ps_keyset *ks, uint64_t step);
/* Begin a walk of ks in its place `place` (< PS_KS_WALKS): the records in
 * list order now, each to be read as it is now.  @return 0 or -ENOMEM. */
int ps_ks_walk_begin(ps_keyset *ks, ps_ks_walk *w, int place);
/* End it: ks no longer saves records for it, and its memory is freed. */
void ps_ks_walk_end(ps_keyset *ks, ps_ks_walk *w, int place);
/* Begin a change walk in place `place`: the records added or touched since
 * the previous change walk began (every record when `all`), in list order,
 * read as ps_ks_walk_begin's are; it takes the keys deleted since then
 * (w->removed) and starts the next interval empty.  @return 0 or -ENOMEM
 * (nothing changed). */
int ps_ks_changes_begin(ps_keyset *ks, ps_ks_walk *w, int place, int all);
/* The change walk w was not stored: its records (those still live) and its
 * removed keys count as changed again; after a walk of `all`,
 * ps_ks_changes_lost says so instead.  Call it before ps_ks_walk_end.
 * @return 0 or -ENOMEM (ps_ks_changes_lost says so too). */
int ps_ks_changes_undo(ps_keyset *ks, ps_ks_walk *w);
/* Whether the changes recorded are not all of them (no change walk began
 * yet, so removals were not recorded; a removal found no memory; or a walk
 * of all was undone): the next change walk must be one of `all`. */
int ps_ks_changes_lost(const ps_keyset *ks);

/* Before its first read: regroup the walk's order by bucket (the top
 * `bits` bits of XXH3 of the key, seeded by `seed`), bucket 0 first, list
 * order within a bucket, remembering each record's place in the list.
 * @return 0 or -ENOMEM (the walk as it was). */
int ps_ks_walk_group(const ps_keyset *ks, ps_ks_walk *w, unsigned bits, uint64_t seed);
/* A key's bucket, as ps_ks_walk_group groups them. */
uint32_t ps_ks_bucket(uint64_t key, unsigned bits, uint64_t seed);

/* The next record of one keyset's walk: its saved bytes, or the live ones
 * (read now: a change after this saves nothing). */
const ps_ks_rec *ps_ks_walk_next(const ps_keyset *ks, ps_ks_walk *w);

#endif
