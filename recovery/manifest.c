/* MANIFEST.json (recovery/FORMAT.md section 4) read: parsed and validated
 * into a ps_ckpt, and opened from a checkpoint directory; the names its
 * fields use (filters, consistency modes, built-in models).  Building it is
 * manifest_build.c's. */
#include "recovery/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/parse.h"
#include "nn/modelfile.h"
#include "recovery/commit.h"

#define JSON_SAFE ((int64_t)1 << 53)

/* Indexed by ps_consistency (common/config.h). */
static const char *const consistency_names[] = {"async", "sync", "ssp"};

const char *ps__ckpt_consistency_name(int consistency) {
  return consistency >= 0 && consistency < 3 ? consistency_names[consistency] : "unknown";
}

/* ------------------------------------------------------------------ */
/* The filters' names                                                 */
/* ------------------------------------------------------------------ */

int ps_ckpt_filter_parse(const char *name, ps_ckpt_filter *out) {
  if (name != NULL && strcmp(name, "none") == 0)
    *out = PS_CKPT_FILTER_NONE;
  else if (name != NULL && strcmp(name, "shuffle") == 0)
    *out = PS_CKPT_FILTER_SHUFFLE;
  else
    return PS_EUSAGE;
  return 0;
}

const char *ps_ckpt_filter_name(ps_ckpt_filter f) {
  switch (f) {
  case PS_CKPT_FILTER_NONE: return "none";
  case PS_CKPT_FILTER_SHUFFLE: return "shuffle";
  }
  return "unknown";
}

/* ------------------------------------------------------------------ */
/* Hex text                                                           */
/* ------------------------------------------------------------------ */

static int parse_hex64(const char *s, uint64_t *out) {
  if (strlen(s) != 16)
    return -1;
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0)
      return -1;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return 0;
}

/* ------------------------------------------------------------------ */
/* What the model is                                                  */
/* ------------------------------------------------------------------ */

int ps__ckpt_builtin_of(const char *model, char *name, size_t name_cap, char *hidden,
                        size_t hidden_cap) {
  const char *mid = NULL;
  size_t n = strlen(model);
  if (strncmp(model, "cnn ", 4) == 0) {
    snprintf(name, name_cap, "cnn");
    hidden[0] = '\0';
  } else if (strncmp(model, "mlp 784-", 8) == 0 && n > 11 && strcmp(model + n - 3, "-10") == 0) {
    /* "mlp 784-256-128-10": the sizes between the input's and the classes'. */
    mid = model + 8;
    size_t len = (size_t)(model + n - 3 - mid);
    if (len + 1 > hidden_cap || strspn(mid, "0123456789-") < len)
      return -1;
    for (size_t i = 0; i < len; i++)
      hidden[i] = mid[i] == '-' ? ',' : mid[i];
    hidden[len] = '\0';
    snprintf(name, name_cap, "mlp");
  } else {
    return -1;
  }
  /* Only a text the built-in gives back is one. */
  ps_model_spec spec;
  ps_errbuf eb = {0};
  if (ps_model_spec_parse(name, mid != NULL ? hidden : NULL, &spec, &eb) != 0 ||
      strcmp(spec.desc, model) != 0)
    return -1;
  return 0;
}

/* ------------------------------------------------------------------ */
/* Parsing the manifest                                               */
/* ------------------------------------------------------------------ */

/* What a JSON value is, for messages: `a string "abc"`, `an integer 3`. */
static const char *found(const json_t *v, char *buf, size_t cap) {
  if (v == NULL)
    return "nothing (missing)";
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: snprintf(buf, cap, "a string \"%.40s\"", json_string_value(v)); return buf;
  case JSON_INTEGER:
    snprintf(buf, cap, "an integer %" JSON_INTEGER_FORMAT, json_integer_value(v));
    return buf;
  case JSON_REAL: snprintf(buf, cap, "a number %g", json_real_value(v)); return buf;
  case JSON_TRUE: return "true";
  case JSON_FALSE: return "false";
  case JSON_NULL: return "null";
  }
  return "?";
}

/* The dotted name of a field, for messages: "shards[1].xxh64". */
typedef struct fpath {
  char s[96];
} fpath;

/* Append s to p, cut at the buffer's end: a field name only appears in
 * messages. */
static void fpath_add(fpath *p, const char *s) {
  size_t at = strlen(p->s), n = strlen(s);
  if (n > sizeof p->s - 1 - at)
    n = sizeof p->s - 1 - at;
  memcpy(p->s + at, s, n);
  p->s[at + n] = '\0';
}

static fpath fp(const char *prefix, const char *key) {
  fpath p = {{0}};
  if (prefix != NULL && prefix[0] != '\0') {
    fpath_add(&p, prefix);
    fpath_add(&p, ".");
  }
  fpath_add(&p, key);
  return p;
}

static fpath fpi(const char *prefix, const char *key, size_t i) {
  fpath p = fp(prefix, key);
  char idx[24];
  snprintf(idx, sizeof idx, "[%zu]", i);
  fpath_add(&p, idx);
  return p;
}

