/* Criteo-format click logs (a label, 13 integer and 26 categorical features
 * per tab-separated line), plain or gzipped, read as a stream through a
 * bounded buffer: one worker's part of a file, batch by batch, with a
 * position it can save and seek back to.  Spec: src/data/CRITEO.md. */
#ifndef PS_DATA_CRITEO_H
#define PS_DATA_CRITEO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "data/sampler.h"
#include "paramserv/error.h"

#define PS_CRITEO_NDENSE 13   /* integer features I1..I13 */
#define PS_CRITEO_NSPARSE 26  /* categorical features C1..C26 */
#define PS_CRITEO_NFIELDS (1 + PS_CRITEO_NDENSE + PS_CRITEO_NSPARSE)

/* The longest field accepted, in bytes (Criteo's are at most 8 hex digits),
 * and so the longest line: 40 such fields, 39 tabs and a '\r', not counting
 * the '\n'. */
#define PS_CRITEO_MAX_FIELD 256
#define PS_CRITEO_MAX_LINE (PS_CRITEO_NFIELDS * (PS_CRITEO_MAX_FIELD + 1))

/* A reader of one worker's part of one file. */
typedef struct ps_criteo ps_criteo;

/* Open `path` (gzip or plain: zlib reads both) for worker `worker` of
 * `nworkers`, which takes the lines of 0-based index i with i mod nworkers
 * == worker, in the file's order, at position (0, 0).  Reads nothing yet.
 * @return 0 with *out set, or a negative code with eb (may be NULL) holding
 * one line naming the file: -errno when it cannot be opened, -EISDIR or
 * -EINVAL when it is not a regular file (each epoch re-reads it from the
 * start), -EINVAL for a worker outside [0, nworkers), -ENOMEM.  Free with
 * ps_criteo_close, which accepts NULL. */
int ps_criteo_open(ps_criteo **out, const char *path, int worker, int nworkers, ps_errbuf *eb);
void ps_criteo_close(ps_criteo *r);

/* Hand out up to `max` next samples of this worker's part: sample k's label
 * (0 or 1) in labels[k], its 13 integer features (transformed, CRITEO.md) in
 * dense[k*13 .. k*13+12], its 26 categorical keys in keys[k*26 .. k*26+25].
 * @return how many: fewer than max only at the end of an epoch, 0 only when
 * max is 0.  Once an epoch is exhausted the next call re-reads the file from
 * its start (the position becomes (e+1, 0) then, not before).  On a bad
 * line, a read error or corrupt gzip data it returns a negative code
 * (PS_EFORMAT for bad input, -EIO, -ENOMEM) with eb holding one line that
 * names the file, line, field, what was found and what was expected; none of
 * that batch is handed out (the position stays where it was) and every later
 * call returns the same error until a ps_criteo_seek.  -ENODATA when this
 * worker's part is empty (the file has fewer lines than worker + 1). */
ssize_t ps_criteo_next(ps_criteo *r, size_t max, float *labels, float *dense, uint64_t *keys,
                       ps_errbuf *eb);

/* Bags (CRITEO.md, "Bags"): from now on each categorical field of r's
 * lines holds the values between the byte `sep` (a separator), each its
 * key; empty values (and an empty field: an empty bag) hold none.  Read
 * them with ps_criteo_next_bags; -1: one value a field again. */
void ps_criteo_set_bags(ps_criteo *r, int sep);

/* A field holds at most this many values: it is at most 256 bytes, and
 * each value takes one and its separator another. */
#define PS_CRITEO_MAX_BAG (PS_CRITEO_MAX_FIELD / 2)

/* A batch's categorical keys as bags: sample k's field c (0-based) holds
 * keys[offs[k*26 + c] .. offs[k*26 + c + 1]).  Without bags every field
 * holds one key (offs[i] = i). */
