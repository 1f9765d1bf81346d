/* Built-in models (mlp, cnn): their variable table, their layers, and the
 * forward and backward passes of a whole model over one workspace. */
#ifndef PS_NN_MODEL_H
#define PS_NN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "nn/backend.h"
#include "nn/layers.h"
#include "paramserv/error.h"
#include "paramserv/vartable.h"

#define PS_MODEL_MAX_HIDDEN 8
#define PS_MODEL_MAX_LAYERS 32

typedef enum ps_model_kind { PS_MODEL_MLP = 0, PS_MODEL_CNN } ps_model_kind;

typedef struct ps_model_spec {
  ps_model_kind kind;
  int nhidden;                       /* mlp: hidden layer sizes */
  int hidden[PS_MODEL_MAX_HIDDEN];
  int in_c, in_h, in_w;              /* input sample, e.g. 1 x 28 x 28 */
  int classes;
} ps_model_spec;

/* Parse a model name ("mlp" or "cnn") and, for mlp, hidden sizes as
 * "256,128" (NULL = the default 256,128) for 1 x 28 x 28 inputs and 10
 * classes.  @return 0 or PS_EUSAGE with a message in eb. */
int ps_model_spec_parse(const char *name, const char *hidden, ps_model_spec *spec,
                        ps_errbuf *eb);

/* Canonical text of a spec, e.g. "mlp 784-256-128-10" or "cnn 1x28x28-10";
 * two processes with the same text build the same variable table. */
const char *ps_model_spec_format(const ps_model_spec *spec, char *buf, size_t len);

typedef struct ps_model {
  ps_model_spec spec;
  ps_vartable vars;
  int nlayers;
  ps_layer layers[PS_MODEL_MAX_LAYERS];
  size_t in_size;      /* floats per input sample */
} ps_model;

/* Build the variable table and layers of `spec`.  @return 0, PS_EUSAGE,
 * -ENOMEM.  Free with ps_model_close. */
int ps_model_build(const ps_model_spec *spec, ps_model *m, ps_errbuf *eb);
void ps_model_close(ps_model *m);

/* Buffers for one thread's forward and backward passes over up to
 * max_batch samples, in backend memory. */
typedef struct ps_model_ws {
  ps_backend *backend;   /* not owned */
  int max_batch;
  float *act[PS_MODEL_MAX_LAYERS];  /* output of each layer */
  ps_layer_aux aux[PS_MODEL_MAX_LAYERS];
  float *grad_a, *grad_b;           /* ping-pong buffers for dy / dx */
  float *dlogits;
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
 * samples' NLL).  labels: host memory.  Adds correct predictions to
 * *correct when not NULL.  @return the NLL summed over the n samples. */
double ps_model_backward(const ps_model *m, ps_model_ws *ws, const float *params,
                         const float *x, const uint8_t *labels, int n, float scale,
                         float *grads, size_t *correct);

#endif
