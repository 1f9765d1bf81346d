/* Delta sections of incremental checkpoints (see delta.h). */
#include "recovery/delta.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common/endian.h"
#include "optim/optim.h"

#define MAX_TABLES 4096

/* An entry of a section: its key, a hash of its bytes whose low bit says
 * which keyset it is in (1: pending), and its place in its table. */
typedef struct ik {
  uint64_t key, h;
  uint64_t pos;
} ik;

/* One table of an index: (key, h) sorted by key, then keyset. */
typedef struct kh {
  uint64_t key, h;
} kh;

struct ps_delta_index {
  int ntables;
  kh *e[MAX_TABLES];
  size_t n[MAX_TABLES];
};

void ps_delta_index_free(ps_delta_index *x) {
  if (x == NULL)
    return;
  for (int t = 0; t < x->ntables; t++)
    free(x->e[t]);
  free(x);
}

static int by_key(const void *a, const void *b) {
  const ik *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return (int)(x->h & 1) - (int)(y->h & 1);
}

static uint64_t entry_hash(const ps_tsec_table *t, const ps_table_entry *e) {
  uint8_t head[PS_TSEC_ENTRY];
  ps_put_le64(head, e->key);
  ps_put_le64(head + 8, e->count);
  ps_put_le64(head + 16, e->last_step);
  uint64_t h = XXH3_64bits(head, sizeof head);
  if (!e->pending)  /* values and slots lie back to back in the section */
    h = XXH3_64bits_withSeed(e->values, (size_t)t->dim * (1 + t->nslots) * sizeof(float), h);
  return (h & ~(uint64_t)1) | (e->pending ? 1 : 0);
}

/* The walk that indexes a section, then the one that writes its delta. */
typedef struct maker {
  const ps_tsec_table *tables;
  ik *ents[MAX_TABLES];
  size_t n[MAX_TABLES], cap[MAX_TABLES];
  uint8_t *changed[MAX_TABLES];    /* by place: 1 written in the delta */
  uint64_t nrows_ch[MAX_TABLES], npend_ch[MAX_TABLES];
  uint64_t *deleted[MAX_TABLES];
  size_t ndel[MAX_TABLES];
  uint8_t *p;                      /* the delta being written */
  int cur;                         /* the table being written, -1 before the first */
} maker;

static int index_entry(void *arg, int t, uint64_t i, const ps_table_entry *e, ps_errbuf *eb) {
  maker *m = arg;
  if (m->n[t] == m->cap[t]) {
    size_t cap = m->cap[t] ? 2 * m->cap[t] : 256;
    ik *g = realloc(m->ents[t], cap * sizeof *g);
    if (g == NULL)
      return ps_err_set(eb, -ENOMEM, "out of memory");
    m->ents[t] = g;
    m->cap[t] = cap;
  }
  m->ents[t][m->n[t]++] = (ik){.key = e->key, .h = entry_hash(&m->tables[t], e), .pos = i};
  return 0;
}

static void put_deleted(maker *m, int t) {
  for (size_t k = 0; k < m->ndel[t]; k++, m->p += 8)
    ps_put_le64(m->p, m->deleted[t][k]);
}

static void put_head(maker *m, int t) {
  ps_put_le64(m->p, m->nrows_ch[t]);
  ps_put_le64(m->p + 8, m->npend_ch[t]);
  ps_put_le64(m->p + 16, m->ndel[t]);
  ps_put_le32(m->p + 24, m->tables[t].dim);
  ps_put_le32(m->p + 28, m->tables[t].nslots);
  m->p += PS_DELTA_HEAD;
}

/* Close the tables before t: the current one's deletions, then whole
 * tables the walk did not reach (none: its section was empty). */
static void close_before(maker *m, int t) {
  if (m->cur >= 0)
    put_deleted(m, m->cur);
  for (int u = m->cur + 1; u < t; u++) {
    put_head(m, u);
    put_deleted(m, u);
  }
  m->cur = t - 1;
}

static int write_head(void *arg, int t, uint64_t rows, uint64_t pending, ps_errbuf *eb) {
  (void)rows, (void)pending, (void)eb;
  maker *m = arg;
  close_before(m, t);
  put_head(m, t);
  m->cur = t;
  return 0;
}

static uint8_t *put_entry(uint8_t *p, const ps_tsec_table *t, const ps_table_entry *e) {
  ps_put_le64(p, e->key);
  ps_put_le64(p + 8, e->count);
  ps_put_le64(p + 16, e->last_step);
  p += PS_TSEC_ENTRY;
  if (!e->pending) {
    size_t bytes = (size_t)t->dim * (1 + t->nslots) * sizeof(float);
    memcpy(p, e->values, bytes);
    p += bytes;
  }
  return p;
}

