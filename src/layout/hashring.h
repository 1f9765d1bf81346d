/* Which shard holds a sparse table's row: consistent hashing on a ring of
 * virtual nodes (LAYOUT.md, section 6).  Every process builds the same ring
 * from (nshards, vnodes) alone, so a worker asks each shard only for the
 * keys it owns, and a change of shard count moves about 1/N of the keys. */
#ifndef PS_LAYOUT_HASHRING_H
#define PS_LAYOUT_HASHRING_H

#include <stddef.h>
#include <stdint.h>

/* Virtual nodes per shard by default: with 256 points per shard the
 * busiest of 2 to 8 shards holds at most 9% more uniform keys than the mean
 * (test_hashring measures it). */
#define PS_HASHRING_VNODES 256

typedef struct ps_hashring {
  int nshards, vnodes;
  size_t npoints;   /* nshards * vnodes */
  uint64_t *point;  /* sorted ascending: the points' positions on the ring */
  uint32_t *owner;  /* owner[i]: the shard of point[i] */
} ps_hashring;

/* Build the ring of `nshards` (1..65535) shards with `vnodes` (1..65536)
 * points each.  @return 0, -EINVAL (out of range) or -ENOMEM; on failure
 * *r is zeroed.  Free with ps_hashring_free (NULL and zeroed accepted). */
int ps_hashring_init(ps_hashring *r, int nshards, int vnodes);
void ps_hashring_free(ps_hashring *r);

/* Where key `key` of table `table` sits on the ring. */
uint64_t ps_hashring_position(uint32_t table, uint64_t key);

/* The shard that owns it: the owner of the first point at or after its
 * position, the ring wrapping past the last point to the first. */
int ps_hashring_owner(const ps_hashring *r, uint32_t table, uint64_t key);

#endif
