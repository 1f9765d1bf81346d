/* What the verbs of the paramserv binary share on the command line: the
 * one-line error, an option or operand refused, an option's number, the
 * --config file loaded, a CKPT operand opened.  Each says what went wrong
 * in one "paramserv: error:" line on stderr, so that every verb words its
 * errors alike.  The verbs (cmd.h) call it; it calls no verb. */
#ifndef PS_CMD_CLI_H
#define PS_CMD_CLI_H

#include <stddef.h>
#include <stdint.h>

struct ps_config;
struct ps_ckpt;

/* Print "paramserv: error: <msg>" on one line to stderr. */
void ps_cmd_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* getopt_long returned ':' (a missing value) or '?' (an unknown option):
 * print the one-line error for `verb` ("chief", "ckpt show") and return 2. */
int ps_cmd_bad_option(int c, char **argv, const char *verb);

/* argv[optind] is an operand the verb does not take: print the one-line
 * error and return 2; 0 when there is none. */
int ps_cmd_no_operands(int argc, char **argv, const char *verb);

/* Parse the value of option --name as an integer in [lo, hi] (or a number,
 * for _double); on failure print "--name 'v': expected ..." and return -1. */
int ps_cmd_flag_i64(const char *name, const char *v, int64_t lo, int64_t hi, int64_t *out);
int ps_cmd_flag_double(const char *name, const char *v, double lo, double hi, double *out);

/* Load the config at `path` into *cfg and, with `secrets`, read the
 * cluster secret; the Redis password file is read whenever one is set.
 * On an error print its one line and return 2; else 0. */
int ps_cmd_load_config(const char *path, struct ps_config *cfg, int secrets);

/* Whether `path` is one checkpoint (it holds a MANIFEST.json), rather than
 * a directory of them. */
int ps_cmd_has_manifest(const char *path);

/* Open CKPT for ckpt show/export, eval and train --init-from: a checkpoint
 * directory (DIR/ckpt-<step>), or the newest valid checkpoint of a
 * directory of them.  @return 0, or 1 after printing one line: no such
 * path, not a directory, a manifest that cannot be read, no valid
 * checkpoint in it. */
int ps_cmd_open_ckpt(const char *path, struct ps_ckpt *c);

/* b bytes as "512 B", "1.5 KiB", ... "2.0 TiB" into buf.  @return buf. */
const char *ps_cmd_human_bytes(uint64_t b, char *buf, size_t len);

#endif
