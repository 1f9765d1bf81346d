/* Tests of the cluster configuration: table, loading, errors, addresses, secret, example file. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tmpdir.h"

#include "common/config.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "common/parse.h"

/* ------------------------------------------------------------------------ */
/* Fixtures: a fresh temp directory per test                                 */
/* ------------------------------------------------------------------------ */

static ps_config cfg; /* large: kept off the stack */

static int setup(void **state) {
  (void)state;
  return tmpdir_create("test_config");
}

static int teardown(void **state) {
  (void)state;
  return tmpdir_remove();
}

/* The smallest valid file: the two required lists. */
#define MINIMAL "[cluster]\nps = 127.0.0.1:7001\nworkers = 127.0.0.1:7101\n"

static const ps_setting *setting(const char *section, const char *key) {
  size_t n;
  const ps_setting *t = ps_config_settings(&n);
  for (size_t i = 0; i < n; i++)
    if (strcmp(t[i].section, section) == 0 && strcmp(t[i].key, key) == 0)
      return &t[i];
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* The table and the defaults                                                */
/* ------------------------------------------------------------------------ */

static void test_table(void **state) {
  (void)state;
  size_t n;
  const ps_setting *t = ps_config_settings(&n);
  assert_true(n >= 40);
  for (size_t i = 0; i < n; i++) {
    const ps_setting *s = &t[i];
    assert_non_null(s->help);
    assert_true(strlen(s->help) > 0 && strlen(s->help) < 150);
    /* Sections are contiguous, keys unique. */
    for (size_t j = 0; j < i; j++) {
      assert_false(strcmp(t[j].section, s->section) == 0 && strcmp(t[j].key, s->key) == 0);
      if (strcmp(t[j].section, s->section) == 0)
        for (size_t k = j + 1; k < i; k++)
          assert_string_equal(t[k].section, s->section);
    }
    /* The field's size fits its type. */
    switch (s->type) {
    case PS_SETTING_INT: assert_int_equal(s->size, sizeof(int64_t)); break;
    case PS_SETTING_DOUBLE: assert_int_equal(s->size, sizeof(double)); break;
    case PS_SETTING_BOOL:
    case PS_SETTING_ENUM: assert_int_equal(s->size, sizeof(int)); break;
    case PS_SETTING_ADDR: assert_int_equal(s->size, sizeof(ps_addr)); break;
    case PS_SETTING_ADDR_LIST:
      assert_int_equal(s->size % sizeof(ps_addr), 0);
      assert_true((double)(s->size / sizeof(ps_addr)) >= s->max);
      /* required (no default), or empty unless given */
      assert_true(s->def == NULL || s->def[0] == '\0');
      break;
    case PS_SETTING_STRING:
      for (int k = 0; s->choices != NULL && s->choices[k] != NULL; k++)
        assert_true(strlen(s->choices[k]) < s->size);
      break;
    }
    assert_true(s->type != PS_SETTING_ENUM || s->choices != NULL);
  }
}

/* A ring has no shards: [cluster] ps may be left out. */
static void test_ring_without_ps(void **state) {
  (void)state;
  ps_errbuf eb = {0};
  int rc = ps_config_parse("cluster.conf", "[cluster]\nmode = ring\nworkers = 127.0.0.1:7101, "
                           "127.0.0.1:7102\n", &cfg, &eb);
  if (rc != 0)
    fail_msg("%s", eb.msg);
  assert_int_equal(cfg.mode, PS_MODE_RING);
  assert_int_equal(cfg.nps, 0);
  assert_int_equal(cfg.nworkers, 2);
}

static void test_defaults(void **state) {
  (void)state;
  ps_config *c = &cfg;
  memset(c, 0x5a, sizeof *c);
  ps_config_defaults(c);
  assert_string_equal(c->cluster_id, "paramserv");
  assert_string_equal(c->secret_file, "secret");
  assert_string_equal(c->chief.host, "127.0.0.1");
  assert_int_equal(c->chief.port, 7070);
  assert_int_equal(c->nps, 0);
  assert_int_equal(c->nworkers, 0);
  assert_string_equal(c->log_level, "info");
  assert_string_equal(c->redis.host, "127.0.0.1");
  assert_int_equal(c->redis.port, 6379);
  assert_string_equal(c->redis_user, "");
  assert_string_equal(c->redis_password_file, "");
  assert_string_equal(c->model, "mlp");
  assert_string_equal(c->hidden, "256,128");
  assert_string_equal(c->data_dir, "/usr/share/datasets/fashion-mnist");
  assert_int_equal(c->seed, 1);
  assert_string_equal(c->optimizer, "adam");
  assert_true(c->lr == 0.001);
  assert_true(c->momentum == 0.9);
  assert_true(c->weight_decay == 0);
  assert_string_equal(c->schedule, "constant");
  assert_int_equal(c->batch, 128);
  assert_int_equal(c->last_step, 0);
  assert_int_equal(c->consistency, PS_CONSISTENCY_ASYNC);
  assert_int_equal(c->replicas_to_aggregate, 0);
  assert_int_equal(c->staleness, 3);
  assert_int_equal(c->sync_timeout_ms, 5000);
  assert_int_equal(c->window, 1);
  assert_int_equal(c->adag, 0);
  assert_int_equal(c->threads, 0);
  assert_int_equal(c->log_every, 100);
  assert_string_equal(c->layout_strategy, "greedy");
  assert_int_equal(c->split_bytes, -1);
  assert_int_equal(c->replication, PS_REPLICATION_LOG);
  assert_int_equal(c->replicate_interval_ms, 200);
  assert_int_equal(c->replicate_every_updates, 100);
  assert_int_equal(c->ps_self_init, 0);
  assert_string_equal(c->checkpoint_dir, "/var/lib/paramserv/checkpoints");
  assert_int_equal(c->checkpoint_every_steps, 0);
  assert_int_equal(c->checkpoint_every_secs, 600);
  assert_int_equal(c->max_to_keep, 5);
  assert_true(c->keep_every_n_hours == 0);
  assert_int_equal(c->worker_give_up_s, 0);
  assert_int_equal(c->heartbeat_ms, 1000);

  /* A file with only the required settings gives the defaults for the rest. */
  ps_errbuf eb = {0};
  assert_int_equal(ps_config_parse("min.conf", MINIMAL, c, &eb), 0);
  assert_string_equal(c->path, "min.conf");
  assert_int_equal(c->nps, 1);
  assert_int_equal(c->batch, 128);
  assert_int_equal(c->split_bytes, -1);
}

/* ------------------------------------------------------------------------ */
/* A full file                                                               */
/* ------------------------------------------------------------------------ */

static const char full_conf[] =
    "\xEF\xBB\xBF# every setting, none at its default\n"
    "[cluster]\n"
    "id = test-cluster_1.a\n"
    "secret_file = /etc/paramserv/secret\n"
    "chief = [::1]:9000\n"
    "ps = 10.0.0.1:7001, 10.0.0.2:7001,\n"
    "     10.0.0.3:7001   ; the third shard\n"
    "  ps3.example.org:7001\n"
    "workers = w1:1, w2:1, [fe80::1]:2\r\n"
    "log_level = debug\n"
    "\n"
    "[redis]\n"
    "address = redis.local:6380\n"
    "user = paramserv\n"
    "password_file = redis.pass\n"
    "[model]\n"
    "name = cnn\n"
    "hidden = 512,256,10\n"
    "data_dir = data\n"
    "seed = 4611686018427387904\n"
    "[train]\n"
    "optimizer = nesterov\n"
    "lr = 0.25\n"
    "momentum = 0.5\n"
    "weight_decay = 1e-4\n"
    "schedule = cosine\n"
    "batch = 65536\n"
    "last_step = 1000\n"
    "consistency = ssp\n"
    "replicas_to_aggregate = 3\n"
    "staleness = 7\n"
    "sync_timeout_ms = 1\n"
    "window = 4\n"
    "adag = on\n"
    "threads = 8\n"
    "log_every = 2147483648\n"
    "[layout]\n"
    "strategy = round-robin\n"
    "split_bytes = 1099511627776\n"
    "[replication]\n"
    "mode = snapshot\n"
    "interval_ms = 50\n"
    "every_updates = 7\n"
    "self_init = false\n"
    "[checkpoint]\n"
    "dir = ckpt\n"
    "every_steps = 500\n"
    "every_secs = 0\n"
    "max_to_keep = 3\n"
    "keep_every_n_hours = 0.5\n"
    "[worker]\n"
    "give_up_s = 60\n"
    "heartbeat_ms = 10\n"
    "device = cuda:3\n";

static void test_full_file(void **state) {
  (void)state;
  ps_config *c = &cfg;
  ps_errbuf eb = {0};
  tmpdir_put("full.conf", full_conf, 0644);
  int rc = ps_config_load(at("full.conf"), c, &eb);
  if (rc != 0)
    fail_msg("%s", eb.msg);
  assert_string_equal(c->path, at("full.conf"));
  assert_string_equal(c->cluster_id, "test-cluster_1.a");
  assert_string_equal(c->secret_file, "/etc/paramserv/secret");
  assert_string_equal(c->chief.host, "::1");
  assert_int_equal(c->chief.port, 9000);
  assert_int_equal(c->nps, 4);
  assert_string_equal(c->ps[0].host, "10.0.0.1");
  assert_string_equal(c->ps[2].host, "10.0.0.3");
  assert_string_equal(c->ps[3].host, "ps3.example.org");
  assert_int_equal(c->ps[3].port, 7001);
  assert_int_equal(c->nworkers, 3);
  assert_string_equal(c->workers[2].host, "fe80::1");
  assert_int_equal(c->workers[2].port, 2);
  assert_string_equal(c->log_level, "debug");
  assert_string_equal(c->redis.host, "redis.local");
  assert_int_equal(c->redis.port, 6380);
  assert_string_equal(c->redis_user, "paramserv");
  assert_string_equal(c->redis_password_file, "redis.pass");
  assert_string_equal(c->model, "cnn");
  assert_string_equal(c->hidden, "512,256,10");
  assert_string_equal(c->data_dir, "data");
  assert_int_equal(c->seed, INT64_C(1) << 62);
  assert_string_equal(c->optimizer, "nesterov");
  assert_true(c->lr == 0.25);
  assert_true(c->momentum == 0.5);
  assert_true(c->weight_decay == 1e-4);
  assert_string_equal(c->schedule, "cosine");
  assert_int_equal(c->batch, 65536);
  assert_int_equal(c->last_step, 1000);
  assert_int_equal(c->consistency, PS_CONSISTENCY_SSP);
  assert_int_equal(c->replicas_to_aggregate, 3);
  assert_int_equal(c->staleness, 7);
  assert_int_equal(c->sync_timeout_ms, 1);
  assert_int_equal(c->window, 4);
  assert_int_equal(c->adag, 1);
  assert_int_equal(c->threads, 8);
  assert_int_equal(c->log_every, INT64_C(1) << 31);
  assert_string_equal(c->layout_strategy, "round-robin");
  assert_int_equal(c->split_bytes, INT64_C(1) << 40);
  assert_int_equal(c->replication, PS_REPLICATION_SNAPSHOT);
  assert_int_equal(c->replicate_interval_ms, 50);
  assert_int_equal(c->replicate_every_updates, 7);
  assert_int_equal(c->ps_self_init, 0);
  assert_string_equal(c->checkpoint_dir, "ckpt");
  assert_int_equal(c->checkpoint_every_steps, 500);
  assert_int_equal(c->checkpoint_every_secs, 0);
  assert_int_equal(c->max_to_keep, 3);
  assert_true(c->keep_every_n_hours == 0.5);
  assert_int_equal(c->worker_give_up_s, 60);
  assert_int_equal(c->heartbeat_ms, 10);
  assert_int_equal(c->device, 3);

  /* The words of split_bytes and the other spellings of booleans. */
  assert_int_equal(ps_config_parse("s.conf", MINIMAL "[layout]\nsplit_bytes = never\n"
                                              "[replication]\nself_init = 0\n[train]\nadag = yes\n",
                                   c, &eb), 0);
  assert_int_equal(c->split_bytes, 0);
  assert_int_equal(c->ps_self_init, 0);
  assert_int_equal(c->adag, 1);
  assert_int_equal(ps_config_parse("s.conf", MINIMAL "[train]\nconsistency = sync\n"
                                              "replicas_to_aggregate = 1\n", c, &eb), 0);
  assert_int_equal(c->consistency, PS_CONSISTENCY_SYNC);

  /* The device's spellings; the default is the CPU. */
  const struct { const char *text; int64_t device; } devices[] = {
      {"cpu", PS_DEVICE_CPU}, {"cuda", 0}, {"cuda:0", 0}, {"cuda:255", 255}};
  for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
    char text[256];
    snprintf(text, sizeof text, MINIMAL "[worker]\ndevice = %s\n", devices[i].text);
    assert_int_equal(ps_config_parse("s.conf", text, c, &eb), 0);
    assert_int_equal(c->device, devices[i].device);
  }
  assert_int_equal(ps_config_parse("s.conf", MINIMAL, c, &eb), 0);
  assert_int_equal(c->device, PS_DEVICE_CPU);
  /* [data] bag_separator: none by default, else its byte. */
  assert_int_equal(c->bag_separator, -1);
  assert_int_equal(ps_config_parse("s.conf", MINIMAL "[data]\nbag_separator = |\n", c, &eb), 0);
  assert_int_equal(c->bag_separator, '|');
}

