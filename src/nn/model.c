/* Built-in models and whole-model forward/backward passes. */
#include "nn/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- specs */

int ps_model_spec_parse(const char *name, const char *hidden, ps_model_spec *spec,
                        ps_errbuf *eb) {
  memset(spec, 0, sizeof *spec);
  spec->in_c = 1;
  spec->in_h = spec->in_w = 28;
  spec->classes = 10;
  if (strcmp(name, "cnn") == 0) {
    spec->kind = PS_MODEL_CNN;
    if (hidden != NULL)
      return ps_err_set(eb, PS_EUSAGE, "--hidden applies to mlp only, not to cnn");
    return 0;
  }
  if (strcmp(name, "mlp") != 0)
    return ps_err_set(eb, PS_EUSAGE, "model '%s': expected mlp or cnn", name);
  spec->kind = PS_MODEL_MLP;
  if (hidden == NULL)
    hidden = "256,128";
  if (*hidden == '\0')
    return ps_err_set(eb, PS_EUSAGE, "hidden sizes '': expected at least one size, as 256,128");
  const char *p = hidden;
  while (*p != '\0') {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno != 0 || v < 1 || v > 65536 || (*end != ',' && *end != '\0'))
      return ps_err_set(eb, PS_EUSAGE,
                        "hidden sizes '%s': expected comma-separated integers in [1, 65536]",
                        hidden);
    if (spec->nhidden == PS_MODEL_MAX_HIDDEN)
      return ps_err_set(eb, PS_EUSAGE, "hidden sizes '%s': at most %d layers", hidden,
                        PS_MODEL_MAX_HIDDEN);
    spec->hidden[spec->nhidden++] = (int)v;
    p = *end == ',' ? end + 1 : end;
    if (*end == ',' && *p == '\0')
      return ps_err_set(eb, PS_EUSAGE, "hidden sizes '%s': trailing comma", hidden);
  }
  return 0;
}

const char *ps_model_spec_format(const ps_model_spec *spec, char *buf, size_t len) {
  if (spec->kind == PS_MODEL_CNN) {
    snprintf(buf, len, "cnn %dx%dx%d-%d", spec->in_c, spec->in_h, spec->in_w, spec->classes);
    return buf;
  }
  size_t w = (size_t)snprintf(buf, len, "mlp %d", spec->in_c * spec->in_h * spec->in_w);
  for (int i = 0; i < spec->nhidden && w < len; i++)
    w += (size_t)snprintf(buf + w, len - w, "-%d", spec->hidden[i]);
  if (w < len)
    snprintf(buf + w, len - w, "-%d", spec->classes);
  return buf;
}

/* --------------------------------------------------------------- layers */

typedef struct builder {
  ps_model *m;
  int c, h, w;  /* shape of the current activation */
  int err;
} builder;

static size_t cur_size(const builder *bd) { return (size_t)bd->c * bd->h * bd->w; }

static ps_layer *push(builder *bd, ps_layer_kind kind) {
  if (bd->m->nlayers == PS_MODEL_MAX_LAYERS) {
    bd->err = -EINVAL;
    return NULL;
  }
  ps_layer *l = &bd->m->layers[bd->m->nlayers++];
  memset(l, 0, sizeof *l);
  l->kind = kind;
  l->wvar = l->bvar = -1;
  l->in_size = cur_size(bd);
  return l;
}

/* PyTorch's default initialization for Linear and Conv2d: weight and bias
 * uniform in +-1/sqrt(fan_in), so accuracy compares with its runs. */
static void add_params(builder *bd, ps_layer *l, const char *name, int ndim,
                       const uint32_t *wshape, uint32_t nbias, uint32_t fan_in) {
  char wname[PS_VAR_NAME_MAX], bname[PS_VAR_NAME_MAX];
  snprintf(wname, sizeof wname, "%s.weight", name);
  snprintf(bname, sizeof bname, "%s.bias", name);
  ps_init init = {PS_INIT_UNIFORM, (float)(1.0 / sqrt((double)fan_in))};
  int wv = ps_vartable_add(&bd->m->vars, wname, ndim, wshape, init);
  int bv = ps_vartable_add(&bd->m->vars, bname, 1, &nbias, init);
  if (wv < 0 || bv < 0) {
    bd->err = wv < 0 ? wv : bv;
    return;
  }
  l->wvar = wv;
  l->bvar = bv;
}

