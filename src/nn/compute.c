/* Batch-parallel gradient computation on the CPU, whole batches on a GPU
 * (see compute.h). */
#include "nn/compute.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/parse.h"
#include "common/pool.h"

typedef struct slot {
  ps_backend *backend;
  ps_model_ws ws;
  float *grad;     /* this slot's gradient; NULL: it writes the caller's */
  double loss;
  size_t correct;
} slot;

struct ps_compute {
  const ps_model *m;
  ps_pool *pool;
  int threads, max_batch;
  slot *slots;
  /* A device backend's copies of a step's params and batch (NULL when the
   * backend computes on host memory, which then reads the caller's). */
  float *dev_params, *dev_x;
  float *dev_emb, *dev_demb;  /* a model with sparse tables: its embedding input and gradient */
  /* ps_compute_train_init's: the kept parameters, their gradient (slot
   * 0's on a device; grad_owned when allocated here) and the optimizer's
   * slots, all in slot 0's backend memory. */
  float *own_params, *own_grad, *own_slots[PS_OPTIM_MAX_SLOTS];
  int grad_owned;
  ps_optim optim;
  /* The current job, read by every thread. */
  const float *params, *x;
  const float *emb;   /* the embedding input, n x emb_size (NULL: the model has none) */
  float *demb;        /* its gradient (train) */
  float *scores;      /* predict: host, n */
  const uint8_t *labels;
  int n, train;
  uint64_t seed, first;
  float *grad;
};

void ps_compute_free(ps_compute *c) {
  if (c == NULL)
    return;
  ps_pool_free(c->pool);
  if (c->slots != NULL && c->slots[0].backend != NULL) {
    ps_backend *b = c->slots[0].backend;
    b->ops->free(b, c->own_params);
    if (c->grad_owned)
      b->ops->free(b, c->own_grad);
    for (int i = 0; i < PS_OPTIM_MAX_SLOTS; i++)
      b->ops->free(b, c->own_slots[i]);
  }
  if (c->slots != NULL)
    for (int t = 0; t < c->threads; t++) {
      slot *s = &c->slots[t];
      if (s->backend != NULL) {
        s->backend->ops->free(s->backend, s->grad);
        if (t == 0) {
          s->backend->ops->free(s->backend, c->dev_params);
          s->backend->ops->free(s->backend, c->dev_x);
          s->backend->ops->free(s->backend, c->dev_emb);
          s->backend->ops->free(s->backend, c->dev_demb);
        }
        ps_model_ws_close(&s->ws);
        ps_backend_free(s->backend);
      }
    }
  free(c->slots);
  free(c);
}

ps_compute *ps_compute_new(const ps_model *m, int threads, int max_batch, ps_errbuf *eb) {
  return ps_compute_new_on(m, PS_DEVICE_CPU, threads, max_batch, eb);
}

ps_compute *ps_compute_new_on(const ps_model *m, int device, int threads, int max_batch,
                              ps_errbuf *eb) {
  /* A GPU runs the whole batch on one backend: threads would only split it
   * into smaller, slower launches on the same device. */
  if (device >= 0)
    threads = 1;
  if (threads < 1 || max_batch < 1) {
    ps_err_set(eb, PS_EUSAGE, "compute: threads %d and batch %d must both be at least 1",
               threads, max_batch);
    return NULL;
  }
  ps_compute *c = calloc(1, sizeof *c);
  if (c == NULL)
    goto nomem;
  c->m = m;
  c->threads = threads;
  c->max_batch = max_batch;
  c->slots = calloc((size_t)threads, sizeof *c->slots);
  if (c->slots == NULL)
    goto nomem;
  int per = (max_batch + threads - 1) / threads;
  size_t grad_bytes = m->vars.total * sizeof(float);
  for (int t = 0; t < threads; t++) {
    slot *s = &c->slots[t];
    s->backend = ps_backend_new(device, eb);
    if (s->backend == NULL) {
      ps_compute_free(c);
      return NULL;
    }
    ps_backend *b = s->backend;
    if (ps_model_ws_init(&s->ws, m, b, per) != 0)
      goto nomem;
    if (t > 0 || !b->host_memory) {
      s->grad = b->ops->alloc(b, grad_bytes);
      if (s->grad == NULL)
        goto nomem;
    }
    if (!b->host_memory) {
      c->dev_params = b->ops->alloc(b, grad_bytes);
      c->dev_x = b->ops->alloc(b, (size_t)max_batch * m->in_size * sizeof(float));
      if (c->dev_params == NULL || c->dev_x == NULL)
        goto nomem;
      if (m->emb_size > 0) {
        size_t bytes = (size_t)max_batch * m->emb_size * sizeof(float);
        c->dev_emb = b->ops->alloc(b, bytes);
        c->dev_demb = b->ops->alloc(b, bytes);
        if (c->dev_emb == NULL || c->dev_demb == NULL)
          goto nomem;
      }
    }
  }
  c->pool = ps_pool_new(threads);
  if (c->pool == NULL)
    goto nomem;
  return c;
nomem:
  ps_compute_free(c);
  ps_err_set(eb, -ENOMEM, "compute: out of %s memory for %d threads at batch %d",
             device >= 0 ? "GPU" : "host", threads, max_batch);
  return NULL;
}

