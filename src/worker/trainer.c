/* What a training process computes with (see trainer.h). */
#include "worker/trainer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "data/npy.h"

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

/* The buffers every data format needs: parameters, gradient, a batch. */
static int alloc_step(ps_trainer *t) {
  const ps_model *model = t->model;
  t->params = ps_compute_host_alloc(t->compute, t->total * sizeof *t->params);
  t->grad = ps_compute_host_alloc(t->compute, t->total * sizeof *t->grad);
  t->x = ps_compute_host_alloc(t->compute, (size_t)t->batch * model->in_size * sizeof *t->x);
  t->y = malloc((size_t)t->batch);
  if (t->params == NULL || t->grad == NULL || t->x == NULL || t->y == NULL) {
    ps_log(PS_LOG_ERROR, "out of memory (batch %d, %zu parameters)", t->batch, t->total);
    return 1;
  }
  return 0;
}

static int open_criteo(ps_trainer *t, const ps_config *cfg, const ps_model *model, int index) {
  ps_errbuf eb = {0};
  char path[PS_CONFIG_PATH_MAX];
  if (model->in_size != PS_CRITEO_NDENSE || model->spec.classes != 1) {
    ps_log(PS_LOG_ERROR, "%s: [data] format = criteo with a model of %zu inputs and %d outputs: "
           "expected input [%d] (the integer features) and one output (sigmoid), as in "
           "models/ctr.json", cfg->path, model->in_size, model->spec.classes, PS_CRITEO_NDENSE);
    return 2;
  }
  for (int k = 0; k < model->ntables; k++)
    if (model->tables[k].field >= PS_CRITEO_NSPARSE) {
      ps_log(PS_LOG_ERROR, "%s: sparse table %s reads categorical field %d: Criteo data has "
             "fields 1 to %d", cfg->path, model->tables[k].name, model->tables[k].field + 1,
             PS_CRITEO_NSPARSE);
      return 2;
    }
  if (ps_criteo_open(&t->reader, ps_config_file_path(cfg, cfg->train_data, path, sizeof path),
                     index, cfg->nworkers, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "[data] train: %s", eb.msg);
    return eb.code == -ENOMEM ? 1 : 2;
  }
  size_t b = (size_t)t->batch;
  t->labels = malloc(b * sizeof *t->labels);
  if (cfg->bag_separator >= 0)
    ps_criteo_set_bags(t->reader, (int)cfg->bag_separator);
  int nokeys = ps_criteo_keys_init(&t->keys, b, cfg->bag_separator >= 0) != 0;
  if (model->emb_size > 0) {
    t->emb = malloc(b * model->emb_size * sizeof *t->emb);
    t->demb = malloc(b * model->emb_size * sizeof *t->demb);
  }
  if (t->labels == NULL || nokeys ||
      (model->emb_size > 0 && (t->emb == NULL || t->demb == NULL))) {
    ps_log(PS_LOG_ERROR, "out of memory (batch %d)", t->batch);
    return 1;
  }
  return alloc_step(t);
}

/* The user's own data (src/data/NPY.md): [data] train, and for worker 0
 * [data] test when set; the model must take its samples and classes. */
