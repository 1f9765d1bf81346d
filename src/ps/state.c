/* A shard's state image (see state.h). */
#include "ps/state.h"

#include <inttypes.h>
#include <stdio.h>

#include "common/endian.h"
#include "paramserv/error.h"

uint64_t ps_state_floats(size_t n, uint32_t nslots, uint32_t has_accum, uint32_t nonce) {
  return (uint64_t)n * (1 + (uint64_t)nslots + has_accum) + 4 * (uint64_t)nonce;
}

static const uint8_t *rows_c(const ps_state_info *in, size_t n, const float *img) {
  return (const uint8_t *)(img + n * ps_state_segments(in));
}

ps_once ps_state_once_decode(const void *row16) {
  const uint8_t *row = row16;
  return (ps_once){ps_get_le64(row), ps_get_le64(row + 8)};
}

ps_once ps_state_once_get(const ps_state_info *in, size_t n, const float *img, uint32_t j) {
  return ps_state_once_decode(rows_c(in, n, img) + 16 * (size_t)j);
}

void ps_state_once_put(const ps_state_info *in, size_t n, float *img, uint32_t j, ps_once row) {
  uint8_t *p = (uint8_t *)(img + n * ps_state_segments(in)) + 16 * (size_t)j;
  ps_put_le64(p, row.incarnation);
  ps_put_le64(p + 8, row.last_seq);
}

int ps_state_check(const ps_state_info *want, size_t n, const ps_state_info *got,
                   uint32_t max_rows, char *why, size_t why_len) {
  if (got->nonce > max_rows || got->target > max_rows) {
    snprintf(why, why_len, "state of %" PRIu32 " exactly-once rows and a sync target of %" PRIu32
             ", expected at most %" PRIu32, got->nonce, got->target, max_rows);
    return PS_ELAYOUT;
  }
  if (got->nslots == want->nslots && got->has_accum == want->has_accum &&
      got->image_floats == ps_state_floats(n, got->nslots, got->has_accum, got->nonce))
    return 0;
  snprintf(why, why_len,
           "state of %" PRIu64 " floats with %" PRIu32 " slots, accumulator %" PRIu32 " and %"
           PRIu32 " exactly-once rows; this shard holds %zu floats with %" PRIu32
           " slots and accumulator %" PRIu32,
           got->image_floats, got->nslots, got->has_accum, got->nonce, n, want->nslots,
           want->has_accum);
  return PS_ELAYOUT;
}
