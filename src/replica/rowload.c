/* A lazy restore's rows (see rowload.h). */
#include "replica/rowload.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "replica/rows.h"

/* Background reads in flight at most: a bucket's hash is a few MB at most
 * (REDIS.md §3), and a fetch waits behind them. */
#define LOAD_WINDOW 2

typedef struct fetch {
  struct fetch *next;
  ps_rowload *rl;
  ps_shard_key *keys;     /* sorted by bucket */
  size_t n;
  size_t waiting;         /* HMGETs not answered */
  int sent;               /* on the connection of now */
  ps_rowload_done_fn *done;
  void *arg;
} fetch;

/* One HMGET of a fetch: its run of keys of one bucket. */
typedef struct fetch_run {
  fetch *f;
  size_t at, n;
} fetch_run;

struct ps_rowload {
  ps_link *link;
  ps_shard *shard;
  ps_rowload_failed_fn *failed;
  void *arg;
  uint64_t buckets;       /* 2^bits */
  uint64_t next;          /* the next bucket to ask for */
  int reading;            /* HGETALLs in flight */
  fetch *fetches;         /* not done yet */
  uint64_t t0_ns, rows;
  int ended;              /* every bucket in (or failed) */
};

static void load_more(ps_rowload *rl);

static void fail(ps_rowload *rl, const char *why) {
  if (rl->ended)
    return;
  rl->ended = 1;
  rl->failed(rl->arg, why);
}

static void fetch_done(ps_rowload *rl, fetch *f) {
  fetch **pp = &rl->fetches;
  while (*pp != f)
    pp = &(*pp)->next;
  *pp = f->next;
  f->done(f->arg);
  free(f->keys);
  free(f);
}

static void on_fetched(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  fetch_run *run = priv;
  fetch *f = run->f;
  ps_rowload *rl = f->rl;
  redisReply *r = reply;
  f->waiting--;
  if (r == NULL) {
    f->sent = 0;  /* the connection went: asked again on the next */
  } else if (r->type == REDIS_REPLY_ERROR) {
    char why[800];
    snprintf(why, sizeof why, "fetching rows of bucket %" PRIu32 ": %s", f->keys[run->at].bucket,
             r->str);
    ps_link_check_role(rl->link, r);
    f->sent = 0;
    if (!ps_link_is_fenced(r))
      ps_log(PS_LOG_WARN, "redis: %s (asked again)", why);
  } else {
    ps_errbuf eb = {0};
    if (ps_rows_take_some(rl->shard, f->keys + run->at, run->n, r, &eb) != 0) {
      char why[800];
      snprintf(why, sizeof why, "the rows of bucket %" PRIu32 ": %s", f->keys[run->at].bucket,
               eb.msg);
      free(run);
      fail(rl, why);
      return;
    }
  }
  free(run);
  if (f->waiting == 0 && f->sent)
    fetch_done(rl, f);
}

static void fetch_send(ps_rowload *rl, fetch *f) {
  redisAsyncContext *ac = ps_link_ac(rl->link);
  if (f->sent || ac == NULL || !ps_link_up(rl->link))
    return;
  f->sent = 1;
  for (size_t at = 0; at < f->n; at += ps_rows_run(f->keys + at, f->n - at)) {
    size_t n = ps_rows_run(f->keys + at, f->n - at);
    ps_rows_hmget h;
    fetch_run *run = malloc(sizeof *run);
    if (run == NULL || ps_rows_hmget_make(&h, rl->link->k->rows_prefix, f->keys + at, n) != 0) {
      free(run);
      f->sent = 0;
      return;
    }
    *run = (fetch_run){f, at, n};
    int rc = redisAsyncCommandArgv(ac, on_fetched, run, h.argc, h.argv, h.argl);
    ps_rows_hmget_free(&h);
    if (rc != REDIS_OK) {
      free(run);
      f->sent = 0;
      return;
    }
    f->waiting++;
  }
}