/* ------------------------------------------------------------------------ */
/* Errors: each kind names the file, the line, the key, the expected form    */
/* ------------------------------------------------------------------------ */

typedef struct bad_case {
  const char *text;
  const char *where;  /* "cluster.conf:N:" or "cluster.conf:" for file-wide errors */
  const char *what;   /* the key or section */
  const char *expect; /* a piece of the expected form */
} bad_case;

#define C "[cluster]\n"
#define X50 "11111111111111111111111111111111111111111111111111"
#define PSW "ps = 127.0.0.1:7001, 127.0.0.1:7002\nworkers = 127.0.0.1:7101\n"
static const bad_case bad_cases[] = {
    /* values out of bounds or of the wrong form, one per type */
    {C PSW "[train]\nbatch = 0\n", "cluster.conf:5:", "[train] batch = 0",
     "expected an integer in [1, 65536]"},
    {C PSW "[data]\nbag_separator = ,,\n", "cluster.conf:5:", "[data] bag_separator = ,,",
     "expected one byte other than a tab, or nothing (no bags)"},
    {C PSW "[redis]\nsentinels = 127.0.0.1:26379\ncluster = 127.0.0.1:7000\n", "cluster.conf:6:",
     "[redis] cluster with sentinels both set", "expected one of them"},
    {C PSW "[redis]\ncluster = 127.0.0.1\n", "cluster.conf:5:", "[redis] cluster = 127.0.0.1",
     "expected host:port"},
    {C PSW "[train]\nbatch = 12x\n", "cluster.conf:5:", "[train] batch = 12x",
     "expected an integer in [1, 65536]"},
    {C PSW "[train]\nlr = 0\n", "cluster.conf:5:", "[train] lr = 0",
     "expected a number in (0, 1000]"},
    {C PSW "[train]\nmomentum = 1.5\n", "cluster.conf:5:", "[train] momentum = 1.5",
     "expected a number in [0, 1]"},
    {C PSW "[train]\nlr = nan\n", "cluster.conf:5:", "[train] lr = nan", "(0, 1000]"},
    {C PSW "[train]\nconsistency = eventual\n", "cluster.conf:5:", "[train] consistency = eventual",
     "expected one of async, sync, ssp"},
    {C PSW "[train]\noptimizer = adamw\n", "cluster.conf:5:", "[train] optimizer = adamw",
     "expected one of sgd, momentum, nesterov, adagrad, adam"},
    {C PSW "[train]\nadag = maybe\n", "cluster.conf:5:", "[train] adag = maybe",
     "expected yes or no"},
    {C PSW "[train]\nthreads =\n", "cluster.conf:5:", "[train] threads = \"\"",
     "expected an integer in [0, 256]"},
    {C PSW "[worker]\ndevice = gpu\n", "cluster.conf:5:", "[worker] device = gpu",
     "expected cpu, cuda or cuda:N"},
    {C PSW "[worker]\ndevice = cuda:x\n", "cluster.conf:5:", "[worker] device = cuda:x",
     "expected cpu, cuda or cuda:N"},
    {C PSW "[worker]\ndevice = cuda:256\n", "cluster.conf:5:", "[worker] device = cuda:256",
     "[0, 255]"},
    {C PSW "[worker]\ndevice = cuda: 1\n", "cluster.conf:5:", "[worker] device = cuda: 1",
     "expected cpu"},
    {C "chief = localhost\n" PSW, "cluster.conf:2:", "[cluster] chief = localhost",
     "expected host:port"},
    {C "ps = 127.0.0.1:7001, 127.0.0.1:0\nworkers = 127.0.0.1:7101\n", "cluster.conf:2:",
     "[cluster] ps = 127.0.0.1:7001, 127.0.0.1:0", "not 127.0.0.1:0"},
    {C "ps = 127.0.0.1:7001,, 127.0.0.1:7002\nworkers = a:1\n", "cluster.conf:2:", "[cluster] ps",
     "expected host:port"},
    {C "id = my cluster\n" PSW, "cluster.conf:2:", "[cluster] id = my cluster",
     "expected 1 to 63 of A-Z a-z 0-9 _ . -"},
    {C PSW "[layout]\nsplit_bytes = 2\n", "cluster.conf:5:", "[layout] split_bytes = 2",
     "expected auto, never, or an integer of bytes in [4, 1099511627776]"},
    {C PSW "[redis]\nuser = 0123456789012345678901234567890123456789012345678901234567890123\n",
     "cluster.conf:5:", "[redis] user = 0123", "expected at most 63 characters"},
    {C PSW "[checkpoint]\ndir =\n", "cluster.conf:5:", "[checkpoint] dir", "1 to 1023 characters"},
    /* sections and keys */
    {C PSW "\n[trian]\nbatch = 5\n", "cluster.conf:5:", "unknown section [trian]",
     "expected one of cluster, redis, model, data, train, layout, replication, checkpoint, chief, worker"},
    {C PSW "[trian]\n", "cluster.conf:4:", "unknown section [trian]", "expected one of cluster"},
    {C PSW "[train]\nbach = 5\n", "cluster.conf:5:", "unknown key [train] bach",
     "expected one of optimizer, lr, momentum"},
    {C PSW "[train]\nbatch = 5\n# again\nbatch = 6\n", "cluster.conf:7:", "[train] batch = 6",
     "first given on line 5"},
    {"batch = 5\n" C PSW, "cluster.conf:1:", "batch = 5", "expected a [section] line first"},
    {C PSW "[train]\nbatch = 5\n   6\n", "cluster.conf:6:", "[train] batch",
     "expected one line per value"},
    /* syntax errors, from inih */
    {C PSW "this is not ini\n", "cluster.conf:4:", "\"this is not ini\"",
     "expected [section], key = value"},
    {C PSW "[train\n", "cluster.conf:4:", "[train", "expected [section]"},
    {C "not a setting\n" PSW "[trian]\n", "cluster.conf:2:", "not a setting", "expected [section]"},
    /* lines too long for inih's buffer */
    {C PSW "[model]\nhidden = " X50 X50 X50 X50 "\n",
     "cluster.conf:5:", "line is 209 characters long", "expected at most 198"},
    /* missing, empty */
    {C "workers = 127.0.0.1:7101\n", "cluster.conf: [cluster] ps is required", "[cluster] ps",
     "expected host:port, host:port, ..."},
    {C "ps = 127.0.0.1:7001\n", "cluster.conf: [cluster] workers is required", "[cluster] workers",
     "expected host:port, host:port, ..."},
    /* one model: a built-in name, a model file or a variables file */
    {C PSW "[model]\nname = cnn\nfile = m.json\n", "cluster.conf:6:",
     "[model] name and file both set", "expected one of name, file, variables"},
    {C PSW "[model]\nfile = m.json\nvariables = v.json\n", "cluster.conf:6:",
     "[model] file and variables both set", "expected one of name, file, variables"},
    {C "mode = ring\nworkers = 127.0.0.1:7101\n[model]\nvariables = v.json\n", "cluster.conf:5:",
     "[model] variables with [cluster] mode = ring", "expected a model with layers"},
    /* [data]: the format's files */
    {C PSW "[data]\nformat = npy\n", "cluster.conf:5:", "[data] format = npy without [data] train",
     "expected the directory of X.npy and y.npy"},
    {C PSW "[data]\nformat = npz\n", "cluster.conf:5:", "[data] format = npz", "expected one of idx, criteo, npy"},
    /* ring mode: no shards, and only every-step gradients */
    {C "mode = ring\nworkers = 127.0.0.1:7101\n[train]\nalgorithm = easgd\n", "cluster.conf:2:",
     "[cluster] mode = ring with algorithm = easgd", "expected algorithm = gradients"},
    {C "mode = ring\nworkers = 127.0.0.1:7101\n[train]\nwindow = 4\n", "cluster.conf:2:",
     "[cluster] mode = ring with window = 4", "expected window = 1"},
    {"", "cluster.conf: no settings", "cluster.conf", "expected at least [cluster] ps and workers"},
    {"# only a comment\n\n[cluster]\n", "cluster.conf: no settings", "cluster.conf", "expected"},
    {C "ps =\nworkers = a:1\n", "cluster.conf:2:", "[cluster] ps has 0 addresses",
     "expected host:port, host:port, ... (1 to 64 addresses)"},
    /* rules across settings */
    {C PSW "[train]\nreplicas_to_aggregate = 2\n", "cluster.conf:5:",
     "[train] replicas_to_aggregate = 2", "expected at most the number of workers (1)"},
    {C "ps = 127.0.0.1:7001, 127.0.0.1:7002,\n  127.0.0.1:7001\nworkers = a:1\n", "cluster.conf:2:",
     "[cluster] ps lists 127.0.0.1:7001 twice", "expected distinct addresses"},
    {C PSW "[train]\nschedule = step\n", "cluster.conf:5:",
     "[train] schedule = step with decay_steps = 0", "expected decay_steps, the global steps"},
    {C PSW "[train]\nschedule = cosine\nlr = 0.1\n", "cluster.conf:5:",
     "[train] schedule = cosine with last_step = 0", "expected a last_step"},
    {C "workers = a:1, A:1\nps = b:1\n", "cluster.conf:2:", "[cluster] workers lists a:1 twice",
     "expected distinct addresses"},
    {C PSW "chief = 127.0.0.1:7002\n", "cluster.conf:4:", "[cluster] chief = 127.0.0.1:7002",
     "expected distinct listening addresses"},
    /* [metrics] listen: empty or host:port, with room for every process's slot */
    {C PSW "[metrics]\nlisten = 9400\n", "cluster.conf:5:", "[metrics] listen = 9400",
     "expected empty (off) or host:port"},
    {C PSW "[metrics]\nlisten = 127.0.0.1:65534\n", "cluster.conf:5:",
     "[metrics] listen = 127.0.0.1:65534", "expected a port of at most 65532"},
};

