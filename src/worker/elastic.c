/* A worker's own replica for averaging and EASGD (see elastic.h). */
#include "worker/elastic.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ps_elastic_init(ps_elastic *e, const ps_config *cfg, size_t n) {
  memset(e, 0, sizeof *e);
  e->algorithm = cfg->algorithm;
  e->alpha = cfg->easgd_alpha > 0 ? (float)cfg->easgd_alpha : 0.9f / (float)cfg->nworkers;
  e->optim = ps_optim_default(PS_OPTIM_ADAM, (float)cfg->lr);
  ps_optim_parse(cfg->optimizer, &e->optim);
  e->optim.lr = (float)cfg->lr;
  e->optim.momentum = (float)cfg->momentum;
  e->optim.weight_decay = (float)cfg->weight_decay;
  e->sched = ps_sched_of_config(cfg);
  e->n = n;
  e->center = malloc((n ? n : 1) * sizeof(float));
  if (e->center == NULL)
    return -ENOMEM;
  for (int k = 0; k < ps_optim_nslots(e->optim.kind); k++) {
    e->slots[k] = malloc((n ? n : 1) * sizeof(float));
    if (e->slots[k] == NULL) {
      ps_elastic_free(e);
      return -ENOMEM;
    }
    float v = ps_optim_slot_init(&e->optim, k);
    for (size_t i = 0; i < n; i++)
      e->slots[k][i] = v;
  }
  return 0;
}

void ps_elastic_free(ps_elastic *e) {
  free(e->center);
  for (int k = 0; k < PS_OPTIM_MAX_SLOTS; k++)
    free(e->slots[k]);
  memset(e, 0, sizeof *e);
}

void ps_elastic_step(ps_elastic *e, float *x, const float *g, uint64_t global_step) {
  e->t++;
  float lr = ps_sched_lr(&e->sched, e->optim.lr, global_step);
  ps_optim_apply(&e->optim, lr, e->t, x, g, e->slots, e->n);
}

void ps_elastic_delta(ps_elastic *e, float *x, float *delta) {
  if (e->algorithm == PS_ALGO_AVERAGING) {
    for (size_t i = 0; i < e->n; i++)
      delta[i] = x[i] - e->center[i];
    return;
  }
  for (size_t i = 0; i < e->n; i++) {
    delta[i] = e->alpha * (x[i] - e->center[i]);
    x[i] -= delta[i];
  }
}

void ps_elastic_pulled(ps_elastic *e, float *x) {
  if (e->algorithm == PS_ALGO_AVERAGING)
    memcpy(x, e->center, e->n * sizeof(float));
}
