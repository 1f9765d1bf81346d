/* The variable table: every trainable variable of a model (name, shape,
 * offset in one contiguous float32 arena, initializer).  It is what the
 * layout splits across parameter-server shards, identical in every process. */
#ifndef PARAMSERV_VARTABLE_H
#define PARAMSERV_VARTABLE_H

#include <stddef.h>
#include <stdint.h>

#include "paramserv/error.h"

#define PS_VAR_NAME_MAX 64
#define PS_VAR_MAX_DIMS 4

typedef enum ps_init_kind {
  PS_INIT_ZEROS = 0,
  PS_INIT_UNIFORM,  /* U(-a, a) */
  PS_INIT_NORMAL,   /* N(0, a^2) */
} ps_init_kind;

typedef struct ps_init {
  ps_init_kind kind;
  float a;  /* bound (uniform) or standard deviation (normal) */
} ps_init;

/* One variable: a name, a shape (row-major: the last dimension varies
 * fastest) and where its values lie in the arena. */
typedef struct ps_var {
  char name[PS_VAR_NAME_MAX];
  int ndim;                          /* 1 to PS_VAR_MAX_DIMS */
  uint32_t shape[PS_VAR_MAX_DIMS];   /* shape[0..ndim) */
  size_t offset;  /* in floats, from the start of the arena */
  size_t count;   /* product of shape */
  ps_init init;   /* how the chief (or a shard) initializes it */
} ps_var;

/* The table: vars[0..n) in arena order, each starting where the one before
 * ends.  Read it; only the functions below change it. */
typedef struct ps_vartable {
  ps_var *vars;
  int n;          /* variables */
  size_t total;   /* floats in the arena: sum of counts */
} ps_vartable;

/* ps_vartable_init makes an empty table; ps_vartable_close frees it. */
PS_API void ps_vartable_init(ps_vartable *t);
PS_API void ps_vartable_close(ps_vartable *t);

/* Append a variable; it takes the next offset in the arena.
 * @return its index, or -EINVAL (bad name, ndim, zero dimension, duplicate
 * name), -ENOMEM. */
PS_API int ps_vartable_add(ps_vartable *t, const char *name, int ndim,
                           const uint32_t *shape, ps_init init);

/* @return the variable's index or -1. */
PS_API int ps_vartable_find(const ps_vartable *t, const char *name);

/* Fill the elements [first, first + count) of variable `v` into out[0..count)
 * with its initializer, seeded by (seed, variable name): the same values in
 * every process, whichever slice it asks for. */
PS_API void ps_vartable_init_values(const ps_vartable *t, int v, uint64_t seed,
                                    size_t first, size_t count, float *out);

/* Fill the whole arena (t->total floats). */
PS_API void ps_vartable_init_arena(const ps_vartable *t, uint64_t seed, float *arena);

/* Format "name[32x1x3x3]" into buf. */
PS_API const char *ps_var_describe(const ps_var *v, char *buf, size_t len);

#endif
