/* A checkpoint laid out again for another shard count (see relayout.h). */
#include "recovery/relayout.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "layout/hashring.h"
#include "ps/tsec.h"

/* One entry of a table section, where the checkpoint's file holds it. */
typedef struct ent {
  uint64_t key, count, last_step;
  const float *row;     /* values then slots, in the file's data; NULL: a pending key */
  uint32_t to;          /* its shard by the new ring */
} ent;

/* A table's rows (or pending keys): every old shard's, in section order,
 * shard after shard; old shard s's are [start[s], start[s + 1]). */
typedef struct ents {
  ent *e;
  size_t n, cap;
  size_t *start;        /* from_shards + 1 */
} ents;

struct ps_relayout {
  const ps_ckpt *c;
  const ps_vartable *vars;
  const ps_layout *layout;
  uint32_t nslots, has_accum;
  uint64_t version, global_step;
  float *arena[1 + PS_OPTIM_MAX_SLOTS];   /* values, then each slot: the whole variables */
  ps_ckpt_shard_data *data;               /* every old shard's file */
  ps_ckpt_tables tt;
  ps_hashring ring;                       /* the new shard count's */
  ents rows[PS_MODEL_MAX_TABLES], pend[PS_MODEL_MAX_TABLES];
  ps_relayout_stats st;
  int from;                               /* the shard being walked */
};

void ps_relayout_close(ps_relayout *r) {
  if (r == NULL)
    return;
  for (int k = 0; k < 1 + PS_OPTIM_MAX_SLOTS; k++)
    free(r->arena[k]);
  if (r->data != NULL)
    for (int s = 0; s < r->c->nshards; s++)
      ps_ckpt_shard_data_close(&r->data[s]);
  free(r->data);
  for (int t = 0; t < PS_MODEL_MAX_TABLES; t++) {
    free(r->rows[t].e);
    free(r->rows[t].start);
    free(r->pend[t].e);
    free(r->pend[t].start);
  }
  ps_ckpt_tables_close(&r->tt);
  ps_hashring_free(&r->ring);
  free(r);
}

static int head(void *arg, int t, uint64_t rows, uint64_t pending, ps_errbuf *eb) {
  (void)rows, (void)pending, (void)eb;
  ps_relayout *r = arg;
  r->rows[t].start[r->from] = r->rows[t].n;
  r->pend[t].start[r->from] = r->pend[t].n;
  return 0;
}

static int entry(void *arg, int t, uint64_t i, const ps_table_entry *e, ps_errbuf *eb) {
  (void)i;
  ps_relayout *r = arg;
  ents *l = e->pending ? &r->pend[t] : &r->rows[t];
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 1024;
    ent *g = realloc(l->e, cap * sizeof *g);
    if (g == NULL)
      return ps_err_set(eb, -ENOMEM, "out of memory");
    l->e = g;
    l->cap = cap;
  }
  uint32_t to = (uint32_t)ps_hashring_owner(&r->ring, (uint32_t)t, e->key);
  l->e[l->n++] = (ent){.key = e->key, .count = e->count, .last_step = e->last_step,
                       .row = e->values, .to = to};
  int moved = to != (uint32_t)r->from;
  if (e->pending) {
    r->st.pending++;
    r->st.pending_moved += moved;
  } else {
    r->st.rows++;
    r->st.rows_moved += moved;
  }
  return 0;
}

/* Old shard s's table section into the lists.  In sync mode the section
 * ends with the open step's rows (their u64 length): none, as no gradient
 * is summed at a cut between steps. */
static int walk(ps_relayout *r, int s, ps_errbuf *eb) {
  const ps_ckpt_shard_data *d = &r->data[s];
  r->from = s;
  if (d->table_bytes == 0) {
    for (int t = 0; t < r->tt.ntables; t++) {
      r->rows[t].start[s] = r->rows[t].n;
      r->pend[t].start[s] = r->pend[t].n;
    }
    return 0;
  }
  ps_tsec_visit v = {.head = head, .entry = entry, .arg = r};
  uint64_t used = 0;
  int rc = ps_tsec_walk(d->tables, d->table_bytes, r->tt.t, r->tt.ntables, &v,
                        r->has_accum ? &used : NULL, eb);
  if (rc == 0 && r->has_accum &&
      (d->table_bytes - used != 8 || ps_get_le64((const uint8_t *)d->tables + used) != 0))
    rc = ps_err_set(eb, PS_ELAYOUT, "an open sync step's rows follow its tables: a checkpoint "
                    "restores into another number of shards only between steps");
  return rc;
}

