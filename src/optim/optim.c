/* Optimizer updates and learning-rate schedules over one float slice (see optim.h). */
#include "optim/optim.h"

#include <math.h>
#include <string.h>

#include "common/config.h"
#include "paramserv/error.h"

/* ------------------------------------------------------------------------ */
/* Update kernels                                                            */
/* ------------------------------------------------------------------------ */

/* gcc -O2 (gcc 12's "very cheap" vectorizer cost model) vectorizes a loop only
 * when it can prove that the trip count is a multiple of the vector width and
 * that the arrays do not overlap.  So every kernel takes `nblk` blocks of
 * BLOCK floats and restrict pointers, and run_kernel() below feeds it the
 * slice in whole blocks, sending the last partial block through zero-padded
 * copies.  BLOCK covers the widest vector (AVX-512: 16 floats).  Adagrad's and
 * Adam's loops also need -fno-math-errno: without it every sqrtf keeps a
 * branch that may call libm to set errno, and that branch stops the vectorizer
 * (no function attribute or pragma lifts it in gcc 12). */
#define BLOCK 16

/* Per-call constants (ps_optim_coefs), computed once so the loops do no
 * per-element pow. */
typedef ps_optim_coef kcoef;

typedef void (*kernel_fn)(const kcoef *c, float *restrict w, const float *restrict g,
                          float *restrict s0, float *restrict s1, size_t nblk);

static void sgd_kernel(const kcoef *c, float *restrict w, const float *restrict g,
                       float *restrict s0, float *restrict s1, size_t nblk) {
  (void)s0, (void)s1;
  const float lr = c->lr;
  for (size_t i = 0; i < nblk * BLOCK; i++)
    w[i] -= lr * g[i];
}

static void momentum_kernel(const kcoef *c, float *restrict w, const float *restrict g,
                            float *restrict v, float *restrict s1, size_t nblk) {
  (void)s1;
  const float lr = c->lr, mu = c->mu;
  for (size_t i = 0; i < nblk * BLOCK; i++) {
    v[i] = mu * v[i] + g[i];
    w[i] -= lr * v[i];
  }
}

static void nesterov_kernel(const kcoef *c, float *restrict w, const float *restrict g,
                            float *restrict v, float *restrict s1, size_t nblk) {
  (void)s1;
  const float lr = c->lr, mu = c->mu;
  for (size_t i = 0; i < nblk * BLOCK; i++) {
    v[i] = mu * v[i] + g[i];
    w[i] -= lr * (g[i] + mu * v[i]);
  }
}

static void adagrad_kernel(const kcoef *c, float *restrict w, const float *restrict g,
                           float *restrict acc, float *restrict s1, size_t nblk) {
  (void)s1;
  const float lr = c->lr, eps = c->eps;
  for (size_t i = 0; i < nblk * BLOCK; i++) {
    acc[i] += g[i] * g[i];
    w[i] -= lr * g[i] / (sqrtf(acc[i]) + eps);
  }
}

/* sqrt(vhat) is sqrt(v) / sqrt(1 - beta2^t), as PyTorch computes it, so that
 * the bias corrections cost one multiply per element. */
static void adam_kernel(const kcoef *c, float *restrict w, const float *restrict g,
                        float *restrict m, float *restrict v, size_t nblk) {
  const float b1 = c->b1, b2 = c->b2, c1 = c->c1, c2 = c->c2;
  const float step = c->step, isb = c->inv_sqrt_bc2, eps = c->eps;
  for (size_t i = 0; i < nblk * BLOCK; i++) {
    m[i] = b1 * m[i] + c1 * g[i];
    v[i] = b2 * v[i] + c2 * g[i] * g[i];
    w[i] -= step * m[i] / (sqrtf(v[i]) * isb + eps);
  }
}

/* L2 weight decay folded into the gradient, for one chunk. */
static void decay_gradient(float *restrict out, const float *restrict g, const float *restrict w,
                           float wd, size_t nblk) {
  for (size_t i = 0; i < nblk * BLOCK; i++)
    out[i] = g[i] + wd * w[i];
}

/* Floats per chunk: the decayed gradient of one chunk lives on the stack,
 * small enough to stay in L1 between the two passes. */
#define CHUNK 1024

/* Apply `k` to w[0..n).  Weight decay goes through a chunk buffer rather than
 * into the kernels, so that each kernel stays one loop with no branch, and
 * the loop without decay does no extra work. */
