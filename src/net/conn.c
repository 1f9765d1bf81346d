/* A framed connection on a libuv TCP handle (see conn.h). */
#include "net/conn.h"

#include "net/conn_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Frames start at an offset of 8 mod 16 in the read buffer, so that every
 * payload (after the 24-byte header) is 16-byte aligned and its floats can
 * be used in place. */
#define FRAME_BASE 8
#define READ_CHUNK (256 * 1024)

typedef struct wreq {
  uv_write_t req;
  ps_conn *c;
  void (*done)(void *arg, int status);
  void *arg;
  uint8_t bytes[];
} wreq;

ps_conn *ps_conn_new(uv_loop_t *loop, const ps_conn_cbs *cbs, void *data) {
  ps_conn *c = calloc(1, sizeof *c);
  if (c == NULL)
    return NULL;
  if (uv_tcp_init(loop, &c->tcp) != 0) {
    free(c);
    return NULL;
  }
  c->cbs = *cbs;
  c->data = data;
  c->tcp.data = c;
  snprintf(c->peer, sizeof c->peer, "?");
  return c;
}

uv_tcp_t *ps_conn_tcp(ps_conn *c) { return &c->tcp; }
void *ps_conn_data(const ps_conn *c) { return c->data; }
void ps_conn_set_data(ps_conn *c, void *data) { c->data = data; }
const char *ps_conn_peer(const ps_conn *c) { return c->peer; }
uint64_t ps_conn_bytes_in(const ps_conn *c) { return c->bytes_in; }
uint64_t ps_conn_bytes_out(const ps_conn *c) { return c->bytes_out; }

static void on_closed(uv_handle_t *h) {
  ps_conn *c = h->data;
  if (c->cbs.on_close != NULL)
    c->cbs.on_close(c, c->err, c->why);
  free(c->rbuf);
  free(c);
}

/* Close with a reason; the first reason given is the one reported. */
static void close_with(ps_conn *c, int err, const char *why) {
  if (c->closing)
    return;
  c->closing = 1;
  c->err = err;
  if (c->on_closing != NULL)
    c->on_closing(c);
  if (why != c->why)
    snprintf(c->why, sizeof c->why, "%s", why);
  uv_read_stop((uv_stream_t *)&c->tcp);
  uv_close((uv_handle_t *)&c->tcp, on_closed);
}

void ps_conn_close(ps_conn *c) { close_with(c, 0, "closed"); }

/* Make room for at least `need` bytes after rlen, keeping [rpos, rlen) and
 * moving it to FRAME_BASE.  @return 0 or UV_ENOMEM. */
static int reserve(ps_conn *c, size_t need) {
  size_t have = c->rlen - c->rpos;
  if (c->rbuf != NULL && c->rcap - c->rlen >= need)
    return 0;
  if (c->rbuf != NULL && c->rpos > FRAME_BASE && c->rcap - FRAME_BASE - have >= need) {
    memmove(c->rbuf + FRAME_BASE, c->rbuf + c->rpos, have);
  } else {
    size_t cap = FRAME_BASE + have + need;
    if (cap < 2 * c->rcap && c->rcap < 64u * 1024 * 1024)
      cap = 2 * c->rcap;
    void *p = NULL;
    if (posix_memalign(&p, 64, cap) != 0)
      return UV_ENOMEM;
    if (have)
      memcpy((uint8_t *)p + FRAME_BASE, c->rbuf + c->rpos, have);
    free(c->rbuf);
    c->rbuf = p;
    c->rcap = cap;
  }
  c->rpos = FRAME_BASE;
  c->rlen = FRAME_BASE + have;
  return 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  ps_conn *c = h->data;
  /* Until the handshake is done a frame is small (PS_PROTO_SMALL_PAYLOAD_MAX),
   * and so is the buffer: a peer that never authenticates costs ~2 KiB. */
  size_t need = c->handshake_done ? READ_CHUNK : PS_PROTO_HEADER_SIZE + PS_PROTO_SMALL_PAYLOAD_MAX;
  if (c->have_hdr) {
    /* Room for the rest of this frame at once, so a large payload is read
     * straight into place. */
    size_t frame = PS_PROTO_HEADER_SIZE + (size_t)c->hdr.length;
    size_t have = c->rlen - c->rpos;
    if (frame > have && frame - have > need)
      need = frame - have;
  }
  if (reserve(c, need) != 0) {
    buf->base = NULL;
    buf->len = 0;
    return;
  }
  buf->base = (char *)c->rbuf + c->rlen;
  buf->len = c->rcap - c->rlen;
}

void ps_conn_hold(ps_conn *c) { c->held = 1; }

static void release(ps_conn *c) {
  if (!c->held)
    return;
  c->held = 0;
  if (c->cbs.on_release != NULL)
    c->cbs.on_release(c);
}

