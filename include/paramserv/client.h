/* The paramserv client: what a worker uses to pull weights from every
 * parameter-server shard and push gradients to them, usable from a user's
 * own C training loop.
 *
 * A client is one worker of a cluster: ps_client_new reads the cluster's
 * config file (systemd/cluster.conf), ps_client_new_opts takes the same
 * settings from a ps_client_options.  It builds the model's variable table
 * and the layout from them, so its weights and gradients are one
 * contiguous float arena laid out as ps_client_vars() says.  Every call
 * talks to all shards at once (all requests in flight together) and
 * returns when every shard has answered.
 *
 * Faults: when a shard's connection fails, the client reconnects after a
 * backoff (100 ms doubling to 1 s, each wait drawn from [w/2, w] so that
 * workers do not come back in step), logs what it waits for, and re-sends
 * the request; a push is re-sent with the same sequence number, so the
 * shard applies it exactly once.  A call fails once a shard has been
 * unreachable for longer than the give-up time ([worker] give_up_s,
 * ps_client_options.give_up_ms; 0, the default, waits for ever).  An
 * ERROR that says not to retry (wrong secret, another layout or cluster)
 * fails the call at once.
 *
 * Errors: calls return 0 or a negative code (PS_E* from error.h, or
 * -errno); ps_client_error() then holds a one-line message.  What a client
 * can still do after each:
 *   -ETIMEDOUT  a shard was unreachable past the give-up time;
 *   -EINTR      the stop flag was set (ps_client_set_stop_flag):
 *               the client is whole.  Call again (with the flag clear):
 *               each call waits the give-up time anew, reconnects, and
 *               re-sends the push not yet acknowledged before anything else.
 *   PS_ESTOPPED the chief ended the run (at [train] last_step, or on
 *               non-finite weights): training is over.
 *   -EACCES, PS_ECONFIG, PS_ELAYOUT
 *               the shards refused this client: another secret, cluster id,
 *               worker index or layout (model, [layout]) than the cluster's.
 *   -ESTALE     a newer incarnation of this worker connected.
 *   PS_EFORMAT  a shard refused a request it cannot take.
 *               After these the client cannot train: every call fails the
 *               same way.  Free it (a new client with the cluster's settings
 *               can start over).
 * After any error the getters, ps_client_error and ps_client_free work; a
 * pull that failed may have written part of its arena (pull again before
 * computing on it).  Whether a failed push took its gradient: see
 * ps_client_push_async.
 *
 * A client is used from one thread at a time. */
#ifndef PARAMSERV_CLIENT_H
#define PARAMSERV_CLIENT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "paramserv/error.h"
#include "paramserv/vartable.h"
#include "paramserv/version.h"

typedef struct ps_client ps_client;

/* Open worker `worker_index` of the cluster in `config_path`.  Nothing is
 * connected yet: the first pull connects.  @return NULL with a one-line
 * message in eb (which may be NULL).  Free with ps_client_free. */
PS_API ps_client *ps_client_new(const char *config_path, int worker_index, ps_errbuf *eb);

/* The settings ps_client_new reads from a config file, for a program that
 * has no such file.  Each must agree with the cluster's config (the shards
 * refuse a client whose cluster id, secret or layout differ), so that
 * every unset field (NULL, 0) means the config's default.  Start from
 * PS_CLIENT_OPTIONS_INIT, which sets `size`, the ABI's guard: a later
 * library adds fields at the end and reads only the `size` bytes a program
 * was built with.  Strings and arrays are read during ps_client_new_opts
 * only; a relative path is the current directory's. */
typedef struct ps_client_options {
  size_t size;                /* sizeof (ps_client_options) */
  const char *cluster_id;     /* [cluster] id: required */
  const char *const *shards;  /* [cluster] ps: nshards "host:port", shard 0 first: required */
  int nshards;
  int worker;                 /* this worker's index in [cluster] workers */
  const void *secret;         /* the cluster secret: secret_len bytes (16 to 4096), */
  size_t secret_len;
  const char *secret_file;    /* or the file holding it (readable by its owner only) */
  const char *model;          /* [model] name: "mlp" (NULL) or "cnn"; or else */
  const char *hidden;         /* [model] hidden: the mlp's layer sizes (NULL: "256,128") */
  const char *model_file;     /* [model] file: a model file (src/nn/MODELFILE.md), or */
  const char *variables_file; /* [model] variables: a variables file */
  const char *layout_strategy;     /* [layout] strategy (NULL: "greedy") */
  const char *layout_split_bytes;  /* [layout] split_bytes (NULL: "auto") */
  uint64_t give_up_ms;        /* [worker] give_up_s in ms (0: never give up) */
  uint64_t peer_timeout_ms;   /* [cluster] peer_timeout_ms (0: 5000) */
  uint64_t last_step;         /* [train] last_step, for ps_client_last_step (0: none) */
} ps_client_options;

#define PS_CLIENT_OPTIONS_INIT {.size = sizeof(ps_client_options)}

/* Open a worker of the cluster `opts` describes: ps_client_new without a
 * config file.  @return NULL with a one-line message in eb (which may be
 * NULL) naming the option at fault.  Free with ps_client_free. */
PS_API ps_client *ps_client_new_opts(const ps_client_options *opts, ps_errbuf *eb);

/* Set this client's incarnation (a number that grows with every start of
 * the same worker, e.g. an epoch from Redis); call it before the first
 * pull.  Default: the start time in nanoseconds. */
PS_API void ps_client_set_incarnation(ps_client *c, uint64_t incarnation);

