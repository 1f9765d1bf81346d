/* The sparse tables' rows kept in Redis by key (REDIS.md §3, format 5):
 * one hash per bucket, a field per entry; a snapshot's changes written as
 * delta chunks, then merged into the hashes by one script per chunk.
 * Encodes and decodes both; no I/O.  Private to src/replica (snapshot.c
 * writes, restore.c reads, both merge). */
#ifndef PS_REPLICA_ROWS_H
#define PS_REPLICA_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "paramserv/error.h"
#include "ps/shard.h"
#include "ps/table.h"
#include "ps/tsec.h"
#include "replica/keys.h"

enum {
  PS_ROWS_FIELD = 12,        /* table u32, key u64 */
  PS_ROWS_VALUE_HEAD = 24,   /* rank, count, last_step u64; a row's floats follow */
  PS_ROWS_BITS = 10,         /* buckets: 2^bits hashes per shard */
  PS_ROWS_MAX_BITS = 16,
  PS_DELTA_GROUP = 12,       /* bucket u32, flags u32, records u32 */
  PS_DELTA_RECORD = 16,      /* field, value length u32 */
};
/* A delta chunk at most: one MERGE script applies it, and Redis serves
 * no other client meanwhile (about 3 ms at 256 KiB; a restarting shard's
 * reads wait behind every script queued). */
#define PS_DELTA_BYTES (1u << 18)
#define PS_DELTA_REMOVE 0xFFFFFFFFu   /* a record's length: remove the field */
#define PS_DELTA_REPLACE 1u           /* a group's flag: delete the hash first */

/* An entry's field: table, key. */
void ps_rows_field_put(uint8_t out[PS_ROWS_FIELD], uint32_t table, uint64_t key);

/* An entry's value: its bytes, and the value itself (rank: its place in
 * its list plus the snapshot's base). */
uint32_t ps_rows_value_bytes(const ps_tsec_table *t, int pending);
uint8_t *ps_rows_value_put(uint8_t *p, const ps_tsec_table *t, const ps_table_entry *e,
                           uint64_t rank);

/* One field and value of a bucket's hash, as HGETALL gives them, into *e
 * (its floats copied into scratch: (1 + nslots) * dim floats of the
 * largest table), *t and *rank.  tables[0..n): the shard's.  @return 0, or
 * PS_ECORRUPT with one line in eb saying what was found and expected. */
int ps_rows_decode(const void *field, size_t flen, const void *value, size_t vlen,
                   const ps_tsec_table *tables, int n, float *scratch, int *t,
                   ps_table_entry *e, uint64_t *rank, ps_errbuf *eb);

/* The shapes of a shard's tables (dim, slots, name) into out; @return the
 * most floats of one row's values and slots (a decode's scratch). */
size_t ps_rows_shapes(const ps_shard_opts *o, ps_tsec_table *out);

/* Entries from a bucket's hash into the shard: every field and value of
 * an HGETALL reply (an opaque hiredis redisReply *), or the values of an
 * HMGET of keys[0..n) (NULL: absent).  lazy: through ps_shard_lazy_entry
 * (held keys skipped), else ps_shard_row_load; got[t][0], got[t][1] count
 * the rows and pending keys of table t decoded.  @return 0, or PS_ECORRUPT
 * or -ENOMEM with eb. */
int ps_rows_take_all(ps_shard *s, const void *reply, int lazy, uint64_t (*got)[2],
                     ps_errbuf *eb);
int ps_rows_take_some(ps_shard *s, const ps_shard_key *keys, size_t n, const void *reply,
                      ps_errbuf *eb);

/* The HMGET of keys[0..n) (one bucket's: keys[0].bucket) from the hashes
 * named prefix<b>: argv and argl into the struct (fields in its buffer).
 * @return 0 or -ENOMEM; free with ps_rows_hmget_free. */
typedef struct ps_rows_hmget {
  const char **argv;
  size_t *argl;
  uint8_t *fields;
  char key[256];
  int argc;
} ps_rows_hmget;
int ps_rows_hmget_make(ps_rows_hmget *h, const char *prefix, const ps_shard_key *keys, size_t n);
void ps_rows_hmget_free(ps_rows_hmget *h);
/* The MERGE (PS_MERGE_SCRIPT) of delta chunk k of snapshot `snap`, whose
 * groups are of buckets[0..ng): its EVAL's argv into the struct.  @return
 * 0 or -ENOMEM; free with ps_rows_merge_free. */
typedef struct ps_rows_merge {
  const char **argv;
  char *names;
  char chunk[PS_KEY_MAX + 80], nkeys[24], k[24];
  int argc;
} ps_rows_merge;
int ps_rows_merge_make(ps_rows_merge *m, const ps_shard_keys *keys, const char *snap, uint64_t k,
                       const uint32_t *buckets, size_t ng);
void ps_rows_merge_free(ps_rows_merge *m);

/* Order keys by bucket (then table, key); @return the length of the run of
 * keys[0]'s bucket. */
void ps_rows_sort(ps_shard_key *keys, size_t n);
size_t ps_rows_run(const ps_shard_key *keys, size_t n);

/* A delta chunk being made: groups of records, each group one bucket's
 * (its hash is the merge's KEYS[2 + group]). */
typedef struct ps_delta {
  uint8_t *buf;              /* PS_DELTA_BYTES */
  size_t len;
  uint32_t *groups;          /* each group's bucket, in order */
  size_t ngroups, cap_groups;
  size_t group_at;           /* the last group's header */
} ps_delta;

int ps_delta_init(ps_delta *d);  /* @return 0 or -ENOMEM */
void ps_delta_clear(ps_delta *d);
void ps_delta_free(ps_delta *d);
/* Whether a record of `vlen` value bytes (PS_DELTA_REMOVE: a removal) in
 * `bucket` fits what the chunk has left. */
int ps_delta_fits(const ps_delta *d, uint32_t bucket, uint32_t vlen);
/* A group that deletes bucket's hash before its records (none yet). */
int ps_delta_replace(ps_delta *d, uint32_t bucket);
/* A record (after ps_delta_fits): @return where its vlen value bytes go
 * (the caller writes them), or NULL when out of memory for a group. */
uint8_t *ps_delta_add(ps_delta *d, uint32_t bucket, uint32_t table, uint64_t key,
                      uint32_t vlen);

/* Check a chunk as the merge does before it applies anything: its groups
 * and records fit its bytes exactly, and each group's bucket is below
 * 2^bits.  @return 0 and its groups' buckets, in order, in *buckets
 * (malloc'd; free it) and *groups; or PS_ECORRUPT with eb naming the
 * byte, or -ENOMEM. */
int ps_delta_check(const void *buf, size_t len, unsigned bits, uint32_t **buckets,
                   size_t *groups, ps_errbuf *eb);

/* The merge (REDIS.md §5, MERGE): KEYS meta, the chunk, then each group's
 * hash; ARGV the snapshot id, the chunk's number k, and the hashes' prefix
 * (`P:rows:`, each group's hash must be it and the group's bucket).  When the meta
 * names that snapshot and `merged` = k: checks the chunk, applies its
 * groups, deletes it, sets `merged` to k + 1, and answers 1; else 0 (done
 * already, or a snapshot replaced since).  Errors: `LOST delta chunk`,
 * `CORRUPT <what>`. */
extern const char PS_MERGE_SCRIPT[];

#endif
