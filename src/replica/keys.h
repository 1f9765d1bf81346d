/* Where things live in Redis (spec: REDIS.md §1), the one AUTH of every
 * connection to it, and the one way to open a blocking connection (connect,
 * deadline, AUTH).  Every module that names a key takes it from here. */
#ifndef PS_REPLICA_KEYS_H
#define PS_REPLICA_KEYS_H

#include <stdint.h>
#include <stdlib.h>

#include "common/config.h"
#include "paramserv/error.h"

#define PS_KEY_MAX 192

/* Shard i's keys: one hash tag {<cluster>:ps:<i>}, one Redis Cluster slot. */
typedef struct ps_shard_keys {
  char tag[96];                  /* {C:ps:i}: cluster ids are at most 63 characters */
  char epoch[PS_KEY_MAX];        /* newest incarnation's epoch */
  char meta[PS_KEY_MAX];         /* the switched snapshot */
  char logkey[PS_KEY_MAX];       /* names the current log stream */
  char log[PS_KEY_MAX];          /* this incarnation's log stream (after ps_shard_keys_log) */
  char snaps[PS_KEY_MAX];        /* snapshot id -> chunk count, of every snapshot written */
  char snap_prefix[PS_KEY_MAX];  /* + "<id>:<k>": chunk k of snapshot id; "<id>:d<k>": its
                                  * delta chunk k */
  char rows_prefix[PS_KEY_MAX];  /* + "<b>": the sparse tables' rows of bucket b */
  char node[PS_KEY_MAX];         /* heartbeat */
} ps_shard_keys;

void ps_shard_keys_init(ps_shard_keys *k, const char *cluster, int index);
/* Name the log stream of incarnation `epoch`. */
void ps_shard_keys_log(ps_shard_keys *k, uint64_t epoch);

/* The replica's format (REDIS.md): the meta hash's `format` field. */
#define PS_SNAP_FORMAT "5"

/* A snapshot's registration in P:snaps: "<chunks> <deltas>", its image
 * chunks and at most that many delta chunks (format 4: "<chunks>"). */
static inline void ps_snap_registered(const char *v, uint64_t *chunks, uint64_t *deltas) {
  char *end = NULL;
  *chunks = v != NULL ? strtoull(v, &end, 10) : 0;
  *deltas = end != NULL && *end == ' ' ? strtoull(end + 1, NULL, 10) : 0;
}

/* A snapshot is the shard's state image (ps_shard_state_write) cut into
 * chunks of this many floats, each one LZ4 block. */
#define PS_SNAP_CHUNK_FLOATS (256u * 1024u)

static inline uint64_t ps_snap_chunks(uint64_t image_floats) {
  return (image_floats + PS_SNAP_CHUNK_FLOATS - 1) / PS_SNAP_CHUNK_FLOATS;
}

/* Floats in chunk i. */
static inline uint64_t ps_snap_chunk_floats(uint64_t image_floats, uint64_t i) {
  uint64_t off = i * PS_SNAP_CHUNK_FLOATS;
  return image_floats - off < PS_SNAP_CHUNK_FLOATS ? image_floats - off : PS_SNAP_CHUNK_FLOATS;
}

/* A key of the cluster's own records: "{<cluster>}:<what>", e.g.
 * ps_cluster_key(buf, C, "node:worker:%d", 3). */
