/* The parameter-server shard process: a libuv TCP server that owns one
 * shard (ps/shard.h) and serves workers' pulls and pushes under the
 * configured consistency mode. */
#ifndef PS_PS_SERVER_H
#define PS_PS_SERVER_H

#include "common/config.h"

/* Serve shard `index` of the cluster in `cfg` until SIGTERM or SIGINT.
 * Logs one line per event to stderr; "listening on ADDR" once ready.
 * @return the process exit status: 0 after a clean stop, 1 on a start-up
 * error (printed as one line). */
int ps_server_run(const ps_config *cfg, int index);

#endif