typedef struct ps_criteo_keys {
  uint64_t *keys;    /* room for max * 26 keys, times PS_CRITEO_MAX_BAG for bags */
  uint32_t *offs;    /* max * 26 + 1 */
  size_t max;        /* samples a batch may have */
  int bags;          /* room for bags */
} ps_criteo_keys;

/* For batches of up to max samples, of bags when `bags` (else one key a
 * field).  @return 0 or -ENOMEM (then freed). */
int ps_criteo_keys_init(ps_criteo_keys *k, size_t max, int bags);
void ps_criteo_keys_free(ps_criteo_keys *k);

/* ps_criteo_next with the keys as bags, in out (at most out->max
 * samples), whether r reads bags or not (a reader of bags needs out with
 * their room: -EINVAL without).  ps_criteo_next refuses a reader of bags
 * (-EINVAL). */
ssize_t ps_criteo_next_bags(ps_criteo *r, size_t max, float *labels, float *dense,
                            ps_criteo_keys *out, ps_errbuf *eb);

/* (epoch, samples of this worker's part handed out in that epoch). */
ps_data_pos ps_criteo_pos(const ps_criteo *r);

/* Jump to `pos` (as saved from ps_criteo_pos, possibly by another process
 * reading the same file as the same worker of as many): the following
 * ps_criteo_next calls hand out exactly what the saved reader would have.
 * Re-reads the file from its start and skips the lines up to the position's,
 * O(pos.offset * nworkers) lines, without parsing them.  @return 0, or
 * -EINVAL (eb says so) when pos.offset exceeds this worker's part (then the
 * reader is at (0, 0)), or a read or gzip error as ps_criteo_next's (then
 * the reader keeps it: a gzip stream found corrupt stays failed).  Clears
 * an earlier error otherwise: after a bad line, seeking and reading again
 * meets the same line again. */
int ps_criteo_seek(ps_criteo *r, ps_data_pos pos, ps_errbuf *eb);

/* The number of samples (lines) in `path`, in one pass that also parses
 * every line, so that it fails on the first bad one as ps_criteo_next
 * would.  For a trainer that needs an epoch's size: worker j of M then has
 * ps_criteo_part_size(n, j, M) samples per epoch. */
int ps_criteo_count(const char *path, uint64_t *n, ps_errbuf *eb);

/* Lines i < n with i mod nworkers == worker. */
static inline uint64_t ps_criteo_part_size(uint64_t n, int worker, int nworkers) {
  return n > (uint64_t)worker ? (n - (uint64_t)worker - 1) / (uint64_t)nworkers + 1 : 0;
}

/* The key of categorical feature c (0-based: C1 is 0) of `len` raw bytes:
 * XXH3_64bits_withSeed(bytes, len, c).  A missing (empty) feature has the
 * key of zero bytes, ps_criteo_key(c, "", 0), a distinct key per feature. */
uint64_t ps_criteo_key(int c, const void *bytes, size_t len);

/* Parse one line (without its '\n'; one trailing '\r' is dropped) into a
 * label, PS_CRITEO_NDENSE dense values and PS_CRITEO_NSPARSE keys, written
 * only on success.  Pure: no I/O.  `file` and `lineno` (1-based) only name
 * the line in messages.  @return 0 or PS_EFORMAT with eb (may be NULL)
 * holding one line "<file>: line <lineno>[, field <f> (<name>)]: found ...,
 * expected ...". */
int ps_criteo_parse_line(const char *line, size_t len, const char *file, uint64_t lineno,
                         float *label, float *dense, uint64_t *keys, ps_errbuf *eb);

/* ps_criteo_parse_line with bags separated by `sep` (-1: none, one key a
 * field): field c's keys in counts[c] keys, one after another in keys (room
 * for 26 * PS_CRITEO_MAX_BAG). */
int ps_criteo_parse_bags(const char *line, size_t len, const char *file, uint64_t lineno,
                         int sep, float *label, float *dense, uint64_t *keys, uint32_t *counts,
                         ps_errbuf *eb);

#endif
