/* The table of every setting of the cluster configuration (settings.h),
 * with the parsers of the few values their type alone cannot describe. */
#include "common/settings.h"

#include <stdio.h>
#include <string.h>

#include "common/addr.h"
#include "common/parse.h"

/* Parsers for the few values their type alone cannot describe. */

static int parse_cluster_id(const ps_setting *s, const char *v, void *field, char *why,
                            size_t len) {
  size_t n = strlen(v);
  if (n < 1 || n >= s->size ||
      strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") != n) {
    snprintf(why, len, "1 to %zu of A-Z a-z 0-9 _ . -", s->size - 1);
    return PS_ECONFIG;
  }
  memcpy(field, v, n + 1);
  return 0;
}

/* [data] bag_separator: one byte (not a tab, a newline or a carriage
 * return, which end a field or a line), or nothing (-1: no bags). */
static int parse_bag_separator(const ps_setting *s, const char *v, void *field, char *why,
                               size_t len) {
  (void)s;
  size_t n = strlen(v);
  if (n > 1 || (n == 1 && (v[0] == '\t' || v[0] == '\n' || v[0] == '\r'))) {
    snprintf(why, len, "one byte other than a tab, or nothing (no bags)");
    return PS_ECONFIG;
  }
  *(int64_t *)field = n == 0 ? -1 : (unsigned char)v[0];
  return 0;
}

/* For a rate, where zero is as wrong as a negative number. */
static int parse_positive(const ps_setting *s, const char *v, void *field, char *why,
                          size_t len) {
  double x;
  if (ps_parse_double(v, 0, s->max, &x) != 0 || x <= 0) {
    snprintf(why, len, "a number in (0, %.15g]", s->max);
    return PS_ECONFIG;
  }
  *(double *)field = x;
  return 0;
}

/* "auto" is -1 and "never" 0, as config.h documents for split_bytes. */
static int parse_split_bytes(const ps_setting *s, const char *v, void *field, char *why,
                             size_t len) {
  int64_t x = 0;
  if (strcmp(v, "auto") == 0)
    x = -1;
  else if (strcmp(v, "never") != 0 && ps_parse_i64(v, (int64_t)s->min, (int64_t)s->max, &x) != 0) {
    snprintf(why, len, "auto, never, or an integer of bytes in [%lld, %lld]", (long long)s->min,
             (long long)s->max);
    return PS_ECONFIG;
  }
  *(int64_t *)field = x;
  return 0;
}

/* [replication] redis_replicas: "auto" (-1: 1 with Sentinels or a Cluster, else 0) or a count. */
static int parse_redis_replicas(const ps_setting *s, const char *v, void *field, char *why,
                                size_t len) {
  int64_t x = -1;
  if (strcmp(v, "auto") != 0 && ps_parse_i64(v, (int64_t)s->min, (int64_t)s->max, &x) != 0) {
    snprintf(why, len, "auto, or an integer of replicas in [%lld, %lld]", (long long)s->min,
             (long long)s->max);
    return PS_ECONFIG;
  }
  *(int64_t *)field = x;
  return 0;
}

/* [worker] device: cpu, cuda or cuda:N, as paramserv train --device. */
static int parse_device(const ps_setting *s, const char *v, void *field, char *why, size_t len) {
  (void)s;
  int device;
  if (ps_parse_device(v, &device) != 0) {
    snprintf(why, len, PS_DEVICE_FORM);
    return PS_ECONFIG;
  }
  *(int64_t *)field = device;
  return 0;
}

/* [metrics] listen: empty (off, port 0) or host:port. */
static int parse_metrics_listen(const ps_setting *s, const char *v, void *field, char *why,
                                size_t len) {
  (void)s;
  if (v[0] == '\0') {
    memset(field, 0, sizeof(ps_addr));
    return 0;
  }
  if (ps_addr_parse(v, (ps_addr *)field) == 0)
    return 0;
  snprintf(why, len, "empty (off) or host:port, the port a base");
  return PS_ECONFIG;
}

