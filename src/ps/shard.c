/* A parameter-server shard's state and update rules (see shard.h). */
#include "ps/shard.h"
#include "ps/shard_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/endian.h"
#include "paramserv/error.h"
#include "proto/proto.h"
#include "ps/tsec.h"


ps_shard_opts ps_shard_opts_for(const ps_config *cfg, const ps_layout *layout, int index) {
  ps_shard_opts so = {.index = index, .nworkers = cfg->nworkers,
                      .nfloats = layout->shard_floats[index],
                      .consistency = cfg->consistency,
                      .replicas_to_aggregate = cfg->replicas_to_aggregate > 0
                                                   ? (int)cfg->replicas_to_aggregate
                                                   : cfg->nworkers};
  /* Shard 0 holds the global step: it refuses what goes past the run's
   * end (async and ssp; a sync step waits for its gradients anyway). */
  if (index == 0 && cfg->consistency != PS_CONSISTENCY_SYNC && cfg->last_step > 0)
    so.last_step = (uint64_t)cfg->last_step;
  so.optim = ps_optim_default(PS_OPTIM_ADAM, (float)cfg->lr);
  ps_optim_parse(cfg->optimizer, &so.optim);
  so.optim.lr = (float)cfg->lr;
  so.optim.momentum = (float)cfg->momentum;
  so.optim.weight_decay = (float)cfg->weight_decay;
  so.sched = ps_sched_of_config(cfg);
  if (cfg->algorithm != PS_ALGO_GRADIENTS) {
    /* The shards hold the center, and a push is how far to move it: the
     * center += what was pushed (sgd at learning rate -1, no decay, no
     * schedule).  The workers' own optimizer runs on their replicas.
     * Averaging pushes x_i - center and a round applies the mean; EASGD
     * pushes alpha (x_i - center), and a sync round applies the sum. */
    so.optim = ps_optim_default(PS_OPTIM_SGD, -1.0f);
    so.sched = (ps_sched){.kind = PS_SCHED_CONSTANT};
    so.sync_sum = cfg->algorithm == PS_ALGO_EASGD;
  }
  return so;
}

void ps_shard_opts_tables(ps_shard_opts *o, const ps_config *cfg, const ps_model *m) {
  _Static_assert(PS_SHARD_MAX_TABLES >= PS_MODEL_MAX_TABLES, "every table of a model fits");
  o->ntables = 0;
  for (int t = 0; t < m->ntables; t++) {
    const ps_sparse_spec *s = &m->tables[t];
    ps_table_opts *to = &o->tables[t];
    *to = (ps_table_opts){.dim = (uint32_t)s->dim, .optim = s->optim, .seed = (uint64_t)cfg->seed,
                          .table_id = (uint32_t)t,
                          .init = {.kind = (ps_table_init_kind)s->init_kind,
                                   .scale = s->init_scale},
                          .admit_after = s->admit_after, .idle_steps = s->idle_steps,
                          .max_rows = s->max_rows};
    o->table_lr[t] = s->optim.lr > 0 ? s->optim.lr : (float)cfg->lr;
    _Static_assert(sizeof o->table_names[t] >= sizeof s->name, "a table's name fits");
    snprintf(o->table_names[t], sizeof o->table_names[t], "%s", s->name);
  }
  o->ntables = m->ntables;
}

