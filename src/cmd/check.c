/* paramserv check: the pre-flight of a config, one line per check
 * (preflight.c runs them). */
#include <getopt.h>
#include <stdio.h>

#include "cmd/cli.h"
#include "cmd/cmd.h"
#include "cmd/preflight.h"
#include "common/config.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: paramserv check --config FILE\n"
          "\n"
          "Checks what a cluster's processes will need, one line per check (ok, warn or\n"
          "error): the config, the secret (mode 600, owned by this user), the model, the\n"
          "data set, the checkpoint directory, each shard's address on this machine, and\n"
          "Redis (reachable, and whether it keeps its data over a restart).  Run it on\n"
          "each machine, as the user the units run as.\n"
          "\n"
          "Exit status: 0 nothing wrong (warnings aside), 2 a config, secret, model, data\n"
          "or directory error, 1 Redis unreachable or refusing.\n");
}

int ps_cmd_check(int argc, char **argv) {
  static const struct option longopts[] = {
      {"config", required_argument, 0, 'c'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  const char *config = NULL;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'c': config = optarg; break;
    case 'h': usage(stdout); return 0;
    default:
      return ps_cmd_bad_option(c, argv, "check");
    }
  }
  if (ps_cmd_no_operands(argc, argv, "check") != 0)
    return 2;
  if (config == NULL) {
    ps_cmd_error("paramserv check needs --config FILE");
    return 2;
  }
  static ps_config cfg;
  if (ps_preflight_config(config, &cfg) != 0)
    return 2;
  int errors = ps_preflight_files(&cfg, 0);
  ps_preflight_ports(&cfg);
  int redis_bad = ps_preflight_redis(&cfg);
  return errors > 0 ? 2 : redis_bad ? 1 : 0;
}
