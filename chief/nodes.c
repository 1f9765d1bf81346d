/* The chief's view of the other nodes (see nodes.h). */
#include "chief/nodes.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "replica/keys.h"

void ps_nodes_init(ps_nodes *n, const ps_config *cfg, ps_summary *sum) {
  memset(n, 0, sizeof *n);
  n->cfg = cfg;
  n->sum = sum;
}

/* A node that died and came back between two looks: lost and back. */
static void restarted(ps_nodes *n, const char *node, uint64_t was, uint64_t now, uint64_t gstep) {
  ps_log(PS_LOG_INFO, "%s restarted (incarnation %" PRIu64 " -> %" PRIu64 ")", node, was, now);
  ps_summary_event(n->sum, gstep, "node_lost", "{s:s}", "node", node);
  ps_summary_event(n->sum, gstep, "node_back", "{s:s, s:b}", "node", node, "restarted", 1);
}

void ps_nodes_shards(ps_nodes *n, const int *ok, const ps_msg_stats_reply *stats,
                     const char *why, uint64_t gstep) {
  for (int i = 0; i < n->cfg->nps; i++) {
    char node[32];
    snprintf(node, sizeof node, "ps %d", i);
    if (ok[i] && !n->shard_up[i]) {
      if (n->shard_incarnation[i] != 0) {
        ps_log(PS_LOG_INFO, "%s is back (incarnation %" PRIu64 ", version %" PRIu64 ")", node,
               stats[i].incarnation, stats[i].version);
        ps_summary_event(n->sum, gstep, "node_back", "{s:s}", "node", node);
      }
      n->shard_up[i] = 1;
    } else if (!ok[i] && n->shard_up[i]) {
      ps_log(PS_LOG_WARN, "%s lost: %s", node,
             why != NULL && why[0] ? why : "it did not answer the chief's STATS request");
      ps_summary_event(n->sum, gstep, "node_lost", "{s:s}", "node", node);
      n->shard_up[i] = 0;
    }
    if (ok[i] && n->shard_incarnation[i] != 0 &&
        stats[i].incarnation != n->shard_incarnation[i] && n->shard_up[i])
      restarted(n, node, n->shard_incarnation[i], stats[i].incarnation, gstep);
    if (ok[i])
      n->shard_incarnation[i] = stats[i].incarnation;
  }
}

void ps_nodes_workers(ps_nodes *n, ps_registry *reg, uint64_t gstep) {
  uint64_t now = ps_now_ns();
  if (now - n->workers_checked_ns < 1000000000ULL)
    return;
  n->workers_checked_ns = now;
  redisContext *c = ps_registry_redis(reg, 0);
  if (c == NULL)
    return;
  for (int j = 0; j < n->cfg->nworkers; j++) {
    char key[PS_KEY_MAX];
    ps_key_node(key, n->cfg->cluster_id, "worker", j);
    redisReply *r = redisCommand(c, "GET %s", key);
    if (r == NULL) {
      ps_registry_lost(reg, "heartbeat check got no reply");
      return;
    }
    int up = r->type == REDIS_REPLY_STRING;
    /* The heartbeat names the incarnation: a new one is a restart. */
    const char *inc = up ? strstr(r->str, "incarnation ") : NULL;
    uint64_t incarnation = inc != NULL ? strtoull(inc + 12, NULL, 10) : 0;
    freeReplyObject(r);
    char node[32];
    snprintf(node, sizeof node, "worker %d", j);
    if (up && n->worker_up[j] == 1 && incarnation != 0 && n->worker_incarnation[j] != 0 &&
        incarnation != n->worker_incarnation[j])
      restarted(n, node, n->worker_incarnation[j], incarnation, gstep);
    uint64_t was = n->worker_incarnation[j];
    if (incarnation != 0)
      n->worker_incarnation[j] = incarnation;
    if (up == (n->worker_up[j] == 1))
      continue;
    if (n->worker_up[j] != 0 && !up) {  /* 0: not seen yet */
      /* The heartbeat's key expired: a process that stalled (paused,
       * swapping, cut off from Redis) looks the same as a dead one until
       * it comes back, as the same incarnation or a new one. */
      ps_log(PS_LOG_WARN, "%s: no heartbeat for %" PRId64 " ms: stalled or gone", node,
             3 * n->cfg->heartbeat_ms);
      n->worker_lost_ns[j] = now;
    } else if (n->worker_up[j] != 0) {
      double away = (double)(now - n->worker_lost_ns[j]) * 1e-9;
      if (incarnation != 0 && incarnation == was)
        ps_log(PS_LOG_INFO, "%s is back: it had stalled (the same incarnation, %.1f s since its "
               "heartbeat was found gone)", node, away);
      else
        ps_log(PS_LOG_INFO, "%s is back as a new incarnation (%.1f s since its heartbeat was "
               "found gone)", node, away);
    }
    if (n->worker_up[j] != 0)
      ps_summary_event(n->sum, gstep, up ? "node_back" : "node_lost", "{s:s}", "node", node);
    n->worker_up[j] = up ? 1 : -1;
  }
}
