/* Checkpoints: bit-exact round trip, the stock lz4 CLI on a shard file,
 * each kind of damage and the fallback it causes, retention, crash points of
 * the commit, and exports read back by numpy. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "common/config.h"
#include "common/log.h"
#include "layout/layout.h"
#include "nn/model.h"
#include "nn/modelfile.h"
#include "recovery/checkpoint.h"
#include "recovery/commit.h"
#include "recovery/export.h"
#include "recovery/solo.h"
#include "state_assert.h"

#define NSHARDS 2
#define NWORKERS 3
#define NSLOTS 2 /* adam */
#define GOLDEN "tests/fuzz/seeds/fuzz_manifest/mlp-784-16-10.json"
#define GOLDEN2 "tests/fuzz/seeds/fuzz_manifest/mlp-784-16-10-v2.json"

static const ps_data_norm NORM = {255.0f, 0.2860f, 0.3530f};

/* A small cluster's state: mlp 784-16-10 on 2 shards, adam. */
typedef struct fx {
  ps_model model;
  char desc[64];
  ps_layout layout;
  ps_optim optim;
  char root[64];
  int consistency;
  /* Each shard's state image (ps/state.h); vals, slots and accum point
   * into it.  Without an accumulator (async) the rows take its place. */
  float *img[NSHARDS];
  float *vals[NSHARDS], *slots[NSHARDS][NSLOTS], *accum[NSHARDS];
  ps_once once[NSHARDS][NWORKERS];
  ps_data_pos pos[NWORKERS];
  ps_ckpt_shard_state st[NSHARDS];
} fx;

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static float rnd(uint64_t *s) { return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2 - 1); }

/* Fill every shard's state from `seed` (different seeds, different bytes). */
static void fill(fx *f, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < NSHARDS; i++) {
    size_t n = f->layout.shard_floats[i];
    for (size_t k = 0; k < n; k++) {
      f->vals[i][k] = rnd(&s) * 0.1f;
      f->slots[i][0][k] = rnd(&s) * 1e-3f;
      f->slots[i][1][k] = (rnd(&s) + 1) * 1e-6f;
      f->accum[i][k] = rnd(&s);
    }
    for (int w = 0; w < NWORKERS; w++)
      f->once[i][w] = (ps_once){(uint64_t)(w + 1) << 40 | seed, seed * 1000 + (uint64_t)w};
    int sync = f->consistency == PS_CONSISTENCY_SYNC;
    ps_state_info in = {
        .nslots = NSLOTS, .has_accum = (uint32_t)sync,
        .accum_count = sync ? 2 : 0, .target = 3,
        .version = seed * 10 + (uint64_t)i, .global_step = seed * 10, .nonce = NWORKERS,
        .image_floats = ps_state_floats(n, NSLOTS, (uint32_t)sync, NWORKERS)};
    for (uint32_t w = 0; w < NWORKERS; w++)
      ps_state_once_put(&in, n, f->img[i], w, f->once[i][w]);
    f->st[i] = (ps_ckpt_shard_state){.nfloats = n, .info = in, .img = f->img[i]};
  }
  for (int w = 0; w < NWORKERS; w++)
    f->pos[w] = (ps_data_pos){seed % 7, seed * 31 + (uint64_t)w};
}

static int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  ps_model_spec spec;
  ps_errbuf eb = {0};
  if (f == NULL || ps_model_spec_parse("mlp", "16", &spec, &eb) != 0 ||
      ps_model_build(&spec, &f->model, &eb) != 0)
    return -1;
  ps_model_spec_format(&f->model.spec, f->desc, sizeof f->desc);
  if (ps_layout_build(&f->model.vars, f->desc, NSHARDS, PS_LAYOUT_GREEDY, SIZE_MAX, &f->layout,
                      &eb) != 0)
    return -1;
  f->optim = ps_optim_default(PS_OPTIM_ADAM, 0.001f);
  for (int i = 0; i < NSHARDS; i++) {
    size_t n = f->layout.shard_floats[i];
    f->img[i] = malloc((size_t)ps_state_floats(n, NSLOTS, 1, NWORKERS) * sizeof(float));
    if (f->img[i] == NULL)
      return -1;
    f->vals[i] = ps_state_segment(f->img[i], n, 0);
    for (uint32_t k = 0; k < NSLOTS; k++)
      f->slots[i][k] = ps_state_segment(f->img[i], n, 1 + k);
    f->accum[i] = ps_state_segment(f->img[i], n, 1 + NSLOTS);
  }
  snprintf(f->root, sizeof f->root, "/tmp/test_ckpt.XXXXXX");
  if (mkdtemp(f->root) == NULL)
    return -1;
  ps_log_init("test", PS_LOG_ERROR);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->root);
  if (system(cmd) != 0)
    return -1;
  for (int i = 0; i < NSHARDS; i++) {
    free(f->img[i]);
  }
  ps_layout_close(&f->layout);
  ps_model_close(&f->model);
  free(f);
  return 0;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* A fresh, empty directory under the fixture's root, named after the test. */
static void fresh_dir(fx *f, const char *name, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s", f->root, name);
  assert_int_equal(sh("rm -rf '%s'", out), 0);
}

static ps_ckpt_write_opts opts(fx *f, uint64_t step, ps_ckpt_filter filter, int64_t keep,
                               double wall) {
  return (ps_ckpt_write_opts){
      .step = step, .wall_time = wall, .cluster_id = "test-cluster", .model = f->desc,
      .vars = &f->model.vars, .layout = &f->layout, .optim = f->optim,
      .consistency = f->consistency, .filter = filter, .shards = f->st, .nworkers = NWORKERS,
      .data_pos = f->pos, .global_step = step, .network = &f->model.spec, .norm = &NORM,
      .max_to_keep = keep};
}

/* Fill from `step` and write checkpoint `step`. */
static void write_step(fx *f, const char *dir, uint64_t step, ps_ckpt_filter filter, int64_t keep,
                       double wall) {
  fill(f, step);
  ps_ckpt_write_opts o = opts(f, step, filter, keep, wall);
  ps_errbuf eb = {0};
  ps_ckpt_write_stats st;
  int rc = ps_ckpt_write(dir, &o, &st, &eb);
  if (rc != 0)
    fail_msg("ps_ckpt_write(%s, %" PRIu64 "): %d %s", dir, step, rc, eb.msg);
  assert_true(st.stored_bytes > 0);
  assert_int_equal(st.raw_bytes, (uint64_t)f->model.vars.total * 4 * (1 + NSLOTS +
                   (f->consistency == PS_CONSISTENCY_SYNC)));
}

static void ckpt_path(const char *dir, uint64_t step, char *out, size_t cap) {
  snprintf(out, cap, "%s/ckpt-%09" PRIu64, dir, step);
}

static void *read_file(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
  buf[n] = '\0';
  fclose(fp);
  *len = (size_t)n;
  return buf;
}

static void write_text(const char *path, const char *text, size_t len) {
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(text, 1, len, fp), len);
  assert_int_equal(fclose(fp), 0);
}

/* Replace the first `from` in the file with `to`. */
static void edit_file(const char *path, const char *from, const char *to) {
  size_t len;
  char *text = read_file(path, &len);
  char *at = strstr(text, from);
  if (at == NULL)
    fail_msg("%s: '%s' not found", path, from);
  size_t nf = strlen(from), nt = strlen(to);
  char *out = malloc(len - nf + nt + 1);
  memcpy(out, text, (size_t)(at - text));
  memcpy(out + (at - text), to, nt);
  memcpy(out + (at - text) + nt, at + nf, len - (size_t)(at - text) - nf + 1);
  write_text(path, out, len - nf + nt);
  free(out);
  free(text);
}

/* The shard's expected file content: values, slots, accum. */
static void expect_shard(fx *f, int i, const float *got) {
  size_t n = f->layout.shard_floats[i];
  assert_memory_equal(got, f->vals[i], n * 4);
  assert_memory_equal(got + n, f->slots[i][0], n * 4);
  assert_memory_equal(got + 2 * n, f->slots[i][1], n * 4);
  if (f->consistency == PS_CONSISTENCY_SYNC)
    assert_memory_equal(got + 3 * n, f->accum[i], n * 4);
}

static void open_ok(const char *path, ps_ckpt *c) {
  ps_errbuf eb = {0};
  int rc = ps_ckpt_open(c, path, &eb);
  if (rc != 0)
    fail_msg("ps_ckpt_open(%s): %d %s", path, rc, eb.msg);
}