static int write_entry(void *arg, int t, uint64_t i, const ps_table_entry *e, ps_errbuf *eb) {
  (void)eb;
  maker *m = arg;
  if (m->changed[t][i])
    m->p = put_entry(m->p, &m->tables[t], e);
  return 0;
}

static void maker_free(maker *m, int n) {
  for (int t = 0; t < n; t++) {
    free(m->ents[t]);
    free(m->changed[t]);
    free(m->deleted[t]);
  }
  free(m);
}

int ps_delta_make(const ps_delta_index *base, const void *sec, uint64_t bytes,
                  const ps_tsec_table *tables, int n, int sync, uint8_t **delta,
                  uint64_t *delta_bytes, ps_delta_index **next, ps_delta_stats *st,
                  ps_errbuf *eb) {
  *next = NULL;
  if (delta != NULL)
    *delta = NULL;
  if (n < 0 || n > MAX_TABLES || (base != NULL && base->ntables != n))
    return ps_err_set(eb, PS_ECORRUPT, "a delta of %d tables against an index of %d", n,
                      base != NULL ? base->ntables : 0);
  maker *m = calloc(1, sizeof *m);
  ps_delta_index *x = calloc(1, sizeof *x);
  if (m == NULL || x == NULL) {
    free(m);
    free(x);
    return ps_err_set(eb, -ENOMEM, "out of memory");
  }
  m->tables = tables;
  m->cur = -1;
  x->ntables = n;
  ps_delta_stats s = {0};
  uint64_t used = bytes;
  int rc = 0;
  if (bytes > 0) {
    ps_tsec_visit v = {.entry = index_entry, .arg = m};
    rc = ps_tsec_walk(sec, bytes, tables, n, &v, sync ? &used : NULL, eb);
  }
  for (int t = 0; t < n && rc == 0; t++) {
    qsort(m->ents[t], m->n[t], sizeof(ik), by_key);
    s.entries += m->n[t];
    x->n[t] = m->n[t];
    if ((x->e[t] = malloc((m->n[t] ? m->n[t] : 1) * sizeof(kh))) == NULL ||
        (m->changed[t] = calloc(m->n[t] ? m->n[t] : 1, 1)) == NULL) {
      rc = ps_err_set(eb, -ENOMEM, "out of memory");
      break;
    }
    for (size_t k = 0; k < m->n[t]; k++)
      x->e[t][k] = (kh){m->ents[t][k].key, m->ents[t][k].h};
    if (base == NULL)
      continue;
    /* Merge with the base's index: new or other bytes -> changed; in the
     * base's keyset and not in this one -> deleted. */
    const kh *b = base->e[t];
    size_t nb = base->n[t], i = 0, j = 0;
    if ((m->deleted[t] = malloc((nb ? nb : 1) * sizeof(uint64_t))) == NULL) {
      rc = ps_err_set(eb, -ENOMEM, "out of memory");
      break;
    }
    uint64_t rb = ps_tsec_row_bytes(&tables[t]);
    while (i < m->n[t] || j < nb) {
      const ik *a = i < m->n[t] ? &m->ents[t][i] : NULL;
      int c = a == NULL ? 1 : j >= nb ? -1
              : a->key != b[j].key ? (a->key < b[j].key ? -1 : 1)
                                   : (int)(a->h & 1) - (int)(b[j].h & 1);
      if (c > 0) {
        m->deleted[t][m->ndel[t]++] = b[j++].key;
        continue;
      }
      if (c < 0 || a->h != b[j].h) {
        m->changed[t][a->pos] = 1;
        if (a->h & 1) {
          m->npend_ch[t]++;
          s.changed_row_bytes += PS_TSEC_ENTRY;
        } else {
          m->nrows_ch[t]++;
          s.changed_row_bytes += rb;
        }
      }
      i++;
      if (c == 0)
        j++;
    }
    s.changed += m->nrows_ch[t] + m->npend_ch[t];
    s.deleted += m->ndel[t];
  }
  if (rc == 0 && base != NULL && delta != NULL) {
    uint64_t size = 8 + (bytes - used);
    for (int t = 0; t < n; t++)
      size += PS_DELTA_HEAD + m->nrows_ch[t] * ps_tsec_row_bytes(&tables[t]) +
              m->npend_ch[t] * PS_TSEC_ENTRY + m->ndel[t] * 8;
    if ((*delta = malloc(size)) == NULL) {
      rc = ps_err_set(eb, -ENOMEM, "out of memory for a delta of %" PRIu64 " bytes", size);
    } else {
      m->p = *delta;
      ps_put_le64(m->p, (uint64_t)n);
      m->p += 8;
      if (bytes > 0) {
        ps_tsec_visit v = {.head = write_head, .entry = write_entry, .arg = m};
        rc = ps_tsec_walk(sec, bytes, tables, n, &v, sync ? &used : NULL, eb);
      }
      if (rc == 0) {
        close_before(m, n);
        memcpy(m->p, (const uint8_t *)sec + used, bytes - used);
        m->p += bytes - used;
        *delta_bytes = (uint64_t)(m->p - *delta);
        if (*delta_bytes != size)
          rc = ps_err_set(eb, PS_ECORRUPT, "a delta of %" PRIu64 " bytes, expected %" PRIu64,
                          *delta_bytes, size);
      }
      if (rc != 0) {
        free(*delta);
        *delta = NULL;
      }
    }
  }
  maker_free(m, n);
  if (rc != 0) {
    ps_delta_index_free(x);
    return rc;
  }
  if (st != NULL)
    *st = s;
  *next = x;
  return 0;
}

