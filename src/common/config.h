/* The cluster configuration: one INI file that every process of a cluster
 * reads (libinih), its settings declared once in a table (name, type,
 * bounds, default, help) that drives parsing, defaults and the annotated
 * example systemd/cluster.conf. */
#ifndef PS_COMMON_CONFIG_H
#define PS_COMMON_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "common/addr.h"
#include "paramserv/error.h"

#define PS_CONFIG_MAX_NODES 64
#define PS_CONFIG_MAX_SENTINELS 16
#define PS_CONFIG_PATH_MAX 1024

/* [checkpoint] unusable: what the chief does with checkpoints it cannot
 * restore from (another model's, damaged) when it finds no usable one. */
typedef enum ps_ckpt_unusable {
  PS_CKPT_UNUSABLE_REFUSE = 0,   /* exit 2 naming the newest and why */
  PS_CKPT_UNUSABLE_SET_ASIDE,    /* move them into DIR/unusable/, start from the seed */
} ps_ckpt_unusable;

typedef enum { PS_CONSISTENCY_ASYNC = 0, PS_CONSISTENCY_SYNC, PS_CONSISTENCY_SSP } ps_consistency;
/* What workers push (src/ps/README.md, "Algorithms"): gradients; or the difference
 * of their own replica from the shards' center, averaged per round
 * (model averaging) or moved elastically (EASGD). */
typedef enum { PS_ALGO_GRADIENTS = 0, PS_ALGO_AVERAGING, PS_ALGO_EASGD } ps_algorithm;
/* How workers combine their gradients: through the shards, or around a
 * ring of their own (src/ring/README.md). */
typedef enum { PS_MODE_PS = 0, PS_MODE_RING } ps_mode;
typedef enum { PS_DATA_IDX = 0, PS_DATA_CRITEO, PS_DATA_NPY } ps_data_format;
typedef enum { PS_REPLICATION_OFF = 0, PS_REPLICATION_SNAPSHOT, PS_REPLICATION_LOG } ps_replication;
/* Sparse tables in Redis (src/replica/REDIS.md §3): in each snapshot's
 * image, or kept by key with each snapshot's changed rows. */
typedef enum { PS_SPARSE_ROWS_IMAGE = 0, PS_SPARSE_ROWS_KEYED } ps_sparse_rows;
typedef enum { PS_REDIS_FAILURE_BLOCK = 0, PS_REDIS_FAILURE_DEGRADE } ps_redis_failure;

typedef struct ps_config {
  char path[PS_CONFIG_PATH_MAX];  /* the file it was read from */

  /* [cluster] */
  char cluster_id[64];            /* [A-Za-z0-9_.-]{1,63} */
  char secret_file[PS_CONFIG_PATH_MAX];  /* relative paths: to the config's directory */
  ps_addr chief;
  int mode;                       /* ps_mode */
  int nps;                        /* 0 in ring mode when [cluster] ps is not given */
  ps_addr ps[PS_CONFIG_MAX_NODES];
  int nworkers;
  ps_addr workers[PS_CONFIG_MAX_NODES];
  char log_level[8];              /* debug|info|warn|error */
  int64_t peer_timeout_ms;        /* keepalive + TCP_USER_TIMEOUT on peer connections */
  int64_t max_connections;        /* a shard's (ring member's) connections open at once */
  char history_dir[PS_CONFIG_PATH_MAX];  /* "": no histories */

  /* [redis] (step 3) */
  ps_addr redis;
  char redis_user[64];
  char redis_password_file[PS_CONFIG_PATH_MAX];
  int64_t redis_timeout_ms;       /* every command's deadline */
  int nsentinels;                 /* 0: [redis] address is the server */
  ps_addr redis_sentinels[PS_CONFIG_MAX_SENTINELS];
  char redis_master_name[64];
  int ncluster;                   /* 0: no Redis Cluster; else its seed nodes */
  ps_addr redis_cluster[PS_CONFIG_MAX_SENTINELS];

  /* [model] */
  char model[8];                  /* mlp|cnn */
  char hidden[128];               /* mlp hidden sizes, e.g. 256,128 */
  char model_file[PS_CONFIG_PATH_MAX];      /* "": the built-in [model] name; see MODELFILE.md */
  char variables_file[PS_CONFIG_PATH_MAX];  /* "": none; variables only, no layers */
  char data_dir[PS_CONFIG_PATH_MAX];
  int64_t seed;

  /* [data] */
  int data_format;                /* ps_data_format */
  char train_data[PS_CONFIG_PATH_MAX];      /* criteo: the training file; npy: its directory */
  char test_data[PS_CONFIG_PATH_MAX];       /* criteo, npy: the test file or directory ("": none) */
  int64_t bag_separator;          /* criteo: the byte that splits a field into a bag; -1: none */

  /* [train] */
  char optimizer[16];             /* sgd|momentum|nesterov|adagrad|adam */
  double lr, momentum, weight_decay;
  char schedule[16];              /* constant|step|cosine */
  int64_t decay_steps;            /* step schedule: global steps between decays */
  double decay_gamma;             /* step schedule: the factor of each decay */
  int64_t batch;
  int64_t last_step;              /* global steps to train; 0 = no limit */
  int consistency;                /* ps_consistency */
  int64_t replicas_to_aggregate;  /* sync: 0 = the number of workers */
  int64_t staleness;              /* ssp bound s */
  int64_t sync_timeout_ms;        /* sync: wait this long for missing workers */
  int64_t window;                 /* communication window n (DOWNPOUR) */
  int adag;                       /* 1: push the accumulated gradient / n */
  int algorithm;                  /* ps_algorithm */
  double easgd_alpha;             /* easgd: the moving rate; 0 = 0.9 / workers */
  int64_t threads;                /* worker compute threads; 0 = all cores */
  int64_t log_every;              /* worker: log every N steps */

  /* [layout] */
  char layout_strategy[16];       /* round-robin|greedy */
  int64_t split_bytes;            /* 0 never, -1 auto (the default) */

  /* [replication] (step 3) */
  int replication;                /* ps_replication */
  int64_t replicate_interval_ms;
  int64_t replicate_every_updates;
  double replicate_log_ratio;     /* log: a snapshot once the log holds this x the image's bytes */
  double replicate_log_budget;    /* keyed: ... or once log + changed rows hold this x the rows (0: off) */
  int64_t replicate_log_max_mb;   /* keyed: ... or once the log holds this many MiB (0: off) */
  int sparse_rows;                /* PS_SPARSE_ROWS_*: how Redis keeps a shard's sparse tables */
  int ps_self_init;               /* a shard with no replica initializes itself */
  int ps_lazy_restore;            /* sparse rows come back from Redis while the shard serves */
  int on_redis_failure;           /* ps_redis_failure */
  int64_t redis_replicas;         /* WAIT for this many replicas; -1: auto (see ps_config_redis_replicas) */

  /* [checkpoint] (step 4) */
  char checkpoint_dir[PS_CONFIG_PATH_MAX];
  int64_t checkpoint_every_steps, checkpoint_every_secs, max_to_keep;
  int64_t checkpoint_on_stop_secs;
  double keep_every_n_hours;
  int ckpt_unusable;              /* ps_ckpt_unusable */
  char checkpoint_filter[8];      /* none|shuffle */
  int64_t checkpoint_full_every;  /* incremental checkpoints: a full one every this many */

  /* [chief] (step 4) */
  int64_t chief_lease_ms, chief_log_every, chief_eval_every;
  char summary_file[PS_CONFIG_PATH_MAX];

  /* [worker] */
  int64_t worker_give_up_s;       /* 0 = never give up */
  int64_t heartbeat_ms;
  int64_t device;                 /* PS_DEVICE_CPU (-1) or a CUDA device number */

  /* [metrics] */
  ps_addr metrics_listen;         /* port 0: off; else each process serves at port + its slot */
} ps_config;