int ps_compute_threads(const ps_compute *c) { return c->threads; }

const char *ps_compute_describe(const ps_compute *c) {
  ps_backend *b = c->slots[0].backend;
  return b->ops->describe(b);
}

void *ps_compute_host_alloc(ps_compute *c, size_t bytes) {
  ps_backend *b = c->slots[0].backend;
  if (b->ops->host_alloc != NULL)
    return b->ops->host_alloc(b, bytes);
  return malloc(bytes ? bytes : 1);
}

void ps_compute_host_free(ps_compute *c, void *p) {
  if (p == NULL)
    return;
  ps_backend *b = c->slots[0].backend;
  if (b->ops->host_free != NULL)
    b->ops->host_free(b, p);
  else
    free(p);
}

/* Thread t's part of the batch: [lo, hi), parts differ by at most one. */
static void part(int n, int t, int nt, int *lo, int *hi) {
  *lo = (int)((long)n * t / nt);
  *hi = (int)((long)n * (t + 1) / nt);
}

/* On a device, the job reads the device's copies: the params (when given)
 * and n samples of x go over now, queued before the passes that use them. */
static void stage_in(ps_compute *c, const float *params, const float *x, int n) {
  if (c->dev_params == NULL)
    return;
  ps_backend *b = c->slots[0].backend;
  if (params != NULL) {
    b->ops->to_device(b, c->dev_params, params, c->m->vars.total * sizeof(float));
    c->params = c->dev_params;
  }
  b->ops->to_device(b, c->dev_x, x, (size_t)n * c->m->in_size * sizeof(float));
  c->x = c->dev_x;
  if (c->emb != NULL) {
    b->ops->to_device(b, c->dev_emb, c->emb, (size_t)n * c->m->emb_size * sizeof(float));
    c->emb = c->dev_emb;
  }
}

static void grad_job(void *arg, int t, int nt) {
  ps_compute *c = arg;
  slot *s = &c->slots[t];
  int lo, hi;
  part(c->n, t, nt, &lo, &hi);
  s->loss = 0.0;
  s->correct = 0;
  float *g = s->grad != NULL ? s->grad : c->grad;
  if (hi == lo) {
    /* An empty slice contributes a zero gradient to the sum. */
    if (c->train)
      s->backend->ops->zero(s->backend, g, c->m->vars.total);
    return;
  }
  const float *x = c->x + (size_t)lo * c->m->in_size;
  if (c->emb != NULL) {
    s->ws.emb = c->emb + (size_t)lo * c->m->emb_size;
    s->ws.demb = c->demb != NULL ? c->demb + (size_t)lo * c->m->emb_size : NULL;
  }
  ps_model_forward(c->m, &s->ws, c->params, x, hi - lo, c->train, c->seed, c->first + lo);
  if (c->scores != NULL) {
    /* predict: the logits, which the caller turns into probabilities. */
    s->backend->ops->to_host(s->backend, c->scores + lo, s->ws.act[c->m->nlayers - 1],
                             (size_t)(hi - lo) * sizeof(float));
    return;
  }
  if (c->train)
    s->loss = ps_model_backward(c->m, &s->ws, c->params, x, c->labels + lo, hi - lo,
                                1.0f / (float)c->n, g, &s->correct);
  else
    s->loss = s->backend->ops->nll(s->backend, hi - lo, c->m->spec.classes,
                                   s->ws.act[c->m->nlayers - 1], c->labels + lo, 0.0f, NULL,
                                   &s->correct);
}

