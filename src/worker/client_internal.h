/* The client's structure (client.c, client_new.c): its links to the
 * shards, each with its window of unacknowledged pushes, and the call
 * they serve.  Internal to src/worker/. */
#ifndef PS_WORKER_CLIENT_INTERNAL_H
#define PS_WORKER_CLIENT_INTERNAL_H

#include <signal.h>
#include <stdint.h>
#include <uv.h>

#include "paramserv/client.h"
#include "common/backoff.h"
#include "common/config.h"
#include "common/history.h"
#include "layout/hashring.h"
#include "layout/layout.h"
#include "net/conn.h"
#include "nn/model.h"
#include "proto/proto.h"
#include "worker/client_sparse.h"
#include "worker/control.h"

#define BACKOFF_BASE_MS 100
#define BACKOFF_CAP_MS 1000
/* Pushes a link may have unacknowledged in async mode (PROTOCOL.md,
 * "Exactly-once pushes"): a push's ack, which in `log` mode waits for
 * Redis, is then awaited behind the next step's compute.  ssp and sync: 1. */
#define PUSH_WINDOW 2

enum { L_DOWN = 0, L_CONNECTING, L_HANDSHAKE, L_READY };
enum { OP_NONE = 0, OP_PULL, OP_REQ };

/* A push to one shard, kept until acked: sent again, the same, on every
 * new connection before anything else. */
typedef struct push_rec {
  int unsent;              /* not yet written on the current connection */
  int pulled_since;        /* a pull reply came after it: fresher than its ack */
  uint64_t req;            /* its request id on the current connection */
  uint64_t seq;
  uint64_t step;           /* its step (async, ssp), fixed when it begins: a push sent again
                              after a reconnect is the same push, rows' stamps included */
  float *slice;            /* its gradient slice, owned */
  ps_sparse_part part;     /* its sparse blocks for this shard (client_sparse.h) */
} push_rec;

typedef struct link {
  struct ps_client *cl;
  int index;
  int state;
  ps_conn *conn;
  uv_connect_t connect_req;
  uv_timer_t retry;
  ps_backoff backoff;
  uint64_t down_since_ns;  /* 0 while connected */
  char last_error[512];
  /* The operation this link must finish in the current call. */
  int op, done;
  uint64_t req_id;
  uint64_t pull_step;
  /* The pushes not yet acknowledged, oldest first: push[(push_first + k) %
   * PUSH_WINDOW] for k < npush (their acks come in order, while later pulls
   * run). */
  push_rec push[PUSH_WINDOW];
  int push_first, npush;
  uint64_t seq;            /* of the newest push */
  uint64_t acked;          /* pushes this link acknowledged */
  /* What the shard said last. */
  uint64_t version, global_step;
  uint64_t shard_incarnation;  /* from its WELCOME */
  uint64_t pulled_version; /* of the weights the current gradient was computed on */
  uint32_t ack_status;
  int consistency;
  ps_msg req;              /* OP_REQ: the request (a LOAD's floats are borrowed) */
  /* Sparse tables (client_sparse.h): the pull's keys; a buffer for the
   * frames built from them and a push's blocks. */
  ps_sparse_part pull_part;
  uint8_t *tail;
  size_t tail_cap;
} link;

struct ps_client {
  uv_loop_t loop;
  uint64_t bytes_in_closed, bytes_out_closed;  /* of the connections closed so far */
  float *pull_pending;     /* ps_client_push_pull_start's params, until finished */
  const ps_sparse_batch *want_pending;  /* and its rows (the caller's, kept as long) */
  int pull_started;        /* its pull was begun (op_start), not yet finished */
  ps_config cfg;
  int role;                /* PS_ROLE_WORKER, or PS_ROLE_CHIEF (worker/control.h) */
  int index;
  uint64_t incarnation;
  uint8_t secret[4096];
  size_t secret_len;
  ps_model model;
  ps_layout layout;
  link *links;
  int nlinks;
  uint64_t next_req;
  float *params;           /* the current pull's destination */
  uint64_t pushes;         /* completed pushes of this client: acked by every shard */
  int flushing;            /* the call also waits for acks (flush_owes) */
  int flush_window;        /* until fewer than this many are unacknowledged (1: none) */
  uint64_t clock_base;     /* ssp: the clock is clock_base + pushes */
  uint64_t duplicates, stale;
  int fatal;               /* a non-retryable error ended the call */
  int fatal_code;
  char error[1024];
  int deadline_ms;         /* a call fails with -ETIMEDOUT after this long; 0: never */
  uint64_t give_up_ms;     /* a call fails once a shard is down this long; 0: never */
  uint64_t fence;          /* the chief's fence token, put in its control frames */
  uv_timer_t deadline;
  int timed_out;
  uint64_t connects;       /* handshakes completed, over all links */
  volatile sig_atomic_t *stop_flag;  /* ps_client_set_stop_flag */
  uv_timer_t wake;         /* with a stop flag: the loop looks at it this often */
  ps_history *history;     /* [cluster] history_dir: every ack a worker saw */
  ps_client_reply_fn reply_fn;  /* OP_REQ */
  void *reply_arg;
  ps_hashring ring;        /* which shard holds a sparse row (LAYOUT.md, section 6) */
  ps_sparse_batch want;    /* the current pull's rows: where they go */
};


#endif
