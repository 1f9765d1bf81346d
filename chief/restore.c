/* Shards that hold no state get one from the chief (see restore.h). */
#include "chief/restore.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/pool.h"
#include "common/timeutil.h"
#include "recovery/plan.h"
#include "recovery/relayout.h"

#define PIECE_FLOATS (1u << 20)  /* floats per LOAD piece */

/* The images of the shards that need one, made on threads: a checkpoint's
 * shard files decompress (and are verified) once, side by side. */
typedef struct images {
  const ps_cut_env *env;
  const ps_ckpt *ck;           /* NULL: the seeded initialization */
  const ps_relayout *rl;       /* ck laid out again: it is of another layout */
  int n;                       /* shards that need a state */
  int shard[PS_CONFIG_MAX_NODES];
  float *img[PS_CONFIG_MAX_NODES];
  ps_state_info in[PS_CONFIG_MAX_NODES];
  ps_errbuf eb[PS_CONFIG_MAX_NODES];
  int rc[PS_CONFIG_MAX_NODES];
  int mismatch;                /* the newest readable checkpoint does not fit this cluster */
  ps_errbuf mismatch_eb;
} images;

static void images_free(images *im) {
  for (int k = 0; k < im->n; k++) {
    free(im->img[k]);
    im->img[k] = NULL;
  }
}

static void plan_one(void *arg, int k) {
  images *im = arg;
  const ps_cut_env *env = im->env;
  if (im->rl != NULL) {
    ps_shard_opts so = ps_shard_opts_for(env->cfg, env->layout, im->shard[k]);
    ps_shard_opts_tables(&so, env->cfg, env->model);
    im->rc[k] = ps_relayout_image(im->rl, &so, &im->img[k], &im->in[k], &im->eb[k]);
    return;
  }
  im->rc[k] = ps_plan_shard_image(env->cfg, env->layout, env->model, im->ck, im->shard[k],
                                  &im->img[k], &im->in[k], &im->eb[k]);
}

/* Every image from ck (NULL: seeded), side by side (ps_pool_for).
 * @return 0, or the first failure's code with its message in *why (and no
 * image kept). */
static int plan_images(images *im, const ps_ckpt *ck, ps_errbuf *why) {
  images_free(im);
  im->ck = ck;
  ps_pool_for(im->n, plan_one, im);
  for (int k = 0; k < im->n; k++)
    if (im->rc[k] != 0) {
      int rc = ps_err_set(why, im->rc[k], "%s", im->eb[k].msg);
      images_free(im);
      return rc;
    }
  return 0;
}

/* A checkpoint of this model taken with another layout (another number of
 * shards): every shard file read once, each image cut from them. */
static int relayout_images(images *im, const ps_ckpt *c, ps_errbuf *why) {
  const ps_cut_env *env = im->env;
  ps_relayout *rl = NULL;
  ps_relayout_stats st;
  int rc = ps_relayout_open(c, &env->model->vars, env->layout, &rl, &st, why);
  if (rc != 0)
    return rc;
  im->rl = rl;
  rc = plan_images(im, c, why);
  im->rl = NULL;
  ps_relayout_close(rl);
  if (rc == 0)
    ps_log(PS_LOG_INFO, "%s was taken with %d shard%s: laid out again for %d; sparse rows moved "
           "to another shard: %" PRIu64 " of %" PRIu64 " (%.1f%%), pending keys %" PRIu64
           " of %" PRIu64, c->name, st.from_shards, st.from_shards == 1 ? "" : "s", st.to_shards,
           st.rows_moved, st.rows, st.rows ? 100.0 * (double)st.rows_moved / (double)st.rows : 0.0,
           st.pending_moved, st.pending);
  return rc;
}

/* A damaged checkpoint is passed over for the one before it, and so is
 * another model's; one of this model that does not fit the cluster
 * (another optimizer, other variables) stops the search: an older one
 * would not fit either, and the seeded initialization instead would throw
 * the training away.  One of another layout (another number of shards) is
 * laid out again. */
static int accept_ckpt(const ps_ckpt *c, void *arg, ps_errbuf *why) {
  images *im = arg;
  const ps_cut_env *env = im->env;
  int rc = c->layout_hash == env->layout->hash ? plan_images(im, c, why)
                                               : relayout_images(im, c, why);
  if (rc == PS_ELAYOUT) {
    im->mismatch = 1;
    im->mismatch_eb = *why;
    return 0;
  }
  return rc;
}

