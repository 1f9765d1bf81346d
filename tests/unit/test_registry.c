/* src/replica/registry.c against a real redis-server on a private port: a
 * process's own records (REDIS.md §1, §10, §11): its epoch, its heartbeat,
 * a worker's data position and clock, the run's end, the chief's token,
 * and a Redis that is away or refuses the login. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "data/sampler.h"
#include "replica/keys.h"
#include "replica/registry.h"
#include "redis_server.h"

typedef struct fx {
  ps_config cfg;
  ps_registry *r;
  redis_server other;
} fx;

static volatile int no_stop;

/* Worker `index`'s registry, with `extra` config lines. */
static ps_registry *open_registry(fx *f, const redis_server *s, int index, const char *extra) {
  redis_server_config(s, at("c.conf"), &f->cfg, "timeout_ms = 1000\n%s", extra);
  ps_registry_free(f->r);
  f->r = ps_registry_new(&f->cfg, "worker", index);
  assert_non_null(f->r);
  return f->r;
}

static uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int setup(void **state) {
  static fx the;
  memset(&the, 0, sizeof the);
  *state = &the;
  redis_ok(redis, "FLUSHALL");
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  ps_registry_free(f->r);
  redis_server_stop(&f->other);
  return 0;
}

/* Each new epoch outranks the one before, and the clock: even after Redis
 * lost the key (FLUSHALL), and when the key was ahead of the clock.
 * (Planted: EPOCH without the clock gave 1 after the FLUSHALL.) */
static int clock_past(void *ms) { return wall_ms() > *(uint64_t *)ms; }
static void test_new_epoch(void **state) {
  fx *f = *state;
  ps_registry *r = open_registry(f, &server, 0, "");
  uint64_t before = wall_ms(), e1, e2, e3, e4;
  ps_errbuf eb = {0};
  assert_int_equal(ps_registry_new_epoch(r, &no_stop, &e1, &eb), 0);
  assert_true(e1 >= before);
  assert_int_equal(ps_registry_new_epoch(r, &no_stop, &e2, &eb), 0);
  assert_true(e2 > e1);
  char v[32];
  assert_true(redis_str(redis, v, sizeof v, "GET {test}:epoch:worker:0"));
  assert_int_equal(strtoull(v, NULL, 10), e2);
  /* Redis loses the key once the clock passed e2 (an incarnation runs
   * for longer than a millisecond): the next epoch still outranks it. */
  wait_until(NULL, clock_past, &e2, "the clock past the epoch");
  redis_ok(redis, "FLUSHALL");
  assert_int_equal(ps_registry_new_epoch(r, &no_stop, &e3, &eb), 0);
  assert_true(e3 > e2);
  redis_ok(redis, "SET {test}:epoch:worker:0 %" PRIu64, e3 + 1000000);
  assert_int_equal(ps_registry_new_epoch(r, &no_stop, &e4, &eb), 0);
  assert_int_equal(e4, e3 + 1000001);
}

/* The data position and clock: a tick saves both (a forced one at
 * once), load_pos reads them back; a record of two fields (the chief's
 * set_pos) reads with clock 0; another worker's position by index. */
static void test_position(void **state) {
  fx *f = *state;
  ps_registry *r = open_registry(f, &server, 1, "");
  ps_data_pos pos = {0}, got = {0};
  uint64_t clock = 9;
  assert_int_equal(ps_registry_load_pos(r, &got, &clock), 0);
  assert_int_equal(clock, 0);
  assert_int_equal(ps_registry_get_pos(r, 1, &got), 0);

  pos.epoch = 3;
  pos.offset = 1234;
  ps_registry_set_clock(r, 77);
  ps_registry_tick(r, &pos, 10, 1.5, 1);
  assert_int_equal(ps_registry_load_pos(r, &got, &clock), 1);
  assert_int_equal(got.epoch, 3);
  assert_int_equal(got.offset, 1234);
  assert_int_equal(clock, 77);

  pos.epoch = 4;
  pos.offset = 5;
  assert_int_equal(ps_registry_set_pos(r, 1, &pos), 0);
  assert_int_equal(ps_registry_load_pos(r, &got, &clock), 1);
  assert_int_equal(got.epoch, 4);
  assert_int_equal(got.offset, 5);
  assert_int_equal(clock, 0);
  assert_int_equal(ps_registry_get_pos(r, 1, &got), 1);
  assert_int_equal(got.offset, 5);
  assert_int_equal(ps_registry_get_pos(r, 0, &got), 0);
}

/* A forced tick writes the heartbeat: the payload names this process and
 * its incarnation, with a TTL of three heartbeat_ms. */
static void test_heartbeat(void **state) {
  fx *f = *state;
  ps_registry *r = open_registry(f, &server, 0, "[worker]\nheartbeat_ms = 200\n");
  uint64_t e;
  ps_errbuf eb = {0};
  assert_int_equal(ps_registry_new_epoch(r, &no_stop, &e, &eb), 0);
  ps_registry_tick(r, NULL, 42, 2.5, 1);
  char v[256], want[64];
  assert_true(redis_str(redis, v, sizeof v, "GET {test}:node:worker:0"));
  snprintf(want, sizeof want, "pid %d host ", (int)getpid());
  assert_true(strncmp(v, want, strlen(want)) == 0);
  snprintf(want, sizeof want, " incarnation %" PRIu64 " step 42 steps/s 2.5", e);
  assert_non_null(strstr(v, want));
  long long ttl = redis_int(redis, "PTTL {test}:node:worker:0");
  assert_true(ttl > 0 && ttl <= 600);
  /* No position record without a position (the chief's ticks). */
  assert_int_equal(redis_int(redis, "EXISTS {test}:pos:worker:0"), 0);
}

