/* A shard's state read later (see shard.h): readers of the state image
 * that walk the tables instead of copying them, the cuts of the tables'
 * changes for a store kept by key, and the lazy loads of a restore that
 * serves before the rows are all back. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "ps/shard.h"
#include "ps/shard_internal.h"
#include "proto/proto.h"
#include "ps/tsec.h"

/* ------------------------------------------------- the state read later */

struct ps_shard_reader {
  ps_shard *s;
  ps_state_info info;
  float *head;              /* the image up to its table section, copied at the start */
  uint64_t head_floats;
  uint64_t at;              /* floats read so far */
  ps_table_walk *walks[PS_SHARD_MAX_TABLES];
  int t, t_headed;          /* the table being read; its head given */
  uint8_t *tail;            /* the open sync step's rows: their length, then them */
  size_t tail_len, tail_at;
  uint8_t *stage;           /* one unit (a head, an entry) being given out */
  size_t stage_cap, stage_len, stage_at;
  float *copy;              /* no walk to be had: the whole image, copied at the start */
  /* A cut of the tables' changes (ps_shard_reader_begin_changes): the
   * image gives every table's head empty, the walks are change walks read
   * by ps_shard_reader_change. */
  int changes, all;
  unsigned bits;
  int ct, cstage;           /* the table being read; 0: its removals not gathered, 1: being
                             * read, 2: its entries */
  struct bucket_key { uint32_t bucket; uint64_t key; } *rm;  /* table ct's removals, by bucket */
  size_t nrm, rm_at;
  ps_shard_cut_counts held[PS_SHARD_MAX_TABLES];  /* rows, pending: the tables as cut */
};

void ps_shard_reader_end(ps_shard_reader *r) {
  if (r == NULL)
    return;
  for (int t = 0; t < r->s->o.ntables; t++)
    ps_table_walk_end(r->walks[t]);
  free(r->head);
  free(r->tail);
  free(r->stage);
  free(r->copy);
  free(r->rm);
  free(r);
}

/* The parts of a reader copied at its start: the image up to its table
 * section, the open sync step's rows; and the room for one unit.
 * @return 0 or -ENOMEM. */
static int reader_prepare(ps_shard_reader *r) {
  ps_shard *s = r->s;
  r->head_floats = ps_state_tables_at(&r->info, s->o.nfloats);
  r->head = malloc((size_t)(r->head_floats ? r->head_floats : 1) * sizeof(float));
  size_t row_max = PS_TSEC_HEAD;
  for (int t = 0; t < s->o.ntables; t++) {
    size_t b = PS_TSEC_ENTRY + 4 * (size_t)s->o.tables[t].dim *
                                   (1 + (size_t)ps_optim_nslots(s->o.tables[t].optim.kind));
    row_max = b > row_max ? b : row_max;
  }
  r->stage = malloc(row_max);
  r->stage_cap = row_max;
  r->tail_len = ps_shard_has_sync_rows(&s->o) ? 8 + s->sync_rows_len : 0;
  r->tail = r->tail_len > 0 ? malloc(r->tail_len) : NULL;
  if (r->head == NULL || r->stage == NULL || (r->tail_len > 0 && r->tail == NULL))
    return -ENOMEM;
  ps_shard_head_write(s, &r->info, r->head);
  ps_shard_sync_tail_write(s, r->tail);
  return 0;
}

ps_shard_reader *ps_shard_reader_begin(ps_shard *s, ps_state_info *info) {
  if (s->lazy_done != NULL)
    return NULL;  /* the tables are not all in yet */
  ps_shard_reader *r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  r->s = s;
  r->info = ps_shard_state_info(s);
  *info = r->info;
  int walked = 1;
  for (int t = 0; walked && t < s->o.ntables; t++)
    walked = (r->walks[t] = ps_table_walk_begin(s->tables[t])) != NULL;
  if (!walked) {
    /* Every walk of a table taken (or no memory for one): a copy, as
     * ps_shard_state_write makes. */
    for (int t = 0; t < s->o.ntables; t++) {
      ps_table_walk_end(r->walks[t]);
      r->walks[t] = NULL;
    }
    r->copy = malloc((size_t)(r->info.image_floats ? r->info.image_floats : 1) * sizeof(float));
    if (r->copy == NULL) {
      ps_shard_reader_end(r);
      return NULL;
    }
    ps_shard_state_write(s, r->copy);
    return r;
  }
  if (reader_prepare(r) != 0) {
    ps_shard_reader_end(r);
    return NULL;
  }
  return r;
}