static void run_kernel(kernel_fn k, const kcoef *c, float wd, float *w, const float *g,
                       float *s0, float *s1, size_t n) {
  float gd[CHUNK];
  size_t bulk = n - n % BLOCK;

  for (size_t off = 0; off < bulk; off += CHUNK) {
    size_t nblk = (bulk - off < CHUNK ? bulk - off : CHUNK) / BLOCK;
    const float *gp = g + off;
    if (wd != 0.0f) {
      decay_gradient(gd, gp, w + off, wd, nblk);
      gp = gd;
    }
    k(c, w + off, gp, s0 ? s0 + off : NULL, s1 ? s1 + off : NULL, nblk);
  }

  if (bulk < n) {
    /* Only the first r lanes are copied back; the zero padding exists so
     * that the tail runs the same vector code as the bulk. */
    size_t r = n - bulk, bytes = r * sizeof(float);
    float tw[BLOCK] = {0}, tg[BLOCK] = {0}, t0[BLOCK] = {0}, t1[BLOCK] = {0};
    memcpy(tw, w + bulk, bytes);
    memcpy(tg, g + bulk, bytes);
    if (s0)
      memcpy(t0, s0 + bulk, bytes);
    if (s1)
      memcpy(t1, s1 + bulk, bytes);
    const float *gp = tg;
    if (wd != 0.0f) {
      decay_gradient(gd, tg, tw, wd, 1);
      gp = gd;
    }
    k(c, tw, gp, t0, t1, 1);
    memcpy(w + bulk, tw, bytes);
    if (s0)
      memcpy(s0 + bulk, t0, bytes);
    if (s1)
      memcpy(s1 + bulk, t1, bytes);
  }
}

/* ------------------------------------------------------------------------ */
/* Optimizers                                                                */
/* ------------------------------------------------------------------------ */

ps_optim ps_optim_default(ps_optim_kind kind, float lr) {
  return (ps_optim){
      .kind = kind,
      .lr = lr,
      .momentum = 0.9f,
      .nesterov = 0,
      .beta1 = 0.9f,
      .beta2 = 0.999f,
      /* Adagrad's eps is PyTorch's; its accumulator starts at 0.1 (as in
       * TensorFlow), so eps only guards an accumulator restored as 0. */
      .eps = kind == PS_OPTIM_ADAGRAD ? 1e-10f : 1e-8f,
      .initial_accumulator = 0.1f,
      .weight_decay = 0.0f,
  };
}

static const struct {
  const char *name;
  ps_optim_kind kind;
  int nesterov;
} optim_names[] = {
    {"sgd", PS_OPTIM_SGD, 0},         {"momentum", PS_OPTIM_MOMENTUM, 0},
    {"nesterov", PS_OPTIM_MOMENTUM, 1}, {"adagrad", PS_OPTIM_ADAGRAD, 0},
    {"adam", PS_OPTIM_ADAM, 0},
};

int ps_optim_parse(const char *name, ps_optim *o) {
  if (name == NULL || o == NULL)
    return PS_EUSAGE;
  for (size_t i = 0; i < sizeof optim_names / sizeof optim_names[0]; i++) {
    if (strcmp(name, optim_names[i].name) == 0) {
      *o = ps_optim_default(optim_names[i].kind, o->lr);
      o->nesterov = optim_names[i].nesterov;
      return 0;
    }
  }
  return PS_EUSAGE;
}

const char *ps_optim_name(const ps_optim *o) {
  switch (o->kind) {
  case PS_OPTIM_SGD:
    return "sgd";
  case PS_OPTIM_MOMENTUM:
    return o->nesterov ? "nesterov" : "momentum";
  case PS_OPTIM_ADAGRAD:
    return "adagrad";
  case PS_OPTIM_ADAM:
    return "adam";
  }
  return "unknown";
}

int ps_optim_nslots(ps_optim_kind kind) {
  switch (kind) {
  case PS_OPTIM_SGD:
    return 0;
  case PS_OPTIM_MOMENTUM:
  case PS_OPTIM_ADAGRAD:
    return 1;
  case PS_OPTIM_ADAM:
    return 2;
  }
  return 0;
}

float ps_optim_slot_init(const ps_optim *o, int i) {
  if (o->kind == PS_OPTIM_ADAGRAD && i == 0)
    return o->initial_accumulator;
  return 0.0f;
}

