/* A step's sparse inputs on the worker (see embed.h). */
#include "worker/embed.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int ps_embed_init(ps_embed *e, const ps_model *m, int max_batch, int nfields) {
  memset(e, 0, sizeof *e);
  e->model = m;
  e->max_batch = max_batch;
  e->nfields = nfields;
  size_t b = (size_t)(max_batch > 0 ? max_batch : 1);
  for (int t = 0; t < m->ntables; t++) {
    if (m->tables[t].field < 0 || m->tables[t].field >= nfields)
      return -EINVAL;
    if ((e->boff[t] = malloc((b + 1) * sizeof *e->boff[t])) == NULL)
      return -ENOMEM;
  }
  return 0;
}

int ps_embed_server_pooling(ps_embed *e) {
  size_t b = (size_t)(e->max_batch > 0 ? e->max_batch : 1);
  for (int t = 0; t < e->model->ntables; t++) {
    if (!e->model->tables[t].server_pool)
      continue;
    size_t row = (size_t)e->model->tables[t].dim * sizeof(float);
    e->server[t] = 1;
    if ((e->pooled[t] = malloc(b * row)) == NULL || (e->bgrads[t] = malloc(b * row)) == NULL)
      return -ENOMEM;
  }
  return 0;
}

void ps_embed_free(ps_embed *e) {
  for (int t = 0; t < PS_MODEL_MAX_TABLES; t++) {
    free(e->pooled[t]);
    free(e->bgrads[t]);
    free(e->keys[t]);
    free(e->bag[t]);
    free(e->boff[t]);
    free(e->rows[t]);
    free(e->grads[t]);
  }
  free(e->sort);
  memset(e, 0, sizeof *e);
}

/* Room for n elements of `size` bytes in *p, which holds *cap.  @return 0
 * or -ENOMEM (*p unchanged). */
static int grow(void **p, size_t *cap, size_t n, size_t size) {
  if (n <= *cap)
    return 0;
  size_t c = *cap * 2 > n ? *cap * 2 : n;
  void *q = realloc(*p, c * size);
  if (q == NULL)
    return -ENOMEM;
  *p = q;
  *cap = c;
  return 0;
}

static int pair_cmp(const void *a, const void *b) {
  const uint64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] > y[1]) - (x[1] < y[1]);
}

/* Table t's keys of field f: its bags (boff), their keys' distinct values
 * ascending (keys) and each key's index among them (bag). */
static int table_keys(ps_embed *e, int t, const uint64_t *keys, const uint32_t *offs, int n) {
  size_t nf = (size_t)e->nfields, f = (size_t)e->model->tables[t].field;
  uint32_t *boff = e->boff[t];
  size_t occ = 0;
  for (int i = 0; i < n; i++) {
    boff[i] = (uint32_t)occ;
    occ += offs == NULL ? 1 : offs[(size_t)i * nf + f + 1] - offs[(size_t)i * nf + f];
  }
  boff[n] = (uint32_t)occ;
  size_t dim = (size_t)e->model->tables[t].dim;
  if (grow((void **)&e->sort, &e->sort_cap, 2 * occ, sizeof *e->sort) != 0 ||
      grow((void **)&e->bag[t], &e->occ_cap[t], occ, sizeof *e->bag[t]) != 0)
    return -ENOMEM;
  if (grow((void **)&e->keys[t], &e->keys_cap[t], occ, sizeof *e->keys[t]) != 0 ||
      grow((void **)&e->rows[t], &e->rows_cap[t], occ * dim, sizeof(float)) != 0 ||
      grow((void **)&e->grads[t], &e->grads_cap[t], occ * dim, sizeof(float)) != 0)
    return -ENOMEM;
  size_t o = 0;
  for (int i = 0; i < n; i++) {
    size_t a = offs == NULL ? (size_t)i * nf + f : offs[(size_t)i * nf + f];
    for (size_t j = boff[i]; j < boff[i + 1]; j++, o++) {
      e->sort[2 * o] = keys[a + j - boff[i]];
      e->sort[2 * o + 1] = o;
    }
  }
  qsort(e->sort, occ, 2 * sizeof *e->sort, pair_cmp);
  size_t u = 0;
  for (size_t j = 0; j < occ; j++) {
    uint64_t key = e->sort[2 * j];
    if (u == 0 || e->keys[t][u - 1] != key)
      e->keys[t][u++] = key;
    e->bag[t][e->sort[2 * j + 1]] = (uint32_t)(u - 1);
  }
  e->nkeys[t] = u;
  return 0;
}

