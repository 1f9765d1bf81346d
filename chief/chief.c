/* The chief (see chief.h).
 *
 * One thread runs a 100 ms control loop: renew the lease, ask every shard
 * for its STATS (a deadline keeps a dead shard from blocking the loop),
 * load any shard that holds no state, note nodes lost and back, and fire
 * the hooks.  A checkpoint is a consistent cut: CUT to every shard (each
 * copies its state and holds pushes), RESUME to every shard once all have
 * copied, so training stalls only for the copies; then the images are
 * fetched while training goes on and written by a second thread (compress,
 * hash, fsync, rename: recovery/checkpoint.c).  An evaluation runs on a
 * third thread (chief/eval.c) over weights pulled like a worker pulls
 * them. */
#include "chief/chief.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chief/bg.h"
#include "chief/cut.h"
#include "chief/eval.h"
#include "chief/keeper.h"
#include "chief/lease.h"
#include "chief/nodes.h"
#include "chief/restore.h"
#include "chief/summary.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/notify.h"
#include "common/timeutil.h"
#include "recovery/checkpoint.h"
#include "recovery/plan.h"
#include "replica/keys.h"
#include "replica/registry.h"
#include "ring/view.h"
#include "worker/control.h"

#define TICK_MS 100

typedef struct chief chief;

/* The chief's series (src/common/METRICS.md). */
enum { C_GLOBAL_STEP, C_CKPT_AGE, C_CKPTS, C_CKPT_FAILURES, C_CKPT_STALL, C_CKPT_BYTES,
       C_CKPT_STORED, C_LEASE_HELD, C_LEASE_TOKEN, C_SHARDS_UP, C_EVAL_STEP, C_EVAL_LOSS,
       C_EVAL_ACCURACY, C_N };
static const ps_metric_def chief_series[C_N] = {
    [C_GLOBAL_STEP] = {PS_METRIC_GAUGE, "paramserv_chief_global_step",
                       "the global step as shard 0 last reported it"},
    [C_CKPT_AGE] = {PS_METRIC_GAUGE, "paramserv_chief_checkpoint_age_seconds",
                    "seconds since the newest checkpoint was cut (or since the schedule began, "
                    "when there is none)"},
    [C_CKPTS] = {PS_METRIC_COUNTER, "paramserv_chief_checkpoints_total",
                 "checkpoints this process wrote"},
    [C_CKPT_FAILURES] = {PS_METRIC_COUNTER, "paramserv_chief_checkpoint_failures_total",
                         "checkpoint writes that failed"},
    [C_CKPT_STALL] = {PS_METRIC_GAUGE, "paramserv_chief_checkpoint_stall_seconds",
                      "how long the last checkpoint's cut paused the shards"},
    [C_CKPT_BYTES] = {PS_METRIC_GAUGE, "paramserv_chief_checkpoint_bytes",
                      "the last checkpoint's state, uncompressed"},
    [C_CKPT_STORED] = {PS_METRIC_GAUGE, "paramserv_chief_checkpoint_stored_bytes",
                       "the last checkpoint's files on disk"},
    [C_LEASE_HELD] = {PS_METRIC_GAUGE, "paramserv_chief_lease_held",
                      "1 while this process holds the chief's lease, else 0"},
    [C_LEASE_TOKEN] = {PS_METRIC_GAUGE, "paramserv_chief_lease_token",
                       "the fencing token of this process's lease (0: never held)"},
    [C_SHARDS_UP] = {PS_METRIC_GAUGE, "paramserv_chief_shards_up",
                     "shards that answered the last STATS"},
    [C_EVAL_STEP] = {PS_METRIC_GAUGE, "paramserv_chief_eval_step",
                     "the global step of the last evaluation"},
    [C_EVAL_LOSS] = {PS_METRIC_GAUGE, "paramserv_chief_eval_loss",
                     "test loss of the last evaluation"},
    [C_EVAL_ACCURACY] = {PS_METRIC_GAUGE, "paramserv_chief_eval_accuracy",
                         "test accuracy of the last evaluation"},
};

struct chief {
  const ps_config *cfg;
  ps_cut_env cut_env;
  ps_client *client;
  const ps_layout *layout;
  const ps_model *model;
  char model_text[128];
  ps_registry *reg;
  ps_registry *writer_reg;    /* the writer thread's own Redis connection */
  ps_lease lease;
  /* The checkpoint commit's fence: on this thread and on the writer's. */
  ps_lease_fence fence, writer_fence;
  ps_ckpt_owner owner, writer_owner;
  ps_lease_keeper keeper;     /* renews the lease on a thread of its own */
  int lease_lost_said;
  ps_summary sum;
  /* The shards as the last STATS saw them. */
  ps_msg_stats_reply stats[PS_CONFIG_MAX_NODES];
  int stats_ok[PS_CONFIG_MAX_NODES];
  ps_nodes nodes;             /* who is up, who restarted */
  uint64_t gstep;
  /* Hooks. */
  uint64_t last_ckpt_step;
  double last_ckpt_time;
  char last_ckpt_name[PS_CKPT_NAME_MAX];
  uint64_t wrote_step;        /* the step of a checkpoint this chief wrote; UINT64_MAX: none */
  char restored_from[PS_CKPT_NAME_MAX];  /* the checkpoint the shards were loaded from */
  ps_ckpt_chain *chain;      /* the writer's incremental checkpoints (its thread's, a write at a time) */
  uint64_t next_log_step, log_step0;
  double log_t0;
  uint64_t next_eval_step;
  uint64_t cut_id;
  ps_bg writer;
  ps_eval *eval;              /* NULL: evaluations off */
  /* Ring mode: the member read as the one shard, and when it was chosen. */
  ps_config *ring_cfg;
  int ring_target;
  uint64_t ring_target_ns;
  int status;
  int stopping;
  int serving;                /* in the main loop: the shards hold their states */
  ps_metrics *metrics;        /* NULL: metrics off */
  ps_metric *series[C_N];
};

