/* Models: a spec (the built-in mlp and cnn, or a model file's layers)
 * built into a variable table and layers, and the forward and backward
 * passes of a whole model over one workspace. */
#ifndef PS_NN_MODEL_H
#define PS_NN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "nn/backend.h"
#include "nn/layers.h"
#include "optim/optim.h"
#include "paramserv/error.h"
#include "paramserv/vartable.h"

#define PS_MODEL_MAX_HIDDEN 8
#define PS_MODEL_MAX_LAYERS 32
#define PS_MODEL_NAME_MAX 32   /* a layer's name, which prefixes its variables */
#define PS_MODEL_DESC_MAX 128
#define PS_MODEL_MAX_TABLES 64   /* sparse tables: categorical fields */
#define PS_MODEL_MAX_DIM 1024    /* an embedding's floats */

/* What a model description may say a layer is (MODELFILE.md).  flatten and
 * log_softmax build no layer: activations are flat arrays already, and the
 * loss applies the log-softmax (it must be last). */
typedef enum ps_layer_type {
  PS_LT_DENSE = 0,
  PS_LT_CONV2D,
  PS_LT_MAXPOOL,
  PS_LT_DROPOUT,
  PS_LT_RELU,
  PS_LT_FLATTEN,
  PS_LT_LOG_SOFTMAX,
  PS_LT_EMBEDDING_BAG,  /* appends the pooled embeddings of categorical fields */
  PS_LT_SIGMOID,        /* last, after one output: the logistic loss */
} ps_layer_type;

/* How an embedding_bag pools the rows of a bag of keys. */
typedef enum ps_combiner { PS_COMBINER_SUM = 0, PS_COMBINER_MEAN, PS_COMBINER_SQRTN } ps_combiner;

typedef struct ps_layer_spec {
  ps_layer_type type;
  char name[PS_MODEL_NAME_MAX];  /* dense, conv2d: "fc1" gives fc1.weight, fc1.bias */
  int out;                       /* dense: features; conv2d: channels */
  int kernel, stride, padding;   /* conv2d, maxpool */
  float p;                       /* dropout: probability of dropping */
  int channels;                  /* dropout: whole channels (Dropout2d) */
  /* embedding_bag: one sparse table per field of [field_first, field_last]
   * (1-based categorical fields), `dim` floats a row; rows start as
   * init_kind (0 zeros, 1 normal, 2 uniform: ps_table_init_kind's values)
   * times init_scale; the rows' optimizer and its rate (0: [train] lr);
   * admission after admit_after pushes, eviction after idle_steps and past
   * max_rows a shard (0: never); server_pool: the shards pool its bags
   * ("pooling": "server"), which changes where, not what, is computed. */
  int field_first, field_last, dim, combiner, init_kind, server_pool;
  float init_scale, lr;
  char optimizer[16];
  uint32_t admit_after, max_rows;
  uint64_t idle_steps;
} ps_layer_spec;

/* One sparse table of a model: one categorical field. */
typedef struct ps_sparse_spec {
  char name[PS_MODEL_NAME_MAX + 8];  /* the layer's name and the field: "C7" */
  int field;                         /* 0-based categorical field (C1 is 0) */
  int dim;
  ps_combiner combiner;
  int server_pool;                   /* the shards pool its bags (MODELFILE.md) */
  int init_kind;                     /* ps_table_init_kind's value */
  float init_scale;
  ps_optim optim;                    /* the rows' optimizer; optim.lr 0: [train] lr */
  uint32_t admit_after, max_rows;
  uint64_t idle_steps;
  size_t offset;                     /* its pooled vector's place in a sample's embedding input */
} ps_sparse_spec;

/* A model: its input sample's shape and its layers, from a built-in name
 * or a model file (nn/modelfile.h). */
typedef struct ps_model_spec {
  char desc[PS_MODEL_DESC_MAX];  /* canonical text, see ps_model_spec_format */
  int in_c, in_h, in_w;          /* input sample, e.g. 1 x 28 x 28 */
  int classes;                   /* the last layer's outputs */
  int nlayers;
  ps_layer_spec layers[PS_MODEL_MAX_LAYERS];
} ps_model_spec;

/* Parse a built-in model name ("mlp" or "cnn") and, for mlp, hidden sizes
 * as "256,128" (NULL = the default 256,128) for 1 x 28 x 28 inputs and 10
 * classes: the layers of models/mlp.json and models/cnn.json.
 * @return 0 or PS_EUSAGE with a message in eb. */
