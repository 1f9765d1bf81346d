/* Model specs (built-in and checked), building them, and whole-model
 * forward/backward passes. */
#include "nn/model.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---------------------------------------------------------------- specs */

static ps_layer_spec *add_spec(ps_model_spec *spec, ps_layer_type type, const char *name) {
  ps_layer_spec *l = &spec->layers[spec->nlayers++];
  memset(l, 0, sizeof *l);
  l->type = type;
  if (name != NULL)
    snprintf(l->name, sizeof l->name, "%s", name);
  return l;
}

static void add_dense(ps_model_spec *spec, const char *name, int out) {
  add_spec(spec, PS_LT_DENSE, name)->out = out;
}

static void add_conv(ps_model_spec *spec, const char *name, int out, int kernel) {
  ps_layer_spec *l = add_spec(spec, PS_LT_CONV2D, name);
  l->out = out;
  l->kernel = kernel;
  l->stride = 1;
}

static void add_dropout(ps_model_spec *spec, float p, int channels) {
  ps_layer_spec *l = add_spec(spec, PS_LT_DROPOUT, NULL);
  l->p = p;
  l->channels = channels;
}

/* The network of the classic parameter-server example (models/cnn.json).
 * Its dropout figures, 0.5 and 0.75, are TensorFlow keep probabilities:
 * here p is the probability of dropping, as in PyTorch, so 0.5 and 0.25.
 * On the conv layers' outputs whole channels are dropped (PyTorch's
 * Dropout2d), as convolutional nets do: dropping single values before the
 * max-pool makes training see larger maxima than evaluation does, and the
 * test accuracy then trails the training accuracy by 8 points after 3
 * epochs (measured: 0.825 against 0.90). */
static void cnn_layers(ps_model_spec *spec) {
  add_conv(spec, "conv1", 32, 3);
  add_dropout(spec, 0.5f, 1);
  add_spec(spec, PS_LT_RELU, NULL);
  add_conv(spec, "conv2", 64, 3);
  add_dropout(spec, 0.25f, 1);
  ps_layer_spec *pool = add_spec(spec, PS_LT_MAXPOOL, NULL);
  pool->kernel = pool->stride = 2;
  add_spec(spec, PS_LT_FLATTEN, NULL);
  add_dense(spec, "fc1", 128);
  add_spec(spec, PS_LT_RELU, NULL);
  add_dense(spec, "fc2", 20);
  add_spec(spec, PS_LT_RELU, NULL);
  add_dense(spec, "fc3", spec->classes);
  add_spec(spec, PS_LT_LOG_SOFTMAX, NULL);
}

int ps_model_spec_parse(const char *name, const char *hidden, ps_model_spec *spec,
                        ps_errbuf *eb) {
  memset(spec, 0, sizeof *spec);
  spec->in_c = 1;
  spec->in_h = spec->in_w = 28;
  spec->classes = 10;
  if (strcmp(name, "cnn") == 0) {
    if (hidden != NULL)
      return ps_err_set(eb, PS_EUSAGE, "--hidden applies to mlp only, not to cnn");
    cnn_layers(spec);
    snprintf(spec->desc, sizeof spec->desc, "cnn %dx%dx%d-%d", spec->in_c, spec->in_h,
             spec->in_w, spec->classes);
    return ps_model_spec_check(spec, name, eb);
  }
  if (strcmp(name, "mlp") != 0)
    return ps_err_set(eb, PS_EUSAGE, "model '%s': expected mlp or cnn", name);
  if (hidden == NULL)
    hidden = "256,128";
  if (*hidden == '\0')
    return ps_err_set(eb, PS_EUSAGE, "hidden sizes '': expected at least one size, as 256,128");
  int nhidden = 0, sizes[PS_MODEL_MAX_HIDDEN];
  const char *p = hidden;
  while (*p != '\0') {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno != 0 || v < 1 || v > 65536 || (*end != ',' && *end != '\0'))
      return ps_err_set(eb, PS_EUSAGE,
                        "hidden sizes '%s': expected comma-separated integers in [1, 65536]",
                        hidden);
    if (nhidden == PS_MODEL_MAX_HIDDEN)
      return ps_err_set(eb, PS_EUSAGE, "hidden sizes '%s': at most %d layers", hidden,
                        PS_MODEL_MAX_HIDDEN);
    sizes[nhidden++] = (int)v;
    p = *end == ',' ? end + 1 : end;
    if (*end == ',' && *p == '\0')
      return ps_err_set(eb, PS_EUSAGE, "hidden sizes '%s': trailing comma", hidden);
  }
  /* models/mlp.json is the default: flatten, fc1, relu, fc2, relu, fc3. */
  char lname[16];
  size_t w = (size_t)snprintf(spec->desc, sizeof spec->desc, "mlp %d",
                              spec->in_c * spec->in_h * spec->in_w);
  add_spec(spec, PS_LT_FLATTEN, NULL);
  for (int i = 0; i < nhidden; i++) {
    snprintf(lname, sizeof lname, "fc%d", i + 1);
    add_dense(spec, lname, sizes[i]);
    add_spec(spec, PS_LT_RELU, NULL);
    w += (size_t)snprintf(spec->desc + w, sizeof spec->desc - w, "-%d", sizes[i]);
  }
  snprintf(lname, sizeof lname, "fc%d", nhidden + 1);
  add_dense(spec, lname, spec->classes);
  add_spec(spec, PS_LT_LOG_SOFTMAX, NULL);
  snprintf(spec->desc + w, sizeof spec->desc - w, "-%d", spec->classes);
  return ps_model_spec_check(spec, name, eb);
}

