/* The sparse tables' rows kept in Redis by key (see rows.h, REDIS.md §3). */
#include "replica/rows.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"

void ps_rows_field_put(uint8_t out[PS_ROWS_FIELD], uint32_t table, uint64_t key) {
  ps_put_le32(out, table);
  ps_put_le64(out + 4, key);
}

uint32_t ps_rows_value_bytes(const ps_tsec_table *t, int pending) {
  return PS_ROWS_VALUE_HEAD + (pending ? 0 : 4u * t->dim * (1 + t->nslots));
}

uint8_t *ps_rows_value_put(uint8_t *p, const ps_tsec_table *t, const ps_table_entry *e,
                           uint64_t rank) {
  ps_put_le64(p, rank);
  ps_put_le64(p + 8, e->count);
  ps_put_le64(p + 16, e->last_step);
  p += PS_ROWS_VALUE_HEAD;
  if (e->pending)
    return p;
  size_t bytes = 4u * (size_t)t->dim;
  memcpy(p, e->values, bytes);
  p += bytes;
  for (uint32_t k = 0; k < t->nslots; k++, p += bytes)
    memcpy(p, e->slots[k], bytes);
  return p;
}

int ps_rows_decode(const void *field, size_t flen, const void *value, size_t vlen,
                   const ps_tsec_table *tables, int n, float *scratch, int *t,
                   ps_table_entry *e, uint64_t *rank, ps_errbuf *eb) {
  const uint8_t *f = field, *v = value;
  if (flen != PS_ROWS_FIELD)
    return ps_err_set(eb, PS_ECORRUPT, "a field of %zu bytes, expected %d (table u32, key u64)",
                      flen, PS_ROWS_FIELD);
  uint32_t tab = ps_get_le32(f);
  uint64_t key = ps_get_le64(f + 4);
  if (tab >= (uint32_t)n)
    return ps_err_set(eb, PS_ECORRUPT, "key %" PRIu64 ": table %" PRIu32 ", this shard has %d",
                      key, tab, n);
  const ps_tsec_table *tb = &tables[tab];
  uint32_t row = ps_rows_value_bytes(tb, 0), pend = ps_rows_value_bytes(tb, 1);
  char name[64];
  if (vlen != row && vlen != pend)
    return ps_err_set(eb, PS_ECORRUPT, "%s, key %" PRIu64 ": a value of %zu bytes, expected %"
                      PRIu32 " (a row) or %" PRIu32 " (a pending key)",
                      ps_tsec_table_name(tables, (int)tab, name, sizeof name), key, vlen, row,
                      pend);
  *t = (int)tab;
  *rank = ps_get_le64(v);
  *e = (ps_table_entry){.pending = vlen == pend, .key = key, .count = ps_get_le64(v + 8),
                        .last_step = ps_get_le64(v + 16)};
  if (e->pending)
    return 0;
  memcpy(scratch, v + PS_ROWS_VALUE_HEAD, vlen - PS_ROWS_VALUE_HEAD);
  e->values = scratch;
  for (uint32_t k = 0; k < tb->nslots; k++)
    e->slots[k] = scratch + (size_t)(1 + k) * tb->dim;
  return 0;
}

size_t ps_rows_shapes(const ps_shard_opts *o, ps_tsec_table *out) {
  size_t most = 1;
  for (int t = 0; t < o->ntables; t++) {
    out[t] = (ps_tsec_table){.dim = o->tables[t].dim,
                             .nslots = (uint32_t)ps_optim_nslots(o->tables[t].optim.kind),
                             .name = o->table_names[t][0] ? o->table_names[t] : NULL};
    size_t f = (size_t)out[t].dim * (1 + out[t].nslots);
    most = f > most ? f : most;
  }
  return most;
}

/* One field and value into the shard. */
static int take_one(ps_shard *s, const ps_tsec_table *shapes, float *scratch, const void *field,
                    size_t flen, const void *value, size_t vlen, int lazy, uint64_t (*got)[2],
                    ps_errbuf *eb) {
  int t = 0;
  uint64_t rank = 0;
  ps_table_entry e;
  int rc = ps_rows_decode(field, flen, value, vlen, shapes, ps_shard_ntables(s), scratch, &t, &e,
                          &rank, eb);
  if (rc == 0)
    rc = lazy ? ps_shard_lazy_entry(s, t, &e, rank, eb) : ps_shard_row_load(s, t, &e, rank, eb);
  if (rc == 1)
    rc = 0;  /* held already */
  if (rc == 0 && got != NULL)
    got[t][e.pending]++;
  return rc;
}

