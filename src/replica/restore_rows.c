/* The sparse tables' rows at a shard's start-up (see restore_rows.h,
 * REDIS.md §7).  hiredis's blocking API, every command under [redis]
 * timeout_ms. */
#include "replica/restore_rows.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timeutil.h"
#include "proto/proto.h"
#include "replica/rows.h"

/* eb's message with where it was found in front ("<where>: <message>"). */
__attribute__((format(printf, 3, 4))) static int err_at(ps_errbuf *eb, int code,
                                                        const char *fmt, ...) {
  char where[PS_KEY_MAX + 80], why[sizeof eb->msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(where, sizeof where, fmt, ap);
  va_end(ap);
  snprintf(why, sizeof why, "%s", eb->msg);
  return ps_err_set(eb, code, "%s: %s", where, why);
}

/* Each chunk is read and checked here first (Redis does not roll a
 * script back), then merged by the MERGE script (rows.h). */
int ps_restore_finish_merges(void *ctx, const ps_shard_keys *k, const void *meta_reply,
                             ps_restore_info *info, ps_errbuf *eb) {
  redisContext *c = ctx;
  const redisReply *meta = meta_reply;
  uint64_t merged = 0, deltas = 0;
  const redisReply *snap = ps_redis_field(meta, "snap");
  if (ps_redis_field_u64(meta, "merged", &merged) || ps_redis_field_u64(meta, "deltas", &deltas) ||
      snap == NULL || snap->type != REDIS_REPLY_STRING)
    return ps_err_set(eb, PS_ECORRUPT, "%s: incomplete snapshot metadata (no merged, deltas)",
                      k->meta);
  for (uint64_t i = merged; i < deltas; i++) {
    char chunk[PS_KEY_MAX + 80];
    snprintf(chunk, sizeof chunk, "%s%s:d%" PRIu64, k->snap_prefix, snap->str, i);
    redisReply *r = redisCommand(c, "GET %s", chunk);
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
      int rc = ps_err_set(eb, -EIO, "%s: GET failed: %s", chunk, r ? r->str : c->errstr);
      freeReplyObject(r);
      return rc;
    }
    if (r->type != REDIS_REPLY_STRING) {
      freeReplyObject(r);
      /* Merged since the meta was read (a stale incarnation's merge)? */
      redisReply *m = redisCommand(c, "HGET %s merged", k->meta);
      int done = m != NULL && m->type == REDIS_REPLY_STRING && strtoull(m->str, NULL, 10) > i;
      freeReplyObject(m);
      if (done)
        continue;
      return ps_err_set(eb, PS_ECORRUPT, "%s: delta chunk %" PRIu64 " of %" PRIu64 " missing "
                        "before its merge (restore from a checkpoint: delete the keys of %s)",
                        chunk, i, deltas, k->tag);
    }
    uint32_t *buckets = NULL;
    size_t ng = 0;
    int rc = ps_delta_check(r->str, r->len, PS_ROWS_MAX_BITS, &buckets, &ng, eb);
    freeReplyObject(r);
    if (rc != 0)
      return rc == -ENOMEM ? ps_err_set(eb, -ENOMEM, "out of memory for a delta chunk")
                           : err_at(eb, PS_ECORRUPT, "%s", chunk);
    ps_rows_merge m;
    rc = ps_rows_merge_make(&m, k, snap->str, i, buckets, ng);
    free(buckets);
    if (rc != 0)
      return ps_err_set(eb, -ENOMEM, "out of memory for a merge");
    r = redisCommandArgv(c, m.argc, m.argv, NULL);
    ps_rows_merge_free(&m);
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
      int corrupt = r != NULL && (strncmp(r->str, "CORRUPT", 7) == 0 ||
                                  strncmp(r->str, "LOST", 4) == 0);
      rc = ps_err_set(eb, corrupt ? PS_ECORRUPT : -EIO, "%s: merge failed: %s", chunk,
                      r ? r->str : c->errstr);
      freeReplyObject(r);
      return rc;
    }
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 1)
      info->merged++;
    freeReplyObject(r);
  }
  return 0;
}

/* Buckets read at once (pipelined HGETALLs). */
#define ROWS_WINDOW 16

/* Format 5: the tables' entries from the rows' hashes, into the shard's
 * tables (which the image left empty).  A shard whose tables never evict
 * serves before they are in (lazy, TABLE.md "Lazy loads"): the load only
 * begins here, with the lists' newest stamps, and the replica brings the
 * buckets in while the shard serves (rowload.c).  Otherwise every hash is
 * read now, the entries ranked, the lists linked, and the counts must be
 * the meta's `rows`. */