static volatile sig_atomic_t stop_signal;
static void on_signal(int sig) { stop_signal = sig; }

/* -------------------------------------------------------------- lease */

/* Is the lease still held (the keeper renews it)?  @return 0, or -1 when
 * this chief must stop acting: another holds it, it lapsed, or Redis has
 * not confirmed it for its whole time to live (said once). */
static int lease_tick(chief *ch) {
  char why[512];
  if (ps_lease_keeper_check(&ch->keeper, why, sizeof why) == 0)
    return 0;
  if (!ch->lease_lost_said)
    ps_log(PS_LOG_ERROR, "%s: exiting so that only one acts", why);
  ch->lease_lost_said = 1;
  ps_metric_set(ch->series[C_LEASE_HELD], 0);
  return -1;
}

/* Wait for the lease.  @return 0 once held, 1 on a stop signal. */
static int lease_wait(chief *ch) {
  int said = 0;
  while (!stop_signal) {
    void *c = ps_registry_redis(ch->reg, 1);
    char holder[256] = "";
    int rc = c != NULL ? ps_lease_take(&ch->lease, c, holder, sizeof holder) : -1;
    if (rc == 1)
      return 0;
    if (rc < 0 && c != NULL)
      ps_registry_lost(ch->reg, "lease: no reply");
    if (!said) {
      ps_log(PS_LOG_INFO, "waiting for the lease %s: %s (until its holder releases it or it "
             "expires, at most %" PRId64 " ms after its last renewal)", ch->lease.key,
             rc == 0 ? holder : "Redis is away", ch->cfg->chief_lease_ms);
      ps_notify_status("standby: waiting for the lease (%s)", rc == 0 ? holder : "Redis is away");
    }
    said = 1;
    ps_notify_watchdog();
    usleep((useconds_t)(ch->cfg->chief_lease_ms * 1000 / 3));
  }
  return 1;
}

/* ------------------------------------------------------- shard calls */

/* A control call to the shards (reqs: one per shard, type 0 = none). */
static int call(chief *ch, ps_msg *reqs, ps_client_reply_fn fn, void *arg) {
  if (lease_tick(ch) != 0) {
    ch->status = PS_CHIEF_FAILED;
    ch->stopping = 1;
    return -EPERM;
  }
  int rc = ps_client_request(ch->client, reqs, fn, arg);
  if (rc == PS_EFENCED && !ch->stopping) {
    ps_log(PS_LOG_ERROR, "fenced out: %s; a newer chief holds the lease %s: exiting so that only "
           "one acts", ps_client_error(ch->client), ch->lease.key);
    ch->status = PS_CHIEF_FAILED;
    ch->stopping = 1;
  }
  return rc;
}

static void on_stats(void *arg, int shard, const ps_msg *m) {
  chief *ch = arg;
  ch->stats[shard] = m->u.stats_reply;
  ch->stats_ok[shard] = 1;
}

static int cut_call(void *ch, ps_msg *reqs, ps_client_reply_fn fn, void *arg) {
  return call(ch, reqs, fn, arg);
}

/* The workers' data positions in Redis, read while a cut holds the
 * shards' pushes (ps_cut_env.positions).  A missing one fails the cut:
 * (0, 0) would send that worker back to its first sample.  A model of
 * variables only is trained by the user's own loops, whose data is theirs:
 * its checkpoints hold (0, 0) for every worker (MODELFILE.md). */
static int cut_positions(void *arg, ps_data_pos *pos, char *why, size_t len) {
  chief *ch = arg;
  if (ch->model->nlayers == 0) {
    memset(pos, 0, (size_t)ch->cfg->nworkers * sizeof *pos);
    return 0;
  }
  for (int j = 0; j < ch->cfg->nworkers; j++) {
    int rc = ps_registry_get_pos(ch->reg, j, &pos[j]);
    if (rc == 1)
      continue;
    if (rc == 0)
      snprintf(why, len, "worker %d has no data position in Redis ({%s}:pos:worker:%d), expected "
               "one from every worker", j, ch->cfg->cluster_id, j);
    else
      snprintf(why, len, "worker %d's data position: Redis did not answer", j);
    return -1;
  }
  return 0;
}

/* STATS from every shard.  @return 0 when every shard answered. */
static int poll_stats(chief *ch) {
  ps_msg reqs[PS_CONFIG_MAX_NODES];
  memset(reqs, 0, sizeof reqs);
  for (int i = 0; i < ch->cfg->nps; i++) {
    reqs[i].type = PS_MSG_STATS;
    ch->stats_ok[i] = 0;
  }
  int rc = call(ch, reqs, on_stats, ch);
  ps_nodes_shards(&ch->nodes, ch->stats_ok, ch->stats, ps_client_error(ch->client), ch->gstep);
  if (ch->stats_ok[0])
    ch->gstep = ch->stats[0].global_step;
  return rc;
}

