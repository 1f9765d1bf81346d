/* chief/lease.c and chief/keeper.c against a real redis-server on a
 * private port (lease.h, keeper.h, REDIS.md §1 and §9): one chief holds
 * the lease, a second is refused, each taking has a higher fencing token,
 * and the keeper renews it past its time to live and notices when it is
 * lost: Redis losing the key, another chief holding it.  Every wait is for
 * an event, with a deadline that only bounds a hang. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chief/keeper.h"
#include "chief/lease.h"
#include "common/config.h"
#include "replica/registry.h"
#include "redis_server.h"

#define LEASE "{test}:chief"

typedef struct fx {
  ps_config cfg;
  ps_lease a, b;          /* two chiefs */
  ps_lease_keeper keeper;
  char holder[256];
} fx;

static int setup(void **state) {
  static fx the;
  fx *f = *state = &the;
  memset(f, 0, sizeof *f);
  redis_ok(redis, "FLUSHALL");
  redis_server_config(&server, at("c.conf"), &f->cfg, "timeout_ms = 1000\n"
                      "[chief]\nlease_ms = 300\n");
  ps_lease_init(&f->a, f->cfg.cluster_id, f->cfg.chief_lease_ms);
  ps_lease_init(&f->b, f->cfg.cluster_id, f->cfg.chief_lease_ms);
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  ps_lease_keeper_stop(&f->keeper);
  redis_ok(redis, "ACL SETUSER default allkeys");
  return 0;
}

/* The first chief takes the lease (its value names its token and this
 * process); the second is refused and told who holds it; the first
 * renews it with the same token. */
static void test_one_holder(void **state) {
  fx *f = *state;
  assert_int_equal(ps_lease_take(&f->a, redis, f->holder, sizeof f->holder), 1);
  assert_true(f->a.token > 0);
  char want[256], v[256];
  snprintf(want, sizeof want, "token %" PRIu64 " %s", f->a.token, f->a.who);
  assert_string_equal(f->a.value, want);
  assert_true(redis_str(redis, v, sizeof v, "GET " LEASE));
  assert_string_equal(v, want);
  long long ttl = redis_int(redis, "PTTL " LEASE);
  assert_true(ttl > 0 && ttl <= 300);

  assert_int_equal(ps_lease_take(&f->b, redis, f->holder, sizeof f->holder), 0);
  assert_string_equal(f->holder, want);
  assert_int_equal(f->b.token, 0);
  assert_int_equal(ps_lease_check(&f->b, redis, f->holder, sizeof f->holder), 0);

  uint64_t token = f->a.token;
  assert_int_equal(ps_lease_take(&f->a, redis, f->holder, sizeof f->holder), 1);
  assert_int_equal(f->a.token, token);
  assert_int_equal(ps_lease_check(&f->a, redis, f->holder, sizeof f->holder), 1);
}

/* Each taking hands out a token above every earlier one, stored in the
 * chief's epoch key: after a release, after a lapse, and after Redis lost
 * both keys (FLUSHALL: the clock keeps it above).  Only the holder's
 * release frees it.  (Planted: TAKE without "+ 1" gave the second chief
 * the first one's token, and this failed.) */
