/* The accepting side of a shard and of a ring member (listener.h). */
#include "net/listener.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "net/conn_internal.h"

/* The kernel's queue of connections not accepted yet: room for as many as
 * may be open at once (a whole cluster's workers reconnecting after a
 * restart), at least 128; the kernel caps it at net.core.somaxconn.  A
 * connection past a full queue has its SYN dropped and sent again 1, 3,
 * 7 s later. */
#define BACKLOG(l) ((l)->cap > 128 ? (l)->cap : 128)
#define TICK_MS 500
/* Lines about unauthenticated peers the owner may log per report period. */
#define LOG_BURST 20
#define MS 1000000ULL

enum { RUNNING = 0, AT_CAP = 1, SHORT = 2 };
enum { LISTENING = 0, CLOSING, CLOSED };

static void on_connection(uv_stream_t *server, int status);

static int open_reserve(void) {
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd >= 0 ? fd : open("/", O_RDONLY | O_CLOEXEC);
}

/* The connections RLIMIT_NOFILE leaves room for, out of `want`: the soft
 * limit is raised (up to the hard one) to want + PS_LISTENER_FD_OTHERS
 * first; what it still lacks is said once. */
static int fit_nofile(const ps_listener *l, int want) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return want;
  rlim_t need = (rlim_t)want + PS_LISTENER_FD_OTHERS;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    struct rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need ? rl.rlim_max : need;
    if (raised.rlim_cur > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &raised) == 0)
      rl.rlim_cur = raised.rlim_cur;
  }
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
    return want;
  int cap = rl.rlim_cur > PS_LISTENER_FD_OTHERS + 8 ? (int)(rl.rlim_cur - PS_LISTENER_FD_OTHERS)
                                                    : 8;
  ps_log(PS_LOG_WARN, "%s: [cluster] max_connections = %d needs %llu descriptors, RLIMIT_NOFILE "
         "allows %llu (hard limit %llu): at most %d connections open at once (raise LimitNOFILE: "
         "systemd/README.md)", l->what, want, (unsigned long long)need,
         (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max, cap);
  return cap;
}

static int bind_listen(ps_listener *l) {
  int rc = uv_tcp_bind(&l->tcp, (const struct sockaddr *)&l->addr, 0);
  return rc != 0 ? rc : uv_listen((uv_stream_t *)&l->tcp, BACKLOG(l), on_connection);
}

static int counted(const ps_listener *l) {
  return l->evicted || l->timed_out || l->short_of || l->at_cap || l->relistens || l->unlogged;
}

#define PLURAL(n) ((n) == 1 ? "" : "s")

/* One line for everything counted since the last one. */
static void report(ps_listener *l, uint64_t now) {
  if (!counted(l))
    return;
  char parts[900] = "";
  size_t n = 0;
#define PART(...) \
  n += (size_t)snprintf(parts + n, n < sizeof parts ? sizeof parts - n : 0, __VA_ARGS__)
  if (l->evicted)
    PART("%s%" PRIu64 " unauthenticated connection%s closed to make room for newer ones",
         n ? "; " : "", l->evicted, PLURAL(l->evicted));
  if (l->timed_out)
    PART("%s%" PRIu64 " closed without a HELLO within %d ms", n ? "; " : "", l->timed_out,
         PS_LISTENER_HANDSHAKE_MS);
  if (l->at_cap)
    PART("%saccepting stopped %" PRIu64 " time%s, every connection authenticated (raise "
         "[cluster] max_connections)", n ? "; " : "", l->at_cap, PLURAL(l->at_cap));
  if (l->short_of)
    PART("%saccept failed %" PRIu64 " time%s (%s): accepting paused %d ms each time",
         n ? "; " : "", l->short_of, PLURAL(l->short_of), uv_strerror(l->last_err),
         PS_LISTENER_PAUSE_MS);
  if (l->relistens)
    PART("%sthe port closed %" PRIu64 " time%s, no descriptor left to free (listening again "
         "after the pause)", n ? "; " : "", l->relistens, PLURAL(l->relistens));
  if (l->unlogged)
    PART("%s%" PRIu64 " line%s about unauthenticated peers not logged", n ? "; " : "",
         l->unlogged, PLURAL(l->unlogged));
#undef PART
  int unauth = 0;
  for (const ps_conn *c = l->oldest; c != NULL; c = c->gnext)
    unauth += !c->handshake_done;
  char over[32] = "";
  if (now - l->first_ns >= 100 * MS)
    snprintf(over, sizeof over, " in %.1f s", (double)(now - l->first_ns) * 1e-9);
  ps_log(PS_LOG_WARN, "%s: %s%s; %d open (%d unauthenticated), limit %d", l->what, parts, over,
         l->open, unauth, l->cap);
  l->evicted = l->timed_out = l->short_of = l->at_cap = l->relistens = l->unlogged = 0;
  l->report_ns = now;
}