static void process(ps_conn *c) {
  while (!c->closing && !c->failing) {
    size_t avail = c->rlen - c->rpos;
    if (!c->have_hdr) {
      if (avail < PS_PROTO_HEADER_SIZE)
        break;
      ps_errbuf eb = {0};
      if (ps_proto_decode_header(c->rbuf + c->rpos, c->max_payload, &c->hdr, &eb) != 0) {
        ps_conn_fail(c, eb.code, 0, "%s", eb.msg);
        break;
      }
      c->have_hdr = 1;
      if (c->rpos % 16 != FRAME_BASE) {
        /* Align the payload: the unread bytes move up by under 16 bytes,
         * leaving the frames handled in place; back to the start of the
         * buffer only when there is no room (then nothing may be held). */
        size_t up = (FRAME_BASE + 16 - c->rpos % 16) % 16, to = c->rpos + up;
        if (c->rcap - c->rlen < up) {
          release(c);
          to = FRAME_BASE;
        }
        memmove(c->rbuf + to, c->rbuf + c->rpos, avail);
        c->rpos = to;
        c->rlen = to + avail;
      }
    }
    size_t frame = PS_PROTO_HEADER_SIZE + (size_t)c->hdr.length;
    if (avail < frame)
      break;
    ps_frame_header h = c->hdr;
    const uint8_t *payload = c->rbuf + c->rpos + PS_PROTO_HEADER_SIZE;
    c->rpos += frame;
    c->have_hdr = 0;
    c->cbs.on_frame(c, &h, payload);
  }
  release(c);
  if (c->rpos == c->rlen)
    c->rpos = c->rlen = FRAME_BASE;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  ps_conn *c = s->data;
  if (nread < 0) {
    close_with(c, (int)nread, nread == UV_EOF ? "peer closed the connection" : uv_strerror((int)nread));
    return;
  }
  if (nread == 0)
    return;
  if (c->closing || c->failing)
    return;
  c->rlen += (size_t)nread;
  c->bytes_in += (uint64_t)nread;
  process(c);
}

void ps_conn_handshake_done(ps_conn *c, uint64_t max_payload) {
  c->max_payload = max_payload;
  c->handshake_done = 1;
}

int ps_conn_start(ps_conn *c) {
  c->max_payload = PS_PROTO_SMALL_PAYLOAD_MAX;
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *a = (struct sockaddr_in *)&ss;
      uv_ip4_name(a, ip, sizeof ip);
      port = ntohs(a->sin_port);
      snprintf(c->peer, sizeof c->peer, "%s:%d", ip, port);
    } else if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      uv_ip6_name(a, ip, sizeof ip);
      port = ntohs(a->sin6_port);
      snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip, port);
    }
  }
  /* Requests are small and answered at once: Nagle's delay would only add
   * latency to every pull and push. */
  uv_tcp_nodelay(&c->tcp, 1);
  return uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

int ps_conn_set_peer_timeout(ps_conn *c, unsigned timeout_ms) {
  /* tcp(7): with SO_KEEPALIVE, an idle connection sends its first probe
   * after TCP_KEEPIDLE seconds without receiving, then one every
   * TCP_KEEPINTVL seconds; TCP_USER_TIMEOUT (ms) overrides TCP_KEEPCNT: at
   * a probe, once nothing was received for that long, the connection is
   * dropped.  It also bounds how long sent data may stay unacknowledged
   * (a busy connection to a dead peer) or unsent behind a zero window.
   * So: probes from timeout - 1 s, one a second, and the cut at the
   * timeout.  A paused peer's kernel answers probes and acknowledges data,
   * so a held pull to a stopped process stays open; only when the stopped
   * process's receive buffer is full (zero window) for the whole timeout
   * is its connection dropped, and the peer reconnects and re-sends when
   * it resumes. */
  unsigned secs = (timeout_ms + 999) / 1000;
  int idle = secs > 1 ? (int)secs - 1 : 1, intvl = 1, cnt = 1;
  int rc = uv_tcp_keepalive(&c->tcp, 1, (unsigned)idle);
  uv_os_fd_t fd;
  if (rc == 0)
    rc = uv_fileno((const uv_handle_t *)&c->tcp, &fd);
  if (rc != 0)
    return rc;
  if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof timeout_ms) != 0)
    return -errno;  /* libuv's errors are -errno on Unix */
  return 0;
}

static void on_written(uv_write_t *req, int status) {
  wreq *w = (wreq *)req;
  if (w->done != NULL)
    w->done(w->arg, status);
  free(w);
}

/* The non-empty parts of a write as libuv buffers.  @return their count. */
static unsigned write_bufs(const uint8_t *prefix, size_t plen, const void *data, size_t dlen,
                           const uint8_t *next, size_t nlen, uv_buf_t bufs[3]) {
  unsigned n = 0;
  if (plen)
    bufs[n++] = uv_buf_init((char *)prefix, (unsigned)plen);
  if (dlen)
    bufs[n++] = uv_buf_init((char *)data, (unsigned)dlen);
  if (nlen)
    bufs[n++] = uv_buf_init((char *)next, (unsigned)nlen);
  return n;
}

