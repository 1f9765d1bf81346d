/* A sparse table's keyset (see keyset.h; TABLE.md gives the structure). */
#include "ps/keyset.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/endian.h"

#define BLOCK_BYTES ((size_t)256 << 10)
#define MIN_SLOTS 16

void ps_ks_init(ps_keyset *ks, size_t rec_bytes) {
  memset(ks, 0, sizeof *ks);
  ks->rec_bytes = rec_bytes;
  while (ks->shift < 31 && (rec_bytes << (ks->shift + 1)) <= BLOCK_BYTES)
    ks->shift++;
  ks->free_head = ks->head = ks->tail = PS_KS_NONE;
}

void ps_ks_close(ps_keyset *ks) {
  free(ks->changed);
  free(ks->removed);
  free(ks->ranks);
  free(ks->unlinked);
  for (uint32_t b = 0; b < ks->nblocks; b++)
    free(ks->blocks[b]);
  free(ks->blocks);
  free(ks->slots);
}

uint64_t ps_ks_bytes(const ps_keyset *ks) {
  return (uint64_t)ks->nblocks * (ks->rec_bytes << ks->shift) +
         (uint64_t)ks->cap_blocks * sizeof(char *) + (uint64_t)ks->nslots * sizeof(ps_ks_slot) +
         (uint64_t)(ks->changed_words + ks->cap_removed) * sizeof(uint64_t);
}

static uint32_t tag_of(uint64_t key) {
  return (uint32_t)XXH3_64bits(&key, sizeof key);
}

/* The slot that holds `key`, or the empty slot where it would go. */
static size_t ks_probe(const ps_keyset *ks, uint64_t key, uint32_t tag) {
  size_t mask = ks->nslots - 1;
  for (size_t i = tag & mask;; i = (i + 1) & mask) {
    ps_ks_slot s = ks->slots[i];
    if (s.rec == PS_KS_NONE || (s.tag == tag && ps_ks_at(ks, s.rec)->key == key))
      return i;
  }
}

uint32_t ps_ks_find(const ps_keyset *ks, uint64_t key) {
  if (ks->nslots == 0)
    return PS_KS_NONE;
  return ks->slots[ks_probe(ks, key, tag_of(key))].rec;
}

static int ks_grow_map(ps_keyset *ks, size_t nslots) {
  ps_ks_slot *s = malloc(nslots * sizeof *s);
  if (s == NULL)
    return -ENOMEM;
  memset(s, 0xff, nslots * sizeof *s);
  for (size_t i = 0; i < ks->nslots; i++) {
    if (ks->slots[i].rec == PS_KS_NONE)
      continue;
    size_t j = ks->slots[i].tag & (nslots - 1);
    while (s[j].rec != PS_KS_NONE)
      j = (j + 1) & (nslots - 1);
    s[j] = ks->slots[i];
  }
  free(ks->slots);
  ks->slots = s;
  ks->nslots = nslots;
  return 0;
}

/* Make room for `target` live records: the map at most 3/4 full, and
 * enough records free or in allocated blocks.  Nothing else changes, so a
 * caller reserves before it starts a change it must finish. */
int ps_ks_reserve(ps_keyset *ks, uint64_t target) {
  if (target >= PS_KS_NONE)
    return -ENOMEM;
  size_t nslots = ks->nslots ? ks->nslots : MIN_SLOTS;
  while (target * 4 > (uint64_t)nslots * 3)
    nslots *= 2;
  if (nslots != ks->nslots && ks_grow_map(ks, nslots) != 0)
    return -ENOMEM;
  uint64_t need = target > ks->live ? target - ks->live : 0;
  while ((uint64_t)ks->nfree + ((uint64_t)ks->nblocks << ks->shift) - ks->used < need) {
    if (((uint64_t)ks->nblocks + 1) << ks->shift > PS_KS_NONE)
      return -ENOMEM;
    if (ks->nblocks == ks->cap_blocks) {
      uint32_t cap = ks->cap_blocks ? 2 * ks->cap_blocks : 8;
      char **b = realloc(ks->blocks, cap * sizeof *b);
      if (b == NULL)
        return -ENOMEM;
      ks->blocks = b;
      /* The change bits cover every record the block array can hold. */
      size_t words = ((((size_t)cap) << ks->shift) + 63) / 64;
      uint64_t *c = realloc(ks->changed, words * sizeof *c);
      if (c == NULL)
        return -ENOMEM;
      memset(c + ks->changed_words, 0, (words - ks->changed_words) * sizeof *c);
      ks->changed = c;
      ks->changed_words = words;
      ks->cap_blocks = cap;
    }
    if ((ks->blocks[ks->nblocks] = malloc(ks->rec_bytes << ks->shift)) == NULL)
      return -ENOMEM;
    ks->nblocks++;
  }
  return 0;
}

