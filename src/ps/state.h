/* A shard's state as one image: the one definition of its layout, shared
 * by the shard (ps/shard.c), the wire (CUT replies and LOADs, proto.h), the
 * Redis snapshot (replica/) and the checkpoint (recovery/).
 *
 * An image of a slice of n floats is, as floats: the values, the nslots
 * optimizer slots, the sync accumulator when has_accum, each n long, then
 * `nonce` exactly-once rows of 16 bytes (incarnation, last sequence;
 * little-endian u64), 4 floats' room each (PROTOCOL.md, "The cut image").
 * The fixed fields travel beside it in a ps_state_info. */
#ifndef PS_PS_STATE_H
#define PS_PS_STATE_H

#include <stddef.h>
#include <stdint.h>

/* Per worker: its newest incarnation and the last sequence applied from it. */
typedef struct ps_once {
  uint64_t incarnation;
  uint64_t last_seq;
} ps_once;

/* The fixed fields of an image. */
typedef struct ps_state_info {
  uint64_t version;       /* updates applied to the slice */
  uint64_t global_step;   /* as the shard knows it */
  uint64_t image_floats;  /* the whole image: ps_state_floats(n, nslots, has_accum, nonce) */
  uint32_t nslots;        /* optimizer slots, 0..PS_OPTIM_MAX_SLOTS */
  uint32_t has_accum;     /* 0 or 1 */
  uint32_t accum_count;   /* sync: gradients summed into the accumulator */
  uint32_t target;        /* sync: gradients that complete a step (0: the config's) */
  uint32_t nonce;         /* exactly-once rows */
} ps_state_info;

/* Floats of an image with these counts. */
uint64_t ps_state_floats(size_t n, uint32_t nslots, uint32_t has_accum, uint32_t nonce);

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
