/* recovery/plan.c: a shard's first state image as the chief LOADs it.
 * Checked: with no checkpoint, each shard's image has the cluster's shape
 * (version 0, the config's slots, accumulator, sync target and one zero
 * row per worker) and holds the seeded values of its own slice with the
 * optimizer's initial slots; from a checkpoint (written by ps_ckpt_write
 * from real shards) it carries the version, global step, sync
 * accumulator, its count and target, and the exactly-once rows, dropping
 * the rows of workers this cluster lacks and leaving zero rows for those
 * it adds; a checkpoint of another optimizer's slots, another accumulator
 * or another slice length is refused with PS_ELAYOUT naming both sides.
 * Only public functions: ps_ckpt_write / ps_ckpt_open and
 * ps_plan_shard_image (no field of ps_ckpt_shard is read here). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpdir.h"

#include "common/config.h"
#include "common/log.h"
#include "layout/layout.h"
#include "nn/model.h"
#include "ps/shard.h"
#include "recovery/checkpoint.h"
#include "recovery/plan.h"

#define NSHARDS 2

/* A cluster of NSHARDS shards and `nworkers` workers from config text. */
typedef struct cluster {
  ps_config cfg;
  ps_model model;
  ps_layout layout;
} cluster;

static void cluster_make(cluster *k, int nworkers, const char *hidden, const char *train) {
  char workers[256] = "", text[1024];
  for (int j = 0; j < nworkers; j++)
    snprintf(workers + strlen(workers), sizeof workers - strlen(workers), "%s127.0.0.1:%d",
             j ? ", " : "", 7101 + j);
  snprintf(text, sizeof text,
           "[cluster]\nid = unit\nps = 127.0.0.1:7001, 127.0.0.1:7002\nworkers = %s\n"
           "[model]\nhidden = %s\nseed = 5\n[train]\n%s",
           workers, hidden, train);
  ps_errbuf eb = {0};
  memset(k, 0, sizeof *k);
  if (ps_config_parse("plan.conf", text, &k->cfg, &eb) != 0 ||
      ps_layout_for_cluster(&k->cfg, &k->model, &k->layout, &eb) != 0)
    fail_msg("%s", eb.msg);
}

static void cluster_close(cluster *k) {
  ps_layout_close(&k->layout);
  ps_model_close(&k->model);
}

static int setup(void **state) {
  (void)state;
  ps_log_init("test", PS_LOG_ERROR);
  return tmpdir_create("ps-plan");
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  return system(cmd) == 0 ? 0 : -1;
}

/* Write checkpoint `step` of cluster k's shards `sh` into DIR/ckpt and
 * open it into *c. */
static void write_and_open(const cluster *k, ps_shard *const *sh, uint64_t step, ps_ckpt *c) {
  ps_ckpt_shard_state st[NSHARDS];
  float *img[NSHARDS];
  for (int i = 0; i < NSHARDS; i++) {
    ps_state_info in = ps_shard_state_info(sh[i]);
    img[i] = malloc(in.image_floats * sizeof(float));
    assert_non_null(img[i]);
    ps_shard_state_write(sh[i], img[i]);
    st[i] = (ps_ckpt_shard_state){.nfloats = k->layout.shard_floats[i], .info = in, .img = img[i]};
  }
  char desc[128];
  ps_model_spec_format(&k->model.spec, desc, sizeof desc);
  ps_data_pos *pos = calloc((size_t)k->cfg.nworkers, sizeof *pos);
  assert_non_null(pos);
  ps_ckpt_write_opts o = {
      .step = step, .cluster_id = "unit", .model = desc, .vars = &k->model.vars,
      .layout = &k->layout, .optim = ps_shard_options(sh[0])->optim,
      .consistency = k->cfg.consistency, .filter = PS_CKPT_FILTER_SHUFFLE, .shards = st,
      .nworkers = k->cfg.nworkers, .data_pos = pos, .global_step = step,
      .network = &k->model.spec};
  ps_errbuf eb = {0};
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s", at("ckpt"));
  if (ps_ckpt_write(dir, &o, NULL, &eb) != 0)
    fail_msg("ps_ckpt_write: %s", eb.msg);
  snprintf(path, sizeof path, "%s/ckpt-%09" PRIu64, dir, step);
  if (ps_ckpt_open(c, path, &eb) != 0)
    fail_msg("ps_ckpt_open: %s", eb.msg);
  for (int i = 0; i < NSHARDS; i++)
    free(img[i]);
  free(pos);
}

