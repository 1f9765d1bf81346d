/* A shard's sparse embedding table (see table.h; the rules and the memory
 * per row are in TABLE.md). */
#include "ps/table.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/endian.h"
#include "common/rng.h"
#include "ps/keyset.h"

#define NONE PS_KS_NONE
#define DEFAULT_MAX_PENDING (1u << 20)

/* ------------------------------------------------------------------ */
/* The table                                                            */
/* ------------------------------------------------------------------ */

struct ps_table {
  ps_table_opts o;
  int nslots;             /* optimizer slots per row */
  ps_keyset rows, pend;
  uint64_t *scratch;      /* a push's keys, sorted to find repeats */
  size_t scratch_cap;
  ps_table_stats st;
  struct ps_table_walk *walks[PS_KS_WALKS];  /* the open walks (NULL: a free place) */
};

static float *row_values(const ps_ks_rec *r) {
  return (float *)(uintptr_t)(r + 1);
}

static void row_slots(const ps_table *t, const ps_ks_rec *r, float *slots[PS_OPTIM_MAX_SLOTS]) {
  for (int s = 0; s < PS_OPTIM_MAX_SLOTS; s++)
    slots[s] = s < t->nslots ? row_values(r) + (size_t)t->o.dim * (size_t)(s + 1) : NULL;
}

static void report(ps_table *t, ps_table_event kind, uint64_t key) {
  if (t->o.on_event != NULL)
    t->o.on_event(t->o.event_arg, kind, key);
}

int ps_table_new(const ps_table_opts *o, ps_table **out, ps_errbuf *eb) {
  *out = NULL;
  if (o->dim < 1 || o->dim > PS_TABLE_MAX_DIM)
    return ps_err_set(eb, PS_ECONFIG, "sparse table %" PRIu32 ": dim %" PRIu32 ", expected 1..%d",
                      o->table_id, o->dim, PS_TABLE_MAX_DIM);
  if (strcmp(ps_optim_name(&o->optim), "unknown") == 0)
    return ps_err_set(eb, PS_ECONFIG,
                      "sparse table %" PRIu32 ": optimizer kind %d, expected sgd, momentum, "
                      "adagrad or adam", o->table_id, (int)o->optim.kind);
  switch (o->init.kind) {
  case PS_TABLE_INIT_ZEROS:
    break;
  case PS_TABLE_INIT_NORMAL:
  case PS_TABLE_INIT_UNIFORM:
    if (!(isfinite(o->init.scale) && o->init.scale > 0))
      return ps_err_set(eb, PS_ECONFIG,
                        "sparse table %" PRIu32 ": initializer %s with scale %g, expected a "
                        "finite scale > 0", o->table_id,
                        o->init.kind == PS_TABLE_INIT_NORMAL ? "normal" : "uniform",
                        (double)o->init.scale);
    break;
  default:
    return ps_err_set(eb, PS_ECONFIG,
                      "sparse table %" PRIu32 ": initializer kind %d, expected zeros, normal "
                      "or uniform", o->table_id, (int)o->init.kind);
  }
  ps_table *t = calloc(1, sizeof *t);
  if (t == NULL)
    return -ENOMEM;
  t->o = *o;
  if (t->o.max_pending == 0)
    t->o.max_pending = DEFAULT_MAX_PENDING;
  t->nslots = ps_optim_nslots(o->optim.kind);
  size_t floats = (size_t)o->dim * (size_t)(1 + t->nslots);
  ps_ks_init(&t->rows, (sizeof(ps_ks_rec) + floats * sizeof(float) + 7) & ~(size_t)7);
  ps_ks_init(&t->pend, sizeof(ps_ks_rec));
  *out = t;
  return 0;
}

void ps_table_free(ps_table *t) {
  if (t == NULL)
    return;
  for (int k = 0; k < PS_KS_WALKS; k++)
    ps_table_walk_end(t->walks[k]);
  ps_ks_close(&t->rows);
  ps_ks_close(&t->pend);
  free(t->scratch);
  free(t);
}