int ps_embed_keys(ps_embed *e, const uint64_t *keys, const uint32_t *offs, int n) {
  e->n = n > e->max_batch ? e->max_batch : n;
  for (int t = 0; t < e->model->ntables; t++)
    if (table_keys(e, t, keys, offs, e->n) != 0)
      return -ENOMEM;
  return 0;
}

size_t ps_embed_nrows(const ps_embed *e) {
  size_t n = 0;
  for (int t = 0; t < e->model->ntables; t++)
    n += e->nkeys[t];
  return n;
}

void ps_embed_batch(const ps_embed *e, ps_sparse_batch *b) {
  memset(b, 0, sizeof *b);
  b->ntables = e->model->ntables;
  for (int t = 0; t < b->ntables; t++) {
    b->dims[t] = (uint32_t)e->model->tables[t].dim;
    b->keys[t] = e->keys[t];
    b->n[t] = e->nkeys[t];
    b->grads[t] = e->grads[t];
    b->rows[t] = e->rows[t];
    if (e->server[t]) {
      b->bags[t] = 1;
      b->nsamples[t] = (size_t)e->n;
      b->boff[t] = e->boff[t];
      b->bag[t] = e->bag[t];
      b->pooled[t] = e->pooled[t];
      b->bgrads[t] = e->bgrads[t];
    }
  }
}

/* The factor a bag of c keys is pooled with: 1 (sum), 1/c (mean) or
 * 1/sqrt(c) (sqrtn); 1 for an empty bag, which pools to zeros. */
static float bag_scale(ps_combiner comb, size_t c) {
  if (c <= 1 || comb == PS_COMBINER_SUM)
    return 1.0f;
  return comb == PS_COMBINER_MEAN ? 1.0f / (float)c : 1.0f / sqrtf((float)c);
}

void ps_embed_pool(const ps_embed *e, float *emb) {
  size_t width = e->model->emb_size;
  for (int t = 0; t < e->model->ntables; t++) {
    const ps_sparse_spec *ts = &e->model->tables[t];
    size_t dim = (size_t)ts->dim;
    const uint32_t *boff = e->boff[t], *bag = e->bag[t];
    for (int i = 0; i < e->n; i++) {
      float *out = emb + (size_t)i * width + ts->offset;
      size_t c = boff[i + 1] - boff[i];
      if (e->server[t]) {  /* the shards' sums, summed over them */
        float s = bag_scale(ts->combiner, c);
        const float *in = e->pooled[t] + (size_t)i * dim;
        for (size_t k = 0; k < dim; k++)
          out[k] = s * in[k];
        continue;
      }
      if (c == 1) {
        memcpy(out, e->rows[t] + bag[boff[i]] * dim, dim * sizeof(float));
        continue;
      }
      memset(out, 0, dim * sizeof(float));
      for (size_t j = boff[i]; j < boff[i + 1]; j++) {
        const float *row = e->rows[t] + bag[j] * dim;
        for (size_t k = 0; k < dim; k++)
          out[k] += row[k];
      }
      float s = bag_scale(ts->combiner, c);
      if (s != 1.0f)
        for (size_t k = 0; k < dim; k++)
          out[k] *= s;
    }
  }
}

void ps_embed_scatter(ps_embed *e, const float *demb) {
  size_t width = e->model->emb_size;
  for (int t = 0; t < e->model->ntables; t++) {
    const ps_sparse_spec *ts = &e->model->tables[t];
    size_t dim = (size_t)ts->dim;
    const uint32_t *boff = e->boff[t], *bag = e->bag[t];
    if (e->server[t]) {  /* each sample's gradient: the shards scatter it */
      for (int i = 0; i < e->n; i++) {
        const float *d = demb + (size_t)i * width + ts->offset;
        float s = bag_scale(ts->combiner, boff[i + 1] - boff[i]), *g = e->bgrads[t] + i * dim;
        for (size_t k = 0; k < dim; k++)
          g[k] = s * d[k];
      }
      continue;
    }
    memset(e->grads[t], 0, e->nkeys[t] * dim * sizeof(float));
    for (int i = 0; i < e->n; i++) {
      const float *d = demb + (size_t)i * width + ts->offset;
      float s = bag_scale(ts->combiner, boff[i + 1] - boff[i]);
      for (size_t j = boff[i]; j < boff[i + 1]; j++) {
        float *g = e->grads[t] + bag[j] * dim;
        for (size_t k = 0; k < dim; k++)
          g[k] += s * d[k];
      }
    }
  }
}
