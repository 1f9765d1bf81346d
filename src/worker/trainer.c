/* What a training process computes with (see trainer.h). */
#include "worker/trainer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

volatile sig_atomic_t *ps_trainer_start_process(const ps_config *cfg, int index) {
  char tag[32];
  snprintf(tag, sizeof tag, "worker.%d", index);
  int level = ps_log_level_parse(cfg->log_level);
  ps_log_init(tag, level < 0 ? PS_LOG_INFO : level);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  return &stop_requested;
}

int ps_trainer_open(ps_trainer *t, const ps_config *cfg, const ps_model *model, int index) {
  ps_errbuf eb = {0};
  memset(t, 0, sizeof *t);
  t->model = model;
  t->total = model->vars.total;
  t->batch = (int)cfg->batch;
  if (model->nlayers == 0) {
    ps_log(PS_LOG_ERROR, "%s: [model] variables = %s: a model of variables and no layers: "
           "expected [model] name or file for a worker (variables train through the client "
           "library, src/nn/MODELFILE.md)", cfg->path, cfg->variables_file);
    return 2;
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = cfg->threads > 0 ? (int)cfg->threads : (cores > 0 ? (int)cores : 1);
  t->compute = ps_compute_new_on(model, (int)cfg->device, threads, t->batch, &eb);
  if (t->compute == NULL) {
    ps_log(PS_LOG_ERROR, "[worker] device: %s", eb.msg);
    return eb.code == -ENODEV ? 2 : 1;
  }
  if (ps_dataset_load(cfg->data_dir, "train", &t->train, &eb) != 0 ||
      (index == 0 && ps_dataset_load(cfg->data_dir, "t10k", &t->test, &eb) != 0)) {
    /* A data set that is missing or broken: a restart would not change it. */
    ps_log(PS_LOG_ERROR, "[model] data_dir: %s", eb.msg);
    return eb.code == -ENOMEM ? 1 : 2;
  }
  if (ps_model_check_data(model, t->train.rows, t->train.cols, 10, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s: %s", cfg->path, eb.msg);
    return 2;
  }
  t->params = ps_compute_host_alloc(t->compute, t->total * sizeof *t->params);
  t->grad = ps_compute_host_alloc(t->compute, t->total * sizeof *t->grad);
  t->x = ps_compute_host_alloc(t->compute, (size_t)t->batch * model->in_size * sizeof *t->x);
  t->y = malloc((size_t)t->batch);
  t->idx = malloc((size_t)t->batch * sizeof *t->idx);
  if (t->params == NULL || t->grad == NULL || t->x == NULL || t->y == NULL || t->idx == NULL ||
      ps_sampler_init(&t->sampler, t->train.n, index, cfg->nworkers, (uint64_t)cfg->seed) != 0) {
    ps_log(PS_LOG_ERROR, "out of memory (batch %d, %zu parameters)", t->batch, t->total);
    return 1;
  }
  return 0;
}

void ps_trainer_close(ps_trainer *t) {
  free(t->idx);
  free(t->y);
  if (t->compute != NULL) {
    ps_compute_host_free(t->compute, t->x);
    ps_compute_host_free(t->compute, t->grad);
    ps_compute_host_free(t->compute, t->params);
  }
  ps_compute_free(t->compute);
  ps_sampler_close(&t->sampler);
  ps_dataset_close(&t->test);
  ps_dataset_close(&t->train);
  memset(t, 0, sizeof *t);
}

size_t ps_trainer_batch(ps_trainer *t) {
  return ps_dataset_batch(&t->train, &t->sampler, t->idx, (size_t)t->batch, t->x, t->y);
}

int ps_trainer_final_test(ps_trainer *t, const float *params, uint64_t global_step) {
  const ps_dataset *test = &t->test;
  float *x = malloc((test->n ? test->n : 1) * t->model->in_size * sizeof *x);
  if (x == NULL) {
    ps_log(PS_LOG_ERROR, "out of memory for the test set");
    return -ENOMEM;
  }
  ps_dataset_images_f32(test, NULL, test->n, PS_DATA_MEAN, PS_DATA_STD, x);
  size_t right = 0;
  ps_compute_eval(t->compute, params, x, test->labels, test->n, &right);
  printf("final test_acc %.4f global_step %" PRIu64 "\n", (double)right / (double)test->n,
         global_step);
  free(x);
  return 0;
}
