/* Reports to systemd through sd_notify: readiness, status, stopping, and
 * the watchdog's keep-alive, rate-limited so that it can be called often;
 * and the receiving end, for a supervisor that reads its children's. */
#define _GNU_SOURCE /* struct ucred */
#include "common/notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "common/timeutil.h"

/* The watchdog interval in microseconds: -1 not read yet, 0 none. */
static _Atomic int64_t watchdog_usec = -1;
/* ps_now_ns() of the last WATCHDOG=1 sent (0: none yet). */
static _Atomic uint64_t watchdog_last_ns;

static int under_systemd(void) { return getenv("NOTIFY_SOCKET") != NULL; }

/* Format the status text on one line: sd_notify's fields are separated by
 * newlines, so a newline inside the text would start a bogus field. */
static void format_status(char *buf, size_t cap, const char *fmt, va_list ap) {
  vsnprintf(buf, cap, fmt, ap);
  for (char *p = buf; *p != '\0'; p++)
    if (*p == '\n' || *p == '\r')
      *p = ' ';
}

/* "<head>STATUS=<text>" */
static void notify_status(const char *head, const char *fmt, va_list ap) {
  if (!under_systemd())
    return;
  char text[512];
  format_status(text, sizeof text, fmt, ap);
  sd_notifyf(0, "%sSTATUS=%s", head, text);
}

void ps_notify_ready(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  notify_status("READY=1\n", fmt, ap);
  va_end(ap);
}

void ps_notify_done(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  notify_status("READY=1\nSTOPPING=1\n", fmt, ap);
  va_end(ap);
}

void ps_notify_status(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  notify_status("", fmt, ap);
  va_end(ap);
}

void ps_notify_stopping(void) {
  if (under_systemd())
    sd_notify(0, "STOPPING=1");
}

static int64_t watchdog_interval(void) {
  int64_t usec = atomic_load_explicit(&watchdog_usec, memory_order_relaxed);
  if (usec < 0) {
    /* sd_watchdog_enabled also checks WATCHDOG_PID against our pid, so a
     * child that inherited the environment sends nothing. */
    uint64_t u = 0;
    usec = under_systemd() && sd_watchdog_enabled(0, &u) > 0 && u > 0 ? (int64_t)u : 0;
    atomic_store_explicit(&watchdog_usec, usec, memory_order_relaxed);
  }
  return usec;
}

static void watchdog_send(uint64_t now) {
  atomic_store_explicit(&watchdog_last_ns, now, memory_order_relaxed);
  sd_notify(0, "WATCHDOG=1");
}

void ps_notify_watchdog(void) {
  int64_t usec = watchdog_interval();
  if (usec == 0)
    return;
  uint64_t now = ps_now_ns();
  uint64_t last = atomic_load_explicit(&watchdog_last_ns, memory_order_relaxed);
  if (last != 0 && now - last < (uint64_t)usec * 1000 / 4)
    return;
  /* Two threads may both pass the check; only the one that moves the
   * stamp sends, so the limit holds across threads too. */
  if (atomic_compare_exchange_strong(&watchdog_last_ns, &last, now))
    sd_notify(0, "WATCHDOG=1");
}

static void on_watchdog_timer(uv_timer_t *t) {
  (void)t;
  watchdog_send(ps_now_ns());
}

int ps_notify_watchdog_start(uv_loop_t *loop, uv_timer_t *timer) {
  int64_t usec = watchdog_interval();
  if (usec == 0)
    return 0;
  uint64_t ms = (uint64_t)usec / 2000;
  if (ms == 0)
    ms = 1;
  uv_timer_init(loop, timer);
  uv_timer_start(timer, on_watchdog_timer, ms, ms);
  uv_unref((uv_handle_t *)timer);
  return 1;
}

int ps_notify_listen(const char *name) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  size_t n = strlen(name);
  if (n == 0 || n >= sizeof a.sun_path)
    return -ENAMETOOLONG;
  memcpy(a.sun_path + 1, name, n); /* sun_path[0] == '\0': abstract */
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0 ||
      bind(fd, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

/* The fields of one datagram: "KEY=VALUE" lines. */
static void parse_msg(const char *buf, size_t n, ps_notify_msg *m) {
  for (size_t at = 0; at < n;) {
    const char *line = buf + at, *nl = memchr(line, '\n', n - at);
    size_t len = nl != NULL ? (size_t)(nl - line) : n - at;
    if (len == 7 && memcmp(line, "READY=1", 7) == 0)
      m->ready = 1;
    else if (len == 10 && memcmp(line, "STOPPING=1", 10) == 0)
      m->stopping = 1;
    else if (len >= 7 && memcmp(line, "STATUS=", 7) == 0) {
      m->has_status = 1;
      snprintf(m->status, sizeof m->status, "%.*s", (int)(len - 7), line + 7);
    }
    at += len + 1;
  }
}

int ps_notify_recv(int fd, ps_notify_msg *m) {
  char buf[4096];
  union {
    struct cmsghdr h;
    char space[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(16 * sizeof(int))];
  } ctl;
  struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl,
                      .msg_controllen = sizeof ctl};
  ssize_t n;
  do
    n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
  memset(m, 0, sizeof *m);
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET)
      continue;
    if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len == CMSG_LEN(sizeof(struct ucred))) {
      struct ucred u;
      memcpy(&u, CMSG_DATA(c), sizeof u);
      m->pid = (long)u.pid;
    } else if (c->cmsg_type == SCM_RIGHTS) {
      /* Nothing here keeps descriptors (systemd's FDSTORE=1). */
      size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < nfd; i++) {
        int passed;
        memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof passed);
        close(passed);
      }
    }
  }
  parse_msg(buf, (size_t)n, m);
  return 1;
}

void ps__notify_reset(void) {
  atomic_store(&watchdog_usec, -1);
  atomic_store(&watchdog_last_ns, 0);
}