/* Count one thing dropped or refused: said at once after a quiet period,
 * else in the next report. */
static void tally(ps_listener *l, uint64_t *counter) {
  uint64_t now = ps_now_ns();
  if (!counted(l))
    l->first_ns = now;
  (*counter)++;
  if (now - l->report_ns >= PS_LISTENER_REPORT_MS * MS)
    report(l, now);
}

int ps_listener_may_log(ps_conn *c) {
  ps_listener *l = c->gate;
  if (l == NULL || c->handshake_done)
    return 1;
  uint64_t now = ps_now_ns();
  if (now - l->window_ns >= PS_LISTENER_REPORT_MS * MS) {
    l->window_ns = now;
    l->logged = 0;
  }
  if (l->logged < LOG_BURST) {
    l->logged++;
    return 1;
  }
  tally(l, &l->unlogged);
  return 0;
}

/* Close the oldest unauthenticated connection: its descriptor is free at
 * once.  @return 0 when every open connection is authenticated. */
static int evict(ps_listener *l) {
  for (ps_conn *c = l->oldest; c != NULL; c = c->gnext)
    if (!c->handshake_done) {
      tally(l, &l->evicted);
      ps_conn_close(c);  /* forget unlinks it */
      return 1;
    }
  return 0;
}

static void on_resume(uv_timer_t *t);
static void forget(ps_conn *c);

static void on_tcp_closed(uv_handle_t *h) {
  ps_listener *l = h->data;
  l->tcp_state = CLOSED;
}

/* An accept failed, or memory for a connection ran out: stop accepting
 * for PS_LISTENER_PAUSE_MS.  libuv calls back again at once after this
 * returns unless its next accept succeeds (the connection then waits,
 * pending, and libuv stops polling) or the socket is closed. */
static void out_of(ps_listener *l, int err) {
  l->last_err = err;
  tally(l, &l->short_of);
  if (l->reserve_fd >= 0) {
    close(l->reserve_fd);
    l->reserve_fd = -1;
  } else if (!evict(l) && l->tcp_state == LISTENING) {
    /* Nothing left to free: close the socket, to listen again later. */
    tally(l, &l->relistens);
    l->pending = 0;
    l->tcp_state = CLOSING;
    uv_close((uv_handle_t *)&l->tcp, on_tcp_closed);
  }
  l->paused = SHORT;
  uv_timer_start(&l->resume, on_resume, PS_LISTENER_PAUSE_MS, 0);
}

/* Take the connection the kernel handed over, making room first. */
static void take(ps_listener *l) {
  if (l->open >= l->cap && !evict(l)) {
    /* It waits, pending: libuv polls no more until it is taken. */
    tally(l, &l->at_cap);
    l->paused = AT_CAP;
    return;
  }
  ps_conn *c = l->cbs.make(l);
  if (c == NULL) {
    out_of(l, UV_ENOMEM);
    return;
  }
  l->pending = 0;
  int rc = uv_accept((uv_stream_t *)&l->tcp, (uv_stream_t *)ps_conn_tcp(c));
  if (rc == 0)
    rc = ps_conn_start(c);
  if (rc != 0) {
    ps_conn_close(c);
    /* A failed uv_accept leaves the socket unpolled: poll it again. */
    uv_listen((uv_stream_t *)&l->tcp, BACKLOG(l), on_connection);
    return;
  }
  c->gate = l;
  c->on_closing = forget;
  c->listed = 1;
  c->accepted_ns = ps_now_ns();
  c->gprev = l->newest;
  c->gnext = NULL;
  if (l->newest != NULL)
    l->newest->gnext = c;
  else
    l->oldest = c;
  l->newest = c;
  l->open++;
  rc = ps_conn_set_peer_timeout(c, l->peer_timeout_ms);
  if (rc != 0 && ps_listener_may_log(c))
    ps_log(PS_LOG_WARN, "%s: peer %s: no keepalive (%s): a silent drop of this peer goes unnoticed",
           l->what, ps_conn_peer(c), uv_strerror(rc));
  l->cbs.accepted(l, c);
}

static void on_connection(uv_stream_t *server, int status) {
  ps_listener *l = server->data;
  if (status < 0) {
    out_of(l, status);
    return;
  }
  l->pending = 1;
  if (l->paused == RUNNING)
    take(l);
}

