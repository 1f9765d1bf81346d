/* The paramserv binary: dispatches to its verbs (cmd.h), and nothing else;
 * what the verbs share is cli.c's. */
#include <stdio.h>
#include <string.h>

#include "cmd/cli.h"
#include "paramserv/version.h"
#include "cmd/cmd.h"


typedef struct verb {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} verb;

static const verb verbs[] = {
    {"local", ps_cmd_local, "run a whole cluster on this machine, Redis included, supervised"},
    {"chief", ps_cmd_chief, "run the chief of a cluster: init, checkpoints, hooks, restore"},
    {"ps", ps_cmd_ps, "run one parameter-server shard of a cluster"},
    {"worker", ps_cmd_worker, "run one worker of a cluster"},
    {"train", ps_cmd_train, "train a model in one process, no parameter server (the reference)"},
    {"eval", ps_cmd_eval, "evaluate a checkpoint on the test set (loss and accuracy)"},
    {"ckpt", ps_cmd_ckpt, "list, show, verify and export checkpoints"},
    {"status", ps_cmd_status, "show every node of a cluster, its lease and its checkpoints"},
    {"check", ps_cmd_check, "check a config before a run: files, model, data, ports, Redis"},
    {"bench-ps", ps_cmd_bench_ps, "time pulls and pushes against a running cluster's shards"},
    {"bench-redis-table", ps_cmd_bench_redis_table,
     "a benchmark's baseline: a worker whose sparse tables live in Redis"},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: paramserv VERB [OPTIONS]\n"
          "\n"
          "paramserv is a fault-tolerant parameter-server training service.\n"
          "\n"
          "verbs:\n");
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
    fprintf(f, "  %-8s %s\n", verbs[i].name, verbs[i].summary);
  fprintf(f,
          "\n"
          "`paramserv VERB --help` describes a verb's options.\n"
          "  -h, --help     this help\n"
          "  -V, --version  print the version\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *v = argv[1];
  if (strcmp(v, "-h") == 0 || strcmp(v, "--help") == 0 || strcmp(v, "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(v, "-V") == 0 || strcmp(v, "--version") == 0) {
    printf("paramserv %s\n", ps_version(NULL, NULL, NULL));
    return 0;
  }
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
    if (strcmp(v, verbs[i].name) == 0)
      return verbs[i].run(argc - 1, argv + 1);
  ps_cmd_error("unknown verb '%s': expected one of the verbs listed by `paramserv --help`", v);
  return 2;
}
