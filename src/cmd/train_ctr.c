/* `paramserv train` on Criteo data: a CTR model trained in this one
 * process.  The sparse tables are the ones a shard holds (ps/table.h, made
 * by ps_shard_opts_tables from the model), expired, pulled and pushed as a
 * shard and a worker do; the dense weights stay on the host and take
 * ps_optim_apply.  The test: AUC and log loss, as a distributed worker 0
 * reports them. */
#include "cmd/train_ctr.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cli.h"
#include "common/config.h"
#include "common/timeutil.h"
#include "data/criteo.h"
#include "nn/compute.h"
#include "nn/model.h"
#include "ps/shard.h"
#include "ps/table.h"
#include "worker/embed.h"
#include "worker/eval_ctr.h"

typedef struct ctr_run {
  const ps_train_opts *o;
  ps_model model;
  ps_compute *compute;
  ps_shard_opts so;  /* the tables' options and learning rates */
  ps_table *tables[PS_MODEL_MAX_TABLES];
  ps_embed embed;
  /* A batch: labels, dense features (x), keys, and the embedding input and
   * its gradient. */
  float *labels, *x, *emb, *demb;
  uint8_t *y;
  ps_criteo_keys keys;
  /* The dense weights, their gradient and the optimizer's slots (host). */
  float *params, *grad, *slots[PS_OPTIM_MAX_SLOTS];
  /* The test set's first ntest samples, and their evaluator. */
  uint64_t ntest;
  ps_eval_ctr *eval;
} ctr_run;

void ps_train_sched_setup(ps_train_opts *o, uint64_t steps_per_epoch) {
  if (o->sched.kind == PS_SCHED_STEP) {
    o->sched.step_size = (uint64_t)(o->step_epochs * (double)steps_per_epoch + 0.5);
    o->sched.gamma = (float)o->gamma;
  }
  o->sched.total = steps_per_epoch * (uint64_t)o->epochs;
  o->sched.min_factor = o->lr > 0 ? (float)(o->min_lr / o->lr) : 0.0f;
  o->sched.warmup = (uint64_t)o->warmup;
}

/* Read up to `max` samples (fewer only at the file's end): labels, x and
 * keys, and y from the labels.  @return how many, or a negative code with
 * one line in eb. */
static ssize_t read_batch(ctr_run *r, ps_criteo *rd, size_t max, ps_errbuf *eb) {
  ssize_t n = ps_criteo_next_bags(rd, max, r->labels, r->x, &r->keys, eb);
  for (ssize_t i = 0; i < n; i++)
    r->y[i] = r->labels[i] > 0.5f;
  return n;
}

/* A batch's rows from the tables into e->rows (a pull creates no row, so
 * the tables stay as they were); the weights are r->params already.  The
 * training batch's and, through ps_eval_ctr, each test batch's. */
static int table_rows(void *arg, ps_embed *e, float *params, ps_errbuf *eb) {
  (void)params;
  (void)eb;
  ctr_run *r = arg;
  for (int t = 0; t < r->model.ntables; t++)
    ps_table_pull(r->tables[t], e->keys[t], e->nkeys[t], e->rows[t]);
  return 0;
}

/* The batch's rows from the tables into the embedding input (r->emb).
 * @return 0 or -ENOMEM. */
static int pull_rows(ctr_run *r, int n) {
  if (ps_embed_keys(&r->embed, r->keys.keys, r->keys.offs, n) != 0)
    return -ENOMEM;
  table_rows(r, &r->embed, r->params, NULL);
  ps_embed_pool(&r->embed, r->emb);
  return 0;
}

/* One pass over the test file's first ntest samples (ps_eval_ctr): the
 * model's AUC and mean log loss.  @return 0, or a negative code with one
 * line in eb. */
static int evaluate(ctr_run *r, double *auc, double *logloss, ps_errbuf *eb) {
  ps_eval_ctr_result res;
  int rc = ps_eval_ctr_run(r->eval, r->params, table_rows, r, &res, eb);
  if (rc == 0 && res.samples != r->ntest)
    rc = ps_err_set(eb, PS_EFORMAT, "%s: ended after %zu samples, expected %" PRIu64
                    " (changed while training?)", r->o->test, res.samples, r->ntest);
  *auc = res.auc;
  *logloss = res.logloss;
  return rc;
}

/* The buffers of a batch, the weights and slots, the tables.  @return 0,
 * or 1 (out of memory) or 2 (a table's options) after one line. */
