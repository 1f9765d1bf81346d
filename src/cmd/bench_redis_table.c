/* `paramserv bench-redis-table`: a benchmark's baseline, not a production
 * path.  One worker of a model with sparse tables whose rows live in Redis
 * and are read and written by the workers themselves, as TensorFlow
 * Recommenders-Addons' Redis backend keeps embeddings: per step it reads
 * the batch's distinct rows (HMGET, one hash per table), computes, applies
 * the rows' optimizer on the worker and writes them back (HSET), while the
 * dense part goes through the cluster's shards as a paramserv worker's
 * does.  scripts/bench-sparse sets it against paramserv's own tables. */
#include <errno.h>
#include <getopt.h>
#include <hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cli.h"
#include "cmd/cmd.h"
#include "common/config.h"
#include "common/endian.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "nn/compute.h"
#include "paramserv/client.h"
#include "ps/shard.h"
#include "ps/table.h"
#include "replica/keys.h"
#include "worker/control.h"
#include "worker/embed.h"
#include "worker/eval_ctr.h"
#include "worker/trainer.h"

static void usage(FILE *f) {
  fprintf(f,
      "usage: paramserv bench-redis-table --config FILE --worker J\n"
      "\n"
      "A BENCHMARK'S BASELINE, NOT A WAY TO TRAIN: scripts/bench-sparse runs it to set\n"
      "paramserv's sparse tables against tables kept in Redis, as TensorFlow\n"
      "Recommenders-Addons' Redis backend keeps them.  Worker J of the cluster in FILE\n"
      "trains a model with sparse tables (models/ctr.json on [data] format = criteo):\n"
      "its dense part through the cluster's shards as `paramserv worker` does, its rows\n"
      "in Redis ([redis] address), one hash per table ({<cluster id>}:bench:table:<t>;\n"
      "field: the key's 8 bytes, little-endian; value: the row's dim floats, then its\n"
      "optimizer slot's, e.g. adagrad's accumulator).  Each step reads the batch's\n"
      "distinct rows (HMGET; a row never written reads its initial values, as on a\n"
      "shard), computes, applies the table's optimizer to the rows on this worker (the\n"
      "model's rate and constants, as a shard would) and writes them back (HSET).  The\n"
      "writes of one step and the reads of the next go in one pipelined round trip,\n"
      "while the dense push and pull are in flight to the shards.  Nothing makes a\n"
      "row's read, update and write atomic: two workers that hold a row in the same\n"
      "step each write their own update, the later one winning.  No admission,\n"
      "eviction, replication or restart: start it on an empty Redis, shards that\n"
      "initialize themselves ([replication] self_init = yes) and no chief; a row\n"
      "optimizer with a step count (adam) is refused.\n"
      "\n"
      "  --config FILE   the cluster's config file (see systemd/cluster.conf)\n"
      "  --worker J      run as worker J of the config\n"
      "  -h, --help      this help\n"
      "\n"
      "It trains until the global step reaches [train] last_step (or SIGTERM) and prints\n"
      "lines in the words of `paramserv worker`'s:\n"
      "  worker J done: L local steps, global step G, S samples, T s, samples/s X, redis round\n"
      "    trips R\n"
      "  worker J rows: N pulled, rows/s Y\n"
      "and worker 0, with [data] test, \"final test_auc A test_logloss L ...\".\n");
}

/* The rows in Redis: the connection, each table's hash and optimizer, and
 * the scratch of a command's arguments. */
typedef struct rtab {
  redisContext *rc;
  const ps_model *model;
  ps_shard_opts so;                    /* the tables' options as a shard derives them */
  char names[PS_MODEL_MAX_TABLES][PS_KEY_MAX];
  int nslots[PS_MODEL_MAX_TABLES];
  /* Per batch buffer (two batches: cur and next), per table: the rows'
   * slots (nkeys x dim x nslots), and a row packed for HSET. */
  float *slots[2][PS_MODEL_MAX_TABLES];
  float *pack[PS_MODEL_MAX_TABLES];
  uint8_t *fields;                     /* the keys of a command, 8 bytes each */
  /* (hiredis formats a command when it is queued: the scratch is free again.) */
  const char **argv;
  size_t *argvlen;
  uint64_t round_trips;
} rtab;

