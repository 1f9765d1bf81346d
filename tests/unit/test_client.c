/* The client's constructors (src/worker/client.c) without a cluster: a
 * client made from options holds the same model and layout as one made
 * from the config file that says the same (so that the shards take it),
 * and each option that is wrong is refused in one line naming it; and the
 * version and error accessors of the public headers.  Training through
 * real shards: tests/integration/client.sh. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tmpdir.h"

#include "common/log.h"
#include "paramserv/client.h"
#include "worker/control.h"

static const char *const shards[] = {"127.0.0.1:7001", "127.0.0.1:7002", "[::1]:7003"};
static const char secret[] = "0123456789abcdef0123456789abcdef";

static int setup(void **state) {
  (void)state;
  if (tmpdir_create("ps-client") != 0)
    return -1;
  tmpdir_put("secret", secret, 0600);
  tmpdir_put("cluster.conf",
             "[cluster]\n"
             "id = unit\n"
             "secret_file = secret\n"
             "ps = 127.0.0.1:7001, 127.0.0.1:7002, [::1]:7003\n"
             "workers = 127.0.0.1:7101, 127.0.0.1:7102\n"
             "[model]\n"
             "hidden = 64,32\n"
             "[layout]\n"
             "strategy = round-robin\n"
             "split_bytes = 4096\n"
             "[train]\n"
             "last_step = 500\n",
             0644);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return tmpdir_remove();
}

/* The options that say what cluster.conf says. */
static ps_client_options options(void) {
  ps_client_options o = PS_CLIENT_OPTIONS_INIT;
  o.cluster_id = "unit";
  o.shards = shards;
  o.nshards = 3;
  o.worker = 1;
  o.secret = secret;
  o.secret_len = strlen(secret);
  o.hidden = "64,32";
  o.layout_strategy = "round-robin";
  o.layout_split_bytes = "4096";
  o.last_step = 500;
  return o;
}

static void test_options_match_the_config(void **state) {
  (void)state;
  ps_errbuf eb = {0};
  char conf[512];
  snprintf(conf, sizeof conf, "%s", at("cluster.conf"));
  ps_client *a = ps_client_new(conf, 1, &eb);
  assert_non_null(a);
  ps_client_options o = options();
  ps_client *b = ps_client_new_opts(&o, &eb);
  if (b == NULL)
    fail_msg("%s", ps_errbuf_message(&eb));
  const ps_layout *la = ps_client_layout(a), *lb = ps_client_layout(b);
  assert_int_equal(la->hash, lb->hash);
  assert_int_equal(la->nparts, lb->nparts);
  assert_int_equal(ps_client_vars(a)->total, ps_client_vars(b)->total);
  assert_int_equal(ps_client_vars(b)->n, 6);
  assert_int_equal(ps_client_last_step(b), 500);
  const ps_config *ca = ps_client_config(a), *cb = ps_client_config(b);
  assert_string_equal(cb->cluster_id, "unit");
  assert_int_equal(cb->nps, 3);
  assert_int_equal(cb->ps[2].port, 7003);
  assert_int_equal(ca->peer_timeout_ms, cb->peer_timeout_ms);
  ps_client_free(a);
  ps_client_free(b);

  /* The secret from a file, as the config reads it; a model file. */
  o = options();
  o.secret = NULL;
  o.secret_len = 0;
  char path[512];
  snprintf(path, sizeof path, "%s", at("secret"));
  o.secret_file = path;
  o.hidden = NULL;
  o.model_file = "models/mlp.json";
  o.peer_timeout_ms = 2000;
  b = ps_client_new_opts(&o, &eb);
  if (b == NULL)
    fail_msg("%s", ps_errbuf_message(&eb));
  assert_int_equal(ps_client_config(b)->peer_timeout_ms, 2000);
  assert_int_equal(ps_client_vars(b)->n, 6);
  ps_client_free(b);
}

/* Each wrong option: NULL, the code, and a message with `words`. */
static void refused(const ps_client_options *o, int code, const char *words) {
  ps_errbuf eb = {0};
  ps_client *c = ps_client_new_opts(o, &eb);
  if (c != NULL)
    fail_msg("options with %s: a client", words);
  assert_int_equal(ps_errbuf_code(&eb), code);
  if (strstr(ps_errbuf_message(&eb), words) == NULL)
    fail_msg("expected '%s' in: %s", words, ps_errbuf_message(&eb));
}