/* Sum the threads' gradients into the caller's, each thread a range. */
static void reduce_job(void *arg, int t, int nt) {
  ps_compute *c = arg;
  int lo, hi;
  size_t total = c->m->vars.total;
  /* Ranges in units of 16 floats keep each thread on its own cache lines. */
  part((int)((total + 15) / 16), t, nt, &lo, &hi);
  size_t a = (size_t)lo * 16, b = (size_t)hi * 16;
  if (b > total)
    b = total;
  if (a >= b)
    return;
  ps_backend *be = c->slots[t].backend;
  for (int s = 1; s < c->threads; s++)
    be->ops->add(be, b - a, c->slots[s].grad + a, c->grad + a);
}

/* The gradient of the batch's mean loss, on params (backend memory, or
 * host memory to stage in when stage_params), into grad: the caller's
 * (host) for ps_compute_grad, the kept one for a training step.  @return
 * the mean loss. */
static double grad_pass(ps_compute *c, const float *params, int stage_params, const float *x,
                        const uint8_t *labels, int n, uint64_t seed, uint64_t first, float *grad,
                        size_t *correct) {
  c->params = params;
  c->x = x;
  c->scores = NULL;
  c->labels = labels;
  c->n = n;
  c->train = 1;
  c->seed = seed;
  c->first = first;
  c->grad = grad;
  stage_in(c, stage_params ? params : NULL, x, n);
  ps_pool_run(c->pool, grad_job, c);
  if (c->threads > 1)
    ps_pool_run(c->pool, reduce_job, c);
  double loss = 0.0;
  for (int t = 0; t < c->threads; t++) {
    loss += c->slots[t].loss;
    if (correct != NULL)
      *correct += c->slots[t].correct;
  }
  return loss / n;
}

double ps_compute_grad(ps_compute *c, const float *params, const float *x,
                       const uint8_t *labels, int n, uint64_t seed, uint64_t first,
                       float *grad, size_t *correct) {
  c->emb = NULL;
  c->demb = NULL;
  double loss = grad_pass(c, params, 1, x, labels, n, seed, first, grad, correct);
  if (c->dev_params != NULL) {
    ps_backend *b = c->slots[0].backend;
    b->ops->to_host(b, grad, c->slots[0].grad, c->m->vars.total * sizeof(float));
  }
  return loss;
}

double ps_compute_grad_emb(ps_compute *c, const float *params, const float *x,
                           const float *emb, const uint8_t *labels, int n, uint64_t seed,
                           uint64_t first, float *grad, float *demb, size_t *correct) {
  c->emb = emb;
  /* On a device the gradient lands in its copy, then comes over. */
  c->demb = c->dev_demb != NULL ? c->dev_demb : demb;
  double loss = grad_pass(c, params, 1, x, labels, n, seed, first, grad, correct);
  if (c->dev_params != NULL) {
    ps_backend *b = c->slots[0].backend;
    b->ops->to_host(b, grad, c->slots[0].grad, c->m->vars.total * sizeof(float));
    b->ops->to_host(b, demb, c->dev_demb, (size_t)n * c->m->emb_size * sizeof(float));
  }
  c->emb = NULL;
  c->demb = NULL;
  return loss;
}

void ps_compute_predict(ps_compute *c, const float *params, const float *x, const float *emb,
                        int n, float *prob) {
  for (int done = 0; done < n;) {
    int chunk = n - done < c->max_batch ? n - done : c->max_batch;
    c->params = params;
    c->x = x + (size_t)done * c->m->in_size;
    c->emb = emb != NULL ? emb + (size_t)done * c->m->emb_size : NULL;
    c->demb = NULL;
    c->scores = prob + done;
    c->n = chunk;
    c->train = 0;
    stage_in(c, params, c->x, chunk);
    ps_pool_run(c->pool, grad_job, c);
    done += chunk;
  }
  for (int i = 0; i < n; i++)
    prob[i] = 1.0f / (1.0f + expf(-prob[i]));
  c->scores = NULL;
  c->emb = NULL;
}

