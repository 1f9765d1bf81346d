/* src/ps/server.c: a shard server's life, phase by phase (server_internal.h,
 * src/ps/README.md "A server's life"), driven over real loopback TCP by
 * workers, the chief and a tool (tests/unit/shard_fixture.h: the server on
 * a thread of this process, replication off).  Checked: WAITING refuses
 * workers with the retry flag until the chief's LOAD, then serves the
 * loaded state; SERVING applies a push once and acknowledges it (again for
 * a duplicate); HELD keeps a push unanswered until RESUME; the chief's
 * STOP drains (held pushes applied, the workers told) and the process
 * exits 0; SIGTERM stops it too. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>

#include "shard_fixture.h"

#define SELF_INIT "[train]\noptimizer = sgd\nlr = 0.5\n[replication]\nself_init = yes\n"

/* A state of this cluster's shape for the chief to LOAD: values 0.001 k,
 * then `pushes` updates from worker 1 (version = pushes). */
static ps_shard *chief_state(int pushes) {
  ps_shard_opts so = ps_shard_opts_for(&fx.cfg, &fx.layout, 0);
  float *v = fx_gradient(0);
  for (size_t k = 0; k < fx.slice; k++)
    v[k] = 0.001f * (float)k;
  ps_shard *sh = ps_shard_new(&so, v);
  assert_non_null(sh);
  float *g = fx_gradient(0.25f);
  for (int i = 1; i <= pushes; i++)
    assert_int_equal(ps_shard_push(sh, 1, 9, (uint64_t)i, 0, g, NULL, 0, NULL), PS_SHARD_APPLIED);
  free(g);
  free(v);
  return sh;
}

/* WAITING: a worker is told to come back (ERROR with PS_ERROR_RETRY, not
 * a failure of its own) until the chief LOADs a state; then it is
 * welcomed at the loaded version and pulls exactly the loaded values.  A
 * wrong proof is refused for what it is even while waiting. */
static void test_waiting_until_loaded(void **state) {
  (void)state;
  fx_start(2, "");
  assert_false(fx.ready);
  assert_non_null(strstr(fx.status_text, "waiting for the chief"));

  peer *early = fx_dial(PS_ROLE_WORKER, 0, 1, 0);
  ps_msg_error e = fx_expect_refusal(early, -EAGAIN);
  assert_true(e.flags & PS_ERROR_RETRY);
  assert_non_null(strstr(e.message, "waiting for the chief"));
  peer *forger = fx_dial(PS_ROLE_WORKER, 1, 1, 1);
  e = fx_expect_refusal(forger, -EACCES);
  assert_false(e.flags & PS_ERROR_RETRY);
  peer *tool = fx_connect(PS_ROLE_TOOL, 0, 1);
  assert_false(fx_stats(tool).flags & PS_STATS_INITIALIZED);

  peer *chief = fx_connect(PS_ROLE_CHIEF, 0, 1);
  ps_shard *sh = chief_state(3);
  fx_load(chief, 1, sh);
  FX_WAIT(fx.ready, "READY=1 after the LOAD");
  ps_msg_stats_reply st = fx_stats(tool);
  assert_true(st.flags & PS_STATS_INITIALIZED);
  assert_int_equal(st.version, 3);

  peer *w = fx_connect(PS_ROLE_WORKER, 0, 2);
  assert_int_equal(w->welcome.version, 3);
  assert_int_equal(w->welcome.slice_floats, fx.slice);
  float *got = fx_gradient(0);
  assert_int_equal(fx_expect_pull(w, fx_pull(w, 3), got), 3);
  assert_memory_equal(got, ps_shard_values(sh), fx.slice * sizeof(float));
  free(got);
  ps_shard_free(sh);
}

/* SERVING: a push is applied (sgd: w -= 0.5 g) and acknowledged with the
 * new version, which shard 0 also counts as the global step; the same
 * (worker, incarnation, seq) again is acknowledged as a duplicate and
 * changes nothing.  A newer incarnation of the worker closes the older
 * one's connection. */
