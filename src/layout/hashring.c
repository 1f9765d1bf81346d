/* Consistent hashing of sparse keys onto shards (hashring.h, LAYOUT.md §6). */
#include "layout/hashring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/endian.h"

/* The seeds of the two hashes ("ps-ring" and "ps-key"), so that a point and
 * a key of equal bytes do not land on each other by construction. */
#define POINT_SEED 0x70732d72696e67ULL
#define KEY_SEED 0x70732d6b6579ULL

static uint64_t hash_pair(uint64_t a, uint64_t b, uint64_t seed) {
  uint8_t buf[16];
  ps_put_le64(buf, a);
  ps_put_le64(buf + 8, b);
  return XXH3_64bits_withSeed(buf, sizeof buf, seed);
}

uint64_t ps_hashring_position(uint32_t table, uint64_t key) {
  return hash_pair(table, key, KEY_SEED);
}

typedef struct {
  uint64_t point;
  uint32_t shard, vnode;
} entry;

/* Points in ring order; equal positions (never seen, but possible) in
 * order of shard, then virtual node, so every process sorts alike. */
static int cmp_entry(const void *pa, const void *pb) {
  const entry *a = pa, *b = pb;
  if (a->point != b->point)
    return a->point < b->point ? -1 : 1;
  if (a->shard != b->shard)
    return a->shard < b->shard ? -1 : 1;
  return a->vnode < b->vnode ? -1 : a->vnode > b->vnode;
}

int ps_hashring_init(ps_hashring *r, int nshards, int vnodes) {
  memset(r, 0, sizeof *r);
  if (nshards < 1 || nshards > 65535 || vnodes < 1 || vnodes > 65536)
    return -EINVAL;
  size_t n = (size_t)nshards * (size_t)vnodes;
  entry *e = malloc(n * sizeof *e);
  r->point = malloc(n * sizeof *r->point);
  r->owner = malloc(n * sizeof *r->owner);
  if (e == NULL || r->point == NULL || r->owner == NULL) {
    free(e);
    ps_hashring_free(r);
    return -ENOMEM;
  }
  for (int s = 0; s < nshards; s++)
    for (int v = 0; v < vnodes; v++)
      e[(size_t)s * (size_t)vnodes + (size_t)v] =
          (entry){hash_pair((uint64_t)s, (uint64_t)v, POINT_SEED), (uint32_t)s, (uint32_t)v};
  qsort(e, n, sizeof *e, cmp_entry);
  for (size_t i = 0; i < n; i++) {
    r->point[i] = e[i].point;
    r->owner[i] = e[i].shard;
  }
  free(e);
  r->nshards = nshards;
  r->vnodes = vnodes;
  r->npoints = n;
  return 0;
}

void ps_hashring_free(ps_hashring *r) {
  if (r == NULL)
    return;
  free(r->point);
  free(r->owner);
  memset(r, 0, sizeof *r);
}

int ps_hashring_owner(const ps_hashring *r, uint32_t table, uint64_t key) {
  uint64_t pos = ps_hashring_position(table, key);
  size_t lo = 0, hi = r->npoints;  /* the first point >= pos is in [lo, hi] */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->point[mid] < pos)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (int)r->owner[lo == r->npoints ? 0 : lo];
}