/* A ranked load's record not linked yet (a lazy load's cold record). */
static int unlinked(const ps_keyset *ks, uint32_t i) {
  return ks->nranked > 0 && i < ks->ranks_cap && ks->ranks[i] != PS_KS_LINKED;
}

static void lru_unlink(ps_keyset *ks, uint32_t i) {
  if (unlinked(ks, i)) {
    /* Off the list: touched (linked now, at the tail) or deleted. */
    ks->ranks[i] = PS_KS_LINKED;
    ks->nranked--;
    return;
  }
  ps_ks_rec *r = ps_ks_at(ks, i);
  if (r->prev != PS_KS_NONE)
    ps_ks_at(ks, r->prev)->next = r->next;
  else
    ks->head = r->next;
  if (r->next != PS_KS_NONE)
    ps_ks_at(ks, r->next)->prev = r->prev;
  else
    ks->tail = r->prev;
}

/* Link record i after every record of a step at most its own.  From the
 * tail, so a record stamped now (ps_ks_stamp()) goes in at once. */
static void lru_insert(ps_keyset *ks, uint32_t i) {
  ps_ks_rec *r = ps_ks_at(ks, i);
  uint32_t after = ks->tail;
  while (after != PS_KS_NONE && ps_ks_at(ks, after)->step > r->step)
    after = ps_ks_at(ks, after)->prev;
  r->prev = after;
  r->next = after == PS_KS_NONE ? ks->head : ps_ks_at(ks, after)->next;
  if (after == PS_KS_NONE)
    ks->head = i;
  else
    ps_ks_at(ks, after)->next = i;
  if (r->next == PS_KS_NONE)
    ks->tail = i;
  else
    ps_ks_at(ks, r->next)->prev = i;
}

/* The step a touch at `step` records: never older than the newest touch
 * in the keyset, so the list stays ordered by step (TABLE.md: stamps). */
uint64_t ps_ks_stamp(const ps_keyset *ks, uint64_t step) {
  if (ks->floor_step > step)
    step = ks->floor_step;
  if (ks->tail != PS_KS_NONE && ps_ks_at(ks, ks->tail)->step > step)
    return ps_ks_at(ks, ks->tail)->step;
  return step;
}

/* Record i's bytes are about to change or the record to go: each open
 * walk that has not read it yet keeps them first. */
static void ks_keep_for(ps_keyset *ks, ps_ks_walk *w, uint32_t i) {
  if (w == NULL || i >= w->nrec || !(w->unread[i >> 6] >> (i & 63) & 1))
    return;
  w->unread[i >> 6] &= ~(1ULL << (i & 63));
  if (w->nsaved == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 1024;
    char *b = realloc(w->bytes, cap * ks->rec_bytes);
    if (b == NULL) {
      w->spoilt = 1;
      return;
    }
    w->bytes = b;
    w->cap = cap;
  }
  memcpy(w->bytes + w->nsaved * ks->rec_bytes, ps_ks_at(ks, i), ks->rec_bytes);
  w->saved[i] = (uint32_t)++w->nsaved;
}

void ps_ks_keep(ps_keyset *ks, uint32_t i) {
  for (int k = 0; k < PS_KS_WALKS; k++)
    ks_keep_for(ks, ks->walks[k], i);
}

static int changed(const ps_keyset *ks, uint32_t i) {
  return ks->changed[i >> 6] >> (i & 63) & 1;
}

static void mark(ps_keyset *ks, uint32_t i) {
  if (!changed(ks, i)) {
    ks->changed[i >> 6] |= 1ULL << (i & 63);
    ks->nchanged++;
  }
}

static void unmark(ps_keyset *ks, uint32_t i) {
  if (changed(ks, i)) {
    ks->changed[i >> 6] &= ~(1ULL << (i & 63));
    ks->nchanged--;
  }
}

/* Append n keys to the keyset's removed keys; -ENOMEM when it cannot. */
static int note_removed(ps_keyset *ks, const uint64_t *keys, size_t n) {
  if (n == 0)
    return 0;  /* ks->removed may be NULL yet: no memcpy to it */
  if (ks->nremoved + n > ks->cap_removed) {
    size_t cap = ks->cap_removed ? ks->cap_removed : 256;
    while (cap < ks->nremoved + n)
      cap *= 2;
    uint64_t *r = realloc(ks->removed, cap * sizeof *r);
    if (r == NULL) {
      ks->removed_lost = 1;
      return -ENOMEM;
    }
    ks->removed = r;
    ks->cap_removed = cap;
  }
  memcpy(ks->removed + ks->nremoved, keys, n * sizeof *keys);
  ks->nremoved += n;
  return 0;
}

