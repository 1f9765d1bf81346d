/* A shard's state as one image: the one definition of its layout, shared
 * by the shard (ps/shard.c), the wire (CUT replies and LOADs, proto.h), the
 * Redis snapshot (replica/) and the checkpoint (recovery/).
 *
 * An image of a slice of n floats is, as floats: the values, the nslots
 * optimizer slots, the sync accumulator when has_accum, each n long, then
 * `nonce` exactly-once rows of 16 bytes (incarnation, last sequence;
 * little-endian u64), 4 floats' room each, then `table_floats` floats of
 * the shard's sparse tables (their rows and pending keys: ps/tsec.h
 * writes and reads that section, PROTOCOL.md "The state image" gives its
 * layout).  The fixed fields travel beside it in a ps_state_info. */
#ifndef PS_PS_STATE_H
#define PS_PS_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "optim/optim.h"

/* Per worker: its newest incarnation and the last sequence applied from it. */
typedef struct ps_once {
  uint64_t incarnation;
  uint64_t last_seq;
} ps_once;

/* The fixed fields of an image, in wire order: the one list from which the
 * struct below, the wire block (CUT_REPLY and LOAD, src/proto), the Redis
 * meta hash (src/replica snapshot.c and restore.c), the checkpoint
 * manifest's shard objects (recovery/manifest*.c) and what a restore
 * carries (recovery/plan.c) are all made.  X(type, name, max, role):
 *   type  uint64_t or uint32_t: its width on the wire (little-endian); in a
 *         manifest a uint64_t is a decimal string, a uint32_t a number;
 *   max   the largest value a decoder accepts (max 1: a flag, true or false
 *         in a manifest);
 *   role  PROGRESS: what the shard has done, carried by a restore into the
 *         restoring cluster's shape; SHAPE: must equal that shape; DERIVED:
 *         shape a manifest does not store (it follows from the slice's
 *         length and the `once` rows).
 * The Redis hash field and the manifest key are the name.  Adding a field is
 * its line here (and its lines in PROTOCOL.md, REDIS.md and FORMAT.md). */
#define PS_STATE_FIELDS(X)                                                                 \
  X(uint64_t, version, UINT64_MAX, PROGRESS)        /* updates applied to the slice */       \
  X(uint64_t, global_step, UINT64_MAX, PROGRESS)    /* as the shard knows it */              \
  X(uint64_t, image_floats, UINT64_MAX, DERIVED)    /* ps_state_floats(n, nslots, ...) */    \
  X(uint32_t, nslots, PS_OPTIM_MAX_SLOTS, SHAPE)    /* optimizer slots */                    \
  X(uint32_t, has_accum, 1, SHAPE)                  /* the sync accumulator: 0 or 1 */       \
  X(uint32_t, accum_count, UINT32_MAX, PROGRESS)    /* sync: gradients summed into it */     \
  X(uint32_t, target, UINT32_MAX, PROGRESS)         /* sync: gradients that complete a step  \
                                                       (0: the config's) */                  \
  X(uint32_t, nonce, UINT32_MAX, DERIVED)           /* exactly-once rows */                  \
  X(uint64_t, table_floats, UINT64_MAX, DERIVED)    /* the sparse tables' section */

typedef struct ps_state_info {
#define PS_STATE_MEMBER_(type, name, max, role) type name;
  PS_STATE_FIELDS(PS_STATE_MEMBER_)
#undef PS_STATE_MEMBER_
} ps_state_info;

typedef enum ps_state_role { PS_STATE_PROGRESS, PS_STATE_SHAPE, PS_STATE_DERIVED } ps_state_role;

/* One field of the list, for the codecs that walk it. */
typedef struct ps_state_field {
  const char *name;
  size_t offset;        /* in ps_state_info */
  unsigned width;       /* bytes: 4 or 8 */
  uint64_t max;
  ps_state_role role;
} ps_state_field;

#define PS_STATE_ONE_(type, name, max, role) +1
#define PS_STATE_BYTES_(type, name, max, role) +sizeof(type)
enum {
  PS_STATE_NFIELDS = 0 PS_STATE_FIELDS(PS_STATE_ONE_),
  /* The wire block: the fields in order, zero padding to a multiple of 16. */
  PS_STATE_WIRE_USED = 0 PS_STATE_FIELDS(PS_STATE_BYTES_),
  PS_STATE_WIRE_SIZE = (PS_STATE_WIRE_USED + 15) / 16 * 16,
};
#undef PS_STATE_ONE_
#undef PS_STATE_BYTES_

extern const ps_state_field ps_state_fields[PS_STATE_NFIELDS];

/* Field f of in. */
uint64_t ps_state_get(const ps_state_info *in, const ps_state_field *f);

/* Set field f of in to v.  @return 0, or -1 when v is over f->max (in unchanged). */
int ps_state_set(ps_state_info *in, const ps_state_field *f, uint64_t v);

/* @return NULL, or in's first field over its max. */
const ps_state_field *ps_state_over(const ps_state_info *in);

/* The wire block: PS_STATE_WIRE_SIZE bytes at p, padding zero. */
void ps_state_wire_put(uint8_t *p, const ps_state_info *in);

/* Read the wire block at p (its padding is the caller's to check).
 * @return NULL, or the first field over its max, its value in *found (in
 * is then partly set). */
const ps_state_field *ps_state_wire_get(const uint8_t *p, ps_state_info *in, uint64_t *found);

/* Carry from's PROGRESS fields into in, an image's shape. */
void ps_state_carry(ps_state_info *in, const ps_state_info *from);

/* Floats of an image with these counts and no sparse tables. */
uint64_t ps_state_floats(size_t n, uint32_t nslots, uint32_t has_accum, uint32_t nonce);

/* Floats of the image `in` describes for n-float segments: the above plus
 * its table section. */
uint64_t ps_state_image_floats(const ps_state_info *in, size_t n);

/* Where the table section starts: floats after the exactly-once rows. */
static inline uint64_t ps_state_tables_at(const ps_state_info *in, size_t n) {
  return ps_state_floats(n, in->nslots, in->has_accum, in->nonce);
}

/* Segments of n floats at the image's start: values, slots, accumulator. */
static inline uint32_t ps_state_segments(const ps_state_info *in) {
  return 1 + in->nslots + in->has_accum;
}

/* Segment k of an image of n-float segments: 0 the values, 1..nslots the
 * slots, nslots + 1 the accumulator. */
static inline float *ps_state_segment(float *img, size_t n, uint32_t k) { return img + n * k; }
static inline const float *ps_state_segment_c(const float *img, size_t n, uint32_t k) {
  return img + n * k;
}

/* A row from its 16 bytes (little-endian incarnation, last sequence). */
ps_once ps_state_once_decode(const void *row16);

/* Row j (< in->nonce) of an image's exactly-once table. */
ps_once ps_state_once_get(const ps_state_info *in, size_t n, const float *img, uint32_t j);
void ps_state_once_put(const ps_state_info *in, size_t n, float *img, uint32_t j, ps_once row);

/* Is `got` the shape of `want` (slots, accumulator, image size for n-float
 * segments, at most max_rows rows, target at most max_rows)?  The version,
 * steps, counts and the number of rows may differ.  @return 0, or
 * PS_ELAYOUT with a one-line message in why naming what differs. */
int ps_state_check(const ps_state_info *want, size_t n, const ps_state_info *got,
                   uint32_t max_rows, char *why, size_t why_len);

#endif
