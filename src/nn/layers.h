/* Layers: dense, conv2d (the backend's convolution of a batch), maxpool2d,
 * relu, dropout.  Each is a small descriptor plus a forward and a backward
 * pass written only against the backend interface, so a new backend needs
 * no change here. */
#ifndef PS_NN_LAYERS_H
#define PS_NN_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "nn/backend.h"

typedef enum ps_layer_kind {
  PS_LAYER_DENSE = 0,
  PS_LAYER_CONV2D,
  PS_LAYER_MAXPOOL2D,
  PS_LAYER_RELU,
  PS_LAYER_DROPOUT,
  PS_LAYER_CONCAT,   /* the input, then a slice of the embedding input (model.c runs it) */
} ps_layer_kind;

typedef struct ps_layer {
  ps_layer_kind kind;
  size_t in_size, out_size;  /* floats per sample */
  ps_conv_geom geom;         /* conv2d, maxpool2d: the input side and window */
  int out_c;                 /* conv2d: output channels; dense: output features */
  float p;                   /* dropout: probability of dropping a group */
  size_t group;              /* dropout: values dropped together (1, or a channel's plane) */
  int wvar, bvar;            /* variable-table indices of weight and bias, or -1 */
  size_t woff, boff;         /* their offsets in the parameter arena */
  size_t emb_off, emb_width; /* concat: its slice of a sample's embedding input */
} ps_layer;

/* Per-layer scratch that a workspace owns (backend memory). */
typedef struct ps_layer_aux {
  uint8_t *mask;   /* dropout: max_batch * out_size */
  int32_t *idx;    /* maxpool2d: max_batch * out_size */
  float *conv_ws;  /* conv2d: the backend's scratch (backend.h's conv_ws) */
} ps_layer_aux;

/* Bytes of each aux buffer this layer needs for `max_batch` samples on
 * backend b (a convolution's scratch depends on the backend). */
void ps_layer_aux_sizes(const ps_layer *l, ps_backend *b, int max_batch, size_t *mask,
                        size_t *idx, size_t *conv_ws);

/* y[n x out_size] from x[n x in_size].  `train` enables dropout; dropout's
 * masks are a function of (seed, first + sample), see backend.h. */
void ps_layer_forward(const ps_layer *l, ps_backend *b, const float *params, const float *x,
                      float *y, int n, ps_layer_aux *aux, int train, uint64_t seed,
                      uint64_t first);

/* Given dy, overwrite this layer's parameter gradients in `grads` (same
 * offsets as params) and, when dx is not NULL, write dx.  x and y are the
 * forward pass's input and output. */
void ps_layer_backward(const ps_layer *l, ps_backend *b, const float *params, const float *x,
                       const float *y, const float *dy, float *dx, float *grads, int n,
                       ps_layer_aux *aux);

#endif