int ps_restore_load_rows(void *ctx, const ps_shard_keys *k, const void *meta_reply, ps_shard *s,
                         ps_restore_info *info, ps_errbuf *eb) {
  redisContext *c = ctx;
  const redisReply *meta = meta_reply;
  const ps_shard_opts *o = ps_shard_options(s);
  uint64_t bits = 0, rank_next = 0;
  const redisReply *rows = ps_redis_field(meta, "rows");
  if (ps_redis_field_u64(meta, "row_bits", &bits) ||
      ps_redis_field_u64(meta, "rank_next", &rank_next) ||
      rows == NULL || rows->type != REDIS_REPLY_STRING || bits > PS_ROWS_MAX_BITS)
    return ps_err_set(eb, PS_ECORRUPT, "%s: incomplete snapshot metadata (row_bits, rank_next, "
                      "rows)", k->meta);
  info->rank_next = rank_next;
  if (o->ntables == 0)
    return 0;
  uint64_t want[PS_SHARD_MAX_TABLES][2], newest[PS_SHARD_MAX_TABLES][2];
  uint64_t got[PS_SHARD_MAX_TABLES][2] = {{0}};
  const char *p = rows->str;
  for (int t = 0; t < o->ntables; t++) {
    int used = 0;
    if (sscanf(p, "%" SCNu64 ":%" SCNu64 ":%" SCNu64 ":%" SCNu64 "%n", &want[t][0], &want[t][1],
               &newest[t][0], &newest[t][1], &used) != 4 ||
        (p[used] != (t + 1 < o->ntables ? ',' : '\0')))
      return ps_err_set(eb, PS_ECORRUPT, "%s: rows \"%s\", expected <rows>:<pending>:<newest "
                        "row>:<newest pending> for each of %d tables", k->meta, rows->str,
                        o->ntables);
    p += used + (t + 1 < o->ntables);
  }
  /* Lazily, the maps grow as the rows come in: reserving them for every
   * row first (their slots memset, 0.1 s at 5 M rows) would put a time
   * that grows with the table before the shard serves. */
  if (info->cfg->ps_lazy_restore && ps_shard_lazy_begin(s, (unsigned)bits, newest) == 0) {
    info->lazy = 1;
    return 0;
  }
  for (int t = 0; t < o->ntables; t++)
    if (ps_shard_rows_reserve(s, t, want[t][0], want[t][1]) != 0)
      return ps_err_set(eb, -ENOMEM, "out of memory for %" PRIu64 " rows", want[t][0]);
  uint64_t nb = 1ull << bits;
  int rc = 0;
  for (uint64_t b0 = 0; b0 < nb && rc == 0; b0 += ROWS_WINDOW) {
    uint64_t b1 = b0 + ROWS_WINDOW < nb ? b0 + ROWS_WINDOW : nb;
    for (uint64_t b = b0; b < b1; b++)
      redisAppendCommand(c, "HGETALL %s%" PRIu64, k->rows_prefix, b);
    for (uint64_t b = b0; b < b1; b++) {
      redisReply *r = NULL;
      if (redisGetReply(c, (void **)&r) != REDIS_OK || r == NULL || r->type != REDIS_REPLY_ARRAY) {
        if (rc == 0)
          rc = ps_err_set(eb, -EIO, "%s%" PRIu64 ": HGETALL failed: %s", k->rows_prefix, b,
                          r && r->str ? r->str : c->errstr);
        freeReplyObject(r);
        if (c->err)
          break;
        continue;
      }
      if (rc == 0 && (rc = ps_rows_take_all(s, r, 0, got, eb)) != 0 && rc != -ENOMEM)
        rc = err_at(eb, PS_ECORRUPT, "%s%" PRIu64, k->rows_prefix, b);
      freeReplyObject(r);
    }
  }
  for (int t = 0; rc == 0 && t < o->ntables; t++) {
    info->rows += got[t][0] + got[t][1];
    if (got[t][0] != want[t][0] || got[t][1] != want[t][1]) {
      char name[64];
      ps_tsec_table shapes[PS_SHARD_MAX_TABLES];
      ps_rows_shapes(o, shapes);
      rc = ps_err_set(eb, PS_ECORRUPT, "%s*: %s holds %" PRIu64 " rows and %" PRIu64 " pending "
                      "keys, the meta says %" PRIu64 " and %" PRIu64 " (restore from a "
                      "checkpoint: delete the keys of %s)", k->rows_prefix,
                      ps_tsec_table_name(shapes, t, name, sizeof name), got[t][0], got[t][1],
                      want[t][0], want[t][1], k->tag);
    }
  }
  if (rc == 0 && ps_shard_rows_link(s) != 0)
    rc = ps_err_set(eb, -ENOMEM, "out of memory linking the tables' rows");
  return rc;
}