/* Fill c with every setting's default (required ones left empty). */
void ps_config_defaults(ps_config *c);

/* Read `path`.  Unknown sections or keys, values that do not parse or are
 * out of bounds, duplicate keys and missing required keys are errors; the
 * one-line message names the file, the line, [section] key, the value
 * found and the expected form, e.g.
 *   cluster.conf:12: [train] batch = 0: expected an integer in [1, 65536]
 * Also checks cross-setting rules (replicas_to_aggregate <= workers, no
 * address listed twice in ps or workers, chief not at a shard's address).
 * Lines are at most 198 characters (libinih's line buffer); an address list
 * too long for one line continues on indented lines, a trailing comma
 * allowed.  On error *c is left partly filled; it owns no memory either way.
 * @return 0, -errno (cannot open or read), PS_ECONFIG. */
int ps_config_load(const char *path, ps_config *c, ps_errbuf *eb);

/* Parse NUL-terminated INI text from memory; what ps_config_load does after
 * reading the file, and what the fuzz target drives.  `name` is used in
 * messages and copied into c->path (ps_config_read_secret resolves a
 * relative secret_file against its directory).  Same returns as
 * ps_config_load. */
int ps_config_parse(const char *name, const char *text, ps_config *c, ps_errbuf *eb);

/* A file named in the config: `file` itself when absolute, else beside
 * the config (in its directory).  @return buf. */
const char *ps_config_file_path(const ps_config *c, const char *file, char *buf, size_t len);

/* Read the cluster secret named by secret_file (relative to the config's
 * directory) into buf[cap]: at least 16 bytes after one trailing newline is
 * stripped, at most cap.  The file must be a regular file with no access for
 * group or others (mode & 077 == 0).  @return the length, or -errno (cannot
 * open or read) / PS_ECONFIG with a message naming the file; on error buf
 * holds nothing of the secret. */
int ps_config_read_secret(const ps_config *c, uint8_t *buf, size_t cap, ps_errbuf *eb);

/* Read [redis] password_file the same way (relative to the config's
 * directory, owner-only), NUL-terminated into buf.  An empty setting gives
 * "" and 0.  @return the length or a negative code with a message. */
int ps_config_read_redis_password(const ps_config *c, char *buf, size_t cap, ps_errbuf *eb);

/* The replicas a log entry must reach before it counts as durable: [replication]
 * redis_replicas, or with "auto" 1 when Sentinels or a Redis Cluster are
 * configured, else 0. */
static inline int ps_config_redis_replicas(const ps_config *c) {
  return c->redis_replicas >= 0                      ? (int)c->redis_replicas
         : c->nsentinels > 0 || c->ncluster > 0 ? 1
                                                     : 0;
}

#endif
