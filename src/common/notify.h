/* Readiness, status and liveness reports to systemd (sd_notify), no-ops
 * when the process does not run under it (NOTIFY_SOCKET unset). */
#ifndef PS_COMMON_NOTIFY_H
#define PS_COMMON_NOTIFY_H

#include <uv.h>

/* "READY=1" and "STATUS=<text>": call once state is restored and the
 * process serves (a shard listens, a worker trains, the chief leads).
 * The text is formatted with printf rules; newlines become spaces. */
void ps_notify_ready(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "READY=1", "STOPPING=1" and "STATUS=<text>" at once: a process that
 * finds nothing to do (the run already ended) and exits 0 before it
 * served; without READY=1, systemd would count that exit as a failed start
 * (result 'protocol') and restart it. */
void ps_notify_done(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "STATUS=<text>", shown by `systemctl status`: call on phase changes
 * (waiting for Redis, restoring, training, checkpointing), not per step. */
void ps_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "STOPPING=1": call when a clean shutdown begins (SIGTERM, last step). */
void ps_notify_stopping(void);

/* "WATCHDOG=1", sent at most once per quarter of the watchdog interval
 * (WATCHDOG_USEC); a no-op without a watchdog.  Cheap (a clock read and a
 * compare) when it sends nothing, so a training loop may call it every
 * step.  Thread-safe. */
void ps_notify_watchdog(void);

/* When systemd set a watchdog for this process, initialize `timer` on
 * `loop` and start it firing every half of the interval, each time sending
 * WATCHDOG=1.  The timer is unreferenced: it never keeps the loop alive.
 * The caller closes it with uv_close() when it stops (the caller owns the
 * memory; it must stay valid until the close callback).
 * @return 1 if started; 0 if no watchdog is set or NOTIFY_SOCKET is unset
 * (timer untouched, not initialized). */
int ps_notify_watchdog_start(uv_loop_t *loop, uv_timer_t *timer);

/* ------------------------------------------------------------------------ */
/* The receiving end, as systemd's: what `paramserv local` gives each child  */
/* ------------------------------------------------------------------------ */

/* What one datagram said. */
typedef struct ps_notify_msg {
  long pid;          /* the sender's, from the kernel (SCM_CREDENTIALS); 0: not told */
  int ready;         /* READY=1 */
  int stopping;      /* STOPPING=1 */
  int has_status;    /* STATUS= was there: its text in status */
  char status[512];
} ps_notify_msg;

/* A non-blocking, close-on-exec AF_UNIX datagram socket bound to the
 * abstract name `name` (no '@', no NUL), with SO_PASSCRED so that every
 * datagram carries its sender's pid; a child finds it through
 * NOTIFY_SOCKET=@name.  The name lives as long as the socket.
 * @return the descriptor, or -errno (-EADDRINUSE: another socket has the name). */
int ps_notify_listen(const char *name);

/* The next queued datagram into *m, its fields parsed (others ignored);
 * descriptors passed with it are closed.  @return 1 with *m filled, 0 when
 * none is queued, or -errno. */
int ps_notify_recv(int fd, ps_notify_msg *m);

/* Tests only: forget the cached watchdog interval and the last send, so
 * that the next call reads the environment again. */
void ps__notify_reset(void);

#endif