static size_t row_floats(const rtab *r, int t) {
  return (size_t)r->model->tables[t].dim * (size_t)(1 + r->nslots[t]);
}

/* The fields of e's table t (its keys, little-endian) into argv from 2 on,
 * each followed by its packed row when `values`.  @return argc. */
static int table_args(rtab *r, const ps_embed *e, int t, const float *slots, int values) {
  size_t dim = (size_t)r->model->tables[t].dim, rf = row_floats(r, t);
  int k = 2;
  for (size_t i = 0; i < e->nkeys[t]; i++) {
    ps_put_le64(r->fields + 8 * i, e->keys[t][i]);
    r->argv[k] = (const char *)r->fields + 8 * i;
    r->argvlen[k++] = 8;
    if (values) {
      float *row = r->pack[t] + i * rf;
      memcpy(row, e->rows[t] + i * dim, dim * sizeof(float));
      if (r->nslots[t] > 0)
        memcpy(row + dim, slots + i * dim * (size_t)r->nslots[t],
               dim * (size_t)r->nslots[t] * sizeof(float));
      r->argv[k] = (const char *)row;
      r->argvlen[k++] = rf * sizeof(float);
    }
  }
  return k;
}

/* Queue HSET of e's rows (with their slots) for every table that has any. */
static void queue_writes(rtab *r, const ps_embed *e, float *const *slots) {
  for (int t = 0; t < r->model->ntables; t++) {
    if (e->nkeys[t] == 0)
      continue;
    int argc = table_args(r, e, t, slots[t], 1);
    r->argv[0] = "HSET";
    r->argvlen[0] = 4;
    r->argv[1] = r->names[t];
    r->argvlen[1] = strlen(r->names[t]);
    redisAppendCommandArgv(r->rc, argc, r->argv, r->argvlen);
  }
}

/* Queue HMGET of e's rows for every table that has any. */
static void queue_reads(rtab *r, const ps_embed *e) {
  for (int t = 0; t < r->model->ntables; t++) {
    if (e->nkeys[t] == 0)
      continue;
    int argc = table_args(r, e, t, NULL, 0);
    r->argv[0] = "HMGET";
    r->argvlen[0] = 5;
    r->argv[1] = r->names[t];
    r->argvlen[1] = strlen(r->names[t]);
    redisAppendCommandArgv(r->rc, argc, r->argv, r->argvlen);
  }
}

/* A reply that is an error or not what was asked for (rep), or none. */
static int redis_failed(rtab *r, const char *what, redisReply *rep, ps_errbuf *eb) {
  int rc = ps_err_set(eb, -EIO, "redis: %s: %s", what,
                      rep == NULL ? (r->rc->errstr[0] ? r->rc->errstr : "no reply")
                      : rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply type");
  freeReplyObject(rep);
  return rc;
}

/* Read the replies of queue_writes (when `wrote`) then of queue_reads:
 * the rows into e->rows and, with slots, their slots; a row Redis does not
 * hold reads its initial values.  @return 0, or -EIO with eb set. */
static int read_replies(rtab *r, const ps_embed *wrote, ps_embed *e, float *const *slots,
                        ps_errbuf *eb) {
  void *v;
  redisReply *rep;
  r->round_trips++;
  for (int t = 0; wrote != NULL && t < r->model->ntables; t++) {
    if (wrote->nkeys[t] == 0)
      continue;
    if (redisGetReply(r->rc, &v) != REDIS_OK)
      return redis_failed(r, "HSET", NULL, eb);
    if ((rep = v)->type != REDIS_REPLY_INTEGER)
      return redis_failed(r, "HSET", rep, eb);
    freeReplyObject(rep);
  }
  for (int t = 0; t < r->model->ntables; t++) {
    if (e->nkeys[t] == 0)
      continue;
    if (redisGetReply(r->rc, &v) != REDIS_OK)
      return redis_failed(r, "HMGET", NULL, eb);
    rep = v;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != e->nkeys[t])
      return redis_failed(r, "HMGET (not an array of the rows asked for)", rep, eb);
    const ps_table_opts *to = &r->so.tables[t];
    size_t dim = to->dim, rf = row_floats(r, t), ns = (size_t)r->nslots[t];
    for (size_t i = 0; i < e->nkeys[t]; i++) {
      const redisReply *x = rep->element[i];
      float *row = e->rows[t] + i * dim;
      float *sl = slots != NULL && ns > 0 ? slots[t] + i * dim * ns : NULL;
      if (x->type == REDIS_REPLY_NIL) {
        ps_table_init_row(to, e->keys[t][i], row);
        for (size_t k = 0; sl != NULL && k < dim * ns; k++)
          sl[k] = ps_optim_slot_init(&to->optim, (int)(k / dim));
      } else if (x->type == REDIS_REPLY_STRING && x->len == rf * sizeof(float)) {
        memcpy(row, x->str, dim * sizeof(float));
        if (sl != NULL)
          memcpy(sl, x->str + dim * sizeof(float), dim * ns * sizeof(float));
      } else {
        int rc = ps_err_set(eb, PS_EFORMAT, "redis: HMGET %s: a row of %zu bytes, expected %zu",
                            r->names[t], x->type == REDIS_REPLY_STRING ? x->len : 0,
                            rf * sizeof(float));
        freeReplyObject(rep);
        return rc;
      }
    }
    freeReplyObject(rep);
  }
  return 0;
}

