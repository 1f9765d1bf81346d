/* The table section of a shard's state image (PROTOCOL.md, "The state
 * image"): the one definition of its layout, with its one writer and its
 * one reader.  The shard writes and restores it (shard.c); a checkpoint's
 * verify and export walk it (recovery/tables.c).  Per table, in table
 * order: a 16-byte head (rows u64, pending keys u64), then each row as 24
 * bytes (key, count, last_step: u64 LE) followed by its dim values and each
 * optimizer slot's dim floats, then each pending key as its 24 bytes. */
#ifndef PS_PS_TSEC_H
#define PS_PS_TSEC_H

#include <stddef.h>
#include <stdint.h>

#include "paramserv/error.h"
#include "ps/table.h"

enum { PS_TSEC_HEAD = 16, PS_TSEC_ENTRY = 24 };

/* What a reader must know of a table to walk its part of the section. */
typedef struct ps_tsec_table {
  uint32_t dim;        /* floats per row */
  uint32_t nslots;     /* optimizer slots per row (ps_optim_nslots) */
  const char *name;    /* for messages ("C7"); NULL: the table's number only */
} ps_tsec_table;

/* Bytes of one row in the section: its 24 bytes, values and slots. */
uint64_t ps_tsec_row_bytes(const ps_tsec_table *t);

/* Bytes of the section of these n tables as they are now. */
uint64_t ps_tsec_bytes(ps_table *const *tables, int n);

/* Write the section of the n tables at p (ps_tsec_bytes of room, 4-byte
 * aligned), each table's entries in ps_table_iter order.  @return the end. */
uint8_t *ps_tsec_write(ps_table *const *tables, int n, uint8_t *p);

/* Its parts, for a writer that goes piece by piece (the shard's reader):
 * a table's head, and one entry of table tb (a pending key's 24 bytes, or
 * a row's with its values and slots).  @return the end. */
uint8_t *ps_tsec_put_head(uint8_t *p, uint64_t rows, uint64_t pending);
uint8_t *ps_tsec_put_entry(const ps_table *tb, const ps_table_entry *e, uint8_t *p);

/* What a walk calls: at each table's head, then for each of its entries.
 * i counts the table's entries from 0, rows first, then pending keys.  An
 * entry's values and slots point into the section (row only), valid for
 * the call.  Either may be NULL.  A callback refuses with nonzero and a
 * message in eb saying what it found and what it expected; the walk puts
 * the table and entry in front of it. */
typedef struct ps_tsec_visit {
  int (*head)(void *arg, int t, uint64_t rows, uint64_t pending, ps_errbuf *eb);
  int (*entry)(void *arg, int t, uint64_t i, const ps_table_entry *e, ps_errbuf *eb);
  void *arg;
} ps_tsec_visit;

/* Walk a section of `bytes` bytes at sec (4-byte aligned) holding the n
 * tables described by tables[0..n): every table's head, its rows with the
 * table's dim and slots, its pending keys, and nothing after the last
 * table, or, when `used` is not NULL, whatever follows (a sync shard's open
 * step: its bytes start at *used).  @return 0; PS_ECORRUPT when the section does not parse, with one
 * line in eb: "sparse table 3 (C4): ..." naming what was found and
 * expected (a section that ends inside a head, counts of rows and pending
 * keys that do not fit the bytes left, bytes past the last table); or a
 * callback's nonzero code, its message prefixed "sparse table 3 (C4),
 * entry 17: ".  The walk stops at the first refusal. */
int ps_tsec_walk(const void *sec, uint64_t bytes, const ps_tsec_table *tables, int n,
                 const ps_tsec_visit *v, uint64_t *used, ps_errbuf *eb);

/* "sparse table 3 (C4)" or "sparse table 3" into buf: how messages name a
 * table of the section. */
const char *ps_tsec_table_name(const ps_tsec_table *tables, int t, char *buf, size_t len);

#endif
