/* A checkpoint cut of every shard, fetched and written (see cut.h). */
#include "chief/cut.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/endian.h"
#include "common/log.h"
#include "common/timeutil.h"

#define PIECE_FLOATS (1u << 20)  /* floats per FETCH reply: 4 MB */

int ps_find_nonfinite(const float *v, size_t n, int shard, char *what, size_t len) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(v[i])) {
      if (shard < 0)
        snprintf(what, len, "%s at element %zu of the model", isnan(v[i]) ? "NaN" : "Inf", i);
      else
        snprintf(what, len, "%s in shard %d at element %zu", isnan(v[i]) ? "NaN" : "Inf", shard,
                 i);
      return 1;
    }
  return 0;
}

int64_t ps_cut_deadline_ms(int hold_ms) { return (int64_t)hold_ms - hold_ms / 4; }

int ps_cut_hold_ms(const ps_cut_env *env) {
  uint64_t ms = 2000 + env->largest_image * sizeof(float) / 150000;
  if (ms < (uint64_t)env->retry_hold_ms)
    ms = (uint64_t)env->retry_hold_ms;
  return ms > 60000 ? 60000 : (int)ms;
}

typedef struct cut_ctx {
  ps_cut *job;
  uint64_t cut_id;
  int replied;
  uint64_t last_reply_ns;
} cut_ctx;

static void on_cut_reply(void *arg, int shard, const ps_msg *m) {
  cut_ctx *x = arg;
  if (m->u.cut_reply.cut_id != x->cut_id)
    return;
  x->job->info[shard] = m->u.cut_reply.state;
  x->replied++;
  x->last_reply_ns = ps_now_ns();
}

static void on_fetch_reply(void *arg, int shard, const ps_msg *m) {
  cut_ctx *x = arg;
  const ps_msg_fetch_reply *f = &m->u.fetch_reply;
  ps_cut *job = x->job;
  if (f->cut_id != x->cut_id || f->offset + f->count > job->info[shard].image_floats)
    return;
  memcpy(job->img[shard] + f->offset, f->data, f->count * sizeof(float));
}

void ps_cut_free(ps_cut *job) {
  if (job == NULL)
    return;
  for (int i = 0; i < PS_CONFIG_MAX_NODES; i++)
    free(job->img[i]);
  free(job);
}

ps_cut *ps_cut_take(ps_cut_env *env, uint64_t cut_id, int hold_ms) {
  const ps_config *cfg = env->cfg;
  ps_cut *job = calloc(1, sizeof *job);
  if (job == NULL)
    return NULL;
  job->env = env;
  cut_ctx x = {.job = job, .cut_id = cut_id};
  ps_msg reqs[PS_CONFIG_MAX_NODES];
  memset(reqs, 0, sizeof reqs);
  for (int i = 0; i < cfg->nps; i++) {
    reqs[i].type = PS_MSG_CUT;
    reqs[i].u.cut.cut_id = x.cut_id;
    reqs[i].u.cut.hold_ms = (uint32_t)hold_ms;
  }
  uint64_t connects = ps_client_connects(env->client);
  /* The CUT call may take as long as the cut may. */
  int normal = ps_client_deadline(env->client);
  int64_t cut_ms = ps_cut_deadline_ms(hold_ms);
  if (normal > 0 && cut_ms > normal)
    ps_client_set_deadline(env->client, (int)cut_ms);
  uint64_t t0 = ps_now_ns();
  int rc = env->call(env->call_arg, reqs, on_cut_reply, &x);
  ps_client_set_deadline(env->client, normal);
  /* The CUT call's own error: the RESUME's below would replace it. */
  char cut_err[300] = "";
  if (rc != 0)
    snprintf(cut_err, sizeof cut_err, "%s", ps_client_error(env->client));
  for (int i = 0; i < cfg->nps; i++)
    if (job->info[i].image_floats > env->largest_image)
      env->largest_image = job->info[i].image_floats;
  if (env->test_delay_ms > 0) {
    struct timespec d = {env->test_delay_ms / 1000, (long)(env->test_delay_ms % 1000) * 1000000L};
    while (nanosleep(&d, &d) != 0 && errno == EINTR) {
    }
  }
  /* Every shard holds its pushes now, so no worker moves on: its data
   * position in Redis is the cut's. */
  char why[256] = "";
  int late = 0, pos_rc = -1;
  if (rc == 0 && x.replied == cfg->nps) {
    pos_rc = env->positions(env->positions_arg, job->pos, why, sizeof why);
    /* Checked after the reads too: every shard must still have held its
     * pushes when the positions were read. */
    late = (ps_now_ns() - t0) / 1000000ULL > (uint64_t)ps_cut_deadline_ms(hold_ms);
  }
  double replies_ms = x.replied > 0 ? (double)(x.last_reply_ns - t0) * 1e-6 : 0.0;
  /* Resume whatever was cut, even after a failure. */
  for (int i = 0; i < cfg->nps; i++) {
    reqs[i].type = PS_MSG_RESUME;
    reqs[i].u.resume.cut_id = x.cut_id;
  }
  int rc2 = env->call(env->call_arg, reqs, NULL, NULL);
  job->stall_ms = (double)(ps_now_ns() - t0) * 1e-6;
  env->retry_hold_ms = rc != 0 || rc2 != 0 || x.replied != cfg->nps || late
                           ? (hold_ms < 30000 ? 2 * hold_ms : 60000)
                           : 0;
  if (rc != 0 || rc2 != 0 || x.replied != cfg->nps ||
      ps_client_connects(env->client) != connects) {
    ps_log(PS_LOG_WARN, "checkpoint: the cut did not complete (%s); trying again later",
           rc == -EPERM || rc2 == -EPERM ? "this chief no longer holds the lease"
           : rc                          ? cut_err
           : rc2                         ? ps_client_error(env->client)
                                         : "a shard reconnected during it");
    ps_cut_free(job);
    return NULL;
  }
  if (late) {
    ps_log(PS_LOG_WARN, "checkpoint: cut %" PRIu64 " abandoned: the CUT replies came %.0f ms after "
           "the CUTs and the positions were read later still, past the %" PRId64 " ms a shard "
           "surely holds its pushes (hold_ms %d less a quarter): a shard may have resumed by "
           "itself; trying again later", cut_id, replies_ms, ps_cut_deadline_ms(hold_ms), hold_ms);
    ps_cut_free(job);
    return NULL;
  }
  if (pos_rc != 0) {
    ps_log(PS_LOG_ERROR, "checkpoint: cut %" PRIu64 " not written: %s", cut_id, why);
    ps_cut_free(job);
    return NULL;
  }
  job->step = job->info[0].global_step;
  /* Fetch while training goes on. */
  uint64_t t1 = ps_now_ns();
  for (int i = 0; i < cfg->nps; i++) {
    job->img[i] = malloc((size_t)(job->info[i].image_floats ? job->info[i].image_floats : 1) *
                         sizeof(float));
    if (job->img[i] == NULL) {
      ps_log(PS_LOG_ERROR, "checkpoint: out of memory for shard %d's copy", i);
      ps_cut_free(job);
      return NULL;
    }
  }
  /* Every shard's next piece in each round, each at most its slice long
   * (the cap of its frames).  A FETCH may wait as long as a CUT could: the
   * shard's loop may be copying a state for Redis. */
  uint64_t got[PS_CONFIG_MAX_NODES] = {0};
  if (normal > 0 && cut_ms > normal)
    ps_client_set_deadline(env->client, (int)cut_ms);
  for (;;) {
    int any = 0;
    memset(reqs, 0, sizeof reqs);
    for (int i = 0; i < cfg->nps; i++) {
      uint64_t left = job->info[i].image_floats - got[i];
      uint64_t piece = env->layout->shard_floats[i] < PIECE_FLOATS ? env->layout->shard_floats[i]
                                                                  : PIECE_FLOATS;
      if (left == 0)
        continue;
      reqs[i].type = PS_MSG_FETCH;
      reqs[i].u.fetch.cut_id = x.cut_id;
      reqs[i].u.fetch.offset = got[i];
      reqs[i].u.fetch.count = left < piece ? left : piece;
      any = 1;
    }
    if (!any)
      break;
    if (env->call(env->call_arg, reqs, on_fetch_reply, &x) != 0 || ps_client_connects(env->client) != connects) {
      ps_log(PS_LOG_WARN, "checkpoint: fetching the copies failed (%s); trying again later",
             ps_client_error(env->client));
      ps_client_set_deadline(env->client, normal);
      ps_cut_free(job);
      return NULL;
    }
    for (int i = 0; i < cfg->nps; i++)
      if (reqs[i].type)
        got[i] += reqs[i].u.fetch.count;
  }
  ps_client_set_deadline(env->client, normal);
  job->fetch_s = (double)(ps_now_ns() - t1) * 1e-9;
  return job;
}

