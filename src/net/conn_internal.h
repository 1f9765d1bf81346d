/* The connection's fields, for src/net/ alone: conn.c (reading and
 * writing frames) and listener.c (the connections it accepted), which
 * sits above conn.c: conn.c knows of a listener only the hook it set. */
#ifndef PS_NET_CONN_INTERNAL_H
#define PS_NET_CONN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "net/conn.h"
#include "proto/proto.h"

struct ps_conn {
  uv_tcp_t tcp;  /* first: the handle's address is the connection's */
  uv_shutdown_t shutdown;
  ps_conn_cbs cbs;
  void *data;
  uint8_t *rbuf;
  size_t rcap, rpos, rlen;  /* unread bytes are [rpos, rlen) */
  uint64_t max_payload;
  int handshake_done;  /* ps_conn_handshake_done: frames up to max_payload */
  ps_frame_header hdr;
  int have_hdr;
  int closing, failing;
  int held;  /* a handled frame's payload must stay in place until on_release */
  int err;
  char why[PS_PROTO_ERROR_MSG_MAX + 64];
  char peer[64];
  uint64_t bytes_in, bytes_out;
  /* Set by the listener that accepted the connection (NULL: dialed), and
   * called once when the connection starts closing (its descriptor is
   * free from then on), so that the listener can take another. */
  void (*on_closing)(struct ps_conn *c);
  /* The listener's (listener.c): the one that accepted it, for the whole
   * life of the connection; `listed` while it is in the listener's list
   * of open connections (oldest first), until it starts closing. */
  struct ps_listener *gate;
  struct ps_conn *gprev, *gnext;
  int listed;
  uint64_t accepted_ns;
};

#endif