static int bad(ps_errbuf *eb, const char *field, const char *expected, const json_t *v) {
  char buf[80];
  return ps_err_set(eb, PS_ECORRUPT, "%s: expected %s, found %s", field, expected,
                    found(v, buf, sizeof buf));
}

static json_t *get_type(json_t *obj, const char *prefix, const char *key, json_type type,
                        const char *expected, ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL || json_typeof(v) != type) {
    bad(eb, fp(prefix, key).s, expected, v);
    return NULL;
  }
  return v;
}

static int get_int(json_t *obj, const char *prefix, const char *key, int64_t lo, int64_t hi,
                   int64_t *out, ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL || !json_is_integer(v) || json_integer_value(v) < lo ||
      json_integer_value(v) > hi) {
    char exp[80];
    snprintf(exp, sizeof exp, "an integer in [%" PRId64 ", %" PRId64 "]", lo, hi);
    return bad(eb, fp(prefix, key).s, exp, v);
  }
  *out = json_integer_value(v);
  return 0;
}

static int get_number(json_t *obj, const char *prefix, const char *key, double lo, double hi,
                      double *out, ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  double d = v != NULL && json_is_number(v) ? json_number_value(v) : NAN;
  if (!(d >= lo && d <= hi)) {
    char exp[80];
    snprintf(exp, sizeof exp, "a number in [%g, %g]", lo, hi);
    return bad(eb, fp(prefix, key).s, exp, v);
  }
  *out = d;
  return 0;
}

static int get_bool(json_t *obj, const char *prefix, const char *key, int *out, ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL || !json_is_boolean(v))
    return bad(eb, fp(prefix, key).s, "true or false", v);
  *out = json_is_true(v);
  return 0;
}

/* A string of 1 to max bytes without control characters. */
static int get_str(json_t *obj, const char *prefix, const char *key, size_t min, size_t max,
                   const char **out, ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  if (v != NULL && json_is_string(v)) {
    const char *s = json_string_value(v);
    size_t n = json_string_length(v), i = 0;
    while (i < n && (unsigned char)s[i] >= 0x20 && s[i] != 0x7f)
      i++;
    if (i == n && n >= min && n <= max) {
      *out = s;
      return 0;
    }
  }
  char exp[80];
  snprintf(exp, sizeof exp, "a string of %zu to %zu printable bytes", min, max);
  return bad(eb, fp(prefix, key).s, exp, v);
}

static int u64_value(const json_t *v, const char *field, uint64_t *out, ps_errbuf *eb) {
  if (v == NULL || !json_is_string(v) || ps_parse_u64(json_string_value(v), out) != 0)
    return bad(eb, field, "a decimal u64 in a string", v);
  return 0;
}

static int get_u64(json_t *obj, const char *prefix, const char *key, uint64_t *out,
                   ps_errbuf *eb) {
  return u64_value(json_object_get(obj, key), fp(prefix, key).s, out, eb);
}

static int get_hex64(json_t *obj, const char *prefix, const char *key, uint64_t *out,
                     ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL || !json_is_string(v) || parse_hex64(json_string_value(v), out) != 0)
    return bad(eb, fp(prefix, key).s, "16 lowercase hex digits in a string", v);
  return 0;
}

/* A list of [u64, u64] pairs. */
static int get_pairs(json_t *obj, const char *prefix, const char *key, uint64_t **out, int *n,
                     ps_errbuf *eb) {
  json_t *a = get_type(obj, prefix, key, JSON_ARRAY, "an array of [u64, u64] pairs", eb);
  if (a == NULL)
    return PS_ECORRUPT;
  size_t len = json_array_size(a);
  if (len > INT_MAX / 2)
    return bad(eb, fp(prefix, key).s, "a shorter array", a);
  *out = calloc(len * 2 + 1, sizeof **out);
  if (*out == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  *n = (int)len;
  for (size_t i = 0; i < len; i++) {
    json_t *p = json_array_get(a, i);
    fpath f = fpi(prefix, key, i);
    if (!json_is_array(p) || json_array_size(p) != 2)
      return bad(eb, f.s, "a pair [\"<u64>\", \"<u64>\"]", p);
    fpath f0 = fp(f.s, "0"), f1 = fp(f.s, "1");
    if (u64_value(json_array_get(p, 0), f0.s, &(*out)[2 * i], eb) != 0 ||
        u64_value(json_array_get(p, 1), f1.s, &(*out)[2 * i + 1], eb) != 0)
      return PS_ECORRUPT;
  }
  return 0;
}

static int parse_optimizer(json_t *root, ps_ckpt *c, ps_errbuf *eb) {
  json_t *o = get_type(root, "", "optimizer", JSON_OBJECT, "an object", eb);
  const char *name;
  if (o == NULL || get_str(o, "optimizer", "name", 1, 15, &name, eb) != 0)
    return PS_ECORRUPT;
  c->optim.lr = 0;
  if (ps_optim_parse(name, &c->optim) != 0)
    return bad(eb, "optimizer.name", "sgd, momentum, nesterov, adagrad or adam",
               json_object_get(o, "name"));
  static const char *const keys[] = {"lr",   "momentum", "weight_decay",       "beta1",
                                     "beta2", "eps",     "initial_accumulator"};
  float *fields[] = {&c->optim.lr,    &c->optim.momentum, &c->optim.weight_decay,
                     &c->optim.beta1, &c->optim.beta2,    &c->optim.eps,
                     &c->optim.initial_accumulator};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    double d;
    if (get_number(o, "optimizer", keys[i], -FLT_MAX, FLT_MAX, &d, eb) != 0)
      return PS_ECORRUPT;
    *fields[i] = (float)d;
  }
  return 0;
}