static float *alloc_floats(size_t n) {
  void *p = NULL;
  size_t bytes = (n ? n : 1) * sizeof(float);
  /* Large slices on huge pages where the kernel gives them on request: the
   * optimizer's passes and a checkpoint's copy take fewer TLB misses. */
  int huge = bytes >= (4u << 20);
  if (posix_memalign(&p, huge ? 2u << 20 : 64, bytes) != 0)
    return NULL;
  if (huge)
    madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

static void shard_close(ps_shard *s) {
  if (s == NULL)
    return;
  for (int t = 0; t < s->o.ntables; t++)
    ps_table_free(s->tables[t]);
  free(s->keys);
  free(s->sync_rows);
  free(s->tsec);
  free(s->lazy_done);
  free(s->values);
  for (int i = 0; i < PS_OPTIM_MAX_SLOTS; i++)
    free(s->slots[i]);
  free(s->accum);
  free(s->once);
  memset(s, 0, sizeof *s);
}

static int shard_init(ps_shard *s, const ps_shard_opts *o, const float *initial) {
  memset(s, 0, sizeof *s);
  s->o = *o;
  if (s->o.replicas_to_aggregate < 1)
    s->o.replicas_to_aggregate = 1;
  s->target = s->o.replicas_to_aggregate;
  s->values = alloc_floats(o->nfloats);
  s->once = calloc((size_t)(o->nworkers > 0 ? o->nworkers : 1), sizeof *s->once);
  int failed = s->values == NULL || s->once == NULL;
  for (int i = 0; i < ps_optim_nslots(o->optim.kind) && !failed; i++) {
    s->slots[i] = alloc_floats(o->nfloats);
    failed = s->slots[i] == NULL;
    for (size_t j = 0; !failed && j < o->nfloats; j++)
      s->slots[i][j] = ps_optim_slot_init(&o->optim, i);
  }
  if (!failed && o->consistency == PS_CONSISTENCY_SYNC) {
    s->accum = alloc_floats(o->nfloats);
    failed = s->accum == NULL;
    if (!failed)
      memset(s->accum, 0, o->nfloats * sizeof(float));
  }
  for (int t = 0; t < o->ntables && !failed; t++)
    failed = ps_table_new(&o->tables[t], &s->tables[t], NULL) != 0;
  if (failed) {
    shard_close(s);
    return -ENOMEM;
  }
  if (initial != NULL)
    memcpy(s->values, initial, o->nfloats * sizeof(float));
  else
    memset(s->values, 0, o->nfloats * sizeof(float));
  return 0;
}

static void apply(ps_shard *s, const float *g, uint64_t step) {
  float lr = ps_sched_lr(&s->o.sched, s->o.optim.lr, step);
  ps_optim_apply(&s->o.optim, lr, s->version + 1, s->values, g, s->slots, s->o.nfloats);
  s->version++;
  if (s->o.index == 0)
    s->global_step = s->version;
}

static void push_sparse(ps_shard *s, const void *sparse, uint64_t bytes, uint64_t step);
static void sync_rows_apply(ps_shard *s);

static void sync_apply(ps_shard *s) {
  sync_rows_apply(s);
  float inv = 1.0f / (float)s->accum_count;
  for (size_t i = 0; i < s->o.nfloats && !s->o.sync_sum; i++)
    s->accum[i] *= inv;
  apply(s, s->accum, s->version);
  memset(s->accum, 0, s->o.nfloats * sizeof(float));
  s->accum_count = 0;
}

/* The next journal entry: numbered, stamped with the version it leads to. */
static void journal(ps_shard *s, ps_journal *out, ps_journal e) {
  e.n = ++s->journal;
  e.version = s->version;
  if (out != NULL)
    *out = e;
}

int ps_shard_sync_flush(ps_shard *s, ps_journal *out) {
  if (s->accum_count == 0)
    return 0;
  s->target = s->accum_count;
  sync_apply(s);
  journal(s, out, (ps_journal){.kind = PS_JOURNAL_FLUSH});
  return 1;
}

int ps_shard_sync_set_target(ps_shard *s, int target, ps_journal *out) {
  if (target < 1)
    target = 1;
  if (target > s->o.replicas_to_aggregate)
    target = s->o.replicas_to_aggregate;
  if (target == s->target)
    return 0;
  s->target = target;
  /* A step that already holds enough gradients completes now. */
  if (s->accum_count >= s->target)
    sync_apply(s);
  journal(s, out, (ps_journal){.kind = PS_JOURNAL_TARGET, .target = target});
  return 1;
}

/* The rows of a push's KV blocks.  Each table first expires what idled
 * past its idle_steps at the push's step, so that a replay of the journal
 * evicts exactly as the shard did.  A table that cannot grow is fatal: part
 * of the push may be applied, and no acknowledgement may cover that; the
 * process restarts from what Redis holds, and the worker sends it again. */
static void push_sparse(ps_shard *s, const void *sparse, uint64_t bytes, uint64_t step) {
  for (int t = 0; t < s->o.ntables; t++)
    ps_table_expire(s->tables[t], step);
  ps_sparse sp = {.bytes = bytes, .data = sparse};
  ps_sparse_iter it;
  ps_sparse_block b;
  ps_sparse_iter_init(&sp, &it);
  while (ps_sparse_iter_next(&it, PS_SPARSE_KV, &b)) {
    if (b.n > s->keys_cap) {
      free(s->keys);
      s->keys_cap = b.n;
      s->keys = malloc(b.n * sizeof *s->keys);
    }
    ps_errbuf eb = {0};
    int rc = s->keys == NULL ? -ENOMEM : 0;
    if (rc == 0) {
      memcpy(s->keys, b.keys, b.n * sizeof *s->keys);
      /* The floats follow 8-byte keys from a 4-byte aligned block: aligned. */
      rc = ps_table_push(s->tables[b.table], s->keys, (const float *)(const void *)b.values,
                         b.n, s->o.table_lr[b.table], step, &eb);
    }
    if (rc != 0) {
      fprintf(stderr, "shard %d: sparse table %u: %s\n", s->o.index, b.table,
              rc == -ENOMEM ? "out of memory" : eb.msg);
      abort();
    }
  }
}

/* Sync: keep a push's blocks for its step.  Out of room is fatal, as in
 * push_sparse. */
static void sync_rows_add(ps_shard *s, const void *sparse, uint64_t bytes) {
  size_t need = s->sync_rows_len + 8 + (size_t)bytes;
  if (need > s->sync_rows_cap) {
    size_t cap = s->sync_rows_cap ? s->sync_rows_cap : 4096;
    while (cap < need)
      cap *= 2;
    uint8_t *p = realloc(s->sync_rows, cap);
    if (p == NULL) {
      fprintf(stderr, "shard %d: out of memory for a sync step's rows\n", s->o.index);
      abort();
    }
    s->sync_rows = p;
    s->sync_rows_cap = cap;
  }
  ps_put_le64(s->sync_rows + s->sync_rows_len, bytes);
  memcpy(s->sync_rows + s->sync_rows_len + 8, sparse, (size_t)bytes);
  s->sync_rows_len = need;
}

typedef struct row_ref {
  uint64_t key;
  uint64_t order;        /* the section's place, then the row's: a stable sum */
  const uint8_t *grad;   /* dim floats, unaligned */
} row_ref;

static int row_ref_cmp(const void *a, const void *b) {
  const row_ref *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return (x->order > y->order) - (x->order < y->order);
}

/* The rows of each table of the open sync step's sections: a key's
 * gradients summed in arrival order, the mean taken as the dense part's
 * (or the sum, sync_sum), pushed at the step being completed. */
static void sync_rows_apply(ps_shard *s) {
  if (s->sync_rows_len == 0)
    return;
  uint64_t step = s->version;
  for (int t = 0; t < s->o.ntables; t++)
    ps_table_expire(s->tables[t], step);
  size_t most = 0;
  for (size_t at = 0; at < s->sync_rows_len; at += 8 + (size_t)ps_get_le64(s->sync_rows + at))
    most += (size_t)ps_get_le64(s->sync_rows + at) / 8;  /* more than its rows */
  row_ref *refs = malloc((most ? most : 1) * sizeof *refs);
  float *grads = NULL;
  if (refs == NULL) {
    fprintf(stderr, "shard %d: out of memory applying a sync step's rows\n", s->o.index);
    abort();
  }
  float scale = s->o.sync_sum ? 1.0f : 1.0f / (float)s->accum_count;
  for (int t = 0; t < s->o.ntables; t++) {
    size_t n = 0, dim = s->o.tables[t].dim;
    uint64_t order = 0;
    for (size_t at = 0; at < s->sync_rows_len;) {
      uint64_t bytes = ps_get_le64(s->sync_rows + at);
      ps_sparse sp = {.bytes = bytes, .data = s->sync_rows + at + 8};
      ps_sparse_iter it;
      ps_sparse_block b;
      ps_sparse_iter_init(&sp, &it);
      while (ps_sparse_iter_next(&it, PS_SPARSE_KV, &b))
        for (uint64_t i = 0; b.table == (uint32_t)t && i < b.n; i++)
          refs[n++] = (row_ref){ps_get_le64(b.keys + 8 * i), order++, b.values + 4 * dim * i};
      at += 8 + (size_t)bytes;
    }
    if (n == 0)
      continue;
    qsort(refs, n, sizeof *refs, row_ref_cmp);
    free(grads);
    grads = malloc(n * dim * sizeof *grads);
    if (grads == NULL || n > s->keys_cap) {
      free(s->keys);
      s->keys_cap = n;
      s->keys = malloc(n * sizeof *s->keys);
    }
    if (grads == NULL || s->keys == NULL) {
      fprintf(stderr, "shard %d: out of memory applying a sync step's rows\n", s->o.index);
      abort();
    }
    size_t u = 0;
    for (size_t i = 0; i < n; i++) {
      float *g = grads + u * dim;
      int first = i == 0 || refs[i].key != refs[i - 1].key;
      for (size_t k = 0; k < dim; k++) {
        float v;
        memcpy(&v, refs[i].grad + 4 * k, sizeof v);
        g[k] = first ? v : g[k] + v;
      }
      if (first)
        s->keys[u] = refs[i].key;
      if (i + 1 == n || refs[i + 1].key != refs[i].key) {
        for (size_t k = 0; k < dim; k++)
          g[k] *= scale;
        u++;
      }
    }
    ps_errbuf eb = {0};
    if (ps_table_push(s->tables[t], s->keys, grads, u, s->o.table_lr[t], step, &eb) != 0) {
      fprintf(stderr, "shard %d: sparse table %d: %s\n", s->o.index, t, eb.msg);
      abort();
    }
  }
  free(grads);
  free(refs);
  s->sync_rows_len = 0;
}

/* The rules of a push; `limit`: refuse one past last_step (a replay
 * applies what was applied, whatever last_step is now). */
static ps_push_result push(ps_shard *s, uint32_t worker, uint64_t incarnation, uint64_t seq,
                           uint64_t step, const void *g, const void *sparse,
                           uint64_t sparse_bytes, ps_journal *out, int limit) {
  if (limit && s->o.last_step > 0 && s->version >= s->o.last_step) {
    /* The global step is at the limit: the run's last checkpoint is cut
     * there, so nothing more is applied. */
    s->counts.stale++;
    return PS_SHARD_STALE;
  }
  ps_once *once = &s->once[worker];
  if (incarnation < once->incarnation)
    return PS_SHARD_OLD_INCARNATION;
  if (incarnation == once->incarnation && seq <= once->last_seq) {
    s->counts.duplicate++;
    return PS_SHARD_DUPLICATE;
  }
  if (s->o.consistency == PS_CONSISTENCY_SYNC && step != s->version) {
    /* Computed on weights of another step: averaging it in would mix two
     * steps' gradients.  It still counts as seen for exactly-once. */
    once->incarnation = incarnation;
    once->last_seq = seq;
    s->counts.stale++;
    return PS_SHARD_STALE;
  }
  once->incarnation = incarnation;
  once->last_seq = seq;
  if (step > s->global_step)
    s->global_step = step;
  /* The payload sits 16-byte aligned in the read buffer (net/conn.c), so
   * it can be read as floats in place. */
  const float *grad = g;
  if (sparse_bytes > 0 && s->o.consistency == PS_CONSISTENCY_SYNC)
    sync_rows_add(s, sparse, sparse_bytes);
  else if (sparse_bytes > 0)
    push_sparse(s, sparse, sparse_bytes, step);
  if (s->o.consistency == PS_CONSISTENCY_SYNC) {
    for (size_t i = 0; i < s->o.nfloats; i++)
      s->accum[i] += grad[i];
    if (++s->accum_count >= s->target)
      sync_apply(s);
  } else {
    apply(s, grad, step);
  }
  s->counts.applied++;
  journal(s, out, (ps_journal){.kind = PS_JOURNAL_PUSH, .worker = worker,
                               .incarnation = incarnation, .seq = seq, .step = step, .g = grad,
                               .sparse = sparse_bytes ? sparse : NULL,
                               .sparse_bytes = sparse_bytes});
  return PS_SHARD_APPLIED;
}

ps_push_result ps_shard_push(ps_shard *s, uint32_t worker, uint64_t incarnation, uint64_t seq,
                             uint64_t step, const void *g, const void *sparse,
                             uint64_t sparse_bytes, ps_journal *out) {
  return push(s, worker, incarnation, seq, step, g, sparse, sparse_bytes, out, 1);
}

int ps_shard_sparse_check(const ps_shard *s, int kind, const void *sparse, uint64_t bytes,
                          char *why, size_t why_len) {
  ps_sparse sp = {.bytes = bytes, .data = sparse};
  ps_sparse_iter it;
  ps_sparse_block b;
  ps_sparse_iter_init(&sp, &it);
  while (ps_sparse_iter_next(&it, (ps_sparse_kind)kind, &b)) {
    if (b.table >= (uint32_t)s->o.ntables) {
      snprintf(why, why_len, "sparse block of table %u: the model has %d sparse tables", b.table,
               s->o.ntables);
      return PS_ELAYOUT;
    }
    if (b.dim != s->o.tables[b.table].dim) {
      snprintf(why, why_len, "sparse block of table %u with dim %u: the table's dim is %u",
               b.table, b.dim, s->o.tables[b.table].dim);
      return PS_ELAYOUT;
    }
  }
  return 0;
}

int ps_shard_replay(ps_shard *s, const ps_journal *e) {
  if (e->n != s->journal + 1)
    return 1;
  switch (e->kind) {
  case PS_JOURNAL_PUSH:
    if (e->worker >= (uint32_t)s->o.nworkers)
      return PS_ECORRUPT;
    /* A push the exactly-once table already holds was logged only once, so
     * it cannot come back here; whatever it returns, the entry is used. */
    if (push(s, e->worker, e->incarnation, e->seq, e->step, e->g, e->sparse, e->sparse_bytes,
             NULL, 0) != PS_SHARD_APPLIED)
      s->journal++;
    return 0;
  case PS_JOURNAL_FLUSH:
    if (!ps_shard_sync_flush(s, NULL))
      s->journal++;
    return 0;
  case PS_JOURNAL_TARGET:
    if (!ps_shard_sync_set_target(s, e->target, NULL))
      s->journal++;
    return 0;
  default:
    s->journal++;  /* a kind this version does not know changes nothing it holds */
    return 0;
  }
}

/* ------------------------------------------------------------ images */

/* The table section: its layout is ps/tsec.h's.  Sync, with tables: the
 * open step's rows follow the tables (their u64 length, then the pushed
 * sections as sync_rows holds them). */
int ps_shard_has_sync_rows(const ps_shard_opts *o) {
  return o->ntables > 0 && o->consistency == PS_CONSISTENCY_SYNC;
}

static uint64_t table_floats(const ps_shard *s) {
  uint64_t bytes = ps_tsec_bytes(s->tables, s->o.ntables);
  if (ps_shard_has_sync_rows(&s->o))
    bytes += 8 + s->sync_rows_len;
  return bytes / sizeof(float);
}

/* The section's tail in sync mode: the open step's rows, their length
 * first (8 + sync_rows_len bytes); nothing otherwise. */
uint8_t *ps_shard_sync_tail_write(const ps_shard *s, uint8_t *p) {
  if (!ps_shard_has_sync_rows(&s->o))
    return p;
  ps_put_le64(p, s->sync_rows_len);
  if (s->sync_rows_len > 0)
    memcpy(p + 8, s->sync_rows, s->sync_rows_len);
  return p + 8 + s->sync_rows_len;
}

static uint8_t *tsec_write(const ps_shard *s, uint8_t *p) {
  return ps_shard_sync_tail_write(s, ps_tsec_write(s->tables, s->o.ntables, p));
}

/* The open sync step's rows from a section's tail (len bytes at p), each
 * pushed section checked as a PUSH's would be. */
static int sync_rows_read(ps_shard *s, const uint8_t *p, uint64_t len, ps_errbuf *eb) {
  s->sync_rows_len = 0;
  for (uint64_t at = 0; at < len;) {
    uint64_t bytes = len - at >= 8 ? ps_get_le64(p + at) : 0;
    char why[256] = "cut short";
    ps_errbuf sb = {0};
    if (len - at < 8 || bytes > len - at - 8 ||
        ps_sparse_check(PS_SPARSE_KV, p + at + 8, bytes, NULL, &sb) != 0 ||
        ps_shard_sparse_check(s, PS_SPARSE_KV, p + at + 8, bytes, why, sizeof why) != 0)
      return ps_err_set(eb, PS_ECORRUPT, "the state's open sync step: rows at byte %" PRIu64
                        " do not parse: %s", at, sb.msg[0] ? sb.msg : why);
    sync_rows_add(s, p + at + 8, bytes);
    at += 8 + bytes;
  }
  return 0;
}

/* Restoring: each entry of the section into its table as it was. */
static int tsec_put(void *arg, int t, uint64_t i, const ps_table_entry *e, ps_errbuf *eb) {
  (void)i;
  ps_shard *s = arg;
  int rc = ps_table_load(s->tables[t], e, eb);
  if (rc == -ENOMEM)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  return rc == 0 ? 0 : PS_ECORRUPT;
}

/* A table's head: room for what follows, at most its caps (a section
 * holding more is refused or trimmed by the entries' own checks). */
static int tsec_head(void *arg, int t, uint64_t rows, uint64_t pending, ps_errbuf *eb) {
  ps_shard *s = arg;
  const ps_table_opts *o = &s->o.tables[t];
  if (o->max_rows > 0 && rows > o->max_rows)
    rows = o->max_rows;
  if (o->max_pending > 0 && pending > o->max_pending)
    pending = o->max_pending;
  if (ps_table_reserve(s->tables[t], rows, pending) != 0)
    return ps_err_set(eb, -ENOMEM, "out of memory for %" PRIu64 " rows", rows);
  return 0;
}

/* Replace every table by the section's (bytes long, 4-byte aligned; 0
 * bytes: an image without a section, empty tables). */
static int tsec_read(ps_shard *s, const uint8_t *p, uint64_t bytes, ps_errbuf *eb) {
  ps_tsec_table shape[PS_SHARD_MAX_TABLES];
  for (int t = 0; t < s->o.ntables; t++)
    if (ps_table_walking(s->tables[t]))
      return ps_err_set(eb, -EBUSY, "the state is being read (a snapshot in progress): it "
                        "cannot be replaced now");
  if (s->lazy_done != NULL)
    return ps_err_set(eb, -EBUSY, "the state's rows are still coming back from Redis (a lazy "
                      "restore): it cannot be replaced now");
  for (int t = 0; t < s->o.ntables; t++) {
    ps_table *fresh = NULL;
    int rc = ps_table_new(&s->o.tables[t], &fresh, eb);
    if (rc != 0)
      return rc;
    ps_table_free(s->tables[t]);
    s->tables[t] = fresh;
    shape[t] = (ps_tsec_table){.dim = s->o.tables[t].dim,
                               .nslots = (uint32_t)ps_optim_nslots(s->o.tables[t].optim.kind),
                               .name = s->o.table_names[t]};
  }
  s->sync_rows_len = 0;
  if (bytes == 0)
    return 0;
  ps_tsec_visit v = {.head = tsec_head, .entry = tsec_put, .arg = s};
  uint64_t used = 0;
  int rc = ps_tsec_walk(p, bytes, shape, s->o.ntables, &v, ps_shard_has_sync_rows(&s->o) ? &used : NULL,
                        eb);
  if (rc != 0 || !ps_shard_has_sync_rows(&s->o))
    return rc;
  const uint8_t *tail = p + used;
  uint64_t left = bytes - used;
  if (left < 8 || ps_get_le64(tail) != left - 8)
    return ps_err_set(eb, PS_ECORRUPT, "the state's table section: %" PRIu64 " bytes after its "
                      "tables, expected the open sync step's rows (their length, then them)",
                      left);
  return sync_rows_read(s, tail + 8, left - 8, eb);
}

ps_state_info ps_shard_state_shape(const ps_shard_opts *o) {
  ps_state_info in = {
      .nslots = (uint32_t)ps_optim_nslots(o->optim.kind),
      .has_accum = o->consistency == PS_CONSISTENCY_SYNC,
      .target = (uint32_t)(o->replicas_to_aggregate > 1 ? o->replicas_to_aggregate : 1),
      .nonce = (uint32_t)o->nworkers,
      /* empty tables (and no sync rows) */
      .table_floats = ((uint64_t)o->ntables * PS_TSEC_HEAD + (ps_shard_has_sync_rows(o) ? 8 : 0)) /
                      sizeof(float),
  };
  in.image_floats = ps_state_image_floats(&in, o->nfloats);
  return in;
}

ps_state_info ps_shard_state_info(const ps_shard *s) {
  ps_state_info in = ps_shard_state_shape(&s->o);
  in.version = s->version;
  in.global_step = s->global_step;
  in.accum_count = (uint32_t)s->accum_count;
  in.target = (uint32_t)s->target;
  in.table_floats = table_floats(s);
  in.image_floats = ps_state_image_floats(&in, s->o.nfloats);
  return in;
}

/* The image up to its table section: the segments and the exactly-once
 * rows. */
void ps_shard_head_write(const ps_shard *s, const ps_state_info *in, float *img) {
  size_t n = s->o.nfloats, bytes = n * sizeof(float);
  memcpy(ps_state_segment(img, n, 0), s->values, bytes);
  for (uint32_t k = 0; k < in->nslots; k++)
    memcpy(ps_state_segment(img, n, 1 + k), s->slots[k], bytes);
  if (in->has_accum)
    memcpy(ps_state_segment(img, n, 1 + in->nslots), s->accum, bytes);
  for (uint32_t j = 0; j < in->nonce; j++)
    ps_state_once_put(in, n, img, j, s->once[j]);
}

void ps_shard_state_write(const ps_shard *s, float *img) {
  ps_state_info in = ps_shard_state_info(s);
  ps_shard_head_write(s, &in, img);
  tsec_write(s, (uint8_t *)(img + ps_state_tables_at(&in, s->o.nfloats)));
}

int ps_shard_state_check(const ps_shard *s, const ps_state_info *info, char *why,
                         size_t why_len) {
  ps_state_info shape = ps_shard_state_shape(&s->o);
  return ps_state_check(&shape, s->o.nfloats, info, PS_CONFIG_MAX_NODES, why, why_len);
}

void ps_shard_state_load_piece(ps_shard *s, const ps_state_info *info, uint64_t off,
                               const void *src, uint64_t count) {
  const uint8_t *from = src;  /* a wire buffer's floats may be unaligned */
  size_t n = s->o.nfloats;
  uint64_t segs_end = (uint64_t)n * ps_state_segments(info);
  while (count > 0 && off < segs_end) {
    uint64_t k = off / n, at = off % n, take = n - at < count ? n - at : count;
    float *dst = k == 0 ? s->values : k <= info->nslots ? s->slots[k - 1] : s->accum;
    memcpy(dst + at, from, (size_t)take * sizeof(float));
    off += take;
    from += take * sizeof(float);
    count -= take;
  }
  /* The rows' bytes land in the table as they are; load_end decodes them.
   * Rows for workers this cluster does not have are dropped. */
  _Static_assert(sizeof(ps_once) == 16, "a row of the table is a row of the image");
  uint64_t once_end = ps_state_tables_at(info, n);
  if (count > 0 && off < once_end) {
    uint64_t take = once_end - off < count ? once_end - off : count;
    uint64_t byte = (off - segs_end) * sizeof(float), room = (uint64_t)s->o.nworkers * 16;
    if (byte < room) {
      uint64_t len = take * sizeof(float);
      memcpy((uint8_t *)s->once + byte, from, (size_t)(len < room - byte ? len : room - byte));
    }
    off += take;
    from += take * sizeof(float);
    count -= take;
  }
  /* The table section is kept whole until load_end parses it. */
  if (count == 0 || s->tsec_failed)
    return;
  uint64_t want = info->table_floats * sizeof(float);
  if (s->tsec == NULL || s->tsec_bytes != want) {
    free(s->tsec);
    s->tsec_bytes = want;
    if ((s->tsec = malloc(want ? want : 1)) == NULL) {
      s->tsec_failed = 1;
      return;
    }
  }
  memcpy(s->tsec + (off - once_end) * sizeof(float), from, (size_t)count * sizeof(float));
}

int ps_shard_state_load_end(ps_shard *s, const ps_state_info *info, ps_errbuf *eb) {
  s->accum_count = (int)info->accum_count;
  /* 0 is the config's; a larger cluster's target is capped at this one's. */
  s->target = info->target > 0 && info->target < (uint32_t)s->o.replicas_to_aggregate
                  ? (int)info->target
                  : s->o.replicas_to_aggregate;
  s->version = info->version;
  s->global_step = info->global_step;
  /* Workers the image lacks start with none. */
  for (int j = 0; j < s->o.nworkers; j++)
    s->once[j] = (uint32_t)j < info->nonce ? ps_state_once_decode(&s->once[j]) : (ps_once){0};
  int rc = 0;
  if (s->tsec_failed)
    rc = ps_err_set(eb, -ENOMEM, "out of memory for a state's table section of %" PRIu64
                    " bytes", info->table_floats * sizeof(float));
  else if (info->table_floats > 0 && s->tsec == NULL)
    rc = ps_err_set(eb, PS_ECORRUPT, "the state's table section never came");
  else
    rc = tsec_read(s, s->tsec, info->table_floats * sizeof(float), eb);
  free(s->tsec);
  s->tsec = NULL;
  s->tsec_bytes = 0;
  s->tsec_failed = 0;
  return rc;
}

int ps_shard_state_load(ps_shard *s, const ps_state_info *info, const float *img,
                        ps_errbuf *eb) {
  ps_shard_state_load_piece(s, info, 0, img, info->image_floats);
  return ps_shard_state_load_end(s, info, eb);
}

void ps_shard_set_journal(ps_shard *s, uint64_t n) { s->journal = n; }

int ps_shard_rows_reserve(ps_shard *s, int t, uint64_t rows, uint64_t pending) {
  return tsec_head(s, t, rows, pending, &(ps_errbuf){0}) == 0 ? 0 : -ENOMEM;
}

int ps_shard_row_load(ps_shard *s, int t, const ps_table_entry *e, uint64_t rank,
                      ps_errbuf *eb) {
  int rc = ps_table_load_ranked(s->tables[t], e, rank, eb);
  if (rc == -ENOMEM)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  return rc == 0 ? 0 : PS_ECORRUPT;
}

int ps_shard_rows_link(ps_shard *s) {
  for (int t = 0; t < s->o.ntables; t++)
    if (ps_table_link_ranked(s->tables[t]) != 0)
      return -ENOMEM;
  return 0;
}

/* ------------------------------------------------------- the opaque API */

ps_shard *ps_shard_new(const ps_shard_opts *o, const float *initial) {
  ps_shard *s = malloc(sizeof *s);
  if (s != NULL && shard_init(s, o, initial) != 0) {
    free(s);
    return NULL;
  }
  return s;
}

void ps_shard_free(ps_shard *s) {
  shard_close(s);
  free(s);
}

const ps_shard_opts *ps_shard_options(const ps_shard *s) { return &s->o; }
uint64_t ps_shard_version(const ps_shard *s) { return s->version; }
uint64_t ps_shard_global_step(const ps_shard *s) { return s->global_step; }
const float *ps_shard_values(const ps_shard *s) { return s->values; }
uint64_t ps_shard_journal(const ps_shard *s) { return s->journal; }
ps_shard_counts ps_shard_get_counts(const ps_shard *s) { return s->counts; }
uint64_t ps_shard_worker_incarnation(const ps_shard *s, uint32_t worker) {
  return worker < (uint32_t)s->o.nworkers ? s->once[worker].incarnation : 0;
}
int ps_shard_sync_pending(const ps_shard *s) { return s->accum_count; }
int ps_shard_sync_target(const ps_shard *s) { return s->target; }

void ps_shard_set_values(ps_shard *s, const float *values) {
  memcpy(s->values, values, s->o.nfloats * sizeof(float));
}

uint64_t ps_shard_sparse_max(const ps_shard_opts *o, uint64_t keys) {
  uint64_t bytes = 0;
  for (int t = 0; t < o->ntables; t++)
    bytes += ps_sparse_block_bytes(PS_SPARSE_KV, o->tables[t].dim, keys);
  return bytes;
}

int ps_shard_ntables(const ps_shard *s) { return s->o.ntables; }
uint32_t ps_shard_table_dim(const ps_shard *s, int t) { return s->o.tables[t].dim; }
const ps_table *ps_shard_table(const ps_shard *s, int t) { return s->tables[t]; }
const char *ps_shard_table_name(const ps_shard *s, int t) { return s->o.table_names[t]; }
ps_table_stats ps_shard_table_stats(const ps_shard *s, int t) {
  return ps_table_get_stats(s->tables[t]);
}
void ps_shard_table_pull(const ps_shard *s, int t, const uint64_t *keys, size_t n, float *out) {
  ps_table_pull(s->tables[t], keys, n, out);
}
