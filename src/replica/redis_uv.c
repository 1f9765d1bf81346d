/* hiredis's async API on a libuv loop, with a deadline (see redis_uv.h). */
#include "replica/redis_uv.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "common/timeutil.h"

typedef struct uv_redis {
  redisAsyncContext *ac;
  uv_poll_t poll;
  uv_timer_t timer;
  int events;
  int closing;               /* handles closing: freed after both callbacks */
  int open_handles;
  uint64_t timeout_ns;
  uint64_t created_ns;
  uint64_t stuck_since_ns;   /* something waits and nothing was read since */
  uint64_t reads;            /* read events seen: Redis's progress */
  uint64_t reads_at_check;
  ps_redis_uv_timeout_fn on_timeout;
  void *owner;
} uv_redis;

static void on_poll(uv_poll_t *h, int status, int events) {
  uv_redis *p = h->data;
  if (p->ac == NULL)
    return;
  if (status < 0 || (events & UV_DISCONNECT)) {
    redisAsyncHandleRead(p->ac);
    return;
  }
  if (events & UV_READABLE) {
    p->reads++;
    redisAsyncHandleRead(p->ac);
  }
  /* Writes are not progress: the kernel takes them while Redis sleeps. */
  if (p->ac != NULL && (events & UV_WRITABLE))
    redisAsyncHandleWrite(p->ac);
}

static void update(uv_redis *p, int add, int ev) {
  p->events = add ? p->events | ev : p->events & ~ev;
  if (p->events)
    uv_poll_start(&p->poll, p->events | UV_DISCONNECT, on_poll);
  else
    uv_poll_stop(&p->poll);
}

static void add_read(void *d) { update(d, 1, UV_READABLE); }
static void del_read(void *d) { update(d, 0, UV_READABLE); }
static void add_write(void *d) { update(d, 1, UV_WRITABLE); }
static void del_write(void *d) { update(d, 0, UV_WRITABLE); }

static void on_closed(uv_handle_t *h) {
  uv_redis *p = h->data;
  if (--p->open_handles == 0)
    free(p);
}

static void cleanup(void *d) {
  uv_redis *p = d;
  p->ac = NULL;
  uv_close((uv_handle_t *)&p->poll, on_closed);
  uv_close((uv_handle_t *)&p->timer, on_closed);
}

/* Is the connection waiting for Redis: connecting, or a reply due? */
static int waiting(const redisAsyncContext *ac) {
  return !(ac->c.flags & REDIS_CONNECTED) || ac->replies.head != NULL;
}

static void on_check(uv_timer_t *t) {
  uv_redis *p = t->data;
  if (p->ac == NULL)
    return;
  uint64_t now = ps_now_ns();
  if (!waiting(p->ac) || p->reads != p->reads_at_check) {
    p->stuck_since_ns = 0;
    p->reads_at_check = p->reads;
    return;
  }
  if (p->stuck_since_ns == 0) {
    /* A connect counts from its start; a command from the first check
     * that finds it waiting with nothing read. */
    p->stuck_since_ns = (p->ac->c.flags & REDIS_CONNECTED) ? now : p->created_ns;
  }
  if (now - p->stuck_since_ns >= p->timeout_ns)
    p->on_timeout(p->ac, p->owner);
}

int ps_redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop, uint64_t timeout_ms,
                       ps_redis_uv_timeout_fn on_timeout, void *owner) {
  uv_redis *p = calloc(1, sizeof *p);
  if (p == NULL)
    return -1;
  if (uv_poll_init(loop, &p->poll, ac->c.fd) != 0) {
    free(p);
    return -1;
  }
  uv_timer_init(loop, &p->timer);
  p->open_handles = 2;
  p->ac = ac;
  p->poll.data = p->timer.data = p;
  p->timeout_ns = timeout_ms * 1000000ULL;
  p->created_ns = ps_now_ns();
  p->on_timeout = on_timeout;
  p->owner = owner;
  ac->ev.data = p;
  ac->ev.addRead = add_read;
  ac->ev.delRead = del_read;
  ac->ev.addWrite = add_write;
  ac->ev.delWrite = del_write;
  ac->ev.cleanup = cleanup;
  /* A dead peer whose kernel is gone too: the kernel gives up on unacked
   * data after the deadline, and probes an idle connection. */
  int fd = ac->c.fd, on = 1, idle = (int)(timeout_ms / 1000 > 0 ? timeout_ms / 1000 : 1);
  int intvl = idle, cnt = 3;
  unsigned int uto = (unsigned int)timeout_ms;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof uto);
  uint64_t every = timeout_ms / 4 ? timeout_ms / 4 : 1;
  uv_timer_start(&p->timer, on_check, every, every);
  return 0;
}