const ps_table_opts *ps_table_options(const ps_table *t) {
  return &t->o;
}

void ps_table_init_row(const ps_table_opts *o, uint64_t key, float *out) {
  /* The stream's seed hashes the three in a fixed byte order, so that every
   * machine draws the same row. */
  uint8_t b[20];
  ps_put_le64(b, o->seed);
  ps_put_le32(b + 8, o->table_id);
  ps_put_le64(b + 12, key);
  ps_rng r;
  ps_rng_seed(&r, XXH3_64bits(b, sizeof b));
  for (uint32_t i = 0; i < o->dim; i++) {
    switch (o->init.kind) {
    case PS_TABLE_INIT_NORMAL:
      out[i] = (float)(o->init.scale * ps_rng_normal(&r));
      break;
    case PS_TABLE_INIT_UNIFORM:
      out[i] = (float)(o->init.scale * (2.0 * ps_rng_uniform(&r) - 1.0));
      break;
    default:
      out[i] = 0.0f;
    }
  }
}

void ps_table_pull(const ps_table *t, const uint64_t *keys, size_t n, float *out) {
  for (size_t i = 0; i < n; i++) {
    float *dst = out + i * t->o.dim;
    uint32_t r = ps_ks_find(&t->rows, keys[i]);
    if (r != NONE)
      memcpy(dst, row_values(ps_ks_at(&t->rows, r)), t->o.dim * sizeof(float));
    else
      ps_table_init_row(&t->o, keys[i], dst);
  }
}

/* ------------------------------------------------------------------ */
/* Push                                                                 */
/* ------------------------------------------------------------------ */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Room for n entries in t->scratch. */
static int scratch_reserve(ps_table *t, size_t n) {
  if (n <= t->scratch_cap)
    return 0;
  uint64_t *s = realloc(t->scratch, n * sizeof *s);
  if (s == NULL)
    return -ENOMEM;
  t->scratch = s;
  t->scratch_cap = n;
  return 0;
}

/* PS_EFORMAT naming the first repeated key, or 0.  Uses t->scratch. */
static int check_distinct(ps_table *t, const uint64_t *keys, size_t n, ps_errbuf *eb) {
  memcpy(t->scratch, keys, n * sizeof *keys);
  qsort(t->scratch, n, sizeof *t->scratch, cmp_u64);
  for (size_t i = 1; i < n; i++) {
    if (t->scratch[i] != t->scratch[i - 1])
      continue;
    uint64_t k = t->scratch[i];
    size_t a = 0, b;
    while (keys[a] != k)
      a++;
    for (b = a + 1; keys[b] != k; b++)
      ;
    return ps_err_set(eb, PS_EFORMAT,
                      "sparse table %" PRIu32 ": push of %zu keys has key %" PRIu64
                      " at %zu and %zu, expected each key once (gradients summed)",
                      t->o.table_id, n, k, a, b);
  }
  return 0;
}

static void row_apply(ps_table *t, ps_ks_rec *r, const float *g, float lr) {
  float *slots[PS_OPTIM_MAX_SLOTS];
  row_slots(t, r, slots);
  r->count++;
  ps_optim_apply(&t->o.optim, lr, r->count, row_values(r), g, slots, t->o.dim);
}

static void evict_head(ps_table *t, ps_table_event kind) {
  uint64_t key = ps_ks_at(&t->rows, t->rows.head)->key;
  ps_ks_del(&t->rows, t->rows.head);
  if (kind == PS_TABLE_EVICT)
    t->st.evicted++;
  else
    t->st.expired++;
  report(t, kind, key);
}

static void forget_head(ps_table *t) {
  ps_ks_del(&t->pend, t->pend.head);
  t->st.forgotten++;
}

