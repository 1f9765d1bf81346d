/* The state image's table section: its writer and its reader (tsec.h). */
#include "ps/tsec.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/endian.h"
#include "optim/optim.h"

uint64_t ps_tsec_row_bytes(const ps_tsec_table *t) {
  return PS_TSEC_ENTRY + 4ull * t->dim * (1 + (uint64_t)t->nslots);
}

/* The walker's view of a live table. */
static ps_tsec_table of(const ps_table *tb) {
  const ps_table_opts *o = ps_table_options(tb);
  return (ps_tsec_table){.dim = o->dim, .nslots = (uint32_t)ps_optim_nslots(o->optim.kind)};
}

uint64_t ps_tsec_bytes(ps_table *const *tables, int n) {
  uint64_t bytes = 0;
  for (int t = 0; t < n; t++) {
    ps_tsec_table d = of(tables[t]);
    ps_table_stats st = ps_table_get_stats(tables[t]);
    bytes += PS_TSEC_HEAD + st.rows * ps_tsec_row_bytes(&d) + st.pending * PS_TSEC_ENTRY;
  }
  return bytes;
}

uint8_t *ps_tsec_put_head(uint8_t *p, uint64_t rows, uint64_t pending) {
  ps_put_le64(p, rows);
  ps_put_le64(p + 8, pending);
  return p + PS_TSEC_HEAD;
}

uint8_t *ps_tsec_put_entry(const ps_table *tb, const ps_table_entry *e, uint8_t *p) {
  ps_put_le64(p, e->key);
  ps_put_le64(p + 8, e->count);
  ps_put_le64(p + 16, e->last_step);
  p += PS_TSEC_ENTRY;
  if (e->pending)
    return p;
  ps_tsec_table d = of(tb);
  size_t dim = d.dim;
  memcpy(p, e->values, dim * sizeof(float));
  p += dim * sizeof(float);
  for (uint32_t k = 0; k < d.nslots; k++, p += dim * sizeof(float))
    memcpy(p, e->slots[k], dim * sizeof(float));
  return p;
}

uint8_t *ps_tsec_write(ps_table *const *tables, int n, uint8_t *p) {
  for (int t = 0; t < n; t++) {
    const ps_table *tb = tables[t];
    ps_table_stats st = ps_table_get_stats(tb);
    p = ps_tsec_put_head(p, st.rows, st.pending);
    ps_table_iter it;
    ps_table_entry e;
    ps_table_iter_init(tb, &it);
    while (ps_table_iter_next(tb, &it, &e))
      p = ps_tsec_put_entry(tb, &e, p);
  }
  return p;
}

const char *ps_tsec_table_name(const ps_tsec_table *tables, int t, char *buf, size_t len) {
  if (tables[t].name != NULL && tables[t].name[0] != '\0')
    snprintf(buf, len, "sparse table %d (%s)", t, tables[t].name);
  else
    snprintf(buf, len, "sparse table %d", t);
  return buf;
}

int ps_tsec_walk(const void *sec, uint64_t bytes, const ps_tsec_table *tables, int n,
                 const ps_tsec_visit *v, uint64_t *used, ps_errbuf *eb) {
  const uint8_t *p = sec, *end = p + bytes;
  char tn[96];
  for (int t = 0; t < n; t++) {
    ps_tsec_table_name(tables, t, tn, sizeof tn);
    uint64_t left = (uint64_t)(end - p);
    if (left < PS_TSEC_HEAD)
      return ps_err_set(eb, PS_ECORRUPT, "%s: the table section ends %" PRIu64 " bytes into "
                        "its head, expected %d bytes (rows, pending keys)", tn, left,
                        PS_TSEC_HEAD);
    uint64_t nrows = ps_get_le64(p), npend = ps_get_le64(p + 8);
    uint64_t rb = ps_tsec_row_bytes(&tables[t]);
    p += PS_TSEC_HEAD;
    left -= PS_TSEC_HEAD;
    if (nrows > left / rb || npend > (left - nrows * rb) / PS_TSEC_ENTRY)
      return ps_err_set(eb, PS_ECORRUPT, "%s: %" PRIu64 " rows of %" PRIu64 " bytes (dim %"
                        PRIu32 ", %" PRIu32 " slot%s) and %" PRIu64 " pending keys of %d do not "
                        "fit the %" PRIu64 " bytes left of the table section", tn, nrows, rb,
                        tables[t].dim, tables[t].nslots, tables[t].nslots == 1 ? "" : "s", npend,
                        PS_TSEC_ENTRY, left);
    ps_errbuf why = {0};
    int rc = 0;
    if (v != NULL && v->head != NULL && (rc = v->head(v->arg, t, nrows, npend, &why)) != 0)
      return ps_err_set(eb, rc, "%s: %s", tn, why.msg);
    size_t dim = tables[t].dim;
    for (uint64_t i = 0; i < nrows + npend; i++) {
      ps_table_entry e = {.pending = i >= nrows, .key = ps_get_le64(p),
                          .count = ps_get_le64(p + 8), .last_step = ps_get_le64(p + 16)};
      p += PS_TSEC_ENTRY;
      if (!e.pending) {
        /* 4-byte aligned: the section is, and every part of it is a
         * multiple of 4 bytes long. */
        const float *row = (const float *)(const void *)p;
        e.values = row;
        for (uint32_t k = 0; k < tables[t].nslots; k++)
          e.slots[k] = row + dim * (1 + k);
        p += dim * (1 + tables[t].nslots) * sizeof(float);
      }
      if (v != NULL && v->entry != NULL && (rc = v->entry(v->arg, t, i, &e, &why)) != 0)
        return ps_err_set(eb, rc, "%s, entry %" PRIu64 ": %s", tn, i, why.msg);
    }
  }
  if (used != NULL) {
    *used = (uint64_t)(p - (const uint8_t *)sec);
    return 0;
  }
  if (p != end)
    return ps_err_set(eb, PS_ECORRUPT, "the table section has %td bytes past its %d table%s, "
                      "expected none", end - p, n, n == 1 ? "" : "s");
  return 0;
}
