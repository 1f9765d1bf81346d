/* Incremental checkpoints (FORMAT.md 2.4): the writer's chain, which
 * makes each checkpoint's delta sections against the one it wrote before
 * (recovery/delta.c) and writes it through ps_ckpt_write; and compaction,
 * which folds a chain into a full checkpoint.  On checkpoint.c,
 * manifest.c, shardfile.c, model.c and delta.c (checkpoint.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/pool.h"
#include "recovery/checkpoint.h"
#include "recovery/commit.h"
#include "recovery/delta.h"

struct ps_ckpt_chain {
  int full_every;
  int ntables;
  ps_tsec_table tables[PS_MODEL_MAX_TABLES];
  int sync;
  int nshards;                  /* of the indexes below; 0: none */
  ps_delta_index **idx;         /* the last checkpoint written: each shard's section */
  char base[PS_CKPT_NAME_MAX];  /* its name */
  uint64_t *base_xxh;           /* its shards' state_xxh64, as written */
  uint64_t base_step;
  int ndeltas;                  /* incremental ones since the last full one */
};

int ps_ckpt_chain_new(int full_every, const ps_tsec_table *tables, int ntables, int sync,
                      ps_ckpt_chain **out) {
  *out = NULL;
  if (full_every < 1 || ntables < 0 || ntables > PS_MODEL_MAX_TABLES)
    return PS_EUSAGE;
  ps_ckpt_chain *ch = calloc(1, sizeof *ch);
  if (ch == NULL)
    return -ENOMEM;
  ch->full_every = full_every;
  ch->ntables = ntables;
  for (int t = 0; t < ntables; t++)
    ch->tables[t] = (ps_tsec_table){.dim = tables[t].dim, .nslots = tables[t].nslots};
  ch->sync = sync;
  *out = ch;
  return 0;
}

static void drop_indexes(ps_delta_index **idx, int n) {
  if (idx == NULL)
    return;
  for (int i = 0; i < n; i++)
    ps_delta_index_free(idx[i]);
  free(idx);
}

void ps_ckpt_chain_free(ps_ckpt_chain *ch) {
  if (ch == NULL)
    return;
  drop_indexes(ch->idx, ch->nshards);
  free(ch->base_xxh);
  free(ch);
}

/* The chain's last checkpoint, as `dir` holds it: its shards'
 * state_xxh64 into xxh (n of them).  @return 0, or -1 (gone, unreadable, another
 * shard count). */
static int base_xxh(const char *dir, const char *name, int n, uint64_t *xxh) {
  char path[PATH_MAX];
  ps_ckpt b;
  ps_errbuf why = {0};
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (ps_ckpt_open(&b, path, &why) != 0)
    return -1;
  int ok = b.nshards == n;
  for (int i = 0; ok && i < n; i++)
    xxh[i] = b.shards[i].state_xxh64;
  ps_ckpt_close(&b);
  return ok ? 0 : -1;
}

/* Is the chain's last checkpoint still in dir as it wrote it (not
 * deleted, not written again by another run)? */
static int same_base(const ps_ckpt_chain *ch, const char *dir) {
  uint64_t *xxh = calloc((size_t)ch->nshards, sizeof *xxh);
  int same = xxh != NULL && ch->base_xxh != NULL &&
             base_xxh(dir, ch->base, ch->nshards, xxh) == 0 &&
             memcmp(xxh, ch->base_xxh, (size_t)ch->nshards * sizeof *xxh) == 0;
  free(xxh);
  return same;
}

/* Each shard's delta (or index only) made side by side. */
typedef struct deltas {
  const ps_ckpt_chain *ch;
  const ps_ckpt_write_opts *o;
  int incremental;
  ps_ckpt_shard_state *sh;      /* copies of o->shards, their delta set */
  uint8_t **buf;
  ps_delta_index **next;
  ps_delta_stats *st;
  ps_errbuf *eb;
  int *rc;
} deltas;

