/* The chief's evaluations (see eval.h). */
#include "chief/eval.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "chief/bg.h"
#include "chief/cut.h"
#include "common/log.h"
#include "data/idx.h"
#include "data/npy.h"
#include "nn/compute.h"
#include "worker/client_sparse.h"
#include "worker/eval_ctr.h"

struct ps_eval {
  const ps_model *model;
  ps_compute *compute;
  ps_dataset test;
  float *test_x;         /* the test images, normalized */
  ps_bg thread;
  float *params;         /* the weights being evaluated */
  ps_eval_result res;
  int ready;             /* res holds an evaluation not yet taken */
  ps_eval_ctr *ctr;      /* a model with sparse tables: its evaluator instead */
};

ps_eval *ps_eval_new(const ps_config *cfg, const ps_model *model) {
  ps_eval *e = calloc(1, sizeof *e);
  ps_errbuf eb = {0};
  if (e == NULL) {
    ps_log(PS_LOG_WARN, "evaluations off: out of memory");
    return NULL;
  }
  e->model = model;
  if (model->ntables > 0 || cfg->data_format == PS_DATA_CRITEO) {
    char path[PS_CONFIG_PATH_MAX];
    if (cfg->test_data[0] == '\0')
      ps_err_set(&eb, -ENOENT, "no [data] test file");
    else if (model->ntables > 0 && cfg->data_format == PS_DATA_CRITEO)
      e->ctr = ps_eval_ctr_new(model, ps_config_file_path(cfg, cfg->test_data, path, sizeof path),
                               (int)cfg->batch, (int)cfg->bag_separator, 0, NULL, &eb);
    if (e->ctr == NULL) {
      ps_log(PS_LOG_INFO, "evaluations off: %s", eb.msg[0] ? eb.msg : "a model without sparse "
             "tables on Criteo data has nothing to evaluate it with here");
      free(e);
      return NULL;
    }
    return e;
  }
  char path[PS_CONFIG_PATH_MAX];
  if (cfg->data_format == PS_DATA_NPY && cfg->test_data[0] == '\0') {
    ps_log(PS_LOG_INFO, "evaluations off: [data] format = npy without [data] test");
    free(e);
    return NULL;
  }
  if (cfg->data_format == PS_DATA_NPY
          ? ps_npy_load(ps_config_file_path(cfg, cfg->test_data, path, sizeof path), &e->test,
                        &eb) != 0
          : ps_dataset_load(cfg->data_dir, "t10k", &e->test, &eb) != 0) {
    ps_log(PS_LOG_WARN, "%s: evaluations off", eb.msg);
    free(e);
    return NULL;
  }
  if (cfg->data_format == PS_DATA_NPY
          ? ps_model_check_inputs(model, e->test.dim, e->test.classes, &eb) != 0
          : ps_model_check_data(model, e->test.rows, e->test.cols, 10, &eb) != 0) {
    ps_log(PS_LOG_INFO, "evaluations off: %s", eb.msg);
    ps_eval_free(e);
    return NULL;
  }
  e->test_x = malloc(e->test.n * model->in_size * sizeof(float));
  e->compute = e->test_x ? ps_compute_new(model, 1, 256, &eb) : NULL;
  if (e->compute == NULL) {
    ps_log(PS_LOG_WARN, "evaluations off: %s", e->test_x ? eb.msg : "out of memory");
    ps_eval_free(e);
    return NULL;
  }
  ps_dataset_inputs(&e->test, NULL, e->test.n, e->test_x);
  return e;
}

static void *eval_main(void *arg) {
  ps_eval *e = arg;
  ps_eval_result *r = &e->res;
  size_t total = e->model->vars.total;
  if (!ps_find_nonfinite(e->params, total, -1, r->nonfinite, sizeof r->nonfinite)) {
    size_t right = 0;
    r->loss = ps_compute_eval(e->compute, e->params, e->test_x, e->test.labels, e->test.n, &right);
    r->accuracy = (double)right / (double)e->test.n;
  }
  free(e->params);
  e->params = NULL;
  return NULL;
}

void ps_eval_start(ps_eval *e, uint64_t step, float *params, int wait) {
  e->res = (ps_eval_result){.step = step};
  e->params = params;
  e->ready = 0;
  if (wait || ps_bg_start(&e->thread, eval_main, e) != 0) {
    eval_main(e);
    e->ready = 1;
  }
}

int ps_eval_busy(ps_eval *e) { return e->ready || ps_bg_busy(&e->thread); }

int ps_eval_finished(ps_eval *e, ps_eval_result *out) {
  if (ps_bg_finished(&e->thread) != NULL)
    e->ready = 1;
  if (!e->ready)
    return 0;
  e->ready = 0;
  *out = e->res;
  return 1;
}

void ps_eval_free(ps_eval *e) {
  if (e == NULL)
    return;
  while (ps_bg_busy(&e->thread) && ps_bg_finished(&e->thread) == NULL)
    usleep(10000);
  free(e->params);
  ps_eval_ctr_free(e->ctr);
  ps_compute_free(e->compute);
  free(e->test_x);
  ps_dataset_close(&e->test);
  free(e);
}

int ps_eval_needs_client(const ps_eval *e) { return e->ctr != NULL; }

/* A test batch's rows, pulled through the chief's client, and the lease
 * checked between batches. */
typedef struct pull_arg {
  ps_client *c;
  int (*tick)(void *);
  void *arg;
} pull_arg;

static int pull_rows(void *arg, ps_embed *emb, float *params, ps_errbuf *eb) {
  pull_arg *a = arg;
  if (a->tick != NULL && a->tick(a->arg) != 0)
    return ps_err_set(eb, -ECANCELED, "stopped");
  ps_sparse_batch want;
  ps_embed_batch(emb, &want);
  int rc = ps_client_pull_sparse(a->c, params, &want);
  return rc != 0 ? ps_err_set(eb, rc, "%s", ps_client_error(a->c)) : 0;
}

int ps_eval_pulled(ps_eval *e, ps_client *c, uint64_t step, float *params, int (*tick)(void *),
                   void *arg) {
  ps_eval_result *r = &e->res;
  *r = (ps_eval_result){.step = step};
  int rc = 0;
  if (!ps_find_nonfinite(params, e->model->vars.total, -1, r->nonfinite, sizeof r->nonfinite)) {
    ps_eval_ctr_result cr = {0};
    ps_errbuf eb = {0};
    pull_arg pa = {c, tick, arg};
    rc = ps_eval_ctr_run(e->ctr, params, pull_rows, &pa, &cr, &eb);
    if (rc != 0)
      ps_log(PS_LOG_WARN, "evaluation at global step %llu: %s", (unsigned long long)step, eb.msg);
    r->loss = cr.logloss;
    r->auc = cr.auc;
    r->has_auc = 1;
  }
  free(params);
  e->ready = rc == 0;
  return rc == 0 ? 0 : -1;
}
