/* src/ps/control.c: what the shard server adds to the state service's CUT,
 * FETCH, RESUME and LOAD (whose copies, fence arithmetic and LOAD pieces
 * test_state_service.c checks): only the chief may send them; a fenced
 * chief's frame is refused before it can touch the held pushes or stop
 * the shard; the pushes held during a cut are applied in arrival order at
 * the RESUME of the newest cut, or by themselves when the hold runs out,
 * and a held push whose worker went away is dropped; nothing may CUT
 * after the chief's STOP.  Through a real shard over loopback TCP
 * (tests/unit/shard_fixture.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "shard_fixture.h"

#define SERVE "[replication]\nself_init = yes\n[train]\noptimizer = sgd\nlr = 0.5\n"
#define HOLD_MS 60000  /* longer than any test: only RESUME ends it */

/* A worker's CUT and a tool's STOP are refused (PS_EFORMAT, closed); the
 * shard goes on serving, not held, not stopping. */
static void test_only_the_chief(void **state) {
  (void)state;
  fx_start(2, SERVE);
  peer *w = fx_connect(PS_ROLE_WORKER, 0, 1), *tool = fx_connect(PS_ROLE_TOOL, 0, 1);
  ps_msg m = {.type = PS_MSG_CUT, .u.cut = {.fence = 1, .cut_id = 1, .hold_ms = HOLD_MS}};
  fx_send(w, &m);
  assert_non_null(strstr(fx_expect_refusal(w, PS_EFORMAT).message, "only the chief"));
  fx_stop_send(tool, 1, 0);
  assert_non_null(strstr(fx_expect_refusal(tool, PS_EFORMAT).message, "only the chief"));

  peer *w1 = fx_connect(PS_ROLE_WORKER, 1, 1);
  float *g = fx_gradient(1.0f);
  fx_push(w1, 1, 0, g);
  assert_int_equal(fx_expect_ack(w1, 1, PS_PUSH_APPLIED).version, 1);
  fx_on_notify(NULL, 0, 0);
  assert_false(fx.stopping);
  free(g);
}

/* Chief 7 cuts; a chief with token 6 cannot RESUME (PS_EFENCED, closed)
 * and the push stays held.  A chief with token 8 resumes it with a cut of
 * its own (a RESUME names its cut's token too), and from then on chief
 * 7's STOP is refused and the shard goes on. */
static void test_fenced_chief(void **state) {
  (void)state;
  fx_start(2, SERVE);
  peer *c7 = fx_connect(PS_ROLE_CHIEF, 0, 1), *c6 = fx_connect(PS_ROLE_CHIEF, 0, 2);
  peer *w = fx_connect(PS_ROLE_WORKER, 0, 1);
  float *g = fx_gradient(1.0f);
  fx_cut(c7, 7, 1, HOLD_MS);
  fx_push(w, 1, 0, g);
  fx_nothing_pending(w);

  fx_resume_send(c6, 6, 1);
  assert_non_null(strstr(fx_expect_refusal(c6, PS_EFENCED).message, "token 6"));
  fx_nothing_pending(w);

  peer *c8 = fx_connect(PS_ROLE_CHIEF, 0, 3);
  fx_resume(c8, 8, 1);  /* answered, but cut 1 is token 7's */
  fx_nothing_pending(w);
  fx_cut(c8, 8, 2, HOLD_MS);
  fx_resume(c8, 8, 2);
  assert_int_equal(fx_expect_ack(w, 1, PS_PUSH_APPLIED).version, 1);
  fx_stop_send(c7, 7, 0);
  fx_expect_refusal(c7, PS_EFENCED);
  fx_nothing_pending(w);
  fx_push(w, 2, 1, g);
  assert_int_equal(fx_expect_ack(w, 2, PS_PUSH_APPLIED).version, 2);
  free(g);
}

/* Pushes held by a cut are applied at RESUME in the order they came,
 * whichever worker sent them: each ack's version says where it went. */
static void test_held_in_arrival_order(void **state) {
  (void)state;
  fx_start(2, SERVE);
  peer *chief = fx_connect(PS_ROLE_CHIEF, 0, 1);
  peer *w0 = fx_connect(PS_ROLE_WORKER, 0, 1), *w1 = fx_connect(PS_ROLE_WORKER, 1, 1);
  float *g = fx_gradient(1.0f);
  fx_cut(chief, 1, 1, HOLD_MS);
  fx_push(w1, 1, 0, g);
  fx_nothing_pending(w1);  /* the shard has it before worker 0's */
  fx_push(w0, 1, 0, g);
  fx_nothing_pending(w0);
  fx_push(w1, 2, 0, g);
  fx_nothing_pending(w1);

  fx_resume(chief, 1, 1);
  assert_int_equal(fx_expect_ack(w1, 1, PS_PUSH_APPLIED).version, 1);
  assert_int_equal(fx_expect_ack(w0, 1, PS_PUSH_APPLIED).version, 2);
  assert_int_equal(fx_expect_ack(w1, 2, PS_PUSH_APPLIED).version, 3);
  free(g);
}

/* Only the RESUME of the newest cut lets pushes go: after CUT 1 and CUT 2
 * a RESUME of 1 is answered and changes nothing. */