/* Create key's row from its initial values and apply its first gradient. */
static void admit(ps_table *t, uint64_t key, const float *g, float lr, uint64_t step) {
  if (t->o.max_rows > 0 && t->rows.live >= t->o.max_rows)
    evict_head(t, PS_TABLE_EVICT);
  uint32_t i = ps_ks_add(&t->rows, key, ps_ks_stamp(&t->rows, step));
  ps_ks_rec *r = ps_ks_at(&t->rows, i);
  ps_table_init_row(&t->o, key, row_values(r));
  float *slots[PS_OPTIM_MAX_SLOTS];
  row_slots(t, r, slots);
  for (int s = 0; s < t->nslots; s++)
    for (uint32_t j = 0; j < t->o.dim; j++)
      slots[s][j] = ps_optim_slot_init(&t->o.optim, s);
  t->st.admitted++;
  report(t, PS_TABLE_ADMIT, key);
  row_apply(t, r, g, lr);
}

/* One occurrence of a key with no row. */
static void occur(ps_table *t, uint64_t key, const float *g, float lr, uint64_t step) {
  if (t->o.admit_after <= 1) {
    admit(t, key, g, lr, step);
    return;
  }
  uint32_t p = ps_ks_find(&t->pend, key);
  uint64_t c = (p == NONE ? 0 : ps_ks_at(&t->pend, p)->count) + 1;
  if (c >= t->o.admit_after) {
    if (p != NONE)
      ps_ks_del(&t->pend, p);
    admit(t, key, g, lr, step);
    return;
  }
  t->st.dropped++;
  if (p == NONE) {
    if (t->pend.live >= t->o.max_pending)
      forget_head(t);
    p = ps_ks_add(&t->pend, key, ps_ks_stamp(&t->pend, step));
  } else {
    ps_ks_touch(&t->pend, p, step);
  }
  ps_ks_at(&t->pend, p)->count = c;
}

