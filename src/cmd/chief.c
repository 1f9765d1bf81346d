/* `paramserv chief --config FILE`: the cluster's chief (chief/chief.h). */
#include <getopt.h>
#include <stdio.h>

#include "chief/chief.h"
#include "cmd/cli.h"
#include "cmd/cmd.h"
#include "common/config.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: paramserv chief --config FILE\n"
          "\n"
          "Run the chief of the cluster in FILE: take the lease in Redis (one chief acts at a\n"
          "time; a second waits), give every shard its state (its Redis replica, else the\n"
          "newest valid checkpoint in [checkpoint] dir, else the seeded initialization),\n"
          "then checkpoint, log, evaluate and guard against NaN/Inf as [checkpoint] and\n"
          "[chief] say, and end the run at [train] last_step.\n"
          "\n"
          "  --config FILE   the cluster's config file (see systemd/cluster.conf)\n"
          "  -h, --help      this help\n"
          "\n"
          "Exit status: 0 the run reached last_step (a final checkpoint was written and every\n"
          "shard told to stop) or SIGTERM; 1 an error (a restart may help); 2 bad usage;\n"
          "3 the weights went NaN or Inf (restarting will not help; the last good\n"
          "checkpoint is kept).\n");
}

int ps_cmd_chief(int argc, char **argv) {
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
      return ps_cmd_bad_option(c, argv, "chief");
    }
  }
  if (ps_cmd_no_operands(argc, argv, "chief") != 0)
    return 2;
  if (config == NULL) {
    ps_cmd_error("paramserv chief needs --config FILE");
    return 2;
  }
  static ps_config cfg;
  int rc = ps_cmd_load_config(config, &cfg, 1);
  if (rc != 0)
    return rc;
  return ps_chief_run(&cfg);
}