static void test_resume_of_an_older_cut(void **state) {
  (void)state;
  fx_start(2, SERVE);
  peer *chief = fx_connect(PS_ROLE_CHIEF, 0, 1), *w = fx_connect(PS_ROLE_WORKER, 0, 1);
  float *g = fx_gradient(1.0f);
  fx_cut(chief, 1, 1, HOLD_MS);
  fx_cut(chief, 1, 2, HOLD_MS);
  fx_push(w, 1, 0, g);
  fx_nothing_pending(w);
  fx_resume(chief, 1, 1);
  fx_nothing_pending(w);
  fx_resume(chief, 1, 2);
  assert_int_equal(fx_expect_ack(w, 1, PS_PUSH_APPLIED).version, 1);
  free(g);
}

/* A cut whose RESUME does not come resumes by itself after its hold_ms:
 * the held push is applied and acknowledged, the shard no longer paused. */
static void test_hold_runs_out(void **state) {
  (void)state;
  fx_start(2, SERVE);
  peer *chief = fx_connect(PS_ROLE_CHIEF, 0, 1), *tool = fx_connect(PS_ROLE_TOOL, 0, 1);
  peer *w = fx_connect(PS_ROLE_WORKER, 0, 1);
  float *g = fx_gradient(1.0f);
  fx_cut(chief, 1, 1, 100);
  fx_push(w, 1, 0, g);
  assert_int_equal(fx_expect_ack(w, 1, PS_PUSH_APPLIED).version, 1);
  assert_false(fx_stats(tool).flags & PS_STATS_PAUSED);
  free(g);
}

/* A held push whose worker closed its connection is not applied at
 * RESUME (nobody would get its ack; the worker re-sends it elsewhere),
 * and the pushes after it still are. */
static void test_held_push_of_a_closed_worker(void **state) {
  (void)state;
  fx_start(2, SERVE);
  peer *chief = fx_connect(PS_ROLE_CHIEF, 0, 1), *tool = fx_connect(PS_ROLE_TOOL, 0, 1);
  peer *w0 = fx_connect(PS_ROLE_WORKER, 0, 1), *w1 = fx_connect(PS_ROLE_WORKER, 1, 1);
  float *g = fx_gradient(1.0f);
  fx_cut(chief, 1, 1, HOLD_MS);
  fx_push(w0, 1, 0, g);
  fx_nothing_pending(w0);
  fx_push(w1, 1, 0, g);
  fx_nothing_pending(w1);
  ps_conn_close(w0->conn);
  FX_WAIT(w0->closed, "close");
  /* Its EOF and the RESUME come on different connections: wait until the
   * shard counts 3 connections, so that the RESUME finds it closed. */
  uint64_t end = uv_now(&fx.loop) + FX_DEADLINE_MS;
  while (fx_stats(tool).clients != 3)
    assert_true(uv_now(&fx.loop) < end);

  fx_resume(chief, 1, 1);
  assert_int_equal(fx_expect_ack(w1, 1, PS_PUSH_APPLIED).version, 1);
  ps_msg_stats_reply st = fx_stats(tool);
  assert_int_equal(st.version, 1);
  assert_int_equal(st.pushes_applied, 1);
  free(g);
}

/* After the chief's STOP, a CUT is refused (PS_EFORMAT), and the shard
 * still exits 0. */
static void test_no_cut_after_stop(void **state) {
  (void)state;
  fx_start(2, SERVE);
  peer *chief = fx_connect(PS_ROLE_CHIEF, 0, 1);
  fx_stop_send(chief, 1, 5);
  ps_msg m = {.type = PS_MSG_CUT, .u.cut = {.fence = 1, .cut_id = 1, .hold_ms = HOLD_MS}};
  fx_send(chief, &m);
  assert_int_equal(fx_expect(chief, PS_MSG_PONG).u.ping.token, 5);
  assert_non_null(strstr(fx_expect_refusal(chief, PS_EFORMAT).message, "after the chief's STOP"));
  assert_int_equal(fx_wait_exit(), 0);
}

/* A second STOP while the shard drains (a chief restarted after its first,
 * or retrying) is answered with its PONG too, and the shard still exits 0. */
static void test_second_stop_answered(void **state) {
  (void)state;
  fx_start(2, SERVE);
  peer *chief = fx_connect(PS_ROLE_CHIEF, 0, 1);
  fx_stop_send(chief, 1, 5);
  fx_stop_send(chief, 1, 5);
  assert_int_equal(fx_expect(chief, PS_MSG_PONG).u.ping.token, 5);
  assert_int_equal(fx_expect(chief, PS_MSG_PONG).u.ping.token, 5);
  assert_int_equal(fx_wait_exit(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_only_the_chief, fx_teardown),
      cmocka_unit_test_teardown(test_fenced_chief, fx_teardown),
      cmocka_unit_test_teardown(test_held_in_arrival_order, fx_teardown),
      cmocka_unit_test_teardown(test_resume_of_an_older_cut, fx_teardown),
      cmocka_unit_test_teardown(test_hold_runs_out, fx_teardown),
      cmocka_unit_test_teardown(test_held_push_of_a_closed_worker, fx_teardown),
      cmocka_unit_test_teardown(test_no_cut_after_stop, fx_teardown),
      cmocka_unit_test_teardown(test_second_stop_answered, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
