/* Shards that hold no state get one from the chief (see restore.h). */
#include "chief/restore.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "recovery/plan.h"

#define PIECE_FLOATS (1u << 20)  /* floats per LOAD piece */

/* LOAD an image into shard i, piece by piece. */
static int load_shard(const ps_cut_env *env, int i, const float *img,
                      const ps_state_info *in) {
  ps_msg reqs[PS_CONFIG_MAX_NODES];
  size_t piece = env->layout->shard_floats[i] < PIECE_FLOATS ? env->layout->shard_floats[i]
                                                              : PIECE_FLOATS;
  for (uint64_t off = 0; off < in->image_floats;) {
    uint64_t n = in->image_floats - off < piece ? in->image_floats - off : piece;
    memset(reqs, 0, sizeof reqs);
    ps_msg *m = &reqs[i];
    m->type = PS_MSG_LOAD;
    m->u.load.state = *in;
    m->u.load.offset = off;
    m->u.load.count = n;
    m->u.load.data = (const uint8_t *)(img + off);
    int rc = env->call(env->call_arg, reqs, NULL, NULL);
    if (rc != 0)
      return rc;
    off += n;
  }
  return 0;
}

int ps_chief_restore(const ps_cut_env *env, ps_registry *reg, ps_summary *sum,
                     const ps_msg_stats_reply *stats, int everyone, ps_restore_result *out) {
  const ps_config *cfg = env->cfg;
  ps_ckpt ck;
  ps_errbuf eb = {0};
  memset(&ck, 0, sizeof ck);
  memset(out, 0, sizeof *out);
  int found = ps_ckpt_find_latest(cfg->checkpoint_dir, env->layout->hash, env->model_text, &ck,
                                  &eb);
  if (found < 0) {
    ps_log(PS_LOG_WARN, "%s; starting from the seeded initialization", eb.msg);
    found = 0;
  }
  if (found && everyone) {
    for (int j = 0; j < ck.nworkers && j < cfg->nworkers; j++)
      if (ps_registry_set_pos(reg, j, &ck.data_pos[j]) != 0)
        ps_log(PS_LOG_WARN, "redis: could not restore worker %d's data position", j);
    ps_log(PS_LOG_INFO, "restored %d workers' data positions from %s", ck.nworkers, ck.name);
  }
  if (found) {
    out->found = 1;
    out->step = ck.step;
    snprintf(out->from, sizeof out->from, "%s", ck.name);
  }
  int rc = 0;
  for (int i = 0; i < cfg->nps && rc == 0; i++) {
    if (stats[i].flags & PS_STATS_INITIALIZED)
      continue;
    float *img = NULL;
    ps_state_info in;
    uint64_t t0 = ps_now_ns();
    if (ps_plan_shard_image(cfg, env->layout, env->model, found ? &ck : NULL, i, &img, &in, &eb) !=
        0) {
      ps_log(PS_LOG_ERROR, "shard %d: %s", i, eb.msg);
      rc = -2;  /* the plan itself failed: retrying will not help */
      break;
    }
    rc = load_shard(env, i, img, &in);
    free(img);
    if (rc != 0) {
      ps_log(PS_LOG_WARN, "shard %d: loading its state: %s", i, ps_client_error(env->client));
      break;
    }
    const char *src = found ? ck.name : "the seeded initialization";
    ps_log(PS_LOG_INFO, "shard %d: loaded from %s: version %" PRIu64 ", global step %" PRIu64
           " (%.3f s)", i, src, in.version, in.global_step, (double)(ps_now_ns() - t0) * 1e-9);
    if (!everyone && found)
      ps_log(PS_LOG_WARN, "shard %d had lost its state: it goes on from %s's, step %" PRIu64
             ", while the others keep theirs", i, ck.name, ck.step);
    ps_summary_event(sum, in.global_step, "restore", "{s:s, s:i, s:s}", "source",
                     ps_plan_source_name(found ? PS_PLAN_CHECKPOINT : PS_PLAN_INIT), "shard", i,
                     "from", found ? ck.name : "seed");
  }
  ps_ckpt_close(&ck);
  return rc == 0 ? 0 : rc == -2 ? -2 : -1;
}