int ps_table_push(ps_table *t, const uint64_t *keys, const float *grads, size_t n, float lr,
                  uint64_t step, ps_errbuf *eb) {
  if (scratch_reserve(t, n) != 0)
    return -ENOMEM;
  int rc = check_distinct(t, keys, n, eb);
  if (rc != 0)
    return rc;
  /* Which keys have no row (their indices into t->scratch), and what the
   * push will add, reserved so that it cannot fail halfway. */
  uint64_t *fresh = t->scratch;
  size_t nfresh = 0;
  uint64_t new_rows = 0, new_pend = 0;
  for (size_t i = 0; i < n; i++) {
    if (ps_ks_find(&t->rows, keys[i]) != NONE)
      continue;
    fresh[nfresh++] = i;
    uint32_t p = t->o.admit_after <= 1 ? NONE : ps_ks_find(&t->pend, keys[i]);
    if (t->o.admit_after <= 1 || (p != NONE && ps_ks_at(&t->pend, p)->count + 1 >= t->o.admit_after))
      new_rows++;
    else if (p == NONE)
      new_pend++;
  }
  uint64_t rows = t->rows.live + new_rows, pend = t->pend.live + new_pend;
  if (t->o.max_rows > 0 && rows > t->o.max_rows)
    rows = t->o.max_rows;
  if (pend > t->o.max_pending)
    pend = t->o.max_pending;
  if (ps_ks_reserve(&t->rows, rows) != 0 || ps_ks_reserve(&t->pend, pend) != 0)
    return -ENOMEM;
  /* The rows first, so that a row this push updates is not evicted to make
   * room for one it creates before its turn; then the keys without rows,
   * in push order. */
  size_t dim = t->o.dim;
  for (size_t i = 0; i < n; i++) {
    uint32_t r = ps_ks_find(&t->rows, keys[i]);
    if (r == NONE)
      continue;
    ps_ks_keep(&t->rows, r);
    row_apply(t, ps_ks_at(&t->rows, r), grads + i * dim, lr);
    ps_ks_touch(&t->rows, r, step);
  }
  for (size_t f = 0; f < nfresh; f++) {
    size_t i = (size_t)fresh[f];
    occur(t, keys[i], grads + i * dim, lr, step);
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* Expiry, removal, lookup                                              */
/* ------------------------------------------------------------------ */

/* Is the head of ks untouched for at least `idle` steps at `step`? */
static int head_idle(const ps_keyset *ks, uint64_t idle, uint64_t step) {
  if (ks->head == NONE)
    return 0;
  uint64_t last = ps_ks_at(ks, ks->head)->step;
  return last <= step && step - last >= idle;
}

size_t ps_table_expire(ps_table *t, uint64_t step) {
  if (t->o.idle_steps == 0)
    return 0;
  size_t n = 0;
  /* Both lists are ordered by step, so the idle ones are at their heads. */
  for (; head_idle(&t->rows, t->o.idle_steps, step); n++)
    evict_head(t, PS_TABLE_EXPIRE);
  while (head_idle(&t->pend, t->o.idle_steps, step))
    forget_head(t);
  return n;
}

int ps_table_remove(ps_table *t, uint64_t key) {
  uint32_t i = ps_ks_find(&t->rows, key);
  if (i != NONE) {
    ps_ks_del(&t->rows, i);
    return 1;
  }
  i = ps_ks_find(&t->pend, key);
  if (i != NONE) {
    ps_ks_del(&t->pend, i);
    return 1;
  }
  return 0;
}

static void entry_of(const ps_table *t, const ps_ks_rec *r, int pending, ps_table_entry *out) {
  float *slots[PS_OPTIM_MAX_SLOTS];
  *out = (ps_table_entry){.pending = pending, .key = r->key, .count = r->count,
                          .last_step = r->step};
  if (pending)
    return;
  row_slots(t, r, slots);
  out->values = row_values(r);
  for (int s = 0; s < PS_OPTIM_MAX_SLOTS; s++)
    out->slots[s] = slots[s];
}

int ps_table_get(const ps_table *t, uint64_t key, ps_table_entry *out) {
  uint32_t i = ps_ks_find(&t->rows, key);
  if (i != NONE) {
    entry_of(t, ps_ks_at(&t->rows, i), 0, out);
    return 1;
  }
  i = ps_ks_find(&t->pend, key);
  if (i != NONE) {
    entry_of(t, ps_ks_at(&t->pend, i), 1, out);
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* Iteration and restore                                                */
/* ------------------------------------------------------------------ */

void ps_table_iter_init(const ps_table *t, ps_table_iter *it) {
  it->pending = 0;
  it->next = t->rows.head;
}

int ps_table_iter_next(const ps_table *t, ps_table_iter *it, ps_table_entry *out) {
  if (it->next == NONE && !it->pending) {
    it->pending = 1;
    it->next = t->pend.head;
  }
  if (it->next == NONE)
    return 0;
  const ps_keyset *ks = it->pending ? &t->pend : &t->rows;
  const ps_ks_rec *r = ps_ks_at(ks, it->next);
  entry_of(t, r, it->pending, out);
  it->next = r->next;
  return 1;
}

/* ------------------------------------------------------------------ */
/* Walks: the table as it was, read while it changes                    */
/* ------------------------------------------------------------------ */

struct ps_table_walk {
  ps_table *t;
  int place;              /* in t->walks and the keysets' walks */
  ps_ks_walk rows, pend;
  uint64_t last_place;    /* the place in its list of the entry read last */
};

/* The place in its list of the entry keyset walk kw read last. */
static uint64_t read_place(const ps_ks_walk *kw) {
  uint32_t k = kw->next - 1;
  return kw->place != NULL ? kw->place[k] : k;
}

/* Open a walk (changes: a change walk, of every entry when `all`).
 * @return it, or NULL when 4 are open already or out of memory. */
static ps_table_walk *walk_open(ps_table *t, int changes, int all) {
  int place = 0;
  while (place < PS_KS_WALKS && t->walks[place] != NULL)
    place++;
  if (place == PS_KS_WALKS)
    return NULL;
  ps_table_walk *w = calloc(1, sizeof *w);
  if (w == NULL)
    return NULL;
  w->t = t;
  w->place = place;
  if ((changes ? ps_ks_changes_begin(&t->rows, &w->rows, place, all)
               : ps_ks_walk_begin(&t->rows, &w->rows, place)) != 0) {
    free(w);
    return NULL;
  }
  if ((changes ? ps_ks_changes_begin(&t->pend, &w->pend, place, all)
               : ps_ks_walk_begin(&t->pend, &w->pend, place)) != 0) {
    if (changes)
      (void)ps_ks_changes_undo(&t->rows, &w->rows);
    ps_ks_walk_end(&t->rows, &w->rows, place);
    free(w);
    return NULL;
  }
  t->walks[place] = w;
  return w;
}

ps_table_walk *ps_table_walk_begin(ps_table *t) {
  return walk_open(t, 0, 0);
}

ps_table_walk *ps_table_changes_begin(ps_table *t, int all) {
  return walk_open(t, 1, all);
}

void ps_table_changes_removed(const ps_table_walk *w, const uint64_t **rows, size_t *nrows,
                              const uint64_t **pending, size_t *npending) {
  *rows = w->rows.removed;
  *nrows = w->rows.nremoved;
  *pending = w->pend.removed;
  *npending = w->pend.nremoved;
}

int ps_table_changes_undo(ps_table_walk *w) {
  int a = ps_ks_changes_undo(&w->t->rows, &w->rows);
  int b = ps_ks_changes_undo(&w->t->pend, &w->pend);
  return a != 0 ? a : b;
}

void ps_table_changes_reset(ps_table *t) {
  ps_ks_changes_reset(&t->rows);
  ps_ks_changes_reset(&t->pend);
}

void ps_table_changes_count(const ps_table *t, uint64_t *entries, uint64_t *removed) {
  *entries = (uint64_t)t->rows.nchanged + t->pend.nchanged;
  *removed = (uint64_t)t->rows.nremoved + t->pend.nremoved;
}

int ps_table_changes_lost(const ps_table *t) {
  return ps_ks_changes_lost(&t->rows) || ps_ks_changes_lost(&t->pend);
}

void ps_table_walk_counts(const ps_table_walk *w, uint64_t *rows, uint64_t *pending) {
  *rows = w->rows.n;
  *pending = w->pend.n;
}

int ps_table_walk_next(ps_table_walk *w, ps_table_entry *out) {
  ps_table *t = w->t;
  if (w->rows.spoilt || w->pend.spoilt)
    return -ENOMEM;
  if (w->rows.next < w->rows.n) {
    entry_of(t, ps_ks_walk_next(&t->rows, &w->rows), 0, out);
    w->last_place = read_place(&w->rows);
    return 1;
  }
  if (w->pend.next < w->pend.n) {
    entry_of(t, ps_ks_walk_next(&t->pend, &w->pend), 1, out);
    w->last_place = read_place(&w->pend);
    return 1;
  }
  return 0;
}

int ps_table_walk_group(ps_table_walk *w, unsigned bits) {
  if (w->rows.next > 0 || w->pend.next > 0 || bits > 24)
    return -EINVAL;
  uint64_t seed = w->t->o.table_id;
  if (ps_ks_walk_group(&w->t->rows, &w->rows, bits, seed) != 0 ||
      ps_ks_walk_group(&w->t->pend, &w->pend, bits, seed) != 0)
    return -ENOMEM;
  return 0;
}

uint32_t ps_table_bucket(const ps_table *t, uint64_t key, unsigned bits) {
  return ps_ks_bucket(key, bits, t->o.table_id);
}

uint64_t ps_table_walk_place(const ps_table_walk *w) {
  return w->last_place;
}

int ps_table_walking(const ps_table *t) {
  for (int k = 0; k < PS_KS_WALKS; k++)
    if (t->walks[k] != NULL)
      return 1;
  return 0;
}

uint64_t ps_table_walk_saved(const ps_table_walk *w) {
  return (uint64_t)w->rows.nsaved + w->pend.nsaved;
}

void ps_table_walk_end(ps_table_walk *w) {
  if (w == NULL)
    return;
  w->t->walks[w->place] = NULL;
  ps_ks_walk_end(&w->t->rows, &w->rows, w->place);
  ps_ks_walk_end(&w->t->pend, &w->pend, w->place);
  free(w);
}

/* What ps_table_put and ps_table_load refuse of an entry. */
static int check_entry(const ps_table *t, const ps_table_entry *e, ps_errbuf *eb) {
  if (e->pending && t->o.admit_after <= 1)
    return ps_err_set(eb, PS_EFORMAT,
                      "sparse table %" PRIu32 ": pending key %" PRIu64 ", expected none "
                      "(admit_after %" PRIu32 " admits a key on its first push)",
                      t->o.table_id, e->key, t->o.admit_after);
  if (e->pending && (e->count < 1 || e->count >= t->o.admit_after))
    return ps_err_set(eb, PS_EFORMAT,
                      "sparse table %" PRIu32 ": pending key %" PRIu64 " with count %" PRIu64
                      ", expected 1..%" PRIu32 " (admit_after %" PRIu32 ")",
                      t->o.table_id, e->key, e->count, t->o.admit_after - 1, t->o.admit_after);
  if (!e->pending && e->values == NULL)
    return ps_err_set(eb, PS_EFORMAT,
                      "sparse table %" PRIu32 ": row %" PRIu64 " without values, expected %"
                      PRIu32 " floats", t->o.table_id, e->key, t->o.dim);
  for (int s = 0; !e->pending && s < t->nslots; s++)
    if (e->slots[s] == NULL)
      return ps_err_set(eb, PS_EFORMAT,
                        "sparse table %" PRIu32 ": row %" PRIu64 " without slot %d, expected "
                        "%d slots (%s)", t->o.table_id, e->key, s, t->nslots,
                        ps_optim_name(&t->o.optim));
  return 0;
}

/* The entry's record i (just added to ks, linked by its last_step): its
 * count, values and slots; then the caps. */
static void fill(const ps_table *t, ps_ks_rec *r, const ps_table_entry *e) {
  r->count = e->count;
  if (e->pending)
    return;
  float *slots[PS_OPTIM_MAX_SLOTS];
  row_slots(t, r, slots);
  memcpy(row_values(r), e->values, t->o.dim * sizeof(float));
  for (int s = 0; s < t->nslots; s++)
    memcpy(slots[s], e->slots[s], t->o.dim * sizeof(float));
}

static int place(ps_table *t, ps_keyset *ks, uint32_t i, const ps_table_entry *e) {
  fill(t, ps_ks_at(ks, i), e);
  while (t->pend.live > t->o.max_pending)
    forget_head(t);
  while (t->o.max_rows > 0 && t->rows.live > t->o.max_rows)
    evict_head(t, PS_TABLE_EVICT);
  return 0;
}

int ps_table_put(ps_table *t, const ps_table_entry *e, ps_errbuf *eb) {
  int rc = check_entry(t, e, eb);
  if (rc != 0)
    return rc;
  ps_keyset *ks = e->pending ? &t->pend : &t->rows;
  if (ps_ks_reserve(ks, (uint64_t)ks->live + 1) != 0)
    return -ENOMEM;
  ps_table_remove(t, e->key);
  return place(t, ks, ps_ks_add(ks, e->key, e->last_step), e);
}

/* A load's checks: the entry, room for it, a key new to the table.
 * @return its keyset, or NULL with *rc set. */
static ps_keyset *load_room(ps_table *t, const ps_table_entry *e, int *rc, ps_errbuf *eb) {
  if ((*rc = check_entry(t, e, eb)) != 0)
    return NULL;
  ps_keyset *ks = e->pending ? &t->pend : &t->rows, *other = e->pending ? &t->rows : &t->pend;
  if (ps_ks_reserve(ks, (uint64_t)ks->live + 1) != 0) {
    *rc = -ENOMEM;
    return NULL;
  }
  if ((other->live > 0 && ps_ks_find(other, e->key) != NONE) || ps_ks_find(ks, e->key) != NONE) {
    *rc = ps_err_set(eb, PS_ECORRUPT, "key %" PRIu64 " again: expected each key once in a "
                     "table", e->key);
    return NULL;
  }
  return ks;
}

int ps_table_load(ps_table *t, const ps_table_entry *e, ps_errbuf *eb) {
  int rc;
  ps_keyset *ks = load_room(t, e, &rc, eb);
  if (ks == NULL)
    return rc;
  return place(t, ks, ps_ks_add(ks, e->key, e->last_step), e);
}

int ps_table_load_ranked(ps_table *t, const ps_table_entry *e, uint64_t rank, ps_errbuf *eb) {
  int rc;
  ps_keyset *ks = load_room(t, e, &rc, eb);
  if (ks == NULL)
    return rc;
  uint32_t i = ps_ks_add_ranked(ks, e->key, e->last_step, rank);
  if (i == NONE)
    return -ENOMEM;
  fill(t, ps_ks_at(ks, i), e);
  return 0;
}

int ps_table_lazy_begin(ps_table *t, uint64_t rows_step, uint64_t pending_step) {
  if (t->o.max_rows > 0 || t->o.idle_steps > 0 || t->o.admit_after > 1 || t->rows.live > 0 ||
      t->pend.live > 0)
    return -EINVAL;
  t->rows.floor_step = rows_step;
  t->pend.floor_step = pending_step;
  ps_ks_changes_reset(&t->rows);
  ps_ks_changes_reset(&t->pend);
  return 0;
}

int ps_table_load_lazy(ps_table *t, const ps_table_entry *e, uint64_t rank, ps_errbuf *eb) {
  if (ps_ks_find(&t->rows, e->key) != NONE || ps_ks_find(&t->pend, e->key) != NONE)
    return 1;
  return ps_table_load_ranked(t, e, rank, eb);
}

int ps_table_lazy_end(ps_table *t) {
  if (ps_ks_link_ranked(&t->rows) != 0 || ps_ks_link_ranked(&t->pend) != 0)
    return -ENOMEM;
  return 0;
}

void ps_table_newest(const ps_table *t, uint64_t *rows_step, uint64_t *pending_step) {
  *rows_step = t->rows.tail != NONE ? ps_ks_at(&t->rows, t->rows.tail)->step : 0;
  *pending_step = t->pend.tail != NONE ? ps_ks_at(&t->pend, t->pend.tail)->step : 0;
}

uint64_t ps_table_lazy_left(const ps_table *t) {
  return (uint64_t)t->rows.nranked + t->pend.nranked;
}

int ps_table_link_ranked(ps_table *t) {
  if (ps_ks_link_ranked(&t->rows) != 0 || ps_ks_link_ranked(&t->pend) != 0)
    return -ENOMEM;
  ps_ks_changes_reset(&t->rows);
  ps_ks_changes_reset(&t->pend);
  /* Caps lowered since the copy was written: the evictions are changes. */
  while (t->o.max_rows > 0 && t->rows.live > t->o.max_rows)
    evict_head(t, PS_TABLE_EVICT);
  while (t->pend.live > t->o.max_pending)
    forget_head(t);
  return 0;
}

int ps_table_reserve(ps_table *t, uint64_t rows, uint64_t pending) {
  if (ps_ks_reserve(&t->rows, rows) != 0 || ps_ks_reserve(&t->pend, pending) != 0)
    return -ENOMEM;
  return 0;
}

ps_table_stats ps_table_get_stats(const ps_table *t) {
  ps_table_stats s = t->st;
  s.rows = t->rows.live;
  s.pending = t->pend.live;
  s.bytes = sizeof *t + ps_ks_bytes(&t->rows) + ps_ks_bytes(&t->pend) + t->scratch_cap * sizeof(uint64_t);
  return s;
}