const char *ps_layer_type_name(ps_layer_type t) {
  switch (t) {
  case PS_LT_DENSE: return "dense";
  case PS_LT_CONV2D: return "conv2d";
  case PS_LT_MAXPOOL: return "maxpool";
  case PS_LT_DROPOUT: return "dropout";
  case PS_LT_RELU: return "relu";
  case PS_LT_FLATTEN: return "flatten";
  case PS_LT_LOG_SOFTMAX: return "log_softmax";
  case PS_LT_EMBEDDING_BAG: return "embedding_bag";
  case PS_LT_SIGMOID: return "sigmoid";
  }
  return "?";
}

/* Bounds that keep every size below in range of the int and uint32_t
 * fields it lands in (and a model far below what a shard can hold). */
#define MAX_SIDE 4096
#define MAX_WIDTH (1 << 20)
#define MAX_PARAMS (1ULL << 31)
#define MAX_ACTIVATION (1ULL << 26)

/* The shape of the activation as the layers go. */
typedef struct shape {
  int c, h, w;
} shape;

static int layer_err(ps_errbuf *eb, const char *what, int i, const ps_layer_spec *l,
                     const char *fmt, int a, int b) {
  char msg[160];
  snprintf(msg, sizeof msg, fmt, a, b);
  return ps_err_set(eb, PS_EUSAGE, "%s: layer %d (%s%s%s): %s", what, i + 1,
                    ps_layer_type_name(l->type), l->name[0] ? " " : "", l->name, msg);
}

/* The output side of a window of `k` at `stride` with `pad` over `in`,
 * or 0 when the window does not fit. */
static int window_out(int in, int k, int stride, int pad) {
  return in + 2 * pad < k ? 0 : (in + 2 * pad - k) / stride + 1;
}

/* conv2d and maxpool: check the window's numbers against the input shape
 * *sh and make *sh the output's.  @return NULL, or a message's format
 * with its two numbers in *a and *b. */
static const char *window_shape(const ps_layer_spec *l, shape *sh, int *a, int *b) {
  int conv = l->type == PS_LT_CONV2D;
  /* A max-pool window must hold one value that is not padding. */
  int max_pad = conv ? l->kernel - 1 : l->kernel / 2;
  *a = l->kernel;
  if (l->kernel < 1 || l->stride < 1 || l->padding < 0 || l->padding > max_pad) {
    *b = max_pad;
    return "kernel %d, stride, padding: expected kernel >= 1, stride >= 1, 0 <= padding <= %d";
  }
  int oh = window_out(sh->h, l->kernel, l->stride, l->padding);
  int ow = window_out(sh->w, l->kernel, l->stride, l->padding);
  if (oh < 1 || ow < 1) {
    *b = sh->h < sh->w ? sh->h : sh->w;
    return "kernel %d over an input of side %d: expected it to fit (with the padding)";
  }
  *sh = (shape){conv ? l->out : sh->c, oh, ow};
  return NULL;
}