void ps_cluster_key(char out[PS_KEY_MAX], const char *cluster, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The cluster's records (REDIS.md §1, §10), each named once here. */
void ps_key_node(char out[PS_KEY_MAX], const char *cluster, const char *role, int index);
void ps_key_epoch(char out[PS_KEY_MAX], const char *cluster, const char *role, int index);
void ps_key_worker_pos(char out[PS_KEY_MAX], const char *cluster, int worker);
void ps_key_chief_lease(char out[PS_KEY_MAX], const char *cluster);
void ps_key_done(char out[PS_KEY_MAX], const char *cluster);
/* Ring mode (src/ring/README.md): the current view; each view's reports. */
void ps_key_ring_view(char out[PS_KEY_MAX], const char *cluster);
void ps_key_ring_reports(char out[PS_KEY_MAX], const char *cluster, uint64_t epoch);
/* `paramserv bench-redis-table` (a benchmark's baseline): sparse table t's
 * rows, one hash. */
void ps_key_bench_table(char out[PS_KEY_MAX], const char *cluster, int table);

/* The hash tag of the cluster's own records, "{<cluster>}" (the shards'
 * is ps_shard_keys.tag): what a connection names so that, in a Redis
 * Cluster, it goes to the node serving that tag's slot. */
void ps_cluster_tag(char out[PS_KEY_MAX], const char *cluster);

/* Where the Redis primary for the keys of hash tag `tag` is: [redis]
 * address; with [redis] sentinels the primary the first Sentinel that
 * answers names for master_name; with [redis] cluster the primary of tag's
 * slot, as the first node that answers CLUSTER KEYSLOT and CLUSTER SLOTS
 * names it (each asked with `timeout_ms`).  @return 0, or -ECONNREFUSED
 * with eb set. */
int ps_redis_primary(const ps_config *cfg, const char *tag, int64_t timeout_ms, ps_addr *out,
                     ps_errbuf *eb);

/* From a CLUSTER SLOTS reply (an opaque hiredis redisReply *), the primary
 * serving `slot` (an empty host there: the node `asked`).  @return 0, or
 * -1 with why set (no range holds the slot, or its entry is malformed). */
int ps_redis_slot_primary(const void *reply, long long slot, const ps_addr *asked, ps_addr *out,
                          char *why, size_t len);

/* A Redis Cluster redirection: 1 for MOVED (the slot is served by *to
 * now), 2 for ASK (the slot is moving to *to), 0 for any other reply. */
int ps_redis_redirect(const void *reply, ps_addr *to);

/* The AUTH of every connection to Redis, blocking (ps_redis_connect_to)
 * or async (link.c), written once: [redis] password_file read now (it is
 * re-read at every connection), AUTH <password>, or AUTH <user> <password>
 * with [redis] user.  argv points into the struct, whose password
 * ps_redis_auth_clear wipes once the command is sent.  @return argc (2 or
 * 3), 0 when no password is set (no AUTH), or a negative code with eb set
 * (the file cannot be read). */
typedef struct ps_redis_auth {
  char pw[512];
  const char *argv[3];
  int argc;
} ps_redis_auth;
int ps_redis_auth_init(ps_redis_auth *a, const ps_config *cfg, ps_errbuf *eb);
void ps_redis_auth_clear(ps_redis_auth *a);

/* Connect to the primary for `tag` (ps_redis_primary) with `timeout_ms`
 * for the connect and for every command after it, and AUTH when [redis]
 * password_file is set; with Sentinels, check that it is the primary now
 * (ROLE: right after a failover a Sentinel may name the old one); in a
 * Redis Cluster, that it serves tag's slot now (a keyed read: a MOVED
 * reply is followed to the node it names).
 * @return an opaque hiredis redisContext * (free with redisFree), or NULL
 * with eb set: -ECONNREFUSED (unreachable, or failing over: retry),
 * -EACCES (AUTH refused or the password file unreadable: do not retry). */
void *ps_redis_connect(const ps_config *cfg, const char *tag, int64_t timeout_ms, ps_errbuf *eb);

/* What a wait for Redis says: once, at its first failed attempt, what is
 * known ("nothing answers there" and whether a redis-server runs on this
 * machine, when the connection was refused), then at most every 30 s how
 * long and how many attempts.  Zero it before a wait. */
typedef struct ps_redis_wait {
  uint64_t first_ns, said_ns;
  unsigned attempts;
} ps_redis_wait;
void ps_redis_wait_failed(ps_redis_wait *w, const char *what, const char *why);

/* Whether a process named redis-server runs on this machine (/proc). */
int ps_redis_running_here(void);

/* The same, to an address already found with ps_redis_primary (the
 * Sentinels and the cluster's nodes are not asked again). */
void *ps_redis_connect_to(const ps_config *cfg, const char *tag, const ps_addr *to,
                          int64_t timeout_ms, ps_errbuf *eb);

/* The backoff (common/backoff.h) of whoever waits for Redis at start-up:
 * the registry's new epoch and the shard's restore. */
#define PS_REDIS_RETRY_BASE_MS 100
#define PS_REDIS_RETRY_CAP_MS 2000

/* A field of a flat field/value reply (an opaque hiredis redisReply *: an
 * HGETALL's, a stream entry's fields): its value's reply, or NULL. */
const void *ps_redis_field(const void *reply, const char *field);
/* That value as an unsigned decimal: 0, or -1 when it is absent, empty or
 * not a number. */
int ps_redis_field_u64(const void *reply, const char *field, uint64_t *out);

#endif