static int load_npy(ps_trainer *t, const ps_config *cfg, const ps_model *model, int index) {
  ps_errbuf eb = {0};
  char path[PS_CONFIG_PATH_MAX];
  const char *keys[2] = {"train", "test"}, *dirs[2] = {cfg->train_data, cfg->test_data};
  ps_dataset *sets[2] = {&t->train, &t->test};
  for (int i = 0; i < (index == 0 ? 2 : 1); i++) {
    if (dirs[i][0] == '\0')
      continue;
    if (ps_npy_load(ps_config_file_path(cfg, dirs[i], path, sizeof path), sets[i], &eb) != 0) {
      /* Data that is missing or broken: a restart would not change it. */
      ps_log(PS_LOG_ERROR, "[data] %s: %s", keys[i], eb.msg);
      return eb.code == -ENOMEM ? 1 : 2;
    }
  }
  if (t->test.n > 0 && t->test.dim != t->train.dim) {
    ps_log(PS_LOG_ERROR, "[data] test %s: %zu floats a sample, the training data %zu: expected "
           "the same", path, t->test.dim, t->train.dim);
    return 2;
  }
  int classes = t->test.classes > t->train.classes ? t->test.classes : t->train.classes;
  if (ps_model_check_inputs(model, t->train.dim, classes, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s: [data] format = npy: %s", cfg->path, eb.msg);
    return 2;
  }
  return 0;
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
  if (cfg->data_format == PS_DATA_CRITEO)
    return open_criteo(t, cfg, model, index);
  if (model->ntables > 0) {
    ps_log(PS_LOG_ERROR, "%s: a model with sparse tables reads [data] format = criteo, not %s",
           cfg->path, cfg->data_format == PS_DATA_NPY ? "npy" : "idx");
    return 2;
  }
  if (cfg->data_format == PS_DATA_NPY) {
    int rc = load_npy(t, cfg, model, index);
    if (rc != 0)
      return rc;
  } else {
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
  }
  if (t->train.n < (size_t)cfg->nworkers) {
    ps_log(PS_LOG_ERROR, "[data] train: %zu samples, fewer than the %d workers: expected at "
           "least one a worker", t->train.n, cfg->nworkers);
    return 2;
  }
  if (alloc_step(t) != 0)
    return 1;
  t->idx = malloc((size_t)t->batch * sizeof *t->idx);
  if (t->idx == NULL ||
      ps_sampler_init(&t->sampler, t->train.n, index, cfg->nworkers, (uint64_t)cfg->seed) != 0) {
    ps_log(PS_LOG_ERROR, "out of memory (batch %d, %zu parameters)", t->batch, t->total);
    return 1;
  }
  return 0;
}

void ps_trainer_close(ps_trainer *t) {
  ps_criteo_close(t->reader);
  free(t->labels);
  ps_criteo_keys_free(&t->keys);
  free(t->emb);
  free(t->demb);
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
  if (t->reader == NULL)
    return ps_dataset_batch(&t->train, &t->sampler, t->idx, (size_t)t->batch, t->x, t->y);
  ps_errbuf eb = {0};
  ssize_t n = ps_criteo_next_bags(t->reader, (size_t)t->batch, t->labels, t->x, &t->keys, &eb);
  if (n < 0) {
    ps_log(PS_LOG_ERROR, "[data] train: %s", eb.msg);
    exit(n == -ENOMEM ? 1 : 2);
  }
  for (ssize_t i = 0; i < n; i++)
    t->y[i] = t->labels[i] > 0.5f;
  return (size_t)n;
}

void ps_trainer_embed(ps_trainer *t, ps_embed *e, size_t n) {
  if (ps_embed_keys(e, t->keys.keys, t->keys.offs, (int)n) != 0) {
    ps_log(PS_LOG_ERROR, "out of memory for the keys of a batch of %zu samples", n);
    exit(1);
  }
}

ps_data_pos ps_trainer_pos(const ps_trainer *t) {
  return t->reader != NULL ? ps_criteo_pos(t->reader) : t->sampler.pos;
}

int ps_trainer_seek(ps_trainer *t, ps_data_pos pos) {
  if (t->reader == NULL)
    return ps_sampler_seek(&t->sampler, pos);
  ps_errbuf eb = {0};
  int rc = ps_criteo_seek(t->reader, pos, &eb);
  if (rc != 0 && rc != -EINVAL) {
    ps_log(PS_LOG_ERROR, "[data] train: %s", eb.msg);
    exit(rc == -ENOMEM ? 1 : 2);
  }
  return rc;
}

size_t ps_trainer_part_size(const ps_trainer *t) {
  return t->reader != NULL ? 0 : ps_sampler_part_size(&t->sampler);
}

int ps_trainer_final_test(ps_trainer *t, const float *params, uint64_t global_step) {
  const ps_dataset *test = &t->test;
  if (test->n == 0) {
    ps_log(PS_LOG_INFO, "no [data] test: no final test accuracy");
    return 0;
  }
  float *x = malloc((test->n ? test->n : 1) * t->model->in_size * sizeof *x);
  if (x == NULL) {
    ps_log(PS_LOG_ERROR, "out of memory for the test set");
    return -ENOMEM;
  }
  ps_dataset_inputs(test, NULL, test->n, x);
  size_t right = 0;
  ps_compute_eval(t->compute, params, x, test->labels, test->n, &right);
  printf("final test_acc %.4f global_step %" PRIu64 "\n", (double)right / (double)test->n,
         global_step);
  free(x);
  return 0;
}