static void dense(builder *bd, const char *name, int out) {
  ps_layer *l = push(bd, PS_LAYER_DENSE);
  if (l == NULL)
    return;
  uint32_t shape[2] = {(uint32_t)out, (uint32_t)l->in_size};
  add_params(bd, l, name, 2, shape, (uint32_t)out, (uint32_t)l->in_size);
  l->out_c = out;
  bd->c = out;
  bd->h = bd->w = 1;
  l->out_size = cur_size(bd);
}

static void conv2d(builder *bd, const char *name, int out_c, int k) {
  ps_layer *l = push(bd, PS_LAYER_CONV2D);
  if (l == NULL)
    return;
  ps_conv_geom g = {.c = bd->c, .h = bd->h, .w = bd->w, .kh = k, .kw = k, .stride = 1,
                    .pad = 0, .oh = bd->h - k + 1, .ow = bd->w - k + 1};
  l->geom = g;
  uint32_t shape[4] = {(uint32_t)out_c, (uint32_t)bd->c, (uint32_t)k, (uint32_t)k};
  add_params(bd, l, name, 4, shape, (uint32_t)out_c, (uint32_t)(bd->c * k * k));
  l->out_c = out_c;
  bd->c = out_c;
  bd->h = g.oh;
  bd->w = g.ow;
  l->out_size = cur_size(bd);
}

static void maxpool2d(builder *bd, int k) {
  ps_layer *l = push(bd, PS_LAYER_MAXPOOL2D);
  if (l == NULL)
    return;
  ps_conv_geom g = {.c = bd->c, .h = bd->h, .w = bd->w, .kh = k, .kw = k, .stride = k,
                    .pad = 0, .oh = bd->h / k, .ow = bd->w / k};
  l->geom = g;
  bd->h = g.oh;
  bd->w = g.ow;
  l->out_size = cur_size(bd);
}

static void relu(builder *bd) {
  ps_layer *l = push(bd, PS_LAYER_RELU);
  if (l != NULL)
    l->out_size = l->in_size;
}

/* Dropout of whole channels (group = one channel's plane) or of single
 * values (group = 1). */
static void dropout(builder *bd, float p, int channels) {
  ps_layer *l = push(bd, PS_LAYER_DROPOUT);
  if (l == NULL)
    return;
  l->p = p;
  l->group = channels ? (size_t)bd->h * bd->w : 1;
  l->out_size = l->in_size;
}

int ps_model_build(const ps_model_spec *spec, ps_model *m, ps_errbuf *eb) {
  memset(m, 0, sizeof *m);
  m->spec = *spec;
  ps_vartable_init(&m->vars);
  builder bd = {.m = m, .c = spec->in_c, .h = spec->in_h, .w = spec->in_w};
  m->in_size = cur_size(&bd);
  if (spec->kind == PS_MODEL_MLP) {
    char name[16];
    for (int i = 0; i < spec->nhidden; i++) {
      snprintf(name, sizeof name, "fc%d", i + 1);
      dense(&bd, name, spec->hidden[i]);
      relu(&bd);
    }
    snprintf(name, sizeof name, "fc%d", spec->nhidden + 1);
    dense(&bd, name, spec->classes);
  } else {
    /* The network of the classic parameter-server example.  Its dropout
     * figures, 0.5 and 0.75, are TensorFlow keep probabilities: here p is
     * the probability of dropping, as in PyTorch, so 0.5 and 0.25.  On the
     * conv layers' outputs whole channels are dropped (PyTorch's
     * Dropout2d), as convolutional nets do: dropping single values before
     * the max-pool makes training see larger maxima than evaluation does,
     * and the test accuracy then trails the training accuracy by 8 points
     * after 3 epochs (measured: 0.825 against 0.90). */
    conv2d(&bd, "conv1", 32, 3);
    dropout(&bd, 0.5f, 1);
    relu(&bd);
    conv2d(&bd, "conv2", 64, 3);
    dropout(&bd, 0.25f, 1);
    maxpool2d(&bd, 2);
    dense(&bd, "fc1", 128);
    relu(&bd);
    dense(&bd, "fc2", 20);
    relu(&bd);
    dense(&bd, "fc3", spec->classes);
  }
  if (bd.err != 0) {
    int err = bd.err;
    ps_model_close(m);
    return ps_err_set(eb, err, "model: cannot build its layers: %s", ps_strerror(err));
  }
  for (int i = 0; i < m->nlayers; i++) {
    ps_layer *l = &m->layers[i];
    if (l->wvar >= 0) {
      l->woff = m->vars.vars[l->wvar].offset;
      l->boff = m->vars.vars[l->bvar].offset;
    }
  }
  return 0;
}