int ps_relayout_open(const ps_ckpt *c, const ps_vartable *vars, const ps_layout *layout,
                     ps_relayout **out, ps_relayout_stats *st, ps_errbuf *eb) {
  *out = NULL;
  const char *where = c->path != NULL ? c->path : c->name;
  ps_errbuf why = {0};
  int rc = ps_ckpt_check_vars(c, vars, &why);
  if (rc != 0)
    return ps_err_set(eb, PS_ELAYOUT, "%s", why.msg);
  for (int s = 0; s < c->nshards; s++)
    if (c->shards[s].info.accum_count > 0)
      return ps_err_set(eb, PS_ELAYOUT, "%s: shard %d holds an open sync step (%" PRIu32
                        " gradients summed): a checkpoint restores into another number of "
                        "shards only between steps; restore it into %d shards", where, s,
                        c->shards[s].info.accum_count, c->nshards);
  ps_relayout *r = calloc(1, sizeof *r);
  if (r == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  r->c = c;
  r->vars = vars;
  r->layout = layout;
  r->nslots = c->shards[0].info.nslots;
  r->has_accum = c->shards[0].info.has_accum;
  r->st.from_shards = c->nshards;
  r->st.to_shards = layout->nshards;
  r->data = calloc((size_t)c->nshards, sizeof *r->data);
  if (r->data == NULL)
    goto oom;
  for (int s = 0; s < c->nshards; s++) {
    const ps_state_info *in = &c->shards[s].info;
    if (in->version > r->version)
      r->version = in->version;
    if (in->global_step > r->global_step)
      r->global_step = in->global_step;
    if ((rc = ps_ckpt_read_shard(c, s, &r->data[s], eb)) != 0)
      goto fail;
  }
  /* The dense state as whole variables: each segment's parts put back. */
  for (uint32_t k = 0; k <= r->nslots; k++) {
    if ((r->arena[k] = malloc((c->total_floats ? c->total_floats : 1) * sizeof(float))) == NULL)
      goto oom;
    for (int v = 0; v < c->nvars; v++)
      for (int p = 0; p < c->vars[v].nparts; p++) {
        const ps_ckpt_part *pt = &c->vars[v].parts[p];
        const ps_ckpt_shard_data *d = &r->data[pt->shard];
        const float *seg = k == 0 ? d->values : d->slots[k - 1];
        memcpy(r->arena[k] + c->vars[v].offset + pt->start, seg + pt->shard_off,
               pt->count * sizeof(float));
      }
  }
  if ((rc = ps_ckpt_tables_open(c, &r->tt, eb)) != 0)
    goto fail;
  if (r->tt.ntables > 0) {
    if ((rc = ps_hashring_init(&r->ring, layout->nshards, PS_HASHRING_VNODES)) != 0) {
      ps_err_set(eb, rc, "the hash ring of %d shards: %s", layout->nshards, strerror(-rc));
      goto fail;
    }
    for (int t = 0; t < r->tt.ntables; t++)
      if ((r->rows[t].start = calloc((size_t)c->nshards + 1, sizeof(size_t))) == NULL ||
          (r->pend[t].start = calloc((size_t)c->nshards + 1, sizeof(size_t))) == NULL)
        goto oom;
    for (int s = 0; s < c->nshards; s++) {
      if ((rc = walk(r, s, &why)) != 0) {
        ps_err_set(eb, rc, "%s/%s: %s", where, c->shards[s].file, why.msg);
        goto fail;
      }
    }
    for (int t = 0; t < r->tt.ntables; t++) {
      r->rows[t].start[c->nshards] = r->rows[t].n;
      r->pend[t].start[c->nshards] = r->pend[t].n;
    }
  }
  if (st != NULL)
    *st = r->st;
  *out = r;
  return 0;
oom:
  rc = ps_err_set(eb, -ENOMEM, "%s: out of memory laying it out again", where);
fail:
  ps_relayout_close(r);
  return rc;
}

/* The next entry of old shard s's part of l at or after *at that goes to
 * shard i; NULL past its end. */
static const ent *next_for(const ents *l, int s, size_t *at, uint32_t i) {
  for (; *at < l->start[s + 1]; ++*at)
    if (l->e[*at].to == i)
      return &l->e[*at];
  return NULL;
}

/* Shard i's entries of l, every old shard's merged by stamp (ties: the
 * lower old shard first), written at p.  Each old shard's entries are in
 * stamp order already (TABLE.md, "Stamps"): the merge gives the order a
 * table that held them all would keep. */
static uint8_t *merge(const ents *l, int from_shards, uint32_t i, size_t row_floats, uint8_t *p) {
  size_t at[PS_LAYOUT_MAX_SHARDS];
  for (int s = 0; s < from_shards; s++)
    at[s] = l->start[s];
  for (;;) {
    const ent *best = NULL;
    int bs = -1;
    for (int s = 0; s < from_shards; s++) {
      const ent *e = next_for(l, s, &at[s], i);
      if (e != NULL && (best == NULL || e->last_step < best->last_step)) {
        best = e;
        bs = s;
      }
    }
    if (best == NULL)
      return p;
    ps_put_le64(p, best->key);
    ps_put_le64(p + 8, best->count);
    ps_put_le64(p + 16, best->last_step);
    p += PS_TSEC_ENTRY;
    if (best->row != NULL) {
      memcpy(p, best->row, row_floats * sizeof(float));
      p += row_floats * sizeof(float);
    }
    at[bs]++;
  }
}

static uint64_t count_for(const ents *l, uint32_t i) {
  uint64_t n = 0;
  for (size_t k = 0; k < l->n; k++)
    n += l->e[k].to == i;
  return n;
}

int ps_relayout_image(const ps_relayout *r, const ps_shard_opts *so, float **img,
                      ps_state_info *info, ps_errbuf *eb) {
  *img = NULL;
  const ps_ckpt *c = r->c;
  int i = so->index;
  ps_state_info shape = ps_shard_state_shape(so);
  if (shape.nslots != r->nslots || shape.has_accum != r->has_accum)
    return ps_err_set(eb, PS_ELAYOUT, "%s: %" PRIu32 " optimizer slots and %s accumulator; "
                      "this cluster's shard %d needs %" PRIu32 " and %s", c->name, r->nslots,
                      r->has_accum ? "a" : "no", i, shape.nslots, shape.has_accum ? "one" : "none");
  if (so->ntables != r->tt.ntables)
    return ps_err_set(eb, PS_ELAYOUT, "%s: %d sparse tables; this cluster's shard %d has %d",
                      c->name, r->tt.ntables, i, so->ntables);
  for (int t = 0; t < so->ntables; t++)
    if (so->tables[t].dim != r->tt.t[t].dim ||
        (uint32_t)ps_optim_nslots(so->tables[t].optim.kind) != r->tt.t[t].nslots)
      return ps_err_set(eb, PS_ELAYOUT, "%s: sparse table %d has dim %" PRIu32 " and %" PRIu32
                        " slots; this cluster's, dim %" PRIu32 " and %d", c->name, t,
                        r->tt.t[t].dim, r->tt.t[t].nslots, so->tables[t].dim,
                        ps_optim_nslots(so->tables[t].optim.kind));
  int sync_tail = so->ntables > 0 && r->has_accum;
  uint64_t bytes = (uint64_t)so->ntables * PS_TSEC_HEAD + (sync_tail ? 8 : 0);
  uint64_t nrows[PS_MODEL_MAX_TABLES], npend[PS_MODEL_MAX_TABLES];
  for (int t = 0; t < so->ntables; t++) {
    nrows[t] = count_for(&r->rows[t], (uint32_t)i);
    npend[t] = count_for(&r->pend[t], (uint32_t)i);
    bytes += nrows[t] * ps_tsec_row_bytes(&r->tt.t[t]) + npend[t] * PS_TSEC_ENTRY;
  }
  *info = shape;
  info->version = r->version;
  info->global_step = r->global_step;
  info->accum_count = 0;
  info->table_floats = bytes / sizeof(float);
  info->image_floats = ps_state_image_floats(info, so->nfloats);
  *img = calloc((size_t)info->image_floats ? (size_t)info->image_floats : 1, sizeof(float));
  if (*img == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory for shard %d's state image", i);
  /* Dense: values and slots cut out of the whole variables; the
   * accumulator (sync) empty, as no gradient is summed; the exactly-once
   * rows empty (calloc). */
  for (uint32_t k = 0; k <= r->nslots; k++)
    ps_layout_gather(r->layout, r->vars, i, r->arena[k],
                     ps_state_segment(*img, so->nfloats, k));
  uint8_t *p = (uint8_t *)(*img + ps_state_tables_at(info, so->nfloats));
  for (int t = 0; t < so->ntables; t++) {
    ps_put_le64(p, nrows[t]);
    ps_put_le64(p + 8, npend[t]);
    p += PS_TSEC_HEAD;
    size_t row_floats = (size_t)r->tt.t[t].dim * (1 + r->tt.t[t].nslots);
    p = merge(&r->rows[t], c->nshards, (uint32_t)i, row_floats, p);
    p = merge(&r->pend[t], c->nshards, (uint32_t)i, 0, p);
  }
  if (sync_tail)
    ps_put_le64(p, 0);
  return 0;
}