/* A gradient of shard i's slice, different per float. */
static float *gradient(const cluster *k, int i) {
  float *g = malloc(k->layout.shard_floats[i] * sizeof(float));
  assert_non_null(g);
  for (size_t j = 0; j < k->layout.shard_floats[i]; j++)
    g[j] = 0.01f * (float)(j % 7 + 1);
  return g;
}

/* No checkpoint: the cluster's shape, version 0, the seeded values of the
 * shard's own slice (the config's seed), adagrad's slot at its initial
 * accumulator, the sync accumulator empty, one zero row per worker. */
static void test_from_nothing(void **state) {
  (void)state;
  cluster k;
  cluster_make(&k, 3, "8", "optimizer = adagrad\nconsistency = sync\n");
  for (int i = 0; i < NSHARDS; i++) {
    size_t n = k.layout.shard_floats[i];
    ps_shard_opts so = ps_shard_opts_for(&k.cfg, &k.layout, i);
    ps_state_info shape = ps_shard_state_shape(&so), in;
    float *img = NULL;
    ps_errbuf eb = {0};
    assert_int_equal(ps_plan_shard_image(&k.cfg, &k.layout, &k.model, NULL, i, &img, &in, &eb), 0);
    assert_int_equal(in.image_floats, shape.image_floats);
    assert_int_equal(in.accum_count, 0);
    assert_int_equal(in.global_step, 0);
    assert_int_equal(in.version, 0);
    assert_int_equal(in.nslots, 1);
    assert_int_equal(in.has_accum, 1);
    assert_int_equal(in.nonce, 3);
    assert_int_equal(in.target, 3);

    float *seeded = malloc(n * sizeof(float)), *other = malloc(n * sizeof(float));
    assert_non_null(seeded);
    assert_non_null(other);
    ps_layout_init_slice(&k.layout, &k.model.vars, i, 5, seeded);
    ps_layout_init_slice(&k.layout, &k.model.vars, i, 6, other);
    assert_memory_equal(ps_state_segment(img, n, 0), seeded, n * sizeof(float));
    assert_memory_not_equal(seeded, other, n * sizeof(float));
    for (size_t j = 0; j < n; j++) {
      assert_true(ps_state_segment(img, n, 1)[j] == so.optim.initial_accumulator);
      assert_true(ps_state_segment(img, n, 2)[j] == 0.0f);
    }
    for (uint32_t w = 0; w < in.nonce; w++) {
      ps_once row = ps_state_once_get(&in, n, img, w);
      assert_int_equal(row.incarnation, 0);
      assert_int_equal(row.last_seq, 0);
    }
    free(seeded);
    free(other);
    free(img);
  }
  cluster_close(&k);
}

/* The checkpoint's shards: sync, adam, 3 workers.  Step 0 gets two
 * gradients and is applied without the third (target 2 from then on);
 * step 1 has one gradient summed (accum_count 1).  Each worker its own
 * incarnation and sequence. */
static void sync_shards(const cluster *k, ps_shard **sh) {
  for (int i = 0; i < NSHARDS; i++) {
    ps_shard_opts so = ps_shard_opts_for(&k->cfg, &k->layout, i);
    sh[i] = ps_shard_new(&so, NULL);
    assert_non_null(sh[i]);
    float *g = gradient(k, i);
    assert_int_equal(ps_shard_push(sh[i], 0, 100, 4, 0, g, NULL, 0, NULL), PS_SHARD_APPLIED);
    assert_int_equal(ps_shard_push(sh[i], 1, 200, 6, 0, g, NULL, 0, NULL), PS_SHARD_APPLIED);
    assert_int_equal(ps_shard_sync_flush(sh[i], &(ps_journal){0}), 1);
    assert_int_equal(ps_shard_push(sh[i], 2, 300, 9, 1, g, NULL, 0, NULL), PS_SHARD_APPLIED);
    free(g);
    ps_state_info in = ps_shard_state_info(sh[i]);
    assert_int_equal(in.version, 1);
    assert_int_equal(in.accum_count, 1);
    assert_int_equal(in.target, 2);
    assert_int_equal(ps_shard_worker_incarnation(sh[i], 2), 300);
  }
}

/* Restored into a cluster of `nworkers` (2: one fewer, 4: one more):
 * everything but the rows is the checkpoint's image; the rows of workers
 * both have are carried, others dropped or zero. */
