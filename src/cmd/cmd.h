/* The verbs of the paramserv binary. */
#ifndef PS_CMD_CMD_H
#define PS_CMD_CMD_H

#include <stdint.h>

struct ps_config;
struct ps_ckpt;

/* Each verb takes argv with argv[0] = the verb's name and returns the
 * process's exit status: 0 success, 1 failure, 2 what a restart would not
 * change: bad usage, a config, model, secret or path error, a device asked
 * for that this machine or build does not have (--device cuda with no GPU,
 * or without CUDA), checkpoints the chief refuses to start over. */
int ps_cmd_train(int argc, char **argv);
int ps_cmd_ps(int argc, char **argv);
int ps_cmd_worker(int argc, char **argv);
int ps_cmd_bench_ps(int argc, char **argv);
int ps_cmd_ckpt(int argc, char **argv);
int ps_cmd_eval(int argc, char **argv);
int ps_cmd_chief(int argc, char **argv);
int ps_cmd_local(int argc, char **argv);
int ps_cmd_status(int argc, char **argv);
int ps_cmd_check(int argc, char **argv);

/* paramserv check's checks of the files a config names (the secret, the
 * model, the data set, the checkpoint directory), one line each on stdout;
 * errors_only (paramserv local, which reads the data set itself): only the
 * errors, as ps_cmd_error lines, and not the data set.  @return the number
 * of errors. */
int ps_cmd_check_files(const struct ps_config *cfg, int errors_only);

/* Parse the value of option --name as an integer in [lo, hi] (or a number,
 * for _double); on failure print "--name 'v': expected ..." and return -1. */
int ps_cmd_flag_i64(const char *name, const char *v, int64_t lo, int64_t hi, int64_t *out);
int ps_cmd_flag_double(const char *name, const char *v, double lo, double hi, double *out);

/* Load the config at `path` into *cfg and, with `secrets`, read the
 * cluster secret; the Redis password file is read whenever one is set.
 * On an error print its one line and return 2; else 0. */
int ps_cmd_load_config(const char *path, struct ps_config *cfg, int secrets);

/* getopt_long returned ':' (a missing value) or '?' (an unknown option):
 * print the one-line error for `verb` ("chief", "ckpt show") and return 2. */
int ps_cmd_bad_option(int c, char **argv, const char *verb);

/* argv[optind] is an operand the verb does not take: print the one-line
 * error and return 2; 0 when there is none. */
int ps_cmd_no_operands(int argc, char **argv, const char *verb);

/* Open CKPT for ckpt show/export and eval: a checkpoint directory
 * (DIR/ckpt-<step>), or the newest valid checkpoint of a directory of them.
 * @return 0, or 1 after printing one line: no such path, not a directory,
 * a manifest that cannot be read, no valid checkpoint in it. */
int ps_cmd_open_ckpt(const char *path, struct ps_ckpt *c);

/* Print "paramserv: error: <msg>" on one line to stderr. */
void ps_cmd_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
