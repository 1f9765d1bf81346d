/* src/ps/consistency.c: the consistency modes' rules as the server carries
 * them out, seen by workers over real loopback TCP (tests/unit/
 * shard_fixture.h: a real shard on a thread of this process, replication
 * off).  consistency.c decides, at each event the server hands it, whether
 * a PULL is answered now or held, and when a sync step is applied; what a
 * worker sees is the answer, or the PONG of a PING sent after the PULL
 * coming first (held).  Checked: async answers every pull at once and
 * applies every push; ssp holds a worker more than `staleness` ahead of
 * the slowest live one and lets it go when the slowest moves on or leaves;
 * sync applies the mean once every worker's gradient is in, holds pulls
 * for the next step until then, drops a gradient of a finished step as
 * stale, applies a step without a missing worker after sync_timeout_ms and
 * goes on with fewer per step until the worker is back. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>

#include "shard_fixture.h"

#define SERVE "[replication]\nself_init = yes\n[train]\noptimizer = sgd\nlr = 0.5\n"

/* async: a pull for any step is answered at the current version, and each
 * push is applied on arrival. */
static void test_async(void **state) {
  (void)state;
  fx_start(2, SERVE "consistency = async\n");
  peer *w0 = fx_connect(PS_ROLE_WORKER, 0, 1), *w1 = fx_connect(PS_ROLE_WORKER, 1, 1);
  float *g = fx_gradient(1.0f);
  assert_int_equal(fx_expect_pull(w0, fx_pull(w0, 100), NULL), 0);
  fx_push(w1, 1, 0, g);
  assert_int_equal(fx_expect_ack(w1, 1, PS_PUSH_APPLIED).version, 1);
  fx_push(w0, 1, 0, g);
  assert_int_equal(fx_expect_ack(w0, 1, PS_PUSH_APPLIED).version, 2);
  assert_int_equal(fx_expect_pull(w1, fx_pull(w1, 7), NULL), 2);
  free(g);
}

/* ssp, staleness 1: a worker's pull at clock c waits while c is more than
 * 1 ahead of the slowest connected worker's clock; it is answered when the
 * slowest pulls at a clock that brings it within the bound, or when the
 * slowest disconnects.  Pushes are applied on arrival. */
static void test_ssp_staleness_bound(void **state) {
  (void)state;
  fx_start(2, SERVE "consistency = ssp\nstaleness = 1\n");
  peer *fast = fx_connect(PS_ROLE_WORKER, 0, 1), *slow = fx_connect(PS_ROLE_WORKER, 1, 1);
  float *g = fx_gradient(1.0f);
  assert_int_equal(fx_expect_pull(fast, fx_pull(fast, 0), NULL), 0);
  assert_int_equal(fx_expect_pull(slow, fx_pull(slow, 0), NULL), 0);
  fx_push(fast, 1, 0, g);
  assert_int_equal(fx_expect_ack(fast, 1, PS_PUSH_APPLIED).version, 1);

  uint64_t held = fx_pull(fast, 2);  /* 2 > 0 + 1 */
  fx_nothing_pending(fast);
  assert_int_equal(fx_expect_pull(slow, fx_pull(slow, 1), NULL), 1);  /* its own: 1 <= 1 + 1 */
  assert_int_equal(fx_expect_pull(fast, held, NULL), 1);              /* now 2 <= 1 + 1 */

  held = fx_pull(fast, 3);  /* 3 > 1 + 1 */
  fx_nothing_pending(fast);
  ps_conn_close(slow->conn);
  FX_WAIT(slow->closed, "close");
  assert_int_equal(fx_expect_pull(fast, held, NULL), 1);  /* the slowest is gone */
  free(g);
}

/* sync, 2 workers: the first gradient of a step is acknowledged but not
 * applied; a pull for the next step waits; the second gradient applies
 * their mean (sgd, lr 0.5: w -= 0.5 * (1 + 3) / 2) and answers the held
 * pull.  A gradient computed at the finished step is STALE and dropped. */
