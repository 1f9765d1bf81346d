/* The chief's cut (chief/cut.c): how long it asks the shards to hold their
 * pushes.  The shards are a stand-in call (ps_cut_env.call) that answers
 * each CUT with an image of the test's size, or fails, or answers late; a
 * client that never connects gives the call deadline the cut sets. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "chief/cut.h"
#include "common/log.h"
#include "paramserv/client.h"
#include "worker/control.h"

static const char *const shards[] = {"127.0.0.1:7001", "127.0.0.1:7002"};
static const char secret[] = "0123456789abcdef0123456789abcdef";

/* The stand-in shards: what they answer, and what they were asked. */
typedef struct fake {
  uint64_t image_floats[2];
  int fail;                 /* the CUT call fails, no reply (a shard too slow) */
  uint32_t asked_hold_ms;   /* the CUT's hold_ms */
  int asked_deadline_ms;    /* the client's deadline during the CUT call */
  ps_client *client;
} fake;

static int fake_call(void *arg, ps_msg *reqs, ps_client_reply_fn fn, void *fn_arg) {
  fake *f = arg;
  if (reqs[0].type != PS_MSG_CUT)
    return 0;  /* RESUME */
  f->asked_hold_ms = reqs[0].u.cut.hold_ms;
  f->asked_deadline_ms = ps_client_deadline(f->client);
  if (f->fail)
    return -ETIMEDOUT;
  for (int i = 0; i < 2; i++) {
    ps_msg rep = {.type = PS_MSG_CUT_REPLY};
    rep.u.cut_reply.cut_id = reqs[i].u.cut.cut_id;
    rep.u.cut_reply.state.image_floats = f->image_floats[i];
    fn(fn_arg, i, &rep);
  }
  return 0;
}

/* No positions: each cut stops after its CUT replies, before any FETCH. */
static int no_positions(void *arg, ps_data_pos *pos, char *why, size_t len) {
  (void)arg;
  (void)pos;
  snprintf(why, len, "test: no position");
  return -1;
}

static void test_hold_grows_with_the_image_and_after_a_failure(void **state) {
  (void)state;
  ps_client_options o = PS_CLIENT_OPTIONS_INIT;
  o.cluster_id = "unit";
  o.shards = shards;
  o.nshards = 2;
  o.secret = secret;
  o.secret_len = strlen(secret);
  ps_errbuf eb = {0};
  ps_client *client = ps_client_new_opts(&o, &eb);
  assert_non_null(client);
  ps_client_set_deadline(client, 2500);
  ps_config cfg = {.nps = 2, .nworkers = 1};
  fake f = {.image_floats = {1000, 2000}, .client = client};
  ps_cut_env env = {.cfg = &cfg, .client = client, .call = fake_call, .call_arg = &f,
                    .positions = no_positions};

  /* No image seen yet: 2000 ms, and the call keeps its deadline. */
  assert_int_equal(ps_cut_hold_ms(&env), 2000);
  assert_null(ps_cut_take(&env, 1, ps_cut_hold_ms(&env)));
  assert_int_equal(f.asked_hold_ms, 2000);
  assert_int_equal(f.asked_deadline_ms, 2500);
  assert_int_equal(ps_client_deadline(client), 2500);

  /* Replies later than the deadline (1500 ms of 2000; a slow link): the
   * next cut holds twice as long; one in time: 2000 again. */
  env.test_delay_ms = 1600;
  assert_null(ps_cut_take(&env, 10, ps_cut_hold_ms(&env)));
  assert_int_equal(ps_cut_hold_ms(&env), 4000);
  env.test_delay_ms = 0;
  assert_null(ps_cut_take(&env, 11, ps_cut_hold_ms(&env)));
  assert_int_equal(f.asked_hold_ms, 4000);
  assert_int_equal(ps_cut_hold_ms(&env), 2000);

  /* A 750 MB image: 2000 + 750e6 / 150e3 = 7000 ms; the CUT call may take
   * the 5250 ms the chief waits for its replies, and no more after it. */
  f.image_floats[1] = 750000000 / 4;
  assert_null(ps_cut_take(&env, 2, ps_cut_hold_ms(&env)));
  assert_int_equal(ps_cut_hold_ms(&env), 7000);
  assert_null(ps_cut_take(&env, 3, ps_cut_hold_ms(&env)));
  assert_int_equal(f.asked_hold_ms, 7000);
  assert_int_equal(f.asked_deadline_ms, 5250);
  assert_int_equal(ps_client_deadline(client), 2500);

  /* A cut that failed: the next holds twice as long; again: 4 times, up
   * to 60 s; one that came back in time: the image's hold again. */
  f.fail = 1;
  assert_null(ps_cut_take(&env, 4, ps_cut_hold_ms(&env)));
  assert_int_equal(ps_cut_hold_ms(&env), 14000);
  assert_null(ps_cut_take(&env, 5, ps_cut_hold_ms(&env)));
  assert_int_equal(f.asked_hold_ms, 14000);
  assert_int_equal(ps_cut_hold_ms(&env), 28000);
  assert_null(ps_cut_take(&env, 6, ps_cut_hold_ms(&env)));
  assert_null(ps_cut_take(&env, 7, ps_cut_hold_ms(&env)));
  assert_int_equal(ps_cut_hold_ms(&env), 60000);
  f.fail = 0;
  assert_null(ps_cut_take(&env, 8, ps_cut_hold_ms(&env)));
  assert_int_equal(f.asked_hold_ms, 60000);
  assert_int_equal(ps_cut_hold_ms(&env), 7000);

  ps_client_free(client);
}

int main(void) {
  ps_log_init("test", PS_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hold_grows_with_the_image_and_after_a_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