static int setup(ctr_run *r, const ps_train_opts *o) {
  const ps_model *m = &r->model;
  size_t b = (size_t)o->batch, total = m->vars.total;
  r->labels = malloc(b * sizeof *r->labels);
  r->y = malloc(b);
  r->x = ps_compute_host_alloc(r->compute, b * m->in_size * sizeof *r->x);
  r->emb = malloc(b * (m->emb_size ? m->emb_size : 1) * sizeof *r->emb);
  r->demb = malloc(b * (m->emb_size ? m->emb_size : 1) * sizeof *r->demb);
  r->params = malloc(total * sizeof *r->params);
  r->grad = malloc(total * sizeof *r->grad);
  ps_errbuf eb = {0};
  if (r->ntest > 0)
    r->eval = ps_eval_ctr_new(m, o->test, (int)o->batch, o->bag_separator, r->ntest, r->compute,
                              &eb);
  int failed = r->labels == NULL || r->y == NULL || r->x == NULL ||
               ps_criteo_keys_init(&r->keys, b, o->bag_separator >= 0) != 0 ||
               r->emb == NULL || r->demb == NULL || r->params == NULL || r->grad == NULL ||
               (r->ntest > 0 && r->eval == NULL) ||
               ps_embed_init(&r->embed, m, (int)o->batch, PS_CRITEO_NSPARSE) != 0;
  for (int k = 0; !failed && k < ps_optim_nslots(o->optim.kind); k++) {
    failed = (r->slots[k] = malloc(total * sizeof *r->slots[k])) == NULL;
    for (size_t i = 0; !failed && i < total; i++)
      r->slots[k][i] = ps_optim_slot_init(&o->optim, k);
  }
  if (failed) {
    ps_cmd_error("out of memory for the %s model at batch %" PRId64, m->spec.desc, o->batch);
    return 1;
  }
  ps_vartable_init_arena(&m->vars, o->seed, r->params);
  /* The tables as a shard of a cluster with this seed and lr would hold
   * them (async: a sync cluster refuses sparse tables). */
  ps_config *cfg = calloc(1, sizeof *cfg);
  if (cfg == NULL) {
    ps_cmd_error("out of memory");
    return 1;
  }
  ps_config_defaults(cfg);
  snprintf(cfg->path, sizeof cfg->path, "paramserv train");
  cfg->seed = (int64_t)o->seed;
  cfg->lr = o->lr;
  cfg->consistency = PS_CONSISTENCY_ASYNC;
  int rc = 0;
  ps_shard_opts_tables(&r->so, cfg, m);
  free(cfg);
  for (int t = 0; rc == 0 && t < r->so.ntables; t++)
    rc = ps_table_new(&r->so.tables[t], &r->tables[t], &eb);
  if (rc != 0) {
    ps_cmd_error("%s", rc == -ENOMEM ? "out of memory for the sparse tables" : eb.msg);
    return rc == -ENOMEM ? 1 : 2;
  }
  return 0;
}

static void teardown(ctr_run *r) {
  for (int t = 0; t < PS_MODEL_MAX_TABLES; t++)
    ps_table_free(r->tables[t]);
  ps_embed_free(&r->embed);
  for (int k = 0; k < PS_OPTIM_MAX_SLOTS; k++)
    free(r->slots[k]);
  free(r->labels);
  free(r->y);
  ps_criteo_keys_free(&r->keys);
  free(r->emb);
  free(r->demb);
  free(r->params);
  free(r->grad);
  ps_eval_ctr_free(r->eval);
  if (r->compute != NULL)
    ps_compute_host_free(r->compute, r->x);
  ps_compute_free(r->compute);
  ps_model_close(&r->model);
}

/* "-" or the value with 4 decimals. */
static const char *fmt4(char *buf, size_t len, double v, int have) {
  if (have)
    snprintf(buf, len, "%.4f", v);
  else
    snprintf(buf, len, "-");
  return buf;
}

