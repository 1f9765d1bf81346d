/* A checkpoint's sparse tables: shards with tables (ps_shard, pushes of
 * KV blocks split by the hash ring) written through ps_ckpt_write; `ckpt
 * verify`'s check of each shard file's table section (ps_ckpt_verify_tables)
 * and its refusals, each one line naming the checkpoint, the shard file, the
 * table and the entry; and the npy export of the tables, read back by
 * numpy. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/endian.h"
#include "common/log.h"
#include "layout/hashring.h"
#include "layout/layout.h"
#include "nn/model.h"
#include "nn/modelfile.h"
#include "ps/shard.h"
#include "ps/tsec.h"
#include "recovery/checkpoint.h"
#include "recovery/export.h"
#include "worker/sparse_split.h"

/* Three tables: C1 and C2 (dim 4, adagrad: 1 slot, a key admitted on its
 * second push, so some keys stay pending) and D3 (dim 2, adam: 2 slots). */
static const char MODEL[] =
    "{\"input\": [2], \"layers\": ["
    "{\"type\": \"dense\", \"name\": \"bot\", \"out\": 3}, {\"type\": \"relu\"},"
    "{\"type\": \"embedding_bag\", \"name\": \"C\", \"fields\": [1, 2], \"dim\": 4,"
    " \"init\": \"normal\", \"scale\": 0.1, \"optimizer\": \"adagrad\", \"lr\": 0.05,"
    " \"admit_after\": 2},"
    "{\"type\": \"embedding_bag\", \"name\": \"D\", \"field\": 3, \"dim\": 2,"
    " \"optimizer\": \"adam\", \"lr\": 0.01},"
    "{\"type\": \"dense\", \"name\": \"out\", \"out\": 1}, {\"type\": \"sigmoid\"}]}";
#define NT 3
#define MAXK 24
#define STEPS 20

typedef struct fx {
  ps_model model;
  ps_config cfg;
  char root[64];
} fx;

static int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  ps_model_spec spec;
  ps_errbuf eb = {0};
  if (f == NULL || ps_modelfile_parse(MODEL, strlen(MODEL), "MODEL", &spec, &eb) != 0 ||
      ps_model_build(&spec, &f->model, &eb) != 0) {
    fprintf(stderr, "setup: %s\n", eb.msg);
    return -1;
  }
  if (f->model.ntables != NT)
    return -1;
  f->cfg.consistency = PS_CONSISTENCY_ASYNC;
  f->cfg.seed = 7;
  f->cfg.lr = 0.1;
  snprintf(f->cfg.path, sizeof f->cfg.path, "test.conf");
  snprintf(f->root, sizeof f->root, "/tmp/test_ckpt_tables.XXXXXX");
  if (mkdtemp(f->root) == NULL)
    return -1;
  ps_log_init("test", PS_LOG_ERROR);
  *state = f;
  return 0;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int teardown(void **state) {
  fx *f = *state;
  int rc = sh("rm -rf '%s'", f->root);
  ps_model_close(&f->model);
  free(f);
  return rc == 0 ? 0 : -1;
}

/* A cluster of n shards of the model, its layout and its ring. */
typedef struct cluster {
  int n;
  ps_layout layout;
  ps_hashring ring;
  ps_shard *shards[2];
  char desc[128];
} cluster;

static void cluster_new(fx *f, cluster *c, int n) {
  memset(c, 0, sizeof *c);
  c->n = n;
  ps_errbuf eb = {0};
  ps_model_spec_format(&f->model.spec, c->desc, sizeof c->desc);
  assert_int_equal(ps_layout_build(&f->model.vars, c->desc, n, PS_LAYOUT_GREEDY, SIZE_MAX,
                                   &c->layout, &eb), 0);
  assert_int_equal(ps_hashring_init(&c->ring, n, PS_HASHRING_VNODES), 0);
  for (int i = 0; i < n; i++) {
    ps_shard_opts o = {.index = i, .nworkers = 1, .nfloats = c->layout.shard_floats[i],
                       .consistency = PS_CONSISTENCY_ASYNC, .replicas_to_aggregate = 1,
                       .optim = ps_optim_default(PS_OPTIM_ADAM, 0.01f)};
    if (ps_shard_opts_tables(&o, &f->cfg, &f->model, &eb) != 0)
      fail_msg("%s", eb.msg);
    assert_non_null(c->shards[i] = ps_shard_new(&o, NULL));
  }
}