ps_optim_coef ps_optim_coefs(const ps_optim *o, float lr, uint64_t t) {
  kcoef c = {.lr = lr, .mu = o->momentum, .eps = o->eps, .wd = o->weight_decay};
  if (o->kind == PS_OPTIM_ADAM) {
    /* t = 0 would divide by 1 - beta^0 = 0; a caller that has not counted
     * this update yet gets the first step's correction, not infinities. */
    double tt = t == 0 ? 1.0 : (double)t;
    double bc1 = 1.0 - pow(o->beta1, tt);
    double bc2 = 1.0 - pow(o->beta2, tt);
    c.b1 = o->beta1;
    c.b2 = o->beta2;
    c.c1 = 1.0f - o->beta1;
    c.c2 = 1.0f - o->beta2;
    c.step = (float)(lr / bc1);
    c.inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
  }
  return c;
}

void ps_optim_apply(const ps_optim *o, float lr, uint64_t t, float *w, const float *g,
                    float *const *slots, size_t n) {
  kcoef c = ps_optim_coefs(o, lr, t);
  kernel_fn k;
  float *s0 = NULL, *s1 = NULL;

  switch (o->kind) {
  case PS_OPTIM_SGD:
    k = sgd_kernel;
    break;
  case PS_OPTIM_MOMENTUM:
    k = o->nesterov ? nesterov_kernel : momentum_kernel;
    s0 = slots[0];
    break;
  case PS_OPTIM_ADAGRAD:
    k = adagrad_kernel;
    s0 = slots[0];
    break;
  case PS_OPTIM_ADAM:
    k = adam_kernel;
    s0 = slots[0];
    s1 = slots[1];
    break;
  default:
    return;
  }
  run_kernel(k, &c, c.wd, w, g, s0, s1, n);
}

/* ------------------------------------------------------------------------ */
/* Learning-rate schedules                                                   */
/* ------------------------------------------------------------------------ */

static const char *const sched_names[] = {
    [PS_SCHED_CONSTANT] = "constant",
    [PS_SCHED_STEP] = "step",
    [PS_SCHED_COSINE] = "cosine",
};

int ps_sched_parse(const char *name, ps_sched *s) {
  if (name == NULL || s == NULL)
    return PS_EUSAGE;
  for (size_t i = 0; i < sizeof sched_names / sizeof sched_names[0]; i++) {
    if (strcmp(name, sched_names[i]) == 0) {
      s->kind = (ps_sched_kind)i;
      return 0;
    }
  }
  return PS_EUSAGE;
}

const char *ps_sched_name(const ps_sched *s) {
  if ((unsigned)s->kind < sizeof sched_names / sizeof sched_names[0])
    return sched_names[s->kind];
  return "unknown";
}

float ps_sched_lr(const ps_sched *s, float base_lr, uint64_t step) {
  /* The (step+1) makes the first warm-up step train rather than waste a
   * batch at lr 0, and the last one reach base_lr exactly. */
  if (step < s->warmup)
    return (float)((double)base_lr * (double)(step + 1) / (double)s->warmup);
  uint64_t k = step - s->warmup;

  switch (s->kind) {
  case PS_SCHED_CONSTANT:
    return base_lr;

  case PS_SCHED_STEP:
    if (s->step_size == 0)
      return base_lr;
    return (float)((double)base_lr * pow(s->gamma, (double)(k / s->step_size)));

  case PS_SCHED_COSINE: {
    uint64_t span = s->total > s->warmup ? s->total - s->warmup : 0;
    double mn = s->min_factor;
    /* Past the end the rate stays at the floor instead of climbing back up
     * the next half-period of the cosine. */
    if (k >= span)
      return (float)((double)base_lr * mn);
    double c = (1.0 + cos(M_PI * (double)k / (double)span)) / 2.0;
    return (float)((double)base_lr * (mn + (1.0 - mn) * c));
  }
  }
  return base_lr;
}

ps_sched ps_sched_of_config(const ps_config *c) {
  ps_sched s = {.kind = PS_SCHED_CONSTANT};
  ps_sched_parse(c->schedule, &s);
  s.step_size = c->decay_steps > 0 ? (uint64_t)c->decay_steps : 0;
  s.gamma = (float)c->decay_gamma;
  s.total = c->last_step > 0 ? (uint64_t)c->last_step : 0;
  return s;
}