int ps_model_spec_check(ps_model_spec *spec, const char *what, ps_errbuf *eb) {
  if (spec->in_c < 1 || spec->in_h < 1 || spec->in_w < 1 || spec->in_c > MAX_SIDE ||
      spec->in_h > MAX_SIDE || spec->in_w > MAX_SIDE)
    return ps_err_set(eb, PS_EUSAGE, "%s: input %dx%dx%d: expected 1 to %d each", what,
                      spec->in_c, spec->in_h, spec->in_w, MAX_SIDE);
  if (spec->nlayers < 1 || (spec->layers[spec->nlayers - 1].type != PS_LT_LOG_SOFTMAX &&
                            spec->layers[spec->nlayers - 1].type != PS_LT_SIGMOID))
    return ps_err_set(eb, PS_EUSAGE, "%s: the last layer must be log_softmax (the loss is the "
                                     "negative log-likelihood of its output) or sigmoid (the "
                                     "logistic loss of one output)", what);
  int tables = 0;
  shape sh = {spec->in_c, spec->in_h, spec->in_w};
  uint64_t params = 0;
  int trained = 0;
  for (int i = 0; i < spec->nlayers; i++) {
    const ps_layer_spec *l = &spec->layers[i];
    const char *fmt = NULL;
    int a = 0, b = 0;
    uint64_t in = (uint64_t)sh.c * sh.h * sh.w;
    switch (l->type) {
    case PS_LT_DENSE:
    case PS_LT_CONV2D: {
      if (l->name[0] == '\0' || strspn(l->name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST"
                                                "UVWXYZ0123456789_") != strlen(l->name)) {
        fmt = "name: expected 1 to 31 of A-Z a-z 0-9 _ (it names the layer's variables)";
        break;
      }
      for (int j = 0; j < i && fmt == NULL; j++)
        if (strcmp(spec->layers[j].name, l->name) == 0) {
          fmt = "name already taken by layer %d: expected a name of its own";
          a = j + 1;
        }
      if (fmt != NULL)
        break;
      int max = l->type == PS_LT_DENSE ? MAX_WIDTH : MAX_SIDE;
      if (l->out < 1 || l->out > max) {
        fmt = "out = %d: expected 1 to %d";
        a = l->out;
        b = max;
        break;
      }
      uint64_t fan_in = in;
      if (l->type == PS_LT_CONV2D) {
        fan_in = (uint64_t)sh.c * (uint64_t)l->kernel * (uint64_t)l->kernel;
        if ((fmt = window_shape(l, &sh, &a, &b)) != NULL)
          break;
      } else {
        sh = (shape){l->out, 1, 1};
      }
      params += fan_in * (uint64_t)l->out + (uint64_t)l->out;
      trained = 1;
      break;
    }
    case PS_LT_MAXPOOL:
      fmt = window_shape(l, &sh, &a, &b);
      break;
    case PS_LT_DROPOUT:
      if (!(l->p >= 0.0f && l->p < 1.0f))
        fmt = "p: expected a probability of dropping in [0, 1)";
      break;
    case PS_LT_RELU:
      break;
    case PS_LT_FLATTEN:
      sh = (shape){sh.c * sh.h * sh.w, 1, 1};
      break;
    case PS_LT_LOG_SOFTMAX:
      if (i != spec->nlayers - 1)
        fmt = "expected log_softmax last only";
      else if (in < 2 || in > 65536) {
        fmt = "%d classes: expected 2 to %d";
        a = (int)in;
        b = 65536;
      }
      break;
    case PS_LT_SIGMOID:
      if (i != spec->nlayers - 1)
        fmt = "expected sigmoid last only";
      else if (in != 1) {
        fmt = "after a layer of %d outputs: expected 1 (the logit)";
        a = (int)in;
      }
      break;
    case PS_LT_EMBEDDING_BAG: {
      int nf = l->field_last - l->field_first + 1;
      if (l->name[0] == '\0' || strspn(l->name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST"
                                                 "UVWXYZ0123456789_") != strlen(l->name))
        fmt = "name: expected 1 to 31 of A-Z a-z 0-9 _ (it names the tables)";
      else if (l->field_first < 1 || nf < 1) {
        fmt = "fields [%d, %d]: expected first >= 1 and last >= first";
        a = l->field_first;
        b = l->field_last;
      } else if (l->dim < 1 || l->dim > PS_MODEL_MAX_DIM) {
        fmt = "dim %d: expected 1 to %d";
        a = l->dim;
        b = PS_MODEL_MAX_DIM;
      } else if (tables + nf > PS_MODEL_MAX_TABLES) {
        fmt = "%d tables in all: expected at most %d";
        a = tables + nf;
        b = PS_MODEL_MAX_TABLES;
      }
      for (int j = 0; j < i && fmt == NULL; j++) {
        const ps_layer_spec *o = &spec->layers[j];
        if (o->type == PS_LT_EMBEDDING_BAG && o->field_first <= l->field_last &&
            l->field_first <= o->field_last) {
          fmt = "a field already embedded by layer %d (field %d): expected each field in one table";
          a = j + 1;
          b = o->field_first > l->field_first ? o->field_first : l->field_first;
        }
      }
      if (fmt == NULL) {
        tables += nf;
        sh = (shape){(int)(in + (uint64_t)nf * (uint64_t)l->dim), 1, 1};
      }
      break;
    }
    default:
      fmt = "unknown layer type %d";
      a = (int)l->type;
    }
    if (fmt == NULL && (params > MAX_PARAMS || (uint64_t)sh.c * sh.h * sh.w > MAX_ACTIVATION))
      fmt = params > MAX_PARAMS ? "the model has more than 2^31 parameters"
                                : "its output has more than 2^26 values per sample";
    if (fmt != NULL)
      return layer_err(eb, what, i, l, fmt, a, b);
  }
  if (!trained)
    return ps_err_set(eb, PS_EUSAGE, "%s: no dense or conv2d layer: nothing to train", what);
  spec->classes = sh.c * sh.h * sh.w;
  if (spec->desc[0] == '\0') {
    /* Another network: its canonical text names its input and classes and
     * hashes the layers, whatever their number. */
    XXH64_state_t *h = XXH64_createState();
    if (h == NULL)
      return ps_err_set(eb, -ENOMEM, "%s: out of memory", what);
    XXH64_reset(h, 0);
    for (int i = 0; i < spec->nlayers; i++) {
      const ps_layer_spec *l = &spec->layers[i];
      char text[128];
      int n = snprintf(text, sizeof text, "%s %s %d %d %d %d %.9g %d;", ps_layer_type_name(l->type),
                       l->name, l->out, l->kernel, l->stride, l->padding, (double)l->p,
                       l->channels);
      XXH64_update(h, text, (size_t)n);
      if (l->type == PS_LT_EMBEDDING_BAG) {
        /* Everything that makes its tables what they are. */
        n = snprintf(text, sizeof text, "%d %d %d %d %d %.9g %.9g %s %u %u %" PRIu64 ";",
                     l->field_first, l->field_last, l->dim, l->combiner, l->init_kind,
                     (double)l->init_scale, (double)l->lr, l->optimizer, l->admit_after,
                     l->max_rows, l->idle_steps);
        XXH64_update(h, text, (size_t)n);
      }
    }
    snprintf(spec->desc, sizeof spec->desc, "model %dx%dx%d-%d #%016" PRIx64, spec->in_c,
             spec->in_h, spec->in_w, spec->classes, (uint64_t)XXH64_digest(h));
    XXH64_freeState(h);
  }
  return 0;
}

