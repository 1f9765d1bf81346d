/* `paramserv ps` and `paramserv worker`: the cluster's long-running
 * processes, each started with the cluster's config file and its index. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cmd/cli.h"
#include "cmd/cmd.h"
#include "common/config.h"
#include "common/parse.h"
#include "ps/server.h"
#include "worker/worker.h"

typedef struct node_verb {
  const char *name, *role, *what;
  int (*run)(const ps_config *cfg, int index);
} node_verb;

static int is_worker(const node_verb *v) { return strcmp(v->name, "worker") == 0; }

static void node_usage(FILE *f, const node_verb *v) {
  fprintf(f,
          "usage: paramserv %s --config FILE --index N%s\n"
          "\n"
          "%s\n"
          "\n"
          "  --config FILE   the cluster's config file (see systemd/cluster.conf)\n"
          "  --index N       which %s of the config's [cluster] %s list this process is\n",
          v->name, is_worker(v) ? " [--device D]" : "", v->what, v->role,
          is_worker(v) ? "workers" : "ps");
  if (is_worker(v))
    fprintf(f, "  --device D      compute on D instead of [worker] device: %s\n"
               "                  (one GPU host among CPU hosts, with the same config)\n",
            PS_DEVICE_FORM);
  fprintf(f, "  -h, --help      this help\n"
             "\n"
             "Stops cleanly on SIGTERM or SIGINT.\n");
}

static int run_node(const node_verb *v, int argc, char **argv) {
  static const struct option longopts[] = {
      {"config", required_argument, 0, 'c'},
      {"index", required_argument, 0, 'i'},
      {"device", required_argument, 0, 'd'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  const char *config = NULL, *index_text = NULL, *device = NULL;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'c': config = optarg; break;
    case 'i': index_text = optarg; break;
    case 'd':
      if (!is_worker(v)) {
        ps_cmd_error("--device: a shard does not compute gradients, only a worker has a device");
        return 2;
      }
      device = optarg;
      break;
    case 'h': node_usage(stdout, v); return 0;
    default:
      return ps_cmd_bad_option(c, argv, v->name);
    }
  }
  if (ps_cmd_no_operands(argc, argv, v->name) != 0)
    return 2;
  if (config == NULL || index_text == NULL) {
    ps_cmd_error("paramserv %s needs --config FILE and --index N", v->name);
    return 2;
  }
  static ps_config cfg;
  int rc = ps_cmd_load_config(config, &cfg, 1);
  if (rc != 0)
    return rc;
  int dev;
  if (device != NULL) {
    if (ps_parse_device(device, &dev) != 0) {
      ps_cmd_error("--device '%s': expected %s", device, PS_DEVICE_FORM);
      return 2;
    }
    cfg.device = dev;
  }
  int count = strcmp(v->name, "ps") == 0 ? cfg.nps : cfg.nworkers;
  int64_t index;
  if (ps_parse_i64(index_text, 0, count - 1, &index) != 0) {
    ps_cmd_error("--index '%s': %s lists %d %s, expected 0..%d", index_text, config, count,
                 strcmp(v->name, "ps") == 0 ? "shards" : "workers", count - 1);
    return 2;
  }
  /* A write to a peer that has gone (a killed chief's connection) fails
   * with EPIPE, which the connection handles; the signal would kill the
   * process instead.  libuv and hiredis leave SIGPIPE to the application;
   * systemd ignores it for its units, `paramserv local` and a shell do not. */
  signal(SIGPIPE, SIG_IGN);
  return v->run(&cfg, (int)index);
}

int ps_cmd_ps(int argc, char **argv) {
  static const node_verb v = {"ps", "shard",
                              "Run one parameter-server shard: hold its slice of the model, apply "
                              "the workers' pushed\ngradients and serve their pulls.",
                              ps_server_run};
  return run_node(&v, argc, argv);
}

int ps_cmd_worker(int argc, char **argv) {
  static const node_verb v = {"worker", "worker",
                              "Run one worker: pull weights from every shard, compute gradients "
                              "on this worker's part of\nthe data, push them, until the cluster's "
                              "step limit.",
                              ps_worker_run};
  return run_node(&v, argc, argv);
}