/* find_latest must give checkpoint `want` (0: none). */
static void expect_latest(fx *f, const char *dir, uint64_t want) {
  ps_ckpt c;
  ps_errbuf eb = {0};
  int rc = ps_ckpt_find_latest(dir, f->layout.hash, f->desc, &c, &eb);
  assert_int_equal(rc, want != 0);
  if (want != 0)
    assert_int_equal(c.step, want);
  ps_ckpt_close(&c);
}

/* ------------------------------------------------------------------ */

static void roundtrip(fx *f, const char *name, ps_ckpt_filter filter, int consistency) {
  char dir[256], path[512];
  fresh_dir(f, name, dir, sizeof dir);
  f->consistency = consistency;
  write_step(f, dir, 100, filter, 5, 0);
  ckpt_path(dir, 100, path, sizeof path);

  ps_ckpt c;
  ps_errbuf eb = {0};
  open_ok(path, &c);
  assert_int_equal(c.format_version, PS_CKPT_FORMAT_VERSION_FULL);
  assert_string_equal(c.name, "ckpt-000000100");
  assert_int_equal(c.step, 100);
  assert_int_equal(c.global_step, 100);
  assert_true(c.wall_time > 1.6e9);
  assert_string_equal(c.cluster_id, "test-cluster");
  assert_string_equal(c.model, "mlp 784-16-10");
  assert_int_equal(c.layout_hash, f->layout.hash);
  /* What the model is: the built-in's layers, name and options, and the
   * normalization, each as written. */
  assert_true(c.has_network && c.has_norm);
  assert_string_equal(c.network.desc, "mlp 784-16-10");
  assert_int_equal(c.network.nlayers, f->model.spec.nlayers);
  assert_string_equal(c.builtin, "mlp");
  assert_string_equal(c.builtin_hidden, "16");
  assert_true(c.norm.divide == 255.0f && c.norm.mean == 0.2860f && c.norm.std == 0.3530f);
  assert_int_equal(c.optim.kind, PS_OPTIM_ADAM);
  assert_true(c.optim.lr == f->optim.lr && c.optim.beta1 == f->optim.beta1 &&
              c.optim.beta2 == f->optim.beta2 && c.optim.eps == f->optim.eps);
  assert_int_equal(c.consistency, consistency);
  assert_int_equal(c.filter, filter);
  assert_int_equal(c.nvars, f->model.vars.n);
  assert_int_equal(c.total_floats, f->model.vars.total);
  int p = 0;
  for (int v = 0; v < c.nvars; v++) {
    const ps_var *want = &f->model.vars.vars[v];
    assert_string_equal(c.vars[v].name, want->name);
    assert_int_equal(c.vars[v].ndim, want->ndim);
    assert_memory_equal(c.vars[v].shape, want->shape, (size_t)want->ndim * sizeof(uint32_t));
    assert_int_equal(c.vars[v].offset, want->offset);
    for (int k = 0; k < c.vars[v].nparts; k++, p++) {
      assert_int_equal(c.vars[v].parts[k].shard, f->layout.parts[p].shard);
      assert_int_equal(c.vars[v].parts[k].start, f->layout.parts[p].start);
      assert_int_equal(c.vars[v].parts[k].count, f->layout.parts[p].count);
      assert_int_equal(c.vars[v].parts[k].shard_off, f->layout.parts[p].shard_off);
    }
  }
  assert_int_equal(p, f->layout.nparts);
  assert_int_equal(c.nworkers, NWORKERS);
  for (int w = 0; w < NWORKERS; w++) {
    assert_int_equal(c.data_pos[w].epoch, f->pos[w].epoch);
    assert_int_equal(c.data_pos[w].offset, f->pos[w].offset);
  }
  assert_int_equal(c.nshards, NSHARDS);
  for (int i = 0; i < NSHARDS; i++) {
    const ps_ckpt_shard *s = &c.shards[i];
    assert_int_equal(s->floats, f->layout.shard_floats[i]);
    /* Every fixed field reads back as written (the list in state.h). */
    assert_state_equal(&s->info, &f->st[i].info);
    assert_int_equal(s->info.nslots, NSLOTS);
    assert_int_equal(s->info.has_accum, consistency == PS_CONSISTENCY_SYNC);
    assert_int_equal(s->info.target, 3);
    assert_int_equal(s->info.nonce, NWORKERS);
    for (int w = 0; w < NWORKERS; w++) {
      assert_int_equal(s->once[w].incarnation, f->once[i][w].incarnation);
      assert_int_equal(s->once[w].last_seq, f->once[i][w].last_seq);
    }
    ps_ckpt_shard_data d;
    assert_int_equal(ps_ckpt_read_shard(&c, i, &d, &eb), 0);
    assert_int_equal(d.nfloats, s->uncompressed_size / 4);
    assert_ptr_equal(d.slots[1], d.values + 2 * s->floats);
    assert_true((d.accum != NULL) == (consistency == PS_CONSISTENCY_SYNC));
    expect_shard(f, i, d.values);
    ps_ckpt_shard_data_close(&d);
  }
  assert_int_equal(ps_ckpt_verify(&c, &eb), 0);

  /* The full arena, reassembled from the parts, is the shards' values scattered. */
  float *want = calloc(f->model.vars.total, sizeof(float));
  float *got = calloc(f->model.vars.total, sizeof(float));
  for (int i = 0; i < NSHARDS; i++)
    ps_layout_scatter(&f->layout, &f->model.vars, i, f->vals[i], want);
  assert_int_equal(ps_ckpt_read_values(&c, got, &eb), 0);
  assert_memory_equal(got, want, f->model.vars.total * sizeof(float));
  free(want);
  free(got);

  /* Layout check: both sides named. */
  assert_int_equal(ps_ckpt_check_layout(&c, f->layout.hash, f->desc, &eb), 0);
  assert_int_equal(ps_ckpt_check_layout(&c, 0x1234, "cnn 1x28x28-10", &eb), PS_ELAYOUT);
  char hex[24];
  snprintf(hex, sizeof hex, "%016" PRIx64, f->layout.hash);
  assert_non_null(strstr(eb.msg, hex));
  assert_non_null(strstr(eb.msg, "0000000000001234"));
  assert_non_null(strstr(eb.msg, "mlp 784-16-10"));
  assert_non_null(strstr(eb.msg, "cnn 1x28x28-10"));
  ps_ckpt_close(&c);
  ps_ckpt_close(&c); /* twice is harmless */

  /* The index names it. */
  size_t len;
  snprintf(path, sizeof path, "%s/checkpoint", dir);
  char *index = read_file(path, &len);
  assert_true(strncmp(index, "latest: ckpt-000000100\nkept: ckpt-000000100 ", 44) == 0);
  free(index);
  f->consistency = PS_CONSISTENCY_ASYNC;
}

static void test_roundtrip_none(void **state) {
  roundtrip(*state, "rt-none", PS_CKPT_FILTER_NONE, PS_CONSISTENCY_ASYNC);
}

static void test_roundtrip_shuffle_sync(void **state) {
  roundtrip(*state, "rt-shuffle", PS_CKPT_FILTER_SHUFFLE, PS_CONSISTENCY_SYNC);
}

/* The stock lz4 CLI decodes a shard file to the bytes the manifest hashes. */
static void test_lz4_cli(void **state) {
  fx *f = *state;
  if (sh("command -v lz4 >/dev/null") != 0)
    fail_msg("no lz4 command: scripts/deps installs it (package lz4)");
  char dir[256], path[512], out[512];
  for (int filter = 0; filter < 2; filter++) {
    fresh_dir(f, filter ? "cli-shuffle" : "cli-none", dir, sizeof dir);
    write_step(f, dir, 7, (ps_ckpt_filter)filter, 0, 0);
    ckpt_path(dir, 7, path, sizeof path);
    snprintf(out, sizeof out, "%s/shard-0.raw", dir);
    assert_int_equal(sh("lz4 -d -q -f '%s/shard-0.lz4' '%s'", path, out), 0);
    size_t len, n = f->layout.shard_floats[0];
    float *raw = read_file(out, &len);
    assert_int_equal(len, n * 4 * (1 + NSLOTS));
    float *want = malloc(len);
    if (filter) {
      /* Plane k is byte k of every float. */
      const unsigned char *b = (const unsigned char *)raw;
      unsigned char *w = (unsigned char *)want;
      size_t nf = len / 4;
      for (int k = 0; k < 4; k++)
        for (size_t j = 0; j < nf; j++)
          w[j * 4 + k] = b[k * nf + j];
    } else {
      memcpy(want, raw, len);
    }
    expect_shard(f, 0, want);
    ps_ckpt c;
    open_ok(path, &c);
    assert_int_equal(XXH64(want, len, 0), c.shards[0].xxh64);
    ps_ckpt_close(&c);
    free(raw);
    free(want);
  }
}

