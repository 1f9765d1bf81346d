/* A shard's state image (see state.h). */
#include "ps/state.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/endian.h"
#include "paramserv/error.h"

const ps_state_field ps_state_fields[PS_STATE_NFIELDS] = {
#define FIELD(type, name, max, role) \
  {#name, offsetof(ps_state_info, name), sizeof(type), (max), PS_STATE_##role},
    PS_STATE_FIELDS(FIELD)
#undef FIELD
};

uint64_t ps_state_get(const ps_state_info *in, const ps_state_field *f) {
  const char *p = (const char *)in + f->offset;
  if (f->width == 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
  }
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

int ps_state_set(ps_state_info *in, const ps_state_field *f, uint64_t v) {
  if (v > f->max)
    return -1;
  char *p = (char *)in + f->offset;
  if (f->width == 8) {
    memcpy(p, &v, 8);
  } else {
    uint32_t w = (uint32_t)v;
    memcpy(p, &w, 4);
  }
  return 0;
}

const ps_state_field *ps_state_over(const ps_state_info *in) {
  for (const ps_state_field *f = ps_state_fields; f < ps_state_fields + PS_STATE_NFIELDS; f++)
    if (ps_state_get(in, f) > f->max)
      return f;
  return NULL;
}

void ps_state_wire_put(uint8_t *p, const ps_state_info *in) {
  memset(p, 0, PS_STATE_WIRE_SIZE);
  for (const ps_state_field *f = ps_state_fields; f < ps_state_fields + PS_STATE_NFIELDS; f++) {
    uint64_t v = ps_state_get(in, f);
    if (f->width == 8)
      ps_put_le64(p, v);
    else
      ps_put_le32(p, (uint32_t)v);
    p += f->width;
  }
}

const ps_state_field *ps_state_wire_get(const uint8_t *p, ps_state_info *in, uint64_t *found) {
  for (const ps_state_field *f = ps_state_fields; f < ps_state_fields + PS_STATE_NFIELDS; f++) {
    *found = f->width == 8 ? ps_get_le64(p) : ps_get_le32(p);
    if (ps_state_set(in, f, *found) != 0)
      return f;
    p += f->width;
  }
  return NULL;
}

void ps_state_carry(ps_state_info *in, const ps_state_info *from) {
  for (const ps_state_field *f = ps_state_fields; f < ps_state_fields + PS_STATE_NFIELDS; f++)
    if (f->role == PS_STATE_PROGRESS)
      ps_state_set(in, f, ps_state_get(from, f));
}

uint64_t ps_state_floats(size_t n, uint32_t nslots, uint32_t has_accum, uint32_t nonce) {
  return (uint64_t)n * (1 + (uint64_t)nslots + has_accum) + 4 * (uint64_t)nonce;
}

uint64_t ps_state_image_floats(const ps_state_info *in, size_t n) {
  uint64_t base = ps_state_floats(n, in->nslots, in->has_accum, in->nonce);
  return in->table_floats > UINT64_MAX - base ? UINT64_MAX : base + in->table_floats;
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
      got->image_floats == ps_state_image_floats(got, n))
    return 0;
  snprintf(why, why_len,
           "state of %" PRIu64 " floats with %" PRIu32 " slots, accumulator %" PRIu32 ", %"
           PRIu32 " exactly-once rows and %" PRIu64 " floats of tables; this shard holds %zu "
           "floats with %" PRIu32 " slots and accumulator %" PRIu32,
           got->image_floats, got->nslots, got->has_accum, got->nonce, got->table_floats, n,
           want->nslots,
           want->has_accum);
  return PS_ELAYOUT;
}