void ps_ks_touch(ps_keyset *ks, uint32_t i, uint64_t step) {
  ps_ks_keep(ks, i);
  mark(ks, i);
  uint64_t s = ps_ks_stamp(ks, step);
  lru_unlink(ks, i);
  ps_ks_at(ks, i)->step = s;
  lru_insert(ks, i);
}

/* A new record for `key` (reserved before), last touched at `step`
 * (placed by it, not stamped), count 0; its payload is the caller's. */
/* A free record for key, in the map, not on the list. */
static uint32_t take(ps_keyset *ks, uint64_t key, uint64_t step) {
  uint32_t i;
  if (ks->free_head != PS_KS_NONE) {
    i = ks->free_head;
    ks->free_head = ps_ks_at(ks, i)->next;
    ks->nfree--;
  } else {
    i = ks->used++;
  }
  uint32_t tag = tag_of(key);
  ks->slots[ks_probe(ks, key, tag)] = (ps_ks_slot){i, tag};
  ps_ks_rec *r = ps_ks_at(ks, i);
  r->key = key;
  r->step = step;
  r->count = 0;
  r->prev = r->next = PS_KS_NONE;
  if (i < ks->ranks_cap)
    ks->ranks[i] = PS_KS_LINKED;
  ks->live++;
  mark(ks, i);
  return i;
}

uint32_t ps_ks_add(ps_keyset *ks, uint64_t key, uint64_t step) {
  uint32_t i = take(ks, key, step);
  lru_insert(ks, i);
  return i;
}

uint32_t ps_ks_add_ranked(ps_keyset *ks, uint64_t key, uint64_t step, uint64_t rank) {
  size_t need = (size_t)ks->nblocks << ks->shift;
  if (ks->ranks_cap < need) {
    uint64_t *r = realloc(ks->ranks, need * sizeof *r);
    if (r == NULL)
      return PS_KS_NONE;
    /* Records taken before the room was (ps_ks_add: a new key) are on the
     * list: linked, not waiting for their rank. */
    for (size_t j = ks->ranks_cap; j < need; j++)
      r[j] = PS_KS_LINKED;
    ks->ranks = r;
    ks->ranks_cap = need;
  }
  if (ks->nunlinked == ks->cap_unlinked) {
    size_t cap = ks->cap_unlinked ? 2 * ks->cap_unlinked : 1024;
    uint32_t *u = realloc(ks->unlinked, cap * sizeof *u);
    if (u == NULL)
      return PS_KS_NONE;
    ks->unlinked = u;
    ks->cap_unlinked = cap;
  }
  uint32_t i = take(ks, key, step);
  ks->ranks[i] = rank;
  ks->unlinked[ks->nunlinked++] = i;
  ks->nranked++;
  /* What the copy holds already: not a change. */
  unmark(ks, i);
  return i;
}