/* Two good checkpoints, then `damage` applied to the newer one. */
static void damaged(fx *f, const char *name, char *dir, size_t cap, char *newer, size_t ncap) {
  fresh_dir(f, name, dir, cap);
  write_step(f, dir, 100, PS_CKPT_FILTER_SHUFFLE, 0, 0);
  write_step(f, dir, 200, PS_CKPT_FILTER_SHUFFLE, 0, 0);
  ckpt_path(dir, 200, newer, ncap);
  expect_latest(f, dir, 200);
}

/* The newer checkpoint opens (or not, with open_rc) and verify gives rc
 * with `msg` in its message; find_latest falls back to 100. */
static void expect_damage(fx *f, const char *dir, const char *newer, int open_rc, int rc,
                          const char *msg) {
  ps_ckpt c;
  ps_errbuf eb = {0};
  int got = ps_ckpt_open(&c, newer, &eb);
  assert_int_equal(got, open_rc);
  if (got == 0) {
    got = ps_ckpt_verify(&c, &eb);
    ps_ckpt_close(&c);
  }
  assert_int_equal(got, rc);
  if (strstr(eb.msg, msg) == NULL)
    fail_msg("message '%s' lacks '%s'", eb.msg, msg);
  expect_latest(f, dir, 100);
}

static void test_damage_truncated(void **state) {
  fx *f = *state;
  char dir[256], newer[512], path[600];
  damaged(f, "dmg-trunc", dir, sizeof dir, newer, sizeof newer);
  snprintf(path, sizeof path, "%s/shard-1.lz4", newer);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(truncate(path, st.st_size / 2), 0);
  expect_damage(f, dir, newer, 0, PS_ECORRUPT, "size mismatch (file ");
}

/* Flip one byte in the middle of ckpt-<step>'s shard-0.lz4, and give the
 * file a later modification time: kernel timestamps are coarse, and a
 * write within the tick of the checkpoint's own would keep its time (damage
 * done then is not what the remembered verification can see). */
static void flip_shard0(const char *dir, uint64_t step) {
  char path[600];
  ckpt_path(dir, step, path, sizeof path);
  strcat(path, "/shard-0.lz4");
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, st.st_size / 2), 1);
  b ^= 0x10;
  assert_int_equal(pwrite(fd, &b, 1, st.st_size / 2), 1);
  struct timespec ts[2] = {st.st_atim, st.st_mtim};
  ts[1].tv_sec += 1;
  assert_int_equal(futimens(fd, ts), 0);
  close(fd);
}

static void test_damage_flipped_byte(void **state) {
  fx *f = *state;
  char dir[256], newer[512];
  damaged(f, "dmg-flip", dir, sizeof dir, newer, sizeof newer);
  flip_shard0(dir, 200);
  /* LZ4's own checksum (or block decoding) catches it before the XXH64. */
  expect_damage(f, dir, newer, 0, PS_ECORRUPT, "shard-0.lz4: lz4 frame");
}

static void test_damage_xxh64(void **state) {
  fx *f = *state;
  char dir[256], newer[512], path[600];
  damaged(f, "dmg-xxh", dir, sizeof dir, newer, sizeof newer);
  snprintf(path, sizeof path, "%s/MANIFEST.json", newer);
  ps_ckpt c;
  open_ok(newer, &c);
  char from[64], to[64];
  snprintf(from, sizeof from, "\"xxh64\": \"%016" PRIx64 "\"", c.shards[1].xxh64);
  snprintf(to, sizeof to, "\"xxh64\": \"%016" PRIx64 "\"", c.shards[1].xxh64 ^ 1);
  edit_file(path, from, to);
  char msg[128];
  snprintf(msg, sizeof msg, "shard-1.lz4: xxh64 mismatch (file %016" PRIx64 ", manifest %016"
           PRIx64 ")", c.shards[1].xxh64, c.shards[1].xxh64 ^ 1);
  ps_ckpt_close(&c);
  expect_damage(f, dir, newer, 0, PS_ECORRUPT, msg);
}

static void test_damage_missing_file(void **state) {
  fx *f = *state;
  char dir[256], newer[512], path[600];
  damaged(f, "dmg-missing", dir, sizeof dir, newer, sizeof newer);
  snprintf(path, sizeof path, "%s/shard-1.lz4", newer);
  assert_int_equal(unlink(path), 0);
  expect_damage(f, dir, newer, 0, -ENOENT, "shard-1.lz4: cannot open");
}

static void test_damage_manifest(void **state) {
  fx *f = *state;
  char dir[256], newer[512], path[600];
  damaged(f, "dmg-manifest", dir, sizeof dir, newer, sizeof newer);
  snprintf(path, sizeof path, "%s/MANIFEST.json", newer);
  assert_int_equal(truncate(path, 300), 0);
  expect_damage(f, dir, newer, PS_ECORRUPT, PS_ECORRUPT, "MANIFEST.json: not valid JSON");
}

static void test_damage_version(void **state) {
  fx *f = *state;
  char dir[256], newer[512], path[600];
  damaged(f, "dmg-version", dir, sizeof dir, newer, sizeof newer);
  snprintf(path, sizeof path, "%s/MANIFEST.json", newer);
  edit_file(path, "\"format_version\": 2,", "\"format_version\": 4,");
  expect_damage(f, dir, newer, PS_EVERSION, PS_EVERSION,
                "format_version 4 is not supported: this build reads versions 1 to 3");
}

/* The newer checkpoint is of another layout (3 shards): skipped with PS_ELAYOUT. */
static void test_damage_other_layout(void **state) {
  fx *f = *state;
  char dir[256], newer[512];
  fresh_dir(f, "dmg-layout", dir, sizeof dir);
  write_step(f, dir, 100, PS_CKPT_FILTER_NONE, 0, 0);

  ps_layout l3;
  ps_errbuf eb = {0};
  assert_int_equal(ps_layout_build(&f->model.vars, f->desc, 3, PS_LAYOUT_GREEDY, SIZE_MAX, &l3,
                                   &eb), 0);
  float *img[3];
  ps_ckpt_shard_state st[3];
  for (int i = 0; i < 3; i++) {
    size_t n = l3.shard_floats[i];
    ps_state_info in = {.nslots = 2, .image_floats = ps_state_floats(n, 2, 0, 0)};
    img[i] = calloc(in.image_floats, 4);
    st[i] = (ps_ckpt_shard_state){.nfloats = n, .info = in, .img = img[i]};
  }
  ps_ckpt_write_opts o = opts(f, 200, PS_CKPT_FILTER_NONE, 0, 0);
  o.layout = &l3;
  o.shards = st;
  assert_int_equal(ps_ckpt_write(dir, &o, NULL, &eb), 0);
  ckpt_path(dir, 200, newer, sizeof newer);

  ps_ckpt c;
  open_ok(newer, &c);
  assert_int_equal(ps_ckpt_verify(&c, &eb), 0);
  assert_int_equal(ps_ckpt_check_layout(&c, f->layout.hash, f->desc, &eb), PS_ELAYOUT);
  char hex[24];
  snprintf(hex, sizeof hex, "%016" PRIx64, l3.hash);
  assert_non_null(strstr(eb.msg, hex));
  ps_ckpt_close(&c);
  expect_latest(f, dir, 100);
  for (int i = 0; i < 3; i++)
    free(img[i]);
  ps_layout_close(&l3);
}

/* A copy under another step's name is not that step. */
static void test_damage_renamed(void **state) {
  fx *f = *state;
  char dir[256], newer[512], copy[512];
  damaged(f, "dmg-renamed", dir, sizeof dir, newer, sizeof newer);
  ckpt_path(dir, 300, copy, sizeof copy);
  assert_int_equal(sh("cp -r '%s' '%s'", newer, copy), 0);
  ps_ckpt c;
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_open(&c, copy, &eb), PS_ECORRUPT);
  assert_non_null(strstr(eb.msg, "the directory is step 300, the manifest says step 200"));
  expect_latest(f, dir, 200);
}