static void check_restore(const ps_ckpt *c, ps_shard *const *sh, int nworkers) {
  cluster k;
  cluster_make(&k, nworkers, "8", "consistency = sync\n");
  for (int i = 0; i < NSHARDS; i++) {
    size_t n = k.layout.shard_floats[i];
    ps_state_info want = ps_shard_state_info(sh[i]), in;
    float *img = NULL, *src = malloc(want.image_floats * sizeof(float));
    assert_non_null(src);
    ps_shard_state_write(sh[i], src);
    ps_errbuf eb = {0};
    int rc = ps_plan_shard_image(&k.cfg, &k.layout, &k.model, c, i, &img, &in, &eb);
    if (rc != 0)
      fail_msg("shard %d into %d workers: %s", i, nworkers, eb.msg);
    assert_int_equal(in.version, want.version);
    assert_int_equal(in.global_step, want.global_step);
    assert_int_equal(in.accum_count, 1);
    assert_int_equal(in.target, 2);
    assert_int_equal(in.nslots, 2);
    assert_int_equal(in.has_accum, 1);
    assert_int_equal(in.nonce, (uint32_t)nworkers);
    assert_int_equal(in.image_floats, ps_state_floats(n, 2, 1, (uint32_t)nworkers));
    /* values, both adam slots, the accumulator */
    assert_memory_equal(img, src, n * 4 * sizeof(float));
    for (uint32_t w = 0; w < (uint32_t)nworkers; w++) {
      ps_once got = ps_state_once_get(&in, n, img, w);
      ps_once exp = w < want.nonce ? ps_state_once_get(&want, n, src, w) : (ps_once){0};
      assert_int_equal(got.incarnation, exp.incarnation);
      assert_int_equal(got.last_seq, exp.last_seq);
    }
    free(src);
    free(img);
  }
  cluster_close(&k);
}

static void test_from_checkpoint(void **state) {
  (void)state;
  cluster k;
  cluster_make(&k, 3, "8", "consistency = sync\n");
  ps_shard *sh[NSHARDS];
  sync_shards(&k, sh);
  ps_ckpt c;
  write_and_open(&k, sh, 10, &c);
  check_restore(&c, sh, 2);
  check_restore(&c, sh, 4);
  ps_ckpt_close(&c);
  for (int i = 0; i < NSHARDS; i++)
    ps_shard_free(sh[i]);
  cluster_close(&k);
}

/* An image from checkpoint c for a cluster from `train` is refused with
 * PS_ELAYOUT, the message holding each of `words`; *img stays NULL. */
static void refused(const ps_ckpt *c, const char *hidden, const char *train, const char *const *words) {
  cluster k;
  cluster_make(&k, 2, hidden, train);
  float *img = (float *)&k;  /* must become NULL */
  ps_state_info in;
  ps_errbuf eb = {0};
  assert_int_equal(ps_plan_shard_image(&k.cfg, &k.layout, &k.model, c, 1, &img, &in, &eb),
                   PS_ELAYOUT);
  assert_null(img);
  for (; *words != NULL; words++)
    if (strstr(eb.msg, *words) == NULL)
      fail_msg("expected '%s' in: %s", *words, eb.msg);
  cluster_close(&k);
}

/* A checkpoint of adam (2 slots) without an accumulator (async) does not
 * become the state of an sgd cluster (0 slots), nor of a sync one (an
 * accumulator), nor of another model's slice. */
static void test_other_layout_refused(void **state) {
  (void)state;
  cluster k;
  cluster_make(&k, 2, "8", "optimizer = adam\n");
  ps_shard *sh[NSHARDS];
  for (int i = 0; i < NSHARDS; i++) {
    ps_shard_opts so = ps_shard_opts_for(&k.cfg, &k.layout, i);
    sh[i] = ps_shard_new(&so, NULL);
    assert_non_null(sh[i]);
  }
  ps_ckpt c;
  write_and_open(&k, sh, 20, &c);
  refused(&c, "8", "optimizer = sgd\n",
          (const char *const[]){"ckpt-000000020", "shard 1 has 2 optimizer slots and no accumulator",
                                "optimizer sgd", "needs 0 and none", NULL});
  refused(&c, "8", "optimizer = adam\nconsistency = sync\n",
          (const char *const[]){"2 optimizer slots and no accumulator", "in sync mode",
                                "needs 2 and one", NULL});
  char floats[64];
  snprintf(floats, sizeof floats, "shard 1 holds %zu floats", k.layout.shard_floats[1]);
  refused(&c, "16", "optimizer = adam\n", (const char *const[]){floats, "this cluster's", NULL});
  ps_ckpt_close(&c);
  for (int i = 0; i < NSHARDS; i++)
    ps_shard_free(sh[i]);
  cluster_close(&k);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_from_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_from_checkpoint, setup, teardown),
      cmocka_unit_test_setup_teardown(test_other_layout_refused, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