int ps_rows_take_all(ps_shard *s, const void *reply, int lazy, uint64_t (*got)[2],
                     ps_errbuf *eb) {
  const redisReply *r = reply;
  ps_tsec_table shapes[PS_SHARD_MAX_TABLES];
  float *scratch = malloc(ps_rows_shapes(ps_shard_options(s), shapes) * sizeof(float));
  if (scratch == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory for a row");
  int rc = 0;
  for (size_t i = 0; rc == 0 && i + 1 < r->elements; i += 2) {
    const redisReply *f = r->element[i], *v = r->element[i + 1];
    if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
      rc = ps_err_set(eb, PS_ECORRUPT, "a field or value that is not a string");
    else
      rc = take_one(s, shapes, scratch, f->str, f->len, v->str, v->len, lazy, got, eb);
  }
  free(scratch);
  return rc;
}

int ps_rows_take_some(ps_shard *s, const ps_shard_key *keys, size_t n, const void *reply,
                      ps_errbuf *eb) {
  const redisReply *r = reply;
  if (r->type != REDIS_REPLY_ARRAY || r->elements != n)
    return ps_err_set(eb, PS_ECORRUPT, "HMGET of %zu fields answered %zu", n,
                      r->type == REDIS_REPLY_ARRAY ? r->elements : 0);
  ps_tsec_table shapes[PS_SHARD_MAX_TABLES];
  float *scratch = malloc(ps_rows_shapes(ps_shard_options(s), shapes) * sizeof(float));
  if (scratch == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory for a row");
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const redisReply *v = r->element[i];
    if (v->type == REDIS_REPLY_NIL)
      continue;  /* not in the copy: a key new to the table */
    uint8_t field[PS_ROWS_FIELD];
    ps_rows_field_put(field, keys[i].table, keys[i].key);
    rc = v->type != REDIS_REPLY_STRING
             ? ps_err_set(eb, PS_ECORRUPT, "a value that is not a string")
             : take_one(s, shapes, scratch, field, sizeof field, v->str, v->len, 1, NULL, eb);
  }
  free(scratch);
  return rc;
}

int ps_rows_hmget_make(ps_rows_hmget *h, const char *prefix, const ps_shard_key *keys, size_t n) {
  *h = (ps_rows_hmget){.argv = malloc((n + 2) * sizeof *h->argv),
                       .argl = malloc((n + 2) * sizeof *h->argl),
                       .fields = malloc(n * PS_ROWS_FIELD + 1)};
  if (h->argv == NULL || h->argl == NULL || h->fields == NULL) {
    ps_rows_hmget_free(h);
    return -ENOMEM;
  }
  snprintf(h->key, sizeof h->key, "%s%" PRIu32, prefix, keys[0].bucket);
  h->argv[0] = "HMGET";
  h->argl[0] = 5;
  h->argv[1] = h->key;
  h->argl[1] = strlen(h->key);
  for (size_t i = 0; i < n; i++) {
    uint8_t *f = h->fields + i * PS_ROWS_FIELD;
    ps_rows_field_put(f, keys[i].table, keys[i].key);
    h->argv[2 + i] = (const char *)f;
    h->argl[2 + i] = PS_ROWS_FIELD;
  }
  h->argc = (int)n + 2;
  return 0;
}

void ps_rows_hmget_free(ps_rows_hmget *h) {
  free(h->argv);
  free(h->argl);
  free(h->fields);
  *h = (ps_rows_hmget){0};
}

int ps_rows_merge_make(ps_rows_merge *m, const ps_shard_keys *keys, const char *snap, uint64_t k,
                       const uint32_t *buckets, size_t ng) {
  size_t plen = strlen(keys->rows_prefix);
  *m = (ps_rows_merge){.argv = malloc((ng + 8) * sizeof *m->argv),
                       .names = malloc(ng * (plen + 12) + 1)};
  if (m->argv == NULL || m->names == NULL) {
    ps_rows_merge_free(m);
    return -ENOMEM;
  }
  snprintf(m->chunk, sizeof m->chunk, "%s%s:d%" PRIu64, keys->snap_prefix, snap, k);
  snprintf(m->nkeys, sizeof m->nkeys, "%zu", ng + 2);
  snprintf(m->k, sizeof m->k, "%" PRIu64, k);
  m->argv[m->argc++] = "EVAL";
  m->argv[m->argc++] = PS_MERGE_SCRIPT;
  m->argv[m->argc++] = m->nkeys;
  m->argv[m->argc++] = keys->meta;
  m->argv[m->argc++] = m->chunk;
  for (size_t g = 0; g < ng; g++) {
    char *name = m->names + g * (plen + 12);
    snprintf(name, plen + 12, "%s%" PRIu32, keys->rows_prefix, buckets[g]);
    m->argv[m->argc++] = name;
  }
  m->argv[m->argc++] = snap;
  m->argv[m->argc++] = m->k;
  m->argv[m->argc++] = keys->rows_prefix;
  return 0;
}

void ps_rows_merge_free(ps_rows_merge *m) {
  free(m->argv);
  free(m->names);
  m->argv = NULL;
  m->names = NULL;
}

static int key_cmp(const void *a, const void *b) {
  const ps_shard_key *x = a, *y = b;
  if (x->bucket != y->bucket)
    return x->bucket < y->bucket ? -1 : 1;
  if (x->table != y->table)
    return x->table < y->table ? -1 : 1;
  return (x->key > y->key) - (x->key < y->key);
}

void ps_rows_sort(ps_shard_key *keys, size_t n) { qsort(keys, n, sizeof *keys, key_cmp); }

size_t ps_rows_run(const ps_shard_key *keys, size_t n) {
  size_t k = 1;
  while (k < n && keys[k].bucket == keys[0].bucket)
    k++;
  return n == 0 ? 0 : k;
}

/* ------------------------------------------------------------- deltas */

int ps_delta_init(ps_delta *d) {
  *d = (ps_delta){.buf = malloc(PS_DELTA_BYTES)};
  return d->buf != NULL ? 0 : -ENOMEM;
}

void ps_delta_clear(ps_delta *d) {
  d->len = 0;
  d->ngroups = 0;
}

void ps_delta_free(ps_delta *d) {
  free(d->buf);
  free(d->groups);
  *d = (ps_delta){0};
}

static uint64_t record_bytes(uint32_t vlen) {
  return PS_DELTA_RECORD + (vlen == PS_DELTA_REMOVE ? 0 : (uint64_t)vlen);
}

int ps_delta_fits(const ps_delta *d, uint32_t bucket, uint32_t vlen) {
  int open = d->ngroups > 0 && d->groups[d->ngroups - 1] == bucket;
  return d->len + (open ? 0 : PS_DELTA_GROUP) + record_bytes(vlen) <= PS_DELTA_BYTES;
}

static int group_open(ps_delta *d, uint32_t bucket, uint32_t flags) {
  if (d->ngroups == d->cap_groups) {
    size_t cap = d->cap_groups ? 2 * d->cap_groups : 256;
    uint32_t *g = realloc(d->groups, cap * sizeof *g);
    if (g == NULL)
      return -ENOMEM;
    d->groups = g;
    d->cap_groups = cap;
  }
  d->groups[d->ngroups++] = bucket;
  d->group_at = d->len;
  ps_put_le32(d->buf + d->len, bucket);
  ps_put_le32(d->buf + d->len + 4, flags);
  ps_put_le32(d->buf + d->len + 8, 0);
  d->len += PS_DELTA_GROUP;
  return 0;
}

int ps_delta_replace(ps_delta *d, uint32_t bucket) {
  if (d->len + PS_DELTA_GROUP > PS_DELTA_BYTES)
    return -ENOSPC;
  return group_open(d, bucket, PS_DELTA_REPLACE);
}

uint8_t *ps_delta_add(ps_delta *d, uint32_t bucket, uint32_t table, uint64_t key,
                      uint32_t vlen) {
  if (!(d->ngroups > 0 && d->groups[d->ngroups - 1] == bucket) &&
      group_open(d, bucket, 0) != 0)
    return NULL;
  uint8_t *g = d->buf + d->group_at;
  ps_put_le32(g + 8, ps_get_le32(g + 8) + 1);
  uint8_t *p = d->buf + d->len;
  ps_rows_field_put(p, table, key);
  ps_put_le32(p + 12, vlen);
  d->len += record_bytes(vlen);
  return p + PS_DELTA_RECORD;
}

int ps_delta_check(const void *buf, size_t len, unsigned bits, uint32_t **buckets,
                   size_t *groups, ps_errbuf *eb) {
  const uint8_t *b = buf;
  size_t at = 0, g = 0, cap = 0;
  uint32_t *out = NULL;
  int rc = 0;
  while (at < len && rc == 0) {
    if (len - at < PS_DELTA_GROUP) {
      rc = ps_err_set(eb, PS_ECORRUPT, "delta chunk: a group at byte %zu is cut short (%zu "
                      "bytes left, a group's head is %d)", at, len - at, PS_DELTA_GROUP);
      break;
    }
    uint32_t bucket = ps_get_le32(b + at), flags = ps_get_le32(b + at + 4);
    uint32_t nrec = ps_get_le32(b + at + 8);
    if (bucket >> bits != 0 || flags > PS_DELTA_REPLACE) {
      rc = ps_err_set(eb, PS_ECORRUPT, "delta chunk: the group at byte %zu has bucket %" PRIu32
                      " and flags %" PRIu32 ", expected a bucket below %u and flags 0 or 1", at,
                      bucket, flags, 1u << bits);
      break;
    }
    if (g == cap) {
      cap = cap ? 2 * cap : 64;
      uint32_t *more = realloc(out, cap * sizeof *out);
      if (more == NULL) {
        rc = -ENOMEM;
        break;
      }
      out = more;
    }
    out[g++] = bucket;
    size_t head = at;
    at += PS_DELTA_GROUP;
    for (uint32_t i = 0; i < nrec && rc == 0; i++) {
      uint32_t vlen = len - at >= PS_DELTA_RECORD ? ps_get_le32(b + at + 12) : 0;
      if (len - at < PS_DELTA_RECORD)
        rc = ps_err_set(eb, PS_ECORRUPT, "delta chunk: record %" PRIu32 " of the group at "
                        "byte %zu is cut short", i, head);
      else if (vlen != PS_DELTA_REMOVE && vlen > len - at - PS_DELTA_RECORD)
        rc = ps_err_set(eb, PS_ECORRUPT, "delta chunk: a value of %" PRIu32 " bytes at byte "
                        "%zu, %zu left", vlen, at + PS_DELTA_RECORD,
                        len - at - PS_DELTA_RECORD);
      else
        at += PS_DELTA_RECORD + (vlen == PS_DELTA_REMOVE ? 0 : vlen);
    }
  }
  if (rc != 0) {
    free(out);
    return rc;
  }
  *buckets = out;
  *groups = g;
  return 0;
}

/* Lua 5.1 in Redis: struct.unpack reads the little-endian integers.  The
 * chunk is checked whole before anything is written (a script's writes
 * are not rolled back by a later error).  Records go out in batches of one
 * kind, in order, so that a removal and a later set of one field keep
 * their order. */
const char PS_MERGE_SCRIPT[] =
    "local m = redis.call('HMGET', KEYS[1], 'snap', 'merged')\n"
    "if m[1] ~= ARGV[1] or m[2] ~= ARGV[2] then return 0 end\n"
    "local d = redis.call('GET', KEYS[2])\n"
    "if not d then return redis.error_reply('LOST delta chunk ' .. KEYS[2]) end\n"
    "local n, pos, g = #d, 1, 0\n"
    "while pos <= n do\n"
    "  if pos + 12 > n + 1 then return redis.error_reply('CORRUPT group head cut short') end\n"
    "  local b, flags, nrec\n"
    "  b, flags, nrec, pos = struct.unpack('<I4I4I4', d, pos)\n"
    "  g = g + 1\n"
    "  if flags > 1 or KEYS[2 + g] ~= ARGV[3] .. b then\n"
    "    return redis.error_reply('CORRUPT group ' .. g .. ' of bucket ' .. b) end\n"
    "  for i = 1, nrec do\n"
    "    if pos + 16 > n + 1 then return redis.error_reply('CORRUPT record cut short') end\n"
    "    local len = struct.unpack('<I4', d, pos + 12)\n"
    "    pos = pos + 16\n"
    "    if len ~= 4294967295 then\n"
    "      if pos + len > n + 1 then return redis.error_reply('CORRUPT value cut short') end\n"
    "      pos = pos + len end end end\n"
    "if g ~= #KEYS - 2 then\n"
    "  return redis.error_reply('CORRUPT ' .. g .. ' groups, ' .. (#KEYS - 2) .. ' hashes') end\n"
    "pos, g = 1, 0\n"
    "while pos <= n do\n"
    "  local b, flags, nrec\n"
    "  b, flags, nrec, pos = struct.unpack('<I4I4I4', d, pos)\n"
    "  g = g + 1\n"
    "  local h = KEYS[2 + g]\n"
    "  if flags == 1 then redis.call('DEL', h) end\n"
    "  local batch, kind = {}, nil\n"
    "  for i = 1, nrec do\n"
    "    local f = string.sub(d, pos, pos + 11)\n"
    "    local len = struct.unpack('<I4', d, pos + 12)\n"
    "    pos = pos + 16\n"
    "    local k = len == 4294967295 and 'HDEL' or 'HSET'\n"
    "    if k ~= kind or #batch >= 512 then\n"
    "      if #batch > 0 then redis.call(kind, h, unpack(batch)) end\n"
    "      batch, kind = {}, k end\n"
    "    batch[#batch + 1] = f\n"
    "    if k == 'HSET' then\n"
    "      batch[#batch + 1] = string.sub(d, pos, pos + len - 1)\n"
    "      pos = pos + len end end\n"
    "  if #batch > 0 then redis.call(kind, h, unpack(batch)) end end\n"
    "redis.call('DEL', KEYS[2])\n"
    "redis.call('HSET', KEYS[1], 'merged', tonumber(ARGV[2]) + 1)\n"
    "return 1\n";
