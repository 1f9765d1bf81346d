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
#include "recovery/relayout.h"
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
  const ps_model *m;
  int n;
  ps_layout layout;
  ps_hashring ring;
  ps_shard *shards[4];
  char desc[128];
} cluster;

/* Shard i's options in a cluster of the model laid out as l. */
static ps_shard_opts opts_of(fx *f, const ps_model *m, const ps_layout *l, int i) {
  ps_shard_opts o = {.index = i, .nworkers = 1, .nfloats = l->shard_floats[i],
                     .consistency = PS_CONSISTENCY_ASYNC, .replicas_to_aggregate = 1,
                     .optim = ps_optim_default(PS_OPTIM_ADAM, 0.01f)};
  ps_shard_opts_tables(&o, &f->cfg, m);
  return o;
}

static void cluster_of(fx *f, const ps_model *m, cluster *c, int n) {
  memset(c, 0, sizeof *c);
  c->m = m;
  c->n = n;
  ps_errbuf eb = {0};
  ps_model_spec_format(&m->spec, c->desc, sizeof c->desc);
  assert_int_equal(ps_layout_build(&m->vars, c->desc, n, PS_LAYOUT_GREEDY, SIZE_MAX,
                                   &c->layout, &eb), 0);
  assert_int_equal(ps_hashring_init(&c->ring, n, PS_HASHRING_VNODES), 0);
  for (int i = 0; i < n; i++) {
    ps_shard_opts o = opts_of(f, m, &c->layout, i);
    assert_non_null(c->shards[i] = ps_shard_new(&o, NULL));
  }
}

/* A cluster of n shards of the fixture's model. */
static void cluster_new(fx *f, cluster *c, int n) { cluster_of(f, &f->model, c, n); }

static void cluster_free(cluster *c) {
  for (int i = 0; i < c->n; i++)
    ps_shard_free(c->shards[i]);
  ps_hashring_free(&c->ring);
  ps_layout_close(&c->layout);
}

/* STEPS pushes of rows: each table's keys from a pool of 40 (some repeat,
 * some are new) and one key of the step alone, split by the ring, each shard pushed its part. */