int ps_model_spec_parse(const char *name, const char *hidden, ps_model_spec *spec,
                        ps_errbuf *eb);

/* Check a spec's layers and shapes (a model file's, or one built in code)
 * and derive its classes; `what` names it in messages (a file's path).
 * @return 0 or PS_EUSAGE with one line naming the layer and what was
 * expected. */
int ps_model_spec_check(ps_model_spec *spec, const char *what, ps_errbuf *eb);

/* "dense", "conv2d", ...: a layer type as model files spell it. */
const char *ps_layer_type_name(ps_layer_type t);

/* Canonical text of a spec, e.g. "mlp 784-256-128-10", "cnn 1x28x28-10",
 * or for another network "model 1x28x28-10 #<xxh64 of its layers>"; two
 * processes with the same text build the same variables and layers. */
const char *ps_model_spec_format(const ps_model_spec *spec, char *buf, size_t len);

typedef struct ps_model {
  ps_model_spec spec;
  ps_vartable vars;
  int nlayers;
  ps_layer layers[PS_MODEL_MAX_LAYERS];
  size_t in_size;      /* floats per input sample */
  /* Sparse tables (embedding_bag layers), table t = tables[t], in file
   * order; emb_size: floats of a sample's embedding input, every table's
   * pooled vector at its offset. */
  int ntables;
  ps_sparse_spec tables[PS_MODEL_MAX_TABLES];
  size_t emb_size;
} ps_model;

/* Build the variable table and layers of `spec`.  @return 0, PS_EUSAGE,
 * -ENOMEM.  Free with ps_model_close. */
int ps_model_build(const ps_model_spec *spec, ps_model *m, ps_errbuf *eb);
void ps_model_close(ps_model *m);

/* Can m train on images of rows x cols pixels (one channel) labelled in
 * [0, classes)?  @return 0 or PS_EUSAGE with one line naming the model
 * (a variables-only model has no layers to train with; a model with
 * sparse tables has no embedding input to read from images). */
int ps_model_check_data(const ps_model *m, uint32_t rows, uint32_t cols, int classes,
                        ps_errbuf *eb);

/* Can m train on samples of `dim` floats (the user's own data: npy,
 * src/data/NPY.md) labelled in [0, classes)?  Its input must hold dim
 * values, in any shape, and it must have at least `classes` classes, or
 * one output (sigmoid) and classes <= 2, and no sparse tables (as
 * ps_model_check_data).  @return 0 or PS_EUSAGE with one line naming the
 * model. */
int ps_model_check_inputs(const ps_model *m, size_t dim, int classes, ps_errbuf *eb);

/* Buffers for one thread's forward and backward passes over up to
 * max_batch samples, in backend memory. */
typedef struct ps_model_ws {
  ps_backend *backend;   /* not owned */
  int max_batch;
  float *act[PS_MODEL_MAX_LAYERS];  /* output of each layer */
  ps_layer_aux aux[PS_MODEL_MAX_LAYERS];
  float *grad_a, *grad_b;           /* ping-pong buffers for dy / dx */
  float *dlogits;
  /* A model with sparse tables: the batch's embedding input, which the
   * caller sets before a forward pass, and where a backward pass writes its
   * gradient (n x m->emb_size each, backend memory, not owned). */
  const float *emb;
  float *demb;
} ps_model_ws;

/* @return 0 or -ENOMEM (nothing left allocated).  Close with ps_model_ws_close. */
int ps_model_ws_init(ps_model_ws *ws, const ps_model *m, ps_backend *b, int max_batch);
void ps_model_ws_close(ps_model_ws *ws);

/* Forward pass over x[n x in_size] (backend memory), n <= max_batch.
 * @return the logits [n x classes], valid until the next pass on ws. */
const float *ps_model_forward(const ps_model *m, ps_model_ws *ws, const float *params,
                              const float *x, int n, int train, uint64_t seed, uint64_t first);

/* Loss and backward pass after ps_model_forward on the same x.  Overwrites
 * grads (params' layout) with the gradient of scale * (sum of the n
 * samples' NLL), and ws->demb with that of the embedding input.  labels: host memory.  Adds correct predictions to
 * *correct when not NULL.  @return the NLL summed over the n samples. */
double ps_model_backward(const ps_model *m, ps_model_ws *ws, const float *params,
                         const float *x, const uint8_t *labels, int n, float scale,
                         float *grads, size_t *correct);

#endif
