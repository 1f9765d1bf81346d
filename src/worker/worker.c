/* The worker process (see worker.h).
 *
 * Each iteration pulls the weights, computes the gradient of one batch of
 * this worker's part of the data, and pushes it.  With a communication
 * window n > 1 (DOWNPOUR) the worker takes n local SGD steps on its copy
 * of the weights, summing their gradients, then pushes the sum (or the sum
 * divided by n with ADAG) and pulls again. */
#include "worker/worker.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/notify.h"
#include "common/timeutil.h"
#include "data/idx.h"
#include "data/sampler.h"
#include "nn/compute.h"
#include "paramserv/client.h"
#include "replica/registry.h"
#include "ring/member.h"
#include "worker/client_sparse.h"
#include "worker/control.h"
#include "worker/elastic.h"
#include "worker/embed.h"
#include "worker/trainer.h"

/* The worker's series (src/common/METRICS.md).  The counts live in the
 * client (ps_client_pushes, _duplicates, ...); the loop copies them here
 * after each step. */
enum { W_STEPS, W_SAMPLES, W_RATE, W_PUSHES, W_DUPLICATES, W_STALE, W_RECONNECTS, W_STALL,
       W_SENT, W_RECEIVED, W_GLOBAL_STEP, W_LOSS, W_ROWS, W_N };
static const ps_metric_def worker_series[W_N] = {
    [W_STEPS] = {PS_METRIC_COUNTER, "paramserv_worker_steps_total",
                 "local steps (batches) this process computed"},
    [W_SAMPLES] = {PS_METRIC_COUNTER, "paramserv_worker_samples_total",
                   "training samples this process computed gradients on"},
    [W_RATE] = {PS_METRIC_GAUGE, "paramserv_worker_samples_per_second",
                "samples per second over the last second or so"},
    [W_PUSHES] = {PS_METRIC_COUNTER, "paramserv_worker_pushes_total",
                  "pushes acknowledged by every shard"},
    [W_DUPLICATES] = {PS_METRIC_COUNTER, "paramserv_worker_duplicates_total",
                      "pushes shards reported already applied (re-sent after a reconnect)"},
    [W_STALE] = {PS_METRIC_COUNTER, "paramserv_worker_stale_pushes_total",
                 "pushes shards dropped as stale"},
    [W_RECONNECTS] = {PS_METRIC_COUNTER, "paramserv_worker_reconnects_total",
                      "shard connections made again after the first one each"},
    [W_STALL] = {PS_METRIC_COUNTER, "paramserv_worker_stall_seconds_total",
                 "time spent waiting for the shards (push acks, pull replies, reconnects)"},
    [W_SENT] = {PS_METRIC_COUNTER, "paramserv_worker_sent_bytes_total", "bytes sent to the shards"},
    [W_RECEIVED] = {PS_METRIC_COUNTER, "paramserv_worker_received_bytes_total",
                    "bytes received from the shards"},
    [W_GLOBAL_STEP] = {PS_METRIC_GAUGE, "paramserv_worker_global_step",
                       "the global step as of shard 0's last reply"},
    [W_LOSS] = {PS_METRIC_GAUGE, "paramserv_worker_loss",
                "mean training loss of the last logged interval ([train] log_every steps)"},
    [W_ROWS] = {PS_METRIC_COUNTER, "paramserv_worker_rows_pulled_total",
                "sparse rows pulled for training batches (each batch's distinct keys per table)"},
};

static void metrics_update(ps_metric **x, const ps_client *c, int nps, uint64_t steps,
                           uint64_t samples, double stall) {
  if (x[0] == NULL)
    return;
  uint64_t in, out = ps_client_bytes(c, &in), connects = ps_client_connects(c);
  ps_metric_set(x[W_STEPS], (double)steps);
  ps_metric_set(x[W_SAMPLES], (double)samples);
  ps_metric_rate(x[W_RATE], (double)samples);
  ps_metric_set(x[W_PUSHES], (double)ps_client_pushes(c));
  ps_metric_set(x[W_DUPLICATES], (double)ps_client_duplicates(c));
  ps_metric_set(x[W_STALE], (double)ps_client_stale(c));
  ps_metric_set(x[W_RECONNECTS], connects > (uint64_t)nps ? (double)(connects - (uint64_t)nps) : 0);
  ps_metric_set(x[W_STALL], stall);
  ps_metric_set(x[W_SENT], (double)out);
  ps_metric_set(x[W_RECEIVED], (double)in);
  ps_metric_set(x[W_GLOBAL_STEP], (double)ps_client_global_step(c));
}