/* A lazy load: the entries of keys[0..n) that are not in yet, fetched
 * (HMGET, one per bucket, pipelined) before a replayed entry touches
 * them. */
static int fetch_keys(redisContext *c, const ps_shard_keys *k, ps_shard *s, ps_shard_key *keys,
                      size_t n, ps_errbuf *eb) {
  ps_rows_sort(keys, n);
  size_t sent = 0;
  int rc = 0;
  for (size_t at = 0; at < n && rc == 0; at += ps_rows_run(keys + at, n - at), sent++) {
    ps_rows_hmget h;
    if (ps_rows_hmget_make(&h, k->rows_prefix, keys + at, ps_rows_run(keys + at, n - at)) != 0)
      return ps_err_set(eb, -ENOMEM, "out of memory for a fetch");
    redisAppendCommandArgv(c, h.argc, h.argv, h.argl);
    ps_rows_hmget_free(&h);
  }
  for (size_t at = 0; sent > 0; at += ps_rows_run(keys + at, n - at), sent--) {
    redisReply *r = NULL;
    if (redisGetReply(c, (void **)&r) != REDIS_OK || r == NULL || r->type == REDIS_REPLY_ERROR) {
      if (rc == 0)
        rc = ps_err_set(eb, -EIO, "%s%" PRIu32 ": HMGET failed: %s", k->rows_prefix,
                        keys[at].bucket, r && r->str ? r->str : c->errstr);
      freeReplyObject(r);
      if (c->err)
        break;
      continue;
    }
    if (rc == 0 && (rc = ps_rows_take_some(s, keys + at, ps_rows_run(keys + at, n - at), r,
                                           eb)) != 0 && rc != -ENOMEM)
      rc = err_at(eb, PS_ECORRUPT, "%s%" PRIu32, k->rows_prefix, keys[at].bucket);
    freeReplyObject(r);
  }
  return rc;
}

/* A lazy load: the rows a page of log entries touches that are not in
 * yet, fetched before any of them is applied (one pipelined round of
 * HMGETs a page).  A key one of them admits is fetched too: Redis does
 * not hold it, and nothing comes in for it.  Entries that do not parse
 * are the replay's to refuse. */
int ps_restore_prefetch(void *ctx, const ps_shard_keys *k, ps_shard *s, const void *page_reply,
                        ps_restore_info *info, ps_errbuf *eb) {
  redisContext *c = ctx;
  const redisReply *page = page_reply;
  size_t want = ps_shard_options(s)->nfloats * sizeof(float);
  ps_shard_key *all = NULL, *one = NULL;
  size_t nall = 0, cap_all = 0, cap_one = 0;
  int rc = 0;
  for (size_t i = 0; i < page->elements && rc == 0; i++) {
    const redisReply *e = page->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2)
      continue;
    const redisReply *v = ps_redis_field(e->element[1], "v");
    if (v == NULL || v->type != REDIS_REPLY_STRING || v->len <= want ||
        ps_sparse_check(PS_SPARSE_KV, (const uint8_t *)v->str + want, v->len - want, NULL,
                        &(ps_errbuf){0}) != 0)
      continue;
    long n = ps_shard_lazy_missing(s, PS_SPARSE_KV, v->str + want, v->len - want, &one, &cap_one);
    if (n > 0 && nall + (size_t)n > cap_all) {
      size_t cap = cap_all ? cap_all : 1024;
      while (cap < nall + (size_t)n)
        cap *= 2;
      ps_shard_key *a = realloc(all, cap * sizeof *a);
      if (a == NULL)
        n = -1;
      else
        all = a, cap_all = cap;
    }
    if (n < 0)
      rc = ps_err_set(eb, -ENOMEM, "out of memory for the log replay");
    else if (n > 0)
      memcpy(all + nall, one, (size_t)n * sizeof *one), nall += (size_t)n;
  }
  uint64_t t0 = ps_now_ns();
  if (rc == 0 && nall > 0)
    rc = fetch_keys(c, k, s, all, nall, eb);
  info->fetched += nall;
  info->fetch_s += (double)(ps_now_ns() - t0) * 1e-9;
  free(all);
  free(one);
  return rc;
}

