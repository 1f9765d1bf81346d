/* A checkpoint's sparse tables: each shard file's table section (FORMAT.md
 * 2.1) walked with the section's one reader (ps/tsec.h), checked entry by
 * entry, its rows handed on; for `paramserv ckpt verify` and the npy
 * export (checkpoint.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "ps/shard.h"
#include "recovery/checkpoint.h"

int ps_ckpt_tables_open(const ps_ckpt *c, ps_ckpt_tables *tt, ps_errbuf *eb) {
  memset(tt, 0, sizeof *tt);
  const char *where = c->path != NULL ? c->path : "the checkpoint";
  int with = -1;
  for (int i = 0; i < c->nshards && with < 0; i++)
    if (c->shards[i].info.table_floats > 0)
      with = i;
  if (with < 0)
    return 0;  /* no sections: nothing to read, no model needed */
  if (!c->has_network)
    return ps_err_set(eb, PS_ECORRUPT, "%s: %s holds a table section of %" PRIu64 " bytes, "
                      "but the manifest's network is null (a model without sparse tables): "
                      "expected none", where, c->shards[with].file,
                      c->shards[with].info.table_floats * sizeof(float));
  /* The tables as the shards held them: the model's, as ps_shard_opts_tables
   * makes them (dim, and the rows' own optimizer's slots). */
  ps_model m;
  ps_data_norm norm;
  int rc = ps_ckpt_model(c, NULL, &m, &norm, eb);
  if (rc != 0)
    return rc;
  for (int t = 0; t < m.ntables; t++) {
    snprintf(tt->names[t], sizeof tt->names[t], "%s", m.tables[t].name);
    tt->t[t] = (ps_tsec_table){.dim = (uint32_t)m.tables[t].dim,
                               .nslots = (uint32_t)ps_optim_nslots(m.tables[t].optim.kind),
                               .name = tt->names[t]};
  }
  tt->ntables = m.ntables;
  ps_model_close(&m);
  if ((rc = ps_hashring_init(&tt->ring, c->nshards, PS_HASHRING_VNODES)) != 0)
    return ps_err_set(eb, rc, "%s: the hash ring of %d shards: %s", where, c->nshards,
                      strerror(-rc));
  return 0;
}

void ps_ckpt_tables_close(ps_ckpt_tables *tt) {
  if (tt == NULL)
    return;
  ps_hashring_free(&tt->ring);
  memset(tt, 0, sizeof *tt);
}

/* The keys of the table being walked, for the uniqueness check: an
 * open-addressing set of (key, entry index + 1), 0 marking a free slot. */
typedef struct seen_key {
  uint64_t key, at;
} seen_key;

typedef struct check {
  const ps_ckpt_tables *tt;
  int shard, nshards;
  seen_key *set;
  uint64_t cap, mask;
  uint64_t rows, pending;
  ps_ckpt_row_fn *fn;
  void *arg;
} check;

/* splitmix64's finalizer: the set's hash of a key. */
static uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int check_head(void *arg, int t, uint64_t rows, uint64_t pending, ps_errbuf *eb) {
  (void)t;
  check *k = arg;
  k->rows += rows;
  k->pending += pending;
  /* At most 2/3 full.  The walk checked that the entries fit the section
   * (24 bytes at least each), so the set is at most about twice its size. */
  uint64_t n = rows + pending, cap = 16;
  while (cap - cap / 3 < n + 1)
    cap *= 2;
  if (cap > k->cap) {
    free(k->set);
    k->cap = 0;
    if ((k->set = malloc((size_t)cap * sizeof *k->set)) == NULL)
      return ps_err_set(eb, -ENOMEM, "out of memory for the keys of %" PRIu64 " entries", n);
    k->cap = cap;
  }
  k->mask = cap - 1;
  memset(k->set, 0, (size_t)cap * sizeof *k->set);
  return 0;
}