/* Ring mode: the member that stopped answering is replaced by the next
 * one of the current view, at most once a second. */
static void ring_retarget(chief *ch) {
  uint64_t now = ps_now_ns();
  if (ch->ring_cfg == NULL || ch->stats_ok[0] || now - ch->ring_target_ns < 1000000000ULL)
    return;
  ps_view v;
  if (ps_view_get(ch->reg, &v) != 1)
    return;
  int pick = v.members[0];
  for (int i = 0; i < v.n; i++)
    if (v.members[i] > ch->ring_target) {
      pick = v.members[i];
      break;
    }
  ch->ring_target_ns = now;
  if (pick == ch->ring_target)
    return;
  ps_log(PS_LOG_INFO, "ring: member %d does not answer; reading member %d (view %" PRIu64 ")",
         ch->ring_target, pick, v.epoch);
  ch->ring_target = pick;
  ch->ring_cfg->ps[0] = ch->ring_cfg->workers[pick];
  ps_client_retarget(ch->client, 0, &ch->ring_cfg->workers[pick]);
}

/* ------------------------------------------------------------- restore */

/* Give every shard that holds no state one (chief/restore.h); the schedule
 * goes on from the checkpoint that gave it.  @return as ps_chief_restore. */
static int load_missing(chief *ch, int everyone) {
  ps_restore_result r;
  int rc = ps_chief_restore(&ch->cut_env, ch->reg, &ch->sum, ch->stats, everyone, &r);
  if (r.found) {
    /* Retention keeps it, and the schedule goes on from it. */
    snprintf(ch->restored_from, sizeof ch->restored_from, "%s", r.from);
    if (everyone) {
      ch->last_ckpt_step = r.step;
      ch->last_ckpt_time = ps_now_s();
      snprintf(ch->last_ckpt_name, sizeof ch->last_ckpt_name, "%s", r.from);
    }
  }
  return rc;
}

/* ---------------------------------------------------------- checkpoint */

static void *write_main(void *arg) {
  ps_cut_write(arg);
  return NULL;
}

/* Stop the cluster: STOP to every shard, which tells its workers. */
static void stop_cluster(chief *ch) {
  ps_msg reqs[PS_CONFIG_MAX_NODES];
  memset(reqs, 0, sizeof reqs);
  for (int i = 0; i < ch->cfg->nps; i++) {
    reqs[i].type = PS_MSG_STOP;
    reqs[i].u.stop.step = ch->gstep;
  }
  for (int attempt = 0; attempt < 3; attempt++)
    if (call(ch, reqs, NULL, NULL) == 0)
      return;
  ps_log(PS_LOG_WARN, "stop: %s", ps_client_error(ch->client));
}

static void fail_nonfinite(chief *ch, uint64_t step, const char *what) {
  if (ch->status == PS_CHIEF_NONFINITE)
    return;  /* the evaluation and a checkpoint may both find it */
  ps_log(PS_LOG_ERROR, "non-finite weights at global step %" PRIu64 ": %s; stopping the run "
         "(the last good checkpoint is %s)", step, what,
         ch->last_ckpt_name[0] ? ch->last_ckpt_name : "none");
  ps_summary_event(&ch->sum, step, "nan", "{s:s, s:s}", "reason", what, "last_good",
                   ch->last_ckpt_name);
  ps_registry_set_done(ch->reg, step, 1);
  stop_cluster(ch);
  ch->status = PS_CHIEF_NONFINITE;
  ch->stopping = 1;
}

/* ------------------------------------------------------------ metrics */

static void metrics_update(chief *ch) {
  int up = 0;
  for (int i = 0; i < ch->cfg->nps; i++)
    up += ch->stats_ok[i];
  ps_metric_set(ch->series[C_GLOBAL_STEP], (double)ch->gstep);
  ps_metric_set(ch->series[C_SHARDS_UP], up);
  if (ch->last_ckpt_time > 0)
    ps_metric_set(ch->series[C_CKPT_AGE], ps_now_s() - ch->last_ckpt_time);
}

/* A finished write: log it and its summary. */
static void write_done(chief *ch, ps_cut *job) {
  if (job->nonfinite[0]) {
    fail_nonfinite(ch, job->step, job->nonfinite);
  } else if (job->rc != 0) {
    ps_log(PS_LOG_ERROR, "checkpoint at step %" PRIu64 " failed: %s", job->step, job->err);
    ps_metric_add(ch->series[C_CKPT_FAILURES], 1);
  } else {
    ps_metric_add(ch->series[C_CKPTS], 1);
    ps_metric_set(ch->series[C_CKPT_STALL], job->stall_ms * 1e-3);
    ps_metric_set(ch->series[C_CKPT_BYTES], (double)job->st.raw_bytes);
    ps_metric_set(ch->series[C_CKPT_STORED], (double)job->st.stored_bytes);
    double mb = (double)job->st.raw_bytes / 1e6;
    char inc[200] = "";
    if (job->st.incremental)
      snprintf(inc, sizeof inc, "; incremental on %s: %" PRIu64 " of %" PRIu64 " table entries "
               "changed (%.3f MB), %" PRIu64 " deleted, delta sections %.3f MB", job->st.base,
               job->st.changed, job->st.entries, (double)job->st.changed_bytes / 1e6,
               job->st.deleted, (double)job->st.delta_bytes / 1e6);
    ps_log(PS_LOG_INFO, "checkpoint %s: step %" PRIu64 ", stall %.1f ms, fetch %.2f s, write %.2f s"
           " (%.1f MB, ratio %.2f%s)", job->st.name, job->step, job->stall_ms, job->fetch_s,
           job->st.total_s, mb,
           job->st.stored_bytes ? (double)job->st.raw_bytes / (double)job->st.stored_bytes : 0.0,
           inc);
    ps_summary_event(&ch->sum, job->step, "checkpoint", "{s:s, s:f, s:f, s:f}", "name",
                     job->st.name, "stall_ms", job->stall_ms, "write_s", job->st.total_s, "mb", mb);
    snprintf(ch->last_ckpt_name, sizeof ch->last_ckpt_name, "%s", job->st.name);
    ch->wrote_step = job->step;
  }
  ps_cut_free(job);
}