const char *ps_model_spec_format(const ps_model_spec *spec, char *buf, size_t len) {
  snprintf(buf, len, "%s", spec->desc);
  return buf;
}

/* --------------------------------------------------------------- layers */

typedef struct builder {
  ps_model *m;
  shape sh;  /* of the current activation */
  int err;
} builder;

static size_t cur_size(const builder *bd) { return (size_t)bd->sh.c * bd->sh.h * bd->sh.w; }

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

static void dense(builder *bd, const ps_layer_spec *s) {
  ps_layer *l = push(bd, PS_LAYER_DENSE);
  if (l == NULL)
    return;
  uint32_t w[2] = {(uint32_t)s->out, (uint32_t)l->in_size};
  add_params(bd, l, s->name, 2, w, (uint32_t)s->out, (uint32_t)l->in_size);
  l->out_c = s->out;
  bd->sh = (shape){s->out, 1, 1};
  l->out_size = cur_size(bd);
}

/* conv2d and maxpool: a window over the current activation. */
static void windowed(builder *bd, const ps_layer_spec *s) {
  int conv = s->type == PS_LT_CONV2D;
  ps_layer *l = push(bd, conv ? PS_LAYER_CONV2D : PS_LAYER_MAXPOOL2D);
  if (l == NULL)
    return;
  const shape in = bd->sh;
  ps_conv_geom g = {.c = in.c, .h = in.h, .w = in.w, .kh = s->kernel, .kw = s->kernel,
                    .stride = s->stride, .pad = s->padding,
                    .oh = window_out(in.h, s->kernel, s->stride, s->padding),
                    .ow = window_out(in.w, s->kernel, s->stride, s->padding)};
  l->geom = g;
  if (conv) {
    uint32_t w[4] = {(uint32_t)s->out, (uint32_t)in.c, (uint32_t)s->kernel, (uint32_t)s->kernel};
    add_params(bd, l, s->name, 4, w, (uint32_t)s->out,
               (uint32_t)(in.c * s->kernel * s->kernel));
    l->out_c = s->out;
  }
  bd->sh = (shape){conv ? s->out : in.c, g.oh, g.ow};
  l->out_size = cur_size(bd);
}