/* [metrics] listen: off when absent or empty; each process's address is
 * the base port plus its slot. */
static void test_metrics_listen(void **state) {
  (void)state;
  ps_config *c = malloc(sizeof *c);
  ps_errbuf eb = {0};
  ps_addr a;
  assert_non_null(c);
  assert_int_equal(ps_config_parse("m.conf", MINIMAL, c, &eb), 0);
  assert_int_equal(c->metrics_listen.port, 0);
  assert_int_equal(ps_metrics_addr(c, "chief", 0, &a), 1);
  assert_int_equal(ps_config_parse("m.conf", MINIMAL "[metrics]\nlisten =\n", c, &eb), 0);
  assert_int_equal(c->metrics_listen.port, 0);
  assert_int_equal(ps_config_parse("m.conf", MINIMAL "[metrics]\nlisten = 127.0.0.1:9400\n", c,
                                   &eb), 0);
  assert_string_equal(c->metrics_listen.host, "127.0.0.1");
  assert_int_equal(c->metrics_listen.port, 9400);
  assert_int_equal(ps_metrics_addr(c, "chief", 0, &a), 0);
  assert_int_equal(a.port, 9400);
  assert_int_equal(ps_metrics_addr(c, "ps", 1, &a), 0);
  assert_int_equal(a.port, 9402);
  assert_int_equal(ps_metrics_addr(c, "worker", 0, &a), 0);
  assert_int_equal(a.port, 9401 + c->nps);
  free(c);
}