static void test_push_applied_and_acked(void **state) {
  (void)state;
  fx_start(2, SELF_INIT);
  assert_true(fx.ready);
  peer *w = fx_connect(PS_ROLE_WORKER, 0, 1);
  float *before = fx_gradient(0), *after = fx_gradient(0), *again = fx_gradient(0);
  float *g = fx_gradient(1.0f);
  assert_int_equal(fx_expect_pull(w, fx_pull(w, 0), before), 0);

  fx_push(w, 1, 0, g);
  ps_msg_push_ack a = fx_expect_ack(w, 1, PS_PUSH_APPLIED);
  assert_int_equal(a.version, 1);
  assert_int_equal(a.global_step, 1);
  assert_int_equal(fx_expect_pull(w, fx_pull(w, 1), after), 1);
  for (size_t k = 0; k < fx.slice; k++)
    assert_true(fabsf(after[k] - (before[k] - 0.5f)) < 1e-6f);

  fx_push(w, 1, 0, g);
  a = fx_expect_ack(w, 1, PS_PUSH_DUPLICATE);
  assert_int_equal(a.version, 1);
  assert_int_equal(fx_expect_pull(w, fx_pull(w, 1), again), 1);
  assert_memory_equal(again, after, fx.slice * sizeof(float));
  peer *tool = fx_connect(PS_ROLE_TOOL, 0, 1);
  ps_msg_stats_reply st = fx_stats(tool);
  assert_int_equal(st.pushes_applied, 1);
  assert_int_equal(st.pushes_duplicate, 1);

  peer *w2 = fx_connect(PS_ROLE_WORKER, 0, 2);
  assert_non_null(strstr(fx_expect_refusal(w, -ESTALE).message, "incarnation 2"));
  fx_nothing_pending(w2);
  free(before);
  free(after);
  free(again);
  free(g);
}

/* HELD: after the chief's CUT a push is neither applied nor answered (the
 * shard says PAUSED) until RESUME; then it is applied and acknowledged. */
static void test_cut_holds_pushes_until_resume(void **state) {
  (void)state;
  fx_start(2, SELF_INIT);
  peer *chief = fx_connect(PS_ROLE_CHIEF, 0, 1);
  peer *tool = fx_connect(PS_ROLE_TOOL, 0, 1);
  peer *w = fx_connect(PS_ROLE_WORKER, 0, 1);
  float *g = fx_gradient(1.0f);
  assert_int_equal(fx_cut(chief, 1, 1, 60000).version, 0);
  assert_true(fx_stats(tool).flags & PS_STATS_PAUSED);
  fx_push(w, 1, 0, g);
  fx_nothing_pending(w);
  assert_int_equal(fx_stats(tool).version, 0);

  fx_resume(chief, 1, 1);
  assert_int_equal(fx_expect_ack(w, 1, PS_PUSH_APPLIED).version, 1);
  ps_msg_stats_reply st = fx_stats(tool);
  assert_false(st.flags & PS_STATS_PAUSED);
  assert_int_equal(st.version, 1);
  free(g);
}

/* DRAINING: the chief's STOP during a cut answers the chief, tells each
 * worker STOP with the step, applies the held push and acknowledges it,
 * then the server closes its connections and exits 0 (STOPPING=1). */
static void test_stop_drains(void **state) {
  (void)state;
  fx_start(2, SELF_INIT);
  peer *chief = fx_connect(PS_ROLE_CHIEF, 0, 1);
  peer *w = fx_connect(PS_ROLE_WORKER, 0, 1);
  float *g = fx_gradient(1.0f);
  fx_cut(chief, 1, 1, 60000);
  fx_push(w, 1, 0, g);
  fx_nothing_pending(w);

  fx_stop_send(chief, 1, 7);
  assert_int_equal(fx_expect(chief, PS_MSG_PONG).u.ping.token, 7);
  assert_int_equal(fx_expect(w, PS_MSG_STOP).u.stop.step, 7);
  assert_int_equal(fx_expect_ack(w, 1, PS_PUSH_APPLIED).version, 1);
  assert_int_equal(fx_wait_exit(), 0);
  assert_true(fx.stopping);
  FX_WAIT(w->closed && chief->closed, "the server closing its connections");
  free(g);
}

/* A shard with no state that the chief STOPs has nothing to drain: it
 * answers and exits 0. */
static void test_stop_while_waiting(void **state) {
  (void)state;
  fx_start(2, "");
  peer *chief = fx_connect(PS_ROLE_CHIEF, 0, 1);
  fx_stop_send(chief, 1, 0);
  fx_expect(chief, PS_MSG_PONG);
  assert_int_equal(fx_wait_exit(), 0);
  assert_false(fx.ready);
}

/* STOPPING by SIGTERM, as systemd stops it: every connection closed,
 * exit 0. */
static void test_sigterm_stops(void **state) {
  (void)state;
  fx_start(2, SELF_INIT);
  peer *w = fx_connect(PS_ROLE_WORKER, 0, 1);
  fx_sigterm();
  assert_int_equal(fx_wait_exit(), 0);
  assert_true(fx.stopping);
  FX_WAIT(w->closed, "the server closing the worker's connection");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_waiting_until_loaded, fx_teardown),
      cmocka_unit_test_teardown(test_push_applied_and_acked, fx_teardown),
      cmocka_unit_test_teardown(test_cut_holds_pushes_until_resume, fx_teardown),
      cmocka_unit_test_teardown(test_stop_drains, fx_teardown),
      cmocka_unit_test_teardown(test_stop_while_waiting, fx_teardown),
      cmocka_unit_test_teardown(test_sigterm_stops, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