int ps_ks_link_ranked(ps_keyset *ks) {
  /* Those touched or deleted since their load are not waiting any more. */
  size_t n = 0;
  for (size_t k = 0; k < ks->nunlinked; k++)
    if (unlinked(ks, ks->unlinked[k]))
      ks->unlinked[n++] = ks->unlinked[k];
  uint32_t *a = ks->unlinked, *b = malloc((n + 1) * sizeof *b);
  size_t *count = malloc(((size_t)1 << 16) * sizeof *count);
  if (b == NULL || count == NULL) {
    free(b);
    free(count);
    return -ENOMEM;
  }
  /* Radix sort by rank less the least, 16 bits a pass, as many passes as
   * the ranks' spread needs (a writer's ranks are nearly dense: 2). */
  uint64_t lo = UINT64_MAX, hi = 0;
  for (size_t k = 0; k < n; k++) {
    uint64_t r = ks->ranks[a[k]];
    lo = r < lo ? r : lo;
    hi = r > hi ? r : hi;
  }
  for (unsigned shift = 0; n > 1 && shift < 64 && ((hi - lo) >> shift) != 0; shift += 16) {
    memset(count, 0, ((size_t)1 << 16) * sizeof *count);
    for (size_t k = 0; k < n; k++)
      count[((ks->ranks[a[k]] - lo) >> shift) & 0xffff]++;
    size_t sum = 0;
    for (size_t d = 0; d < (1 << 16); d++) {
      size_t c = count[d];
      count[d] = sum;
      sum += c;
    }
    for (size_t k = 0; k < n; k++)
      b[count[((ks->ranks[a[k]] - lo) >> shift) & 0xffff]++] = a[k];
    uint32_t *t = a;
    a = b;
    b = t;
  }
  /* Rank by rank: each goes in at the tail, the stamps having come in
   * list order.  When records were touched since the load (a lazy load:
   * they are on the list already, stamped at least the floor, so after
   * every record loaded), the loaded ones go before them, from the last
   * rank back, each at the head. */
  for (size_t k = 0; k < n; k++)
    ks->ranks[a[k]] = PS_KS_LINKED;
  if (ks->head == PS_KS_NONE) {
    for (size_t k = 0; k < n; k++)
      lru_insert(ks, a[k]);
  } else {
    for (size_t k = n; k-- > 0;) {
      ps_ks_rec *r = ps_ks_at(ks, a[k]);
      r->prev = PS_KS_NONE;
      r->next = ks->head;
      ps_ks_at(ks, ks->head)->prev = a[k];
      ks->head = a[k];
    }
  }
  ks->nranked = 0;
  ks->floor_step = 0;
  free(a);
  free(b);
  free(count);
  ks->unlinked = NULL;
  ks->nunlinked = ks->cap_unlinked = 0;
  free(ks->ranks);
  ks->ranks = NULL;
  ks->ranks_cap = 0;
  return 0;
}

void ps_ks_changes_reset(ps_keyset *ks) {
  if (ks->changed != NULL)
    memset(ks->changed, 0, ks->changed_words * sizeof *ks->changed);
  ks->nchanged = 0;
  ks->nremoved = 0;
  ks->removed_lost = 0;
  ks->tracking = 1;
}

/* Take record i out of the map (backward shift: no tombstones, so probe
 * lengths never grow with deletions) and the list, and free it. */
void ps_ks_del(ps_keyset *ks, uint32_t i) {
  ps_ks_keep(ks, i);
  size_t mask = ks->nslots - 1;
  uint64_t key = ps_ks_at(ks, i)->key;
  unmark(ks, i);
  if (ks->tracking)
    (void)note_removed(ks, &key, 1); /* on failure ps_ks_changes_lost says so */
  size_t hole = ks_probe(ks, key, tag_of(key));
  for (size_t j = (hole + 1) & mask; ks->slots[j].rec != PS_KS_NONE; j = (j + 1) & mask) {
    size_t home = ks->slots[j].tag & mask;
    /* The entry at j may fill the hole if the hole is not before its
     * home on its probe path. */
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      ks->slots[hole] = ks->slots[j];
      hole = j;
    }
  }
  ks->slots[hole].rec = PS_KS_NONE;
  lru_unlink(ks, i);
  ps_ks_at(ks, i)->next = ks->free_head;
  ks->free_head = i;
  ks->nfree++;
  ks->live--;
}

static void walk_free(ps_ks_walk *w) {
  free(w->place);
  free(w->removed);
  free(w->order);
  free(w->unread);
  free(w->saved);
  free(w->bytes);
}

void ps_ks_walk_end(ps_keyset *ks, ps_ks_walk *w, int place) {
  if (ks->walks[place] == w)
    ks->walks[place] = NULL;
  walk_free(w);
}

/* A walk's arrays for n records of ks.  @return 0 or -ENOMEM. */
static int walk_alloc(const ps_keyset *ks, ps_ks_walk *w, uint32_t n) {
  memset(w, 0, sizeof *w);
  w->n = n;
  w->nrec = ks->used;
  w->order = malloc(((size_t)w->n + 1) * sizeof *w->order);
  w->unread = calloc(((size_t)w->nrec + 63) / 64 + 1, sizeof *w->unread);
  w->saved = calloc((size_t)w->nrec + 1, sizeof *w->saved);
  if (w->order == NULL || w->unread == NULL || w->saved == NULL) {
    walk_free(w);
    return -ENOMEM;
  }
  return 0;
}

/* The walk reads record i as its k-th. */
static void walk_place(ps_ks_walk *w, uint32_t k, uint32_t i) {
  w->order[k] = i;
  w->unread[i >> 6] |= 1ULL << (i & 63);
}