static void train_steps(fx *f, cluster *c, int k0, int k1) {
  ps_sparse_part part[2] = {{0}}, *parts[2] = {&part[0], &part[1]};
  float *g = calloc(f->model.vars.total + 1, sizeof(float));
  for (int k = k0; k < k1; k++) {
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

static void train(fx *f, cluster *c) { train_steps(f, c, 0, STEPS); }

/* Each shard's state image, as the chief's cut gives it. */
typedef struct images {
  float *img[4];
  ps_ckpt_shard_state st[4];
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

/* What a checkpoint of c's images at `step` is written with (pos: the one
 * worker's data position, kept by the caller). */
static ps_ckpt_write_opts opts_at(const cluster *c, images *im, uint64_t step,
                                  ps_ckpt_filter filter, const ps_data_pos *pos) {
  return (ps_ckpt_write_opts){
      .step = step, .cluster_id = "test", .model = c->desc, .vars = &c->m->vars,
      .layout = &c->layout, .optim = ps_optim_default(PS_OPTIM_ADAM, 0.01f),
      .consistency = PS_CONSISTENCY_ASYNC, .filter = filter, .shards = im->st, .nworkers = 1,
      .data_pos = pos, .global_step = step, .network = &c->m->spec};
}

/* Write checkpoint 100 of the images into dir/name; its path into out. */
static void write_ckpt(fx *f, const cluster *c, images *im, const char *name, char *out,
                       size_t cap) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/%s", f->root, name);
  ps_data_pos pos = {0, 0};
  ps_ckpt_write_opts o = opts_at(c, im, 100, PS_CKPT_FILTER_SHUFFLE, &pos);
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

/* ------------------------------------------------------------------ */

/* Each table's rows from the live shards, by key: what the export must
 * hold, into dir/expect/<table>.{keys,values,slots,pending}.raw, and the
 * tables' names, dims and slots into dir/expect/list.txt. */
static void write_expected(fx *f, const cluster *c, const char *dir) {
  char path[600];
  snprintf(path, sizeof path, "%s/expect", dir);
  assert_int_equal(sh("mkdir -p '%s'", path), 0);
  snprintf(path, sizeof path, "%s/expect/list.txt", dir);
  FILE *list = fopen(path, "w");
  assert_non_null(list);
  for (int t = 0; t < NT; t++) {
    size_t dim = (size_t)f->model.tables[t].dim;
    size_t ns = (size_t)ps_optim_nslots(f->model.tables[t].optim.kind);
    fprintf(list, "%s %zu %zu\n", f->model.tables[t].name, dim, ns);
    /* Every row and pending key of every shard; sorted below. */
    size_t n = 0, np = 0, cap = 4096;
    uint64_t *keys = malloc(cap * 8), *pend = malloc(cap * 8);
    float *vals = malloc(cap * dim * 4), *slots = malloc(cap * (ns ? ns : 1) * dim * 4);
    for (int i = 0; i < c->n; i++) {
      const ps_table *tb = ps_shard_table(c->shards[i], t);
      ps_table_iter it;
      ps_table_entry e;
      ps_table_iter_init(tb, &it);
      while (ps_table_iter_next(tb, &it, &e)) {
        assert_true(n < cap && np < cap);
        if (e.pending) {
          pend[np++] = e.key;
          continue;
        }
        keys[n] = e.key;
        memcpy(vals + n * dim, e.values, dim * 4);
        for (size_t k = 0; k < ns; k++)
          memcpy(slots + (n * ns + k) * dim, e.slots[k], dim * 4);
        n++;
      }
    }
    /* Selection sort by key: a few hundred rows. */
    for (size_t a = 0; a < n; a++) {
      size_t m = a;
      for (size_t b = a + 1; b < n; b++)
        if (keys[b] < keys[m])
          m = b;
      if (m == a)
        continue;
      uint64_t k = keys[a];
      keys[a] = keys[m];
      keys[m] = k;
      float tmp[64];
      memcpy(tmp, vals + a * dim, dim * 4);
      memcpy(vals + a * dim, vals + m * dim, dim * 4);
      memcpy(vals + m * dim, tmp, dim * 4);
      memcpy(tmp, slots + a * ns * dim, ns * dim * 4);
      memcpy(slots + a * ns * dim, slots + m * ns * dim, ns * dim * 4);
      memcpy(slots + m * ns * dim, tmp, ns * dim * 4);
    }
    static const char *const ext[] = {"keys", "values", "slots", "pending"};
    const void *data[] = {keys, vals, slots, pend};
    size_t len[] = {n * 8, n * dim * 4, n * ns * dim * 4, np * 8};
    for (int x = 0; x < 4; x++) {
      snprintf(path, sizeof path, "%s/expect/%s.%s.raw", dir, f->model.tables[t].name, ext[x]);
      FILE *fp = fopen(path, "wb");
      assert_non_null(fp);
      assert_int_equal(fwrite(data[x], 1, len[x], fp), len[x]);
      assert_int_equal(fclose(fp), 0);
    }
    free(keys);
    free(pend);
    free(vals);
    free(slots);
  }
  fclose(list);
}

static const char *const py_check =
    "import os, struct, sys\n"
    "import numpy as np\n"
    "d = sys.argv[1]\n"
    "for line in open(d + '/expect/list.txt'):\n"
    "    name, dim, ns = line.split()\n"
    "    dim, ns = int(dim), int(ns)\n"
    "    raw = lambda x, t: np.fromfile('%s/expect/%s.%s.raw' % (d, name, x), dtype=t)\n"
    "    for out in ('npy2', 'npy1'):\n"
    "        p = '%s/%s/%s.' % (d, out, name)\n"
    "        head = open(p + 'keys.npy', 'rb').read(10)\n"
    "        assert head[:8] == b'\\x93NUMPY\\x01\\x00' and (10 + struct.unpack('<H', head[8:])[0]) % 64 == 0\n"
    "        keys = np.load(p + 'keys.npy')\n"
    "        vals = np.load(p + 'values.npy')\n"
    "        assert keys.dtype == np.uint64 and keys.ndim == 1, (keys.dtype, keys.shape)\n"
    "        n = len(keys)\n"
    "        assert n > 0 and np.all(keys[1:] > keys[:-1]), 'keys not strictly ascending'\n"
    "        assert vals.dtype == np.float32 and vals.shape == (n, dim), (vals.dtype, vals.shape)\n"
    "        assert keys.tobytes() == raw('keys', '<u8').tobytes(), (out, name, 'keys')\n"
    "        assert vals.tobytes() == raw('values', '<f4').tobytes(), (out, name, 'values')\n"
    "        assert not np.isin(raw('pending', '<u8'), keys).any(), (out, name, 'a pending key exported')\n"
    "        if ns == 0:\n"
    "            assert not os.path.exists(p + 'slots.npy'), (out, name, 'slots of sgd')\n"
    "        else:\n"
    "            slots = np.load(p + 'slots.npy')\n"
    "            assert slots.dtype == np.float32 and slots.shape == (n, ns, dim), slots.shape\n"
    "            assert slots.tobytes() == raw('slots', '<f4').tobytes(), (out, name, 'slots')\n"
    "    for x in ('keys', 'values', 'slots'):\n"
    "        f = '/%s.%s.npy' % (name, x)\n"
    "        if os.path.exists(d + '/npy1' + f):\n"
    "            assert open(d + '/npy1' + f, 'rb').read() == open(d + '/npy2' + f, 'rb').read(), f\n"
    "    print('numpy: %s: %d rows, %d pending keys not exported' % (name, n, len(raw('pending', '<u8'))))\n";

/* The npy export writes each table's rows, all shards together, by key,
 * with their slots; pending keys are not rows.  The same rows held by 1
 * shard or by 2 export byte for byte the same. */
static void test_export(void **state) {
  fx *f = *state;
  if (sh("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
    fail_msg("no numpy for /usr/bin/python3: scripts/deps installs it (python3-numpy)");
  cluster c2, c1;
  cluster_new(f, &c2, 2);
  cluster_new(f, &c1, 1);
  train(f, &c2);
  train(f, &c1);
  images i2, i1;
  images_of(&c2, &i2);
  images_of(&c1, &i1);
  char p2[512], p1[512], dir[256], out[600], note[512];
  write_ckpt(f, &c2, &i2, "export2", p2, sizeof p2);
  write_ckpt(f, &c1, &i1, "export1", p1, sizeof p1);
  snprintf(dir, sizeof dir, "%s/export", f->root);
  assert_int_equal(sh("mkdir -p '%s'", dir), 0);
  write_expected(f, &c2, dir);
  ps_ckpt ck;
  ps_errbuf eb = {0};
  const char *const paths[2] = {p2, p1}, *const outs[2] = {"npy2", "npy1"};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(ps_ckpt_open(&ck, paths[k], &eb), 0);
    snprintf(out, sizeof out, "%s/%s", dir, outs[k]);
    if (ps_ckpt_export(&ck, "npy", out, 0, note, sizeof note, &eb) != 0)
      fail_msg("%s: %s", out, eb.msg);
    assert_non_null(strstr(note, "; 3 sparse tables, "));
    assert_non_null(strstr(note, " rows: <table>.keys.npy and <table>.values.npy, "
                                 "<table>.slots.npy"));
    ps_ckpt_close(&ck);
  }
  /* safetensors holds the variables and says the tables are not in it. */
  assert_int_equal(ps_ckpt_open(&ck, p2, &eb), 0);
  snprintf(out, sizeof out, "%s/model.safetensors", dir);
  assert_int_equal(ps_ckpt_export(&ck, "safetensors", out, 0, note, sizeof note, &eb), 0);
  assert_non_null(strstr(note, "; not its 3 sparse tables (--format npy writes them)"));
  ps_ckpt_close(&ck);
  snprintf(out, sizeof out, "%s/check.py", dir);
  FILE *fp = fopen(out, "w");
  assert_non_null(fp);
  fputs(py_check, fp);
  fclose(fp);
  assert_int_equal(sh("/usr/bin/python3 '%s' '%s'", out, dir), 0);
  images_free(&c2, &i2);
  images_free(&c1, &i1);
  cluster_free(&c2);
  cluster_free(&c1);
}

/* Segment k (0 values, 1.. the slots) of every shard put back into the
 * whole variables. */
static float *whole(fx *f, const cluster *c, images *im, uint32_t k) {
  float *a = calloc(f->model.vars.total + 1, sizeof(float));
  assert_non_null(a);
  for (int i = 0; i < c->n; i++)
    ps_layout_scatter(&c->layout, &f->model.vars, i,
                      ps_state_segment(im->img[i], c->layout.shard_floats[i], k), a);
  return a;
}

/* A checkpoint of 2 shards restored into 3 and into 1 (relayout.h): the
 * dense values and optimizer slots are the same variables; every row and
 * pending key is on the shard the new ring gives it, with the same count,
 * stamp, values and slots, none lost or added; each shard's lists stay in
 * stamp order; the version and global step are the largest of the cut's.
 * Other variables, and a sync step open at the cut, are refused. */
static void test_relayout(void **state) {
  fx *f = *state;
  cluster c2;
  cluster_new(f, &c2, 2);
  train(f, &c2);
  images i2;
  images_of(&c2, &i2);
  char path[512];
  write_ckpt(f, &c2, &i2, "relayout", path, sizeof path);
  ps_ckpt ck;
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_open(&ck, path, &eb), 0);
  uint32_t nslots = i2.st[0].info.nslots;
  const int to[2] = {3, 1};
  for (int r = 0; r < 2; r++) {
    cluster cm;
    cluster_new(f, &cm, to[r]);
    ps_relayout *rl = NULL;
    ps_relayout_stats st;
    if (ps_relayout_open(&ck, &f->model.vars, &cm.layout, &rl, &st, &eb) != 0)
      fail_msg("ps_relayout_open into %d: %s", to[r], eb.msg);
    for (int i = 0; i < cm.n; i++) {
      ps_shard_opts so = opts_of(f, &f->model, &cm.layout, i);
      float *img = NULL;
      ps_state_info in;
      if (ps_relayout_image(rl, &so, &img, &in, &eb) != 0 ||
          ps_shard_state_load(cm.shards[i], &in, img, &eb) != 0)
        fail_msg("shard %d of %d: %s", i, to[r], eb.msg);
      assert_int_equal(in.version, STEPS);
      free(img);
    }
    ps_relayout_close(rl);
    images im;
    images_of(&cm, &im);
    for (uint32_t k = 0; k <= nslots; k++) {
      float *a = whole(f, &c2, &i2, k), *b = whole(f, &cm, &im, k);
      assert_memory_equal(a, b, f->model.vars.total * sizeof(float));
      free(a);
      free(b);
    }
    uint64_t rows = 0, moved = 0, entries = 0;
    for (int t = 0; t < NT; t++) {
      size_t dim = (size_t)f->model.tables[t].dim;
      int ns = ps_optim_nslots(f->model.tables[t].optim.kind);
      for (int i = 0; i < 2; i++) {
        ps_table_iter it;
        ps_table_entry e, g;
        const ps_table *tb = ps_shard_table(c2.shards[i], t);
        ps_table_iter_init(tb, &it);
        while (ps_table_iter_next(tb, &it, &e)) {
          int j = ps_hashring_owner(&cm.ring, (uint32_t)t, e.key);
          assert_true(ps_table_get(ps_shard_table(cm.shards[j], t), e.key, &g));
          assert_int_equal(g.pending, e.pending);
          assert_int_equal(g.count, e.count);
          assert_int_equal(g.last_step, e.last_step);
          if (!e.pending) {
            assert_memory_equal(g.values, e.values, dim * sizeof(float));
            for (int q = 0; q < ns; q++)
              assert_memory_equal(g.slots[q], e.slots[q], dim * sizeof(float));
            rows++;
            moved += j != i;
          }
          entries++;
        }
      }
      for (int j = 0; j < cm.n; j++) {
        const ps_table *tb = ps_shard_table(cm.shards[j], t);
        ps_table_iter it;
        ps_table_entry e;
        uint64_t last[2] = {0, 0};
        ps_table_iter_init(tb, &it);
        while (ps_table_iter_next(tb, &it, &e)) {
          assert_true(e.last_step >= last[e.pending]);
          last[e.pending] = e.last_step;
          entries--;
        }
      }
    }
    assert_int_equal(entries, 0);  /* nothing added */
    assert_int_equal(st.rows, rows);
    assert_int_equal(st.rows_moved, moved);
    assert_true(moved > 0 && moved < rows);
    images_free(&cm, &im);
    cluster_free(&cm);
  }
  /* Refused in one line each: other variables; a sync step open at the cut. */
  cluster c3;
  cluster_new(f, &c3, 3);
  ps_relayout *rl = NULL;
  ps_vartable other = f->model.vars;
  other.n = 1;
  assert_int_equal(ps_relayout_open(&ck, &other, &c3.layout, &rl, NULL, &eb), PS_ELAYOUT);
  assert_null(rl);
  ck.shards[1].info.accum_count = 3;
  assert_int_equal(ps_relayout_open(&ck, &f->model.vars, &c3.layout, &rl, NULL, &eb),
                   PS_ELAYOUT);
  assert_non_null(strstr(eb.msg, "shard 1 holds an open sync step (3 gradients summed)"));
  assert_null(strchr(eb.msg, '\n'));
  cluster_free(&c3);
  ps_ckpt_close(&ck);
  images_free(&c2, &i2);
  cluster_free(&c2);
}

/* A model whose tables delete: C evicts past 12 rows per shard, D expires
 * rows idle for 6 steps. */
static const char MODEL_DELETES[] =
    "{\"input\": [2], \"layers\": ["
    "{\"type\": \"dense\", \"name\": \"bot\", \"out\": 3}, {\"type\": \"relu\"},"
    "{\"type\": \"embedding_bag\", \"name\": \"C\", \"fields\": [1, 2], \"dim\": 4,"
    " \"init\": \"normal\", \"scale\": 0.1, \"optimizer\": \"adagrad\", \"lr\": 0.05,"
    " \"admit_after\": 2, \"max_rows\": 12},"
    "{\"type\": \"embedding_bag\", \"name\": \"D\", \"field\": 3, \"dim\": 2,"
    " \"optimizer\": \"adam\", \"lr\": 0.01, \"idle_steps\": 6},"
    "{\"type\": \"dense\", \"name\": \"out\", \"out\": 1}, {\"type\": \"sigmoid\"}]}";

/* A chain of a full checkpoint (after 10 steps of training) and 5
 * incremental ones (ps_ckpt_chain_write, full_every 6), a step apart, each
 * step touching some of the rows, admitting, evicting and expiring others: each reads back (put together from the chain)
 * as the very state it was cut from, dense segments and table sections
 * byte for byte; each delta's changed rows are at most the full section; the seventh
 * is full again; retention keeps every checkpoint a kept one builds on;
 * a chain whose link is damaged is passed over for the newest whole one. */
static void test_incremental_chain(void **state) {
  fx *f = *state;
  ps_model m;
  ps_model_spec spec;
  ps_errbuf eb = {0};
  assert_int_equal(ps_modelfile_parse(MODEL_DELETES, strlen(MODEL_DELETES), "MODEL", &spec, &eb),
                   0);
  assert_int_equal(ps_model_build(&spec, &m, &eb), 0);
  cluster c;
  cluster_of(f, &m, &c, 2);
  ps_tsec_table tables[NT];
  for (int t = 0; t < NT; t++)
    tables[t] = (ps_tsec_table){(uint32_t)m.tables[t].dim,
                                (uint32_t)ps_optim_nslots(m.tables[t].optim.kind), NULL};
  ps_ckpt_chain *ch = NULL;
  assert_int_equal(ps_ckpt_chain_new(6, tables, NT, 0, &ch), 0);
  char dir[256];
  snprintf(dir, sizeof dir, "%s/chain", f->root);
  enum { N = 8 };
  float *want[N][2];
  size_t want_bytes[N][2];
  uint64_t deleted = 0;
  for (int j = 0; j < N; j++) {
    train_steps(f, &c, j ? 9 + j : 0, 10 + j);
    images im;
    images_of(&c, &im);
    ps_data_pos pos = {0, 0};
    ps_ckpt_write_opts o = opts_at(&c, &im, 100 + (uint64_t)j, PS_CKPT_FILTER_SHUFFLE, &pos);
    o.max_to_keep = 2;
    ps_ckpt_write_stats st;
    if (ps_ckpt_chain_write(ch, dir, &o, &st, &eb) != 0)
      fail_msg("checkpoint %d: %s", j, eb.msg);
    assert_int_equal(st.incremental, j != 0 && j != 6);
    uint64_t full_tables = 0;
    for (int i = 0; i < 2; i++) {
      /* What the shard held: its segments and table section. */
      size_t seg = (size_t)ps_state_segments(&im.st[i].info) * c.layout.shard_floats[i];
      size_t tf = (size_t)im.st[i].info.table_floats;
      want[j][i] = malloc((seg + tf) * sizeof(float));
      memcpy(want[j][i], im.img[i], seg * sizeof(float));
      memcpy(want[j][i] + seg, section(&c, &im, i), tf * sizeof(float));
      want_bytes[j][i] = (seg + tf) * sizeof(float);
      full_tables += tf * sizeof(float);
    }
    if (st.incremental) {
      assert_true(st.changed > 0 && st.changed <= st.entries);
      assert_true(st.changed_bytes <= full_tables);
      deleted += st.deleted;
    }
    images_free(&c, &im);
  }
  assert_true(deleted > 0);  /* evictions and expiries reached the deltas */
  /* Every checkpoint is still there: max_to_keep 2, but the two newest
   * (106 full, 107 on it) need none, so 100..105 went; before the full
   * one, 105 kept its whole chain. */
  char path[600];
  for (int j = 0; j < N; j++) {
    snprintf(path, sizeof path, "%s/ckpt-%09d", dir, 100 + j);
    struct stat sb;
    assert_int_equal(stat(path, &sb) == 0, j >= 6);
  }
  ps_ckpt_chain_free(ch);

  /* A second chain, all kept, read back link by link. */
  assert_int_equal(ps_ckpt_chain_new(6, tables, NT, 0, &ch), 0);
  snprintf(dir, sizeof dir, "%s/chain2", f->root);
  cluster c2;
  cluster_of(f, &m, &c2, 2);
  for (int j = 0; j < 6; j++) {
    train_steps(f, &c2, j ? 9 + j : 0, 10 + j);
    images im;
    images_of(&c2, &im);
    ps_data_pos pos = {0, 0};
    ps_ckpt_write_opts o = opts_at(&c2, &im, 100 + (uint64_t)j, PS_CKPT_FILTER_NONE, &pos);
    assert_int_equal(ps_ckpt_chain_write(ch, dir, &o, NULL, &eb), 0);
    images_free(&c2, &im);
  }
  ps_ckpt_chain_free(ch);
  for (int j = 0; j < 6; j++) {
    ps_ckpt ck;
    snprintf(path, sizeof path, "%s/ckpt-%09d", dir, 100 + j);
    assert_int_equal(ps_ckpt_open(&ck, path, &eb), 0);
    assert_int_equal(ck.format_version, j == 0 ? 2 : 3);
    for (int i = 0; i < 2; i++) {
      ps_ckpt_shard_data d;
      if (ps_ckpt_read_shard(&ck, i, &d, &eb) != 0)
        fail_msg("%s shard %d: %s", path, i, eb.msg);
      assert_int_equal(d.nfloats * sizeof(float), want_bytes[j][i]);
      assert_memory_equal(d.buf, want[j][i], want_bytes[j][i]);
      ps_ckpt_shard_data_close(&d);
    }
    ps_ckpt_tables_stats ts;
    if (ps_ckpt_verify_tables(&ck, &ts, &eb) != 0)
      fail_msg("verify %s: %s", path, eb.msg);
    ps_ckpt_close(&ck);
  }
  /* 101 written again (another run's state at that step): 102 no longer
   * applies to it, and says so. */
  {
    images im;
    images_of(&c, &im);
    ps_data_pos pos = {0, 0};
    ps_ckpt_write_opts o = opts_at(&c, &im, 101, PS_CKPT_FILTER_NONE, &pos);
    snprintf(path, sizeof path, "%s/again", f->root);
    assert_int_equal(ps_ckpt_write(path, &o, NULL, &eb), 0);
    assert_int_equal(sh("cp -a '%s/ckpt-000000101' '%s/saved101' && rm -rf '%s/ckpt-000000101' && "
                        "cp -a '%s/again/ckpt-000000101' '%s/'", dir, f->root, dir, f->root, dir),
                     0);
    ps_ckpt ck;
    snprintf(path, sizeof path, "%s/ckpt-000000102", dir);
    assert_int_equal(ps_ckpt_open(&ck, path, &eb), 0);
    assert_int_equal(ps_ckpt_verify(&ck, &eb), PS_ECORRUPT);
    assert_non_null(strstr(eb.msg, "its base ckpt-000000101: it holds another state than the one this checkpoint built on"));
    ps_ckpt_close(&ck);
    assert_int_equal(sh("rm -rf '%s/ckpt-000000101' && cp -a '%s/saved101' '%s/ckpt-000000101'",
                        dir, f->root, dir), 0);
    images_free(&c, &im);
  }
  /* A damaged link: 103's shard 1 gone.  103, 104 and 105 no longer read;
   * the newest whole one is 102. */
  assert_int_equal(sh("rm '%s/ckpt-000000103/shard-1.lz4'", dir), 0);
  ps_ckpt ck;
  snprintf(path, sizeof path, "%s/ckpt-000000105", dir);
  assert_int_equal(ps_ckpt_open(&ck, path, &eb), 0);
  assert_int_equal(ps_ckpt_verify(&ck, &eb), -ENOENT);
  assert_non_null(strstr(eb.msg, "ckpt-000000105: its base ckpt-000000104: "));
  assert_non_null(strstr(eb.msg, "its base ckpt-000000103: "));
  ps_ckpt_close(&ck);
  assert_int_equal(ps_ckpt_find_latest(dir, c2.layout.hash, c2.desc, &ck, &eb), 1);
  assert_int_equal(ck.step, 102);
  ps_ckpt_close(&ck);
  for (int j = 0; j < N; j++)
    for (int i = 0; i < 2; i++)
      free(want[j][i]);
  cluster_free(&c);
  cluster_free(&c2);
  ps_model_close(&m);
}

/* Two tables of one name (layers C, field 12, and C1, field 2: both
 * "C12") would write the same files: refused before anything is written. */
static void test_export_name_clash(void **state) {
  fx *f = *state;
  static const char text[] =
      "{\"input\": [2], \"layers\": ["
      "{\"type\": \"embedding_bag\", \"name\": \"C\", \"field\": 12, \"dim\": 2},"
      "{\"type\": \"embedding_bag\", \"name\": \"C1\", \"field\": 2, \"dim\": 2},"
      "{\"type\": \"dense\", \"name\": \"out\", \"out\": 1}, {\"type\": \"sigmoid\"}]}";
  ps_model_spec spec;
  ps_model m;
  ps_errbuf eb = {0};
  if (ps_modelfile_parse(text, strlen(text), "text", &spec, &eb) != 0 ||
      ps_model_build(&spec, &m, &eb) != 0)
    fail_msg("%s", eb.msg);
  assert_string_equal(m.tables[0].name, m.tables[1].name);
  cluster c;
  cluster_of(f, &m, &c, 1);
  images im;
  images_of(&c, &im);
  char path[512], out[600];
  write_ckpt(f, &c, &im, "clash", path, sizeof path);
  ps_ckpt ck;
  assert_int_equal(ps_ckpt_open(&ck, path, &eb), 0);
  snprintf(out, sizeof out, "%s/clash-npy", f->root);
  assert_int_equal(ps_ckpt_export(&ck, "npy", out, 0, NULL, 0, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "clash-npy: sparse tables 0 and 1 are both named 'C12': "
                                 "expected distinct names"));
  struct stat sb;
  assert_int_not_equal(stat(out, &sb), 0);
  ps_ckpt_close(&ck);
  images_free(&c, &im);
  cluster_free(&c);
  ps_model_close(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_verify_ok),
      cmocka_unit_test(test_verify_refusals),
      cmocka_unit_test(test_verify_section_without_tables),
      cmocka_unit_test(test_export),
      cmocka_unit_test(test_export_name_clash),
      cmocka_unit_test(test_relayout),
      cmocka_unit_test(test_incremental_chain),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