void ps_cut_write(ps_cut *job) {
  const ps_cut_env *env = job->env;
  const ps_config *cfg = env->cfg;
  ps_ckpt_shard_state shards[PS_CONFIG_MAX_NODES];
  memset(shards, 0, sizeof shards);
  for (int i = 0; i < cfg->nps; i++) {
    size_t n = env->layout->shard_floats[i];
    const float *img = job->img[i];
    /* The guard: never checkpoint weights that went NaN or Inf. */
    if (ps_find_nonfinite(img, n, i, job->nonfinite, sizeof job->nonfinite))
      return;
    shards[i] = (ps_ckpt_shard_state){.nfloats = n, .info = job->info[i], .img = img};
  }
  ps_ckpt_filter filter = PS_CKPT_FILTER_SHUFFLE;
  ps_ckpt_filter_parse(cfg->checkpoint_filter, &filter);
  ps_shard_opts so = ps_shard_opts_for(cfg, env->layout, 0);
  /* The user's own data (npy) is fed as it is. */
  ps_data_norm norm = cfg->data_format == PS_DATA_NPY ? PS_DATA_NORM_NONE : PS_DATA_NORM;
  ps_ckpt_write_opts o = {
      .step = job->step,
      .cluster_id = cfg->cluster_id,
      .model = env->model_text,
      .vars = &env->model->vars,
      .layout = env->layout,
      .optim = so.optim,
      .consistency = cfg->consistency,
      .filter = filter,
      .shards = shards,
      .nworkers = cfg->nworkers,
      .data_pos = job->pos,
      .global_step = job->step,
      /* What every worker trains: the model's layers and the inputs'
       * normalization (none for a model of variables only). */
      .network = env->model->nlayers > 0 ? &env->model->spec : NULL,
      .norm = &norm,
      .max_to_keep = cfg->max_to_keep,
      .keep_every_n_hours = cfg->keep_every_n_hours,
      .owner = env->owner,
  };
  ps_errbuf eb = {0};
  job->rc = env->chain != NULL ? ps_ckpt_chain_write(env->chain, cfg->checkpoint_dir, &o, &job->st, &eb)
                               : ps_ckpt_write(cfg->checkpoint_dir, &o, &job->st, &eb);
  if (job->rc != 0)
    snprintf(job->err, sizeof job->err, "%s", eb.msg);
}