static void delta_one(void *arg, int i) {
  deltas *d = arg;
  const ps_ckpt_shard_state *s = &d->o->shards[i];
  const void *sec = s->img + ps_state_tables_at(&s->info, s->nfloats);
  uint64_t bytes = s->info.table_floats * sizeof(float), out = 0;
  d->rc[i] = ps_delta_make(d->incremental ? d->ch->idx[i] : NULL, sec, bytes, d->ch->tables,
                           d->ch->ntables, d->ch->sync, d->incremental ? &d->buf[i] : NULL,
                           &out, &d->next[i], &d->st[i], &d->eb[i]);
  if (d->rc[i] == 0 && d->incremental) {
    d->sh[i].delta = d->buf[i];
    d->sh[i].delta_bytes = out;
    d->sh[i].base_xxh64 = d->ch->base_xxh[i];
  }
}

int ps_ckpt_chain_write(ps_ckpt_chain *ch, const char *dir, const ps_ckpt_write_opts *o,
                        ps_ckpt_write_stats *st, ps_errbuf *eb) {
  int n = o->layout->nshards;
  if (ch->ntables == 0)
    return ps_ckpt_write(dir, o, st, eb);  /* no tables: nothing to make smaller */
  /* Incremental when the last checkpoint written is still there to build
   * on and the chain is shorter than full_every. */
  int incremental = ch->idx != NULL && ch->nshards == n && ch->ndeltas + 1 < ch->full_every &&
                    o->step > ch->base_step && same_base(ch, dir);
  deltas d = {.ch = ch, .o = o, .incremental = incremental};
  d.sh = calloc((size_t)n, sizeof *d.sh);
  d.buf = calloc((size_t)n, sizeof *d.buf);
  d.next = calloc((size_t)n, sizeof *d.next);
  d.st = calloc((size_t)n, sizeof *d.st);
  d.eb = calloc((size_t)n, sizeof *d.eb);
  d.rc = calloc((size_t)n, sizeof *d.rc);
  int rc = 0;
  if (d.sh == NULL || d.buf == NULL || d.next == NULL || d.st == NULL || d.eb == NULL ||
      d.rc == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "out of memory");
    goto out;
  }
  memcpy(d.sh, o->shards, (size_t)n * sizeof *d.sh);
  ps_pool_for(n, delta_one, &d);
  for (int i = 0; i < n && rc == 0; i++)
    if (d.rc[i] != 0)
      rc = ps_err_set(eb, d.rc[i], "shard %d's table section: %s", i, d.eb[i].msg);
  if (rc != 0)
    goto out;
  ps_ckpt_write_opts w = *o;
  w.shards = d.sh;
  w.base = incremental ? ch->base : NULL;
  rc = ps_ckpt_write(dir, &w, st, eb);
  if (rc != 0)
    goto out;
  if (st != NULL) {
    st->incremental = incremental;
    snprintf(st->base, sizeof st->base, "%s", incremental ? ch->base : "");
    for (int i = 0; i < n; i++) {
      st->entries += d.st[i].entries;
      st->changed += d.st[i].changed;
      st->deleted += d.st[i].deleted;
      st->changed_bytes += d.st[i].changed_row_bytes;
      st->delta_bytes += d.sh[i].delta_bytes;
    }
  }
  drop_indexes(ch->idx, ch->nshards);
  ch->idx = d.next;
  d.next = NULL;
  ch->nshards = n;
  ps__ckpt_name(o->step, ch->base);
  ch->base_step = o->step;
  ch->ndeltas = incremental ? ch->ndeltas + 1 : 0;
  /* What the next one builds on: this one's states, as its manifest
   * names them (the shard files' writer hashed them); unreadable, the
   * next one is full. */
  free(ch->base_xxh);
  ch->base_xxh = calloc((size_t)n, sizeof *ch->base_xxh);
  if (ch->base_xxh == NULL || base_xxh(dir, ch->base, n, ch->base_xxh) != 0) {
    drop_indexes(ch->idx, ch->nshards);
    ch->idx = NULL;
  }
