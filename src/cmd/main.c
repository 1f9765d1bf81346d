/* The paramserv binary: dispatches to its verbs. */
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/config.h"
#include "common/parse.h"

#define PS_VERSION "0.1.0"

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

void ps_cmd_error(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* One line, whatever the message held. */
  for (char *p = msg; *p; p++)
    if (*p == '\n')
      *p = ' ';
  fprintf(stderr, "paramserv: error: %s\n", msg);
}

int ps_cmd_load_config(const char *path, ps_config *cfg, int secrets) {
  ps_errbuf eb = {0};
  if (ps_config_load(path, cfg, &eb) != 0) {
    ps_cmd_error("%s", eb.msg);
    return 2;
  }
  /* The files the process reads later, read once now: a secret that is
   * missing or readable by others would otherwise fail after the start,
   * with a status a restart retries.  The sizes are the readers'. */
  uint8_t secret[4096];
  char pw[512];
  int rc = 0;
  if (secrets && ps_config_read_secret(cfg, secret, sizeof secret, &eb) < 0)
    rc = 2;
  else if (ps_config_read_redis_password(cfg, pw, sizeof pw, &eb) < 0)
    rc = 2;
  explicit_bzero(secret, sizeof secret);
  explicit_bzero(pw, sizeof pw);
  if (rc != 0)
    ps_cmd_error("%s", eb.msg);
  return rc;
}

int ps_cmd_bad_option(int c, char **argv, const char *name) {
  if (c == ':')
    ps_cmd_error("%s: expected a value", argv[optind - 1]);
  else
    ps_cmd_error("unknown option '%s' (see paramserv %s --help)", argv[optind - 1], name);
  return 2;
}

int ps_cmd_no_operands(int argc, char **argv, const char *name) {
  if (optind >= argc)
    return 0;
  ps_cmd_error("unexpected argument '%s' (see paramserv %s --help)", argv[optind], name);
  return 2;
}

int ps_cmd_flag_i64(const char *name, const char *v, int64_t lo, int64_t hi, int64_t *out) {
  if (ps_parse_i64(v, lo, hi, out) == 0)
    return 0;
  ps_cmd_error("--%s '%s': expected an integer in [%" PRId64 ", %" PRId64 "]", name, v, lo, hi);
  return -1;
}

int ps_cmd_flag_double(const char *name, const char *v, double lo, double hi, double *out) {
  if (ps_parse_double(v, lo, hi, out) == 0)
    return 0;
  ps_cmd_error("--%s '%s': expected a number in [%g, %g]", name, v, lo, hi);
  return -1;
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
    printf("paramserv %s\n", PS_VERSION);
    return 0;
  }
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
    if (strcmp(v, verbs[i].name) == 0)
      return verbs[i].run(argc - 1, argv + 1);
  ps_cmd_error("unknown verb '%s': expected one of the verbs listed by `paramserv --help`", v);
  return 2;
}