static void test_errors(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    const bad_case *b = &bad_cases[i];
    ps_errbuf eb = {0};
    tmpdir_put("cluster.conf", b->text, 0644);
    int rc = ps_config_load(at("cluster.conf"), &cfg, &eb);
    /* Messages name the file as it was given: strip the temp directory. */
    const char *msg = strstr(eb.msg, "cluster.conf");
    if (rc != PS_ECONFIG || eb.code != PS_ECONFIG || msg == NULL ||
        strncmp(msg, b->where, strlen(b->where)) != 0 || strstr(msg, b->what) == NULL ||
        strstr(msg, b->expect) == NULL || strchr(eb.msg, '\n') != NULL)
      fail_msg("case %zu: rc %d, message \"%s\"; expected %s ... %s ... %s", i, rc, eb.msg,
               b->where, b->what, b->expect);
  }
  /* The exact form of the message the header promises. */
  ps_errbuf eb = {0};
  assert_int_equal(ps_config_parse("cluster.conf", bad_cases[0].text, &cfg, &eb), PS_ECONFIG);
  assert_string_equal(eb.msg,
                      "cluster.conf:5: [train] batch = 0: expected an integer in [1, 65536]");
  /* Without an errbuf the code alone comes back. */
  assert_int_equal(ps_config_parse("x", "", &cfg, NULL), PS_ECONFIG);
}