void ps_model_close(ps_model *m) {
  if (m == NULL)
    return;
  ps_vartable_close(&m->vars);
  m->nlayers = 0;
}

/* ------------------------------------------------------------ workspace */

void ps_model_ws_close(ps_model_ws *ws) {
  if (ws == NULL || ws->backend == NULL)
    return;
  ps_backend *b = ws->backend;
  for (int i = 0; i < PS_MODEL_MAX_LAYERS; i++) {
    b->ops->free(b, ws->act[i]);
    b->ops->free(b, ws->aux[i].mask);
    b->ops->free(b, ws->aux[i].idx);
    b->ops->free(b, ws->aux[i].col);
    b->ops->free(b, ws->aux[i].dcol);
  }
  b->ops->free(b, ws->grad_a);
  b->ops->free(b, ws->grad_b);
  b->ops->free(b, ws->dlogits);
  memset(ws, 0, sizeof *ws);
}

int ps_model_ws_init(ps_model_ws *ws, const ps_model *m, ps_backend *b, int max_batch) {
  memset(ws, 0, sizeof *ws);
  ws->backend = b;
  ws->max_batch = max_batch;
  size_t widest = m->in_size;
  int failed = 0;
  for (int i = 0; i < m->nlayers; i++) {
    const ps_layer *l = &m->layers[i];
    size_t mask, idx, col;
    ps_layer_aux_sizes(l, max_batch, &mask, &idx, &col);
    ws->act[i] = b->ops->alloc(b, (size_t)max_batch * l->out_size * sizeof(float));
    failed |= ws->act[i] == NULL;
    if (mask) {
      ws->aux[i].mask = b->ops->alloc(b, mask);
      failed |= ws->aux[i].mask == NULL;
    }
    if (idx) {
      ws->aux[i].idx = b->ops->alloc(b, idx);
      failed |= ws->aux[i].idx == NULL;
    }
    if (col) {
      ws->aux[i].col = b->ops->alloc(b, col);
      ws->aux[i].dcol = b->ops->alloc(b, col);
      failed |= ws->aux[i].col == NULL || ws->aux[i].dcol == NULL;
    }
    if (l->out_size > widest)
      widest = l->out_size;
  }
  ws->grad_a = b->ops->alloc(b, (size_t)max_batch * widest * sizeof(float));
  ws->grad_b = b->ops->alloc(b, (size_t)max_batch * widest * sizeof(float));
  ws->dlogits = b->ops->alloc(b, (size_t)max_batch * m->spec.classes * sizeof(float));
  if (failed || ws->grad_a == NULL || ws->grad_b == NULL || ws->dlogits == NULL) {
    ps_model_ws_close(ws);
    return -ENOMEM;
  }
  return 0;
}

/* ------------------------------------------------------------- passes */

const float *ps_model_forward(const ps_model *m, ps_model_ws *ws, const float *params,
                              const float *x, int n, int train, uint64_t seed, uint64_t first) {
  const float *in = x;
  for (int i = 0; i < m->nlayers; i++) {
    /* Each dropout layer gets its own stream of masks. */
    uint64_t layer_seed = seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1));
    ps_layer_forward(&m->layers[i], ws->backend, params, in, ws->act[i], n, &ws->aux[i], train,
                     layer_seed, first);
    in = ws->act[i];
  }
  return in;
}

double ps_model_backward(const ps_model *m, ps_model_ws *ws, const float *params,
                         const float *x, const uint8_t *labels, int n, float scale,
                         float *grads, size_t *correct) {
  ps_backend *b = ws->backend;
  const float *logits = ws->act[m->nlayers - 1];
  double loss = b->ops->nll(b, n, m->spec.classes, logits, labels, scale, ws->dlogits, correct);
  const float *dy = ws->dlogits;
  float *bufs[2] = {ws->grad_a, ws->grad_b};
  /* The first layer that has parameters needs no input gradient, and
   * nothing below it needs a backward pass at all. */
  int lowest = 0;
  while (lowest < m->nlayers && m->layers[lowest].wvar < 0)
    lowest++;
  for (int i = m->nlayers - 1; i >= lowest; i--) {
    const float *in = i > 0 ? ws->act[i - 1] : x;
    float *dx = i > lowest ? bufs[i & 1] : NULL;
    ps_layer_backward(&m->layers[i], b, params, in, ws->act[i], dy, dx, grads, n, &ws->aux[i]);
    dy = dx;
  }
  return loss;
}