static void cluster_free(cluster *c) {
  for (int i = 0; i < c->n; i++)
    ps_shard_free(c->shards[i]);
  ps_hashring_free(&c->ring);
  ps_layout_close(&c->layout);
}

/* STEPS pushes of rows: each table's keys from a pool of 40 (some repeat,
 * some are new) and one key of the step alone, split by the ring, each shard pushed its part. */
static void train(fx *f, cluster *c) {
  ps_sparse_part part[2] = {{0}}, *parts[2] = {&part[0], &part[1]};
  float *g = calloc(f->model.vars.total + 1, sizeof(float));
  for (int k = 0; k < STEPS; k++) {
    uint64_t keys[NT][MAXK];
    float grads[NT][MAXK * 4];
    ps_sparse_batch b = {.ntables = NT};
    for (int t = 0; t < NT; t++) {
      size_t n = 0;
      for (uint64_t key = 1; key <= 40 && n < MAXK - 1; key++)
        if ((key * 2654435761u + (uint64_t)k * 40503u + (uint64_t)t * 7u) % 5 < 2)
          keys[t][n++] = key * 1000003u + (uint64_t)t;
      /* A key of this step alone: in C1 and C2 it stays pending. */
      keys[t][n++] = (uint64_t)(100 + k) * 1000003u + (uint64_t)t;
      b.dims[t] = (uint32_t)f->model.tables[t].dim;
      for (size_t i = 0; i < n * b.dims[t]; i++)
        grads[t][i] = (float)((int)((i * 3 + (size_t)k * 5 + (size_t)t) % 9) - 4) / 8.0f;
      b.keys[t] = keys[t];
      b.n[t] = n;
      b.grads[t] = grads[t];
    }
    assert_int_equal(ps_sparse_split(&c->ring, &b, PS_SPARSE_KV, parts), 0);
    for (int i = 0; i < c->n; i++)
      assert_int_equal(ps_shard_push(c->shards[i], 0, 1, (uint64_t)k + 1, (uint64_t)k, g,
                                     part[i].bytes, part[i].len, NULL),
                       PS_SHARD_APPLIED);
  }
  for (int i = 0; i < 2; i++)
    ps_sparse_part_free(&part[i]);
  free(g);
}

/* Each shard's state image, as the chief's cut gives it. */
typedef struct images {
  float *img[2];
  ps_ckpt_shard_state st[2];
} images;

static void images_of(const cluster *c, images *im) {
  for (int i = 0; i < c->n; i++) {
    ps_state_info in = ps_shard_state_info(c->shards[i]);
    /* Room for one more float: a test may make the section longer. */
    im->img[i] = calloc((size_t)in.image_floats + 1, sizeof(float));
    assert_non_null(im->img[i]);
    ps_shard_state_write(c->shards[i], im->img[i]);
    im->st[i] = (ps_ckpt_shard_state){.nfloats = c->layout.shard_floats[i], .info = in,
                                      .img = im->img[i]};
  }
}

static void images_free(const cluster *c, images *im) {
  for (int i = 0; i < c->n; i++)
    free(im->img[i]);
}

/* Shard i's table section in its image. */
static uint8_t *section(const cluster *c, images *im, int i) {
  return (uint8_t *)(im->img[i] + ps_state_tables_at(&im->st[i].info, c->layout.shard_floats[i]));
}

/* The section's length changed by `floats` (negative: cut short). */
static void resize_section(images *im, int i, int64_t floats) {
  im->st[i].info.table_floats = (uint64_t)((int64_t)im->st[i].info.table_floats + floats);
  im->st[i].info.image_floats = (uint64_t)((int64_t)im->st[i].info.image_floats + floats);
}

/* Where table t starts in shard i's section, and its row size. */
static uint64_t table_at(fx *f, const cluster *c, int i, int t) {
  uint64_t at = 0;
  for (int u = 0; u < t; u++) {
    ps_table_stats st = ps_shard_table_stats(c->shards[i], u);
    ps_tsec_table d = {(uint32_t)f->model.tables[u].dim,
                       (uint32_t)ps_optim_nslots(f->model.tables[u].optim.kind), NULL};
    at += PS_TSEC_HEAD + st.rows * ps_tsec_row_bytes(&d) + st.pending * PS_TSEC_ENTRY;
  }
  return at;
}

static uint64_t row_bytes(fx *f, int t) {
  ps_tsec_table d = {(uint32_t)f->model.tables[t].dim,
                     (uint32_t)ps_optim_nslots(f->model.tables[t].optim.kind), NULL};
  return ps_tsec_row_bytes(&d);
}