static void test_load_errors(void **state) {
  (void)state;
  ps_errbuf eb = {0};
  assert_int_equal(ps_config_load(at("missing.conf"), &cfg, &eb), -ENOENT);
  assert_non_null(strstr(eb.msg, "missing.conf: cannot open"));
  assert_int_equal(ps_config_load(tmp, &cfg, &eb), -EISDIR);
  assert_non_null(strstr(eb.msg, "cannot read"));

  /* A NUL byte would end the text early and hide what follows. */
  FILE *f = fopen(at("nul.conf"), "wb");
  assert_non_null(f);
  fwrite(MINIMAL "\0x", 1, sizeof MINIMAL + 1, f);
  fclose(f);
  assert_int_equal(ps_config_load(at("nul.conf"), &cfg, &eb), PS_ECONFIG);
  assert_non_null(strstr(eb.msg, "NUL byte at offset"));

  /* 64 addresses fit, over several lines; the 65th does not. */
  char text[4096];
  size_t n = (size_t)snprintf(text, sizeof text, "[cluster]\nworkers = w:1\nps = 10.0.0.1:1");
  for (int i = 2; i <= 64; i++)
    n += (size_t)snprintf(text + n, sizeof text - n,
                          i % 8 == 1 ? "\n  10.0.0.%d:1" : ", 10.0.0.%d:1", i);
  snprintf(text + n, sizeof text - n, "\n");
  int rc = ps_config_parse("list.conf", text, &cfg, &eb);
  if (rc != 0)
    fail_msg("%s", eb.msg);
  assert_int_equal(cfg.nps, 64);
  assert_string_equal(cfg.ps[63].host, "10.0.0.64");
  snprintf(text + n, sizeof text - n, ", 10.0.0.65:1\n");
  assert_int_equal(ps_config_parse("list.conf", text, &cfg, &eb), PS_ECONFIG);
  assert_non_null(strstr(eb.msg, "list.conf:10: [cluster] ps = "));
  assert_non_null(strstr(eb.msg, "expected at most 64 addresses"));
}

