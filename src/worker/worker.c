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
#include "common/notify.h"
#include "common/timeutil.h"
#include "data/idx.h"
#include "data/sampler.h"
#include "nn/compute.h"
#include "paramserv/client.h"
#include "replica/registry.h"
#include "ring/member.h"
#include "worker/control.h"
#include "worker/elastic.h"

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

int ps_worker_run(const ps_config *cfg, int index) {
  if (cfg->mode == PS_MODE_RING)
    return ps_ring_member_run(cfg, index);
  char tag[32];
  snprintf(tag, sizeof tag, "worker.%d", index);
  int level = ps_log_level_parse(cfg->log_level);
  ps_log_init(tag, level < 0 ? PS_LOG_INFO : level);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  int status = 1;
  ps_errbuf eb = {0};
  ps_dataset train = {0}, test = {0};
  ps_sampler sampler = {0};
  ps_compute *compute = NULL;
  float *params = NULL, *grad = NULL, *sum = NULL, *x = NULL, *test_x = NULL;
  uint8_t *y = NULL;
  size_t *idx = NULL;
  ps_registry *registry = NULL;
  ps_elastic el = {0};
  ps_client *client = ps_client_new(cfg->path, index, &eb);
  if (client == NULL) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    return 1;
  }
  const ps_vartable *vars = ps_client_vars(client);
  /* The model the client built from the config, layout and all. */
  const ps_model *model = ps_client_model(client);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = cfg->threads > 0 ? (int)cfg->threads : (cores > 0 ? (int)cores : 1);
  int batch = (int)cfg->batch;
  /* The device first: one that cannot be used ([worker] device = cuda with
   * no GPU, or no CUDA in this build) is said at once, in one line, and is
   * the environment's fault (exit 2), not the run's. */
  compute = ps_compute_new_on(model, (int)cfg->device, threads, batch, &eb);
  if (compute == NULL) {
    ps_log(PS_LOG_ERROR, "[worker] device: %s", eb.msg);
    if (eb.code == -ENODEV)
      status = 2;
    goto out;
  }
  if (ps_dataset_load(cfg->data_dir, "train", &train, &eb) != 0 ||
      (index == 0 && ps_dataset_load(cfg->data_dir, "t10k", &test, &eb) != 0)) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    goto out;
  }
  size_t total = vars->total;
  /* What goes to and from the device every step lives in its fastest host
   * memory (pinned, on a GPU). */
  params = ps_compute_host_alloc(compute, total * sizeof *params);
  grad = ps_compute_host_alloc(compute, total * sizeof *grad);
  /* Averaging and EASGD keep a replica of their own; what they push, and
   * DOWNPOUR's summed gradient, go in `sum`. */
  int elastic = cfg->algorithm != PS_ALGO_GRADIENTS;
  int summed = cfg->window > 1 || elastic;
  sum = summed ? malloc(total * sizeof *sum) : NULL;
  x = ps_compute_host_alloc(compute, (size_t)batch * model->in_size * sizeof *x);
  y = malloc((size_t)batch);
  idx = malloc((size_t)batch * sizeof *idx);
  if (params == NULL || grad == NULL || (summed && sum == NULL) ||
      (elastic && ps_elastic_init(&el, cfg, total) != 0) ||
      x == NULL || y == NULL || idx == NULL ||
      ps_sampler_init(&sampler, train.n, index, cfg->nworkers, (uint64_t)cfg->seed) != 0) {
    ps_log(PS_LOG_ERROR, "out of memory (batch %d, %zu parameters)", batch, total);
    goto out;
  }
  ps_client_set_stop_flag(client, &stop_requested);
  uint64_t epoch = 0;
  if (cfg->replication != PS_REPLICATION_OFF || !cfg->ps_self_init) {
    /* The incarnation and the data position live in Redis, so that a
     * restarted worker is a new incarnation that goes on where it was.
     * With a chief (the shards wait for it to initialize them) there is a
     * Redis even when the shards do not replicate: the chief's lease lives
     * there, and its checkpoints need every worker's data position. */
    registry = ps_registry_new(cfg, "worker", index);
    if (registry == NULL ||
        ps_registry_new_epoch(registry, (volatile int *)&stop_requested, &epoch, &eb) != 0) {
      ps_log(PS_LOG_ERROR, "%s", registry ? eb.msg : "out of memory");
      goto out;
    }
    ps_client_set_incarnation(client, epoch);
    if (ps_registry_run_ended(registry)) {
      status = 0;
      goto out;
    }
  }
  uint64_t last = ps_client_last_step(client);
  ps_log(PS_LOG_INFO, "worker %d of %d: %zu samples a epoch, batch %d, %d threads, step limit %" PRIu64
         "; %s", index, cfg->nworkers, ps_sampler_part_size(&sampler), batch,
         ps_compute_threads(compute), last, ps_compute_describe(compute));

  /* Test only: poison the gradients after this many local steps, to
   * exercise the chief's NaN guard end to end. */
  const char *nan_env = getenv("PS_TEST_NAN_AFTER_STEP");
  uint64_t nan_after = nan_env != NULL ? strtoull(nan_env, NULL, 10) : 0;
  uint64_t local = 0, samples = 0, window_steps = 0;
  double t0 = ps_now_s(), tlog = t0, loss_sum = 0.0;
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
      if (ps_sampler_seek(&sampler, pos) == 0)
        ps_log(PS_LOG_INFO, "resumed data position epoch %" PRIu64 " offset %" PRIu64
               " from Redis (incarnation %" PRIu64 "), clock %" PRIu64, pos.epoch, pos.offset,
               epoch, clock);
      else
        ps_log(PS_LOG_WARN, "data position epoch %" PRIu64 " offset %" PRIu64 " from Redis is "
               "past this worker's %zu samples; starting from the beginning", pos.epoch, pos.offset,
               ps_sampler_part_size(&sampler));
    }
  }
  /* The batch is prepared while the shards apply the push and answer the
   * pull sent with it (cores the step leaves idle); `trained` is the data
   * position of the batches already pushed, what a restart resumes from. */
  size_t n = 0;
  int have_batch = 0;
  ps_data_pos trained = sampler.pos;
  while (rc == 0 && !stop_requested && (last == 0 || ps_client_global_step(client) < last)) {
    if (!have_batch)
      n = ps_dataset_batch(&train, &sampler, idx, (size_t)batch, x, y);
    have_batch = 0;
    /* Dropout masks are keyed by the sample's place in this worker's
     * stream, unique per (worker, sample). */
    uint64_t first = ((uint64_t)index << 48) + samples;
    double loss = ps_compute_grad(compute, params, x, y, (int)n, (uint64_t)cfg->seed, first, grad, NULL);
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
    rc = ps_client_push_pull_start(client, summed ? sum : grad, elastic ? el.center : params);
    trained = sampler.pos;
    if (rc == 0) {
      n = ps_dataset_batch(&train, &sampler, idx, (size_t)batch, x, y);
      have_batch = 1;
      rc = ps_client_pull_finish(client);
      if (rc == 0 && elastic)
        ps_elastic_pulled(&el, params);
    }
    double now = ps_now_s();
    if (registry != NULL && rc == 0) {
      ps_registry_set_clock(registry, ps_client_clock(client));
      ps_registry_tick(registry, &trained, local, (double)local / (now - t0), 0);
    }
    if (steps_log >= (uint64_t)cfg->log_every) {
      ps_log(PS_LOG_INFO,
             "step %" PRIu64 " global %" PRIu64 " loss %.4f samples/s %.1f epoch %" PRIu64,
             local, ps_client_global_step(client), loss_sum / (double)steps_log,
             (double)samples_log / (now - tlog), sampler.pos.epoch);
      tlog = now;
      loss_sum = 0.0;
      steps_log = samples_log = 0;
    }
  }
  /* The last push's acks (it was sent without waiting for them). */
  if (rc == 0)
    rc = ps_client_flush(client);
  if (rc == PS_ESTOPPED || (rc == -EINTR && stop_requested)) {
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
  if (index == 0 && !stop_requested) {
    test_x = malloc(test.n * model->in_size * sizeof *test_x);
    if (test_x == NULL) {
      ps_log(PS_LOG_ERROR, "out of memory for the test set");
      goto out;
    }
    ps_dataset_images_f32(&test, NULL, test.n, PS_DATA_MEAN, PS_DATA_STD, test_x);
    size_t right = 0;
    ps_compute_eval(compute, params, test_x, test.labels, test.n, &right);
    printf("final test_acc %.4f global_step %" PRIu64 "\n", (double)right / (double)test.n,
           ps_client_global_step(client));
  }
  fflush(stdout);
  status = 0;
out:
  free(idx);
  free(y);
  free(sum);
  ps_elastic_free(&el);
  free(test_x);
  if (compute != NULL) {
    ps_compute_host_free(compute, x);
    ps_compute_host_free(compute, grad);
    ps_compute_host_free(compute, params);
  }
  ps_compute_free(compute);
  ps_sampler_close(&sampler);
  ps_dataset_close(&test);
  ps_dataset_close(&train);
  ps_client_free(client);
  ps_registry_free(registry);
  return status;
}
