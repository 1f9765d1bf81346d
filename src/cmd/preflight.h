/* The pre-flight checks of a config: what a cluster's processes will need
 * (the config, the secret, the model, the data set, the checkpoint
 * directory, each shard's address here, Redis), each said in one line,
 * "ok: ...", "warn: ..." or "error: ..." on stdout.  `paramserv check`
 * runs them all; `paramserv local` the files' alone, errors only. */
#ifndef PS_CMD_PREFLIGHT_H
#define PS_CMD_PREFLIGHT_H

struct ps_config;

/* Load the config at `path` into *cfg and say so, or say its error.
 * @return 0, or 2 (the error said). */
int ps_preflight_config(const char *path, struct ps_config *cfg);

/* The checks of the files a config names (the secret, the model, the data
 * set, the checkpoint directory); errors_only (paramserv local, which checks
 * an IDX or Criteo data set itself): only the errors, as paramserv: error:
 * lines on stderr (ps_cmd_error), and of the data set only npy data's.
 * @return the number of errors. */
int ps_preflight_files(const struct ps_config *cfg, int errors_only);

/* Each shard's address (each member's in ring mode): free here, in use, or
 * not this machine's.  Says warnings, never errors. */
void ps_preflight_ports(const struct ps_config *cfg);

/* Redis: reachable, and whether it keeps its data over a restart.
 * @return 1 when it is unreachable or refuses us, else 0. */
int ps_preflight_redis(const struct ps_config *cfg);

#endif