/* ------------------------------------------------------------------------ */
/* Addresses                                                                 */
/* ------------------------------------------------------------------------ */

static void test_addr(void **state) {
  (void)state;
  ps_addr a;
  char buf[300];
  assert_int_equal(ps_addr_parse("127.0.0.1:7000", &a), 0);
  assert_string_equal(a.host, "127.0.0.1");
  assert_int_equal(a.port, 7000);
  assert_string_equal(ps_addr_format(&a, buf, sizeof buf), "127.0.0.1:7000");
  assert_int_equal(ps_addr_parse("ps-1.example.org:65535", &a), 0);
  assert_int_equal(a.port, 65535);
  assert_int_equal(ps_addr_parse("[::1]:1", &a), 0);
  assert_string_equal(a.host, "::1");
  assert_int_equal(a.port, 1);
  assert_string_equal(ps_addr_format(&a, buf, sizeof buf), "[::1]:1");
  assert_int_equal(ps_addr_parse("[fe80::1%eth0]:80", &a), 0);
  assert_string_equal(a.host, "fe80::1%eth0");

  static const char *const bad[] = {
      "127.0.0.1",       "127.0.0.1:",      ":7000",         "127.0.0.1:0",    "127.0.0.1:65536",
      "127.0.0.1:70x",   "127.0.0.1:+80",   "127.0.0.1: 80", "127.0.0.1:-1",   "::1:7000",
      "[::1]",           "[::1]7000",       "[]:7000",       "[::1:7000",      "my host:80",
      "a,b:80",          "",                "host:99999999999999999999",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    a.port = 4242;
    if (ps_addr_parse(bad[i], &a) != PS_ECONFIG)
      fail_msg("\"%s\" was accepted", bad[i]);
    assert_int_equal(a.port, 4242);
  }
  /* A host that fills the buffer is refused rather than cut. */
  char longhost[300];
  memset(longhost, 'h', 256);
  snprintf(longhost + 256, sizeof longhost - 256, ":80");
  assert_int_equal(ps_addr_parse(longhost, &a), PS_ECONFIG);
  longhost[255] = '\0';
  strcat(longhost, ":80");
  assert_int_equal(ps_addr_parse(longhost, &a), 0);
  assert_int_equal(strlen(a.host), 255);
  /* Formatting into a small buffer truncates and stays terminated. */
  assert_string_equal(ps_addr_format(&(ps_addr){"abc", 80}, buf, 4), "abc");
}

