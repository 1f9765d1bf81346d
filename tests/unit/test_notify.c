/* Tests of the sd_notify wrapper against a real AF_UNIX datagram socket
 * standing in for systemd's NOTIFY_SOCKET. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tmpdir.h"

#include "common/notify.h"

/* ------------------------------------------------------------------------ */
/* Fixtures: a bound datagram socket and NOTIFY_SOCKET naming it             */
/* ------------------------------------------------------------------------ */

static int sock = -1;

static int setup(void **state) {
  (void)state;
  if (tmpdir_create("test_notify") != 0)
    return -1;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  const char *path = at("notify");
  if (strlen(path) >= sizeof a.sun_path)
    return -1;
  memcpy(a.sun_path, path, strlen(path) + 1);
  sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0 || bind(sock, (struct sockaddr *)&a, sizeof a) != 0)
    return -1;
  setenv("NOTIFY_SOCKET", a.sun_path, 1);
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  ps__notify_reset();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  ps__notify_reset();
  close(sock);
  sock = -1;
  return tmpdir_remove();
}

/* The next datagram already queued, as a string; NULL when none is.
 * sd_notify's sendmsg has returned before we look, so no wait is needed. */
static const char *next_msg(void) {
  static char buf[1024];
  ssize_t n = recv(sock, buf, sizeof buf - 1, MSG_DONTWAIT);
  if (n < 0)
    return NULL;
  buf[n] = '\0';
  return buf;
}

static int count_msgs(const char *expected) {
  int n = 0;
  const char *m;
  while ((m = next_msg()) != NULL) {
    assert_string_equal(m, expected);
    n++;
  }
  return n;
}