/* The tables of an embedding_bag, one per field, and the layer that
 * appends their pooled vectors to the activation. */
static void embedding_bag(builder *bd, const ps_layer_spec *s) {
  ps_layer *l = push(bd, PS_LAYER_CONCAT);
  if (l == NULL)
    return;
  ps_model *m = bd->m;
  l->emb_off = m->emb_size;
  for (int f = s->field_first; f <= s->field_last; f++) {
    ps_sparse_spec *t = &m->tables[m->ntables++];
    snprintf(t->name, sizeof t->name, "%s%d", s->name, f);
    t->field = f - 1;
    t->dim = s->dim;
    t->combiner = (ps_combiner)s->combiner;
    t->server_pool = s->server_pool;
    t->init_kind = s->init_kind;
    t->init_scale = s->init_scale;
    t->optim = ps_optim_default(PS_OPTIM_ADAGRAD, s->lr);
    if (ps_optim_parse(s->optimizer[0] ? s->optimizer : "adagrad", &t->optim) != 0)
      bd->err = -EINVAL;
    t->optim.lr = s->lr;
    t->admit_after = s->admit_after;
    t->max_rows = s->max_rows;
    t->idle_steps = s->idle_steps;
    t->offset = m->emb_size;
    m->emb_size += (size_t)s->dim;
  }
  l->emb_width = m->emb_size - l->emb_off;
  bd->sh = (shape){(int)(l->in_size + l->emb_width), 1, 1};
  l->out_size = cur_size(bd);
}

/* Dropout of whole channels (group = one channel's plane) or of single
 * values (group = 1). */
static void dropout(builder *bd, const ps_layer_spec *s) {
  ps_layer *l = push(bd, PS_LAYER_DROPOUT);
  if (l == NULL)
    return;
  l->p = s->p;
  l->group = s->channels ? (size_t)bd->sh.h * bd->sh.w : 1;
  l->out_size = l->in_size;
}

