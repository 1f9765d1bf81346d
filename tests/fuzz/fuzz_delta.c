/* libFuzzer target for an incremental checkpoint's delta section
 * (recovery/delta.h), as a reader applies it to its base's table section:
 * the input is a u32 (LE) length of the delta, the delta, then the base's
 * section.  Any bytes are applied or refused with one line; a section
 * applied parses with the delta's tables, and holds as many entries as the
 * base kept and the delta brought. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "recovery/delta.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct counts {
  uint64_t entries;
} counts;

static int count(void *arg, int t, uint64_t i, const ps_table_entry *e, ps_errbuf *eb) {
  (void)t, (void)i, (void)e, (void)eb;
  ((counts *)arg)->entries++;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  size_t dn = ps_get_le32(data), rest = size - 4;
  if (dn > rest)
    dn = rest;
  dn = dn / 4 * 4;
  const uint8_t *delta = data + 4, *base = delta + dn;
  size_t bn = (rest - dn) / 4 * 4;
  /* Aligned copies: sections are read as floats. */
  uint8_t *d = malloc(dn + 1), *b = malloc(bn + 1);
  if (d == NULL || b == NULL)
    __builtin_trap();
  memcpy(d, delta, dn);
  memcpy(b, base, bn);
  uint8_t *out = NULL;
  uint64_t out_bytes = 0;
  ps_errbuf eb = {0};
  int rc = ps_delta_apply(b, bn, d, dn, &out, &out_bytes, &eb);
  if (rc != 0) {
    if (eb.msg[0] == '\0' || strchr(eb.msg, '\n') != NULL || out != NULL)
      __builtin_trap();
  } else {
    /* The delta parsed: its tables walk the section it made. */
    uint64_t n = ps_get_le64(d);
    ps_tsec_table *tables = calloc(n + 1, sizeof *tables);
    if (tables == NULL)
      __builtin_trap();
    const uint8_t *p = d + 8;
    uint64_t brought = 0;
    for (uint64_t t = 0; t < n; t++) {
      uint64_t rows = ps_get_le64(p), pend = ps_get_le64(p + 8), del = ps_get_le64(p + 16);
      tables[t] = (ps_tsec_table){.dim = ps_get_le32(p + 24), .nslots = ps_get_le32(p + 28)};
      brought += rows + pend;
      p += PS_DELTA_HEAD + rows * ps_tsec_row_bytes(&tables[t]) + pend * PS_TSEC_ENTRY + del * 8;
    }
    counts c = {0};
    ps_tsec_visit v = {.entry = count, .arg = &c};
    uint64_t used = 0;
    if (ps_tsec_walk(out, out_bytes, tables, (int)n, &v, &used, &eb) != 0 ||
        out_bytes - used != (uint64_t)(d + dn - p) || c.entries < brought)
      __builtin_trap();
    free(tables);
  }
  free(out);
  free(d);
  free(b);
  return 0;
}
