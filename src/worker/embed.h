/* A step's sparse inputs on the worker: each table's distinct keys of a
 * batch (what the worker pulls and pushes), the pooled embedding input the
 * network reads (nn/model.h: emb), and the rows' gradients from the
 * network's gradient of that input.  A sample's field holds a bag of keys
 * (one in Criteo's data, which every combiner leaves as it is; any number
 * with [data] bag_separator), pooled by its table's combiner: the sum, the
 * mean or the sum over the square root of the count; an empty bag pools to
 * zeros.  No I/O. */
#ifndef PS_WORKER_EMBED_H
#define PS_WORKER_EMBED_H

#include <stddef.h>
#include <stdint.h>

#include "nn/model.h"
#include "worker/sparse_split.h"

typedef struct ps_embed {
  const ps_model *model;
  int max_batch, nfields;      /* nfields: keys per sample in the data */
  int n;                       /* samples of the current batch */
  /* Per table: the batch's distinct keys ascending (nkeys), sample i's
   * keys as indexes among them (bag[boff[i] .. boff[i + 1])), the rows
   * pulled for them and their gradients.  Grown as batches need. */
  uint64_t *keys[PS_MODEL_MAX_TABLES];
  size_t nkeys[PS_MODEL_MAX_TABLES];
  uint32_t *bag[PS_MODEL_MAX_TABLES], *boff[PS_MODEL_MAX_TABLES];
  float *rows[PS_MODEL_MAX_TABLES], *grads[PS_MODEL_MAX_TABLES];
  size_t keys_cap[PS_MODEL_MAX_TABLES], occ_cap[PS_MODEL_MAX_TABLES];
  size_t rows_cap[PS_MODEL_MAX_TABLES], grads_cap[PS_MODEL_MAX_TABLES];  /* floats */
  uint64_t *sort;              /* scratch: (key, place) pairs */
  size_t sort_cap;
  /* Tables pooled on the shards (ps_embed_server_pooling): each sample's
   * pooled sum as the shards send it, and each sample's gradient pushed
   * (max_batch * dim floats each). */
  int server[PS_MODEL_MAX_TABLES];
  float *pooled[PS_MODEL_MAX_TABLES], *bgrads[PS_MODEL_MAX_TABLES];
} ps_embed;

/* For batches of up to max_batch samples with nfields fields each (a
 * table's field must be below it).  @return 0, -EINVAL (a table's field out
 * of range) or -ENOMEM.  Free with ps_embed_free (also after a failure). */
int ps_embed_init(ps_embed *e, const ps_model *m, int max_batch, int nfields);
void ps_embed_free(ps_embed *e);

/* From now on the tables whose layer says "pooling": "server" go to the
 * shards as bags (ps_embed_batch), which pool them: pool then reads their
 * sums, scatter writes each sample's gradient.  A worker's; the chief's
 * evaluation and paramserv train pool every table here.  @return 0 or
 * -ENOMEM. */
int ps_embed_server_pooling(ps_embed *e);

/* Take a batch's keys (at most max_batch samples): sample i's field f holds
 * keys[offs[i * nfields + f] .. offs[i * nfields + f + 1]), or, when offs
 * is NULL, the one key keys[i * nfields + f].  @return 0 or -ENOMEM. */
int ps_embed_keys(ps_embed *e, const uint64_t *keys, const uint32_t *offs, int n);

/* Rows the batch names: its distinct keys summed over the tables (what a
 * pull of its rows fetches). */
size_t ps_embed_nrows(const ps_embed *e);

/* The batch's rows as the client splits them: keys, and rows to pull into
 * or gradients to push; for a table the shards pool, its bags, the pooled
 * sums to pull into and the samples' gradients to push. */
void ps_embed_batch(const ps_embed *e, ps_sparse_batch *b);

/* The embedding input of the batch (n x model->emb_size floats) from the
 * rows pulled: each bag pooled by its table's combiner. */
void ps_embed_pool(const ps_embed *e, float *emb);

/* The rows' gradients (grads) from the network's gradient of its embedding
 * input (demb, n x emb_size): each row gets the sum over the samples that
 * hold its key (as many times as their bags hold it) of the sample's
 * gradient times its bag's combiner factor. */
void ps_embed_scatter(ps_embed *e, const float *demb);

#endif
