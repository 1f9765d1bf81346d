/* The sparse tables' rows at a shard's start-up, when Redis keeps them by
 * key (format 5, REDIS.md §3 and §7): the merges a killed incarnation
 * left, the rows read (or, lazily, only begun), and the rows a log
 * replay's page touches fetched before it is applied.  restore.c's, on
 * its blocking connection (an opaque hiredis redisContext *); replies are
 * opaque hiredis redisReply *. */
#ifndef PS_REPLICA_RESTORE_ROWS_H
#define PS_REPLICA_RESTORE_ROWS_H

#include "paramserv/error.h"
#include "ps/shard.h"
#include "replica/keys.h"
#include "replica/restore.h"

/* Finish the merges of the meta's delta chunks that a previous
 * incarnation left (REDIS.md §7 step 6), in order, by the same script: one
 * it merged meanwhile does nothing.  @return 0; -EIO (Redis refused or
 * went away: the restore starts over); PS_ECORRUPT (a chunk missing or
 * malformed). */
int ps_restore_finish_merges(void *c, const ps_shard_keys *k, const void *meta,
                             ps_restore_info *info, ps_errbuf *eb);

/* The tables' entries from the rows' hashes, into the shard's tables
 * (which the image left empty); lazily (info->lazy) only begun, where the
 * tables allow it.  @return 0, or a negative code with a message. */
int ps_restore_load_rows(void *c, const ps_shard_keys *k, const void *meta, ps_shard *s,
                         ps_restore_info *info, ps_errbuf *eb);

/* A lazy load: the rows a page of log entries (an XRANGE reply) touches
 * that are not in yet, fetched before any of them is applied.  Counted in
 * info->fetched and fetch_s.  @return 0, or a negative code. */
int ps_restore_prefetch(void *c, const ps_shard_keys *k, ps_shard *s, const void *page,
                        ps_restore_info *info, ps_errbuf *eb);

#endif
