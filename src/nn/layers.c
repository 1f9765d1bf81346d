/* Forward and backward passes of the layers, on the backend interface. */
#include "nn/layers.h"

void ps_layer_aux_sizes(const ps_layer *l, ps_backend *b, int max_batch, size_t *mask,
                        size_t *idx, size_t *conv_ws) {
  *mask = *idx = *conv_ws = 0;
  switch (l->kind) {
  case PS_LAYER_DROPOUT:
    *mask = (size_t)max_batch * l->out_size;
    break;
  case PS_LAYER_MAXPOOL2D:
    *idx = (size_t)max_batch * l->out_size * sizeof(int32_t);
    break;
  case PS_LAYER_CONV2D:
    *conv_ws = b->ops->conv_ws(b, max_batch, &l->geom, l->out_c) * sizeof(float);
    break;
  default:
    break;
  }
}

void ps_layer_forward(const ps_layer *l, ps_backend *b, const float *params, const float *x,
                      float *y, int n, ps_layer_aux *aux, int train, uint64_t seed,
                      uint64_t first) {
  const ps_backend_ops *op = b->ops;
  switch (l->kind) {
  case PS_LAYER_DENSE: {
    /* y = x W^T + b, W stored [out][in] as PyTorch does. */
    int in = (int)l->in_size, out = l->out_c;
    op->gemm(b, 0, 1, n, out, in, 1.0f, x, in, params + l->woff, in, 0.0f, y, out);
    op->bias_add(b, n, out, 1, params + l->boff, y);
    break;
  }
  case PS_LAYER_CONV2D:
    op->conv_fwd(b, n, &l->geom, l->out_c, params + l->woff, x, y, aux->conv_ws);
    op->bias_add(b, n, l->out_c, l->geom.oh * l->geom.ow, params + l->boff, y);
    break;
  case PS_LAYER_MAXPOOL2D:
    op->maxpool_fwd(b, n, &l->geom, x, y, aux->idx);
    break;
  case PS_LAYER_RELU:
    op->relu_fwd(b, (size_t)n * l->out_size, x, y);
    break;
  case PS_LAYER_DROPOUT:
    if (train)
      op->dropout_fwd(b, n, l->out_size, l->group ? l->group : 1, l->p, seed, first, x, y,
                      aux->mask);
    else
      op->copy(b, y, x, (size_t)n * l->out_size * sizeof *y);
    break;
  case PS_LAYER_CONCAT:
    break;  /* model.c's: it needs the embedding input */
  }
}

void ps_layer_backward(const ps_layer *l, ps_backend *b, const float *params, const float *x,
                       const float *y, const float *dy, float *dx, float *grads, int n,
                       ps_layer_aux *aux) {
  const ps_backend_ops *op = b->ops;
  switch (l->kind) {
  case PS_LAYER_DENSE: {
    int in = (int)l->in_size, out = l->out_c;
    op->gemm(b, 1, 0, out, in, n, 1.0f, dy, out, x, in, 0.0f, grads + l->woff, in);
    op->bias_grad(b, n, out, 1, dy, grads + l->boff);
    if (dx != NULL)
      op->gemm(b, 0, 0, n, in, out, 1.0f, dy, out, params + l->woff, in, 0.0f, dx, in);
    break;
  }
  case PS_LAYER_CONV2D:
    op->bias_grad(b, n, l->out_c, l->geom.oh * l->geom.ow, dy, grads + l->boff);
    op->conv_bwd(b, n, &l->geom, l->out_c, params + l->woff, x, dy, grads + l->woff, dx,
                 aux->conv_ws);
    break;
  case PS_LAYER_MAXPOOL2D:
    if (dx != NULL)
      op->maxpool_bwd(b, n, &l->geom, aux->idx, dy, dx);
    break;
  case PS_LAYER_RELU:
    if (dx != NULL)
      op->relu_bwd(b, (size_t)n * l->out_size, y, dy, dx);
    break;
  case PS_LAYER_DROPOUT:
    if (dx != NULL)
      op->dropout_bwd(b, (size_t)n * l->out_size, l->p, aux->mask, dy, dx);
    break;
  case PS_LAYER_CONCAT:
    break;  /* model.c's: it needs the embedding input */
  }
}
