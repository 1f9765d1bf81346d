/* The ring's shared state, for its two files only: ring.c (links, the
 * all-reduce, the requests a member answers, the API) and ring_state.c
 * (fetching a peer's state, on top of ring.c). */
#ifndef PS_RING_RING_INTERNAL_H
#define PS_RING_RING_INTERNAL_H

#include <stdint.h>
#include <uv.h>

#include "net/conn.h"
#include "net/listener.h"
#include "proto/proto.h"
#include "ps/state_service.h"
#include "ring/ring.h"

#define PIECE_FLOATS (64u * 1024u)
#define FETCH_FLOATS (1024u * 1024u)
#define TICK_MS 20
#define MAX_HOPS (2 * PS_CONFIG_MAX_NODES)
/* Pieces that come early are at most a step's worth of the vector (one
 * behind from each hop); more than this many models' worth is a broken
 * peer. */
#define EARLY_MAX_MODELS 4

/* A piece that came before its step (its sender was a step ahead, or in
 * the next view already): kept until then. */
typedef struct early {
  struct early *next;
  uint64_t epoch, step, off, count;
  uint32_t phase;
  int from;
  float data[];
} early;

enum { K_ACCEPTED = 0, K_SUCC, K_FETCH };
enum { L_DIALING = 0, L_HANDSHAKE, L_WELCOME, L_READY };

typedef struct link {
  ps_ring *r;
  ps_conn *conn;
  struct link *next, *prev;
  int kind, state;
  int rank; /* the other member's, -1 for the chief or a tool */
  int role;
  int joined; /* accepted: a RING_JOIN came, `epoch` is its view */
  uint64_t epoch;
  int writes; /* pieces queued on it, not yet written */
  uint8_t nonce[PS_PROTO_NONCE_SIZE];
  uv_connect_t creq;
  /* A fetch link (ring_state.c): it is ready, and a frame on it.  The
   * reply hook @return 1 when the frame was the fetch's. */
  void (*fetch_ready)(struct link *l);
  int (*fetch_reply)(struct link *l, const ps_msg *m);
} link;

typedef struct send_item {
  uint32_t phase;
  uint64_t off, count;
} send_item;

struct ps_ring {
  const ps_config *cfg;
  int rank;
  uint64_t incarnation, layout_hash;
  uint8_t secret[4096];
  size_t secret_len;
  ps_shard *state;
  uv_loop_t loop;
  ps_listener listener;
  uv_timer_t tick;
  volatile sig_atomic_t *stop;
  link *links;
  ps_state_service *svc; /* CUT, FETCH, RESUME, LOAD from the replica (src/ps/state_service.h) */
  uint64_t stop_step;
  /* The view. */
  uint64_t epoch, newer;
  int members[PS_CONFIG_MAX_NODES];
  int n, pos;
  link *succ;
  /* The all-reduce in progress. */
  int active, broken, suspect;
  int pred_lost; /* the predecessor's link closed between two steps */
  float *buf;
  size_t nfl;
  uint64_t step, recv_left, recv[MAX_HOPS];
  uint64_t progress_ns;
  send_item *sendq;
  size_t nsendq, capsendq;
  early *early;
  uint64_t early_floats; /* held in `early`: at most EARLY_MAX_MODELS models */
  /* The state fetch in progress. */
  link *fetch;
  int fetching; /* 1 running, 0 done, -1 failed */
  ps_state_info fetch_info;
  float *fetch_img;
  uint64_t fetch_off;
  char why[512];
  uint64_t bytes_in_closed, bytes_out_closed;
  int holds;               /* the replica holds a state (seeded, fetched, loaded) */
  int waiting;             /* no member of the view holds one: STATS says so */
  int loaded;              /* a LOAD completed since ps_ring_take_loaded */
  void (*idle)(void *arg); /* while a call waits: the member's heartbeat */
  void *idle_arg;
  uint64_t idle_ns;
};

/* The all-reduce (or the fetch) cannot finish in this view: its reason,
 * and the member to blame (-1: nobody). */
void ring_fail(ps_ring *r, int suspect, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Refuse a peer's request with an ERROR and close the link. */
void ring_refuse(link *l, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A link of `kind` to member `rank`, connecting; NULL (ring_fail said why). */
link *ring_dial(ps_ring *r, int kind, int rank);
/* Run the loop until done(r), or -EINTR at the stop flag.  @return 0 or -EINTR. */
int ring_run_until(ps_ring *r, int (*done)(const ps_ring *));

/* ring_state.c, the client side of a state fetch: a link of kind K_FETCH
 * to member `rank`, its hooks set (ring.c calls them; ring_state.c calls
 * ring.c). */
#endif