/* Give the changes of every table whose change walk began back to the
 * next one.  @return 0, or -ENOMEM (that table's next walk is one of all). */
static int changes_undo(ps_shard_reader *r) {
  int rc = 0;
  for (int t = 0; t < r->s->o.ntables; t++)
    if (r->walks[t] != NULL && ps_table_changes_undo(r->walks[t]) != 0)
      rc = -ENOMEM;
  return rc;
}

ps_shard_reader *ps_shard_reader_begin_changes(ps_shard *s, ps_state_info *info, int all,
                                               unsigned bits) {
  ps_shard_reader *r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  r->s = s;
  r->changes = 1;
  r->bits = bits;
  for (int t = 0; t < s->o.ntables; t++)
    all |= ps_table_changes_lost(s->tables[t]);
  r->all = all;
  int ok = 1;
  for (int t = 0; t < s->o.ntables; t++) {
    ps_table_stats st = ps_table_get_stats(s->tables[t]);
    r->held[t] = (ps_shard_cut_counts){.rows = st.rows, .pending = st.pending};
    ps_table_newest(s->tables[t], &r->held[t].rows_newest, &r->held[t].pending_newest);
  }
  for (int t = 0; ok && t < s->o.ntables; t++)
    ok = (r->walks[t] = ps_table_changes_begin(s->tables[t], all)) != NULL &&
         ps_table_walk_group(r->walks[t], bits) == 0;
  r->info = ps_shard_state_info(s);
  r->info.table_floats = ((uint64_t)s->o.ntables * PS_TSEC_HEAD +
                          (ps_shard_has_sync_rows(&s->o) ? 8 + s->sync_rows_len : 0)) / sizeof(float);
  r->info.image_floats = ps_state_image_floats(&r->info, s->o.nfloats);
  *info = r->info;
  if (!ok || reader_prepare(r) != 0) {
    (void)changes_undo(r);
    ps_shard_reader_end(r);
    return NULL;
  }
  return r;
}

int ps_shard_reader_all(const ps_shard_reader *r) { return r->all; }

ps_shard_cut_counts ps_shard_reader_table_counts(const ps_shard_reader *r, int t) {
  ps_shard_cut_counts c = r->held[t];
  const uint64_t *rk, *pk;
  size_t nr, np;
  ps_table_walk_counts(r->walks[t], &c.changed_rows, &c.changed_pending);
  ps_table_changes_removed(r->walks[t], &rk, &nr, &pk, &np);
  c.removed = nr + np;
  return c;
}

static int bucket_key_cmp(const void *a, const void *b) {
  const struct bucket_key *x = a, *y = b;
  if (x->bucket != y->bucket)
    return x->bucket < y->bucket ? -1 : 1;
  return (x->key > y->key) - (x->key < y->key);
}

/* Table ct's removed keys, ordered by bucket.  @return 0 or -ENOMEM. */
static int removals_gather(ps_shard_reader *r) {
  const ps_table *tb = r->s->tables[r->ct];
  const uint64_t *rk, *pk;
  size_t nr, np;
  ps_table_changes_removed(r->walks[r->ct], &rk, &nr, &pk, &np);
  free(r->rm);
  r->rm = NULL;
  r->nrm = r->rm_at = 0;
  if (nr + np == 0)
    return 0;
  if ((r->rm = malloc((nr + np) * sizeof *r->rm)) == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < nr + np; i++) {
    uint64_t key = i < nr ? rk[i] : pk[i - nr];
    r->rm[i] = (struct bucket_key){ps_table_bucket(tb, key, r->bits), key};
  }
  r->nrm = nr + np;
  qsort(r->rm, r->nrm, sizeof *r->rm, bucket_key_cmp);
  return 0;
}