/* Write checkpoint 100 of the images into dir/name; its path into out. */
static void write_ckpt(fx *f, const cluster *c, images *im, const char *name, char *out,
                       size_t cap) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/%s", f->root, name);
  ps_data_pos pos = {0, 0};
  ps_ckpt_write_opts o = {
      .step = 100, .cluster_id = "test", .model = c->desc, .vars = &f->model.vars,
      .layout = &c->layout, .optim = ps_optim_default(PS_OPTIM_ADAM, 0.01f),
      .consistency = PS_CONSISTENCY_ASYNC, .filter = PS_CKPT_FILTER_SHUFFLE, .shards = im->st,
      .nworkers = 1, .data_pos = &pos, .global_step = 100, .network = &f->model.spec};
  ps_errbuf eb = {0};
  if (ps_ckpt_write(dir, &o, NULL, &eb) != 0)
    fail_msg("ps_ckpt_write(%s): %s", dir, eb.msg);
  snprintf(out, cap, "%s/ckpt-000000100", dir);
}

/* ------------------------------------------------------------------ */

/* A sound checkpoint verifies, and the counts are the shards' tables'. */
static void test_verify_ok(void **state) {
  fx *f = *state;
  cluster c;
  cluster_new(f, &c, 2);
  train(f, &c);
  images im;
  images_of(&c, &im);
  char path[512];
  write_ckpt(f, &c, &im, "ok", path, sizeof path);
  uint64_t rows = 0, pending = 0;
  for (int i = 0; i < 2; i++)
    for (int t = 0; t < NT; t++) {
      ps_table_stats st = ps_shard_table_stats(c.shards[i], t);
      assert_true(st.rows > 0);
      rows += st.rows;
      pending += st.pending;
    }
  assert_true(pending > 0);  /* the test reaches pending keys */
  ps_ckpt ck;
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_open(&ck, path, &eb), 0);
  ps_ckpt_tables_stats ts;
  if (ps_ckpt_verify_tables(&ck, &ts, &eb) != 0)
    fail_msg("%s", eb.msg);
  assert_int_equal(ts.ntables, NT);
  assert_int_equal(ts.rows, rows);
  assert_int_equal(ts.pending, pending);
  ps_ckpt_close(&ck);
  images_free(&c, &im);
  cluster_free(&c);
}

/* A damaged section, written through the writer (whose XXH64 then covers
 * the damage): the file checks pass, the table check refuses it with one
 * line holding `want`; a shard refuses to load it when `load` says so. */
static void expect_refusal(fx *f, const cluster *c, images *im, const char *name,
                           const char *want, int load) {
  char path[512], full[1024];
  write_ckpt(f, c, im, name, path, sizeof path);
  ps_ckpt ck;
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_open(&ck, path, &eb), 0);
  if (ps_ckpt_verify(&ck, &eb) != 0)
    fail_msg("%s: the files' checks: %s", name, eb.msg);
  assert_int_equal(ps_ckpt_verify_tables(&ck, NULL, &eb), PS_ECORRUPT);
  snprintf(full, sizeof full, "%s/shard-0.lz4: %s", path, want);
  if (strstr(eb.msg, full) == NULL)
    fail_msg("%s: '%s', expected it to hold '%s'", name, eb.msg, full);
  assert_null(strchr(eb.msg, '\n'));
  ps_ckpt_close(&ck);
  if (load) {
    ps_shard *s = ps_shard_new(ps_shard_options(c->shards[0]), NULL);
    assert_int_equal(ps_shard_state_load(s, &im->st[0].info, im->img[0], &eb), PS_ECORRUPT);
    ps_shard_free(s);
  }
}