/* The run's end: set, read back, and whether it ended for this config
 * (a raised last_step trains on; a non-finite stop ends it whatever
 * last_step says); cleared. */
static void test_done(void **state) {
  fx *f = *state;
  ps_registry *r = open_registry(f, &server, 0, "[train]\nlast_step = 200\n");
  uint64_t step = 0;
  int nonfinite = -1;
  assert_int_equal(ps_registry_get_done(r, &step, &nonfinite), 0);
  assert_int_equal(ps_registry_run_ended(r), 0);
  assert_int_equal(ps_registry_set_done(r, 100, 0), 0);
  assert_int_equal(ps_registry_get_done(r, &step, &nonfinite), 1);
  assert_int_equal(step, 100);
  assert_int_equal(nonfinite, 0);
  assert_int_equal(ps_registry_run_ended(r), 0);  /* last_step 200 > 100 */
  assert_int_equal(ps_registry_set_done(r, 200, 0), 0);
  assert_int_equal(ps_registry_run_ended(r), 1);
  assert_int_equal(ps_registry_set_done(r, 50, 1), 0);
  assert_int_equal(ps_registry_get_done(r, &step, &nonfinite), 1);
  assert_int_equal(step, 50);
  assert_int_equal(nonfinite, 1);
  assert_int_equal(ps_registry_run_ended(r), 1);
  assert_int_equal(ps_registry_clear_done(r), 0);
  assert_int_equal(ps_registry_get_done(r, &step, &nonfinite), 0);
}

/* The chief's token is the chief's epoch key: none, then what an EPOCH on
 * it gave. */
static void test_chief_token(void **state) {
  fx *f = *state;
  open_registry(f, &server, 0, "");
  ps_registry *chief = ps_registry_new(&f->cfg, "chief", 0);
  assert_non_null(chief);
  uint64_t token = 0, e;
  int found = -2;
  assert_int_equal(ps_registry_run_ended_token(chief, &token, &found), 0);
  assert_int_equal(found, 0);
  assert_int_equal(ps_registry_run_ended_token(f->r, &token, &found), 0);
  assert_int_equal(found, 0);
  ps_errbuf eb = {0};
  assert_int_equal(ps_registry_new_epoch(chief, &no_stop, &e, &eb), 0);
  assert_int_equal(ps_registry_run_ended_token(f->r, &token, &found), 0);
  assert_int_equal(found, 1);
  assert_int_equal(token, e);
  assert_int_equal(ps_registry_set_done(f->r, 7, 0), 0);
  token = 0;
  assert_int_equal(ps_registry_run_ended_token(f->r, &token, &found), 1);
  assert_int_equal(found, 1);
  assert_int_equal(token, e);
  ps_registry_free(chief);
}

/* Redis away (its server stopped): reads say so (-1, or "none" where the
 * caller only asks for a record), writes fail, ticks go on without it;
 * once Redis is back (restarted empty) the same registry connects again. */
static void test_redis_away(void **state) {
  fx *f = *state;
  assert_int_equal(redis_server_start(&f->other, tmp, NULL), 0);
  ps_registry *r = open_registry(f, &f->other, 0, "");
  ps_data_pos pos = {1, 2}, got;
  assert_int_equal(ps_registry_set_pos(r, 0, &pos), 0);
  redis_server_halt(&f->other);
  uint64_t step, clock;
  int nonfinite;
  assert_int_equal(ps_registry_get_pos(r, 0, &got), -1);
  assert_int_equal(ps_registry_load_pos(r, &got, &clock), 0);
  assert_int_equal(ps_registry_set_pos(r, 0, &pos), -1);
  assert_int_equal(ps_registry_get_done(r, &step, &nonfinite), -1);
  assert_int_equal(ps_registry_run_ended(r), 0);
  ps_registry_tick(r, &pos, 1, 1.0, 1);
  assert_null(ps_registry_redis(r, 1));

  assert_int_equal(redis_server_restart(&f->other), 0);
  assert_int_equal(ps_registry_get_pos(r, 0, &got), 0);  /* empty: its data is lost */
  assert_int_equal(ps_registry_set_pos(r, 0, &pos), 0);
  assert_int_equal(ps_registry_get_pos(r, 0, &got), 1);
  assert_int_equal(got.offset, 2);
}

/* A Redis that requires a password: a wrong one in password_file ends
 * the wait for an epoch at once with -EACCES (a login refused is the
 * config's to fix, not worth a retry); the right one gets an epoch. */
static void test_auth(void **state) {
  fx *f = *state;
  const char *args[] = {"--requirepass", "s3cret", NULL};
  assert_int_equal(redis_server_start(&f->other, tmp, args), 0);
  tmpdir_put("wrong", "s3cre7\n", 0600);
  ps_registry *r = open_registry(f, &f->other, 0, "password_file = wrong\n");
  uint64_t e = 0;
  ps_errbuf eb = {0};
  assert_int_equal(ps_registry_new_epoch(r, &no_stop, &e, &eb), -EACCES);
  assert_non_null(strstr(eb.msg, "AUTH"));
  tmpdir_put("right", "s3cret\n", 0600);
  r = open_registry(f, &f->other, 0, "password_file = right\n");
  eb = (ps_errbuf){0};
  assert_int_equal(ps_registry_new_epoch(r, &no_stop, &e, &eb), 0);
  assert_true(e > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_new_epoch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_position, setup, teardown),
      cmocka_unit_test_setup_teardown(test_heartbeat, setup, teardown),
      cmocka_unit_test_setup_teardown(test_done, setup, teardown),
      cmocka_unit_test_setup_teardown(test_chief_token, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_away, setup, teardown),
      cmocka_unit_test_setup_teardown(test_auth, setup, teardown),
  };
  return cmocka_run_group_tests(tests, redis_group_setup, redis_group_teardown);
}