static void set_watchdog(const char *usec, long pid) {
  char p[32];
  snprintf(p, sizeof p, "%ld", pid);
  setenv("WATCHDOG_USEC", usec, 1);
  setenv("WATCHDOG_PID", p, 1);
  ps__notify_reset();
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* ------------------------------------------------------------------------ */
/* READY, STATUS, STOPPING                                                   */
/* ------------------------------------------------------------------------ */

static void test_ready(void **state) {
  (void)state;
  ps_notify_ready("shard %d: version %d\nlistening", 1, 42);
  const char *m = next_msg();
  assert_non_null(m);
  /* The newline inside the text must not start a field of its own. */
  assert_string_equal(m, "READY=1\nSTATUS=shard 1: version 42 listening");
  assert_null(next_msg());
}

static void test_status_stopping(void **state) {
  (void)state;
  ps_notify_status("waiting for Redis %s", "127.0.0.1:6379");
  const char *m = next_msg();
  assert_non_null(m);
  assert_string_equal(m, "STATUS=waiting for Redis 127.0.0.1:6379");
  ps_notify_stopping();
  m = next_msg();
  assert_non_null(m);
  assert_string_equal(m, "STOPPING=1");
  assert_null(next_msg());
}

/* ------------------------------------------------------------------------ */
/* WATCHDOG                                                                  */
/* ------------------------------------------------------------------------ */

static void test_watchdog_rate(void **state) {
  (void)state;
  /* 60 s: a quarter is 15 s, far longer than this loop. */
  set_watchdog("60000000", (long)getpid());
  for (int i = 0; i < 10000; i++)
    ps_notify_watchdog();
  assert_int_equal(count_msgs("WATCHDOG=1"), 1);

  /* 20 ms: a quarter is 5 ms, so a call 8 ms later sends again. */
  set_watchdog("20000", (long)getpid());
  ps_notify_watchdog();
  assert_int_equal(count_msgs("WATCHDOG=1"), 1);
  sleep_ms(8);
  ps_notify_watchdog();
  assert_int_equal(count_msgs("WATCHDOG=1"), 1);
}

static void test_watchdog_other_pid(void **state) {
  (void)state;
  /* The watchdog is another process's (a parent's environment leaked). */
  set_watchdog("60000000", (long)getpid() + 1);
  ps_notify_watchdog();
  assert_null(next_msg());
  uv_loop_t loop;
  uv_timer_t timer;
  memset(&timer, 0xab, sizeof timer);
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(ps_notify_watchdog_start(&loop, &timer), 0);
  /* Untouched: not initialized, so not in the loop either. */
  for (size_t i = 0; i < sizeof timer; i++)
    assert_int_equal(((unsigned char *)&timer)[i], 0xab);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static uv_timer_t watchdog_timer;
static int timer_msgs;
static uint64_t timer_started_ms;

/* Count the keep-alives every 5 ms; stop at 3, or after 5 s. */
static void on_poll(uv_timer_t *t) {
  timer_msgs += count_msgs("WATCHDOG=1");
  if (timer_msgs >= 3 || uv_now(t->loop) - timer_started_ms > 5000) {
    uv_close((uv_handle_t *)&watchdog_timer, NULL);
    uv_close((uv_handle_t *)t, NULL);
  }
}

static void test_watchdog_timer(void **state) {
  (void)state;
  /* 40 ms: the timer fires every 20 ms. */
  set_watchdog("40000", (long)getpid());
  uv_loop_t loop;
  uv_timer_t poll;
  assert_int_equal(uv_loop_init(&loop), 0);
  timer_msgs = 0;
  timer_started_ms = uv_now(&loop);
  assert_int_equal(ps_notify_watchdog_start(&loop, &watchdog_timer), 1);
  assert_int_equal(uv_timer_init(&loop, &poll), 0);
  assert_int_equal(uv_timer_start(&poll, on_poll, 5, 5), 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  uint64_t elapsed = uv_now(&loop) - timer_started_ms;
  assert_int_equal(timer_msgs, 3);
  /* Every half interval, never faster: the third tick comes at 60 ms. */
  assert_true(elapsed >= 60);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_watchdog_timer_unref(void **state) {
  (void)state;
  /* The watchdog's timer alone does not keep a loop running. */
  set_watchdog("40000", (long)getpid());
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(ps_notify_watchdog_start(&loop, &watchdog_timer), 1);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  uv_close((uv_handle_t *)&watchdog_timer, NULL);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  assert_null(next_msg());
}

/* ------------------------------------------------------------------------ */
/* Without systemd                                                           */
/* ------------------------------------------------------------------------ */

static void test_no_notify_socket(void **state) {
  (void)state;
  set_watchdog("40000", (long)getpid());
  unsetenv("NOTIFY_SOCKET");
  ps__notify_reset();
  ps_notify_ready("ready");
  ps_notify_status("status");
  ps_notify_stopping();
  ps_notify_watchdog();
  uv_loop_t loop;
  uv_timer_t timer;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(ps_notify_watchdog_start(&loop, &timer), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  assert_null(next_msg());
}

/* ------------------------------------------------------------------------ */
/* The receiving end (paramserv local's supervisor)                          */
/* ------------------------------------------------------------------------ */

static void test_listen_recv(void **state) {
  (void)state;
  char name[64], addr[80];
  snprintf(name, sizeof name, "paramserv-test/%ld/notify", (long)getpid());
  int fd = ps_notify_listen(name);
  assert_true(fd >= 0);
  /* One name, one socket. */
  assert_int_equal(ps_notify_listen(name), -EADDRINUSE);
  snprintf(addr, sizeof addr, "@%s", name);
  setenv("NOTIFY_SOCKET", addr, 1);
  ps_notify_msg m;
  assert_int_equal(ps_notify_recv(fd, &m), 0);

  ps_notify_status("shard %d waiting for the chief", 1);
  ps_notify_ready("shard %d serving\nat version %d", 1, 7);
  ps_notify_stopping();
  ps_notify_done("the run has ended");
  assert_int_equal(ps_notify_recv(fd, &m), 1);
  assert_int_equal(m.pid, (long)getpid());
  assert_false(m.ready);
  assert_true(m.has_status);
  assert_string_equal(m.status, "shard 1 waiting for the chief");
  assert_int_equal(ps_notify_recv(fd, &m), 1);
  assert_true(m.ready);
  assert_false(m.stopping);
  assert_string_equal(m.status, "shard 1 serving at version 7");
  assert_int_equal(ps_notify_recv(fd, &m), 1);
  assert_true(m.stopping);
  assert_false(m.ready);
  assert_false(m.has_status);
  assert_int_equal(ps_notify_recv(fd, &m), 1);
  assert_true(m.ready && m.stopping && m.has_status);
  assert_string_equal(m.status, "the run has ended");
  assert_int_equal(ps_notify_recv(fd, &m), 0);

  /* The sender's pid comes from the kernel: a child's is its own, read
   * after it died (the datagram outlives its sender). */
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    ps_notify_ready("child");
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(child, &st, 0), child);
  assert_int_equal(ps_notify_recv(fd, &m), 1);
  assert_int_equal(m.pid, (long)child);
  assert_true(m.ready);
  assert_string_equal(m.status, "child");
  assert_int_equal(ps_notify_recv(fd, &m), 0);

  /* Closed, the name is free again. */
  close(fd);
  fd = ps_notify_listen(name);
  assert_true(fd >= 0);
  close(fd);
}

static void test_recv_fields(void **state) {
  (void)state;
  char name[64];
  snprintf(name, sizeof name, "paramserv-test/%ld/fields", (long)getpid());
  int fd = ps_notify_listen(name);
  assert_true(fd >= 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path + 1, name, strlen(name));
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
  int out = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_true(out >= 0);
  /* Fields it does not know, READY=0, and a STATUS= without a newline at
   * the end; the last STATUS= of a datagram counts. */
  static const char msg[] = "MAINPID=1\nREADY=0\nSTATUS=a\nWATCHDOG=1\nSTATUS=b c";
  assert_int_equal(sendto(out, msg, sizeof msg - 1, 0, (struct sockaddr *)&a, len),
                   (ssize_t)(sizeof msg - 1));
  ps_notify_msg m;
  assert_int_equal(ps_notify_recv(fd, &m), 1);
  assert_false(m.ready);
  assert_false(m.stopping);
  assert_string_equal(m.status, "b c");
  assert_int_equal(m.pid, (long)getpid());
  close(out);
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ready, setup, teardown),
      cmocka_unit_test_setup_teardown(test_status_stopping, setup, teardown),
      cmocka_unit_test_setup_teardown(test_watchdog_rate, setup, teardown),
      cmocka_unit_test_setup_teardown(test_watchdog_other_pid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_watchdog_timer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_watchdog_timer_unref, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_notify_socket, setup, teardown),
      cmocka_unit_test_setup_teardown(test_listen_recv, setup, teardown),
      cmocka_unit_test_setup_teardown(test_recv_fields, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