/* The rows' optimizer on the worker: each of e's rows updated by its
 * gradient, as a shard's table would (ps_table_push: the table's rate). */
static void apply_rows(rtab *r, ps_embed *e, float *const *slots) {
  for (int t = 0; t < r->model->ntables; t++) {
    const ps_table_opts *to = &r->so.tables[t];
    size_t dim = to->dim, ns = (size_t)r->nslots[t];
    for (size_t i = 0; i < e->nkeys[t]; i++) {
      float *sl[PS_OPTIM_MAX_SLOTS] = {0};
      for (size_t k = 0; k < ns; k++)
        sl[k] = slots[t] + (i * ns + k) * dim;
      ps_optim_apply(&to->optim, r->so.table_lr[t], 1, e->rows[t] + i * dim,
                     e->grads[t] + i * dim, sl, dim);
    }
  }
}

static int rtab_open(rtab *r, const ps_config *cfg, const ps_model *m, int max_batch,
                     ps_errbuf *eb) {
  memset(r, 0, sizeof *r);
  r->model = m;
  if (m->ntables == 0)
    return ps_err_set(eb, PS_ECONFIG, "%s: the model has no sparse tables: nothing to keep in "
                      "Redis (expected an embedding_bag layer, as in models/ctr.json)", cfg->path);
  ps_shard_opts_tables(&r->so, cfg, m);
  for (int t = 0; t < m->ntables; t++) {
    const ps_table_opts *to = &r->so.tables[t];
    if (to->optim.kind == PS_OPTIM_ADAM)
      return ps_err_set(eb, PS_ECONFIG, "sparse table %s: optimizer adam counts each row's "
                        "updates, which this baseline does not keep: expected sgd, momentum or "
                        "adagrad", m->tables[t].name);
    if (to->admit_after > 1 || to->idle_steps > 0 || to->max_rows > 0)
      return ps_err_set(eb, PS_ECONFIG, "sparse table %s: admit_after, idle_steps and max_rows "
                        "are a shard's; this baseline keeps every row", m->tables[t].name);
    r->nslots[t] = ps_optim_nslots(to->optim.kind);
    ps_key_bench_table(r->names[t], cfg->cluster_id, t);
    size_t b = (size_t)max_batch, dim = to->dim;
    for (int k = 0; k < 2; k++)
      if ((r->slots[k][t] = malloc(b * dim * (size_t)(r->nslots[t] ? r->nslots[t] : 1) *
                                   sizeof(float))) == NULL)
        return ps_err_set(eb, -ENOMEM, "out of memory");
    if ((r->pack[t] = malloc(b * row_floats(r, t) * sizeof(float))) == NULL)
      return ps_err_set(eb, -ENOMEM, "out of memory");
  }
  size_t args = 2 + 2 * (size_t)max_batch;
  r->fields = malloc(8 * (size_t)max_batch);
  r->argv = malloc(args * sizeof *r->argv);
  r->argvlen = malloc(args * sizeof *r->argvlen);
  if (r->fields == NULL || r->argv == NULL || r->argvlen == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  char tag[PS_KEY_MAX];
  ps_cluster_tag(tag, cfg->cluster_id);
  r->rc = ps_redis_connect(cfg, tag, cfg->redis_timeout_ms, eb);
  return r->rc == NULL ? eb->code : 0;
}

static void rtab_close(rtab *r) {
  if (r->rc != NULL)
    redisFree(r->rc);
  for (int t = 0; t < PS_MODEL_MAX_TABLES; t++) {
    free(r->slots[0][t]);
    free(r->slots[1][t]);
    free(r->pack[t]);
  }
  free(r->fields);
  free(r->argv);
  free(r->argvlen);
}

/* The final test's rows from Redis (values only), the weights from the shards. */
typedef struct test_arg {
  rtab *r;
  ps_client *client;
} test_arg;

static int test_rows(void *arg, ps_embed *e, float *params, ps_errbuf *eb) {
  test_arg *a = arg;
  int rc = ps_client_pull(a->client, params);
  if (rc != 0)
    return ps_err_set(eb, rc, "%s", ps_client_error(a->client));
  queue_reads(a->r, e);
  return read_replies(a->r, NULL, e, NULL, eb);
}

int ps_cmd_bench_redis_table(int argc, char **argv) {
  enum { O_CONFIG = 256, O_WORKER };
  static const struct option longopts[] = {
      {"config", required_argument, 0, O_CONFIG},
      {"worker", required_argument, 0, O_WORKER},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  const char *config = NULL;
  int64_t worker = -1;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case O_CONFIG: config = optarg; break;
    case O_WORKER:
      if (ps_cmd_flag_i64("worker", optarg, 0, 1 << 20, &worker) != 0)
        return 2;
      break;
    case 'h': usage(stdout); return 0;
    default: return ps_cmd_bad_option(c, argv, "bench-redis-table");
    }
  }
  if (ps_cmd_no_operands(argc, argv, "bench-redis-table") != 0)
    return 2;
  if (config == NULL || worker < 0) {
    ps_cmd_error("paramserv bench-redis-table needs --config FILE and --worker J");
    return 2;
  }
  ps_config cfg;
  if (ps_cmd_load_config(config, &cfg, 1) != 0)
    return 2;
  if (worker >= cfg.nworkers) {
    ps_cmd_error("--worker %" PRId64 ": %s lists workers 0..%d", worker, config, cfg.nworkers - 1);
    return 2;
  }
  int index = (int)worker;
  volatile sig_atomic_t *stop = ps_trainer_start_process(&cfg, index);
  int status = 1;
  ps_errbuf eb = {0};
  ps_trainer t = {0};
  ps_embed emb[2] = {0};
  rtab r = {0};
  ps_client *client = ps_client_new(config, index, &eb);
  if (client == NULL) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    return eb.code == PS_EUSAGE ? 2 : 1;
  }
  const ps_model *model = ps_client_model(client);
  if ((status = ps_trainer_open(&t, &cfg, model, index)) != 0)
    goto out;
  status = 1;
  if (cfg.bag_separator >= 0) {
    ps_log(PS_LOG_ERROR, "%s: [data] bag_separator is set: this baseline reads one key a field",
           config);
    status = 2;
    goto out;
  }
  if (rtab_open(&r, &cfg, model, t.batch, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    status = eb.code == PS_ECONFIG ? 2 : 1;
    goto out;
  }
  for (int k = 0; k < 2; k++)
    if (ps_embed_init(&emb[k], model, t.batch, PS_CRITEO_NSPARSE) != 0) {
      ps_log(PS_LOG_ERROR, "out of memory for the sparse rows of a batch");
      goto out;
    }
  ps_client_set_stop_flag(client, stop);
  uint64_t last = ps_client_last_step(client);
  ps_log(PS_LOG_INFO, "bench-redis-table worker %d of %d: batch %d, %d threads, step limit %" PRIu64
         ", %d tables in redis %s:%u", index, cfg.nworkers, t.batch,
         ps_compute_threads(t.compute), last, model->ntables, cfg.redis.host, cfg.redis.port);

  uint64_t local = 0, samples = 0, rows_pulled = 0;
  double t0 = ps_now_s();
  int cur = 0, rc;
  size_t n = ps_trainer_batch(&t);
  ps_trainer_embed(&t, &emb[cur], n);
  rows_pulled += ps_embed_nrows(&emb[cur]);
  queue_reads(&r, &emb[cur]);
  if ((rc = read_replies(&r, NULL, &emb[cur], r.slots[cur], &eb)) != 0)
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
  else if ((rc = ps_client_pull(client, t.params)) != 0)
    ps_log(PS_LOG_ERROR, "%s", ps_client_error(client));
  while (rc == 0 && !*stop && (last == 0 || ps_client_global_step(client) < last)) {
    uint64_t first = ((uint64_t)index << 48) + samples;
    ps_embed_pool(&emb[cur], t.emb);
    ps_compute_grad_emb(t.compute, t.params, t.x, t.emb, t.y, (int)n, (uint64_t)cfg.seed, first,
                        t.grad, t.demb, NULL);
    ps_embed_scatter(&emb[cur], t.demb);
    apply_rows(&r, &emb[cur], r.slots[cur]);
    local++;
    samples += n;
    /* The next batch while the dense push and pull are in flight; its rows
     * come in the round trip that writes this one's. */
    n = ps_trainer_batch(&t);
    ps_trainer_embed(&t, &emb[1 - cur], n);
    rows_pulled += ps_embed_nrows(&emb[1 - cur]);
    if ((rc = ps_client_push_pull_start(client, t.grad, t.params)) != 0) {
      ps_log(PS_LOG_ERROR, "%s", ps_client_error(client));
      break;
    }
    queue_writes(&r, &emb[cur], r.slots[cur]);
    queue_reads(&r, &emb[1 - cur]);
    if ((rc = read_replies(&r, &emb[cur], &emb[1 - cur], r.slots[1 - cur], &eb)) != 0) {
      ps_log(PS_LOG_ERROR, "%s", eb.msg);
      break;
    }
    if ((rc = ps_client_pull_finish(client)) != 0) {
      ps_log(PS_LOG_ERROR, "%s", ps_client_error(client));
      break;
    }
    cur = 1 - cur;
  }
  if (rc == 0)
    rc = ps_client_flush(client);
  if (rc == PS_ESTOPPED || (rc == -EINTR && *stop))
    ps_log(PS_LOG_INFO, "%s", ps_client_error(client));
  else if (rc != 0)
    goto out;
  double secs = ps_now_s() - t0;
  printf("worker %d done: %" PRIu64 " local steps, global step %" PRIu64 ", %" PRIu64
         " samples, %.1f s, samples/s %.1f, redis round trips %" PRIu64 "\n",
         index, local, ps_client_global_step(client), samples, secs,
         secs > 0 ? (double)samples / secs : 0.0, r.round_trips);
  printf("worker %d rows: %" PRIu64 " pulled, rows/s %.1f\n", index, rows_pulled,
         secs > 0 ? (double)rows_pulled / secs : 0.0);
  if (index == 0 && !*stop && cfg.test_data[0] != '\0') {
    test_arg ta = {&r, client};
    char path[PS_CONFIG_PATH_MAX];
    ps_eval_ctr_result res;
    ps_eval_ctr *ev = ps_eval_ctr_new(t.model, ps_config_file_path(&cfg, cfg.test_data, path,
                                                                     sizeof path),
                                      (int)cfg.batch, -1, 0, t.compute, &eb);
    rc = ev != NULL ? ps_eval_ctr_run(ev, t.params, test_rows, &ta, &res, &eb) : -1;
    ps_eval_ctr_free(ev);
    if (rc != 0) {
      ps_log(PS_LOG_ERROR, "[data] test: %s", eb.msg);
      goto out;
    }
    printf("final test_auc %.4f test_logloss %.4f samples %zu global_step %" PRIu64 "\n", res.auc,
           res.logloss, res.samples, ps_client_global_step(client));
  }
  fflush(stdout);
  status = 0;
out:
  ps_embed_free(&emb[0]);
  ps_embed_free(&emb[1]);
  rtab_close(&r);
  ps_trainer_close(&t);
  ps_client_free(client);
  return status;
}