/* The index names a directory that is gone; everything damaged gives none. */
static void test_damage_all(void **state) {
  fx *f = *state;
  char dir[256], newer[512], path[600];
  damaged(f, "dmg-all", dir, sizeof dir, newer, sizeof newer);
  assert_int_equal(sh("rm -rf '%s'", newer), 0);
  expect_latest(f, dir, 100);
  ckpt_path(dir, 100, path, sizeof path);
  assert_int_equal(sh("rm '%s/shard-0.lz4'", path), 0);
  expect_latest(f, dir, 0);
  /* No directory at all: none, not an error. */
  snprintf(path, sizeof path, "%s/does-not-exist", f->root);
  expect_latest(f, path, 0);
}

/* ------------------------------------------------------------------ */

static char *index_text(const char *dir) {
  char path[512];
  size_t len;
  snprintf(path, sizeof path, "%s/checkpoint", dir);
  return read_file(path, &len);
}

static int exists(const char *dir, uint64_t step) {
  char path[512];
  struct stat st;
  ckpt_path(dir, step, path, sizeof path);
  return stat(path, &st) == 0;
}

static void test_retention_max_to_keep(void **state) {
  fx *f = *state;
  char dir[256];
  fresh_dir(f, "ret-keep", dir, sizeof dir);
  double t0 = 1700000000;
  for (int k = 1; k <= 4; k++)
    write_step(f, dir, (uint64_t)k * 100, PS_CKPT_FILTER_NONE, 2, t0 + k);
  assert_false(exists(dir, 100));
  assert_false(exists(dir, 200));
  assert_true(exists(dir, 300));
  assert_true(exists(dir, 400));
  char *idx = index_text(dir);
  assert_string_equal(idx, "latest: ckpt-000000400\n"
                           "kept: ckpt-000000300 1700000003.000\n"
                           "kept: ckpt-000000400 1700000004.000\n");
  free(idx);

  /* On start, with the restored one protected: it stays, and is latest. */
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_retain(dir, NULL, 1, 0, "ckpt-000000300", NULL, &eb), 0);
  assert_true(exists(dir, 300) && exists(dir, 400));
  idx = index_text(dir);
  assert_true(strncmp(idx, "latest: ckpt-000000300\n", 23) == 0);
  free(idx);
  assert_int_equal(ps_ckpt_retain(dir, NULL, 1, 0, NULL, NULL, &eb), 0);
  assert_false(exists(dir, 300));
  assert_true(exists(dir, 400));

  ps_ckpt_entry *e;
  assert_int_equal(ps_ckpt_list(dir, &e, &eb), 1);
  assert_string_equal(e[0].name, "ckpt-000000400");
  assert_true(e[0].in_index && e[0].on_disk && e[0].latest);
  assert_true(e[0].time == t0 + 4);
  free(e);
}

static void test_retention_hours(void **state) {
  fx *f = *state;
  char dir[256];
  fresh_dir(f, "ret-hours", dir, sizeof dir);
  /* Every half hour from a whole hour; keep 1 plus the first of each hour. */
  double t0 = 1700000000 - 1700000000 % 3600;
  for (int k = 0; k < 6; k++) {
    fill(f, (uint64_t)k + 1);
    ps_ckpt_write_opts o = opts(f, (uint64_t)k + 1, PS_CKPT_FILTER_NONE, 1, t0 + 1800.0 * k);
    o.keep_every_n_hours = 1;
    ps_errbuf eb = {0};
    assert_int_equal(ps_ckpt_write(dir, &o, NULL, &eb), 0);
  }
  int want[6] = {1, 0, 1, 0, 1, 1};
  for (int k = 0; k < 6; k++)
    assert_int_equal(exists(dir, (uint64_t)k + 1), want[k]);
}

/* By step, not by wall clock: a clock stepped back an hour must not make
 * each new checkpoint delete the one written just before it. */
static void test_retention_by_step(void **state) {
  fx *f = *state;
  char dir[256];
  fresh_dir(f, "ret-step", dir, sizeof dir);
  double t0 = 1700000000;
  for (int k = 1; k <= 3; k++)
    write_step(f, dir, (uint64_t)k * 100, PS_CKPT_FILTER_NONE, 2, t0 - 3600.0 * k);
  assert_false(exists(dir, 100));
  assert_true(exists(dir, 200));
  assert_true(exists(dir, 300));
  expect_latest(f, dir, 300);
}

/* Only this model's checkpoints count and go: another model's, and one
 * whose manifest cannot be read, are kept, and never the latest. */
static void test_retention_other_model(void **state) {
  fx *f = *state;
  char dir[256];
  fresh_dir(f, "ret-model", dir, sizeof dir);
  write_step(f, dir, 900, PS_CKPT_FILTER_NONE, 0, 1700000000);
  write_step(f, dir, 950, PS_CKPT_FILTER_NONE, 0, 1700000001);
  /* ckpt-900 becomes another model's; ckpt-950's manifest is torn. */
  assert_int_equal(sh("sed -i 's/\\(\"model\": *\"\\)/\\1other /' '%s/ckpt-000000900/MANIFEST.json' &&"
                      " grep -q '\"other ' '%s/ckpt-000000900/MANIFEST.json' &&"
                      " truncate -s 20 '%s/ckpt-000000950/MANIFEST.json'", dir, dir, dir), 0);
  for (int k = 1; k <= 3; k++)
    write_step(f, dir, (uint64_t)k * 100, PS_CKPT_FILTER_NONE, 1, 1700000100 + k);
  assert_true(exists(dir, 900) && exists(dir, 950));
  assert_false(exists(dir, 100) || exists(dir, 200));
  assert_true(exists(dir, 300));
  char *idx = index_text(dir);
  assert_true(strncmp(idx, "latest: ckpt-000000300\n", 23) == 0);
  free(idx);
  /* Without a model (ckpt tools), every checkpoint counts. */
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_retain(dir, f->desc, 1, 0, NULL, NULL, &eb), 0);
  assert_true(exists(dir, 900) && exists(dir, 950) && exists(dir, 300));
}

/* A damaged checkpoint never counts as newer and is never deleted: with
 * max_to_keep 1 and the newest damaged, the older valid one stays (and is
 * the index's latest); once a valid one is newer, the older valid one goes
 * and the damaged one stays. */
static void test_retention_damaged(void **state) {
  fx *f = *state;
  char dir[256];
  fresh_dir(f, "ret-damaged", dir, sizeof dir);
  write_step(f, dir, 100, PS_CKPT_FILTER_NONE, 0, 1700000001);
  write_step(f, dir, 200, PS_CKPT_FILTER_NONE, 0, 1700000002);
  flip_shard0(dir, 200);
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_retain(dir, f->desc, 1, 0, NULL, NULL, &eb), 0);
  assert_true(exists(dir, 100) && exists(dir, 200));
  char *idx = index_text(dir);
  assert_true(strncmp(idx, "latest: ckpt-000000100\n", 23) == 0);
  free(idx);
  expect_latest(f, dir, 100);
  /* The same answer again from what this process remembers. */
  assert_int_equal(ps_ckpt_retain(dir, f->desc, 1, 0, NULL, NULL, &eb), 0);
  assert_true(exists(dir, 100) && exists(dir, 200));

  write_step(f, dir, 300, PS_CKPT_FILTER_NONE, 1, 1700000003);
  assert_false(exists(dir, 100));
  assert_true(exists(dir, 200) && exists(dir, 300));
  expect_latest(f, dir, 300);
}

/* Set aside: moved into unusable/, never over an earlier one of its name. */
static void test_set_aside(void **state) {
  fx *f = *state;
  char dir[256];
  fresh_dir(f, "aside", dir, sizeof dir);
  write_step(f, dir, 100, PS_CKPT_FILTER_NONE, 0, 0);
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_set_aside(dir, "ckpt-000000100", &eb), 0);
  assert_false(exists(dir, 100));
  write_step(f, dir, 100, PS_CKPT_FILTER_NONE, 0, 0);
  assert_int_equal(ps_ckpt_set_aside(dir, "ckpt-000000100", &eb), 0);
  assert_int_equal(sh("test -f '%s/unusable/ckpt-000000100/MANIFEST.json' && "
                      "test -f '%s/unusable/ckpt-000000100.1/MANIFEST.json'", dir, dir), 0);
  /* The index still names it (the next retention drops it); not on disk. */
  ps_ckpt_entry *e = NULL;
  assert_int_equal(ps_ckpt_list(dir, &e, &eb), 1);
  assert_false(e[0].on_disk);
  free(e);
  assert_int_equal(ps_ckpt_set_aside(dir, "ckpt-000000777", &eb), -ENOENT);
  assert_non_null(strstr(eb.msg, "ckpt-000000777"));
}