int ps_rowload_fetch(ps_rowload *rl, const ps_shard_key *keys, size_t n, ps_rowload_done_fn *done,
                     void *arg) {
  fetch *f = calloc(1, sizeof *f);
  if (f == NULL || (f->keys = malloc((n ? n : 1) * sizeof *keys)) == NULL) {
    free(f);
    return -ENOMEM;
  }
  memcpy(f->keys, keys, n * sizeof *keys);
  ps_rows_sort(f->keys, n);
  *f = (fetch){.rl = rl, .keys = f->keys, .n = n, .done = done, .arg = arg, .next = rl->fetches};
  rl->fetches = f;
  fetch_send(rl, f);
  return 0;
}

/* ------------------------------------------------------ the background */

typedef struct bucket_read {
  ps_rowload *rl;
  uint64_t bucket;
} bucket_read;

static void on_bucket(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  bucket_read *b = priv;
  ps_rowload *rl = b->rl;
  redisReply *r = reply;
  uint64_t bucket = b->bucket;
  free(b);
  rl->reading--;
  if (r == NULL || rl->ended) {
    /* The connection went: asked again from the first bucket not in. */
    if (rl->next > bucket)
      rl->next = bucket;
    return;
  }
  if (r->type != REDIS_REPLY_ARRAY) {
    ps_link_check_role(rl->link, r);
    if (rl->next > bucket)
      rl->next = bucket;
    return;
  }
  ps_errbuf eb = {0};
  uint64_t got[PS_SHARD_MAX_TABLES][2] = {{0}};
  int rc = ps_rows_take_all(rl->shard, r, 1, got, &eb);
  if (rc == 0) {
    for (int t = 0; t < ps_shard_ntables(rl->shard); t++)
      rl->rows += got[t][0] + got[t][1];
    rc = ps_shard_lazy_bucket(rl->shard, (uint32_t)bucket);
  }
  if (rc < 0) {
    char why[800];
    snprintf(why, sizeof why, "%s%" PRIu64 ": %s", rl->link->k->rows_prefix, bucket,
             rc == -ENOMEM ? "out of memory" : eb.msg);
    fail(rl, why);
    return;
  }
  if (rc == 1) {
    rl->ended = 1;
    ps_log(PS_LOG_INFO, "tables loaded from Redis: %" PRIu64 " entries in %.3f s after the "
           "shard began serving", rl->rows, (double)(ps_now_ns() - rl->t0_ns) * 1e-9);
    return;
  }
  load_more(rl);
}

static void load_more(ps_rowload *rl) {
  redisAsyncContext *ac = ps_link_ac(rl->link);
  if (ac == NULL || !ps_link_up(rl->link))
    return;
  while (!rl->ended && rl->reading < LOAD_WINDOW && rl->next < rl->buckets) {
    bucket_read *b = malloc(sizeof *b);
    if (b == NULL)
      return;
    *b = (bucket_read){rl, rl->next};
    if (redisAsyncCommand(ac, on_bucket, b, "HGETALL %s%" PRIu64, rl->link->k->rows_prefix,
                          rl->next) != REDIS_OK) {
      free(b);
      return;
    }
    rl->next++;
    rl->reading++;
  }
}

void ps_rowload_up(ps_rowload *rl) {
  for (fetch *f = rl->fetches; f != NULL; f = f->next)
    fetch_send(rl, f);
  load_more(rl);
}

ps_rowload *ps_rowload_new(ps_link *l, ps_shard *shard, ps_rowload_failed_fn *failed,
                           void *arg) {
  ps_rowload *rl = calloc(1, sizeof *rl);
  if (rl == NULL)
    return NULL;
  uint64_t done = 0;
  *rl = (ps_rowload){.link = l, .shard = shard, .failed = failed, .arg = arg,
                     .t0_ns = ps_now_ns()};
  ps_shard_lazy_progress(shard, &done, &rl->buckets);
  return rl;
}

void ps_rowload_free(ps_rowload *rl) {
  if (rl == NULL)
    return;
  while (rl->fetches != NULL)
    fetch_done(rl, rl->fetches);
  free(rl);
}
