/* The verbs of the paramserv binary. */
#ifndef PS_CMD_CMD_H
#define PS_CMD_CMD_H

/* Each verb takes argv with argv[0] = the verb's name and returns the
 * process's exit status: 0 success, 1 failure, 2 bad usage. */
int ps_cmd_train(int argc, char **argv);
int ps_cmd_ps(int argc, char **argv);
int ps_cmd_worker(int argc, char **argv);
int ps_cmd_bench_ps(int argc, char **argv);

/* Print "paramserv: error: <msg>" on one line to stderr. */
void ps_cmd_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