int ps_conn_try_send(ps_conn *c, const uint8_t *prefix, size_t plen, const void *data,
                     size_t dlen, size_t *sent) {
  *sent = 0;
  if (c->closing || c->failing)
    return UV_ECANCELED;
  uv_buf_t bufs[3];
  unsigned nbufs = write_bufs(prefix, plen, data, dlen, NULL, 0, bufs);
  /* libuv answers UV_EAGAIN while writes are queued, keeping frames in order. */
  int n = nbufs ? uv_try_write((uv_stream_t *)&c->tcp, bufs, nbufs) : 0;
  if (n == UV_EAGAIN)
    return 0;
  if (n < 0)
    return n;
  *sent = (size_t)n;
  c->bytes_out += (size_t)n;
  return 0;
}

int ps_conn_send_with(ps_conn *c, const uint8_t *prefix, size_t plen, const void *data,
                      size_t dlen, const uint8_t *next, size_t nlen,
                      void (*done)(void *arg, int status), void *arg) {
  if (c->closing)
    return UV_ECANCELED;
  wreq *w = malloc(sizeof *w + plen + nlen);
  if (w == NULL)
    return UV_ENOMEM;
  if (plen)
    memcpy(w->bytes, prefix, plen);  /* a frame built whole goes as `next` alone */
  if (nlen)
    memcpy(w->bytes + plen, next, nlen);
  w->c = c;
  w->done = done;
  w->arg = arg;
  uv_buf_t bufs[3];
  unsigned nbufs = write_bufs(w->bytes, plen, data, dlen, w->bytes + plen, nlen, bufs);
  int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, bufs, nbufs, on_written);
  if (rc != 0) {
    free(w);
    return rc;
  }
  c->bytes_out += plen + dlen + nlen;
  return 0;
}

int ps_conn_send(ps_conn *c, const uint8_t *prefix, size_t plen, const void *data, size_t dlen,
                 void (*done)(void *arg, int status), void *arg) {
  return ps_conn_send_with(c, prefix, plen, data, dlen, NULL, 0, done, arg);
}

int ps_conn_send_msg(ps_conn *c, const ps_msg *m, uint64_t request_id) {
  uint8_t buf[PS_PROTO_HEADER_SIZE + PS_PROTO_SMALL_PAYLOAD_MAX];
  size_t n = ps_proto_encode(m, request_id, buf, sizeof buf);
  if (n == 0)
    return UV_EINVAL;
  return ps_conn_send(c, buf, n, NULL, 0, NULL, NULL);
}

int ps_conn_send_challenge(ps_conn *c, uint8_t nonce[PS_PROTO_NONCE_SIZE], int role,
                           uint32_t index, uint64_t incarnation) {
  ps_msg m = {.type = PS_MSG_CHALLENGE};
  if (RAND_bytes(nonce, PS_PROTO_NONCE_SIZE) != 1)
    return UV_EIO;
  memcpy(m.u.challenge.nonce, nonce, PS_PROTO_NONCE_SIZE);
  m.u.challenge.role = (uint8_t)role;
  m.u.challenge.index = index;
  m.u.challenge.incarnation = incarnation;
  return ps_conn_send_msg(c, &m, 0);
}

int ps_conn_send_pong(ps_conn *c, uint64_t request_id, uint64_t token) {
  ps_msg m = {.type = PS_MSG_PONG};
  m.u.ping.token = token;
  return ps_conn_send_msg(c, &m, request_id);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  (void)status;
  ps_conn *c = req->data;
  c->failing = 0;
  close_with(c, c->err, c->why);
}

void ps_conn_fail(ps_conn *c, int code, uint32_t flags, const char *fmt, ...) {
  if (c->closing || c->failing)
    return;
  ps_msg m = {.type = PS_MSG_ERROR};
  m.u.error.code = code;
  m.u.error.flags = flags;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m.u.error.message, sizeof m.u.error.message, fmt, ap);
  va_end(ap);
  for (char *p = m.u.error.message; *p; p++)
    if (*p == '\n' || *p == '\r' || (unsigned char)*p < 0x20)
      *p = ' ';
  snprintf(c->why, sizeof c->why, "%s", m.u.error.message);
  c->err = code;
  uv_read_stop((uv_stream_t *)&c->tcp);
  c->failing = 1;
  /* The ERROR frame goes out first; the shutdown completes after it. */
  ps_conn_send_msg(c, &m, 0);
  c->shutdown.data = c;
  if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
    c->failing = 0;
    close_with(c, code, c->why);
  }
}

int ps_net_resolve(uv_loop_t *loop, const ps_addr *a, struct sockaddr_storage *ss) {
  memset(ss, 0, sizeof *ss);
  if (uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)ss) == 0 ||
      uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)ss) == 0)
    return 0;
  uv_getaddrinfo_t req;
  char port[8];
  snprintf(port, sizeof port, "%u", a->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  int rc = uv_getaddrinfo(loop, &req, NULL, a->host, port, &hints);
  if (rc != 0)
    return rc;
  memcpy(ss, req.addrinfo->ai_addr, req.addrinfo->ai_addrlen);
  uv_freeaddrinfo(req.addrinfo);
  return 0;
}