int ps_model_build(const ps_model_spec *spec, ps_model *m, ps_errbuf *eb) {
  memset(m, 0, sizeof *m);
  m->spec = *spec;
  ps_vartable_init(&m->vars);
  builder bd = {.m = m, .sh = {spec->in_c, spec->in_h, spec->in_w}};
  m->in_size = cur_size(&bd);
  for (int i = 0; i < spec->nlayers && bd.err == 0; i++) {
    const ps_layer_spec *s = &spec->layers[i];
    switch (s->type) {
    case PS_LT_DENSE: dense(&bd, s); break;
    case PS_LT_CONV2D:
    case PS_LT_MAXPOOL: windowed(&bd, s); break;
    case PS_LT_DROPOUT: dropout(&bd, s); break;
    case PS_LT_RELU: {
      ps_layer *l = push(&bd, PS_LAYER_RELU);
      if (l != NULL)
        l->out_size = l->in_size;
      break;
    }
    case PS_LT_FLATTEN:
      bd.sh = (shape){(int)cur_size(&bd), 1, 1};
      break;
    case PS_LT_EMBEDDING_BAG: embedding_bag(&bd, s); break;
    case PS_LT_LOG_SOFTMAX:
    case PS_LT_SIGMOID:
      break;  /* the loss's */
    }
  }
  if (bd.err == 0 && (m->nlayers == 0 || m->layers[m->nlayers - 1].out_size != (size_t)spec->classes))
    bd.err = -EINVAL;
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

/* A model that dense data (images, numpy files) can feed: layers, and no
 * sparse tables, whose embedding input only categorical fields fill (a
 * pass without it would read none).  @return 0 or PS_EUSAGE. */
static int dense_trainable(const ps_model *m, const char *data, ps_errbuf *eb) {
  const ps_model_spec *s = &m->spec;
  if (m->nlayers == 0)
    return ps_err_set(eb, PS_EUSAGE, "model '%s' has variables and no layers: expected [model] "
                      "name or file to train it here (variables train through the client "
                      "library)", s->desc);
  if (m->ntables > 0)
    return ps_err_set(eb, PS_EUSAGE, "model '%s' has sparse tables (%s..%s): it trains on "
                      "Criteo-format data ([data] format = criteo, paramserv train --train), "
                      "not on %s", s->desc, m->tables[0].name, m->tables[m->ntables - 1].name,
                      data);
  return 0;
}

int ps_model_check_data(const ps_model *m, uint32_t rows, uint32_t cols, int classes,
                        ps_errbuf *eb) {
  const ps_model_spec *s = &m->spec;
  int rc = dense_trainable(m, "images", eb);
  if (rc != 0)
    return rc;
  if (s->in_c != 1 || (uint32_t)s->in_h != rows || (uint32_t)s->in_w != cols)
    return ps_err_set(eb, PS_EUSAGE, "model '%s' takes %dx%dx%d inputs: expected 1x%ux%u, the "
                      "data set's images", s->desc, s->in_c, s->in_h, s->in_w, rows, cols);
  if (s->classes < classes)
    return ps_err_set(eb, PS_EUSAGE, "model '%s' has %d classes: expected at least %d, the data "
                      "set's labels", s->desc, s->classes, classes);
  return 0;
}

int ps_model_check_inputs(const ps_model *m, size_t dim, int classes, ps_errbuf *eb) {
  const ps_model_spec *s = &m->spec;
  int rc = dense_trainable(m, "numpy files", eb);
  if (rc != 0)
    return rc;
  if (m->in_size != dim)
    return ps_err_set(eb, PS_EUSAGE, "model '%s' takes %zu inputs (input %dx%dx%d): expected "
                      "%zu, the floats of a sample of the data", s->desc, m->in_size, s->in_c,
                      s->in_h, s->in_w, dim);
  if (s->classes == 1 && classes > 2)
    return ps_err_set(eb, PS_EUSAGE, "model '%s' has one output (sigmoid): expected labels 0 "
                      "and 1, the data's go up to %d", s->desc, classes - 1);
  if (s->classes > 1 && s->classes < classes)
    return ps_err_set(eb, PS_EUSAGE, "model '%s' has %d classes: expected at least %d, the "
                      "data's largest label + 1", s->desc, s->classes, classes);
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
    b->ops->free(b, ws->aux[i].conv_ws);
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
    size_t mask, idx, conv_ws;
    ps_layer_aux_sizes(l, b, max_batch, &mask, &idx, &conv_ws);
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
    if (conv_ws) {
      ws->aux[i].conv_ws = b->ops->alloc(b, conv_ws);
      failed |= ws->aux[i].conv_ws == NULL;
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
    const ps_layer *l = &m->layers[i];
    if (l->kind == PS_LAYER_CONCAT) {
      /* The activation, then the layer's slice of the embedding input. */
      ps_backend *b = ws->backend;
      b->ops->copy2d(b, n, l->in_size, ws->act[i], l->out_size, in, l->in_size);
      b->ops->copy2d(b, n, l->emb_width, ws->act[i] + l->in_size, l->out_size,
                     ws->emb + l->emb_off, m->emb_size);
    } else {
      ps_layer_forward(l, ws->backend, params, in, ws->act[i], n, &ws->aux[i], train, layer_seed,
                       first);
    }
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
  while (lowest < m->nlayers && m->layers[lowest].wvar < 0 &&
         m->layers[lowest].kind != PS_LAYER_CONCAT)
    lowest++;
  for (int i = m->nlayers - 1; i >= lowest; i--) {
    const ps_layer *l = &m->layers[i];
    const float *in = i > 0 ? ws->act[i - 1] : x;
    float *dx = i > lowest ? bufs[i & 1] : NULL;
    if (l->kind == PS_LAYER_CONCAT) {
      /* The input's part of dy goes down; the rest is the embedding's. */
      if (dx != NULL)
        b->ops->copy2d(b, n, l->in_size, dx, l->in_size, dy, l->out_size);
      b->ops->copy2d(b, n, l->emb_width, ws->demb + l->emb_off, m->emb_size, dy + l->in_size,
                     l->out_size);
    } else {
      ps_layer_backward(l, b, params, in, ws->act[i], dy, dx, grads, n, &ws->aux[i]);
    }
    dy = dx;
  }
  return loss;
}