/* Cut and hand the copies to the writer; wait: finish before returning. */
static int checkpoint(chief *ch, int wait) {
  ps_cut *job = ps_cut_take(&ch->cut_env, ++ch->cut_id, ps_cut_hold_ms(&ch->cut_env));
  if (job == NULL)
    return -1;
  ch->last_ckpt_step = job->step;
  ch->last_ckpt_time = ps_now_s();
  if (ps_bg_start(&ch->writer, write_main, job) != 0) {
    ps_cut_write(job);
    write_done(ch, job);
    return 0;
  }
  while (wait && ps_bg_busy(&ch->writer)) {
    ps_cut *done = ps_bg_finished(&ch->writer);
    if (done != NULL) {
      write_done(ch, done);
      break;
    }
    if (lease_tick(ch) != 0)
      return -1;
    ps_notify_watchdog();
    usleep(10000);
  }
  return 0;
}

/* ---------------------------------------------------------- evaluation */

static void eval_done(chief *ch, const ps_eval_result *e, int final) {
  if (e->nonfinite[0]) {
    fail_nonfinite(ch, e->step, e->nonfinite);
    return;
  }
  if (e->has_auc) {
    ps_log(PS_LOG_INFO, "%sevaluation at global step %" PRIu64 ": test AUC %.4f, test log loss "
           "%.4f", final ? "final " : "", e->step, e->auc, e->loss);
    if (final)
      printf("final test_auc %.4f test_logloss %.4f global_step %" PRIu64 "\n", e->auc, e->loss,
             e->step);
    fflush(stdout);
    ps_summary_eval_auc(&ch->sum, e->step, e->loss, e->auc);
    ps_metric_set(ch->series[C_EVAL_STEP], (double)e->step);
    ps_metric_set(ch->series[C_EVAL_LOSS], e->loss);
    return;
  }
  ps_log(PS_LOG_INFO, "%sevaluation at global step %" PRIu64 ": test loss %.4f, test accuracy "
         "%.4f", final ? "final " : "", e->step, e->loss, e->accuracy);
  if (final)
    printf("final test_acc %.4f global_step %" PRIu64 "\n", e->accuracy, e->step);
  fflush(stdout);
  ps_summary_eval(&ch->sum, e->step, e->loss, e->accuracy);
  ps_metric_set(ch->series[C_EVAL_STEP], (double)e->step);
  ps_metric_set(ch->series[C_EVAL_LOSS], e->loss);
  ps_metric_set(ch->series[C_EVAL_ACCURACY], e->accuracy);
}

static int eval_tick(void *arg) {
  chief *ch = arg;
  return lease_tick(ch) != 0 || stop_signal;
}

/* Pull the weights and evaluate them; wait: here, and report it. */
static int evaluate(chief *ch, int wait) {
  if (ch->eval == NULL)
    return -1;
  float *params = malloc(ch->model->vars.total * sizeof(float));
  if (params == NULL)
    return -1;
  int rc = -1;
  for (int attempt = 0; attempt < 5 && rc != 0 && lease_tick(ch) == 0; attempt++)
    rc = ps_client_pull(ch->client, params);
  if (rc != 0) {
    ps_log(PS_LOG_WARN, "evaluation: pulling the weights: %s", ps_client_error(ch->client));
    free(params);
    return -1;
  }
  if (ps_eval_needs_client(ch->eval)) {
    /* Its batches pull their rows: here, the lease kept between them. */
    if (ps_eval_pulled(ch->eval, ch->client, ps_client_global_step(ch->client), params,
                       eval_tick, ch) != 0)
      return -1;
  } else {
    ps_eval_start(ch->eval, ps_client_global_step(ch->client), params, wait);
  }
  ps_eval_result r;
  if (wait && ps_eval_finished(ch->eval, &r))
    eval_done(ch, &r, 1);
  return 0;
}

/* --------------------------------------------------------------- hooks */

