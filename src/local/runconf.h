/* The cluster config of a `paramserv local` run: the user's config (or the
 * defaults) with the run's own addresses, secret, Redis and checkpoint
 * directory, written back as INI for the processes the run starts. */
#ifndef PS_LOCAL_RUNCONF_H
#define PS_LOCAL_RUNCONF_H

#include <stdint.h>
#include <stdio.h>

#include "common/config.h"
#include "paramserv/error.h"

typedef struct ps_runconf_opts {
  const char *user_path;  /* the user's config file, NULL for the defaults */
  const char *rundir;     /* the run directory, an absolute path that exists */
  int nps, nworkers;      /* 0: as the user's file lists them, else 2 */
  int64_t last_step;      /* -1: as configured */
  int64_t seed;           /* -1: as configured */
} ps_runconf_opts;

/* Derive the run's config into *c:
 *   - [cluster] chief, ps, workers: fresh ports on 127.0.0.1 (below the
 *     kernel's ephemeral range, so that no outgoing connection holds a
 *     dead shard's port when it comes back);
 *   - [cluster] secret_file: the user's (made absolute) if the file names
 *     one, else "secret" beside the run's config, created (32 random bytes
 *     as hex, mode 600) unless a valid one is there from an earlier run;
 *   - [redis] address: 127.0.0.1 on a fresh port, no user or password (the
 *     run's own redis-server, bound to 127.0.0.1); unless the file names a
 *     Redis Cluster ([redis] cluster): then the file's, and its user and
 *     password file (made absolute);
 *   - [checkpoint] dir: RUNDIR/checkpoints unless the file sets one;
 *   - [replication] mode: log unless the file sets it; self_init: no;
 *   - [metrics] listen: 127.0.0.1 at the first of 1 + nps + nworkers
 *     consecutive free ports, unless the file sets it (empty: off);
 *   - [train] threads: the cores shared among the workers, and [chief]
 *     log_every_steps: 100 (the progress line follows it), unless the file
 *     sets them; last_step and [model] seed from the options when given.
 * Every other setting is the file's or the default.  A file without
 * [cluster] ps or workers is fine (local fills them in).
 * @return 0, or a negative code with a one-line message in eb. */
int ps_runconf_make(const ps_runconf_opts *o, ps_config *c, ps_errbuf *eb);

/* Write c as INI ("[section]" and "key = value" lines, every setting of
 * the table in its order) to path, mode 644, then read it back with
 * ps_config_load and check that it says the same (a value INI cannot
 * carry, such as a path longer than a line, is an error).  On success
 * c->path is path.  @return 0 or a negative code with a message. */
int ps_runconf_write(ps_config *c, const char *path, ps_errbuf *eb);

/* Print every setting of c as INI to f. */
void ps_runconf_print(const ps_config *c, FILE *f);

/* n distinct free TCP ports on 127.0.0.1 below the ephemeral range into
 * out.  @return 0 or a negative errno. */
int ps_runconf_free_ports(int n, uint16_t *out);

/* n consecutive free TCP ports on 127.0.0.1 below the ephemeral range,
 * the first into *base.  @return 0 or a negative errno. */
int ps_runconf_free_port_run(int n, uint16_t *base);

#endif
