/* A step's sparse inputs on the worker (see embed.h). */
#include "worker/embed.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ps_embed_init(ps_embed *e, const ps_model *m, int max_batch, int nfields) {
  memset(e, 0, sizeof *e);
  e->model = m;
  e->max_batch = max_batch;
  e->nfields = nfields;
  size_t b = (size_t)(max_batch > 0 ? max_batch : 1);
  if ((e->sort = malloc(2 * b * sizeof *e->sort)) == NULL)
    return -ENOMEM;
  for (int t = 0; t < m->ntables; t++) {
    const ps_sparse_spec *ts = &m->tables[t];
    if (ts->field < 0 || ts->field >= nfields)
      return -EINVAL;
    size_t row = (size_t)ts->dim * sizeof(float);
    e->keys[t] = malloc(b * sizeof *e->keys[t]);
    e->bag[t] = malloc(b * sizeof *e->bag[t]);
    e->rows[t] = malloc(b * row);
    e->grads[t] = malloc(b * row);
    if (e->keys[t] == NULL || e->bag[t] == NULL || e->rows[t] == NULL || e->grads[t] == NULL)
      return -ENOMEM;
  }
  return 0;
}

void ps_embed_free(ps_embed *e) {
  for (int t = 0; t < PS_MODEL_MAX_TABLES; t++) {
    free(e->keys[t]);
    free(e->bag[t]);
    free(e->rows[t]);
    free(e->grads[t]);
  }
  free(e->sort);
  memset(e, 0, sizeof *e);
}

static int pair_cmp(const void *a, const void *b) {
  const uint64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] > y[1]) - (x[1] < y[1]);
}

void ps_embed_keys(ps_embed *e, const uint64_t *keys, int n) {
  e->n = n;
  for (int t = 0; t < e->model->ntables; t++) {
    int f = e->model->tables[t].field;
    for (int i = 0; i < n; i++) {
      e->sort[2 * i] = keys[(size_t)i * (size_t)e->nfields + (size_t)f];
      e->sort[2 * i + 1] = (uint64_t)i;
    }
    qsort(e->sort, (size_t)n, 2 * sizeof *e->sort, pair_cmp);
    size_t u = 0;
    for (int i = 0; i < n; i++) {
      uint64_t key = e->sort[2 * i];
      if (u == 0 || e->keys[t][u - 1] != key)
        e->keys[t][u++] = key;
      e->bag[t][e->sort[2 * i + 1]] = (uint32_t)(u - 1);
    }
    e->nkeys[t] = u;
  }
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
  }
}

void ps_embed_pool(const ps_embed *e, float *emb) {
  size_t width = e->model->emb_size;
  for (int t = 0; t < e->model->ntables; t++) {
    const ps_sparse_spec *ts = &e->model->tables[t];
    size_t dim = (size_t)ts->dim;
    for (int i = 0; i < e->n; i++)
      memcpy(emb + (size_t)i * width + ts->offset, e->rows[t] + e->bag[t][i] * dim,
             dim * sizeof(float));
  }
}

void ps_embed_scatter(ps_embed *e, const float *demb) {
  size_t width = e->model->emb_size;
  for (int t = 0; t < e->model->ntables; t++) {
    const ps_sparse_spec *ts = &e->model->tables[t];
    size_t dim = (size_t)ts->dim;
    memset(e->grads[t], 0, e->nkeys[t] * dim * sizeof(float));
    for (int i = 0; i < e->n; i++) {
      float *g = e->grads[t] + e->bag[t][i] * dim;
      const float *d = demb + (size_t)i * width + ts->offset;
      for (size_t k = 0; k < dim; k++)
        g[k] += d[k];
    }
  }
}
