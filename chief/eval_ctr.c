/* The chief's evaluation of a model with sparse tables (see eval_ctr.h). */
#include "chief/eval_ctr.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "data/criteo.h"
#include "nn/auc.h"
#include "nn/compute.h"
#include "worker/client_sparse.h"
#include "worker/embed.h"

struct ps_eval_ctr {
  const ps_model *model;
  char path[PS_CONFIG_PATH_MAX];
  int batch;
  ps_compute *compute;
  ps_embed embed;
  float *x, *labels, *emb;
  uint64_t *keys;
  float *scores;       /* every test sample's, grown as the file is read */
  uint8_t *truth;
  size_t cap;
};

void ps_eval_ctr_free(ps_eval_ctr *e) {
  if (e == NULL)
    return;
  ps_compute_free(e->compute);
  ps_embed_free(&e->embed);
  free(e->x);
  free(e->labels);
  free(e->emb);
  free(e->keys);
  free(e->scores);
  free(e->truth);
  free(e);
}

ps_eval_ctr *ps_eval_ctr_new(const ps_config *cfg, const ps_model *model, ps_errbuf *eb) {
  if (cfg->test_data[0] == '\0') {
    ps_err_set(eb, -ENOENT, "no [data] test file");
    return NULL;
  }
  ps_eval_ctr *e = calloc(1, sizeof *e);
  if (e == NULL) {
    ps_err_set(eb, -ENOMEM, "out of memory");
    return NULL;
  }
  e->model = model;
  e->batch = (int)cfg->batch;
  ps_config_file_path(cfg, cfg->test_data, e->path, sizeof e->path);
  size_t b = (size_t)e->batch;
  e->compute = ps_compute_new(model, 1, e->batch, eb);
  e->x = malloc(b * PS_CRITEO_NDENSE * sizeof *e->x);
  e->labels = malloc(b * sizeof *e->labels);
  e->emb = malloc(b * model->emb_size * sizeof *e->emb);
  e->keys = malloc(b * PS_CRITEO_NSPARSE * sizeof *e->keys);
  if (e->compute == NULL || e->x == NULL || e->labels == NULL || e->emb == NULL ||
      e->keys == NULL || ps_embed_init(&e->embed, model, e->batch, PS_CRITEO_NSPARSE) != 0) {
    if (e->compute != NULL)
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

int ps_eval_ctr_run(ps_eval_ctr *e, ps_client *c, float *params, int (*tick)(void *), void *arg,
                    ps_eval_ctr_result *out, ps_errbuf *eb) {
  ps_criteo *rd = NULL;
  size_t total = 0;
  int rc = ps_criteo_open(&rd, e->path, 0, 1, eb);
  for (ssize_t n = e->batch; rc == 0 && n == e->batch;) {
    /* One pass: a batch short of full ends it; one read from the pass
     * after (the file a multiple of the batch) is not used. */
    n = ps_criteo_next(rd, (size_t)e->batch, e->labels, e->x, e->keys, eb);
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
    ps_sparse_batch want;
    ps_embed_keys(&e->embed, e->keys, (int)n);
    ps_embed_batch(&e->embed, &want);
    if ((rc = ps_client_pull_sparse(c, params, &want)) != 0) {
      ps_err_set(eb, rc, "%s", ps_client_error(c));
      break;
    }
    ps_embed_pool(&e->embed, e->emb);
    ps_compute_predict(e->compute, params, e->x, e->emb, (int)n, e->scores + total);
    for (ssize_t i = 0; i < n; i++)
      e->truth[total + (size_t)i] = e->labels[i] > 0.5f;
    total += (size_t)n;
    if (tick != NULL && tick(arg) != 0) {
      rc = ps_err_set(eb, -ECANCELED, "stopped");
      break;
    }
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