/* What a crash leaves (temporary directories, an index temporary) goes,
 * when it is of an older token (or version 1's names); a newer chief's
 * write in progress stays. */
static void test_retain_leftovers(void **state) {
  fx *f = *state;
  char dir[256];
  fresh_dir(f, "ret-tmp", dir, sizeof dir);
  write_step(f, dir, 100, PS_CKPT_FILTER_NONE, 0, 0);
  assert_int_equal(sh("mkdir '%s/.tmp-ckpt-000000200-4242' && touch '%s/.tmp-ckpt-000000200-4242/"
                      "shard-0.lz4' && mkdir '%s/.old-ckpt-000000100-77' && echo x > "
                      "'%s/checkpoint.tmp' && mkdir '%s/unrelated' && "
                      "mkdir '%s/.tmp-ckpt-000000300-8-55' && echo x > '%s/checkpoint.tmp-8-55' && "
                      "mkdir '%s/.tmp-ckpt-000000400-10-55' && echo x > '%s/checkpoint.tmp-10-56'",
                      dir, dir, dir, dir, dir, dir, dir, dir, dir), 0);
  ps_errbuf eb = {0};
  ps_ckpt_owner me = {.token = 9};
  assert_int_equal(ps_ckpt_retain(dir, NULL, 5, 0, NULL, &me, &eb), 0);
  assert_int_equal(sh("test ! -e '%s/.tmp-ckpt-000000200-4242' && test ! -e "
                      "'%s/.old-ckpt-000000100-77' && test ! -e '%s/checkpoint.tmp' && test -d "
                      "'%s/unrelated' && test ! -e '%s/.tmp-ckpt-000000300-8-55' && "
                      "test ! -e '%s/checkpoint.tmp-8-55' && test -d '%s/.tmp-ckpt-000000400-10-55' "
                      "&& test -f '%s/checkpoint.tmp-10-56'", dir, dir, dir, dir, dir, dir, dir, dir),
                   0);
  expect_latest(f, dir, 100);
}

/* Which temporaries a writer with (token 9, pid 100) may remove. */
static void test_leftover_rule(void **state) {
  (void)state;
  static const struct {
    const char *name;
    int want;
  } cases[] = {
      {".tmp-ckpt-000000200-9-100", 1},   /* its own */
      {".tmp-ckpt-000000200-9-101", 0},   /* same token, another pid: not its own */
      {".tmp-ckpt-000000200-8-100", 1},   /* an older token: fenced, can never commit */
      {".tmp-ckpt-000000200-10-100", 0},  /* a newer chief's write in progress */
      {".old-ckpt-000000200-3-7", 1},
      {".old-ckpt-000000200-12-7", 0},
      {"checkpoint.tmp-9-100", 1},
      {"checkpoint.tmp-10-100", 0},
      {"checkpoint.tmp-2-5", 1},
      {".tmp-ckpt-000000200-4242", 1},    /* version 1's names: token 0 */
      {"checkpoint.tmp", 1},
      {"checkpoint", -1},
      {"ckpt-000000200", -1},
      {".tmp-ckpt-000000200", -1},
      {".tmp-ckpt-000000200-x-1", -1},
      {"checkpoint.tmp-9", -1},
      {"checkpoint.tmpx", -1},
      {"unrelated", -1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (ps__ckpt_leftover_removable(cases[i].name, 9, 100) != cases[i].want)
      fail_msg("%s: %d, expected %d", cases[i].name,
               ps__ckpt_leftover_removable(cases[i].name, 9, 100), cases[i].want);
  /* Token 0 (no lease): only its own. */
  assert_int_equal(ps__ckpt_leftover_removable(".tmp-ckpt-000000200-0-100", 0, 100), 1);
  assert_int_equal(ps__ckpt_leftover_removable(".tmp-ckpt-000000200-0-101", 0, 100), 0);
}

static int fence_calls, fence_after;
/* Passes fence_after times, then refuses. */
static int test_fence(void *arg, char *why, size_t len) {
  (void)arg;
  if (fence_calls++ < fence_after)
    return 0;
  snprintf(why, len, "lease lost (test)");
  return -1;
}

/* A writer whose fence refuses never renames its checkpoint into place,
 * never rewrites the index and never deletes a checkpoint. */
static void test_fenced_commit(void **state) {
  fx *f = *state;
  char dir[256];
  fresh_dir(f, "fenced", dir, sizeof dir);
  write_step(f, dir, 100, PS_CKPT_FILTER_NONE, 0, 0);
  write_step(f, dir, 200, PS_CKPT_FILTER_NONE, 0, 0);
  char *before = index_text(dir);
  ps_ckpt_owner o7 = {.token = 7, .fence = test_fence};
  /* Refused at the rename: nothing committed, its temporary gone. */
  fence_calls = fence_after = 0;
  fill(f, 300);
  ps_ckpt_write_opts o = opts(f, 300, PS_CKPT_FILTER_NONE, 1, 0);
  o.owner = &o7;
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_write(dir, &o, NULL, &eb), PS_EFENCED);
  assert_non_null(strstr(eb.msg, "fenced: not renaming it into place in "));
  assert_false(exists(dir, 300));
  assert_int_equal(sh("test -z \"$(ls -A '%s' | grep '^\\.')\"", dir), 0);
  char *idx = index_text(dir);
  assert_string_equal(idx, before);
  free(idx);
  /* Retention refused before the index: the index and both checkpoints stay. */
  fence_calls = 0;
  fence_after = 1;  /* the leftovers pass, the index does not */
  assert_int_equal(ps_ckpt_retain(dir, NULL, 1, 0, NULL, &o7, &eb), PS_EFENCED);
  assert_non_null(strstr(eb.msg, "not rewriting the index"));
  assert_true(exists(dir, 100) && exists(dir, 200));
  idx = index_text(dir);
  assert_string_equal(idx, before);
  free(idx);
  /* Refused before the deletion: the index is rewritten, nothing deleted. */
  fence_calls = 0;
  fence_after = 2;
  assert_int_equal(ps_ckpt_retain(dir, NULL, 1, 0, NULL, &o7, &eb), PS_EFENCED);
  assert_non_null(strstr(eb.msg, "not deleting ckpt-000000100 (retention)"));
  assert_true(exists(dir, 100) && exists(dir, 200));
  free(before);
}

/* Writing a step that exists (a damaged one, or one of an abandoned
 * timeline) replaces it. */
static void test_same_step_replaced(void **state) {
  fx *f = *state;
  char dir[256], path[512];
  fresh_dir(f, "same-step", dir, sizeof dir);
  write_step(f, dir, 100, PS_CKPT_FILTER_NONE, 0, 0);
  fill(f, 555);
  ps_ckpt_write_opts o = opts(f, 100, PS_CKPT_FILTER_SHUFFLE, 0, 0);
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_write(dir, &o, NULL, &eb), 0);
  ckpt_path(dir, 100, path, sizeof path);
  ps_ckpt c;
  open_ok(path, &c);
  assert_int_equal(c.filter, PS_CKPT_FILTER_SHUFFLE);
  ps_ckpt_shard_data d;
  assert_int_equal(ps_ckpt_read_shard(&c, 1, &d, &eb), 0);
  expect_shard(f, 1, d.values);
  ps_ckpt_shard_data_close(&d);
  ps_ckpt_close(&c);
  assert_int_equal(sh("test $(ls -A '%s' | wc -l) -eq 2", dir), 0);
}

static void test_write_errors(void **state) {
  fx *f = *state;
  char dir[256], file[300];
  ps_errbuf eb = {0};
  fill(f, 1);
  fresh_dir(f, "werr", dir, sizeof dir);
  ps_ckpt_write_opts o = opts(f, 1, PS_CKPT_FILTER_NONE, 0, 0);
  o.optim = ps_optim_default(PS_OPTIM_SGD, 0.1f);
  assert_int_equal(ps_ckpt_write(dir, &o, NULL, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "optimizer slots"));
  /* The directory's place is taken by a file. */
  snprintf(file, sizeof file, "%s/file", f->root);
  write_text(file, "x", 1);
  o = opts(f, 1, PS_CKPT_FILTER_NONE, 0, 0);
  int rc = ps_ckpt_write(file, &o, NULL, &eb);
  assert_true(rc == -ENOTDIR || rc == -EEXIST);
  assert_non_null(strstr(eb.msg, file));
}

/* ------------------------------------------------------------------ */

/* A kill -9 at each stage of the commit: the next start finds a complete
 * checkpoint, the index never names a missing one, retention cleans up. */
