/* The client's calls for models with sparse tables (a worker's, not the
 * public library's yet): the dense calls of paramserv/client.h with each
 * step's rows beside them.  The rows go to and come from the shards the
 * hash ring names (worker/sparse_split.h), in the same PUSH and PULL. */
#ifndef PS_WORKER_CLIENT_SPARSE_H
#define PS_WORKER_CLIENT_SPARSE_H

#include "paramserv/client.h"
#include "worker/sparse_split.h"

/* ps_client_pull, and the rows of `want` (NULL: none) into want->rows. */
int ps_client_pull_sparse(ps_client *c, float *params, const ps_sparse_batch *want);

/* ps_client_push_pull_start with the gradients of `pushed`'s rows (copied
 * now: one push covers both, exactly once) and the rows of `want`, which
 * must stay valid until ps_client_pull_finish writes them. */
int ps_client_push_pull_start_sparse(ps_client *c, const float *grad,
                                     const ps_sparse_batch *pushed, float *params,
                                     const ps_sparse_batch *want);

#endif