static void on_resume(uv_timer_t *t) {
  ps_listener *l = t->data;
  if (l->closed)
    return;
  if (l->reserve_fd < 0)
    l->reserve_fd = open_reserve();
  if (l->reserve_fd >= 0 && l->tcp_state == CLOSED) {
    int rc = uv_tcp_init(l->loop, &l->tcp);
    if (rc == 0) {
      l->tcp.data = l;
      rc = bind_listen(l);
      l->tcp_state = rc == 0 ? LISTENING : CLOSING;
      if (rc != 0)
        uv_close((uv_handle_t *)&l->tcp, on_tcp_closed);
    }
    if (rc != 0)
      l->last_err = rc;
  }
  if (l->reserve_fd < 0 || l->tcp_state != LISTENING) {
    tally(l, &l->short_of);  /* still short: another pause */
    uv_timer_start(&l->resume, on_resume, PS_LISTENER_PAUSE_MS, 0);
    return;
  }
  l->paused = RUNNING;
  if (l->pending)
    take(l);
}

/* conn.c calls this (on_closing) when `c` starts closing: its descriptor
 * is free from now on. */
static void forget(ps_conn *c) {
  ps_listener *l = c->gate;
  if (!c->listed)
    return;
  c->listed = 0;
  if (c->gprev != NULL)
    c->gprev->gnext = c->gnext;
  else
    l->oldest = c->gnext;
  if (c->gnext != NULL)
    c->gnext->gprev = c->gprev;
  else
    l->newest = c->gprev;
  c->gprev = c->gnext = NULL;
  l->open--;
  /* Room again for the one waiting: taken from the loop, not from
   * within whatever is closing this connection. */
  if (l->paused == AT_CAP && !l->closed)
    uv_timer_start(&l->resume, on_resume, 0, 0);
}

static void on_tick(uv_timer_t *t) {
  ps_listener *l = t->data;
  uint64_t now = ps_now_ns(), deadline = PS_LISTENER_HANDSHAKE_MS * MS;
  ps_conn *next;
  /* Oldest first: the first one within its time ends the walk. */
  for (ps_conn *c = l->oldest; c != NULL && now - c->accepted_ns > deadline; c = next) {
    next = c->gnext;
    if (!c->handshake_done && !c->failing) {
      tally(l, &l->timed_out);
      ps_conn_fail(c, -ETIMEDOUT, 0, "no HELLO within %d ms", PS_LISTENER_HANDSHAKE_MS);
    }
  }
  if (counted(l) && now - l->report_ns >= PS_LISTENER_REPORT_MS * MS)
    report(l, now);
}

int ps_listener_start(ps_listener *l, uv_loop_t *loop, const ps_addr *a, int max_conns,
                      unsigned peer_timeout_ms, const ps_listener_cbs *cbs, void *data) {
  memset(l, 0, sizeof *l);
  l->loop = loop;
  l->cbs = *cbs;
  l->data = data;
  l->peer_timeout_ms = peer_timeout_ms;
  l->reserve_fd = -1;
  char at[300];
  ps_addr_format(a, at, sizeof at);
  snprintf(l->what, sizeof l->what, "port %s", at);
  uv_timer_init(loop, &l->tick);
  uv_timer_init(loop, &l->resume);
  l->tick.data = l->resume.data = l;
  /* Neither keeps a loop running by itself. */
  uv_unref((uv_handle_t *)&l->tick);
  uv_unref((uv_handle_t *)&l->resume);
  int rc = uv_tcp_init(loop, &l->tcp);
  if (rc != 0) {
    l->tcp_state = CLOSED;
    return rc;
  }
  l->tcp.data = l;
  l->cap = fit_nofile(l, max_conns);
  rc = ps_net_resolve(loop, a, &l->addr);
  if (rc == 0)
    rc = bind_listen(l);
  if (rc != 0)
    return rc;
  /* The address bound (a port 0 chosen), to listen on again after closing. */
  int len = sizeof l->addr;
  uv_tcp_getsockname(&l->tcp, (struct sockaddr *)&l->addr, &len);
  l->reserve_fd = open_reserve();
  uv_timer_start(&l->tick, on_tick, TICK_MS, TICK_MS);
  return 0;
}

static void close_handle(uv_handle_t *h) {
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

void ps_listener_close(ps_listener *l) {
  if (l->loop == NULL || l->closed)
    return;
  l->closed = 1;
  if (l->tcp_state == LISTENING)
    close_handle((uv_handle_t *)&l->tcp);
  close_handle((uv_handle_t *)&l->tick);
  close_handle((uv_handle_t *)&l->resume);
  if (l->reserve_fd >= 0)
    close(l->reserve_fd);
  l->reserve_fd = -1;
}
