/* The evaluation of a model with sparse tables (see eval_ctr.h). */
#include "worker/eval_ctr.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "data/criteo.h"
#include "nn/auc.h"

struct ps_eval_ctr {
  const ps_model *model;
  char path[4096];
  int batch;
  uint64_t max_samples;
  ps_compute *compute;
  int own_compute;
  ps_embed embed;
  float *x, *labels, *emb;
  ps_criteo_keys keys;
  int sep;
  float *scores;       /* every test sample's, grown as the file is read */
  uint8_t *truth;
  size_t cap;
};

void ps_eval_ctr_free(ps_eval_ctr *e) {
  if (e == NULL)
    return;
  if (e->compute != NULL)
    ps_compute_host_free(e->compute, e->x);
  if (e->own_compute)
    ps_compute_free(e->compute);
  ps_embed_free(&e->embed);
  free(e->labels);
  free(e->emb);
  ps_criteo_keys_free(&e->keys);
  free(e->scores);
  free(e->truth);
  free(e);
}

ps_eval_ctr *ps_eval_ctr_new(const ps_model *model, const char *path, int batch, int sep,
                             uint64_t max_samples, ps_compute *compute, ps_errbuf *eb) {
  ps_eval_ctr *e = calloc(1, sizeof *e);
  if (e == NULL) {
    ps_err_set(eb, -ENOMEM, "out of memory");
    return NULL;
  }
  e->model = model;
  e->batch = batch;
  e->max_samples = max_samples;
  e->sep = sep;
  snprintf(e->path, sizeof e->path, "%s", path);
  size_t b = (size_t)batch;
  e->compute = compute;
  if (compute == NULL) {
    e->compute = ps_compute_new(model, 1, batch, eb);
    e->own_compute = 1;
    if (e->compute == NULL) {
      ps_eval_ctr_free(e);
      return NULL;
    }
  }
  e->x = ps_compute_host_alloc(e->compute, b * PS_CRITEO_NDENSE * sizeof *e->x);
  e->labels = malloc(b * sizeof *e->labels);
  e->emb = malloc(b * (model->emb_size ? model->emb_size : 1) * sizeof *e->emb);
  if (e->x == NULL || e->labels == NULL || e->emb == NULL ||
      ps_criteo_keys_init(&e->keys, b, sep >= 0) != 0 ||
      ps_embed_init(&e->embed, model, batch, PS_CRITEO_NSPARSE) != 0) {
    ps_err_set(eb, -ENOMEM, "out of memory for the evaluation's batches");
    ps_eval_ctr_free(e);
    return NULL;
  }
  return e;
}

/* Room for n more samples' scores and labels. */
static int room(ps_eval_ctr *e, size_t used, size_t n) {
  if (used + n <= e->cap)
    return 0;
  size_t cap = e->cap ? e->cap * 2 : 65536;
  while (cap < used + n)
    cap *= 2;
  float *s = realloc(e->scores, cap * sizeof *s);
  if (s == NULL)
    return -ENOMEM;
  e->scores = s;
  uint8_t *t = realloc(e->truth, cap);
  if (t == NULL)
    return -ENOMEM;
  e->truth = t;
  e->cap = cap;
  return 0;
}

int ps_eval_ctr_run(ps_eval_ctr *e, float *params, ps_eval_ctr_rows_fn *rows, void *arg,
                    ps_eval_ctr_result *out, ps_errbuf *eb) {
  ps_criteo *rd = NULL;
  size_t total = 0;
  int rc = ps_criteo_open(&rd, e->path, 0, 1, eb);
  if (rc == 0 && e->sep >= 0)
    ps_criteo_set_bags(rd, e->sep);
  while (rc == 0) {
    size_t want = (size_t)e->batch;
    if (e->max_samples > 0 && e->max_samples - total < want)
      want = (size_t)(e->max_samples - total);
    if (want == 0)
      break;
    /* One pass: a batch short of what was asked ends it; one read from
     * the pass after (the file a multiple of the batch) is not used. */
    ssize_t n = ps_criteo_next_bags(rd, want, e->labels, e->x, &e->keys, eb);
    if (n < 0) {
      rc = (int)n;
      break;
    }
    if (n == 0 || ps_criteo_pos(rd).epoch > 0)
      break;
    if ((rc = room(e, total, (size_t)n)) != 0) {
      ps_err_set(eb, rc, "out of memory for the test scores");
      break;
    }
    if ((rc = ps_embed_keys(&e->embed, e->keys.keys, e->keys.offs, (int)n)) != 0) {
      ps_err_set(eb, rc, "out of memory for the keys of a test batch");
      break;
    }
    if ((rc = rows(arg, &e->embed, params, eb)) != 0)
      break;
    ps_embed_pool(&e->embed, e->emb);
    ps_compute_predict(e->compute, params, e->x, e->model->ntables ? e->emb : NULL, (int)n,
                       e->scores + total);
    for (ssize_t i = 0; i < n; i++)
      e->truth[total + (size_t)i] = e->labels[i] > 0.5f;
    total += (size_t)n;
    if ((size_t)n < want)
      break;
  }
  ps_criteo_close(rd);
  if (rc != 0)
    return rc;
  double ll = 0;
  for (size_t i = 0; i < total; i++) {
    double p = e->scores[i] < 1e-7f ? 1e-7 : e->scores[i] > 1 - 1e-7f ? 1 - 1e-7 : e->scores[i];
    ll -= e->truth[i] ? log(p) : log(1 - p);
  }
  *out = (ps_eval_ctr_result){.auc = ps_auc(e->scores, e->truth, total),
                              .logloss = total ? ll / (double)total : 0.0, .samples = total};
  return 0;
}