static void test_options_refused(void **state) {
  (void)state;
  ps_client_options o = options();
  o.size = 0;
  refused(&o, PS_EUSAGE, "PS_CLIENT_OPTIONS_INIT");
  refused(NULL, PS_EUSAGE, "PS_CLIENT_OPTIONS_INIT");
  o = options();
  o.cluster_id = NULL;
  refused(&o, PS_ECONFIG, "cluster_id: required");
  o = options();
  o.nshards = 0;
  refused(&o, PS_ECONFIG, "nshards = 0");
  const char *const bad[] = {"127.0.0.1:7001", "nowhere"};
  o.shards = bad;
  o.nshards = 2;
  refused(&o, PS_ECONFIG, "shards[1] = 'nowhere': expected host:port");
  o = options();
  o.worker = -1;
  refused(&o, PS_EUSAGE, "worker = -1");
  o = options();
  o.secret_len = 8;
  refused(&o, PS_ECONFIG, "secret_len = 8: expected 16 to");
  o.secret_file = "secret";
  refused(&o, PS_ECONFIG, "not both");
  o.secret = NULL;
  o.secret_file = "/nonexistent/secret";
  refused(&o, -ENOENT, "/nonexistent/secret");
  o.secret_file = NULL;
  refused(&o, PS_ECONFIG, "not neither");
  o = options();
  o.peer_timeout_ms = 10;
  refused(&o, PS_ECONFIG, "peer_timeout_ms = 10");

  /* The text options, each through its setting's rules. */
  static const struct {
    size_t field;
    const char *value;
    int code;
    const char *words;
  } texts[] = {
      {offsetof(ps_client_options, cluster_id), "two words", PS_ECONFIG,
       "ps_client_options.cluster_id = 'two words' ([cluster] id): 1 to 63 of"},
      {offsetof(ps_client_options, model), "resnet", PS_ECONFIG,
       "model = 'resnet' ([model] name): not one of the choices: mlp, cnn"},
      {offsetof(ps_client_options, layout_strategy), "random", PS_ECONFIG,
       "layout_strategy = 'random'"},
      {offsetof(ps_client_options, layout_split_bytes), "lots", PS_ECONFIG,
       "layout_split_bytes = 'lots' ([layout] split_bytes)"},
      {offsetof(ps_client_options, variables_file), "/nonexistent/vars.json", -ENOENT,
       "ps_client_options: [model]"},
      {offsetof(ps_client_options, hidden), "0,5", PS_EUSAGE,
       "ps_client_options: [model]: hidden sizes '0,5'"},
  };
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    o = options();
    *(const char **)((char *)&o + texts[i].field) = texts[i].value;
    refused(&o, texts[i].code, texts[i].words);
  }
}

/* A program built with an older, shorter ps_client_options: the fields
 * past its size keep their defaults. */
static void test_options_shorter(void **state) {
  (void)state;
  ps_client_options o = options();
  o.size = offsetof(ps_client_options, last_step) + sizeof o.last_step;
  ps_errbuf eb = {0};
  ps_client *c = ps_client_new_opts(&o, &eb);
  if (c == NULL)
    fail_msg("%s", ps_errbuf_message(&eb));
  ps_client_free(c);
  o.size = offsetof(ps_client_options, last_step);
  refused(&o, PS_EUSAGE, "size");
}

static void test_version(void **state) {
  (void)state;
  int major = -1, minor = -1, patch = -1;
  const char *v = ps_version(&major, &minor, &patch);
  assert_int_equal(major, PARAMSERV_VERSION_MAJOR);
  assert_int_equal(minor, PARAMSERV_VERSION_MINOR);
  assert_int_equal(patch, PARAMSERV_VERSION_PATCH);
  char want[64];
  snprintf(want, sizeof want, "%d.%d.%d", major, minor, patch);
  assert_string_equal(v, want);
  assert_non_null(ps_version(NULL, NULL, NULL));
  assert_true(PARAMSERV_VERSION_NUMBER >= PARAMSERV_VERSION_ENCODE(2, 0, 0));
}

static void test_errbuf(void **state) {
  (void)state;
  ps_errbuf eb = {0};
  assert_int_equal(ps_errbuf_code(&eb), 0);
  assert_string_equal(ps_errbuf_message(&eb), "");
  assert_int_equal(ps_err_set(&eb, PS_ELAYOUT, "shard %d", 3), PS_ELAYOUT);
  assert_int_equal(ps_errbuf_code(&eb), PS_ELAYOUT);
  assert_string_equal(ps_errbuf_message(&eb), "shard 3");
}

/* The table grows as it fills, every variable where the one before ends. */
static void test_vartable_grows(void **state) {
  (void)state;
  ps_vartable t;
  ps_vartable_init(&t);
  for (int i = 0; i < 300; i++) {
    char name[16];
    snprintf(name, sizeof name, "v%d", i);
    uint32_t shape[2] = {(uint32_t)i % 7 + 1, 3};
    assert_int_equal(ps_vartable_add(&t, name, 2, shape, (ps_init){PS_INIT_ZEROS, 0}), i);
  }
  size_t off = 0;
  for (int i = 0; i < t.n; i++) {
    assert_int_equal(t.vars[i].offset, off);
    off += t.vars[i].count;
  }
  assert_int_equal(t.total, off);
  assert_int_equal(ps_vartable_find(&t, "v299"), 299);
  ps_vartable_close(&t);
}

int main(void) {
  ps_log_init("test", PS_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_options_match_the_config, setup, teardown),
      cmocka_unit_test_setup_teardown(test_options_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_options_shorter, setup, teardown),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_errbuf),
      cmocka_unit_test(test_vartable_grows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