static void hooks(chief *ch) {
  const ps_config *cfg = ch->cfg;
  uint64_t g = ch->gstep;
  double now = ps_now_s();
  ps_cut *wj = ps_bg_finished(&ch->writer);
  if (wj != NULL)
    write_done(ch, wj);
  ps_eval_result er;
  if (ch->eval != NULL && ps_eval_finished(ch->eval, &er))
    eval_done(ch, &er, 0);
  if (ch->stopping)
    return;
  if (cfg->chief_log_every > 0 && g >= ch->next_log_step && now - ch->log_t0 >= 0.5) {
    double sps = now > ch->log_t0 ? (double)(g - ch->log_step0) / (now - ch->log_t0) : 0.0;
    if (g > 0) {
      char of[32] = "";
      if (cfg->last_step > 0)
        snprintf(of, sizeof of, " of %" PRId64, cfg->last_step);
      ps_log(PS_LOG_INFO, "global step %" PRIu64 "%s, %.1f steps/s", g, of, sps);
      ps_summary_progress(&ch->sum, g, sps);
    }
    ch->next_log_step = (g / (uint64_t)cfg->chief_log_every + 1) * (uint64_t)cfg->chief_log_every;
    ch->log_step0 = g;
    ch->log_t0 = now;
  }
  if (cfg->last_step > 0 && g >= (uint64_t)cfg->last_step)
    return;  /* the finish takes it from here */
  int due = (cfg->checkpoint_every_steps > 0 &&
             g >= ch->last_ckpt_step + (uint64_t)cfg->checkpoint_every_steps) ||
            (cfg->checkpoint_every_secs > 0 &&
             now - ch->last_ckpt_time >= (double)cfg->checkpoint_every_secs);
  if (due && g > ch->last_ckpt_step && !ps_bg_busy(&ch->writer))
    checkpoint(ch, 0);
  if (cfg->chief_eval_every > 0 && g >= ch->next_eval_step && ch->eval != NULL &&
      !ps_eval_busy(ch->eval)) {
    evaluate(ch, 0);
    ch->next_eval_step = (g / (uint64_t)cfg->chief_eval_every + 1) * (uint64_t)cfg->chief_eval_every;
  }
}

/* The run reached last_step: a final checkpoint there, a final
 * evaluation, then STOP. */
static void finish(chief *ch) {
  while (ps_bg_busy(&ch->writer) || (ch->eval != NULL && ps_eval_busy(ch->eval))) {
    hooks(ch);
    if (lease_tick(ch) != 0)
      return;
    ps_notify_watchdog();
    usleep(10000);
  }
  if (ch->stopping)
    return;
  /* The final checkpoint, tried up to 5 times a second apart; without it
   * the run is not done. */
  for (int attempt = 0; attempt < 5 && ch->wrote_step != ch->gstep; attempt++) {
    for (uint64_t t0 = ps_now_ns(); attempt > 0 && ps_now_ns() - t0 < 1000000000ULL;) {
      if (stop_signal || lease_tick(ch) != 0)
        return;
      ps_notify_watchdog();
      usleep(10000);
    }
    checkpoint(ch, 1);
    if (ch->stopping)
      return;
  }
  if (ch->wrote_step != ch->gstep) {
    ps_log(PS_LOG_ERROR, "the final checkpoint at global step %" PRIu64 " failed 5 times (said "
           "above); the run is not done, and its newest checkpoint is %s: mend [checkpoint] "
           "dir %s and start the chief again, it writes the final checkpoint then", ch->gstep,
           ch->last_ckpt_name[0] ? ch->last_ckpt_name : "none", ch->cfg->checkpoint_dir);
    ch->status = PS_CHIEF_FAILED;
    ch->stopping = 1;
    return;
  }
  evaluate(ch, 1);
  if (ch->stopping)
    return;
  ps_log(PS_LOG_INFO, "reached last_step %" PRId64 ": final checkpoint %s; stopping the cluster",
         ch->cfg->last_step, ch->last_ckpt_name[0] ? ch->last_ckpt_name : "(none)");
  /* Processes that start later (a restart after a crash) exit at once. */
  if (ps_registry_set_done(ch->reg, ch->gstep, 0) != 0)
    ps_log(PS_LOG_WARN, "redis: could not record the end of the run");
  stop_cluster(ch);
  ps_summary_event(&ch->sum, ch->gstep, "stop", "{s:s}", "checkpoint", ch->last_ckpt_name);
  ch->status = PS_CHIEF_DONE;
  ch->stopping = 1;
}

/* SIGTERM or Ctrl-C: a final checkpoint at the step reached, so that
 * stopping a run keeps its training, bounded by [checkpoint] on_stop_secs.
 * @return 1 when its write is still running at the bound (the caller then
 * exits without freeing what the writer uses), else 0. */