int ps_shard_reader_change(ps_shard_reader *r, ps_shard_change *c) {
  ps_shard *s = r->s;
  while (r->ct < s->o.ntables) {
    if (r->cstage == 0) {
      if (removals_gather(r) != 0)
        return -ENOMEM;
      r->cstage = 1;
    }
    if (r->cstage == 1) {
      if (r->rm_at < r->nrm) {
        *c = (ps_shard_change){.table = r->ct, .removed = 1, .bucket = r->rm[r->rm_at].bucket,
                               .e = {.key = r->rm[r->rm_at].key}};
        r->rm_at++;
        return 1;
      }
      r->cstage = 2;
    }
    int rc = ps_table_walk_next(r->walks[r->ct], &c->e);
    if (rc < 0)
      return rc;
    if (rc == 1) {
      c->table = r->ct;
      c->removed = 0;
      c->bucket = ps_table_bucket(s->tables[r->ct], c->e.key, r->bits);
      c->place = ps_table_walk_place(r->walks[r->ct]);
      return 1;
    }
    r->ct++;
    r->cstage = 0;
  }
  return 0;
}

int ps_shard_reader_undo(ps_shard_reader *r) { return r->changes ? changes_undo(r) : 0; }

uint64_t ps_shard_changes_bytes(const ps_shard *s) {
  uint64_t bytes = 0;
  for (int t = 0; t < s->o.ntables; t++) {
    const ps_table_opts *o = &s->o.tables[t];
    uint64_t row = ps_tsec_row_bytes(
        &(ps_tsec_table){.dim = o->dim, .nslots = (uint32_t)ps_optim_nslots(o->optim.kind)});
    if (ps_table_changes_lost(s->tables[t])) {
      ps_table_stats st = ps_table_get_stats(s->tables[t]);
      bytes += st.rows * row + st.pending * PS_TSEC_ENTRY;
      continue;
    }
    uint64_t entries, removed;
    ps_table_changes_count(s->tables[t], &entries, &removed);
    bytes += entries * row + removed * 8;
  }
  return bytes;
}

/* The next unit of the table section into the stage: a table's head, an
 * entry, or the tail.  @return 1, 0 at the end, -ENOMEM (a walk spoilt). */
static int reader_stage(ps_shard_reader *r) {
  ps_shard *s = r->s;
  r->stage_at = r->stage_len = 0;
  while (r->t < s->o.ntables) {
    if (!r->t_headed) {
      uint64_t rows = 0, pending = 0;
      if (!r->changes)
        ps_table_walk_counts(r->walks[r->t], &rows, &pending);
      r->stage_len = (size_t)(ps_tsec_put_head(r->stage, rows, pending) - r->stage);
      r->t_headed = 1;
      return 1;
    }
    if (r->changes) {
      /* The entries are ps_shard_reader_change's. */
      r->t++;
      r->t_headed = 0;
      continue;
    }
    ps_table_entry e;
    int rc = ps_table_walk_next(r->walks[r->t], &e);
    if (rc < 0)
      return rc;
    if (rc == 1) {
      r->stage_len = (size_t)(ps_tsec_put_entry(s->tables[r->t], &e, r->stage) - r->stage);
      return 1;
    }
    ps_table_walk_end(r->walks[r->t]);
    r->walks[r->t] = NULL;
    r->t++;
    r->t_headed = 0;
  }
  return 0;
}

int ps_shard_reader_read(ps_shard_reader *r, float *out, uint64_t count) {
  if (count > r->info.image_floats - r->at)
    return -EINVAL;
  if (r->copy != NULL) {
    memcpy(out, r->copy + r->at, (size_t)count * sizeof(float));
    r->at += count;
    return 0;
  }
  uint64_t from_head = r->at < r->head_floats ? r->head_floats - r->at : 0;
  if (from_head > count)
    from_head = count;
  memcpy(out, r->head + r->at, (size_t)from_head * sizeof(float));
  r->at += from_head;
  uint8_t *p = (uint8_t *)(out + from_head);
  size_t want = (size_t)(count - from_head) * sizeof(float);
  while (want > 0) {
    if (r->stage_at == r->stage_len) {
      int rc = reader_stage(r);
      if (rc < 0)
        return rc;
      if (rc == 0) {
        /* The tail, then nothing: the image is its info's length. */
        size_t take = r->tail_len - r->tail_at < want ? r->tail_len - r->tail_at : want;
        if (take == 0)
          return -EINVAL;
        memcpy(p, r->tail + r->tail_at, take);
        r->tail_at += take;
        p += take;
        want -= take;
        continue;
      }
    }
    size_t take = r->stage_len - r->stage_at < want ? r->stage_len - r->stage_at : want;
    memcpy(p, r->stage + r->stage_at, take);
    r->stage_at += take;
    p += take;
    want -= take;
  }
  r->at += count - from_head;
  return 0;
}