int ps_ks_walk_begin(ps_keyset *ks, ps_ks_walk *w, int place) {
  if (ks->nranked > 0)
    return -EBUSY;  /* records loaded and not linked yet: not on the list to walk */
  if (walk_alloc(ks, w, ks->live) != 0)
    return -ENOMEM;
  uint32_t k = 0;
  for (uint32_t i = ks->head; i != PS_KS_NONE; i = ps_ks_at(ks, i)->next)
    walk_place(w, k++, i);
  ks->walks[place] = w;
  return 0;
}

int ps_ks_changes_begin(ps_keyset *ks, ps_ks_walk *w, int place, int all) {
  if (all) {
    if (ps_ks_walk_begin(ks, w, place) != 0)
      return -ENOMEM;
    w->all = 1;
    ps_ks_changes_reset(ks);
    return 0;
  }
  if (walk_alloc(ks, w, ks->nchanged) != 0)
    return -ENOMEM;
  /* A touch moves a record to the tail, so the changed records are found
   * from there back: all of them at once after a stored change walk. */
  uint32_t k = ks->nchanged;
  for (uint32_t i = ks->tail; k > 0 && i != PS_KS_NONE; i = ps_ks_at(ks, i)->prev) {
    if (changed(ks, i)) {
      walk_place(w, --k, i);
      unmark(ks, i);
    }
  }
  w->removed = ks->removed;
  w->nremoved = ks->nremoved;
  ks->removed = NULL;
  ks->nremoved = ks->cap_removed = 0;
  ks->walks[place] = w;
  return 0;
}

int ps_ks_changes_undo(ps_keyset *ks, ps_ks_walk *w) {
  if (w->all) {
    /* The removals before it are gone: only another walk of all is exact. */
    ks->removed_lost = 1;
    return 0;
  }
  for (uint32_t k = 0; k < w->n; k++) {
    uint32_t i = w->order[k];
    if (i < ks->used && ps_ks_find(ks, ps_ks_at(ks, i)->key) == i)
      mark(ks, i);
  }
  int rc = note_removed(ks, w->removed, w->nremoved);
  free(w->removed);
  w->removed = NULL;
  w->nremoved = 0;
  return rc;
}

int ps_ks_changes_lost(const ps_keyset *ks) {
  return ks->removed_lost || !ks->tracking;
}

/* Record i as walk w sees it: the bytes it saved, or the live ones. */
static const ps_ks_rec *walk_view(const ps_keyset *ks, const ps_ks_walk *w, uint32_t i) {
  if (w->saved[i] != 0)
    return (const ps_ks_rec *)(w->bytes + (size_t)(w->saved[i] - 1) * ks->rec_bytes);
  return ps_ks_at(ks, i);
}

uint32_t ps_ks_bucket(uint64_t key, unsigned bits, uint64_t seed) {
  if (bits == 0)
    return 0;
  uint8_t b[8];
  ps_put_le64(b, key);
  return (uint32_t)(XXH3_64bits_withSeed(b, sizeof b, seed) >> (64 - bits));
}

int ps_ks_walk_group(const ps_keyset *ks, ps_ks_walk *w, unsigned bits, uint64_t seed) {
  size_t nb = (size_t)1 << bits;
  uint32_t *bucket = malloc(((size_t)w->n + 1) * sizeof *bucket);
  uint32_t *order = malloc(((size_t)w->n + 1) * sizeof *order);
  uint32_t *place = malloc(((size_t)w->n + 1) * sizeof *place);
  size_t *start = calloc(nb + 1, sizeof *start);
  if (bucket == NULL || order == NULL || place == NULL || start == NULL) {
    free(bucket);
    free(order);
    free(place);
    free(start);
    return -ENOMEM;
  }
  for (uint32_t k = 0; k < w->n; k++) {
    bucket[k] = ps_ks_bucket(walk_view(ks, w, w->order[k])->key, bits, seed);
    start[bucket[k] + 1]++;
  }
  for (size_t b = 0; b < nb; b++)
    start[b + 1] += start[b];
  for (uint32_t k = 0; k < w->n; k++) {
    size_t to = start[bucket[k]]++;
    order[to] = w->order[k];
    place[to] = k;
  }
  free(bucket);
  free(start);
  free(w->order);
  free(w->place);
  w->order = order;
  w->place = place;
  return 0;
}

/* The next record of one keyset's walk: its saved bytes, or the live ones
 * (read now: a change after this saves nothing). */
const ps_ks_rec *ps_ks_walk_next(const ps_keyset *ks, ps_ks_walk *w) {
  uint32_t i = w->order[w->next++];
  w->unread[i >> 6] &= ~(1ULL << (i & 63));
  return walk_view(ks, w, i);
}
