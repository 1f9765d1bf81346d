/* The shard server's state, shared by server.c (workers' requests) and
 * control.c (the chief's requests).  Private to src/ps/. */
#ifndef PS_PS_SERVER_INTERNAL_H
#define PS_PS_SERVER_INTERNAL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#include "common/config.h"
#include "common/history.h"
#include "common/lathist.h"
#include "common/log.h"
#include "layout/layout.h"
#include "net/conn.h"
#include "net/listener.h"
#include "nn/model.h"
#include "proto/proto.h"
#include "ps/consistency.h"
#include "ps/shard.h"
#include "ps/durable.h"
#include "ps/state_service.h"
#include "replica/restore.h"

typedef struct client client;
typedef struct ps_metrics ps_metrics;
typedef struct ps_metric ps_metric;

/* The shard's series (src/common/METRICS.md), in server.c's table. */
enum { S_APPLIED, S_DUPLICATES, S_STALE, S_STALENESS, S_VERSION, S_GLOBAL_STEP, S_LAG_VERSIONS,
       S_LAG_SECONDS, S_NONDURABLE, S_ACKS_WAITING, S_RESTORES, S_RESTORE_SECONDS, S_INCARNATION,
       S_RECEIVED, S_SENT, S_CONNECTIONS, S_PUSH_ACK, S_N };
/* Its series per sparse table, each a family labelled table="<name>"
 * (server.c's table_series), from ps_table_stats. */
enum { T_ROWS, T_PENDING, T_ADMITTED, T_EXPIRED, T_EVICTED, T_BYTES, T_N };
typedef struct reply_buf reply_buf;

/* A shard server's life, one phase at a time:
 *   WAITING  -> SERVING   restored from Redis, made from the seed, or the chief's LOAD
 *   SERVING  -> HELD      a CUT: pushes are held while the chief fetches the copy
 *   HELD     -> SERVING   RESUME, or the cut's hold ran out (the held pushes are applied)
 *   SERVING, HELD -> DRAINING  the chief's STOP: held pushes applied, the workers told,
 *                        exit once the frames are out
 *   any      -> STOPPING  SIGTERM, fenced, a failure, or the end of DRAINING */
typedef enum ps_server_phase {
  PS_PHASE_WAITING = 0,  /* no state yet: workers are told to come back */
  PS_PHASE_SERVING,
  PS_PHASE_HELD,
  PS_PHASE_DRAINING,
  PS_PHASE_STOPPING,
} ps_server_phase;

typedef struct server {
  uv_loop_t loop;
  ps_listener listener;
  uv_signal_t sigterm, sigint;
  uv_timer_t tick;
  const ps_config *cfg;
  int index;
  uint64_t incarnation;
  uint8_t secret[4096];
  size_t secret_len;
  ps_model model;
  ps_layout layout;
  ps_shard *shard;       /* the state (shard.h): opaque here too */
  uint64_t max_payload;
  client *clients;
  int nclients;
  ps_server_phase phase;
  uint64_t pulls, bytes_in_closed, bytes_out_closed;
  reply_buf *reply_cur, *reply_free;  /* pull.c: the current version's copy, the pool */
  int reply_nfree;
  uint8_t *unbag;        /* a PUSH's bags turned into rows (ps_sparse_unbag) */
  size_t unbag_cap;
  ps_durable *durable;   /* how updates become durable (durable.h) */
  ps_cons cons;          /* consistency.c */
  int status;            /* the exit status */
  ps_restore_info ri;    /* kept to start replicating once the chief loads a state */
  ps_history *history;   /* [cluster] history_dir: each state this process started from */
  ps_metrics *metrics;   /* NULL: metrics off */
  ps_metric *series[S_N];
  ps_metric *table_series[T_N][PS_SHARD_MAX_TABLES];  /* [T_*][table] */
  /* For the line at the end (ps_server_stop): each push's time from the
   * shard taking it to its ack's write, and the resident memory once it
   * listened, before any worker came. */
  ps_lathist acks;
  long rss_start_kb;
  uint64_t trimmed_ns;        /* when on_tick last gave freed heap back (ps_procmem_trim) */
  /* control.c */
  ps_state_service *state;      /* CUT, FETCH, RESUME, LOAD (state_service.h) */
  uint64_t cut_id;              /* the cut that holds pushes (phase HELD) */
  uint64_t resume_at_ns;        /* it resumes by itself then */
  struct held_push *held, *held_tail;
  uint64_t started_ns;          /* the process's start */
  int pulled;                   /* a pull was answered (its time said once) */
  ps_shard_key *miss;           /* rowwait.c: a request's keys not in yet */
  size_t miss_cap;
  uv_timer_t stop_timer;        /* STOP: exit once the replies are out */
  uv_timer_t watchdog;          /* systemd's, when it set one */
  int watchdog_on;
} server;

