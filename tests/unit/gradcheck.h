/* Whole-model gradients against finite differences of the loss, through
 * ps_compute on any device: tests/unit/test_model.c runs them on the CPU,
 * tests/gpu/test_backend_cuda.c on a GPU, with the same code.  Include after
 * cmocka.h: they assert. */
#ifndef PS_TESTS_GRADCHECK_H
#define PS_TESTS_GRADCHECK_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "nn/compute.h"
#include "nn/model.h"
#include "nn/modelfile.h"

/* Parse and build a built-in model, or a model file when `name` ends in
 * .json, asserting that both work. */
static inline void gradcheck_build(const char *name, const char *hidden, ps_model *m) {
  ps_model_spec spec;
  ps_errbuf eb = {0};
  size_t n = strlen(name);
  int rc = n > 5 && strcmp(name + n - 5, ".json") == 0 ? ps_modelfile_load(name, &spec, &eb)
                                                       : ps_model_spec_parse(name, hidden, &spec, &eb);
  if (rc != 0)
    fail_msg("%s", eb.msg);
  assert_int_equal(ps_model_build(&spec, m, &eb), 0);
}

/* A one-thread computation of up to n samples on `device`, or the test
 * fails with the reason. */
static inline ps_compute *gradcheck_compute(const ps_model *m, int device, int n) {
  ps_errbuf eb = {0};
  ps_compute *c = ps_compute_new_on(m, device, 1, n, &eb);
  if (c == NULL)
    fail_msg("%s", eb.msg);
  return c;
}

/* The summed NLL of the n samples and its gradient (ps_compute gives the
 * mean's: scaled back by n).  Seed and first sample are fixed, so every
 * call draws the same dropout masks. */
static inline double gradcheck_loss(ps_compute *c, int n, const float *params, const float *x,
                                    const uint8_t *y, float *grad, size_t total) {
  double mean = ps_compute_grad(c, params, x, y, n, 11, 0, grad, NULL);
  for (size_t i = 0; i < total; i++)
    grad[i] *= (float)n;
  return mean * n;
}

/* The gradient of model `name` (hidden sizes `hidden`, NULL for the
 * default) against central differences on `checks` parameters spread over
 * every variable, on 3 samples. */
static inline void gradcheck_params(const char *name, const char *hidden, int device, int checks,
                                    float eps) {
  enum { N = 3 };
  ps_model model;
  const ps_model *m = &model;
  gradcheck_build(name, hidden, &model);
  ps_compute *c = gradcheck_compute(m, device, N);
  size_t total = m->vars.total;
  float *params = malloc(total * sizeof *params), *grad = malloc(total * sizeof *grad);
  float *scratch = malloc(total * sizeof *scratch);
  float *x = malloc(N * m->in_size * sizeof *x);
  uint8_t y[N] = {1, 7, 3};
  ps_vartable_init_arena(&m->vars, 3, params);
  ps_rng r;
  ps_rng_seed(&r, 9);
  for (size_t i = 0; i < N * m->in_size; i++)
    x[i] = (float)ps_rng_uniform(&r);
  gradcheck_loss(c, N, params, x, y, grad, total);
  int bad = 0;
  for (int k = 0; k < checks; k++) {
    const ps_var *v = &m->vars.vars[k % m->vars.n];
    size_t i = v->offset + ps_rng_below(&r, v->count);
    float keep = params[i];
    params[i] = keep + eps;
    double up = gradcheck_loss(c, N, params, x, y, scratch, total);
    params[i] = keep - eps;
    double down = gradcheck_loss(c, N, params, x, y, scratch, total);
    params[i] = keep;
    double num = (up - down) / (2.0 * eps);
    if (fabs(num - grad[i]) > 2e-2 * fmax(1e-1, fabs(num)) + 2e-3) {
      print_message("%s[%zu]: backward %.6f, finite difference %.6f\n", v->name, i - v->offset,
                    grad[i], num);
      bad++;
    }
  }
  /* relu kinks and max-pool switches can flip under a perturbation; allow
   * at most 2% of the checks to land on one. */
  assert_true(bad <= checks / 50);
  free(params);
  free(grad);
  free(scratch);
  free(x);
  ps_compute_free(c);
  ps_model_close(&model);
}

/* The gradient of model `name` (the cnn, in practice) checked variable by
 * variable.  For the cnn, whose tens of thousands of relu and max-pool kinks per sample
 * make a per-parameter finite difference either cross some (large step) or
 * drown in float32 noise (small step): each variable is checked along the
 * gradient itself, where the directional derivative is |g_v|.  At a step of
 * 1e-4 that matches to about 1e-4 relative, except when an input happens to
 * put a relu within about 1e-5 of its kink (seen: one fc2 unit at -0.00002),
 * so each variable must match on two of three inputs: a wrong gradient
 * fails on all three. */
static inline void gradcheck_directional(const char *name, int device) {
  enum { N = 3, TRIALS = 3 };
  ps_model model;
  const ps_model *m = &model;
  gradcheck_build(name, NULL, &model);
  ps_compute *c = gradcheck_compute(m, device, N);
  size_t total = m->vars.total;
  float *params = malloc(total * sizeof *params), *grad = malloc(total * sizeof *grad);
  float *moved = malloc(total * sizeof *moved), *scratch = malloc(total * sizeof *scratch);
  float *x = malloc(N * m->in_size * sizeof *x);
  uint8_t y[N] = {2, 9, 4};
  int matched[PS_MODEL_MAX_LAYERS * 2] = {0};
  ps_vartable_init_arena(&m->vars, 4, params);
  for (int trial = 0; trial < TRIALS; trial++) {
    ps_rng r;
    ps_rng_seed(&r, 10 + (uint64_t)trial);
    for (size_t i = 0; i < N * m->in_size; i++)
      x[i] = (float)ps_rng_uniform(&r);
    gradcheck_loss(c, N, params, x, y, grad, total);
    for (int v = 0; v < m->vars.n; v++) {
      const ps_var *var = &m->vars.vars[v];
      const float *g = grad + var->offset;
      double norm2 = 0.0;
      for (size_t i = 0; i < var->count; i++)
        norm2 += (double)g[i] * g[i];
      double norm = sqrt(norm2), h = 1e-4, fd[2];
      for (int side = 0; side < 2; side++) {
        memcpy(moved, params, total * sizeof *moved);
        for (size_t i = 0; i < var->count; i++)
          moved[var->offset + i] += (float)((side ? -h : h) * g[i] / norm);
        fd[side] = gradcheck_loss(c, N, moved, x, y, scratch, total);
      }
      double num = (fd[0] - fd[1]) / (2.0 * h);
      if (fabs(num - norm) < 0.01 * norm)
        matched[v]++;
      else
        print_message("input %d %s: |g| %.6f, directional finite difference %.6f\n", trial,
                      var->name, norm, num);
    }
  }
  for (int v = 0; v < m->vars.n; v++)
    if (matched[v] < 2)
      fail_msg("%s: gradient matched its finite difference on %d of %d inputs",
               m->vars.vars[v].name, matched[v], TRIALS);
  free(params);
  free(grad);
  free(moved);
  free(scratch);
  free(x);
  ps_compute_free(c);
  ps_model_close(&model);
}

#endif