static int lapsed(void *arg) {
  (void)arg;
  return redis_int(redis, "EXISTS " LEASE) == 0;
}
static int clock_past(void *token) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000 > *(uint64_t *)token;
}
static void test_tokens_grow(void **state) {
  fx *f = *state;
  assert_int_equal(ps_lease_take(&f->a, redis, f->holder, sizeof f->holder), 1);
  uint64_t t1 = f->a.token;
  assert_int_equal(ps_lease_release(&f->b, redis), 0);  /* not b's */
  assert_int_equal(ps_lease_release(&f->a, redis), 1);
  assert_int_equal(ps_lease_take(&f->b, redis, f->holder, sizeof f->holder), 1);
  uint64_t t2 = f->b.token;
  assert_true(t2 > t1);
  ps_registry *reg = ps_registry_new(&f->cfg, "chief", 0);
  assert_non_null(reg);
  uint64_t stored = 0;
  int found = 0;
  assert_int_equal(ps_registry_run_ended_token(reg, &stored, &found), 0);
  assert_int_equal(found, 1);
  assert_int_equal(stored, t2);
  ps_registry_free(reg);

  wait_until(NULL, lapsed, NULL, "the lease's lapse");
  assert_int_equal(ps_lease_take(&f->b, redis, f->holder, sizeof f->holder), 1);
  uint64_t t3 = f->b.token;
  assert_true(t3 > t2);

  wait_until(NULL, clock_past, &t3, "the clock past the last token");
  redis_ok(redis, "FLUSHALL");
  assert_int_equal(ps_lease_take(&f->a, redis, f->holder, sizeof f->holder), 1);
  uint64_t t4 = f->a.token;
  assert_true(t4 > t3);

  /* Tokens handed out faster than the clock runs: the key is ahead. */
  assert_int_equal(ps_lease_release(&f->a, redis), 1);
  redis_ok(redis, "SET {test}:epoch:chief:0 %" PRIu64, t4 + 1000000);
  assert_int_equal(ps_lease_take(&f->b, redis, f->holder, sizeof f->holder), 1);
  assert_int_equal(f->b.token, t4 + 1000001);
}

/* The checkpoint commit's fence passes while the lease is ours, and
 * fails naming the holder once another chief holds it. */
static void test_fence_check(void **state) {
  fx *f = *state;
  assert_int_equal(ps_lease_take(&f->a, redis, f->holder, sizeof f->holder), 1);
  ps_lease_fence fence = {.lease = &f->a, .reg = ps_registry_new(&f->cfg, "chief", 0)};
  assert_non_null(fence.reg);
  char why[512] = "";
  assert_int_equal(ps_lease_fence_check(&fence, why, sizeof why), 0);
  assert_int_equal(ps_lease_release(&f->a, redis), 1);
  assert_int_equal(ps_lease_take(&f->b, redis, f->holder, sizeof f->holder), 1);
  assert_int_equal(ps_lease_fence_check(&fence, why, sizeof why), -1);
  assert_non_null(strstr(why, "no longer holds the lease"));
  assert_non_null(strstr(why, f->b.value));
  ps_registry_free(fence.reg);
}

/* INFO commandstats' EVAL calls: the keeper's renewals. */
static long long evals(void) {
  char info[8192];
  redis_str(redis, info, sizeof info, "INFO commandstats");
  const char *p = strstr(info, "cmdstat_eval:calls=");
  return p != NULL ? atoll(p + strlen("cmdstat_eval:calls=")) : 0;
}
static int renewed4(void *arg) { return evals() >= *(long long *)arg + 4; }
static int keeper_lost(void *arg) {
  fx *f = arg;
  char why[512];
  return ps_lease_keeper_check(&f->keeper, why, sizeof why) != 0;
}

/* The keeper renews the lease past its time to live (four renewals, a
 * third of it apart), holding it with the same token. */
static void test_keeper_renews(void **state) {
  fx *f = *state;
  assert_int_equal(ps_lease_take(&f->a, redis, f->holder, sizeof f->holder), 1);
  redis_ok(redis, "CONFIG RESETSTAT");
  long long base = 0;
  assert_int_equal(ps_lease_keeper_start(&f->keeper, &f->cfg, &f->a), 0);
  wait_until(NULL, renewed4, &base, "four renewals");
  char why[512] = "";
  assert_int_equal(ps_lease_keeper_check(&f->keeper, why, sizeof why), 0);
  assert_int_equal(ps_lease_check(&f->a, redis, f->holder, sizeof f->holder), 1);
}

/* Redis loses the lease key (a DEL, or FLUSHALL: the epoch key too): the
 * keeper's renewal takes it again with a new token, gives that back, and
 * reports the lease lost to Redis.  (Planted: a keeper that counted a
 * renewal with a new token as renewed never noticed, and this failed.) */