out:
  drop_indexes(d.next, d.next != NULL ? n : 0);
  if (d.buf != NULL)
    for (int i = 0; i < n; i++)
      free(d.buf[i]);
  free(d.buf);
  free(d.sh);
  free(d.st);
  free(d.eb);
  free(d.rc);
  return rc;
}

int ps_ckpt_compact(const ps_ckpt *c, ps_ckpt_write_stats *st, ps_errbuf *eb) {
  const char *path = c->path != NULL ? c->path : c->name;
  if (c->base[0] == '\0')
    return ps_err_set(eb, PS_EUSAGE, "%s: a full checkpoint already: nothing to compact", path);
  char dir[PATH_MAX];
  ps__ckpt_parent(path, dir, sizeof dir);
  /* What ps_ckpt_write takes, from the manifest: the model's variables,
   * the layout's parts, each shard's state put together from the chain. */
  ps_model m;
  ps_data_norm norm;
  int rc = ps_ckpt_model(c, NULL, &m, &norm, eb);
  if (rc != 0)
    return rc;
  int nparts = 0;
  for (int v = 0; v < c->nvars; v++)
    nparts += c->vars[v].nparts;
  ps_layout l = {.nshards = c->nshards, .nparts = nparts, .hash = c->layout_hash};
  l.parts = calloc((size_t)nparts + 1, sizeof *l.parts);
  l.shard_floats = calloc((size_t)c->nshards, sizeof *l.shard_floats);
  ps_ckpt_shard_state *sh = calloc((size_t)c->nshards, sizeof *sh);
  float **img = calloc((size_t)c->nshards, sizeof *img);
  if (l.parts == NULL || l.shard_floats == NULL || sh == NULL || img == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "out of memory");
    goto out;
  }
  for (int v = 0, k = 0; v < c->nvars; v++)
    for (int p = 0; p < c->vars[v].nparts; p++, k++) {
      const ps_ckpt_part *pt = &c->vars[v].parts[p];
      l.parts[k] = (ps_part){.var = v, .start = pt->start, .count = pt->count,
                             .shard = pt->shard, .shard_off = pt->shard_off};
    }
  for (int i = 0; i < c->nshards && rc == 0; i++) {
    const ps_ckpt_shard *s = &c->shards[i];
    l.shard_floats[i] = s->floats;
    ps_ckpt_shard_data d;
    if ((rc = ps_ckpt_read_shard(c, i, &d, eb)) != 0)
      break;
    if ((img[i] = calloc((size_t)s->info.image_floats + 1, sizeof(float))) == NULL) {
      ps_ckpt_shard_data_close(&d);
      rc = ps_err_set(eb, -ENOMEM, "out of memory");
      break;
    }
    size_t seg = (size_t)ps_state_segments(&s->info) * s->floats;
    memcpy(img[i], d.buf, seg * sizeof(float));
    for (uint32_t j = 0; j < s->info.nonce; j++)
      ps_state_once_put(&s->info, s->floats, img[i], j, s->once[j]);
    memcpy(img[i] + ps_state_tables_at(&s->info, s->floats), d.tables, d.table_bytes);
    ps_ckpt_shard_data_close(&d);
    sh[i] = (ps_ckpt_shard_state){.nfloats = s->floats, .info = s->info, .img = img[i]};
  }
  if (rc == 0) {
    ps_ckpt_write_opts o = {
        .step = c->step, .wall_time = c->wall_time, .cluster_id = c->cluster_id,
        .model = c->model, .vars = &m.vars, .layout = &l, .optim = c->optim,
        .consistency = c->consistency, .filter = c->filter, .shards = sh,
        .nworkers = c->nworkers, .data_pos = c->data_pos, .global_step = c->global_step,
        .network = c->has_network ? &c->network : NULL, .norm = c->has_norm ? &c->norm : NULL};
    rc = ps_ckpt_write(dir, &o, st, eb);
  }
out:
  if (img != NULL)
    for (int i = 0; i < c->nshards; i++)
      free(img[i]);
  free(img);
  free(sh);
  free(l.parts);
  free(l.shard_floats);
  ps_model_close(&m);
  return rc;
}