/* ------------------------------------------------------------------------ */
/* The secret                                                                */
/* ------------------------------------------------------------------------ */

static void test_secret(void **state) {
  (void)state;
  ps_errbuf eb = {0};
  uint8_t buf[64];
  const char *key = "0123456789abcdef0123456789abcdef";

  /* Relative to the config file's directory, not to the working directory. */
  tmpdir_put("cluster.conf", MINIMAL "secret_file = my.secret\n", 0644);
  assert_int_equal(ps_config_load(at("cluster.conf"), &cfg, &eb), 0);
  tmpdir_put("my.secret", "0123456789abcdef0123456789abcdef\n", 0600);
  assert_int_equal(ps_config_read_secret(&cfg, buf, sizeof buf, &eb), 32);
  assert_memory_equal(buf, key, 32);

  /* Without a newline, and exactly at cap (with its newline past cap). */
  tmpdir_put("my.secret", key, 0600);
  assert_int_equal(ps_config_read_secret(&cfg, buf, 32, &eb), 32);
  tmpdir_put("my.secret", "0123456789abcdef0123456789abcdef\n", 0600);
  assert_int_equal(ps_config_read_secret(&cfg, buf, 32, &eb), 32);
  assert_int_equal(ps_config_read_secret(&cfg, buf, 31, &eb), PS_ECONFIG);
  assert_non_null(strstr(eb.msg, "longer than 31 bytes"));
  /* Only one newline is stripped. */
  tmpdir_put("my.secret", "0123456789abcdef\n\n", 0600);
  assert_int_equal(ps_config_read_secret(&cfg, buf, sizeof buf, &eb), 17);

  /* Readable by others: refused, with the fix in the message. */
  tmpdir_put("my.secret", key, 0644);
  assert_int_equal(ps_config_read_secret(&cfg, buf, sizeof buf, &eb), PS_ECONFIG);
  assert_non_null(strstr(eb.msg, at("my.secret")));
  assert_non_null(strstr(eb.msg, "0644"));
  assert_non_null(strstr(eb.msg, "chmod 600"));
  tmpdir_put("my.secret", key, 0640);
  assert_int_equal(ps_config_read_secret(&cfg, buf, sizeof buf, &eb), PS_ECONFIG);
  assert_non_null(strstr(eb.msg, "0640"));

  /* Too short, counted after the newline is stripped. */
  tmpdir_put("my.secret", "0123456789abcde\n", 0600);
  memset(buf, 0, sizeof buf);
  assert_int_equal(ps_config_read_secret(&cfg, buf, sizeof buf, &eb), PS_ECONFIG);
  assert_non_null(strstr(eb.msg, "is 15 bytes: expected at least 16"));
  assert_int_equal(buf[0], 0);

  /* Missing, and an absolute path. */
  unlink(at("my.secret"));
  assert_int_equal(ps_config_read_secret(&cfg, buf, sizeof buf, &eb), -ENOENT);
  assert_non_null(strstr(eb.msg, at("my.secret")));
  tmpdir_put("abs.secret", key, 0600);
  snprintf(cfg.secret_file, sizeof cfg.secret_file, "%s", at("abs.secret"));
  snprintf(cfg.path, sizeof cfg.path, "/nonexistent/cluster.conf");
  assert_int_equal(ps_config_read_secret(&cfg, buf, sizeof buf, &eb), 32);
  /* A config given without a directory: the secret is beside it, in the
   * working directory. */
  snprintf(cfg.path, sizeof cfg.path, "cluster.conf");
  snprintf(cfg.secret_file, sizeof cfg.secret_file, "no-such-secret.test");
  assert_int_equal(ps_config_read_secret(&cfg, buf, sizeof buf, &eb), -ENOENT);
  assert_non_null(strstr(eb.msg, "secret no-such-secret.test: cannot open"));
}