/* ------------------------------------------------------------------ */
/* Applying                                                           */
/* ------------------------------------------------------------------ */

typedef struct dtable {
  uint64_t nrows, npend, ndel;
  const uint8_t *rows, *pend, *del;
  uint64_t *drop;     /* every key the delta names, sorted */
  size_t ndrop;
  uint64_t keep_rows, keep_pend;
} dtable;

typedef struct applier {
  ps_tsec_table tables[MAX_TABLES];
  dtable d[MAX_TABLES];
  uint8_t *p;
  int pass;           /* 0 count, 1 write */
  int cur;
} applier;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static int dropped(const dtable *d, uint64_t key) {
  size_t lo = 0, hi = d->ndrop;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (d->drop[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < d->ndrop && d->drop[lo] == key;
}

/* Close table t's part of the output: its changed entries after the
 * base's kept ones (rows: the changed rows; pending: see apply_entry). */
static void flush_rows(applier *a, int t) {
  const dtable *d = &a->d[t];
  size_t rb = (size_t)ps_tsec_row_bytes(&a->tables[t]);
  memcpy(a->p, d->rows, d->nrows * rb);
  a->p += d->nrows * rb;
}

static void flush_pend(applier *a, int t) {
  const dtable *d = &a->d[t];
  memcpy(a->p, d->pend, d->npend * PS_TSEC_ENTRY);
  a->p += d->npend * PS_TSEC_ENTRY;
}

/* The output's table t: its head, then (as the walk goes) the base's
 * kept rows, the changed rows, the base's kept pending keys, the changed
 * pending keys. */
static int apply_head(void *arg, int t, uint64_t rows, uint64_t pending, ps_errbuf *eb) {
  (void)rows, (void)pending, (void)eb;
  applier *a = arg;
  if (a->pass == 0)
    return 0;
  if (a->cur >= 0)
    flush_pend(a, a->cur);
  const dtable *d = &a->d[t];
  ps_put_le64(a->p, d->keep_rows + d->nrows);
  ps_put_le64(a->p + 8, d->keep_pend + d->npend);
  a->p += PS_TSEC_HEAD;
  if (d->keep_rows == 0)
    flush_rows(a, t);  /* no kept row ends them: now */
  a->cur = t;
  return 0;
}

static int apply_entry(void *arg, int t, uint64_t i, const ps_table_entry *e, ps_errbuf *eb) {
  (void)eb;
  applier *a = arg;
  dtable *d = &a->d[t];
  if (dropped(d, e->key))
    return 0;
  if (a->pass == 0) {
    if (e->pending)
      d->keep_pend++;
    else
      d->keep_rows++;
    return 0;
  }
  (void)i;
  a->p = put_entry(a->p, &a->tables[t], e);
  /* The last kept row: the changed rows follow it. */
  if (!e->pending && --d->keep_rows == 0)
    flush_rows(a, t);
  return 0;
}

int ps_delta_apply(const void *base, uint64_t base_bytes, const void *delta, uint64_t delta_bytes,
                   uint8_t **out, uint64_t *out_bytes, ps_errbuf *eb) {
  *out = NULL;
  const uint8_t *p = delta, *end = p + delta_bytes;
  if (delta_bytes < 8)
    return ps_err_set(eb, PS_ECORRUPT, "a delta section of %" PRIu64 " bytes: expected at "
                      "least its table count (8 bytes)", delta_bytes);
  uint64_t n = ps_get_le64(p);
  p += 8;
  if (n > MAX_TABLES)
    return ps_err_set(eb, PS_ECORRUPT, "a delta section of %" PRIu64 " tables, expected at "
                      "most %d", n, MAX_TABLES);
  applier *a = calloc(1, sizeof *a);
  if (a == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  int rc = 0;
  for (uint64_t t = 0; t < n && rc == 0; t++) {
    dtable *d = &a->d[t];
    if ((uint64_t)(end - p) < PS_DELTA_HEAD) {
      rc = ps_err_set(eb, PS_ECORRUPT, "delta table %" PRIu64 ": the section ends in its head",
                      t);
      break;
    }
    d->nrows = ps_get_le64(p);
    d->npend = ps_get_le64(p + 8);
    d->ndel = ps_get_le64(p + 16);
    a->tables[t] = (ps_tsec_table){.dim = ps_get_le32(p + 24), .nslots = ps_get_le32(p + 28)};
    p += PS_DELTA_HEAD;
    uint64_t rb = ps_tsec_row_bytes(&a->tables[t]), left = (uint64_t)(end - p);
    if (a->tables[t].dim < 1 || a->tables[t].dim > 65536 ||
        a->tables[t].nslots > PS_OPTIM_MAX_SLOTS || d->nrows > left / rb ||
        d->npend > (left - d->nrows * rb) / PS_TSEC_ENTRY ||
        d->ndel > (left - d->nrows * rb - d->npend * PS_TSEC_ENTRY) / 8) {
      rc = ps_err_set(eb, PS_ECORRUPT, "delta table %" PRIu64 ": %" PRIu64 " rows (dim %" PRIu32
                      ", %" PRIu32 " slots), %" PRIu64 " pending and %" PRIu64 " deleted keys "
                      "do not fit the %" PRIu64 " bytes left", t, d->nrows, a->tables[t].dim,
                      a->tables[t].nslots, d->npend, d->ndel, left);
      break;
    }
    d->rows = p;
    p += d->nrows * rb;
    d->pend = p;
    p += d->npend * PS_TSEC_ENTRY;
    d->del = p;
    p += d->ndel * 8;
    d->ndrop = d->nrows + d->npend + d->ndel;
    if ((d->drop = malloc((d->ndrop ? d->ndrop : 1) * sizeof(uint64_t))) == NULL) {
      rc = ps_err_set(eb, -ENOMEM, "out of memory");
      break;
    }
    size_t k = 0;
    for (uint64_t r = 0; r < d->nrows; r++)
      d->drop[k++] = ps_get_le64(d->rows + r * rb);
    for (uint64_t r = 0; r < d->npend; r++)
      d->drop[k++] = ps_get_le64(d->pend + r * PS_TSEC_ENTRY);
    for (uint64_t r = 0; r < d->ndel; r++)
      d->drop[k++] = ps_get_le64(d->del + r * 8);
    qsort(d->drop, d->ndrop, sizeof(uint64_t), cmp_u64);
  }
  const uint8_t *tail = p;
  uint64_t tail_bytes = (uint64_t)(end - p);
  ps_tsec_visit v = {.head = apply_head, .entry = apply_entry, .arg = a};
  uint64_t used = 0;
  if (rc == 0 && base_bytes > 0) {
    ps_errbuf why = {0};
    if ((rc = ps_tsec_walk(base, base_bytes, a->tables, (int)n, &v, &used, &why)) != 0)
      rc = ps_err_set(eb, rc, "its base's table section: %s", why.msg);
  }
  if (rc == 0) {
    uint64_t size = tail_bytes;
    for (uint64_t t = 0; t < n; t++) {
      const dtable *d = &a->d[t];
      size += PS_TSEC_HEAD + (d->keep_rows + d->nrows) * ps_tsec_row_bytes(&a->tables[t]) +
              (d->keep_pend + d->npend) * PS_TSEC_ENTRY;
    }
    if ((*out = malloc(size ? size : 1)) == NULL) {
      rc = ps_err_set(eb, -ENOMEM, "out of memory for a table section of %" PRIu64 " bytes",
                      size);
    } else {
      a->p = *out;
      a->pass = 1;
      a->cur = -1;
      if (base_bytes > 0)
        ps_tsec_walk(base, base_bytes, a->tables, (int)n, &v, &used, eb);
      /* Tables the walk did not reach (an empty base: none) get theirs now. */
      for (uint64_t t = (uint64_t)(a->cur + 1); t < n; t++)
        apply_head(a, (int)t, 0, 0, eb);
      if (a->cur >= 0)
        flush_pend(a, a->cur);
      memcpy(a->p, tail, tail_bytes);
      a->p += tail_bytes;
      *out_bytes = (uint64_t)(a->p - *out);
      if (*out_bytes != size) {
        rc = ps_err_set(eb, PS_ECORRUPT, "a table section of %" PRIu64 " bytes, expected %"
                        PRIu64, *out_bytes, size);
        free(*out);
        *out = NULL;
      }
    }
  }
  for (uint64_t t = 0; t < n; t++)
    free(a->d[t].drop);
  free(a);
  return rc;
}