/* A model with sparse tables: the batch in t's buffers, its keys into e,
 * and its rows pulled with the weights. */
static int sparse_pull(ps_client *client, ps_trainer *t, ps_embed *e, size_t n, float *params) {
  ps_sparse_batch b;
  ps_trainer_embed(t, e, n);
  ps_embed_batch(e, &b);
  return ps_client_pull_sparse(client, params, &b);
}

int ps_worker_run(const ps_config *cfg, int index) {
  if (cfg->mode == PS_MODE_RING)
    return ps_ring_member_run(cfg, index);
  volatile sig_atomic_t *stop = ps_trainer_start_process(cfg, index);
  int status = 1;
  ps_errbuf eb = {0};
  ps_trainer t = {0};
  float *sum = NULL;
  ps_registry *registry = NULL;
  ps_elastic el = {0};
  ps_metrics *metrics = NULL;
  ps_metric *series[W_N];
  ps_embed emb[2] = {0};
  ps_client *client = ps_client_new(cfg->path, index, &eb);
  if (client == NULL) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    return 1;
  }
  if (ps_metrics_start(cfg, "worker", index, worker_series, W_N, series, &metrics, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    goto out;
  }
  /* The model the client built from the config, layout and all. */
  const ps_model *model = ps_client_model(client);
  if ((status = ps_trainer_open(&t, cfg, model, index)) != 0)
    goto out;
  status = 1;
  size_t total = t.total;
  float *params = t.params, *grad = t.grad;
  /* Sparse tables: the batch computed on (emb[cur]) and the next (its rows
   * pulled with the push of this one). */
  int sparse = model->ntables > 0, cur = 0;
  if (sparse && (cfg->window > 1 || cfg->algorithm != PS_ALGO_GRADIENTS)) {
    ps_log(PS_LOG_ERROR, "%s: a model with sparse tables trains with [train] algorithm = "
           "gradients and window = 1", cfg->path);
    status = 2;
    goto out;
  }
  /* Tables with "pooling": "server" go to the shards as bags. */
  for (int k = 0; k < 2 * sparse; k++)
    if (ps_embed_init(&emb[k], model, t.batch, PS_CRITEO_NSPARSE) != 0 ||
        ps_embed_server_pooling(&emb[k]) != 0) {
      ps_log(PS_LOG_ERROR, "out of memory for the sparse rows of a batch");
      goto out;
    }
  /* Averaging and EASGD keep a replica of their own; what they push, and
   * DOWNPOUR's summed gradient, go in `sum`. */
  int elastic = cfg->algorithm != PS_ALGO_GRADIENTS;
  int summed = cfg->window > 1 || elastic;
  sum = summed ? malloc(total * sizeof *sum) : NULL;
  if ((summed && sum == NULL) || (elastic && ps_elastic_init(&el, cfg, total) != 0)) {
    ps_log(PS_LOG_ERROR, "out of memory (%zu parameters)", total);
    goto out;
  }
  ps_client_set_stop_flag(client, stop);
  uint64_t epoch = 0;
  if (cfg->replication != PS_REPLICATION_OFF || !cfg->ps_self_init) {
    /* The incarnation and the data position live in Redis, so that a
     * restarted worker is a new incarnation that goes on where it was.
     * With a chief (the shards wait for it to initialize them) there is a
     * Redis even when the shards do not replicate: the chief's lease lives
     * there, and its checkpoints need every worker's data position. */
    registry = ps_registry_new(cfg, "worker", index);
    if (registry == NULL ||
        ps_registry_new_epoch(registry, (volatile int *)stop, &epoch, &eb) != 0) {
      ps_log(PS_LOG_ERROR, "%s", registry ? eb.msg : "out of memory");
      goto out;
    }
    ps_client_set_incarnation(client, epoch);
    if (ps_registry_run_ended(registry)) {
      ps_notify_done("worker %d: the run has ended", index);
      status = 0;
      goto out;
    }
  }
  uint64_t last = ps_client_last_step(client);
  ps_log(PS_LOG_INFO, "worker %d of %d: %zu samples a epoch, batch %d, %d threads, step limit %" PRIu64
         "; %s", index, cfg->nworkers, ps_trainer_part_size(&t), t.batch,
         ps_compute_threads(t.compute), last, ps_compute_describe(t.compute));

  /* Test only: poison the gradients after this many local steps, to
   * exercise the chief's NaN guard end to end. */
  const char *nan_env = getenv("PS_TEST_NAN_AFTER_STEP");
  uint64_t nan_after = nan_env != NULL ? strtoull(nan_env, NULL, 10) : 0;
  uint64_t local = 0, samples = 0, window_steps = 0, rows_pulled = 0;
  double t0 = ps_now_s(), tlog = t0, loss_sum = 0.0, stall = 0.0;
  uint64_t samples_log = 0, steps_log = 0;
  /* The replica starts from the center (a restarted worker's too). */
  int rc = ps_client_pull(client, elastic ? el.center : params);
  if (rc == 0 && elastic)
    memcpy(params, el.center, total * sizeof *params);
  if (rc == 0)
    ps_notify_ready("worker %d training from global step %" PRIu64, index,
                    ps_client_global_step(client));
  if (rc == 0 && registry != NULL) {
    /* Read after the first pull: shards admit workers only once the chief
     * initialized them, after it restored the positions of a checkpoint. */
    ps_data_pos pos;
    uint64_t clock;
    if (ps_registry_load_pos(registry, &pos, &clock)) {
      /* The clock goes on from the saved one, so that under ssp the others
       * do not wait while this worker redoes the steps it had done.  (The
       * first pull above asked as clock 0: it is answered at once, and the
       * next pull corrects the shards' view.) */
      ps_client_set_clock(client, clock);
      if (ps_trainer_seek(&t, pos) == 0)
        ps_log(PS_LOG_INFO, "resumed data position epoch %" PRIu64 " offset %" PRIu64
               " from Redis (incarnation %" PRIu64 "), clock %" PRIu64, pos.epoch, pos.offset,
               epoch, clock);
      else
        ps_log(PS_LOG_WARN, "data position epoch %" PRIu64 " offset %" PRIu64 " from Redis is "
               "past this worker's %zu samples; starting from the beginning", pos.epoch, pos.offset,
               ps_trainer_part_size(&t));
    }
  }
  /* The batch is prepared while the shards apply the push and answer the
   * pull sent with it (cores the step leaves idle); `trained` is the data
   * position of the batches already pushed, what a restart resumes from. */
  size_t n = 0;
  int have_batch = 0;
  ps_data_pos trained = ps_trainer_pos(&t);
  ps_sparse_batch pushed, want;
  while (rc == 0 && !*stop && (last == 0 || ps_client_global_step(client) < last)) {
    if (!have_batch) {
      n = ps_trainer_batch(&t);
      if (sparse && (rc = sparse_pull(client, &t, &emb[cur], n, params)) != 0)
        break;
      if (sparse)
        rows_pulled += ps_embed_nrows(&emb[cur]);
    }
    have_batch = 0;
    /* Dropout masks are keyed by the sample's place in this worker's
     * stream, unique per (worker, sample). */
    uint64_t first = ((uint64_t)index << 48) + samples;
    double loss;
    if (sparse) {
      ps_embed_pool(&emb[cur], t.emb);
      loss = ps_compute_grad_emb(t.compute, params, t.x, t.emb, t.y, (int)n, (uint64_t)cfg->seed,
                                 first, grad, t.demb, NULL);
      ps_embed_scatter(&emb[cur], t.demb);
    } else {
      loss = ps_compute_grad(t.compute, params, t.x, t.y, (int)n, (uint64_t)cfg->seed, first,
                             grad, NULL);
    }
    local++;
    samples += n;
    ps_notify_watchdog();
    if (nan_after > 0 && local > nan_after)
      grad[0] = NAN;
    loss_sum += loss;
    steps_log++;
    samples_log += n;
    if (elastic) {
      ps_elastic_step(&el, params, grad, ps_client_global_step(client));
      if (++window_steps < (uint64_t)cfg->window)
        continue;
      window_steps = 0;
      ps_elastic_delta(&el, params, sum);
    } else if (cfg->window > 1) {
      /* DOWNPOUR: a local step on our copy, the gradient summed for the push. */
      for (size_t i = 0; i < total; i++) {
        sum[i] = window_steps ? sum[i] + grad[i] : grad[i];
        params[i] -= (float)cfg->lr * grad[i];
      }
      if (++window_steps < (uint64_t)cfg->window)
        continue;
      if (cfg->adag) {
        float inv = 1.0f / (float)window_steps;
        for (size_t i = 0; i < total; i++)
          sum[i] *= inv;
      }
      window_steps = 0;
    }
    /* The time in the client's calls is time waiting for the shards; the
     * batch prepared between them is not. */
    double w0;
    if (sparse) {
      /* The next batch first: its rows come with the reply to this push. */
      trained = ps_trainer_pos(&t);
      n = ps_trainer_batch(&t);
      ps_trainer_embed(&t, &emb[1 - cur], n);
      rows_pulled += ps_embed_nrows(&emb[1 - cur]);
      ps_embed_batch(&emb[cur], &pushed);
      ps_embed_batch(&emb[1 - cur], &want);
      cur = 1 - cur;
      have_batch = 1;
      w0 = ps_now_s();
      rc = ps_client_push_pull_start_sparse(client, grad, &pushed, params, &want);
      stall += ps_now_s() - w0;
    } else {
      w0 = ps_now_s();
      rc = ps_client_push_pull_start(client, summed ? sum : grad, elastic ? el.center : params);
      stall += ps_now_s() - w0;
      trained = ps_trainer_pos(&t);
    }
    if (rc == 0) {
      if (!sparse)
        n = ps_trainer_batch(&t);
      have_batch = 1;
      w0 = ps_now_s();
      rc = ps_client_pull_finish(client);
      stall += ps_now_s() - w0;
      if (rc == 0 && elastic)
        ps_elastic_pulled(&el, params);
    }
    double now = ps_now_s();
    metrics_update(series, client, cfg->nps, local, samples, stall);
    ps_metric_set(series[W_ROWS], (double)rows_pulled);
    if (registry != NULL && rc == 0) {
      ps_registry_set_clock(registry, ps_client_clock(client));
      ps_registry_tick(registry, &trained, local, (double)local / (now - t0), 0);
    }
    if (steps_log >= (uint64_t)cfg->log_every) {
      ps_log(PS_LOG_INFO,
             "step %" PRIu64 " global %" PRIu64 " loss %.4f samples/s %.1f epoch %" PRIu64,
             local, ps_client_global_step(client), loss_sum / (double)steps_log,
             (double)samples_log / (now - tlog), ps_trainer_pos(&t).epoch);
      ps_metric_set(series[W_LOSS], loss_sum / (double)steps_log);
      tlog = now;
      loss_sum = 0.0;
      steps_log = samples_log = 0;
    }
  }
  /* The last push's acks (it was sent without waiting for them). */
  if (rc == 0)
    rc = ps_client_flush(client);
  if (rc == PS_ESTOPPED || (rc == -EINTR && *stop)) {
    ps_log(PS_LOG_INFO, "%s", ps_client_error(client));
  } else if (rc != 0) {
    ps_log(PS_LOG_ERROR, "%s", ps_client_error(client));
    goto out;
  }
  double secs = ps_now_s() - t0;
  if (registry != NULL) {
    ps_registry_set_clock(registry, ps_client_clock(client));
    ps_registry_tick(registry, &trained, local, (double)local / secs, 1);
  }
  uint64_t bytes_in, bytes_out = ps_client_bytes(client, &bytes_in);
  /* Scripts read this line by its words; "stale N" stays last. */
  printf("worker %d done: %" PRIu64 " local steps, global step %" PRIu64 ", %" PRIu64
         " samples, %.1f s, samples/s %.1f, bytes out %" PRIu64 " in %" PRIu64
         ", pushes %" PRIu64 ", duplicates %" PRIu64 ", stale %" PRIu64 "\n",
         index, local, ps_client_global_step(client), samples, secs,
         secs > 0 ? (double)samples / secs : 0.0, bytes_out, bytes_in,
         ps_client_pushes(client), ps_client_duplicates(client), ps_client_stale(client));
  if (sparse)
    printf("worker %d rows: %" PRIu64 " pulled, rows/s %.1f\n", index, rows_pulled,
           secs > 0 ? (double)rows_pulled / secs : 0.0);
  /* A model with sparse tables is evaluated by the chief (its rows are on
   * the shards, which the run's end stops). */
  if (index == 0 && !*stop && !sparse && t.reader == NULL &&
      ps_trainer_final_test(&t, params, ps_client_global_step(client)) != 0)
    goto out;
  fflush(stdout);
  status = 0;
out:
  ps_metrics_free(metrics);
  ps_embed_free(&emb[0]);
  ps_embed_free(&emb[1]);
  free(sum);
  ps_elastic_free(&el);
  ps_trainer_close(&t);
  ps_client_free(client);
  ps_registry_free(registry);
  return status;
}