/* ------------------------------------------------------------------------ */
/* The annotated example matches the table                                   */
/* ------------------------------------------------------------------------ */

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t')
    s++;
  size_t n = strlen(s);
  while (n > 0 && strchr(" \t\r\n", s[n - 1]) != NULL)
    s[--n] = '\0';
  return s;
}

static void test_example_file(void **state) {
  (void)state;
  const char *path = "systemd/cluster.conf";
  ps_errbuf eb = {0};
  int rc = ps_config_load(path, &cfg, &eb);
  if (rc != 0)
    fail_msg("%s: %s", path, eb.msg);
  assert_int_equal(cfg.nps, 2);
  assert_int_equal(cfg.nworkers, 2);

  /* Read it again, line by line, independently of the parser: each key line
   * is in the table, in the table's order, shows the default, and the
   * comment block just above it holds the setting's help. */
  size_t n, next = 0;
  const ps_setting *t = ps_config_settings(&n);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[512], section[64] = "", comments[2048] = "";
  int lineno = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    lineno++;
    char *s = trim(line);
    if (*s == '#' || *s == ';') {
      strncat(comments, s, sizeof comments - strlen(comments) - 2);
      strcat(comments, "\n");
      continue;
    }
    if (*s == '\0' || *s == '[') {
      comments[0] = '\0';
      if (*s == '[') {
        char *end = strchr(s, ']');
        assert_non_null(end);
        *end = '\0';
        snprintf(section, sizeof section, "%s", s + 1);
      }
      continue;
    }
    char *eq = strchr(s, '=');
    if (eq == NULL)
      fail_msg("%s:%d: not a key line: %s", path, lineno, s);
    *eq = '\0';
    char *key = trim(s), *value = trim(eq + 1);
    const ps_setting *st = setting(section, key);
    if (st == NULL)
      fail_msg("%s:%d: [%s] %s is not in the table", path, lineno, section, key);
    if (next >= n || st != &t[next])
      fail_msg("%s:%d: [%s] %s is out of the table's order (expected [%s] %s)", path, lineno,
               section, key, next < n ? t[next].section : "-", next < n ? t[next].key : "-");
    next++;
    if (strstr(comments, st->help) == NULL)
      fail_msg("%s:%d: [%s] %s: the comment above lacks the help \"%s\"", path, lineno, section,
               key, st->help);
    if (st->def != NULL && strcmp(value, st->def) != 0)
      fail_msg("%s:%d: [%s] %s = %s: expected the default %s", path, lineno, section, key, value,
               st->def);
    comments[0] = '\0';
  }
  fclose(f);
  if (next != n)
    fail_msg("%s: [%s] %s is missing", path, t[next].section, t[next].key);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_ring_without_ps),
      cmocka_unit_test_setup_teardown(test_full_file, setup, teardown),
      cmocka_unit_test(test_metrics_listen),
      cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_load_errors, setup, teardown),
      cmocka_unit_test(test_addr),
      cmocka_unit_test_setup_teardown(test_secret, setup, teardown),
      cmocka_unit_test(test_example_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