static void test_crash_points(void **state) {
  fx *f = *state;
  static const char *const stages[] = {"shards", "manifest", "rename", "index", "retain"};
  static const uint64_t latest[] = {200, 200, 300, 300, 300};
  for (size_t s = 0; s < sizeof stages / sizeof stages[0]; s++) {
    char dir[256], name[64];
    snprintf(name, sizeof name, "crash-%s", stages[s]);
    fresh_dir(f, name, dir, sizeof dir);
    write_step(f, dir, 100, PS_CKPT_FILTER_SHUFFLE, 2, 0);
    write_step(f, dir, 200, PS_CKPT_FILTER_SHUFFLE, 2, 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      setenv(PS_CKPT_CRASH_ENV, stages[s], 1);
      fill(f, 300);
      ps_ckpt_write_opts o = opts(f, 300, PS_CKPT_FILTER_SHUFFLE, 2, 0);
      ps_errbuf eb = {0};
      ps_ckpt_write(dir, &o, NULL, &eb);
      _exit(3); /* not killed: the crash point was not reached */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
      fail_msg("stage %s: the writer was not killed (status %d)", stages[s], status);

    ps_ckpt_entry *e;
    ps_errbuf eb = {0};
    int n = ps_ckpt_list(dir, &e, &eb);
    assert_true(n >= 2);
    for (int i = 0; i < n; i++)
      if (e[i].in_index && !e[i].on_disk)
        fail_msg("stage %s: the index names missing %s", stages[s], e[i].name);
    free(e);
    expect_latest(f, dir, latest[s]);
    ps_ckpt_owner successor = {.token = 1};
    assert_int_equal(ps_ckpt_retain(dir, NULL, 2, 0, NULL, &successor, &eb), 0);
    assert_int_equal(sh("test -z \"$(ls -A '%s' | grep '^\\.')\"", dir), 0);
    /* Two kept: 200 and 300 where 300 was committed, else 100 and 200. */
    assert_int_equal(exists(dir, 100), latest[s] == 200);
    assert_true(exists(dir, 200));
    assert_int_equal(exists(dir, 300), latest[s] == 300);
    expect_latest(f, dir, latest[s]);
  }
}

/* ------------------------------------------------------------------ */

static const char *const py_check =
    "import json, struct, sys\n"
    "import numpy as np\n"
    "d = sys.argv[1]\n"
    "b = open(d + '/model.safetensors', 'rb').read()\n"
    "n = struct.unpack('<Q', b[:8])[0]\n"
    "assert n % 8 == 0, n\n"
    "h = json.loads(b[8:8 + n])\n"
    "meta = h.pop('__metadata__')\n"
    "assert meta['paramserv.step'] == '100', meta\n"
    "assert meta['paramserv.model'] == 'mlp 784-16-10', meta\n"
    "net = json.loads(meta['paramserv.network'])\n"
    "assert [l['type'] for l in net['layers']] == ['flatten', 'dense', 'relu', 'dense', 'log_softmax'], net\n"
    "assert json.loads(meta['paramserv.normalization'])['std'] == 0.353, meta\n"
    "norm = json.load(open(d + '/npy/normalization.json'))\n"
    "assert (norm['divide'], norm['mean'], norm['std']) == (255, 0.286, 0.353), norm\n"
    "assert json.load(open(d + '/npy/model.json'))['input'] == [1, 28, 28]\n"
    "data = b[8 + n:]\n"
    "end = 0\n"
    "for line in open(d + '/expect/list.txt'):\n"
    "    name, shape = line.split()\n"
    "    shape = [int(x) for x in shape.split('x')]\n"
    "    want = np.fromfile(d + '/expect/' + name + '.raw', dtype='<f4')\n"
    "    t = h.pop(name)\n"
    "    assert t['dtype'] == 'F32' and t['shape'] == shape, t\n"
    "    s, e = t['data_offsets']\n"
    "    assert s == end, (s, end)\n"
    "    end = e\n"
    "    a = np.frombuffer(data[s:e], dtype='<f4').reshape(shape)\n"
    "    assert a.tobytes() == want.tobytes(), name\n"
    "    raw = open(d + '/npy/' + name + '.npy', 'rb').read(10)\n"
    "    assert raw[:8] == b'\\x93NUMPY\\x01\\x00'\n"
    "    assert (10 + struct.unpack('<H', raw[8:10])[0]) % 64 == 0\n"
    "    m = np.load(d + '/npy/' + name + '.npy')\n"
    "    assert m.dtype == np.float32 and list(m.shape) == shape, (m.dtype, m.shape)\n"
    "    assert m.tobytes() == want.tobytes(), name\n"
    "assert not h and end == len(data), (h, end, len(data))\n"
    "print('numpy: exports ok')\n";

static void test_export(void **state) {
  fx *f = *state;
  if (sh("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
    fail_msg("no numpy for /usr/bin/python3: scripts/deps installs it (python3-numpy)");
  char dir[256], path[512], out[600];
  fresh_dir(f, "export", dir, sizeof dir);
  write_step(f, dir, 100, PS_CKPT_FILTER_SHUFFLE, 0, 0);
  ckpt_path(dir, 100, path, sizeof path);

  /* The expected arrays, from the shards' values through the layout. */
  const ps_vartable *t = &f->model.vars;
  float *arena = calloc(t->total, sizeof(float));
  for (int i = 0; i < NSHARDS; i++)
    ps_layout_scatter(&f->layout, t, i, f->vals[i], arena);
  snprintf(out, sizeof out, "%s/expect", dir);
  assert_int_equal(mkdir(out, 0755), 0);
  snprintf(out, sizeof out, "%s/expect/list.txt", dir);
  FILE *list = fopen(out, "w");
  for (int v = 0; v < t->n; v++) {
    const ps_var *var = &t->vars[v];
    fprintf(list, "%s ", var->name);
    for (int d = 0; d < var->ndim; d++)
      fprintf(list, "%s%" PRIu32, d ? "x" : "", var->shape[d]);
    fprintf(list, "\n");
    snprintf(out, sizeof out, "%s/expect/%s.raw", dir, var->name);
    write_text(out, (const char *)(arena + var->offset), var->count * sizeof(float));
  }
  fclose(list);
  free(arena);

  ps_ckpt c;
  ps_errbuf eb = {0};
  open_ok(path, &c);
  char note[256];
  snprintf(out, sizeof out, "%s/model.safetensors", dir);
  assert_int_equal(ps_ckpt_export(&c, "safetensors", out, 0, note, sizeof note, &eb), 0);
  assert_non_null(strstr(note, "paramserv.network"));
  /* An existing file is replaced only with force. */
  assert_int_equal(ps_ckpt_export(&c, "safetensors", out, 0, NULL, 0, &eb), -EEXIST);
  assert_non_null(strstr(eb.msg, "model.safetensors: exists: expected a new file"));
  assert_int_equal(ps_ckpt_export(&c, "safetensors", out, 1, NULL, 0, &eb), 0);
  snprintf(out, sizeof out, "%s/npy", dir);
  assert_int_equal(mkdir(out, 0755), 0); /* an empty directory is fine */
  assert_int_equal(ps_ckpt_export(&c, "npy", out, 0, note, sizeof note, &eb), 0);
  assert_string_equal(note, "the model file model.json and the normalization normalization.json");
  /* A second export into it would mix two: refused, unless forced. */
  assert_int_equal(ps_ckpt_export(&c, "npy", out, 0, NULL, 0, &eb), -EEXIST);
  assert_non_null(strstr(eb.msg, "npy: not empty ("));
  assert_int_equal(ps_ckpt_export(&c, "npy", out, 1, NULL, 0, &eb), 0);
  assert_int_equal(ps_ckpt_export(&c, "onnx", out, 1, NULL, 0, &eb), PS_EUSAGE);
  ps_ckpt_close(&c);
  /* The exported model file builds the checkpoint's layers. */
  ps_model_spec spec;
  snprintf(out, sizeof out, "%s/npy/model.json", dir);
  if (ps_modelfile_load(out, &spec, &eb) != 0)
    fail_msg("%s: %s", out, eb.msg);
  assert_int_equal(spec.nlayers, f->model.spec.nlayers);
  assert_int_equal(spec.classes, 10);

  snprintf(out, sizeof out, "%s/check.py", dir);
  write_text(out, py_check, strlen(py_check));
  assert_int_equal(sh("/usr/bin/python3 '%s' '%s'", out, dir), 0);
}

/* ------------------------------------------------------------------ */

/* The golden version-1 manifest (also a fuzz seed) parses to the fixture's
 * model and layout: the format and the layout hash it records are stable. */
static void test_golden_manifest(void **state) {
  fx *f = *state;
  size_t len;
  char *text = read_file(GOLDEN, &len);
  ps_ckpt c;
  ps_errbuf eb = {0};
  int rc = ps_ckpt_parse_manifest(text, len, &c, &eb);
  if (rc != 0)
    fail_msg("%s: %s", GOLDEN, eb.msg);
  assert_int_equal(c.step, 1200);
  assert_string_equal(c.model, f->desc);
  assert_int_equal(c.layout_hash, f->layout.hash);
  assert_int_equal(c.nshards, NSHARDS);
  assert_int_equal(c.nvars, f->model.vars.n);
  assert_int_equal(c.shards[0].floats, f->layout.shard_floats[0]);
  assert_int_equal(c.shards[0].once[1].incarnation, 18446744073709551615ull);
  assert_null(c.path);
  ps_ckpt_close(&c);
  free(text);
}

/* text[0..*len) with its first `from` replaced by `to`; *len becomes the
 * new length.  Free with free(). */
static char *replaced(const char *text, size_t *len, const char *from, const char *to) {
  const char *at = strstr(text, from);
  if (at == NULL)
    fail_msg("golden manifest lacks '%s'", from);
  size_t nf = strlen(from), nt = strlen(to);
  char *edited = malloc(*len - nf + nt + 1);
  assert_non_null(edited);
  memcpy(edited, text, (size_t)(at - text));
  memcpy(edited + (at - text), to, nt);
  memcpy(edited + (at - text) + nt, at + nf, *len - (size_t)(at - text) - nf + 1);
  *len = *len - nf + nt;
  return edited;
}

/* One edit of a golden manifest and the error it must give. */
static void expect_parse_error_in(const char *golden, const char *from, const char *to, int code,
                                  const char *msg) {
  size_t len;
  char *text = read_file(golden, &len);
  char *edited = replaced(text, &len, from, to);
  ps_ckpt c;
  ps_errbuf eb = {0};
  int rc = ps_ckpt_parse_manifest(edited, len, &c, &eb);
  if (rc != code || strstr(eb.msg, msg) == NULL)
    fail_msg("'%s' -> '%s': got %d '%s', expected %d '%s'", from, to, rc, eb.msg, code, msg);
  assert_null(c.vars);
  assert_null(c.shards);
  free(edited);
  free(text);
}

static void expect_parse_error(const char *from, const char *to, int code, const char *msg) {
  expect_parse_error_in(GOLDEN, from, to, code, msg);
}

/* The golden version-2 manifest: the built-in's layers, name and options and
 * the normalization; ps_ckpt_model builds the fixture's model from it, and
 * from the version-1 golden by its model text alone. */
static void test_golden_manifest_v2(void **state) {
  fx *f = *state;
  const char *const files[] = {GOLDEN2, GOLDEN};
  for (int i = 0; i < 2; i++) {
    size_t len;
    char *text = read_file(files[i], &len);
    ps_ckpt c;
    ps_errbuf eb = {0};
    if (ps_ckpt_parse_manifest(text, len, &c, &eb) != 0)
      fail_msg("%s: %s", files[i], eb.msg);
    assert_int_equal(c.format_version, 2 - i);
    assert_int_equal(c.has_network, i == 0);
    assert_int_equal(c.has_norm, i == 0);
    if (i == 0) {
      assert_string_equal(c.builtin, "mlp");
      assert_string_equal(c.builtin_hidden, "16");
      assert_string_equal(c.network.desc, f->desc);
      assert_true(c.norm.divide == 255.0f && c.norm.mean == 0.286f && c.norm.std == 0.353f);
    }
    ps_model m;
    ps_data_norm norm;
    if (ps_ckpt_model(&c, NULL, &m, &norm, &eb) != 0)
      fail_msg("%s: ps_ckpt_model: %s", files[i], eb.msg);
    assert_int_equal(m.vars.total, f->model.vars.total);
    assert_int_equal(m.nlayers, f->model.nlayers);
    assert_true(norm.divide == 255.0f && norm.mean == 0.286f && norm.std == 0.353f);
    ps_model_close(&m);
    /* A model file that is not the checkpoint's is refused. */
    assert_int_equal(ps_ckpt_model(&c, "models/cnn.json", &m, &norm, &eb), PS_EUSAGE);
    assert_non_null(strstr(eb.msg, i == 0 ? "not the checkpoint's model" : "mlp 784-16-10"));
    ps_ckpt_close(&c);
    free(text);
  }
  /* Version 1 of a model file: its text alone cannot say the layers. */
  size_t len;
  char *text = read_file(GOLDEN, &len);
  char *edited = replaced(text, &len, "\"mlp 784-16-10\"",
                          "\"model 1x28x28-10 #0123456789abcdef\"");
  ps_ckpt c;
  ps_errbuf eb = {0};
  assert_int_equal(ps_ckpt_parse_manifest(edited, len, &c, &eb), 0);
  ps_model m;
  ps_data_norm norm;
  assert_int_equal(ps_ckpt_model(&c, NULL, &m, &norm, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "a format version 1 checkpoint names its model only as "
                                 "'model 1x28x28-10 #0123456789abcdef'"));
  ps_ckpt_close(&c);
  free(edited);
  free(text);
}

/* Version 2's fields: each required, typed, and consistent with `model`. */
static void test_manifest_errors_v2(void **state) {
  (void)state;
  expect_parse_error_in(GOLDEN2, "\"network\":", "\"networx\":", PS_ECORRUPT,
                        "network: expected a model file's object or null, found nothing");
  expect_parse_error_in(GOLDEN2, "\"normalization\":", "\"normalisation\":", PS_ECORRUPT,
                        "normalization: expected an object or null, found nothing");
  expect_parse_error_in(GOLDEN2, "\"log_softmax\"", "\"softmax\"", PS_ECORRUPT,
                        "network: layer 5: type: found \"softmax\"");
  expect_parse_error_in(GOLDEN2, "\"out\": 16}", "\"out\": 17}", PS_ECORRUPT,
                        "builtin: mlp 16 is the model 'mlp 784-16-10' with its own layers");
  expect_parse_error_in(GOLDEN2, "\"hidden\": \"16\"", "\"hidden\": \"32\"", PS_ECORRUPT,
                        "builtin: mlp 32 is the model 'mlp 784-32-10'");
  expect_parse_error_in(GOLDEN2, "\"hidden\": \"16\"", "\"hidden\": 16", PS_ECORRUPT,
                        "builtin.hidden: expected a string or null, found an integer 16");
  expect_parse_error_in(GOLDEN2, "\"builtin\": {", "\"builtin\": null, \"x\": {", PS_ECORRUPT,
                        "network: its layers are the model 'model 1x28x28-10 #");
  expect_parse_error_in(GOLDEN2, "\"network\": {", "\"network\": null, \"x\": {", PS_ECORRUPT,
                        "builtin: expected null with a null network");
  expect_parse_error_in(GOLDEN2, "\"std\": 0.353", "\"std\": 0", PS_ECORRUPT,
                        "normalization.std: expected a number in");
  expect_parse_error_in(GOLDEN2, "\"divide\": 255.0", "\"divide\": \"255\"", PS_ECORRUPT,
                        "normalization.divide: expected a number in");
}

static void test_manifest_errors(void **state) {
  (void)state;
  expect_parse_error("\"format_version\": 1", "\"format_version\": 7", PS_EVERSION,
                     "format_version 7 is not supported: this build reads versions 1 to 3");
  expect_parse_error("\"format_version\": 1", "\"format_version\": \"1\"", PS_ECORRUPT,
                     "format_version: expected an integer, found a string \"1\"");
  expect_parse_error("\"paramserv-checkpoint\"", "\"other\"", PS_ECORRUPT,
                     "format: expected \"paramserv-checkpoint\"");
  expect_parse_error("\"xxh64\"", "\"xxh46\"", PS_ECORRUPT,
                     "shards[0].xxh64: expected 16 lowercase hex digits in a string, found "
                     "nothing (missing)");
  expect_parse_error("\"step\": \"1200\"", "\"step\": 1200", PS_ECORRUPT,
                     "step: expected a decimal u64 in a string, found an integer 1200");
  expect_parse_error("\"dtype\": \"float32\"", "\"dtype\": \"float16\"", PS_ECORRUPT,
                     "variables[0].dtype: expected \"float32\"");
  expect_parse_error("\"shard_off\": 0", "\"shard_off\": 1", PS_ECORRUPT, "do not tile");
  expect_parse_error("\"nshards\": 2", "\"nshards\": 3", PS_ECORRUPT,
                     "shards: expected an array of nshards (3) entries");
  expect_parse_error("\"file\": \"shard-0.lz4\"", "\"file\": \"../../etc/passwd\"", PS_ECORRUPT,
                     "shards[0].file: expected \"shard-0.lz4\"");
  expect_parse_error("\"filter\": \"shuffle\"", "\"filter\": \"zstd\"", PS_ECORRUPT,
                     "filter: expected none or shuffle");
  expect_parse_error("\"once\": [", "\"once\": [[\"1\"],", PS_ECORRUPT,
                     "shards[0].once[0]: expected a pair");
  expect_parse_error("\"model\"", "\"step\": \"1\", \"model\"", PS_ECORRUPT,
                     "not valid JSON (line");
  expect_parse_error("{", "[", PS_ECORRUPT, "not valid JSON");
}

/* One process's checkpoints (paramserv train): written, resumed with the
 * values, slots, step and data position; another model or optimizer in
 * the directory refused in one line; a warm start reads the values. */
static void test_solo(void **state) {
  fx *f = *state;
  char dir[256];
  fresh_dir(f, "solo", dir, sizeof dir);
  ps_errbuf eb = {0};
  ps_solo s;
  if (ps_solo_open(&s, dir, &f->model, &f->optim, 2, &eb) != 0)
    fail_msg("ps_solo_open: %s", eb.msg);
  size_t n = f->model.vars.total;
  uint64_t step;
  ps_data_pos pos;
  char name[PS_CKPT_NAME_MAX];
  assert_int_equal(ps_solo_resume(&s, &step, &pos, name, &eb), 0); /* nothing yet */
  for (uint64_t k = 1; k <= 3; k++) {
    for (size_t i = 0; i < n; i++) {
      ps_solo_values(&s)[i] = (float)(k * 1000 + i) * 1e-6f;
      ps_solo_slot(&s, 0)[i] = (float)k;
      ps_solo_slot(&s, 1)[i] = (float)i;
    }
    if (ps_solo_write(&s, k * 10, (ps_data_pos){k, 128 * k}, NULL, &eb) != 0)
      fail_msg("ps_solo_write: %s", eb.msg);
  }
  ps_solo_close(&s);
  assert_false(exists(dir, 10)); /* keep 2 */

  assert_int_equal(ps_solo_open(&s, dir, &f->model, &f->optim, 2, &eb), 0);
  assert_int_equal(ps_solo_resume(&s, &step, &pos, name, &eb), 1);
  assert_int_equal(step, 30);
  assert_string_equal(name, "ckpt-000000030");
  assert_true(pos.epoch == 3 && pos.offset == 384);
  for (size_t i = 0; i < n; i++)
    if (ps_solo_values(&s)[i] != (float)(3000 + i) * 1e-6f || ps_solo_slot(&s, 0)[i] != 3.0f ||
        ps_solo_slot(&s, 1)[i] != (float)i)
      fail_msg("element %zu resumed wrong", i);
  ps_solo_close(&s);

  /* Its manifest says the model: eval's builder takes it. */
  char path[512];
  ckpt_path(dir, 30, path, sizeof path);
  ps_ckpt c;
  open_ok(path, &c);
  assert_true(c.has_network && c.has_norm && c.nworkers == 1 && c.nshards == 1);
  float *params = calloc(n, sizeof *params);
  if (ps_solo_init_from(&c, &f->model, params, &eb) != 0)
    fail_msg("ps_solo_init_from: %s", eb.msg);
  assert_true(params[5] == (float)3005 * 1e-6f);

  /* Another model: refused at once, naming both; a warm start too. */
  ps_model_spec spec;
  ps_model other;
  assert_int_equal(ps_model_spec_parse("mlp", "8", &spec, &eb), 0);
  assert_int_equal(ps_model_build(&spec, &other, &eb), 0);
  assert_int_equal(ps_solo_open(&s, dir, &other, &f->optim, 2, &eb), 0);
  assert_int_equal(ps_solo_resume(&s, &step, &pos, name, &eb), PS_ELAYOUT);
  assert_non_null(strstr(eb.msg, "holds checkpoints of another model (the newest, "
                                 "ckpt-000000030: 'mlp 784-16-10'"));
  assert_non_null(strstr(eb.msg, "this run's 'mlp 784-8-10'"));
  ps_solo_close(&s);
  assert_int_equal(ps_solo_init_from(&c, &other, params, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "the model has 4 variables of 6370 floats, the checkpoint "
                                 "(mlp 784-16-10) 4 of 12730"));
  ps_model_close(&other);
  ps_ckpt_close(&c);
  free(params);

  /* Another optimizer (other slots): refused, naming the newest. */
  ps_optim sgd = ps_optim_default(PS_OPTIM_SGD, 0.1f);
  assert_int_equal(ps_solo_open(&s, dir, &f->model, &sgd, 2, &eb), 0);
  assert_int_equal(ps_solo_resume(&s, &step, &pos, name, &eb), PS_ELAYOUT);
  assert_non_null(strstr(eb.msg, "holds checkpoints of another optimizer (the newest, "
                                 "ckpt-000000030: adam on 1 shard; this run trains with sgd "
                                 "on one shard)"));
  ps_solo_close(&s);

  /* A damaged newest one: never trained beside, even with an older one to
   * resume. */
  assert_int_equal(sh("printf '\\377' | dd of='%s/shard-0.lz4' bs=1 seek=300 conv=notrunc "
                      "status=none", path), 0);
  assert_int_equal(ps_solo_open(&s, dir, &f->model, &f->optim, 2, &eb), 0);
  assert_int_equal(ps_solo_resume(&s, &step, &pos, name, &eb), PS_ELAYOUT);
  assert_non_null(strstr(eb.msg, "holds 1 checkpoint this run cannot resume (the newest, "
                                 "ckpt-000000030: "));
  ps_solo_close(&s);
}

static void test_filter_names(void **state) {
  (void)state;
  ps_ckpt_filter fl = PS_CKPT_FILTER_NONE;
  assert_int_equal(ps_ckpt_filter_parse("shuffle", &fl), 0);
  assert_int_equal(fl, PS_CKPT_FILTER_SHUFFLE);
  assert_int_equal(ps_ckpt_filter_parse("bitshuffle", &fl), PS_EUSAGE);
  assert_int_equal(ps_ckpt_filter_parse(NULL, &fl), PS_EUSAGE);
  assert_int_equal(fl, PS_CKPT_FILTER_SHUFFLE);
  assert_string_equal(ps_ckpt_filter_name(PS_CKPT_FILTER_NONE), "none");
  assert_string_equal(ps_ckpt_filter_name((ps_ckpt_filter)9), "unknown");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_none),
      cmocka_unit_test(test_roundtrip_shuffle_sync),
      cmocka_unit_test(test_lz4_cli),
      cmocka_unit_test(test_damage_truncated),
      cmocka_unit_test(test_damage_flipped_byte),
      cmocka_unit_test(test_damage_xxh64),
      cmocka_unit_test(test_damage_missing_file),
      cmocka_unit_test(test_damage_manifest),
      cmocka_unit_test(test_damage_version),
      cmocka_unit_test(test_damage_other_layout),
      cmocka_unit_test(test_damage_renamed),
      cmocka_unit_test(test_damage_all),
      cmocka_unit_test(test_retention_max_to_keep),
      cmocka_unit_test(test_retention_hours),
      cmocka_unit_test(test_retain_leftovers),
      cmocka_unit_test(test_retention_by_step),
      cmocka_unit_test(test_retention_other_model),
      cmocka_unit_test(test_retention_damaged),
      cmocka_unit_test(test_set_aside),
      cmocka_unit_test(test_leftover_rule),
      cmocka_unit_test(test_fenced_commit),
      cmocka_unit_test(test_same_step_replaced),
      cmocka_unit_test(test_write_errors),
      cmocka_unit_test(test_crash_points),
      cmocka_unit_test(test_export),
      cmocka_unit_test(test_golden_manifest),
      cmocka_unit_test(test_manifest_errors),
      cmocka_unit_test(test_golden_manifest_v2),
      cmocka_unit_test(test_manifest_errors_v2),
      cmocka_unit_test(test_solo),
      cmocka_unit_test(test_filter_names),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