static int check_entry(void *arg, int t, uint64_t i, const ps_table_entry *e, ps_errbuf *eb) {
  check *k = arg;
  for (uint64_t h = mix(e->key) & k->mask;; h = (h + 1) & k->mask) {
    if (k->set[h].at == 0) {
      k->set[h] = (seen_key){e->key, i + 1};
      break;
    }
    if (k->set[h].key == e->key)
      return ps_err_set(eb, PS_ECORRUPT, "key %" PRIu64 " again (entry %" PRIu64 " holds it "
                        "too): expected each key once in a table", e->key, k->set[h].at - 1);
  }
  int owner = ps_hashring_owner(&k->tt->ring, (uint32_t)t, e->key);
  if (owner != k->shard)
    return ps_err_set(eb, PS_ECORRUPT, "key %" PRIu64 " is shard %d's by the hash ring of %d "
                      "shards, expected shard %d's (this file's)", e->key, owner, k->nshards,
                      k->shard);
  if (!e->pending && k->fn != NULL)
    return k->fn(k->arg, t, e, eb);
  return 0;
}

/* ps_ckpt_shard_tables, adding the section's rows and pending keys to
 * *rows and *pending. */
static int shard_tables(const ps_ckpt *c, const ps_ckpt_tables *tt, int i,
                        const ps_ckpt_shard_data *d, ps_ckpt_row_fn *fn, void *arg,
                        uint64_t *rows, uint64_t *pending, ps_errbuf *eb) {
  if (i < 0 || i >= c->nshards)
    return ps_err_set(eb, -EINVAL, "checkpoint: no shard %d", i);
  if (d->table_bytes == 0)
    return 0;  /* empty tables, as a shard loads it */
  check k = {.tt = tt, .shard = i, .nshards = c->nshards, .fn = fn, .arg = arg};
  ps_tsec_visit v = {.head = check_head, .entry = check_entry, .arg = &k};
  ps_errbuf why = {0};
  /* A sync checkpoint's section ends with the open step's rows, which a
   * shard checks when it loads them: here their length must fit. */
  uint64_t used = 0;
  int sync = c->consistency == PS_CONSISTENCY_SYNC;
  int rc = ps_tsec_walk(d->tables, d->table_bytes, tt->t, tt->ntables, &v, sync ? &used : NULL,
                        &why);
  if (rc == 0 && sync) {
    uint64_t left = d->table_bytes - used;
    const uint8_t *tail = (const uint8_t *)d->tables + used;
    if (left < 8 || ps_get_le64(tail) != left - 8)
      rc = ps_err_set(&why, PS_ECORRUPT, "%" PRIu64 " bytes after the tables, expected the open "
                      "sync step's rows (their length, then them)", left);
  }
  free(k.set);
  if (rc != 0)
    return ps_err_set(eb, rc, "%s/%s: %s", c->path != NULL ? c->path : ".", c->shards[i].file,
                      why.msg);
  *rows += k.rows;
  *pending += k.pending;
  return 0;
}

int ps_ckpt_shard_tables(const ps_ckpt *c, const ps_ckpt_tables *tt, int i,
                         const ps_ckpt_shard_data *d, ps_ckpt_row_fn *fn, void *arg,
                         ps_errbuf *eb) {
  uint64_t rows = 0, pending = 0;
  return shard_tables(c, tt, i, d, fn, arg, &rows, &pending, eb);
}

int ps_ckpt_verify_tables(const ps_ckpt *c, ps_ckpt_tables_stats *st, ps_errbuf *eb) {
  ps_ckpt_tables_stats scratch;
  if (st == NULL)
    st = &scratch;
  *st = (ps_ckpt_tables_stats){0};
  ps_ckpt_tables tt;
  int rc = ps_ckpt_tables_open(c, &tt, eb);
  for (int i = 0; rc == 0 && i < c->nshards; i++) {
    ps_ckpt_shard_data d;
    if ((rc = ps_ckpt_read_shard(c, i, &d, eb)) != 0)
      break;
    rc = shard_tables(c, &tt, i, &d, NULL, NULL, &st->rows, &st->pending, eb);
    ps_ckpt_shard_data_close(&d);
  }
  st->ntables = tt.ntables;
  ps_ckpt_tables_close(&tt);
  return rc;
}