static int stop_checkpoint(chief *ch) {
  int64_t secs = ch->cfg->checkpoint_on_stop_secs;
  const char *sig = stop_signal == SIGTERM ? "SIGTERM" : "SIGINT";
  if (secs <= 0 || !ch->serving || ch->stopping)
    return 0;
  poll_stats(ch);
  if (ch->wrote_step == ch->gstep) {
    ps_log(PS_LOG_INFO, "%s: the newest checkpoint %s is at global step %" PRIu64 " already", sig,
           ch->last_ckpt_name, ch->gstep);
    return 0;
  }
  ps_log(PS_LOG_INFO, "%s: a final checkpoint at global step %" PRIu64 " (at most %" PRId64
         " s, [checkpoint] on_stop_secs)", sig, ch->gstep, secs);
  uint64_t deadline = ps_now_ns() + (uint64_t)secs * 1000000000ULL;
  uint64_t before = ch->wrote_step;
  if (checkpoint(ch, 0) != 0) {
    /* The cut said why (the shards stopping too, as systemctl stop
     * paramserv.target stops a machine's units at once; a worker that has
     * not saved a data position yet): the shards keep their states in
     * Redis, so nothing is lost; only the checkpoint directory stays where
     * it was. */
    ps_log(PS_LOG_WARN, "%s: no final checkpoint (the cut failed, said above); the newest "
           "checkpoint is %s (stop the chief before the shards to have one)", sig,
           ch->last_ckpt_name[0] ? ch->last_ckpt_name : "none");
    return 0;
  }
  while (ps_bg_busy(&ch->writer)) {
    ps_cut *j = ps_bg_finished(&ch->writer);
    if (j != NULL) {
      write_done(ch, j);
      break;
    }
    if (ps_now_ns() > deadline) {
      ps_log(PS_LOG_ERROR, "%s: the final checkpoint did not finish within %" PRId64 " s "
             "([checkpoint] on_stop_secs): stopping without it; the newest checkpoint is %s",
             sig, secs, ch->last_ckpt_name[0] ? ch->last_ckpt_name : "none");
      ch->status = PS_CHIEF_FAILED;
      return 1;
    }
    lease_tick(ch);
    ps_notify_watchdog();
    usleep(10000);
  }
  if (ch->wrote_step == before)
    ch->status = PS_CHIEF_FAILED;  /* write_done said why */
  return 0;
}

/* ---------------------------------------------------------------- run */

/* The schedule goes on from the newest checkpoint in the directory. */
static void schedule_from_dir(chief *ch) {
  ps_errbuf eb = {0};
  ps_ckpt_entry *e = NULL;
  int n = ps_ckpt_list(ch->cfg->checkpoint_dir, &e, &eb);
  ch->last_ckpt_time = ps_now_s();
  ch->last_ckpt_step = ch->gstep;
  for (int i = n - 1; i >= 0; i--)
    if (e[i].on_disk && e[i].step <= ch->gstep) {
      /* e[i].time is wall-clock time; the schedule runs on the monotonic
       * clock: carry the checkpoint's age over. */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      double age = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 - e[i].time;
      ch->last_ckpt_step = e[i].step;
      ch->last_ckpt_time = ps_now_s() - (age > 0 ? age : 0);
      snprintf(ch->last_ckpt_name, sizeof ch->last_ckpt_name, "%s", e[i].name);
      break;
    }
  free(e);
  if (n < 0)
    ps_log(PS_LOG_WARN, "%s", eb.msg);
}

