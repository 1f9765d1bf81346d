/* `paramserv bench-ps`: measure how fast one worker pulls and pushes the
 * whole model through the cluster's shards, in GB/s of floats moved. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cli.h"
#include "cmd/cmd.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/timeutil.h"
#include "paramserv/client.h"

typedef struct bench_opts {
  const char *config;
  int64_t worker, rounds, warmup;
} bench_opts;

static void bench_usage(FILE *f) {
  fprintf(f,
      "usage: paramserv bench-ps --config FILE [OPTIONS]\n"
      "\n"
      "Connect to every shard of a running cluster as one worker and time pulls of\n"
      "the whole model, then pushes of a zero gradient (each push is applied by the\n"
      "shards' optimizer: use [train] optimizer = sgd with a tiny lr).\n"
      "\n"
      "  --config FILE   the cluster's config file (see systemd/cluster.conf)\n"
      "  --worker J      connect as worker J of the config (default 0)\n"
      "  --rounds N      timed pulls, then timed pushes (default 20)\n"
      "  --warmup W      untimed pulls and pushes before each loop (default 3)\n"
      "  -h, --help      this help\n"
      "\n"
      "One machine-readable line, figures the median over the rounds; GB/s is\n"
      "1e9 bytes/s of the model's floats (B bytes) moved by one operation:\n"
      "  bench-ps bytes B pull_gbps X push_gbps Y pull_ms P push_ms Q\n");
}

/* @return 0, 1 for --help (printed), or -1 after printing an error. */
static int parse_opts(int argc, char **argv, bench_opts *o) {
  enum { O_CONFIG = 256, O_WORKER, O_ROUNDS, O_WARMUP };
  static const struct option longopts[] = {
      {"config", required_argument, 0, O_CONFIG},
      {"worker", required_argument, 0, O_WORKER},
      {"rounds", required_argument, 0, O_ROUNDS},
      {"warmup", required_argument, 0, O_WARMUP},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  *o = (bench_opts){.rounds = 20, .warmup = 3};
  opterr = 0;
  optind = 1;
  int c, rc = 0;
  while (rc == 0 && (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case O_CONFIG: o->config = optarg; break;
    case O_WORKER: rc = ps_cmd_flag_i64("worker", optarg, 0, 1 << 20, &o->worker); break;
    case O_ROUNDS: rc = ps_cmd_flag_i64("rounds", optarg, 1, 1000000, &o->rounds); break;
    case O_WARMUP: rc = ps_cmd_flag_i64("warmup", optarg, 0, 1000000, &o->warmup); break;
    case 'h': bench_usage(stdout); return 1;
    default:
      ps_cmd_bad_option(c, argv, "bench-ps");
      return -1;
    }
  }
  if (rc != 0)
    return -1;
  if (ps_cmd_no_operands(argc, argv, "bench-ps") != 0)
    return -1;
  if (o->config == NULL) {
    ps_cmd_error("paramserv bench-ps needs --config FILE");
    return -1;
  }
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of t[n]; sorts t. */
static double median(double *t, int64_t n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Run `warmup` untimed then `rounds` timed pulls (push = 0) or pushes, the
 * seconds of each timed one into t[].  @return 0 or the client's error. */
static int time_ops(ps_client *c, int push, float *params, const float *grad,
                    const bench_opts *o, double *t) {
  for (int64_t i = 0; i < o->warmup + o->rounds; i++) {
    uint64_t t0 = ps_now_ns();
    int rc = push ? ps_client_push(c, grad) : ps_client_pull(c, params);
    if (rc != 0)
      return rc;
    if (i >= o->warmup)
      t[i - o->warmup] = (double)(ps_now_ns() - t0) * 1e-9;
  }
  return 0;
}

int ps_cmd_bench_ps(int argc, char **argv) {
  bench_opts o;
  int prc = parse_opts(argc, argv, &o);
  if (prc != 0)
    return prc > 0 ? 0 : 2;
  /* Reconnects and refusals still show; per-connection chatter does not. */
  ps_log_init("bench-ps", PS_LOG_WARN);
  ps_errbuf eb = {0};
  ps_client *c = ps_client_new(o.config, (int)o.worker, &eb);
  if (c == NULL) {
    ps_cmd_error("%s", eb.msg);
    return eb.code == PS_EUSAGE ? 2 : 1;
  }
  int status = 1;
  size_t total = ps_client_vars(c)->total;
  double bytes = (double)total * sizeof(float);
  float *params = malloc(total * sizeof *params);
  float *grad = calloc(total, sizeof *grad);
  double *tpull = malloc((size_t)o.rounds * sizeof *tpull);
  double *tpush = malloc((size_t)o.rounds * sizeof *tpush);
  if (params == NULL || grad == NULL || tpull == NULL || tpush == NULL) {
    ps_cmd_error("out of memory for a model of %zu floats", total);
    goto out;
  }
  /* The first pull connects to every shard; it is not timed. */
  const char *what = "connect";
  int rc = ps_client_pull(c, params);
  if (rc == 0) {
    what = "pull";
    rc = time_ops(c, 0, params, grad, &o, tpull);
  }
  if (rc == 0) {
    what = "push";
    rc = time_ops(c, 1, params, grad, &o, tpush);
  }
  if (rc != 0) {
    ps_cmd_error("%s as worker %" PRId64 " of %s: %s", what, o.worker, o.config,
                 ps_client_error(c));
    goto out;
  }
  double pull_s = median(tpull, o.rounds), push_s = median(tpush, o.rounds);
  printf("bench-ps bytes %.0f pull_gbps %.4f push_gbps %.4f pull_ms %.4f push_ms %.4f\n", bytes,
         bytes / pull_s * 1e-9, bytes / push_s * 1e-9, pull_s * 1e3, push_s * 1e3);
  fflush(stdout);
  status = 0;
out:
  free(tpush);
  free(tpull);
  free(grad);
  free(params);
  ps_client_free(c);
  return status;
}
