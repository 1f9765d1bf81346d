/* Tests of the run config of `paramserv local`: derived from a user's file or the defaults, written as INI, read back the same. */
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

#include "local/runconf.h"

static ps_config cfg, back; /* large: kept off the stack */

static int setup(void **state) {
  (void)state;
  return tmpdir_create("test_runconf");
}

static int teardown(void **state) {
  (void)state;
  return tmpdir_remove();
}

static int loopback(const ps_addr *a) { return strcmp(a->host, "127.0.0.1") == 0 && a->port > 0; }

/* No user file: the defaults, 2 + 2 on fresh ports, a new secret. */
static void test_defaults(void **state) {
  (void)state;
  ps_errbuf eb = {0};
  ps_runconf_opts o = {.rundir = tmp, .last_step = 1234, .seed = 7};
  assert_int_equal(ps_runconf_make(&o, &cfg, &eb), 0);
  assert_int_equal(cfg.nps, 2);
  assert_int_equal(cfg.nworkers, 2);
  assert_true(loopback(&cfg.chief) && loopback(&cfg.redis));
  assert_true(loopback(&cfg.ps[0]) && loopback(&cfg.ps[1]));
  assert_true(loopback(&cfg.workers[0]) && loopback(&cfg.workers[1]));
  assert_int_equal(cfg.last_step, 1234);
  assert_int_equal(cfg.seed, 7);
  assert_int_equal(cfg.replication, PS_REPLICATION_LOG);
  assert_int_equal(cfg.ps_self_init, 0);
  assert_int_equal(cfg.chief_log_every, 100);
  assert_string_equal(cfg.secret_file, "secret");
  char want[256];
  snprintf(want, sizeof want, "%s/checkpoints", tmp);
  assert_string_equal(cfg.checkpoint_dir, want);
  struct stat sb;
  assert_int_equal(stat(at("secret"), &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);
  assert_int_equal(sb.st_size, 65); /* 32 bytes as hex, a newline */

  /* Written and read back: the processes read what was meant. */
  char path[512];
  snprintf(path, sizeof path, "%s", at("cluster.conf"));
  assert_int_equal(ps_runconf_write(&cfg, path, &eb), 0);
  assert_int_equal(ps_config_load(path, &back, &eb), 0);
  assert_int_equal(back.redis.port, cfg.redis.port);
  assert_int_equal(back.ps[1].port, cfg.ps[1].port);
  assert_int_equal(back.split_bytes, -1);
  assert_true(back.lr == cfg.lr);
  assert_int_equal(back.device, -1);  /* written as "cpu" */
  uint8_t secret[128];
  assert_int_equal(ps_config_read_secret(&back, secret, sizeof secret, &eb), 64);
  /* A GPU device is written as its word too, and reads back. */
  cfg.device = 2;
  assert_int_equal(ps_runconf_write(&cfg, path, &eb), 0);
  assert_int_equal(ps_config_load(path, &back, &eb), 0);
  assert_int_equal(back.device, 2);
}

/* A user's file without ps or workers: its settings are kept, relative
 * secret made absolute, its checkpoint dir and replication mode kept. */
static void test_user_file(void **state) {
  (void)state;
  ps_errbuf eb = {0};
  tmpdir_put("s", "0123456789abcdef0123456789abcdef\n", 0600);
  tmpdir_put("user.conf",
      "[cluster]\nsecret_file = s\nlog_level = warn\n"
      "[train]\nbatch = 64\nlr = 0.0123\nthreads = 3\nreplicas_to_aggregate = 3\n"
      "[replication]\nmode = snapshot\nself_init = yes\n"
      "[checkpoint]\ndir = /somewhere/ckpt\n",
      0644);
  char user[512];
  snprintf(user, sizeof user, "%s", at("user.conf"));
  ps_runconf_opts o = {.user_path = user, .rundir = tmp, .nworkers = 3, .last_step = -1, .seed = -1};
  assert_int_equal(ps_runconf_make(&o, &cfg, &eb), 0);
  assert_int_equal(cfg.nps, 2);
  assert_int_equal(cfg.nworkers, 3);
  assert_int_equal(cfg.batch, 64);
  assert_true(cfg.lr == 0.0123);
  assert_int_equal(cfg.threads, 3);
  assert_string_equal(cfg.log_level, "warn");
  assert_int_equal(cfg.replication, PS_REPLICATION_SNAPSHOT);
  assert_int_equal(cfg.ps_self_init, 0); /* the chief initializes */
  assert_string_equal(cfg.checkpoint_dir, "/somewhere/ckpt");
  char *real = realpath(tmp, NULL);
  char want[300];
  snprintf(want, sizeof want, "%s/s", real);
  free(real);
  assert_string_equal(cfg.secret_file, want);
  assert_int_equal(access(at("secret"), F_OK), -1); /* no secret of its own */

  /* The model's and the data's relative paths are made absolute too: the
   * run's config, which the processes read, lives elsewhere. */
  tmpdir_put("user3.conf",
      "[model]\nfile = m.json\n[data]\nformat = npy\ntrain = tr\ntest = /abs/te\n", 0644);
  snprintf(user, sizeof user, "%s", at("user3.conf"));
  ps_runconf_opts paths = {.user_path = user, .rundir = tmp, .last_step = -1, .seed = -1};
  assert_int_equal(ps_runconf_make(&paths, &cfg, &eb), 0);
  real = realpath(tmp, NULL);
  snprintf(want, sizeof want, "%s/m.json", real);
  assert_string_equal(cfg.model_file, want);
  snprintf(want, sizeof want, "%s/tr", real);
  assert_string_equal(cfg.train_data, want);
  assert_string_equal(cfg.test_data, "/abs/te");
  free(real);

  /* The file's own list sets the count when no option does. */
  tmpdir_put("user2.conf", "[cluster]\nps = 10.0.0.1:1, 10.0.0.2:1, 10.0.0.3:1\nworkers = 10.0.0.9:1\n",
      0644);
  snprintf(user, sizeof user, "%s", at("user2.conf"));
  ps_runconf_opts o2 = {.user_path = user, .rundir = tmp, .last_step = -1, .seed = -1};
  assert_int_equal(ps_runconf_make(&o2, &cfg, &eb), 0);
  assert_int_equal(cfg.nps, 3);
  assert_int_equal(cfg.nworkers, 1);
  assert_true(loopback(&cfg.ps[2]));

  /* A bad value is the config's own one-line error. */
  tmpdir_put("bad.conf", "[train]\nbatch = 0\n", 0644);
  snprintf(user, sizeof user, "%s", at("bad.conf"));
  ps_runconf_opts o3 = {.user_path = user, .rundir = tmp, .last_step = -1, .seed = -1};
  assert_int_equal(ps_runconf_make(&o3, &cfg, &eb), PS_ECONFIG);
  assert_non_null(strstr(eb.msg, "bad.conf:2: [train] batch = 0"));

  /* schedule = cosine needs a last step: --last-step gives it (as make demo
   * runs scripts/demo.conf), and without one the file is refused. */
  tmpdir_put("cos.conf", "[train]\nschedule = cosine\n", 0644);
  snprintf(user, sizeof user, "%s", at("cos.conf"));
  ps_runconf_opts o4 = {.user_path = user, .rundir = tmp, .last_step = 6000, .seed = -1};
  assert_int_equal(ps_runconf_make(&o4, &cfg, &eb), 0);
  assert_int_equal(cfg.last_step, 6000);
  o4.last_step = -1;
  assert_int_equal(ps_runconf_make(&o4, &cfg, &eb), PS_ECONFIG);
  assert_non_null(strstr(eb.msg, "cos.conf:2: [train] schedule = cosine with last_step = 0"));
}

/* 64 shards and 64 workers: the lists continue on indented lines within
 * the line limit, and read back whole. */
static void test_long_lists(void **state) {
  (void)state;
  ps_errbuf eb = {0};
  ps_runconf_opts o = {.rundir = tmp, .nps = 64, .nworkers = 64, .last_step = -1, .seed = -1};
  assert_int_equal(ps_runconf_make(&o, &cfg, &eb), 0);
  char path[512];
  snprintf(path, sizeof path, "%s", at("cluster.conf"));
  assert_int_equal(ps_runconf_write(&cfg, path, &eb), 0);
  assert_int_equal(ps_config_load(path, &back, &eb), 0);
  assert_int_equal(back.nps, 64);
  assert_int_equal(back.nworkers, 64);
  for (int i = 0; i < 64; i++) {
    assert_int_equal(back.ps[i].port, cfg.ps[i].port);
    assert_int_equal(back.workers[i].port, cfg.workers[i].port);
  }
  FILE *f = fopen(path, "r");
  char line[512];
  while (fgets(line, sizeof line, f) != NULL)
    assert_true(strlen(line) <= 199);
  fclose(f);
}

/* A value INI cannot carry is refused, naming it. */
static void test_unwritable_value(void **state) {
  (void)state;
  ps_errbuf eb = {0};
  ps_runconf_opts o = {.rundir = tmp, .last_step = -1, .seed = -1};
  assert_int_equal(ps_runconf_make(&o, &cfg, &eb), 0);
  memset(cfg.data_dir, 'x', 300);
  cfg.data_dir[0] = '/';
  cfg.data_dir[300] = '\0';
  char path[512];
  snprintf(path, sizeof path, "%s", at("cluster.conf"));
  assert_int_not_equal(ps_runconf_write(&cfg, path, &eb), 0);
  assert_non_null(strstr(eb.msg, "cluster.conf"));
}

static void test_free_ports(void **state) {
  (void)state;
  uint16_t p[130];
  assert_int_equal(ps_runconf_free_ports(130, p), 0);
  for (int i = 0; i < 130; i++) {
    assert_true(p[i] >= 1024);
    for (int j = 0; j < i; j++)
      assert_int_not_equal(p[i], p[j]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
      cmocka_unit_test_setup_teardown(test_user_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_long_lists, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unwritable_value, setup, teardown),
      cmocka_unit_test(test_free_ports),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