static void assert_loss_noticed(fx *f, const char *cmd) {
  assert_int_equal(ps_lease_take(&f->a, redis, f->holder, sizeof f->holder), 1);
  assert_int_equal(ps_lease_keeper_start(&f->keeper, &f->cfg, &f->a), 0);
  redis_ok(redis, cmd);
  wait_until(NULL, keeper_lost, f, "the keeper noticing the loss");
  char why[512] = "";
  assert_int_equal(ps_lease_keeper_check(&f->keeper, why, sizeof why), -1);
  /* "Redis lost it" when the renewal came within the time to live, as it
   * does unless this machine stalls the keeper's thread for longer. */
  assert_true(strstr(why, "Redis lost it") != NULL || strstr(why, "lapsed") != NULL);
  assert_non_null(strstr(why, LEASE));
  ps_lease_keeper_stop(&f->keeper);
  assert_int_equal(redis_int(redis, "EXISTS " LEASE), 0);  /* given back */
}
static void test_keeper_notices_del(void **state) {
  assert_loss_noticed(*state, "DEL " LEASE);
}
static void test_keeper_notices_flushall(void **state) {
  assert_loss_noticed(*state, "FLUSHALL");
}

/* Another chief holds the lease (here written over it): the keeper's next
 * renewal is refused and it reports the lease lost, naming the holder. */
static void test_keeper_loses_to_another(void **state) {
  fx *f = *state;
  assert_int_equal(ps_lease_take(&f->a, redis, f->holder, sizeof f->holder), 1);
  assert_int_equal(ps_lease_keeper_start(&f->keeper, &f->cfg, &f->a), 0);
  redis_ok(redis, "SET " LEASE " %s PX 10000", "token 999 host other pid 1");
  wait_until(NULL, keeper_lost, f, "the keeper noticing another holder");
  char why[512] = "";
  assert_int_equal(ps_lease_keeper_check(&f->keeper, why, sizeof why), -1);
  assert_non_null(strstr(why, "to another chief (token 999 host other pid 1)"));
}

/* Redis refuses the renewals (an ACL without the lease's keys) for 2.4 s
 * of a 3 s lease, starting just after a renewal: renewals a third of the
 * lease apart would try at 1 s and 2 s, both refused, and next at 3 s,
 * when the lease has run out.  Retrying every 100 ms after a refusal, the
 * keeper renews it as soon as Redis takes writes again, with the same
 * token.  (Planted: without the quick retry this failed, "lapsed".) */
static int lease_renewed_again(void *arg) {
  (void)arg;
  return redis_int(redis, "PTTL " LEASE) > 2700;
}
static void test_keeper_rides_out_refusals(void **state) {
  fx *f = *state;
  f->cfg.chief_lease_ms = 3000;
  ps_lease_init(&f->a, f->cfg.cluster_id, f->cfg.chief_lease_ms);
  assert_int_equal(ps_lease_take(&f->a, redis, f->holder, sizeof f->holder), 1);
  uint64_t token = f->a.token;
  assert_int_equal(ps_lease_keeper_start(&f->keeper, &f->cfg, &f->a), 0);
  redis_ok(redis, "ACL SETUSER default resetkeys ~{other}:*");
  usleep(2400 * 1000);  /* the refusal's length: the fault, not a wait */
  redis_ok(redis, "ACL SETUSER default allkeys");
  wait_until(NULL, lease_renewed_again, NULL, "the renewal after the refusal");
  char why[512] = "";
  int rc = ps_lease_keeper_check(&f->keeper, why, sizeof why);
  if (rc != 0)
    fail_msg("the keeper lost the lease over a 2.4 s refusal: %s", why);
  char v[256], want[256];
  snprintf(want, sizeof want, "token %" PRIu64 " %s", token, f->a.who);
  assert_true(redis_str(redis, v, sizeof v, "GET " LEASE));
  assert_string_equal(v, want);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_one_holder, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tokens_grow, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fence_check, setup, teardown),
      cmocka_unit_test_setup_teardown(test_keeper_renews, setup, teardown),
      cmocka_unit_test_setup_teardown(test_keeper_notices_del, setup, teardown),
      cmocka_unit_test_setup_teardown(test_keeper_notices_flushall, setup, teardown),
      cmocka_unit_test_setup_teardown(test_keeper_loses_to_another, setup, teardown),
      cmocka_unit_test_setup_teardown(test_keeper_rides_out_refusals, setup, teardown),
  };
  return cmocka_run_group_tests(tests, redis_group_setup, redis_group_teardown);
}