static const char *const log_levels[] = {"debug", "info", "warn", "error", NULL};
static const char *const models[] = {"mlp", "cnn", NULL};
static const char *const optimizers[] = {"sgd", "momentum", "nesterov", "adagrad", "adam", NULL};
static const char *const schedules[] = {"constant", "step", "cosine", NULL};
static const char *const strategies[] = {"round-robin", "greedy", NULL};
/* ENUM choices are stored as their index: these follow the enums' order. */
static const char *const consistencies[] = {"async", "sync", "ssp", NULL};
static const char *const modes[] = {"ps", "ring", NULL};
static const char *const data_formats[] = {"idx", "criteo", "npy", NULL};
static const char *const algorithms[] = {"gradients", "averaging", "easgd", NULL};
static const char *const replications[] = {"off", "snapshot", "log", NULL};
static const char *const ckpt_filters[] = {"none", "shuffle", NULL};
static const char *const redis_failures[] = {"block", "degrade", NULL};
static const char *const sparse_rows[] = {"image", "keyed", NULL};
static const char *const ckpt_unusables[] = {"refuse", "set_aside", NULL};

#define FIELD(f) .offset = offsetof(ps_config, f), .size = sizeof(((ps_config *)0)->f)
#define LIST(f, n) FIELD(f), .count_offset = offsetof(ps_config, n)
#define POW2(k) ((double)(1ULL << (k)))
#define STRING PS_SETTING_STRING
#define INT PS_SETTING_INT
#define DOUBLE PS_SETTING_DOUBLE
#define BOOL PS_SETTING_BOOL
#define ENUM PS_SETTING_ENUM
#define ADDR PS_SETTING_ADDR
#define ADDR_LIST PS_SETTING_ADDR_LIST

/* In the order of systemd/cluster.conf, sections kept together (a test checks
 * both).  Defaults are text, parsed by the same code as the file's values. */