int ps_chief_run(const ps_config *cfg) {
  ps_log_init("chief", ps_log_level_parse(cfg->log_level) < 0 ? PS_LOG_INFO
                                                               : ps_log_level_parse(cfg->log_level));
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  chief *ch = calloc(1, sizeof *ch);
  if (ch == NULL)
    return PS_CHIEF_FAILED;
  if (cfg->mode == PS_MODE_RING) {
    /* A ring is read as a one-shard cluster whose shard is a member
     * (src/ring/README.md, "The chief"), as the client does. */
    ch->ring_cfg = malloc(sizeof *ch->ring_cfg);
    if (ch->ring_cfg == NULL) {
      free(ch);
      return PS_CHIEF_FAILED;
    }
    *ch->ring_cfg = *cfg;
    ch->ring_cfg->nps = 1;
    ch->ring_cfg->ps[0] = cfg->workers[0];
    cfg = ch->ring_cfg;
  }
  ch->cfg = cfg;
  ps_nodes_init(&ch->nodes, cfg, &ch->sum);
  ch->status = PS_CHIEF_FAILED;
  ch->wrote_step = UINT64_MAX;
  ps_errbuf eb = {0};
  uint64_t token = 0;
  char path[4200];
  if (ps_metrics_start(cfg, "chief", 0, chief_series, C_N, ch->series, &ch->metrics, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    goto out;
  }
  /* Found now, not at the first checkpoint (or the last). */
  if (ps_ckpt_dir_writable(cfg->checkpoint_dir, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "[checkpoint] dir: %s; the chief writes its checkpoints there (and a "
           "standby chief needs it too)", eb.msg);
    ch->status = PS_CHIEF_REFUSED;
    goto out;
  }
  ch->client = ps_client_new_as(cfg->path, PS_ROLE_CHIEF, 0, &eb);
  if (ch->client == NULL) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    goto out;
  }
  ch->layout = ps_client_layout(ch->client);
  ch->model = ps_client_model(ch->client);
  ps_model_spec_format(&ch->model->spec, ch->model_text, sizeof ch->model_text);
  ch->cut_env = (ps_cut_env){.cfg = cfg, .client = ch->client, .layout = ch->layout,
                             .model = ch->model, .model_text = ch->model_text,
                             .call = cut_call, .call_arg = ch,
                             .positions = cut_positions, .positions_arg = ch};
  const char *delay = getenv("PS_TEST_CUT_DELAY_MS");
  ch->cut_env.test_delay_ms = delay != NULL ? atoi(delay) : 0;
  /* A call never outlasts half the lease: a chief whose lease the keeper
   * lost learns it before its next call. */
  ps_client_set_deadline(ch->client, (int)(cfg->chief_lease_ms / 2 > 200 ? cfg->chief_lease_ms / 2
                                                                          : 200));
  ch->reg = ps_registry_new(cfg, "chief", 0);
  if (ch->reg == NULL ||
      ps_registry_new_epoch(ch->reg, (volatile int *)&stop_signal, &token, &eb) != 0) {
    if (stop_signal)
      ch->status = PS_CHIEF_DONE;
    else
      ps_log(PS_LOG_ERROR, "%s", ch->reg ? eb.msg : "out of memory");
    goto out;
  }
  ps_lease_init(&ch->lease, cfg->cluster_id, cfg->chief_lease_ms);
  if (lease_wait(ch) != 0) {
    ch->status = PS_CHIEF_DONE;
    goto out;
  }
  if (ps_lease_keeper_start(&ch->keeper, cfg, &ch->lease) != 0) {
    ps_log(PS_LOG_ERROR, "cannot start the thread that renews the lease %s", ch->lease.key);
    goto out;
  }
  /* The token of this holding of the lease: higher than every earlier
   * holder's, whatever order the chiefs started in. */
  token = ch->lease.token;
  ps_metric_set(ch->series[C_LEASE_HELD], 1);
  ps_metric_set(ch->series[C_LEASE_TOKEN], (double)token);
  ps_client_set_fence(ch->client, token);
  ch->writer_reg = ps_registry_new(cfg, "chief", 0);
  if (ch->writer_reg == NULL) {
    ps_log(PS_LOG_ERROR, "out of memory");
    goto out;
  }
  ch->fence = (ps_lease_fence){.lease = &ch->lease, .reg = ch->reg};
  ch->writer_fence = (ps_lease_fence){.lease = &ch->lease, .reg = ch->writer_reg};
  ch->owner = (ps_ckpt_owner){.token = token, .fence = ps_lease_fence_check,
                              .fence_arg = &ch->fence};
  ch->writer_owner = (ps_ckpt_owner){.token = token, .fence = ps_lease_fence_check,
                                     .fence_arg = &ch->writer_fence};
  ch->cut_env.owner = &ch->writer_owner;
  {
    /* Incremental checkpoints of the sparse tables (FORMAT.md 2.4). */
    const ps_model *m = ch->cut_env.model;
    ps_tsec_table tt[PS_MODEL_MAX_TABLES];
    for (int t = 0; t < m->ntables; t++)
      tt[t] = (ps_tsec_table){.dim = (uint32_t)m->tables[t].dim,
                              .nslots = (uint32_t)ps_optim_nslots(m->tables[t].optim.kind)};
    if (ps_ckpt_chain_new((int)cfg->checkpoint_full_every, tt, m->ntables,
                          cfg->consistency == PS_CONSISTENCY_SYNC, &ch->chain) != 0) {
      ps_log(PS_LOG_ERROR, "out of memory");
      goto out;
    }
    ch->cut_env.chain = ch->chain;
  }
  uint64_t done_step = 0;
  int nonfinite = 0;
  if (ps_registry_get_done(ch->reg, &done_step, &nonfinite) == 1) {
    if (nonfinite) {
      ps_log(PS_LOG_ERROR, "the run was stopped at global step %" PRIu64 " because the weights "
             "went non-finite; to go on from the last good checkpoint, fix the cause (e.g. a "
             "lower [train] lr), delete {%s}:done and the shards' replicas, and start again",
             done_step, cfg->cluster_id);
      ch->status = PS_CHIEF_NONFINITE;
      goto done;
    }
    if (cfg->last_step == 0 || (uint64_t)cfg->last_step <= done_step) {
      ps_log(PS_LOG_INFO, "the run already ended at global step %" PRIu64 " ({%s}:done in Redis): "
             "nothing to do; raise [train] last_step to train on", done_step, cfg->cluster_id);
      ps_notify_done("the run ended at global step %" PRIu64, done_step);
      ch->status = PS_CHIEF_DONE;
      goto done;
    }
    ps_log(PS_LOG_INFO, "the run ended at global step %" PRIu64 " and [train] last_step is now %"
           PRId64 ": training on (start the shards and workers again)", done_step,
           cfg->last_step);
    ps_registry_clear_done(ch->reg);
  }
  if (cfg->summary_file[0])
    snprintf(path, sizeof path, "%s", cfg->summary_file);
  else
    snprintf(path, sizeof path, "%s/summaries.jsonl", cfg->checkpoint_dir);
  if (ps_summary_open(&ch->sum, path) != 0)
    ps_log(PS_LOG_WARN, "%s: cannot append summaries: %s", path, strerror(errno));
  ps_log(PS_LOG_INFO, "holding the lease %s (token %" PRIu64 "); model %s, %d shards, %d workers,"
         " checkpoints in %s", ch->lease.key, token, ch->model_text, cfg->nps, cfg->nworkers,
         cfg->checkpoint_dir);
  ps_summary_event(&ch->sum, 0, "chief", "{s:I}", "token", (long long)token);
  if (cfg->chief_eval_every > 0 || cfg->last_step > 0)
    ch->eval = ps_eval_new(cfg, ch->model);

  /* The restore plan: wait until every shard answers. */
  int said = 0;
  uint64_t t0 = ps_now_ns();
  while (!stop_signal && !ch->stopping && poll_stats(ch) != 0) {
    ring_retarget(ch);
    if (!said || ps_now_ns() - t0 > 10000000000ULL) {
      ps_log(PS_LOG_INFO, "waiting for every shard to answer: %s", ps_client_error(ch->client));
      said = 1;
      t0 = ps_now_ns();
    }
    usleep(TICK_MS * 1000);
  }
  if (stop_signal || ch->stopping)
    goto done;
  int missing = 0;
  for (int i = 0; i < cfg->nps; i++)
    missing += !(ch->stats[i].flags & PS_STATS_INITIALIZED);
  if (missing == 0) {
    ps_log(PS_LOG_INFO, "every shard holds its state (restored from Redis, or running): global "
           "step %" PRIu64, ch->gstep);
    ps_summary_event(&ch->sum, ch->gstep, "restore", "{s:s}", "source",
                     ps_plan_source_name(PS_PLAN_REDIS));
  } else {
    int rc = load_missing(ch, missing == cfg->nps);
    if (rc == -2) {
      /* Checkpoints it cannot use, or of another optimizer: said why. */
      ch->status = PS_CHIEF_REFUSED;
      goto done;
    }
    /* Otherwise a shard that did not take its state is retried each tick. */
    poll_stats(ch);
  }
  if (ps_ckpt_retain(cfg->checkpoint_dir, ch->cut_env.model_text,
                     cfg->max_to_keep, cfg->keep_every_n_hours,
                     ch->restored_from[0] ? ch->restored_from : NULL, &ch->owner, &eb) < 0)
    ps_log(PS_LOG_WARN, "retention: %s", eb.msg);
  if (!ch->last_ckpt_name[0])
    schedule_from_dir(ch);
  ch->next_eval_step = cfg->chief_eval_every > 0
                           ? (ch->gstep / (uint64_t)cfg->chief_eval_every + 1) *
                                 (uint64_t)cfg->chief_eval_every
                           : UINT64_MAX;
  poll_stats(ch);  /* the rate counts from a fresh step */
  ch->log_t0 = ps_now_s();
  ch->log_step0 = ch->gstep;
  ps_notify_ready("chief of %s at global step %" PRIu64, cfg->cluster_id, ch->gstep);
  ch->serving = 1;
  ch->next_log_step = ch->gstep + 1;

  while (!stop_signal && !ch->stopping) {
    uint64_t tick0 = ps_now_ns();
    if (poll_stats(ch) != 0)
      ring_retarget(ch);
    else {
      int missing_now = 0;
      for (int i = 0; i < cfg->nps; i++)
        missing_now += !(ch->stats[i].flags & PS_STATS_INITIALIZED);
      if (missing_now > 0 && load_missing(ch, missing_now == cfg->nps) == -2)
        break;
    }
    ps_nodes_workers(&ch->nodes, ch->reg, ch->gstep);
    metrics_update(ch);
    ps_notify_watchdog();
    double now = ps_now_s();
    ps_registry_tick(ch->reg, NULL, ch->gstep,
                     now > ch->log_t0 ? (double)(ch->gstep - ch->log_step0) / (now - ch->log_t0)
                                      : 0.0,
                     0);
    if (ch->stopping)
      break;
    if (cfg->last_step > 0 && ch->gstep >= (uint64_t)cfg->last_step && ch->stats_ok[0]) {
      finish(ch);
      break;
    }
    hooks(ch);
    uint64_t spent = (ps_now_ns() - tick0) / 1000000ULL;
    if (spent < TICK_MS)
      usleep((useconds_t)(TICK_MS - spent) * 1000);
  }
done:
  ps_notify_stopping();
  if (stop_signal)
    ch->status = PS_CHIEF_DONE;
  /* Let a write in flight finish: a checkpoint is never cut short. */
  while (ps_bg_busy(&ch->writer)) {
    ps_cut *j = ps_bg_finished(&ch->writer);
    if (j != NULL)
      write_done(ch, j);
    else
      usleep(10000);
  }
  int abandoned = stop_signal ? stop_checkpoint(ch) : 0;
  if (stop_signal)
    ps_log(PS_LOG_INFO, "%s: stopping; the cluster trains on without a chief until one is back",
           stop_signal == SIGTERM ? "SIGTERM" : "SIGINT");
  ps_lease_keeper_stop(&ch->keeper);
  /* A clean exit says so: the next chief need not wait out the lease. */
  void *c = ps_registry_redis(ch->reg, 1);
  int released = c != NULL ? ps_lease_release(&ch->lease, c) : -1;
  ps_metric_set(ch->series[C_LEASE_HELD], 0);
  if (released == 1)
    ps_log(PS_LOG_INFO, "released the lease %s", ch->lease.key);
  else
    ps_log(PS_LOG_WARN, "the lease %s was not released (%s): the next chief waits until it expires",
           ch->lease.key, released == 0 ? "no longer ours" : "Redis did not answer");
  if (abandoned) {
    /* The writer still uses the cut and the clients: exit under it (its
     * files are temporary until renamed; the next chief removes them). */
    fflush(NULL);
    _exit(ch->status);
  }
out:
  ps_lease_keeper_stop(&ch->keeper);
  ps_metrics_free(ch->metrics);
  ps_summary_close(&ch->sum);
  ps_eval_free(ch->eval);
  ps_registry_free(ch->reg);
  ps_registry_free(ch->writer_reg);
  ps_client_free(ch->client);
  ps_ckpt_chain_free(ch->chain);
  int status = ch->status;
  free(ch->ring_cfg);
  free(ch);
  return status;
}