/* A shard answers an image's last LOAD piece once it has decoded the
 * table section into its tables (ps_shard_state_load_end): seconds at
 * millions of rows, past the lease-bound deadline of the chief's other
 * calls (2.5 s with the default lease: a 20-million-row checkpoint laid
 * out for 3 shards timed out there and was read all over again).  Its call
 * may take 2 s plus 1 s per 25 MB of the largest table section (three
 * shards decoding 1 GB each took 12 s on 2 cores): the lease's own thread
 * renews it meanwhile, and a newer chief's token fences these LOADs. */
static int load_deadline_ms(const images *im, int normal) {
  uint64_t most = 0;
  for (int k = 0; k < im->n; k++)
    if (im->in[k].table_floats > most)
      most = im->in[k].table_floats;
  if (most == 0)
    return normal;  /* no tables: a LOAD is a copy */
  uint64_t ms = 2000 + most * sizeof(float) / 25000;
  return normal <= 0 || ms <= (uint64_t)normal ? normal : ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* LOAD every image, piece k of every shard in one call: the shards load
 * side by side. */
static int load_images(const ps_cut_env *env, const images *im) {
  int normal = ps_client_deadline(env->client);
  ps_client_set_deadline(env->client, load_deadline_ms(im, normal));
  int rc = 0;
  ps_msg reqs[PS_CONFIG_MAX_NODES];
  for (uint64_t piece = 0; rc == 0; piece++) {
    memset(reqs, 0, sizeof reqs);
    int any = 0;
    for (int k = 0; k < im->n; k++) {
      int i = im->shard[k];
      uint64_t size = env->layout->shard_floats[i] < PIECE_FLOATS ? env->layout->shard_floats[i]
                                                                  : PIECE_FLOATS;
      uint64_t off = piece * size, total = im->in[k].image_floats;
      if (off >= total)
        continue;
      ps_msg *m = &reqs[i];
      m->type = PS_MSG_LOAD;
      m->u.load.state = im->in[k];
      m->u.load.offset = off;
      m->u.load.count = total - off < size ? total - off : size;
      m->u.load.data = (const uint8_t *)(im->img[k] + off);
      any = 1;
    }
    if (!any)
      break;
    rc = env->call(env->call_arg, reqs, NULL, NULL);
  }
  ps_client_set_deadline(env->client, normal);
  return rc;
}

/* Checkpoints newer than the one found (none found: all) that the search
 * skipped as another model's or damaged.  Left where they are, they would
 * be overwritten when the run reaches their step, or, with none usable, a
 * start from the seed would go on over them as if they were not there: so
 * they are set aside into DIR/unusable/, and with none usable only when the
 * user said so ([checkpoint] unusable = set_aside).  @return 0, or -2
 * refused (said why in one line). */
static int unusable(const ps_config *cfg, int found, const ps_ckpt_skipped *sk) {
  const char *dir = cfg->checkpoint_dir;
  if (!found && cfg->ckpt_unusable == PS_CKPT_UNUSABLE_REFUSE) {
    ps_log(PS_LOG_ERROR, "%s holds %d checkpoint%s and none fits this cluster (the newest, %s: "
           "%s): refusing to start from the seeded initialization beside them; to start "
           "afresh, set [checkpoint] unusable = set_aside (they move into %s/unusable/) or "
           "give this model another [checkpoint] dir", dir, sk->n, sk->n == 1 ? "" : "s",
           sk->newest, sk->why, dir);
    return -2;
  }
  ps_ckpt_entry *e = NULL;
  ps_errbuf eb = {0};
  int n = ps_ckpt_list(dir, &e, &eb);
  if (n < 0) {
    ps_log(PS_LOG_ERROR, "%s; refusing to go on beside checkpoints it cannot list", eb.msg);
    return -2;
  }
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    if (!e[i].on_disk || (found && e[i].step <= sk->below))
      continue;
    if (ps_ckpt_set_aside(dir, e[i].name, &eb) != 0) {
      ps_log(PS_LOG_ERROR, "%s; refusing to go on beside it", eb.msg);
      rc = -2;
    } else {
      ps_log(PS_LOG_WARN, "checkpoint %s set aside into %s/unusable/: %s", e[i].name, dir,
             found ? "newer than the one restored, and unusable (said above)"
                   : "none fits this cluster ([checkpoint] unusable = set_aside)");
    }
  }
  free(e);
  return rc;
}

