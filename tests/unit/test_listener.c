/* Tests of the listener (src/net/listener.h) on real sockets: the
 * connection limit (the oldest unauthenticated connection makes room; with
 * every connection authenticated a newcomer waits), and accepting while
 * descriptors are short: it pauses instead of spinning, and resumes.
 *
 * Short of descriptors, libuv first tries its own trick (it frees a
 * descriptor it keeps in reserve, accepts and closes what waits, and takes
 * the reserve back); it calls back with EMFILE only when another thread
 * took that reserve in between, and then again at once for every accept
 * until something changes.  The tests take libuv's reserve away (a
 * private field of the loop) to be in that case every time. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cmocka.h>

#include "net/conn.h"
#include "net/listener.h"

#define MAXC 64

static uv_loop_t loop;
static ps_listener lis;
static int port, accepted, closes, authenticate_first;
static ps_conn *conns[MAXC];
static int clients[MAXC], nclients;
static int fills[1024], nfills;
static struct rlimit saved;

static void on_frame(ps_conn *c, const ps_frame_header *h, const uint8_t *p) {
  (void)c, (void)h, (void)p;
}

static void on_close(ps_conn *c, int err, const char *why) {
  (void)err, (void)why;
  closes++;
  for (int i = 0; i < MAXC; i++)
    if (conns[i] == c)
      conns[i] = NULL;
}

static const ps_conn_cbs conn_cbs = {.on_frame = on_frame, .on_close = on_close};

static ps_conn *make(ps_listener *l) { return ps_conn_new(l->loop, &conn_cbs, NULL); }

static void on_accepted(ps_listener *l, ps_conn *c) {
  (void)l;
  if (accepted < MAXC)
    conns[accepted] = c;
  if (++accepted <= authenticate_first)
    ps_conn_handshake_done(c, 4096);
}

static const ps_listener_cbs lcbs = {.make = make, .accepted = on_accepted};

static void on_stop(uv_timer_t *t) { uv_stop(t->loop); }

/* Run the loop for `ms` milliseconds. */
static void run_ms(unsigned ms) {
  uv_timer_t t;
  uv_timer_init(&loop, &t);
  uv_timer_start(&t, on_stop, ms, 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
}

/* Run until `*v` reaches `want`, 5 s at most. */
static void run_until(const int *v, int want) {
  for (int i = 0; i < 100 && *v < want; i++)
    run_ms(50);
}

static int dial(void) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(s >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof a), 0);
  clients[nclients++] = s;
  return s;
}

/* The server closed client socket s (it reads end of file). */
static int closed_by_server(int s) {
  char b[64];
  ssize_t n = recv(s, b, sizeof b, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

/* Take every descriptor left; `fill_free` gives them back. */
static void fill(void) {
  int fd;
  while (nfills < 1024 && (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
    fills[nfills++] = fd;
  assert_int_equal(errno, EMFILE);
}

static void fill_free(void) {
  while (nfills > 0)
    close(fills[--nfills]);
}

/* libuv's reserve descriptor, gone as if another thread had taken it. */
static void take_libuv_reserve(void) {
  if (loop.emfile_fd >= 0)
    close(loop.emfile_fd);
  loop.emfile_fd = -1;
}

static int setup(void **state) {
  (void)state;
  accepted = closes = authenticate_first = nclients = nfills = 0;
  memset(conns, 0, sizeof conns);
  /* Few descriptors, so that taking them all is quick. */
  getrlimit(RLIMIT_NOFILE, &saved);
  struct rlimit low = saved;
  low.rlim_cur = 256;
  if (setrlimit(RLIMIT_NOFILE, &low) != 0 || uv_loop_init(&loop) != 0)
    return -1;
  ps_addr a = {.host = "127.0.0.1", .port = 0};
  if (ps_listener_start(&lis, &loop, &a, 16, 5000, &lcbs, NULL) != 0)
    return -1;
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getsockname(&lis.tcp, (struct sockaddr *)&ss, &len) != 0)
    return -1;
  port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  fill_free();
  for (int i = 0; i < MAXC; i++)
    if (conns[i] != NULL)
      ps_conn_close(conns[i]);
  ps_listener_close(&lis);
  uv_run(&loop, UV_RUN_DEFAULT);
  int rc = uv_loop_close(&loop);
  for (int i = 0; i < nclients; i++)
    close(clients[i]);
  setrlimit(RLIMIT_NOFILE, &saved);
  return rc == 0 ? 0 : -1;
}

/* 16 open, 4 more: the 4 oldest (unauthenticated) are closed for them. */
static void test_cap_closes_the_oldest_unauthenticated(void **state) {
  (void)state;
  assert_int_equal(lis.cap, 16);
  for (int i = 0; i < 16; i++)
    dial();
  run_until(&accepted, 16);
  assert_int_equal(accepted, 16);
  assert_int_equal(closes, 0);
  for (int i = 0; i < 4; i++)
    dial();
  run_until(&accepted, 20);
  run_until(&closes, 4);
  assert_int_equal(accepted, 20);
  assert_int_equal(closes, 4);
  assert_int_equal(lis.open, 16);
  for (int i = 0; i < 20; i++)
    assert_int_equal(closed_by_server(clients[i]), i < 4);
}

/* Every connection authenticated: a newcomer waits until one closes. */
static void test_cap_all_authenticated_waits(void **state) {
  (void)state;
  authenticate_first = 16;
  for (int i = 0; i < 17; i++)
    dial();
  run_until(&accepted, 16);
  run_ms(200);
  assert_int_equal(accepted, 16);
  assert_int_equal(closes, 0);
  assert_int_equal(lis.pending, 1);
  ps_conn_close(conns[0]);
  run_until(&accepted, 17);
  assert_int_equal(accepted, 17);
  assert_int_equal(lis.open, 16);
}

/* Out of descriptors: one failed accept, then a pause (no spin: libuv
 * would call back for every accept), then accepting again once there
 * are descriptors. */
static void test_short_of_descriptors_pauses(void **state) {
  (void)state;
  for (int i = 0; i < 3; i++)
    dial();
  take_libuv_reserve();
  fill();
  run_ms(300);
  assert_int_equal(accepted, 0);
  assert_int_equal(lis.paused, 2);
  assert_int_equal(lis.pending, 1);
  assert_true(lis.short_of <= 1);  /* the first was reported at once */
  fill_free();
  run_until(&accepted, 3);
  assert_int_equal(accepted, 3);
  assert_true(lis.reserve_fd >= 0);
  assert_int_equal(lis.paused, 0);
}

/* Out of descriptors with the reserve gone too and no connection to
 * close: the listening socket closes, and listens again after the pause
 * on the same port. */
static void test_nothing_to_free_listens_again(void **state) {
  (void)state;
  dial();
  take_libuv_reserve();
  close(lis.reserve_fd);
  lis.reserve_fd = -1;
  fill();
  run_ms(300);
  assert_int_equal(accepted, 0);
  assert_int_equal(lis.tcp_state, 2);  /* closed */
  fill_free();
  run_ms(PS_LISTENER_PAUSE_MS + 300);
  assert_int_equal(lis.tcp_state, 0);  /* listening again */
  dial();
  run_until(&accepted, 1);
  assert_int_equal(accepted, 1);
}

int main(void) {
  /* A listener that spins never returns from uv_run: fail, not hang. */
  alarm(60);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cap_closes_the_oldest_unauthenticated, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cap_all_authenticated_waits, setup, teardown),
      cmocka_unit_test_setup_teardown(test_short_of_descriptors_pauses, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nothing_to_free_listens_again, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