/* ------------------------------------------------------- lazy loads */

int ps_shard_lazy_begin(ps_shard *s, unsigned bits, const uint64_t (*newest)[2]) {
  for (int t = 0; t < s->o.ntables; t++) {
    const ps_table_opts *o = &s->o.tables[t];
    if (o->max_rows > 0 || o->idle_steps > 0 || o->admit_after > 1)
      return -EINVAL;
  }
  size_t words = (((size_t)1 << bits) + 63) / 64;
  free(s->lazy_done);
  if ((s->lazy_done = calloc(words, sizeof *s->lazy_done)) == NULL)
    return -ENOMEM;
  for (int t = 0; t < s->o.ntables; t++)
    if (ps_table_lazy_begin(s->tables[t], newest[t][0], newest[t][1]) != 0)
      return -EINVAL;
  s->lazy_bits = bits;
  s->lazy_left = (uint64_t)1 << bits;
  return 0;
}

int ps_shard_lazy_entry(ps_shard *s, int t, const ps_table_entry *e, uint64_t rank,
                        ps_errbuf *eb) {
  int rc = ps_table_load_lazy(s->tables[t], e, rank, eb);
  if (rc == -ENOMEM)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  return rc < 0 ? PS_ECORRUPT : rc;
}

int ps_shard_lazy_bucket(ps_shard *s, uint32_t bucket) {
  if (s->lazy_done == NULL || (s->lazy_done[bucket >> 6] >> (bucket & 63) & 1))
    return 0;
  s->lazy_done[bucket >> 6] |= 1ULL << (bucket & 63);
  if (--s->lazy_left > 0)
    return 0;
  for (int t = 0; t < s->o.ntables; t++)
    if (ps_table_lazy_end(s->tables[t]) != 0)
      return -ENOMEM;
  free(s->lazy_done);
  s->lazy_done = NULL;
  return 1;
}

int ps_shard_lazy(const ps_shard *s) { return s->lazy_done != NULL; }

void ps_shard_lazy_progress(const ps_shard *s, uint64_t *done, uint64_t *all) {
  *all = (uint64_t)1 << s->lazy_bits;
  *done = s->lazy_done != NULL ? *all - s->lazy_left : *all;
}

long ps_shard_lazy_missing(const ps_shard *s, int kind, const void *sparse, uint64_t bytes,
                           ps_shard_key **out, size_t *cap) {
  if (s->lazy_done == NULL || bytes == 0)
    return 0;
  ps_sparse sp = {.bytes = bytes, .data = sparse};
  ps_sparse_iter it;
  ps_sparse_block b;
  ps_table_entry e;
  size_t n = 0;
  ps_sparse_iter_init(&sp, &it);
  while (ps_sparse_iter_next(&it, (ps_sparse_kind)kind, &b)) {
    if (b.table >= (uint32_t)s->o.ntables)
      continue;  /* refused when the frame is handled (ps_shard_sparse_check) */
    const ps_table *tb = s->tables[b.table];
    for (uint64_t i = 0; i < b.nkeys; i++) {
      uint64_t key = ps_get_le64(b.keys + 8 * i);
      if (ps_table_get(tb, key, &e))
        continue;
      uint32_t bucket = ps_table_bucket(tb, key, s->lazy_bits);
      if (s->lazy_done[bucket >> 6] >> (bucket & 63) & 1)
        continue;
      if (n == *cap) {
        size_t c = *cap ? 2 * *cap : 256;
        ps_shard_key *o = realloc(*out, c * sizeof *o);
        if (o == NULL)
          return -ENOMEM;
        *out = o;
        *cap = c;
      }
      (*out)[n++] = (ps_shard_key){.table = b.table, .bucket = bucket, .key = key};
    }
  }
  return (long)n;
}

