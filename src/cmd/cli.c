/* What the verbs share on the command line (cli.h). */
#include "cmd/cli.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/config.h"
#include "common/parse.h"
#include "recovery/checkpoint.h"

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

int ps_cmd_has_manifest(const char *path) {
  char m[4096];
  struct stat st;
  snprintf(m, sizeof m, "%s/MANIFEST.json", path);
  return lstat(m, &st) == 0;
}

int ps_cmd_open_ckpt(const char *path, ps_ckpt *c) {
  ps_errbuf eb = {0};
  struct stat st;
  if (stat(path, &st) != 0) {
    ps_cmd_error("%s: %s: expected a checkpoint directory", path, strerror(errno));
    return 1;
  }
  if (!S_ISDIR(st.st_mode)) {
    ps_cmd_error("%s: not a directory: expected a checkpoint directory (DIR/ckpt-<step>) or a "
                 "directory of them", path);
    return 1;
  }
  if (ps_cmd_has_manifest(path)) {
    if (ps_ckpt_open(c, path, &eb) == 0)
      return 0;
    ps_cmd_error("%s", eb.msg);
    return 1;
  }
  int rc = ps_ckpt_find_latest(path, 0, NULL, c, &eb);
  if (rc == 1)
    return 0;
  if (rc < 0)
    ps_cmd_error("%s", eb.msg);
  else
    ps_cmd_error("%s: not a checkpoint (no MANIFEST.json) and no ckpt-<step> directory in it "
                 "that verifies", path);
  return 1;
}

const char *ps_cmd_human_bytes(uint64_t b, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  snprintf(buf, len, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}
