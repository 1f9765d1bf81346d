/* Optimizers as pure functions over one float slice, its gradient and its
 * slot arrays, so that a shard can apply them to whatever slice it holds. */
#ifndef PS_OPTIM_OPTIM_H
#define PS_OPTIM_OPTIM_H

#include <stddef.h>
#include <stdint.h>

typedef enum ps_optim_kind {
  PS_OPTIM_SGD = 0,
  PS_OPTIM_MOMENTUM,
  PS_OPTIM_ADAGRAD,
  PS_OPTIM_ADAM,
} ps_optim_kind;

#define PS_OPTIM_MAX_SLOTS 2

typedef struct ps_optim {
  ps_optim_kind kind;
  float lr;            /* base learning rate */
  float momentum;      /* momentum: coefficient (default 0.9) */
  int nesterov;        /* momentum: 1 = Nesterov's update */
  float beta1, beta2;  /* adam: defaults 0.9, 0.999 */
  float eps;           /* adam default 1e-8, adagrad default 1e-10 */
  float initial_accumulator; /* adagrad: starting value of its slot (default 0.1) */
  float weight_decay;  /* L2 added to the gradient: g + wd * w (default 0) */
} ps_optim;

/* Defaults for `kind` with learning rate `lr`.  Every field is filled, also
 * those `kind` does not use: momentum 0.9, nesterov 0, beta1 0.9, beta2 0.999,
 * eps 1e-10 for adagrad and 1e-8 otherwise, initial_accumulator 0.1, wd 0. */
ps_optim ps_optim_default(ps_optim_kind kind, float lr);

/* "sgd|momentum|nesterov|adagrad|adam" (exact, case-sensitive) -> kind
 * ("nesterov" is PS_OPTIM_MOMENTUM with o->nesterov = 1).  Every field but
 * o->lr is reset to ps_optim_default() for that kind, so set momentum, eps,
 * weight_decay, ... after parsing the name.
 * @return 0, or PS_EUSAGE for any other name (or NULL), leaving *o as it was. */
int ps_optim_parse(const char *name, ps_optim *o);

/* The name ps_optim_parse() takes for *o ("nesterov" for momentum with
 * nesterov set).  A static string, never NULL ("unknown" for a bad kind). */
const char *ps_optim_name(const ps_optim *o);

/* Number of slot arrays (each as long as the slice): 0, 1, 1, 2. */
int ps_optim_nslots(ps_optim_kind kind);

/* Initial value of slot `i` (adagrad's accumulator starts at
 * initial_accumulator, every other slot at 0). */
float ps_optim_slot_init(const ps_optim *o, int i);

/* Apply one update to w[0..n) with gradient g and slots (the exact rules are
 * in src/optim/README.md).
 * `lr` is the learning rate for this step (the schedule's value); o->lr is
 * not read.  `t` is the 1-based count of updates applied to this slice
 * including this one (adam's bias correction; 0 is taken as 1).
 * slots[i] has n floats each, for i < ps_optim_nslots(o->kind); `slots` may
 * be NULL when that is 0.  w, g and the slot arrays must not overlap.
 * Nothing is allocated or kept after the call. */
void ps_optim_apply(const ps_optim *o, float lr, uint64_t t, float *w, const float *g,
                    float *const *slots, size_t n);

/* The constants of one update as ps_optim_apply derives them from o, lr and
 * t (adam's bias corrections in double, rounded to float once), for code
 * that runs the same rules elsewhere (nn/backend.h's optim op on a GPU) and
 * must match ps_optim_apply to the bit. */
typedef struct ps_optim_coef {
  float lr, mu, eps;    /* the step's rate, momentum, eps */
  float wd;             /* weight decay; 0: the gradient is used as it is */
  float b1, b2, c1, c2; /* adam: beta1, beta2, 1 - beta1, 1 - beta2 */
  float step;           /* adam: lr / (1 - beta1^t) */
  float inv_sqrt_bc2;   /* adam: 1 / sqrt(1 - beta2^t) */
} ps_optim_coef;

ps_optim_coef ps_optim_coefs(const ps_optim *o, float lr, uint64_t t);

/* Learning-rate schedules over the global step. */
typedef enum ps_sched_kind {
  PS_SCHED_CONSTANT = 0,
  PS_SCHED_STEP,    /* lr * gamma^(floor(step / step_size)) */
  PS_SCHED_COSINE,  /* lr * (min + (1-min) * (1 + cos(pi * step / total)) / 2) */
} ps_sched_kind;

typedef struct ps_sched {
  ps_sched_kind kind;
  uint64_t step_size;  /* step: steps between decays */
  float gamma;         /* step: factor per decay */
  uint64_t total;      /* cosine: steps to the end */
  float min_factor;    /* cosine: floor as a fraction of lr (default 0) */
  uint64_t warmup;     /* linear warm-up steps before either schedule (default 0) */
} ps_sched;

/* "constant|step|cosine" -> s->kind; the other fields are kept.
 * @return 0, or PS_EUSAGE for any other name (or NULL), leaving *s as it was. */
int ps_sched_parse(const char *name, ps_sched *s);

/* A static string, never NULL ("unknown" for a bad kind). */
const char *ps_sched_name(const ps_sched *s);

/* The schedule a cluster's [train] settings name (schedule, decay_steps,
 * decay_gamma; cosine over last_step), as its shards and workers run it. */
struct ps_config;
ps_sched ps_sched_of_config(const struct ps_config *c);

/* Learning rate at 0-based global step `step`.  For step < warmup it is
 * base_lr * (step + 1) / warmup; after that the schedule runs on
 * k = step - warmup.  step: step_size 0 means no decay.  cosine: runs over
 * total - warmup steps (total counts the warm-up) and stays at
 * base_lr * min_factor from step total on; total <= warmup means the floor
 * right after warm-up. */
float ps_sched_lr(const ps_sched *s, float base_lr, uint64_t step);

#endif
