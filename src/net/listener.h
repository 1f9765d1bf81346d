/* The accepting side of a shard and of a ring member: a listening socket
 * whose clients, authenticated or not, cannot take more than their share.
 *
 * - At most `cap` connections are open at once: [cluster] max_connections,
 *   lowered to what RLIMIT_NOFILE allows (the soft limit is raised first,
 *   up to the hard one).  At the cap a newcomer takes the place of the
 *   oldest connection not yet authenticated, which is closed without a
 *   word; when every open connection is authenticated, accepting stops
 *   until one closes (newcomers wait in the kernel's backlog, which holds
 *   as many as `cap`: a burst of that many connections is not dropped).
 * - Until ps_conn_handshake_done a connection reads frames of at most
 *   PS_PROTO_SMALL_PAYLOAD_MAX bytes (ps_conn_start), and it must get there
 *   within PS_LISTENER_HANDSHAKE_MS: otherwise an ERROR ("no HELLO within
 *   10000 ms") and the close.
 * - An accept that fails (EMFILE, ENFILE: descriptors short; ENOMEM...)
 *   stops accepting for PS_LISTENER_PAUSE_MS.  A descriptor kept in reserve
 *   is freed so that libuv's accept loop takes one connection and ends
 *   (libuv calls back at once for every failed accept: without this it
 *   spins); the reserve is taken back before accepting resumes.  Should
 *   even that fail, the oldest unauthenticated connection is closed, and
 *   failing that the listening socket itself, to listen again after the
 *   pause.
 * - What it drops or refuses is counted and said in one line (warn) at
 *   once, then at most once per PS_LISTENER_REPORT_MS while it goes on;
 *   ps_listener_may_log rations the owner's own lines about unauthenticated
 *   peers the same way.  A flood of clients so costs a few lines a minute.
 *
 * The owner embeds a ps_listener (its fields are listener.c's), and must
 * outlive the connections it accepted: they point at it until freed. */
#ifndef PS_NET_LISTENER_H
#define PS_NET_LISTENER_H

#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "common/config.h"
#include "net/conn.h"

#define PS_LISTENER_HANDSHAKE_MS 10000
#define PS_LISTENER_PAUSE_MS 500
#define PS_LISTENER_REPORT_MS 10000
/* Descriptors a process keeps for everything but its listener's
 * connections: the metrics server's (PS_METRICS_MAX_CONNECTIONS, 64),
 * Redis, files, the event loop's own. */
#define PS_LISTENER_FD_OTHERS 128

typedef struct ps_listener ps_listener;

typedef struct ps_listener_cbs {
  /* A connection for the next client, with the owner's callbacks
   * (ps_conn_new on the listener's loop); NULL when memory ran out.  If
   * the accept then fails the listener closes it (its on_close runs). */
  ps_conn *(*make)(ps_listener *l);
  /* It is accepted and reading frames: greet it (CHALLENGE). */
  void (*accepted)(ps_listener *l, ps_conn *c);
} ps_listener_cbs;

struct ps_listener {
  uv_loop_t *loop;
  uv_tcp_t tcp;
  uv_timer_t tick, resume;
  ps_listener_cbs cbs;
  void *data;  /* the owner's */
  struct sockaddr_storage addr;
  char what[320];  /* "port 127.0.0.1:7001" */
  unsigned peer_timeout_ms;
  int cap, open, unauthenticated;
  struct ps_conn *oldest, *newest;
  int paused;     /* accepting stopped: 1 at the cap, 2 short of descriptors */
  int pending;    /* the kernel handed over a connection not yet taken */
  int tcp_state;  /* 0 listening, 1 closing to listen again, 2 closed, 3 closed for good */
  int reserve_fd;
  int closed;
  /* Counts since the last report. */
  uint64_t report_ns, first_ns, window_ns;
  uint64_t evicted, timed_out, short_of, at_cap, relistens, unlogged;
  int logged, last_err;
};

/* Listen on `a` on `loop`, for at most `max_conns` connections open at
 * once; `data` is the owner's (l->data).  @return 0 or a libuv error (the
 * address cannot be resolved, bound or listened on); either way the
 * listener must be closed with ps_listener_close. */
int ps_listener_start(ps_listener *l, uv_loop_t *loop, const ps_addr *a, int max_conns,
                      unsigned peer_timeout_ms, const ps_listener_cbs *cbs, void *data);

/* Stop listening and close the listener's handles (its connections stay
 * open: the owner closes them). */
void ps_listener_close(ps_listener *l);

/* Whether the owner may log a line about `c` now: always for a connection
 * that completed its handshake or was not accepted by a listener; for an
 * unauthenticated one, the first few of every PS_LISTENER_REPORT_MS, the
 * rest counted in the listener's next report. */
int ps_listener_may_log(ps_conn *c);

#endif
