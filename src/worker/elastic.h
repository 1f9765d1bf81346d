/* A worker's own replica, for the algorithms that push parameters rather
 * than gradients ([train] algorithm = averaging | easgd; README.md in this
 * directory): the configured optimizer runs here, on the replica, every
 * step; every `window` steps the worker pushes how far the shards' center
 * should move, and pulls the center back. */
#ifndef PS_WORKER_ELASTIC_H
#define PS_WORKER_ELASTIC_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "optim/optim.h"

typedef struct ps_elastic {
  int algorithm;     /* PS_ALGO_AVERAGING or PS_ALGO_EASGD */
  float alpha;       /* easgd: the moving rate */
  ps_optim optim;
  ps_sched sched;    /* over the global step, as the shards' would be */
  size_t n;          /* floats in the replica */
  uint64_t t;        /* local updates so far (adam's bias correction) */
  float *slots[PS_OPTIM_MAX_SLOTS];
  float *center;     /* the center as last pulled */
} ps_elastic;

/* For cfg's algorithm (not gradients) over n floats.  @return 0 or -ENOMEM. */
int ps_elastic_init(ps_elastic *e, const ps_config *cfg, size_t n);
void ps_elastic_free(ps_elastic *e);

/* One local step of the optimizer: x moves by gradient g, at the
 * schedule's rate for `global_step` (the cluster's, as last heard from the
 * shards: the same for every worker, and where a restarted one goes on). */
void ps_elastic_step(ps_elastic *e, float *x, const float *g, uint64_t global_step);

/* The push at the end of a window, into `delta`: averaging x - center
 * (a round moves the center to the workers' mean); EASGD alpha (x -
 * center), and x moves back by as much (the elastic force both ways). */
void ps_elastic_delta(ps_elastic *e, float *x, float *delta);

/* The center was pulled (into e->center): averaging starts the next round
 * from it; EASGD keeps its replica. */
void ps_elastic_pulled(ps_elastic *e, float *x);

#endif