static void test_sync_mean_of_every_worker(void **state) {
  (void)state;
  fx_start(2, SERVE "consistency = sync\n");
  peer *w0 = fx_connect(PS_ROLE_WORKER, 0, 1), *w1 = fx_connect(PS_ROLE_WORKER, 1, 1);
  float *g1 = fx_gradient(1.0f), *g3 = fx_gradient(3.0f);
  float *before = fx_gradient(0), *after = fx_gradient(0);
  assert_int_equal(fx_expect_pull(w0, fx_pull(w0, 0), before), 0);

  fx_push(w0, 1, 0, g1);
  assert_int_equal(fx_expect_ack(w0, 1, PS_PUSH_APPLIED).version, 0);
  uint64_t held = fx_pull(w0, 1);
  fx_nothing_pending(w0);
  fx_push(w1, 1, 0, g3);
  assert_int_equal(fx_expect_ack(w1, 1, PS_PUSH_APPLIED).version, 1);
  assert_int_equal(fx_expect_pull(w0, held, after), 1);
  for (size_t k = 0; k < fx.slice; k++)
    assert_true(fabsf(after[k] - (before[k] - 1.0f)) < 1e-6f);

  fx_push(w0, 2, 0, g1);
  assert_int_equal(fx_expect_ack(w0, 2, PS_PUSH_STALE).version, 1);
  peer *tool = fx_connect(PS_ROLE_TOOL, 0, 1);
  ps_msg_stats_reply st = fx_stats(tool);
  assert_int_equal(st.version, 1);
  assert_int_equal(st.pushes_stale, 1);
  free(g1);
  free(g3);
  free(before);
  free(after);
}

/* sync, 2 workers, worker 1 absent: the step with worker 0's gradient
 * alone is applied after sync_timeout_ms (its held pull answered), and
 * the next steps complete with one gradient, at once.  Worker 1's HELLO
 * brings the count back to 2: the step then waits for its gradient. */
static void test_sync_timeout_and_return(void **state) {
  (void)state;
  fx_start(2, SERVE "consistency = sync\nsync_timeout_ms = 100\n");
  peer *w0 = fx_connect(PS_ROLE_WORKER, 0, 1);
  float *g = fx_gradient(1.0f);
  fx_push(w0, 1, 0, g);
  assert_int_equal(fx_expect_ack(w0, 1, PS_PUSH_APPLIED).version, 0);
  uint64_t held = fx_pull(w0, 1);
  fx_nothing_pending(w0);
  assert_int_equal(fx_expect_pull(w0, held, NULL), 1);  /* the timeout applied it */
  fx_push(w0, 2, 1, g);
  assert_int_equal(fx_expect_ack(w0, 2, PS_PUSH_APPLIED).version, 2);  /* one is enough now */

  peer *w1 = fx_connect(PS_ROLE_WORKER, 1, 1);
  fx_push(w0, 3, 2, g);
  assert_int_equal(fx_expect_ack(w0, 3, PS_PUSH_APPLIED).version, 2);  /* waits for worker 1 */
  fx_push(w1, 1, 2, g);
  assert_int_equal(fx_expect_ack(w1, 1, PS_PUSH_APPLIED).version, 3);
  free(g);
}

/* sync, 3 workers, 1 and 2 absent: after the timeout a step takes one
 * gradient, the push that brings worker 1 back included.  Steps then wait
 * for 3 again, but with worker 2 still missing the step that has worker
 * 0's and 1's gradients is applied as soon as it has them (a STATS right
 * after the ack sees it), without waiting out another timeout. */
static void test_sync_early_with_one_still_missing(void **state) {
  (void)state;
  fx_start(3, SERVE "consistency = sync\nsync_timeout_ms = 300\n");
  peer *w0 = fx_connect(PS_ROLE_WORKER, 0, 1), *w1 = fx_connect(PS_ROLE_WORKER, 1, 1);
  peer *tool = fx_connect(PS_ROLE_TOOL, 0, 1);
  float *g = fx_gradient(1.0f);
  fx_push(w0, 1, 0, g);
  fx_expect_ack(w0, 1, PS_PUSH_APPLIED);
  assert_int_equal(fx_expect_pull(w0, fx_pull(w0, 1), NULL), 1);  /* after the timeout */
  fx_push(w1, 1, 1, g);
  assert_int_equal(fx_expect_ack(w1, 1, PS_PUSH_APPLIED).version, 2);  /* one was enough */

  fx_push(w0, 2, 2, g);
  assert_int_equal(fx_expect_ack(w0, 2, PS_PUSH_APPLIED).version, 2);  /* waits for worker 1 */
  fx_push(w1, 2, 2, g);
  fx_expect_ack(w1, 2, PS_PUSH_APPLIED);
  assert_int_equal(fx_stats(tool).version, 3);
  free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_async, fx_teardown),
      cmocka_unit_test_teardown(test_ssp_staleness_bound, fx_teardown),
      cmocka_unit_test_teardown(test_sync_mean_of_every_worker, fx_teardown),
      cmocka_unit_test_teardown(test_sync_timeout_and_return, fx_teardown),
      cmocka_unit_test_teardown(test_sync_early_with_one_still_missing, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