const ps_setting ps_settings[] = {
    {"cluster", "id", STRING, FIELD(cluster_id), .min = 1, .parse = parse_cluster_id,
     .def = "paramserv", .help = "name of this cluster, in every handshake and Redis key"},
    {"cluster", "secret_file", STRING, FIELD(secret_file), .min = 1, .def = "secret",
     .help = "shared secret: mode 600, 16+ bytes; a relative path is beside this file"},
    {"cluster", "chief", ADDR, FIELD(chief), .def = "127.0.0.1:7070",
     .help = "the chief's host:port (the chief listens on nothing: the port only names it)"},
    {"cluster", "mode", ENUM, FIELD(mode), .choices = modes, .def = "ps",
     .help = "ps: workers push to shards; ring: workers all-reduce around a ring, no shards"},
    {"cluster", "ps", ADDR_LIST, LIST(ps, nps), .min = 1, .max = PS_CONFIG_MAX_NODES,
     .help = "required with mode = ps: the shards' host:port, in shard order"},
    {"cluster", "workers", ADDR_LIST, LIST(workers, nworkers), .min = 1,
     .max = PS_CONFIG_MAX_NODES,
     .help = "required: the workers' host:port, in index order (ring mode listens on them)"},
    {"cluster", "log_level", STRING, FIELD(log_level), .choices = log_levels, .def = "info",
     .help = "lowest level logged: debug, info, warn or error"},
    {"cluster", "peer_timeout_ms", INT, FIELD(peer_timeout_ms), .min = 1000, .max = 3600000,
     .def = "5000",
     .help = "a peer connection that goes silent (dead host, dropped link) is closed after this long"},
    {"cluster", "max_connections", INT, FIELD(max_connections), .min = 16, .max = 1000000,
     .def = "512",
     .help = "connections a shard (or ring member) keeps open at once; at the limit the oldest unauthenticated one makes room"},
    {"cluster", "history_dir", STRING, FIELD(history_dir), .def = "",
     .help = "each process appends its history (acks, restores) here, for checkers (empty: off)"},

    {"redis", "address", ADDR, FIELD(redis), .def = "127.0.0.1:6379",
     .help = "Redis server for shard replicas, heartbeats, the global step, the chief's lease"},
    {"redis", "user", STRING, FIELD(redis_user), .def = "",
     .help = "Redis ACL user (empty: the default user)"},
    {"redis", "password_file", STRING, FIELD(redis_password_file), .def = "",
     .help = "file holding the Redis password (empty: no AUTH)"},
    {"redis", "timeout_ms", INT, FIELD(redis_timeout_ms), .min = 10, .max = 600000, .def = "3000",
     .help = "deadline of every Redis command and connect; past it the connection is dropped"},
    {"redis", "sentinels", ADDR_LIST, LIST(redis_sentinels, nsentinels), .max = PS_CONFIG_MAX_SENTINELS,
     .def = "", .help = "Redis Sentinels, host:port each (empty: none, [redis] address is the server)"},
    {"redis", "master_name", STRING, FIELD(redis_master_name), .min = 1, .def = "paramserv",
     .help = "with sentinels: the name they monitor the primary by"},
    {"redis", "cluster", ADDR_LIST, LIST(redis_cluster, ncluster), .max = PS_CONFIG_MAX_SENTINELS,
     .def = "", .help = "Redis Cluster nodes to ask where each shard's slot is, host:port each (empty: no cluster)"},

    {"model", "name", STRING, FIELD(model), .choices = models, .def = "mlp",
     .help = "the model: mlp (fully connected) or cnn"},
    {"model", "hidden", STRING, FIELD(hidden), .def = "256,128",
     .help = "mlp hidden layer sizes, comma-separated"},
    {"model", "file", STRING, FIELD(model_file), .def = "",
     .help = "a model file (src/nn/MODELFILE.md), instead of name; a relative path is beside this file"},
    {"model", "variables", STRING, FIELD(variables_file), .def = "",
     .help = "a variables file (MODELFILE.md): variables only, for the client library; instead of name"},
    {"model", "data_dir", STRING, FIELD(data_dir), .min = 1,
     .def = "/usr/share/datasets/fashion-mnist",
     .help = "directory of the Fashion-MNIST IDX files"},
    {"model", "seed", INT, FIELD(seed), .max = POW2(62), .def = "1",
     .help = "seed of weight initialization and data shuffling"},

    {"data", "format", ENUM, FIELD(data_format), .choices = data_formats, .def = "idx",
     .help = "idx: Fashion-MNIST in [model] data_dir; criteo: click logs; npy: your own X.npy and y.npy (src/data/NPY.md)"},
    {"data", "train", STRING, FIELD(train_data), .def = "",
     .help = "criteo: training samples, plain or gzip (src/data/CRITEO.md); npy: the directory of X.npy, y.npy; beside this file if relative"},
    {"data", "test", STRING, FIELD(test_data), .def = "",
     .help = "criteo, npy: test samples worker 0 evaluates at the end, as train (empty: none)"},
    {"data", "bag_separator", INT, FIELD(bag_separator), .min = -1, .max = 255,
     .parse = parse_bag_separator, .def = "",
     .help = "criteo: a byte that splits each categorical field into a bag of values, e.g. , (src/data/CRITEO.md, Bags); empty: one value a field"},

    {"train", "optimizer", STRING, FIELD(optimizer), .choices = optimizers, .def = "adam",
     .help = "sgd, momentum, nesterov, adagrad or adam: the shards apply it (averaging, easgd: each worker)"},
    {"train", "lr", DOUBLE, FIELD(lr), .max = 1000, .parse = parse_positive, .def = "0.001",
     .help = "learning rate"},
    {"train", "momentum", DOUBLE, FIELD(momentum), .max = 1, .def = "0.9",
     .help = "momentum coefficient (momentum and nesterov)"},
    {"train", "weight_decay", DOUBLE, FIELD(weight_decay), .max = 1, .def = "0",
     .help = "L2 weight decay"},
    {"train", "schedule", STRING, FIELD(schedule), .choices = schedules, .def = "constant",
     .help = "learning-rate schedule over the global step: constant, step (decay_steps) or "
             "cosine (to 0 at last_step)"},
    {"train", "decay_steps", INT, FIELD(decay_steps), .max = POW2(62), .def = "0",
     .help = "step schedule: global steps between decays of the learning rate (required)"},
    {"train", "decay_gamma", DOUBLE, FIELD(decay_gamma), .max = 1, .parse = parse_positive,
     .def = "0.1", .help = "step schedule: the factor of each decay"},
    {"train", "batch", INT, FIELD(batch), .min = 1, .max = 65536, .def = "128",
     .help = "examples per worker step"},
    {"train", "last_step", INT, FIELD(last_step), .max = POW2(62), .def = "0",
     .help = "stop at this global step (0: no limit)"},
    {"train", "consistency", ENUM, FIELD(consistency), .choices = consistencies, .def = "async",
     .help = "async: apply each push at once; sync: aggregate per step; ssp: bounded staleness"},
    {"train", "replicas_to_aggregate", INT, FIELD(replicas_to_aggregate),
     .max = PS_CONFIG_MAX_NODES, .def = "0",
     .help = "sync: pushes aggregated per step, at most the workers (0: all of them)"},
    {"train", "staleness", INT, FIELD(staleness), .max = 1000000, .def = "3",
     .help = "ssp: steps the fastest worker may lead the slowest (ignored otherwise)"},
    {"train", "sync_timeout_ms", INT, FIELD(sync_timeout_ms), .min = 1, .max = 3600000,
     .def = "5000", .help = "sync: how long a step waits for a missing worker before going on"},
    {"train", "window", INT, FIELD(window), .min = 1, .max = 100000, .def = "1",
     .help = "steps a worker computes between pulls and pushes (DOWNPOUR's n)"},
    {"train", "adag", BOOL, FIELD(adag), .def = "no",
     .help = "yes: push the gradient accumulated over the window divided by its length"},
    {"train", "algorithm", ENUM, FIELD(algorithm), .choices = algorithms, .def = "gradients",
     .help = "gradients: push gradients; averaging: average the workers' replicas every "
             "window steps (sync); easgd: elastic averaging with a center"},
    {"train", "easgd_alpha", DOUBLE, FIELD(easgd_alpha), .max = 1, .def = "0",
     .help = "easgd: moving rate alpha (0: 0.9 / the number of workers)"},
    {"train", "threads", INT, FIELD(threads), .max = 256, .def = "0",
     .help = "worker compute threads (0: all cores)"},
    {"train", "log_every", INT, FIELD(log_every), .min = 1, .max = POW2(31), .def = "100",
     .help = "a worker logs every this many steps"},

    {"layout", "strategy", STRING, FIELD(layout_strategy), .choices = strategies,
     .def = "greedy", .help = "placement of variable parts: round-robin or greedy (least loaded)"},
    {"layout", "split_bytes", INT, FIELD(split_bytes), .min = 4, .max = POW2(40),
     .parse = parse_split_bytes, .def = "auto",
     .help = "a variable larger than this is split across shards: auto, never, or bytes"},

    {"replication", "mode", ENUM, FIELD(replication), .choices = replications, .def = "log",
     .help = "off: no Redis replica; snapshot: periodic; log: each update logged before its ack"},
    {"replication", "interval_ms", INT, FIELD(replicate_interval_ms), .min = 1, .max = 3600000,
     .def = "200",
     .help = "a shard snapshots its state to Redis this often (log: once the log holds an image)"},
    {"replication", "every_updates", INT, FIELD(replicate_every_updates), .min = 1,
     .max = POW2(31), .def = "100",
     .help = "a shard also snapshots after this many updates (bounds the log to replay)"},
    {"replication", "log_ratio", DOUBLE, FIELD(replicate_log_ratio), .max = 1000, .def = "1",
     .help = "log: a snapshot waits until the log since the last holds this x the state's bytes"},
    {"replication", "sparse_rows", ENUM, FIELD(sparse_rows), .choices = sparse_rows,
     .def = "image",
     .help = "sparse tables in Redis: image (whole, each snapshot) or keyed (changed rows only)"},
    {"replication", "log_budget", DOUBLE, FIELD(replicate_log_budget), .max = 1000,
     .def = "0.125",
     .help = "keyed rows: a snapshot once the log and changed rows reach this x the rows"},
    {"replication", "log_max_mb", INT, FIELD(replicate_log_max_mb), .min = 0, .max = POW2(20),
     .def = "4",
     .help = "keyed rows: a snapshot once the log holds this many MiB (0: no bound)"},
    {"replication", "lazy_restore", BOOL, FIELD(ps_lazy_restore), .def = "yes",
     .help = "keyed rows: a restarted shard serves before they are all back from Redis"},
    {"replication", "self_init", BOOL, FIELD(ps_self_init), .def = "no",
     .help = "a shard with no replica initializes its variables itself (no: the chief does)"},
    {"replication", "on_redis_failure", ENUM, FIELD(on_redis_failure), .choices = redis_failures,
     .def = "block", .help = "log mode, Redis refusing or away: block (hold acks) or degrade (count)"},
    {"replication", "redis_replicas", INT, FIELD(redis_replicas), .max = PS_CONFIG_MAX_SENTINELS,
     .parse = parse_redis_replicas, .def = "auto",
     .help = "log mode: an entry is durable once on the primary and this many replicas (WAIT)"},

    {"checkpoint", "dir", STRING, FIELD(checkpoint_dir), .min = 1,
     .def = "/var/lib/paramserv/checkpoints", .help = "checkpoint directory, written by the chief"},
    {"checkpoint", "every_steps", INT, FIELD(checkpoint_every_steps), .max = POW2(62), .def = "0",
     .help = "checkpoint every this many global steps (0: off)"},
    {"checkpoint", "every_secs", INT, FIELD(checkpoint_every_secs), .max = POW2(31), .def = "600",
     .help = "checkpoint every this many seconds (0: off)"},
    {"checkpoint", "on_stop_secs", INT, FIELD(checkpoint_on_stop_secs), .max = 3600, .def = "30",
     .help = "on SIGTERM or Ctrl-C the chief writes a final checkpoint taking at most this long (0: none)"},
    {"checkpoint", "max_to_keep", INT, FIELD(max_to_keep), .min = 1, .max = 1000000, .def = "5",
     .help = "newest checkpoints of this model kept (by step); older ones are deleted"},
    {"checkpoint", "keep_every_n_hours", DOUBLE, FIELD(keep_every_n_hours), .max = 1e6,
     .def = "0", .help = "also keep one checkpoint per this many hours (0: off)"},
    {"checkpoint", "unusable", ENUM, FIELD(ckpt_unusable), .choices = ckpt_unusables,
     .def = "refuse",
     .help = "no checkpoint fits (another model, damaged): refuse (exit 2) or set_aside"},
    {"checkpoint", "filter", STRING, FIELD(checkpoint_filter), .choices = ckpt_filters,
     .def = "shuffle", .help = "byte filter before LZ4: shuffle (groups float bytes) or none"},
    {"checkpoint", "full_every", INT, FIELD(checkpoint_full_every), .min = 1, .max = 1000,
     .def = "8", .help = "with sparse tables, every this many checkpoints one is full; the others "
                         "hold the rows changed since the one before (1: all full)"},

    {"chief", "lease_ms", INT, FIELD(chief_lease_ms), .min = 100, .max = 3600000, .def = "5000",
     .help = "the chief's lease in Redis lasts this long; renewed every third of it"},
    {"chief", "log_every_steps", INT, FIELD(chief_log_every), .max = POW2(31), .def = "500",
     .help = "the chief logs progress every this many global steps (0: off)"},
    {"chief", "eval_every_steps", INT, FIELD(chief_eval_every), .max = POW2(31), .def = "1000",
     .help = "the chief measures test accuracy every this many global steps (0: off)"},
    {"chief", "summary_file", STRING, FIELD(summary_file), .def = "",
     .help = "JSON-lines summaries (empty: summaries.jsonl in the checkpoint directory)"},

    {"worker", "give_up_s", INT, FIELD(worker_give_up_s), .max = POW2(31), .def = "0",
     .help = "a worker exits after failing to reach a shard for this long (0: never)"},
    {"worker", "heartbeat_ms", INT, FIELD(heartbeat_ms), .min = 10, .max = 3600000, .def = "1000",
     .help = "a worker heart-beats to Redis this often"},
    {"worker", "device", INT, FIELD(device), .min = PS_DEVICE_CPU, .max = PS_DEVICE_MAX,
     .parse = parse_device, .def = "cpu",
     .help = "where a worker computes gradients: cpu, cuda (GPU 0) or cuda:N (GPU N)"},

    {"metrics", "listen", ADDR, FIELD(metrics_listen), .parse = parse_metrics_listen, .def = "",
     .help = "Prometheus metrics at http://host:(port + slot)/metrics (empty: off)"},
};

const size_t ps_nsettings = sizeof ps_settings / sizeof ps_settings[0];
_Static_assert(sizeof ps_settings / sizeof ps_settings[0] <= PS_SETTINGS_MAX,
               "the config parser keeps a line per setting: raise PS_SETTINGS_MAX");

const ps_setting *ps_config_settings(size_t *n) {
  if (n != NULL)
    *n = ps_nsettings;
  return ps_settings;
}