int ps_chief_restore(const ps_cut_env *env, ps_registry *reg, ps_summary *sum,
                     const ps_msg_stats_reply *stats, int everyone, ps_restore_result *out) {
  const ps_config *cfg = env->cfg;
  ps_ckpt ck;
  ps_errbuf eb = {0};
  memset(&ck, 0, sizeof ck);
  memset(out, 0, sizeof *out);
  images *im = calloc(1, sizeof *im);
  if (im == NULL) {
    ps_log(PS_LOG_WARN, "out of memory restoring the shards");
    return -1;
  }
  im->env = env;
  for (int i = 0; i < cfg->nps; i++)
    if (!(stats[i].flags & PS_STATS_INITIALIZED))
      im->shard[im->n++] = i;
  uint64_t t0 = ps_now_ns();
  /* The newest checkpoint whose files all decompress and verify, read
   * once: the images are what the shards get. */
  ps_ckpt_skipped sk;
  int found = ps_ckpt_find_latest_with(cfg->checkpoint_dir, env->layout->hash, env->model_text,
                                       accept_ckpt, im, &ck, &sk, &eb);
  int rc = 0;
  if (found < 0) {
    /* Checkpoints it cannot even list may hold the run: never start over them. */
    ps_log(PS_LOG_ERROR, "[checkpoint] dir: %s; refusing to start from the seeded "
           "initialization without knowing what it holds", eb.msg);
    found = 0;
    rc = -2;
  } else if (im->mismatch) {
    ps_log(PS_LOG_ERROR, "%s", im->mismatch_eb.msg);
    rc = -2;
  } else if (everyone && sk.n > 0) {
    rc = unusable(cfg, found, &sk);
  }
  if (rc == 0 && !found && plan_images(im, NULL, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    rc = -2;  /* the plan itself failed: retrying will not help */
  }
  if (rc == 0 && found && everyone) {
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
  /* Tests stand in for a state that takes long to read (it runs on the
   * chief's main thread; the lease keeper renews meanwhile). */
  const char *delay = getenv("PS_TEST_RESTORE_DELAY_MS");
  if (rc == 0 && delay != NULL && atoi(delay) > 0) {
    struct timespec d = {atoi(delay) / 1000, (long)(atoi(delay) % 1000) * 1000000L};
    nanosleep(&d, NULL);
  }
  double planned = (double)(ps_now_ns() - t0) * 1e-9;
  int lrc = rc == 0 ? load_images(env, im) : 0;
  if (lrc != 0) {
    const char *why = ps_client_error(env->client);
    ps_log(PS_LOG_WARN, "loading the shards' states: %s",
           why[0] ? why : lrc == -EPERM ? "this chief does not hold the lease any more"
                                        : strerror(lrc < 0 ? -lrc : lrc));
    rc = -1;
  }
  const char *src = found ? ck.name : "the seeded initialization";
  if (rc == 0)
    ps_log(PS_LOG_INFO, "%s: %d shard state%s made in %.3f s (side by side), loaded in %.3f s",
           src, im->n, im->n == 1 ? "" : "s", planned,
           (double)(ps_now_ns() - t0) * 1e-9 - planned);
  for (int k = 0; k < im->n && rc == 0; k++) {
    int i = im->shard[k];
    ps_log(PS_LOG_INFO, "shard %d: loaded from %s: version %" PRIu64 ", global step %" PRIu64
           " (%.3f s)", i, src, im->in[k].version, im->in[k].global_step,
           (double)(ps_now_ns() - t0) * 1e-9);
    if (!everyone && found)
      ps_log(PS_LOG_WARN, "shard %d had lost its state: it goes on from %s's, step %" PRIu64
             ", while the others keep theirs", i, ck.name, ck.step);
    ps_summary_event(sum, im->in[k].global_step, "restore", "{s:s, s:i, s:s}", "source",
                     ps_plan_source_name(found ? PS_PLAN_CHECKPOINT : PS_PLAN_INIT), "shard", i,
                     "from", found ? ck.name : "seed");
  }
  images_free(im);
  free(im);
  ps_ckpt_close(&ck);
  return rc;
}
