/* Requests that wait for their rows (see rowwait.h). */
#include "ps/rowwait.h"

#include <errno.h>
#include <string.h>

#include "ps/server_internal.h"

struct rowwait_frame {
  struct rowwait_frame *next;
  int fetched;            /* its rows were asked for and came: handle it without asking again */
  ps_frame_header h;
  uint8_t payload[];
};

/* The keys of m that are not in yet, into s->miss: @return how many, or
 * -ENOMEM. */
static long missing(server *s, const ps_msg *m) {
  if (m->type == PS_MSG_PULL)
    return ps_shard_lazy_missing(s->shard, PS_SPARSE_K, m->u.pull.sparse.data,
                                 m->u.pull.sparse.bytes, &s->miss, &s->miss_cap);
  return ps_shard_lazy_missing(s->shard, PS_SPARSE_KV, m->u.push.sparse.data,
                               m->u.push.sparse.bytes, &s->miss, &s->miss_cap);
}

static void drain(client *cl);

static void on_fetched(void *arg) {
  client *cl = arg;
  cl->rw_fetching = 0;
  if (!cl->closed && cl->rw_head != NULL && cl->srv->phase != PS_PHASE_STOPPING) {
    cl->rw_head->fetched = 1;
    drain(cl);
  }
  client_unref(cl);
}

/* Ask for the n keys in s->miss; @return 0 (on_fetched follows), 1 (no
 * fetch needed), -ENOMEM. */
static int fetch(client *cl, long n) {
  server *s = cl->srv;
  int rc = ps_durable_fetch(s->durable, s->miss, (size_t)n, on_fetched, cl);
  if (rc == 0) {
    cl->rw_fetching = 1;
    cl->refs++;
  }
  return rc;
}

static int keep(client *cl, const ps_frame_header *h, const uint8_t *payload) {
  struct rowwait_frame *f = malloc(sizeof *f + h->length);
  if (f == NULL)
    return -ENOMEM;
  f->next = NULL;
  f->fetched = 0;
  f->h = *h;
  memcpy(f->payload, payload, h->length);
  if (cl->rw_tail != NULL)
    cl->rw_tail->next = f;
  else
    cl->rw_head = f;
  cl->rw_tail = f;
  return 0;
}

/* Handle the waiting frames in order, until one must wait for rows. */
static void drain(client *cl) {
  server *s = cl->srv;
  while (cl->rw_head != NULL && !cl->rw_fetching && !cl->closed) {
    struct rowwait_frame *f = cl->rw_head;
    ps_msg m;
    ps_errbuf eb = {0};
    if (ps_proto_decode(&f->h, f->payload, f->h.length, &m, &eb) != 0)
      return;  /* decoded once already: cannot happen */
    if (!f->fetched) {
      long n = missing(s, &m);
      int rc = n > 0 ? fetch(cl, n) : n < 0 ? -ENOMEM : 1;
      if (rc == 0)
        return;
      if (rc < 0) {
        ps_conn_fail(cl->conn, -ENOMEM, PS_ERROR_RETRY, "shard %d: out of memory fetching rows",
                     s->index);
        return;
      }
    }
    cl->rw_head = f->next;
    if (cl->rw_head == NULL)
      cl->rw_tail = NULL;
    cl->rw_dispatch(cl, &f->h, f->payload, &m);
    free(f);
  }
}

int ps_rowwait_frame(client *cl, const ps_frame_header *h, const uint8_t *payload,
                     const ps_msg *m, ps_rowwait_dispatch_fn *dispatch) {
  server *s = cl->srv;
  if (m->type != PS_MSG_PULL && m->type != PS_MSG_PUSH)
    return 0;
  if (cl->rw_head == NULL) {
    if (!ps_shard_lazy(s->shard))
      return 0;
    long n = missing(s, m);
    if (n == 0)
      return 0;
    if (n < 0 || keep(cl, h, payload) != 0)
      return -ENOMEM;
    cl->rw_dispatch = dispatch;
    int rc = fetch(cl, n);
    if (rc == 1) {
      cl->rw_head->fetched = 1;
      drain(cl);
    }
    return rc < 0 ? -ENOMEM : 1;
  }
  if (keep(cl, h, payload) != 0)
    return -ENOMEM;
  return 1;
}

void ps_rowwait_closed(client *cl) {
  while (cl->rw_head != NULL) {
    struct rowwait_frame *f = cl->rw_head;
    cl->rw_head = f->next;
    free(f);
  }
  cl->rw_tail = NULL;
}