/* C_CLOSING: refused while READY, its ERROR being written; it counts for
 * nothing (held pulls, clocks, the STOP broadcast). */
enum { C_HANDSHAKE = 0, C_READY, C_CLOSING };

struct client {
  server *srv;
  ps_conn *conn;
  client *prev, *next;
  int state;
  uint8_t nonce[PS_PROTO_NONCE_SIZE];
  int role;
  uint32_t index;
  uint64_t incarnation;
  ps_cons_pull pull;      /* consistency.c */
  uint8_t *pull_keys;     /* the held PULL's sparse blocks (K), copied; pull.c answers them */
  uint64_t pull_keys_bytes, pull_keys_cap;
  char name[96];          /* "worker 1 (127.0.0.1:5000)" for log lines */
  int refused;            /* REFUSE logged why it is closing */
  int refs;               /* acks waiting for Redis hold the client */
  int closed;             /* its connection is gone */
  /* rowwait.c: frames waiting for their rows (a lazy restore). */
  struct rowwait_frame *rw_head, *rw_tail;
  int rw_fetching;        /* their first's rows asked for */
  void (*rw_dispatch)(client *cl, const ps_frame_header *h, const uint8_t *payload,
                      const ps_msg *m);
};

/* Drop a reference (an ack kept for Redis, a held push): the client is
 * freed with its last one once its connection is gone. */
static inline void client_unref(client *cl) {
  if (--cl->refs == 0 && cl->closed) {
    free(cl->pull_keys);
    free(cl);
  }
}

/* Log, answer with ERROR, close.  The shard's state is not touched.  Lines
 * about peers that have not authenticated are rationed (listener.h). */
#define REFUSE(cl, code, flags, ...)                                                     \
  do {                                                                                   \
    char why_[512];                                                                      \
    snprintf(why_, sizeof why_, __VA_ARGS__);                                            \
    if (ps_listener_may_log((cl)->conn))                                                 \
      ps_log(PS_LOG_WARN, "%s: %s; closing", (cl)->name, why_);                          \
    (cl)->refused = 1;                                                                   \
    ps_conn_fail((cl)->conn, (code), (flags), "%s", why_);                               \
  } while (0)

/* control.c: the chief's frames (CUT, RESUME, FETCH, LOAD, STOP).  It
 * calls nothing of server.c: what a frame or the tick leaves for the
 * server to do is its outcome. */
typedef enum ps_control_outcome {
  PS_CONTROL_NONE = 0,
  PS_CONTROL_RESUMED,  /* pushes flow again: apply the held ones (ps_control_drain) */
  PS_CONTROL_LOADED,   /* the shard holds the chief's state now: replicate it */
  PS_CONTROL_STOP,     /* the chief ended the run: drain, then stop once the frames are out */
} ps_control_outcome;
ps_control_outcome ps_control_frame(client *cl, uint64_t req, const ps_msg *m);
/* Apply each push held during a cut, in arrival order, through `apply`
 * (skipping those of closed clients), and release them. */
typedef void (*ps_control_apply_fn)(client *cl, uint64_t req, const ps_msg_push *p);
void ps_control_drain(server *s, ps_control_apply_fn apply);
/* A push that arrived while a cut holds pushes: queue it.  @return 1 if
 * queued (or refused), 0 if the shard is not paused. */
int ps_control_hold_push(client *cl, uint64_t req, const ps_msg_push *p);
/* Allocate and touch the state service's copy buffer once the shard holds
 * a state (when the config checkpoints at all). */
void ps_control_prepare(server *s);
/* on_tick: resume a cut whose RESUME did not come in time. */
ps_control_outcome ps_control_tick(server *s, uint64_t now_ns);
/* Free the held pushes. */
void ps_control_free(server *s);

/* pull.c: answer a PULL with the slice at the current version; free the
 * pooled reply buffers at the server's end. */
void ps_server_pull_reply(client *cl, uint64_t req);
void ps_server_pull_bufs_free(server *s);

/* server.c, for consistency.c and control.c */
void ps_server_push(client *cl, uint64_t req, const ps_msg_push *p);

/* server_metrics.c: the shard's series registered and served (on failure
 * every series is NULL), their values copied on every tick, and the bytes
 * in and out over the connections closed and open. */
int ps_server_metrics_start(server *s, ps_errbuf *eb);
void ps_server_metrics_update(server *s);
void ps_server_bytes(const server *s, uint64_t *in, uint64_t *out);
void ps_server_stop(server *s, const char *why);
/* The shard holds a state now (source: "redis", "seed", "chief"): record it. */
void ps_server_state_began(server *s, const char *source);

#endif