/* A shard's stored fixed fields (state.h's list less the DERIVED ones):
 * a uint64_t as a decimal string, a flag as true or false, any other as a
 * number up to its maximum. */
static int get_state(json_t *s, const char *prefix, ps_state_info *in, ps_errbuf *eb) {
  for (const ps_state_field *f = ps_state_fields; f < ps_state_fields + PS_STATE_NFIELDS; f++) {
    uint64_t u = 0;
    int64_t v;
    int b = 0, rc = 0;
    if (f->role == PS_STATE_DERIVED)
      continue;
    if (f->width == 8)
      rc = get_u64(s, prefix, f->name, &u, eb);
    else if (f->max == 1 && (rc = get_bool(s, prefix, f->name, &b, eb)) == 0)
      u = (uint64_t)b;
    else if (f->max != 1 && (rc = get_int(s, prefix, f->name, 0, (int64_t)f->max, &v, eb)) == 0)
      u = (uint64_t)v;
    if (rc != 0)
      return PS_ECORRUPT;
    ps_state_set(in, f, u);
  }
  return 0;
}

static int parse_shards(json_t *root, ps_ckpt *c, ps_errbuf *eb) {
  json_t *a = get_type(root, "", "shards", JSON_ARRAY, "an array", eb);
  if (a == NULL)
    return PS_ECORRUPT;
  if (json_array_size(a) != (size_t)c->nshards) {
    char exp[48];
    snprintf(exp, sizeof exp, "an array of nshards (%d) entries", c->nshards);
    return bad(eb, "shards", exp, a);
  }
  c->shards = calloc((size_t)c->nshards, sizeof *c->shards);
  if (c->shards == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  int nslots = ps_optim_nslots(c->optim.kind);
  for (int i = 0; i < c->nshards; i++) {
    json_t *s = json_array_get(a, (size_t)i);
    ps_ckpt_shard *sh = &c->shards[i];
    fpath pre = fpi("", "shards", (size_t)i);
    if (!json_is_object(s))
      return bad(eb, pre.s, "an object", s);
    int64_t v;
    const char *file;
    char want[PS_CKPT_NAME_MAX];
    snprintf(want, sizeof want, "shard-%d.lz4", i);
    if (get_int(s, pre.s, "index", i, i, &v, eb) != 0 ||
        get_str(s, pre.s, "file", 1, PS_CKPT_NAME_MAX - 1, &file, eb) != 0)
      return PS_ECORRUPT;
    if (strcmp(file, want) != 0) {
      char exp[48];
      snprintf(exp, sizeof exp, "\"%s\"", want);
      return bad(eb, fp(pre.s, "file").s, exp, json_object_get(s, "file"));
    }
    snprintf(sh->file, sizeof sh->file, "%s", file);
    sh->index = i;
    if (get_int(s, pre.s, "floats", 1, (int64_t)PS_CKPT_MAX_FLOATS, &v, eb) != 0)
      return PS_ECORRUPT;
    sh->floats = (size_t)v;
    int rc = get_state(s, pre.s, &sh->info, eb);
    if (rc != 0)
      return rc;
    if (sh->info.nslots != (uint32_t)nslots) {
      char exp[64];
      snprintf(exp, sizeof exp, "%d (the slots of optimizer %s)", nslots,
               ps_optim_name(&c->optim));
      return bad(eb, fp(pre.s, "nslots").s, exp, json_object_get(s, "nslots"));
    }
    uint64_t *pairs = NULL;
    int nonce = 0;
    rc = get_pairs(s, pre.s, "once", &pairs, &nonce, eb);
    if (pairs != NULL) {
      sh->once = calloc((size_t)nonce + 1, sizeof *sh->once);
      for (int w = 0; sh->once != NULL && w < nonce; w++)
        sh->once[w] = (ps_once){pairs[2 * w], pairs[2 * w + 1]};
      free(pairs);
      if (sh->once == NULL && rc == 0)
        rc = ps_err_set(eb, -ENOMEM, "out of memory");
    }
    if (rc != 0)
      return rc;
    /* The fields a manifest derives rather than stores; table_floats only
     * with sparse tables. */
    sh->info.nonce = (uint32_t)nonce;
    if (json_object_get(s, "table_floats") != NULL &&
        get_u64(s, pre.s, "table_floats", &sh->info.table_floats, eb) != 0)
      return PS_ECORRUPT;
    if (sh->info.table_floats > (uint64_t)JSON_SAFE / sizeof(float))
      return ps_err_set(eb, PS_ECORRUPT, "%stable_floats: found %" PRIu64 ", expected at most %"
                        PRIu64, pre.s, sh->info.table_floats, (uint64_t)JSON_SAFE / sizeof(float));
    sh->info.image_floats = ps_state_image_floats(&sh->info, sh->floats);
    /* An incremental checkpoint's file holds its delta section in place
     * of the table section (FORMAT.md 2.4). */
    if (c->base[0] != '\0') {
      if (get_u64(s, pre.s, "delta_floats", &sh->delta_floats, eb) != 0 ||
          get_hex64(s, pre.s, "base_xxh64", &sh->base_xxh64, eb) != 0 ||
          get_hex64(s, pre.s, "state_xxh64", &sh->state_xxh64, eb) != 0)
        return PS_ECORRUPT;
      if (sh->delta_floats > (uint64_t)JSON_SAFE / sizeof(float))
        return ps_err_set(eb, PS_ECORRUPT, "%sdelta_floats: found %" PRIu64 ", expected at most %"
                          PRIu64, pre.s, sh->delta_floats, (uint64_t)JSON_SAFE / sizeof(float));
    }
    uint64_t raw = (uint64_t)sh->floats * sizeof(float) * (uint64_t)(1 + nslots + sh->info.has_accum) +
                   (c->base[0] != '\0' ? sh->delta_floats : sh->info.table_floats) * sizeof(float);
    if (get_int(s, pre.s, "compressed_size", 0, JSON_SAFE, &v, eb) != 0)
      return PS_ECORRUPT;
    sh->compressed_size = (uint64_t)v;
    if (get_int(s, pre.s, "uncompressed_size", (int64_t)raw, (int64_t)raw, &v, eb) != 0)
      return PS_ECORRUPT;
    sh->uncompressed_size = raw;
    if (get_hex64(s, pre.s, "xxh64", &sh->xxh64, eb) != 0)
      return PS_ECORRUPT;
    if (c->base[0] == '\0')
      sh->state_xxh64 = sh->xxh64;  /* the file holds the state as it is */
  }
  return 0;
}

static int cmp_name_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

typedef struct part_ref {
  int shard;
  size_t off, count;
} part_ref;

static int cmp_part_ref(const void *a, const void *b) {
  const part_ref *x = a, *y = b;
  if (x->shard != y->shard)
    return x->shard < y->shard ? -1 : 1;
  return x->off < y->off ? -1 : x->off > y->off;
}

static int parse_variables(json_t *root, ps_ckpt *c, ps_errbuf *eb) {
  json_t *a = get_type(root, "", "variables", JSON_ARRAY, "an array", eb);
  if (a == NULL)
    return PS_ECORRUPT;
  size_t n = json_array_size(a);
  if (n == 0 || n > INT_MAX / 2)
    return bad(eb, "variables", "a non-empty array", a);
  c->vars = calloc(n, sizeof *c->vars);
  if (c->vars == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  c->nvars = (int)n;
  size_t total = 0, nparts = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *jv = json_array_get(a, i);
    ps_ckpt_var *v = &c->vars[i];
    fpath pre = fpi("", "variables", i);
    if (!json_is_object(jv))
      return bad(eb, pre.s, "an object", jv);
    const char *name, *dtype;
    if (get_str(jv, pre.s, "name", 1, PS_VAR_NAME_MAX - 1, &name, eb) != 0)
      return PS_ECORRUPT;
    snprintf(v->name, sizeof v->name, "%s", name);
    json_t *shape = get_type(jv, pre.s, "shape", JSON_ARRAY, "an array of 1 to 4 dimensions", eb);
    if (shape == NULL)
      return PS_ECORRUPT;
    if (json_array_size(shape) < 1 || json_array_size(shape) > PS_VAR_MAX_DIMS)
      return bad(eb, fp(pre.s, "shape").s, "an array of 1 to 4 dimensions", shape);
    v->ndim = (int)json_array_size(shape);
    uint64_t count = 1;
    for (int d = 0; d < v->ndim; d++) {
      json_t *x = json_array_get(shape, (size_t)d);
      if (!json_is_integer(x) || json_integer_value(x) < 1 ||
          json_integer_value(x) > (json_int_t)UINT32_MAX)
        return bad(eb, fpi(pre.s, "shape", (size_t)d).s, "an integer in [1, 4294967295]", x);
      v->shape[d] = (uint32_t)json_integer_value(x);
      if (count > PS_CKPT_MAX_FLOATS / v->shape[d])
        return bad(eb, fp(pre.s, "shape").s, "at most 2^48 elements", shape);
      count *= v->shape[d];
    }
    v->count = (size_t)count;
    if (get_str(jv, pre.s, "dtype", 1, 16, &dtype, eb) != 0)
      return PS_ECORRUPT;
    if (strcmp(dtype, "float32") != 0)
      return bad(eb, fp(pre.s, "dtype").s, "\"float32\"", json_object_get(jv, "dtype"));
    int64_t x;
    /* Variables are back to back in the arena, in this order. */
    if (get_int(jv, pre.s, "offset", (int64_t)total, (int64_t)total, &x, eb) != 0 ||
        get_int(jv, pre.s, "count", (int64_t)count, (int64_t)count, &x, eb) != 0)
      return PS_ECORRUPT;
    v->offset = total;
    total += v->count;
    if (total > JSON_SAFE)
      return bad(eb, fp(pre.s, "count").s, "a total below 2^53 elements", json_object_get(jv, "count"));

    json_t *parts = get_type(jv, pre.s, "parts", JSON_ARRAY, "a non-empty array", eb);
    if (parts == NULL)
      return PS_ECORRUPT;
    size_t np = json_array_size(parts);
    if (np == 0 || np > (size_t)INT_MAX)
      return bad(eb, fp(pre.s, "parts").s, "a non-empty array", parts);
    v->parts = calloc(np, sizeof *v->parts);
    if (v->parts == NULL)
      return ps_err_set(eb, -ENOMEM, "out of memory");
    v->nparts = (int)np;
    nparts += np;
    size_t start = 0;
    for (size_t k = 0; k < np; k++) {
      json_t *jp = json_array_get(parts, k);
      fpath pp = fpi(pre.s, "parts", k);
      ps_ckpt_part *p = &v->parts[k];
      if (!json_is_object(jp))
        return bad(eb, pp.s, "an object", jp);
      /* Parts tile the variable in order: each starts where the last ended. */
      if (get_int(jp, pp.s, "shard", 0, c->nshards - 1, &x, eb) != 0)
        return PS_ECORRUPT;
      p->shard = (int)x;
      if (get_int(jp, pp.s, "start", (int64_t)start, (int64_t)start, &x, eb) != 0)
        return PS_ECORRUPT;
      p->start = start;
      if (get_int(jp, pp.s, "count", 1, (int64_t)(v->count - start), &x, eb) != 0)
        return PS_ECORRUPT;
      p->count = (size_t)x;
      size_t fl = c->shards[p->shard].floats;
      if (p->count > fl || get_int(jp, pp.s, "shard_off", 0, (int64_t)(fl - p->count), &x, eb) != 0) {
        if (p->count > fl)
          bad(eb, fp(pp.s, "count").s, "at most the shard's floats", json_object_get(jp, "count"));
        return PS_ECORRUPT;
      }
      p->shard_off = (size_t)x;
      start += p->count;
    }
    if (start != v->count)
      return bad(eb, fp(pre.s, "parts").s, "parts that cover the variable", parts);
  }
  c->total_floats = total;

  /* Unique names. */
  const char **names = malloc(n * sizeof *names);
  if (names == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    names[i] = c->vars[i].name;
  qsort(names, n, sizeof *names, cmp_name_ptr);
  for (size_t i = 1; i < n; i++)
    if (strcmp(names[i - 1], names[i]) == 0) {
      int rc = ps_err_set(eb, PS_ECORRUPT, "variables: the name \"%s\" appears twice", names[i]);
      free(names);
      return rc;
    }
  free(names);

  /* Each shard's parts tile its slice from 0, without gap or overlap. */
  part_ref *refs = malloc(nparts * sizeof *refs);
  if (refs == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  size_t r = 0;
  for (int i = 0; i < c->nvars; i++)
    for (int k = 0; k < c->vars[i].nparts; k++)
      refs[r++] = (part_ref){c->vars[i].parts[k].shard, c->vars[i].parts[k].shard_off,
                             c->vars[i].parts[k].count};
  qsort(refs, nparts, sizeof *refs, cmp_part_ref);
  int rc = 0;
  size_t k = 0;
  for (int s = 0; s < c->nshards && rc == 0; s++) {
    size_t at = 0;
    for (; k < nparts && refs[k].shard == s; k++) {
      if (refs[k].off != at)
        break;
      at += refs[k].count;
    }
    if (at != c->shards[s].floats || (k < nparts && refs[k].shard == s))
      rc = ps_err_set(eb, PS_ECORRUPT,
                      "variables: the parts on shard %d do not tile its %zu floats from 0 "
                      "(a gap or an overlap at float %zu)", s, c->shards[s].floats, at);
  }
  free(refs);
  return rc;
}

/* The same layers (what the model file of each says). */
static int same_layers(const ps_model_spec *a, const ps_model_spec *b) {
  char *x = ps_modelfile_text(a, NULL, 0), *y = ps_modelfile_text(b, NULL, 0);
  int same = x != NULL && y != NULL && strcmp(x, y) == 0;
  free(x);
  free(y);
  return same;
}

/* Version 2's `network`, `builtin` and `normalization` (FORMAT.md 4.1). */
static int parse_model_def(json_t *root, ps_ckpt *c, ps_errbuf *eb) {
  json_t *net = json_object_get(root, "network"), *bi = json_object_get(root, "builtin"),
         *norm = json_object_get(root, "normalization");
  if (net == NULL || !(json_is_null(net) || json_is_object(net)))
    return bad(eb, "network", "a model file's object or null", net);
  if (bi == NULL || !(json_is_null(bi) || json_is_object(bi)))
    return bad(eb, "builtin", "an object or null", bi);
  if (norm == NULL || !(json_is_null(norm) || json_is_object(norm)))
    return bad(eb, "normalization", "an object or null", norm);
  if (json_is_object(net)) {
    char *text = json_dumps(net, JSON_COMPACT);
    if (text == NULL)
      return ps_err_set(eb, -ENOMEM, "out of memory");
    ps_errbuf why = {0};
    int rc = ps_modelfile_parse(text, strlen(text), "network", &c->network, &why);
    free(text);
    if (rc != 0)
      return ps_err_set(eb, rc == -ENOMEM ? -ENOMEM : PS_ECORRUPT, "%s", why.msg);
    c->has_network = 1;
  } else if (!json_is_null(bi)) {
    return bad(eb, "builtin", "null with a null network", bi);
  }
  if (json_is_object(bi)) {
    const char *name, *hidden = NULL;
    json_t *h = json_object_get(bi, "hidden");
    if (get_str(bi, "builtin", "name", 1, sizeof c->builtin - 1, &name, eb) != 0)
      return PS_ECORRUPT;
    if (h == NULL || !(json_is_null(h) || json_is_string(h)))
      return bad(eb, "builtin.hidden", "a string or null", h);
    if (json_is_string(h) &&
        get_str(bi, "builtin", "hidden", 1, sizeof c->builtin_hidden - 1, &hidden, eb) != 0)
      return PS_ECORRUPT;
    ps_model_spec spec;
    ps_errbuf why = {0};
    if (ps_model_spec_parse(name, hidden, &spec, &why) != 0)
      return ps_err_set(eb, PS_ECORRUPT, "builtin: %s", why.msg);
    if (strcmp(spec.desc, c->model) != 0 || !same_layers(&spec, &c->network))
      return ps_err_set(eb, PS_ECORRUPT, "builtin: %s%s%s is the model '%s' with its own "
                        "layers: expected the manifest's model '%s' with the network's layers",
                        name, hidden ? " " : "", hidden ? hidden : "", spec.desc, c->model);
    c->network = spec;
    snprintf(c->builtin, sizeof c->builtin, "%s", name);
    snprintf(c->builtin_hidden, sizeof c->builtin_hidden, "%s", hidden ? hidden : "");
  } else if (c->has_network && strcmp(c->network.desc, c->model) != 0) {
    return ps_err_set(eb, PS_ECORRUPT, "network: its layers are the model '%s': expected the "
                      "manifest's model '%s'", c->network.desc, c->model);
  }
  if (json_is_object(norm)) {
    double d, m, sd;
    if (get_number(norm, "normalization", "divide", FLT_MIN, FLT_MAX, &d, eb) != 0 ||
        get_number(norm, "normalization", "mean", -FLT_MAX, FLT_MAX, &m, eb) != 0 ||
        get_number(norm, "normalization", "std", FLT_MIN, FLT_MAX, &sd, eb) != 0)
      return PS_ECORRUPT;
    c->norm = (ps_data_norm){(float)d, (float)m, (float)sd};
    c->has_norm = 1;
  }
  return 0;
}

/* `base` (version 3: an incremental checkpoint's, FORMAT.md 2.4): a
 * checkpoint's canonical name; "" when absent. */
static int get_base(json_t *root, char base[PS_CKPT_NAME_MAX], ps_errbuf *eb) {
  base[0] = '\0';
  if (json_object_get(root, "base") == NULL)
    return 0;
  const char *s;
  uint64_t step;
  if (get_str(root, "", "base", 1, PS_CKPT_NAME_MAX - 1, &s, eb) != 0)
    return PS_ECORRUPT;
  if (ps__ckpt_parse_name(s, &step) != 0)
    return bad(eb, "base", "a checkpoint's name (ckpt-<step>, 9 digits at least)",
               json_object_get(root, "base"));
  snprintf(base, PS_CKPT_NAME_MAX, "%s", s);
  return 0;
}

static int parse_root(json_t *root, ps_ckpt *c, ps_errbuf *eb) {
  if (!json_is_object(root))
    return bad(eb, "the manifest", "a JSON object", root);
  const char *s;
  int64_t v;
  if (get_str(root, "", "format", 1, 64, &s, eb) != 0)
    return PS_ECORRUPT;
  if (strcmp(s, "paramserv-checkpoint") != 0)
    return bad(eb, "format", "\"paramserv-checkpoint\"", json_object_get(root, "format"));
  json_t *ver = json_object_get(root, "format_version");
  if (ver == NULL || !json_is_integer(ver))
    return bad(eb, "format_version", "an integer", ver);
  if (json_integer_value(ver) < PS_CKPT_FORMAT_VERSION_MIN ||
      json_integer_value(ver) > PS_CKPT_FORMAT_VERSION)
    return ps_err_set(eb, PS_EVERSION,
                      "format_version %" JSON_INTEGER_FORMAT " is not supported: this build "
                      "reads versions %d to %d",
                      json_integer_value(ver), PS_CKPT_FORMAT_VERSION_MIN,
                      PS_CKPT_FORMAT_VERSION);
  c->format_version = (int)json_integer_value(ver);
  if (get_u64(root, "", "step", &c->step, eb) != 0 ||
      get_u64(root, "", "global_step", &c->global_step, eb) != 0 ||
      get_number(root, "", "wall_time", 0, 1e12, &c->wall_time, eb) != 0 ||
      get_str(root, "", "cluster_id", 0, sizeof c->cluster_id - 1, &s, eb) != 0)
    return PS_ECORRUPT;
  snprintf(c->cluster_id, sizeof c->cluster_id, "%s", s);
  if (get_str(root, "", "model", 1, sizeof c->model - 1, &s, eb) != 0)
    return PS_ECORRUPT;
  snprintf(c->model, sizeof c->model, "%s", s);
  if (get_hex64(root, "", "layout_hash", &c->layout_hash, eb) != 0)
    return PS_ECORRUPT;
  if (c->format_version >= 2) {
    int rc = parse_model_def(root, c, eb);
    if (rc != 0)
      return rc;
  }
  if (c->format_version >= 3) {
    if (json_object_get(root, "base") == NULL)
      return bad(eb, "base", "a checkpoint's name (version 3: an incremental checkpoint)", NULL);
    if (get_base(root, c->base, eb) != 0)
      return PS_ECORRUPT;
    uint64_t bstep = 0;
    ps__ckpt_parse_name(c->base, &bstep);
    if (bstep >= c->step)
      return ps_err_set(eb, PS_ECORRUPT, "base: %s is not older than this checkpoint (step %"
                        PRIu64 "): expected the checkpoint before it", c->base, c->step);
  } else if (json_object_get(root, "base") != NULL) {
    return bad(eb, "base", "absent before format_version 3", json_object_get(root, "base"));
  }
  if (parse_optimizer(root, c, eb) != 0 || get_str(root, "", "consistency", 1, 8, &s, eb) != 0)
    return PS_ECORRUPT;
  c->consistency = -1;
  for (int i = 0; i < 3; i++)
    if (strcmp(s, consistency_names[i]) == 0)
      c->consistency = i;
  if (c->consistency < 0)
    return bad(eb, "consistency", "async, sync or ssp", json_object_get(root, "consistency"));
  if (get_str(root, "", "filter", 1, 16, &s, eb) != 0)
    return PS_ECORRUPT;
  if (ps_ckpt_filter_parse(s, &c->filter) != 0)
    return bad(eb, "filter", "none or shuffle", json_object_get(root, "filter"));
  if (get_int(root, "", "nshards", 1, PS_LAYOUT_MAX_SHARDS, &v, eb) != 0)
    return PS_ECORRUPT;
  c->nshards = (int)v;
  int rc = parse_shards(root, c, eb);
  if (rc == 0)
    rc = parse_variables(root, c, eb);
  if (rc != 0)
    return rc;
  uint64_t *pairs = NULL;
  rc = get_pairs(root, "", "data_positions", &pairs, &c->nworkers, eb);
  if (pairs != NULL) {
    c->data_pos = calloc((size_t)c->nworkers + 1, sizeof *c->data_pos);
    for (int w = 0; c->data_pos != NULL && w < c->nworkers; w++)
      c->data_pos[w] = (ps_data_pos){pairs[2 * w], pairs[2 * w + 1]};
    free(pairs);
    if (c->data_pos == NULL && rc == 0)
      rc = ps_err_set(eb, -ENOMEM, "out of memory");
  }
  return rc;
}

/* Keep a message one line whatever the input held. */
static void mask_controls(ps_errbuf *eb) {
  if (eb == NULL)
    return;
  for (char *p = eb->msg; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      *p = '?';
}

int ps_ckpt_parse_manifest(const char *json, size_t len, ps_ckpt *out, ps_errbuf *eb) {
  memset(out, 0, sizeof *out);
  json_error_t je;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
  if (root == NULL) {
    int rc = ps_err_set(eb, PS_ECORRUPT, "not valid JSON (line %d column %d: %s)", je.line,
                        je.column, je.text);
    mask_controls(eb);
    return rc;
  }
  int rc = parse_root(root, out, eb);
  json_decref(root);
  if (rc != 0) {
    mask_controls(eb);
    ps_ckpt_close(out);
  }
  return rc;
}

int ps__ckpt_manifest_fd(const char *ckpt_dir, char *mpath, size_t cap, size_t *size,
                         ps_errbuf *eb) {
  if ((size_t)snprintf(mpath, cap, "%s/" MANIFEST_FILE, ckpt_dir) >= cap)
    return ps_err_set(eb, -ENAMETOOLONG, "%s: path too long", ckpt_dir);
  int fd = open(mpath, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return ps_err_set(eb, -errno, "%s: cannot open: %s", mpath, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MANIFEST_MAX) {
    close(fd);
    return ps_err_set(eb, PS_ECORRUPT, "%s: not a regular file of at most %zu bytes", mpath,
                      MANIFEST_MAX);
  }
  *size = (size_t)st.st_size;
  return fd;
}

int ps__ckpt_manifest_model(const char *ckpt_dir, uint64_t *layout_hash, char *base, char *model, size_t cap,
                            ps_errbuf *eb) {
  char path[PATH_MAX];
  size_t size;
  int fd = ps__ckpt_manifest_fd(ckpt_dir, path, sizeof path, &size, eb);
  if (fd < 0)
    return fd;
  json_error_t je;
  json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
  close(fd);
  if (root == NULL) {
    int rc = ps_err_set(eb, PS_ECORRUPT, "%s: not valid JSON (line %d column %d: %s)", path,
                        je.line, je.column, je.text);
    mask_controls(eb);
    return rc;
  }
  ps_errbuf why = {0};
  const char *s;
  int rc = !json_is_object(root) ? bad(&why, "the manifest", "a JSON object", root)
           : get_str(root, "", "model", 1, cap - 1, &s, &why) != 0 ||
                   get_hex64(root, "", "layout_hash", layout_hash, &why) != 0
               ? PS_ECORRUPT
               : 0;
  if (rc == 0)
    snprintf(model, cap, "%s", s);
  if (rc == 0 && base != NULL)
    rc = get_base(root, base, &why);
  json_decref(root);
  if (rc != 0) {
    ps_err_set(eb, PS_ECORRUPT, "%s: %s", path, why.msg);
    mask_controls(eb);
  }
  return rc != 0 ? PS_ECORRUPT : 0;
}

/* ------------------------------------------------------------------ */
/* Opening a checkpoint: its manifest                                 */
/* ------------------------------------------------------------------ */

static void prefix_msg(ps_errbuf *eb, const char *prefix) {
  if (eb == NULL)
    return;
  char msg[sizeof eb->msg];
  /* Truncation is fine: the message stays one NUL-terminated line. */
  if (snprintf(msg, sizeof msg, "%s: %s", prefix, eb->msg) >= 0)
    memcpy(eb->msg, msg, sizeof msg);
}

int ps_ckpt_open(ps_ckpt *c, const char *path, ps_errbuf *eb) {
  memset(c, 0, sizeof *c);
  char mpath[PATH_MAX];
  size_t size;
  int fd = ps__ckpt_manifest_fd(path, mpath, sizeof mpath, &size, eb);
  if (fd < 0)
    return fd;
  char *text = malloc(size + 1);
  if (text == NULL) {
    close(fd);
    return ps_err_set(eb, -ENOMEM, "%s: out of memory", mpath);
  }
  ssize_t n = ps__ckpt_read_full(fd, text, size);
  close(fd);
  if (n < 0) {
    free(text);
    return ps_err_set(eb, (int)n, "%s: cannot read: %s", mpath, strerror((int)-n));
  }
  int rc = ps_ckpt_parse_manifest(text, (size_t)n, c, eb);
  free(text);
  if (rc != 0) {
    prefix_msg(eb, mpath);
    return rc;
  }
  c->path = strdup(path);
  if (c->path == NULL) {
    ps_ckpt_close(c);
    return ps_err_set(eb, -ENOMEM, "out of memory");
  }
  /* A trailing slash is not part of the name. */
  size_t end = strlen(path);
  while (end > 1 && path[end - 1] == '/')
    end--;
  size_t start = end;
  while (start > 0 && path[start - 1] != '/')
    start--;
  snprintf(c->name, sizeof c->name, "%.*s",
           (int)(end - start < sizeof c->name ? end - start : sizeof c->name - 1), path + start);
  /* A directory named ckpt-<step> holds that step (a renamed copy does not). */
  uint64_t named;
  if (ps__ckpt_parse_name(c->name, &named) == 0 && named != c->step) {
    rc = ps_err_set(eb, PS_ECORRUPT, "%s: the directory is step %" PRIu64 ", the manifest says "
                    "step %" PRIu64, path, named, c->step);
    ps_ckpt_close(c);
    return rc;
  }
  return 0;
}

void ps_ckpt_close(ps_ckpt *c) {
  if (c == NULL)
    return;
  for (int i = 0; c->vars != NULL && i < c->nvars; i++)
    free(c->vars[i].parts);
  for (int i = 0; c->shards != NULL && i < c->nshards; i++)
    free(c->shards[i].once);
  free(c->vars);
  free(c->shards);
  free(c->data_pos);
  free(c->path);
  memset(c, 0, sizeof *c);
}

int ps_ckpt_check_layout(const ps_ckpt *c, uint64_t layout_hash, const char *model,
                         ps_errbuf *eb) {
  if (c->layout_hash == layout_hash && model != NULL && strcmp(c->model, model) == 0)
    return 0;
  return ps_err_set(eb, PS_ELAYOUT,
                    "%s: layout mismatch (checkpoint: model '%s' layout %016" PRIx64
                    "; this cluster: model '%s' layout %016" PRIx64 ")",
                    c->path != NULL ? c->path : c->name, c->model, c->layout_hash,
                    model != NULL ? model : "", layout_hash);
}