double ps_compute_eval(ps_compute *c, const float *params, const float *x,
                       const uint8_t *labels, size_t n, size_t *correct) {
  double loss = 0.0;
  size_t right = 0;
  c->emb = NULL;
  c->demb = NULL;
  c->scores = NULL;
  c->params = params != NULL ? params : c->own_params;
  c->train = 0;
  for (size_t done = 0; done < n;) {
    int chunk = (int)(n - done < (size_t)c->max_batch ? n - done : (size_t)c->max_batch);
    c->x = x + done * c->m->in_size;
    c->labels = labels + done;
    c->n = chunk;
    /* The params go over once, with the first chunk. */
    stage_in(c, done == 0 ? params : NULL, c->x, chunk);
    ps_pool_run(c->pool, grad_job, c);
    for (int t = 0; t < c->threads; t++) {
      loss += c->slots[t].loss;
      right += c->slots[t].correct;
    }
    done += (size_t)chunk;
  }
  *correct = right;
  return n ? loss / (double)n : 0.0;
}

/* Backend memory of n floats, all `value`. */
static float *alloc_filled(ps_backend *b, size_t n, float value) {
  float *p = b->ops->alloc(b, n * sizeof *p);
  if (p == NULL || value == 0.0f) {
    if (p != NULL)
      b->ops->zero(b, p, n);
    return p;
  }
  float *h = malloc(n * sizeof *h);
  if (h == NULL) {
    b->ops->free(b, p);
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    h[i] = value;
  b->ops->to_device(b, p, h, n * sizeof *h);
  /* backend.h: h must stay as it is until a to_host returns. */
  float one;
  b->ops->to_host(b, &one, p, sizeof one);
  free(h);
  return p;
}

int ps_compute_train_init(ps_compute *c, const float *params, const ps_optim *o) {
  ps_backend *b = c->slots[0].backend;
  size_t total = c->m->vars.total;
  c->optim = *o;
  if (c->own_params == NULL) {
    c->own_params = b->ops->alloc(b, total * sizeof(float));
    if (c->own_params == NULL)
      return -ENOMEM;
  }
  if (c->own_grad == NULL) {
    /* On a device slot 0 has a gradient of its own, which the step uses;
     * on the CPU it writes the caller's: this one. */
    c->grad_owned = c->slots[0].grad == NULL;
    c->own_grad = c->grad_owned ? b->ops->alloc(b, total * sizeof(float)) : c->slots[0].grad;
    if (c->own_grad == NULL)
      return -ENOMEM;
  }
  for (int i = 0; i < PS_OPTIM_MAX_SLOTS; i++) {
    b->ops->free(b, c->own_slots[i]);
    c->own_slots[i] = NULL;
  }
  for (int i = 0; i < ps_optim_nslots(o->kind); i++) {
    c->own_slots[i] = alloc_filled(b, total, ps_optim_slot_init(o, i));
    if (c->own_slots[i] == NULL)
      return -ENOMEM;
  }
  b->ops->to_device(b, c->own_params, params, total * sizeof(float));
  return 0;
}

double ps_compute_train_step(ps_compute *c, const float *x, const uint8_t *labels, int n,
                             uint64_t seed, uint64_t first, float lr, uint64_t t,
                             size_t *correct) {
  double loss = grad_pass(c, c->own_params, 0, x, labels, n, seed, first, c->own_grad, correct);
  ps_backend *b = c->slots[0].backend;
  b->ops->optim(b, &c->optim, lr, t, c->own_params, c->own_grad, c->own_slots,
                c->m->vars.total);
  return loss;
}

void ps_compute_train_params(ps_compute *c, float *params) {
  ps_backend *b = c->slots[0].backend;
  b->ops->to_host(b, params, c->own_params, c->m->vars.total * sizeof(float));
}

void ps_compute_train_slots(ps_compute *c, float *const *slots) {
  ps_backend *b = c->slots[0].backend;
  for (int i = 0; i < ps_optim_nslots(c->optim.kind); i++)
    b->ops->to_host(b, slots[i], c->own_slots[i], c->m->vars.total * sizeof(float));
}

void ps_compute_train_load_slots(ps_compute *c, const float *const *slots) {
  ps_backend *b = c->slots[0].backend;
  for (int i = 0; i < ps_optim_nslots(c->optim.kind); i++)
    b->ops->to_device(b, c->own_slots[i], slots[i], c->m->vars.total * sizeof(float));
}