int ps_train_ctr(ps_train_opts *o, const ps_model_spec *spec, volatile sig_atomic_t *stop) {
  ctr_run r = {.o = o};
  ps_errbuf eb = {0};
  ps_criteo *rd = NULL;
  int status = 1;
  if (ps_model_build(spec, &r.model, &eb) != 0) {
    ps_cmd_error("%s", eb.msg);
    return eb.code == -ENOMEM ? 1 : 2;
  }
  ps_model *m = &r.model;
  char desc[128];
  ps_model_spec_format(spec, desc, sizeof desc);
  if (m->in_size != PS_CRITEO_NDENSE || spec->classes != 1 || spec->nlayers < 1 ||
      spec->layers[spec->nlayers - 1].type != PS_LT_SIGMOID) {
    ps_cmd_error("--train (Criteo data) with model %s of %zu inputs and %d outputs: expected "
                 "input [%d] (the integer features) and one sigmoid output, as "
                 "--model-file models/ctr.json", desc, m->in_size, spec->classes,
                 PS_CRITEO_NDENSE);
    status = 2;
    goto out;
  }
  for (int t = 0; t < m->ntables; t++)
    if (m->tables[t].field >= PS_CRITEO_NSPARSE) {
      ps_cmd_error("--train (Criteo data): sparse table %s reads categorical field %d: expected "
                   "fields 1 to %d", m->tables[t].name, m->tables[t].field + 1,
                   PS_CRITEO_NSPARSE);
      status = 2;
      goto out;
    }
  /* The device first (one line at once if it is not there), then the
   * files, each read through once: their sizes, and a bad line said before
   * any training. */
  r.compute = ps_compute_new_on(m, o->device, (int)o->threads, (int)o->batch, &eb);
  if (r.compute == NULL) {
    ps_cmd_error("%s", eb.msg);
    status = eb.code == -ENODEV ? 2 : 1;
    goto out;
  }
  uint64_t ntrain = 0;
  int test_bad = 0;
  if (ps_criteo_count(o->train, &ntrain, &eb) != 0 ||
      (test_bad = o->test != NULL && o->eval && ps_criteo_count(o->test, &r.ntest, &eb) != 0)) {
    ps_cmd_error("--%s %s", test_bad ? "test" : "train", eb.msg);
    status = eb.code == -ENOMEM ? 1 : 2;
    goto out;
  }
  if (ntrain == 0) {
    ps_cmd_error("--train %s: no samples, expected at least one line", o->train);
    status = 2;
    goto out;
  }
  int eval = o->test != NULL && o->eval && r.ntest > 0;
  if ((status = setup(&r, o)) != 0)
    goto out;
  status = 1;
  if (ps_criteo_open(&rd, o->train, 0, 1, &eb) == 0 && o->bag_separator >= 0)
    ps_criteo_set_bags(rd, o->bag_separator);
  if (rd == NULL) {
    ps_cmd_error("--train %s", eb.msg);
    status = eb.code == -ENOMEM ? 1 : 2;
    goto out;
  }
  uint64_t part = ntrain;
  if (o->train_limit > 0 && (uint64_t)o->train_limit < part)
    part = (uint64_t)o->train_limit;
  uint64_t steps_per_epoch = (part + (uint64_t)o->batch - 1) / (uint64_t)o->batch;
  ps_train_sched_setup(o, steps_per_epoch);

  printf("train: model %s, %zu parameters, %s lr %g (%s), batch %" PRId64 ", %" PRId64
         " threads, seed %" PRIu64 "\n",
         desc, m->vars.total, ps_optim_name(&o->optim), o->lr, ps_sched_name(&o->sched),
         o->batch, (int64_t)ps_compute_threads(r.compute), o->seed);
  if (m->ntables > 0)
    printf("train: %d sparse tables (%s..%s), dim %d, %s lr %g; %zu embedding floats a sample\n",
           m->ntables, m->tables[0].name, m->tables[m->ntables - 1].name, m->tables[0].dim,
           ps_optim_name(&m->tables[0].optim), (double)r.so.table_lr[0], m->emb_size);
  printf("train: data %s: %" PRIu64 " training samples; test %s: %" PRIu64 " samples; %s\n",
         o->train, part, eval ? o->test : "-", r.ntest, ps_compute_describe(r.compute));
  fflush(stdout);

  /* Timed from the end of the first step, as the IDX path (train.c). */
  uint64_t step = 0, samples = 0, timed_steps = 0, timed_samples = 0;
  double train_seconds = 0.0, first_step_seconds = 0.0, auc = 0.0, logloss = 0.0;
  int evaluated = 0, stopped = 0;
  size_t total = m->vars.total;
  for (int64_t epoch = 0; epoch < o->epochs && !stopped; epoch++) {
    /* A limit short of the file: each epoch reads its first `part` lines. */
    if (epoch > 0 && part < ntrain && ps_criteo_seek(rd, (ps_data_pos){(uint64_t)epoch, 0},
                                                     &eb) != 0) {
      ps_cmd_error("%s", eb.msg);
      goto out;
    }
    double t0 = ps_now_s(), loss_sum = 0.0;
    size_t seen = 0, epoch_timed = 0;
    for (uint64_t s = 0; s < steps_per_epoch; s++) {
      if ((o->max_steps > 0 && step >= (uint64_t)o->max_steps) || *stop != 0) {
        stopped = 1;
        break;
      }
      uint64_t left = part - s * (uint64_t)o->batch;
      size_t want = left < (uint64_t)o->batch ? (size_t)left : (size_t)o->batch;
      ssize_t n = read_batch(&r, rd, want, &eb);
      if (n <= 0) {
        if (n == 0)
          ps_err_set(&eb, PS_EFORMAT, "%s: ended early in epoch %" PRId64 ", expected %" PRIu64
                     " samples (changed while training?)", o->train, epoch + 1, part);
        ps_cmd_error("%s", eb.msg);
        status = n == -ENOMEM ? 1 : 2;
        goto out;
      }
      /* As a shard: idle rows expire at the step's start; as a worker: the
       * rows pulled, the gradient, each table's distinct keys pushed. */
      for (int t = 0; t < m->ntables; t++)
        ps_table_expire(r.tables[t], step);
      if (pull_rows(&r, (int)n) != 0) {
        ps_cmd_error("out of memory for the keys of a batch of %zd samples", n);
        goto out;
      }
      double loss = ps_compute_grad_emb(r.compute, r.params, r.x, m->ntables ? r.emb : NULL,
                                        r.y, (int)n, o->seed, samples, r.grad, r.demb, NULL);
      if (!(loss == loss) || loss > 1e30) {
        ps_cmd_error("step %" PRIu64 ": loss is %g; stopping (lower --lr?)", step, loss);
        goto out;
      }
      ps_embed_scatter(&r.embed, r.demb);
      for (int t = 0; t < m->ntables; t++)
        if (ps_table_push(r.tables[t], r.embed.keys[t], r.embed.grads[t], r.embed.nkeys[t],
                          r.so.table_lr[t], step, &eb) != 0) {
          ps_cmd_error("sparse table %s: %s", m->tables[t].name,
                       eb.code == -ENOMEM ? "out of memory" : eb.msg);
          goto out;
        }
      ps_optim_apply(&o->optim, ps_sched_lr(&o->sched, o->optim.lr, step), step + 1, r.params,
                     r.grad, r.slots, total);
      loss_sum += loss * (double)n;
      seen += (size_t)n;
      samples += (uint64_t)n;
      step++;
      if (step == 1) {
        double t1 = ps_now_s();
        first_step_seconds = t1 - t0;
        t0 = t1;  /* the clock starts after the warm-up step */
      } else {
        timed_steps++;
        timed_samples += (uint64_t)n;
        epoch_timed += (size_t)n;
      }
    }
    double secs = ps_now_s() - t0;
    if (epoch_timed == 0) /* only the warm-up step: time that one */
      secs = first_step_seconds, epoch_timed = seen;
    else
      train_seconds += secs;
    if (seen == 0)
      break;
    if (eval && *stop == 0) {
      if (evaluate(&r, &auc, &logloss, &eb) != 0) {
        ps_cmd_error("%s", eb.msg);
        status = eb.code == -ENOMEM ? 1 : 2;
        goto out;
      }
      evaluated = 1;
    }
    char a[32], l[32];
    printf("epoch %" PRId64 "/%" PRId64 " loss %.4f test_auc %s test_logloss %s samples/s %.1f "
           "seconds %.3f\n",
           epoch + 1, o->epochs, loss_sum / (double)seen, fmt4(a, sizeof a, auc, evaluated),
           fmt4(l, sizeof l, logloss, evaluated), secs > 0 ? (double)epoch_timed / secs : 0.0,
           secs);
    fflush(stdout);
  }
  if (*stop != 0) {
    int sig = *stop;
    printf("train: stopped by %s at step %" PRIu64 " (sparse tables: nothing kept)\n",
           sig == SIGINT ? "SIGINT" : "SIGTERM", step);
    fflush(stdout);
    status = 128 + sig;
    goto out;
  }
  if (m->ntables > 0) {
    uint64_t rows = 0, bytes = 0;
    for (int t = 0; t < m->ntables; t++) {
      ps_table_stats st = ps_table_get_stats(r.tables[t]);
      rows += st.rows;
      bytes += st.bytes;
    }
    printf("train: the tables hold %" PRIu64 " rows, %.1f MB\n", rows, (double)bytes / 1e6);
  }
  if (timed_steps == 0 && step > 0) { /* only the warm-up step ran: time that one */
    train_seconds = first_step_seconds;
    timed_steps = step;
    timed_samples = samples;
  }
  char a[32], l[32];
  printf("done steps %" PRIu64 " samples %" PRIu64 " seconds %.3f samples/s %.1f test_auc %s "
         "test_logloss %s ms/step %.4f\n",
         step, samples, train_seconds,
         train_seconds > 0 ? (double)timed_samples / train_seconds : 0.0,
         fmt4(a, sizeof a, auc, evaluated), fmt4(l, sizeof l, logloss, evaluated),
         timed_steps > 0 ? train_seconds * 1e3 / (double)timed_steps : 0.0);
  status = 0;
out:
  ps_criteo_close(rd);
  teardown(&r);
  return status;
}