static void test_verify_refusals(void **state) {
  fx *f = *state;
  cluster c;
  cluster_new(f, &c, 2);
  train(f, &c);
  char want[512];
  uint64_t t2 = table_at(f, &c, 0, 2), t1 = table_at(f, &c, 0, 1);
  ps_table_stats s1 = ps_shard_table_stats(c.shards[0], 1);
  ps_table_stats s2 = ps_shard_table_stats(c.shards[0], 2);
  images im;

  /* Cut short inside the last table's head. */
  images_of(&c, &im);
  uint64_t all = im.st[0].info.table_floats * 4;
  resize_section(&im, 0, -(int64_t)((all - t2 - 8) / 4));
  expect_refusal(f, &c, &im, "head", "sparse table 2 (D3): the table section ends 8 bytes "
                 "into its head, expected 16 bytes (rows, pending keys)", 1);
  images_free(&c, &im);

  /* Cut short by one float: the last table's rows no longer fit. */
  images_of(&c, &im);
  resize_section(&im, 0, -1);
  snprintf(want, sizeof want, "sparse table 2 (D3): %" PRIu64 " rows of %" PRIu64 " bytes (dim "
           "2, 2 slots) and 0 pending keys of 24 do not fit the %" PRIu64 " bytes left of the "
           "table section", s2.rows, row_bytes(f, 2), all - t2 - 16 - 4);
  expect_refusal(f, &c, &im, "short", want, 1);
  images_free(&c, &im);

  /* A count of rows that does not fit: table 1 claims 1000 more. */
  images_of(&c, &im);
  ps_put_le64(section(&c, &im, 0) + t1, s1.rows + 1000);
  snprintf(want, sizeof want, "sparse table 1 (C2): %" PRIu64 " rows of %" PRIu64 " bytes (dim "
           "4, 1 slot) and %" PRIu64 " pending keys of 24 do not fit the %" PRIu64 " bytes left "
           "of the table section", s1.rows + 1000, row_bytes(f, 1), s1.pending, all - t1 - 16);
  expect_refusal(f, &c, &im, "count", want, 1);
  images_free(&c, &im);

  /* Bytes past the last table. */
  images_of(&c, &im);
  resize_section(&im, 0, 1);
  expect_refusal(f, &c, &im, "past", "the table section has 4 bytes past its 3 tables, "
                 "expected none", 1);
  images_free(&c, &im);

  /* A duplicate key: table 0's entry 1 takes entry 0's key. */
  images_of(&c, &im);
  uint8_t *sec = section(&c, &im, 0);
  uint64_t key0 = ps_get_le64(sec + PS_TSEC_HEAD);
  ps_put_le64(sec + PS_TSEC_HEAD + row_bytes(f, 0), key0);
  snprintf(want, sizeof want, "sparse table 0 (C1), entry 1: key %" PRIu64 " again (entry 0 "
           "holds it too): expected each key once in a table", key0);
  expect_refusal(f, &c, &im, "duplicate", want, 1);
  images_free(&c, &im);

  /* A key on the wrong shard: table 1's first pending key becomes one
   * that shard 1 owns (and no table holds). */
  images_of(&c, &im);
  sec = section(&c, &im, 0);
  assert_true(s1.pending > 0);
  uint64_t at = t1 + PS_TSEC_HEAD + s1.rows * row_bytes(f, 1), other = 1ull << 60;
  while (ps_hashring_owner(&c.ring, 1, other) != 1)
    other++;
  ps_put_le64(sec + at, other);
  snprintf(want, sizeof want, "sparse table 1 (C2), entry %" PRIu64 ": key %" PRIu64 " is shard "
           "1's by the hash ring of 2 shards, expected shard 0's (this file's)", s1.rows, other);
  expect_refusal(f, &c, &im, "owner", want, 0);
  images_free(&c, &im);

  cluster_free(&c);
}

/* A checkpoint of a model without tables whose file holds a section. */
static void test_verify_section_without_tables(void **state) {
  fx *f = *state;
  cluster c;
  cluster_new(f, &c, 1);
  images im;
  images_of(&c, &im);
  char dir[256], path[512];
  snprintf(dir, sizeof dir, "%s/notables", f->root);
  ps_data_pos pos = {0, 0};
  ps_ckpt_write_opts o = {
      .step = 100, .cluster_id = "test", .model = c.desc, .vars = &f->model.vars,
      .layout = &c.layout, .optim = ps_optim_default(PS_OPTIM_ADAM, 0.01f),
      .shards = im.st, .nworkers = 1, .data_pos = &pos, .global_step = 100};
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_write(dir, &o, NULL, &eb), 0);
  snprintf(path, sizeof path, "%s/ckpt-000000100", dir);
  ps_ckpt ck;
  assert_int_equal(ps_ckpt_open(&ck, path, &eb), 0);
  assert_int_equal(ps_ckpt_verify_tables(&ck, NULL, &eb), PS_ECORRUPT);
  assert_non_null(strstr(eb.msg, "shard-0.lz4 holds a table section of 48 bytes, but the "
                                 "manifest's network is null"));
  ps_ckpt_close(&ck);
  images_free(&c, &im);
  cluster_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_verify_ok),
      cmocka_unit_test(test_verify_refusals),
      cmocka_unit_test(test_verify_section_without_tables),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
