/* The verbs of the paramserv binary, one file each, which main.c
 * dispatches to.  A verb calls no other verb: what several share is a
 * module of its own (cli.h: the command line; preflight.h: the checks of a
 * config's files). */
#ifndef PS_CMD_CMD_H
#define PS_CMD_CMD_H

/* Each verb takes argv with argv[0] = the verb's name and returns the
 * process's exit status: 0 success, 1 failure, 2 what a restart would not
 * change: bad usage, a config, model, secret or path error, a device asked
 * for that this machine or build does not have (--device cuda with no GPU,
 * or without CUDA), checkpoints the chief refuses to start over. */
int ps_cmd_train(int argc, char **argv);
int ps_cmd_ps(int argc, char **argv);
int ps_cmd_worker(int argc, char **argv);
int ps_cmd_bench_ps(int argc, char **argv);
int ps_cmd_bench_redis_table(int argc, char **argv);
int ps_cmd_ckpt(int argc, char **argv);
int ps_cmd_eval(int argc, char **argv);
int ps_cmd_chief(int argc, char **argv);
int ps_cmd_local(int argc, char **argv);
int ps_cmd_status(int argc, char **argv);
int ps_cmd_check(int argc, char **argv);

#endif