/* Make every call return -EINTR soon after *flag becomes nonzero (a signal
 * handler's flag), even while it waits for a shard that is down.  NULL:
 * calls are never interrupted (the default). */
PS_API void ps_client_set_stop_flag(ps_client *c, volatile sig_atomic_t *flag);

/* Close every connection and free the client.  ps_client_free(NULL) does
 * nothing. */
PS_API void ps_client_free(ps_client *c);

/* The model's variables: weights and gradients are arenas of
 * ps_client_vars(c)->total floats.  Valid until ps_client_free.  The
 * model is the config's [model]: a built-in name, a model file, or a
 * variables file (src/nn/MODELFILE.md) for a model only your loop knows. */
PS_API const ps_vartable *ps_client_vars(const ps_client *c);

/* A new arena, zeroed, for weights or gradients; free() it.  NULL when out
 * of memory. */
PS_API float *ps_client_arena_new(const ps_client *c);

/* The values of variable `name` in `arena` (one of this client's
 * arenas): arena + its offset, row-major in its shape.  *var (when not
 * NULL) gets its entry in the table (shape, count).  @return NULL, and
 * *var NULL, when the model has no such variable. */
PS_API float *ps_client_view(const ps_client *c, float *arena, const char *name,
                             const ps_var **var);

/* Fetch the current weights of every shard into `params` (the whole
 * arena).  In sync mode it waits until every shard has applied the step the
 * client's last push belongs to; in ssp mode, until the slowest worker is
 * within the staleness bound.  @return 0 or a negative code (`params` may
 * then hold some shards' new values and others' old ones). */
PS_API int ps_client_pull(ps_client *c, float *params);

/* Push a gradient (the whole arena) to every shard, computed on the
 * weights of the last pull, and wait until every shard has acknowledged
 * it: ps_client_push_async, then ps_client_flush.  @return 0 or a negative
 * code, from either half (a loop that must know whether `grad` was taken
 * calls the two itself). */
PS_API int ps_client_push(ps_client *c, const float *grad);

/* The same push without waiting for its acknowledgements: it copies
 * `grad`, sends it, and returns.  The acks come while later calls run, so
 * that a shard's durable write (Redis, [replication] mode = log) overlaps
 * the caller's next gradients: push_async, pull, compute, push_async...
 * In async mode at most two pushes are unacknowledged: push_async first
 * waits for the oldest one's acks when two are, or for the previous one's
 * when no pull came after it (its acks then say the step this push is
 * computed at).  In sync and ssp mode at most one is: push_async waits for
 * the previous push's acks (as ps_client_flush), and a sync pull does too.
 * A pull after a push_async sees its update (a shard reads a connection's
 * frames in order).  A shard that fails meanwhile gets the unacknowledged
 * pushes again, in order, with the same sequence numbers.  @return 0:
 * `grad` was taken, and this call or a later one delivers it, exactly
 * once; or a negative code from waiting for earlier pushes' acks: `grad`
 * was not taken (the earlier pushes still are, and go first in the next
 * call). */
PS_API int ps_client_push_async(ps_client *c, const float *grad);

/* A push_async followed by a pull, in two halves so that the caller can
 * work while the shards answer (prepare its next batch): start sends the
 * push and the pull together (a shard reads both at once, and answers the
 * pull before it copies the push into its log), finish waits for the pull
 * into `params` (untouched until then).  Call finish after every start that
 * returned 0; no other call in between.  @return 0 or a negative code:
 * start's as ps_client_push_async's (an error: nothing taken, nothing to
 * finish); finish's as ps_client_pull's. */
PS_API int ps_client_push_pull_start(ps_client *c, const float *grad, float *params);
PS_API int ps_client_pull_finish(ps_client *c);

/* Wait until every shard acknowledged every push (nothing to wait for:
 * returns 0 at once).  @return 0 or a negative code. */
PS_API int ps_client_flush(ps_client *c);

/* The global step as of the last reply from shard 0 (updates applied to
 * the model so far). */
PS_API uint64_t ps_client_global_step(const ps_client *c);

/* The step limit of the cluster's config ([train] last_step, 0 = none;
 * ps_client_options.last_step).  The chief ends the run there: calls then
 * return PS_ESTOPPED. */
PS_API uint64_t ps_client_last_step(const ps_client *c);

/* Pushes this client completed: each was acknowledged by every shard (a
 * push_async counts once its acks came). */
PS_API uint64_t ps_client_pushes(const ps_client *c);

/* Bytes this client sent to the shards over all its connections (frames,
 * headers included); *in (when not NULL) the bytes it received. */
PS_API uint64_t ps_client_bytes(const ps_client *c, uint64_t *in);

/* The worker's clock: its pushes over all its incarnations, which ssp
 * compares with the other workers'.  It starts at 0; a restarted worker
 * sets the clock it had saved (e.g. in Redis, with its data position), so
 * it rejoins at its clock instead of holding the others back while it
 * redoes every step.  Setting it does not change ps_client_pushes. */
PS_API void ps_client_set_clock(ps_client *c, uint64_t clock);
PS_API uint64_t ps_client_clock(const ps_client *c);

/* Pushes of this client that shards reported as already applied
 * (re-sent after a reconnect) or dropped as stale (sync). */
PS_API uint64_t ps_client_duplicates(const ps_client *c);
PS_API uint64_t ps_client_stale(const ps_client *c);

/* The message of the last failed call: one line, valid until another
 * call fails or the client is freed. */
PS_API const char *ps_client_error(const ps_client *c);

#endif
