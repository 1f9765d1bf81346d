/* The variable table and its seeded initializers. */
#include "paramserv/vartable.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"

void ps_vartable_init(ps_vartable *t) { memset(t, 0, sizeof *t); }

void ps_vartable_close(ps_vartable *t) {
  if (t == NULL)
    return;
  free(t->vars);
  memset(t, 0, sizeof *t);
}

int ps_vartable_find(const ps_vartable *t, const char *name) {
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->vars[i].name, name) == 0)
      return i;
  return -1;
}

int ps_vartable_add(ps_vartable *t, const char *name, int ndim, const uint32_t *shape,
                    ps_init init) {
  size_t len = strlen(name);
  if (len == 0 || len >= PS_VAR_NAME_MAX || ndim < 1 || ndim > PS_VAR_MAX_DIMS ||
      ps_vartable_find(t, name) >= 0)
    return -EINVAL;
  size_t count = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 0)
      return -EINVAL;
    count *= shape[d];
  }
  /* The array holds 8 entries, then the power of two at or above n: it
   * is full when n is 0 or a power of two from 8 on. */
  if (t->n == 0 || (t->n >= 8 && (t->n & (t->n - 1)) == 0)) {
    size_t cap = t->n ? 2 * (size_t)t->n : 8;
    ps_var *vars = realloc(t->vars, cap * sizeof *vars);
    if (vars == NULL)
      return -ENOMEM;
    t->vars = vars;
  }
  ps_var *v = &t->vars[t->n];
  memset(v, 0, sizeof *v);
  memcpy(v->name, name, len + 1);
  v->ndim = ndim;
  memcpy(v->shape, shape, (size_t)ndim * sizeof *shape);
  v->offset = t->total;
  v->count = count;
  v->init = init;
  t->total += count;
  return t->n++;
}

/* A variable's stream depends on its name, not its position, so adding a
 * variable to a model does not change the others' initial values. */
static uint64_t var_seed(uint64_t seed, const char *name) {
  uint64_t h = ps_mix64(seed);
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    h = ps_mix64(h ^ *p);
  return h;
}

void ps_vartable_init_values(const ps_vartable *t, int vi, uint64_t seed, size_t first,
                             size_t count, float *out) {
  const ps_var *v = &t->vars[vi];
  uint64_t base = var_seed(seed, v->name);
  /* Each element is a pure function of (seed, name, element index), so a
   * shard holding any slice computes the same values as the whole table. */
  for (size_t i = 0; i < count; i++) {
    uint64_t e = first + i;
    switch (v->init.kind) {
    case PS_INIT_ZEROS:
      out[i] = 0.0f;
      break;
    case PS_INIT_UNIFORM: {
      double u = (double)(ps_mix64(base ^ ps_mix64(e)) >> 11) * (1.0 / 9007199254740992.0);
      out[i] = (float)((2.0 * u - 1.0) * v->init.a);
      break;
    }
    case PS_INIT_NORMAL: {
      uint64_t r1 = ps_mix64(base ^ ps_mix64(2 * e));
      uint64_t r2 = ps_mix64(base ^ ps_mix64(2 * e + 1));
      double u1 = ((double)(r1 >> 11) + 0.5) * (1.0 / 9007199254740992.0);
      double u2 = (double)(r2 >> 11) * (1.0 / 9007199254740992.0);
      out[i] = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2) * v->init.a);
      break;
    }
    }
  }
}

void ps_vartable_init_arena(const ps_vartable *t, uint64_t seed, float *arena) {
  for (int i = 0; i < t->n; i++)
    ps_vartable_init_values(t, i, seed, 0, t->vars[i].count, arena + t->vars[i].offset);
}

const char *ps_var_describe(const ps_var *v, char *buf, size_t len) {
  size_t w = (size_t)snprintf(buf, len, "%s[", v->name);
  for (int d = 0; d < v->ndim && w < len; d++)
    w += (size_t)snprintf(buf + w, len - w, d ? "x%u" : "%u", v->shape[d]);
  if (w < len)
    snprintf(buf + w, len - w, "]");
  return buf;
}
