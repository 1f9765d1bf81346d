/* A framed connection on a libuv TCP handle: reads whole protocol frames
 * (header checked, payload into an aligned buffer) and queues writes.  Used
 * by the shard server and the client alike. */
#ifndef PS_NET_CONN_H
#define PS_NET_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/config.h"
#include "proto/proto.h"

typedef struct ps_conn ps_conn;

typedef struct ps_conn_cbs {
  /* A whole frame arrived.  `payload` (h->length bytes, 16-byte aligned) is
   * valid only during the call.  The callback may send, close the
   * connection, or stop reading. */
  void (*on_frame)(ps_conn *c, const ps_frame_header *h, const uint8_t *payload);
  /* After on_frame called ps_conn_hold: the held payloads are valid until
   * this returns.  It runs once the frames that arrived together were
   * handled (or sooner, before anything would move them). */
  void (*on_release)(ps_conn *c);
  /* The connection is closed and its handle released: `err` is 0 after
   * ps_conn_close, UV_EOF when the peer closed, another negative code on an
   * I/O error or a frame the header check refused (`why` says which, one
   * line).  The ps_conn is freed right after this returns. */
  void (*on_close)(ps_conn *c, int err, const char *why);
} ps_conn_cbs;

/* A connection on `loop`, not yet connected.  Its TCP handle
 * (ps_conn_tcp) is initialized: pass it to uv_accept or uv_tcp_connect,
 * then call ps_conn_start.  @return NULL on allocation failure. */
ps_conn *ps_conn_new(uv_loop_t *loop, const ps_conn_cbs *cbs, void *data);

uv_tcp_t *ps_conn_tcp(ps_conn *c);
void *ps_conn_data(const ps_conn *c);
void ps_conn_set_data(ps_conn *c, void *data);

/* Start reading frames.  Until ps_conn_handshake_done every frame, of any
 * type, is capped at PS_PROTO_SMALL_PAYLOAD_MAX (the handshake's frames
 * are small; a larger one is refused from its header) and the read buffer
 * is that small too, so that a peer that never authenticates cannot make
 * this side hold a frame of the full payload cap.  Records the peer's
 * address for messages.  @return 0 or a libuv error. */
int ps_conn_start(ps_conn *c);

/* The handshake succeeded (the server sent WELCOME, or the client read
 * it): float-carrying frames up to `max_payload` are read from now on
 * (see ps_proto_decode_header), and a connection accepted by a listener
 * counts as authenticated (listener.h). */
void ps_conn_handshake_done(ps_conn *c, uint64_t max_payload);

/* A deadline on a silent peer (a dead host, a dropped link): TCP keepalive
 * and TCP_USER_TIMEOUT on the connected socket, so that the connection is
 * closed with an error (on_close: UV_ETIMEDOUT, or the network error that
 * was seen) about `timeout_ms` after the peer's kernel last answered, at
 * least 2 s (keepalive counts in whole seconds).  Only the peer's kernel
 * must answer: a connection that only waits (a held pull) stays open while
 * the peer lives, even when its process is paused (SIGSTOP), which the
 * heartbeats in Redis cover.  Call after the connection is established
 * (uv_accept, or the connect callback).  @return 0 or a libuv error. */
int ps_conn_set_peer_timeout(ps_conn *c, unsigned timeout_ms);

/* "ip:port" of the peer, or "?" before ps_conn_start. */
const char *ps_conn_peer(const ps_conn *c);

/* Queue a frame: `prefix` (copied, at most PS_PROTO_PREFIX_MAX bytes)
 * followed by `dlen` bytes at `data`, which must stay valid and unchanged
 * until `done(arg, status)` runs (status 0, or a libuv error when the
 * connection failed first).  done may be NULL.  @return 0 or a libuv
 * error, in which case done is never called. */
int ps_conn_send(ps_conn *c, const uint8_t *prefix, size_t plen, const void *data, size_t dlen,
                 void (*done)(void *arg, int status), void *arg);

/* From on_frame: keep this frame's payload valid until on_release, so
 * that work on it can wait until the frames that came with it (a pull
 * after a push) were answered. */
void ps_conn_hold(ps_conn *c);

/* Write as much of a frame (`prefix`, then `dlen` bytes at `data`) as the
 * socket takes now, without blocking and without copying; nothing when
 * earlier frames are still queued, so frames never interleave.  *sent is
 * the bytes written.  The caller queues the rest with ps_conn_send (from a
 * copy when `data` may change before that write completes).  @return 0, or
 * a libuv error when the connection failed (the caller closes it). */
int ps_conn_try_send(ps_conn *c, const uint8_t *prefix, size_t plen, const void *data,
                     size_t dlen, size_t *sent);

/* ps_conn_send of a frame followed by a small frame `next` (nlen bytes,
 * copied), in one write: the peer reads the second with the end of the
 * first (a pull with the push before it).  With plen and dlen 0 (prefix
 * and data may then be NULL), `next` alone: a frame built whole. */
int ps_conn_send_with(ps_conn *c, const uint8_t *prefix, size_t plen, const void *data,
                      size_t dlen, const uint8_t *next, size_t nlen,
                      void (*done)(void *arg, int status), void *arg);

/* Encode and queue a message without floats (copied).  @return 0 or an error. */
int ps_conn_send_msg(ps_conn *c, const ps_msg *m, uint64_t request_id);

/* The server's first frame: CHALLENGE with a fresh random nonce, kept in
 * `nonce` for the HELLO's proof, and the server's identity.  @return as
 * ps_conn_send_msg. */
int ps_conn_send_challenge(ps_conn *c, uint8_t nonce[PS_PROTO_NONCE_SIZE], int role,
                           uint32_t index, uint64_t incarnation);

/* A PONG with `token`: the answer to a PING, and to the chief's RESUME,
 * LOAD and STOP.  @return as ps_conn_send_msg. */
int ps_conn_send_pong(ps_conn *c, uint64_t request_id, uint64_t token);

/* Send an ERROR frame, stop reading, and close once it is written. */
void ps_conn_fail(ps_conn *c, int code, uint32_t flags, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Close now (pending writes are cancelled: their done gets an error). */
void ps_conn_close(ps_conn *c);

/* The socket address of `a`: an IP literal, or a host name resolved now
 * (blocking, on `loop`).  @return 0 or a libuv error. */
int ps_net_resolve(uv_loop_t *loop, const ps_addr *a, struct sockaddr_storage *ss);

/* Bytes received and sent so far. */
uint64_t ps_conn_bytes_in(const ps_conn *c);
uint64_t ps_conn_bytes_out(const ps_conn *c);

#endif
