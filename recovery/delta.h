/* Incremental checkpoints of the sparse tables (FORMAT.md 2.4): a shard's
 * table section written as what changed since the checkpoint before it
 * (its base), and put back together from its base.
 *
 * A *delta section* is self-describing: u64 ntables, then per table a
 * 32-byte head (changed rows u64, changed pending keys u64, deleted keys
 * u64, dim u32, nslots u32), its changed rows (24 bytes and the floats,
 * as in a table section), its changed pending keys (24 bytes each), its
 * deleted keys (u64 each); then, in sync mode, the open step's rows as the
 * full section ends with them.  An entry is *changed* when the base's
 * section has no entry of its key in its keyset (rows, pending) or one of
 * other bytes; a key is *deleted* when the base has it in a keyset and the
 * new section has it in neither or in the other.
 *
 * Applying: every key the delta names (changed or deleted) is taken out of
 * the base's lists, which keep their order, and the changed entries follow
 * in the delta's order.  That is the new section byte for byte: an entry
 * the delta does not name was not touched since the base, a touched one
 * was last touched after every untouched one, and a table's lists are in
 * the order of the last touch (src/ps/TABLE.md, "Stamps"). */
#ifndef PS_RECOVERY_DELTA_H
#define PS_RECOVERY_DELTA_H

#include <stdint.h>

#include "paramserv/error.h"
#include "ps/tsec.h"

enum { PS_DELTA_HEAD = 32 };

/* One shard's table section as a checkpoint wrote it: per table, each
 * entry's key and a hash of its bytes, which the next checkpoint's delta
 * compares against. */
typedef struct ps_delta_index ps_delta_index;

void ps_delta_index_free(ps_delta_index *x);

/* What a delta holds. */
typedef struct ps_delta_stats {
  uint64_t entries;             /* entries in the new section */
  uint64_t changed, deleted;    /* entries written, keys deleted */
  uint64_t changed_row_bytes;   /* of the changed rows and pending keys, as a full section holds them */
} ps_delta_stats;

/* The table section `sec` (bytes long, the n tables of `tables`; with
 * `sync`, the open step's rows after them) of one shard: its index into
 * *next, and, with base not NULL, its delta against the section base
 * indexed, malloc'd into *delta (*delta_bytes long).  delta may be NULL
 * (the index only).  st may be NULL.  @return 0, PS_ECORRUPT (the section
 * does not parse: eb says where), -ENOMEM. */
int ps_delta_make(const ps_delta_index *base, const void *sec, uint64_t bytes,
                  const ps_tsec_table *tables, int n, int sync, uint8_t **delta,
                  uint64_t *delta_bytes, ps_delta_index **next, ps_delta_stats *st,
                  ps_errbuf *eb);

/* The full section from its base's full section and a delta: malloc'd into
 * *out (*out_bytes long).  @return 0, PS_ECORRUPT with one line (a delta
 * that does not parse, a base section that does not parse with the
 * delta's tables), -ENOMEM. */
int ps_delta_apply(const void *base, uint64_t base_bytes, const void *delta, uint64_t delta_bytes,
                   uint8_t **out, uint64_t *out_bytes, ps_errbuf *eb);

#endif
