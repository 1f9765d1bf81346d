/* Model files and variables files (MODELFILE.md): strict JSON readers.
 * Every key is known, every value typed and bounded; what is wrong is one
 * line naming the file, the layer or variable, the key, what was found and
 * what was expected. */
#include "nn/modelfile.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/parse.h"

/* Where a value sits, for messages: "model.json: layer 3 (conv2d)". */
typedef struct where {
  const char *file;
  char at[96];
} where;

static int bad(ps_errbuf *eb, const where *w, const char *key, const char *expected,
               const json_t *found) {
  char f[64];
  if (found == NULL)
    snprintf(f, sizeof f, "nothing");
  else if (json_is_string(found))
    snprintf(f, sizeof f, "\"%.40s\"", json_string_value(found));
  else if (json_is_integer(found))
    snprintf(f, sizeof f, "%" JSON_INTEGER_FORMAT, json_integer_value(found));
  else if (json_is_real(found))
    snprintf(f, sizeof f, "%g", json_real_value(found));
  else
    snprintf(f, sizeof f, "%s", json_is_object(found)  ? "an object"
                                : json_is_array(found) ? "an array"
                                : json_is_boolean(found) ? "a boolean"
                                                         : "null");
  return ps_err_set(eb, PS_EUSAGE, "%s: %s%s%s: found %s, expected %s", w->file, w->at,
                    w->at[0] ? ": " : "", key, f, expected);
}

/* Only `keys` (NULL-terminated) may appear in obj. */
static int known_keys(const json_t *obj, const char *const *keys, const where *w,
                      ps_errbuf *eb) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)obj, k, v) {
    int ok = 0;
    char list[160] = "";
    size_t n = 0;
    for (int i = 0; keys[i] != NULL; i++) {
      ok |= strcmp(k, keys[i]) == 0;
      n += (size_t)snprintf(list + n, n < sizeof list ? sizeof list - n : 0, "%s%s",
                            i ? ", " : "", keys[i]);
    }
    if (!ok)
      return ps_err_set(eb, PS_EUSAGE, "%s: %s%sunknown key \"%.40s\": expected one of %s",
                        w->file, w->at, w->at[0] ? ": " : "", k, list);
  }
  return 0;
}

/* An integer in [lo, hi]; `def` when absent, or an error when def < lo. */
static int get_int(const json_t *obj, const char *key, int def, int lo, int hi, int *out,
                   const where *w, ps_errbuf *eb) {
  const json_t *v = json_object_get(obj, key);
  if (v == NULL && def >= lo) {
    *out = def;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    char exp[64];
    snprintf(exp, sizeof exp, "an integer in [%d, %d]", lo, hi);
    return bad(eb, w, key, exp, v);
  }
  *out = (int)json_integer_value(v);
  return 0;
}

/* ------------------------------------------------------------- layers */

/* Each layer type's keys; its name is ps_layer_type_name's. */
static const struct {
  ps_layer_type type;
  const char *const keys[15];
} LAYERS[] = {
    {PS_LT_DENSE, {"type", "name", "out", NULL}},
    {PS_LT_CONV2D, {"type", "name", "out", "kernel", "stride", "padding", NULL}},
    {PS_LT_MAXPOOL, {"type", "kernel", "stride", "padding", NULL}},
    {PS_LT_DROPOUT, {"type", "p", "channels", NULL}},
    {PS_LT_RELU, {"type", NULL}},
    {PS_LT_FLATTEN, {"type", NULL}},
    {PS_LT_LOG_SOFTMAX, {"type", NULL}},
    {PS_LT_EMBEDDING_BAG, {"type", "name", "fields", "field", "dim", "combiner", "pooling", "init",
                           "scale", "optimizer", "lr", "admit_after", "idle_steps", "max_rows",
                           NULL}},
    {PS_LT_SIGMOID, {"type", NULL}},
};

static const char *const COMBINERS[] = {"sum", "mean", "sqrtn", NULL};
static const char *const POOLINGS[] = {"worker", "server", NULL};
static const char *const INITS[] = {"zeros", "normal", "uniform", NULL};

/* One of names (NULL-terminated): its index into *out, def when absent. */
static int get_choice(const json_t *obj, const char *key, const char *const *names, int def,
                      const char *expected, int *out, const where *w, ps_errbuf *eb) {
  const json_t *v = json_object_get(obj, key);
  if (v == NULL) {
    *out = def;
    return 0;
  }
  for (int i = 0; json_is_string(v) && names[i] != NULL; i++)
    if (strcmp(json_string_value(v), names[i]) == 0) {
      *out = i;
      return 0;
    }
  return bad(eb, w, key, expected, v);
}

/* embedding_bag's keys (MODELFILE.md, "Sparse models"). */
static int parse_embedding(const json_t *o, ps_layer_spec *l, const where *w, ps_errbuf *eb) {
  const json_t *fields = json_object_get(o, "fields"), *field = json_object_get(o, "field");
  if ((fields == NULL) == (field == NULL))
    return bad(eb, w, "fields", "[first, last] (1-based categorical fields) or one \"field\"",
               fields != NULL ? fields : field);
  if (field != NULL) {
    if (get_int(o, "field", -1, 1, 4096, &l->field_first, w, eb) != 0)
      return PS_EUSAGE;
    l->field_last = l->field_first;
  } else {
    const json_t *a = json_array_get(fields, 0), *b = json_array_get(fields, 1);
    if (!json_is_array(fields) || json_array_size(fields) != 2 || !json_is_integer(a) ||
        !json_is_integer(b) || json_integer_value(a) < 1 ||
        json_integer_value(b) < json_integer_value(a) || json_integer_value(b) > 4096)
      return bad(eb, w, "fields", "[first, last] with 1 <= first <= last <= 4096", fields);
    l->field_first = (int)json_integer_value(a);
    l->field_last = (int)json_integer_value(b);
  }
  int rc = get_int(o, "dim", -1, 1, PS_MODEL_MAX_DIM, &l->dim, w, eb);
  if (rc == 0)
    rc = get_choice(o, "combiner", COMBINERS, PS_COMBINER_SUM, "sum, mean or sqrtn",
                    &l->combiner, w, eb);
  if (rc == 0)
    rc = get_choice(o, "pooling", POOLINGS, 0, "worker or server", &l->server_pool, w, eb);
  if (rc == 0)
    rc = get_choice(o, "init", INITS, 1, "zeros, normal or uniform", &l->init_kind, w, eb);
  if (rc != 0)
    return rc;
  const json_t *scale = json_object_get(o, "scale");
  if (l->init_kind == 0 && scale != NULL)
    return bad(eb, w, "scale", "no scale for zeros", scale);
  /* A positive number a float rounds to 0 is refused too: a table's
   * scale 0 would fail only when a shard creates the table. */
  if (scale != NULL && (!json_is_number(scale) || !((float)json_number_value(scale) > 0.0f) ||
                        json_number_value(scale) > 1e3))
    return bad(eb, w, "scale", "a number in (0, 1000]", scale);
  l->init_scale = l->init_kind == 0 ? 0.0f : scale != NULL ? (float)json_number_value(scale) : 0.01f;
  const json_t *opt = json_object_get(o, "optimizer");
  ps_optim probe;
  if (opt != NULL && (!json_is_string(opt) || json_string_length(opt) >= sizeof l->optimizer ||
                      ps_optim_parse(json_string_value(opt), &probe) != 0))
    return bad(eb, w, "optimizer", "sgd, momentum, nesterov, adagrad or adam", opt);
  snprintf(l->optimizer, sizeof l->optimizer, "%s", opt != NULL ? json_string_value(opt) : "adagrad");
  const json_t *lr = json_object_get(o, "lr");
  /* Likewise the rate: 0 would silently mean the [train] lr. */
  if (lr != NULL && (!json_is_number(lr) || !((float)json_number_value(lr) > 0.0f) ||
                     json_number_value(lr) > 1e3))
    return bad(eb, w, "lr", "a learning rate in (0, 1000] (absent: [train] lr)", lr);
  l->lr = lr != NULL ? (float)json_number_value(lr) : 0.0f;
  int admit = 0, idle = 0, rows = 0;
  if ((rc = get_int(o, "admit_after", 0, 0, 1 << 20, &admit, w, eb)) != 0 ||
      (rc = get_int(o, "idle_steps", 0, 0, INT32_MAX, &idle, w, eb)) != 0 ||
      (rc = get_int(o, "max_rows", 0, 0, INT32_MAX, &rows, w, eb)) != 0)
    return rc;
  l->admit_after = (uint32_t)admit;
  l->idle_steps = (uint64_t)idle;
  l->max_rows = (uint32_t)rows;
  return 0;
}
#define NTYPES (sizeof LAYERS / sizeof LAYERS[0])

static int parse_layer(const json_t *o, int i, ps_layer_spec *l, const char *file,
                       ps_errbuf *eb) {
  where w = {file, ""};
  snprintf(w.at, sizeof w.at, "layer %d", i + 1);
  if (!json_is_object(o))
    return bad(eb, &w, "layer", "an object such as {\"type\": \"relu\"}", o);
  const json_t *t = json_object_get(o, "type");
  size_t k = 0;
  while (k < NTYPES && !(json_is_string(t) &&
                         strcmp(json_string_value(t), ps_layer_type_name(LAYERS[k].type)) == 0))
    k++;
  if (k == NTYPES)
    return bad(eb, &w, "type",
               "dense, conv2d, maxpool, dropout, relu, flatten, embedding_bag, log_softmax or "
               "sigmoid", t);
  memset(l, 0, sizeof *l);
  l->type = LAYERS[k].type;
  snprintf(w.at, sizeof w.at, "layer %d (%s)", i + 1, ps_layer_type_name(l->type));
  int rc = 0;
  if (l->type == PS_LT_DENSE || l->type == PS_LT_CONV2D || l->type == PS_LT_EMBEDDING_BAG) {
    const json_t *n = json_object_get(o, "name");
    if (!json_is_string(n) || json_string_length(n) < 1 ||
        json_string_length(n) >= sizeof l->name ||
        strlen(json_string_value(n)) != json_string_length(n))
      return bad(eb, &w, "name", "a name of 1 to 31 characters (it names the variables)", n);
    snprintf(l->name, sizeof l->name, "%s", json_string_value(n));
    snprintf(w.at, sizeof w.at, "layer %d (%s %s)", i + 1, ps_layer_type_name(l->type), l->name);
  }
  if (known_keys(o, LAYERS[k].keys, &w, eb) != 0)
    return PS_EUSAGE;
  if (l->type == PS_LT_EMBEDDING_BAG)
    return parse_embedding(o, l, &w, eb);
  if (l->type == PS_LT_DENSE || l->type == PS_LT_CONV2D)
    rc = get_int(o, "out", -1, 1, 1 << 20, &l->out, &w, eb);
  if (rc == 0 && (l->type == PS_LT_CONV2D || l->type == PS_LT_MAXPOOL))
    rc = get_int(o, "kernel", -1, 1, 4096, &l->kernel, &w, eb);
  if (rc == 0 && l->type == PS_LT_CONV2D)
    rc = get_int(o, "stride", 1, 1, 4096, &l->stride, &w, eb);
  if (rc == 0 && l->type == PS_LT_MAXPOOL)
    rc = get_int(o, "stride", l->kernel, 1, 4096, &l->stride, &w, eb);
  if (rc == 0 && (l->type == PS_LT_CONV2D || l->type == PS_LT_MAXPOOL))
    rc = get_int(o, "padding", 0, 0, 4096, &l->padding, &w, eb);
  if (rc == 0 && l->type == PS_LT_DROPOUT) {
    const json_t *p = json_object_get(o, "p"), *c = json_object_get(o, "channels");
    if (!json_is_number(p) || !(json_number_value(p) >= 0.0 && json_number_value(p) < 1.0))
      return bad(eb, &w, "p", "a probability of dropping in [0, 1)", p);
    if (c != NULL && !json_is_boolean(c))
      return bad(eb, &w, "channels", "true (drop whole channels) or false", c);
    l->p = (float)json_number_value(p);
    l->channels = json_is_true(c);
  }
  return rc;
}

/* Parse a loaded document into spec. */
static int layers_from(const json_t *doc, const char *file, ps_model_spec *spec,
                       ps_errbuf *eb) {
  where w = {file, ""};
  static const char *const top[] = {"comment", "input", "layers", NULL};
  if (!json_is_object(doc))
    return bad(eb, &w, "the document", "an object with \"input\" and \"layers\"", doc);
  if (known_keys(doc, top, &w, eb) != 0)
    return PS_EUSAGE;
  memset(spec, 0, sizeof *spec);
  const json_t *in = json_object_get(doc, "input");
  int dims[3] = {1, 1, 1};
  size_t nd = json_array_size(in);
  if (!json_is_array(in) || (nd != 3 && nd != 1))
    return bad(eb, &w, "input", "[channels, height, width], as [1, 28, 28], or [features]", in);
  for (size_t d = 0; d < nd; d++) {
    const json_t *v = json_array_get(in, d);
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 4096)
      return bad(eb, &w, "input", "[channels, height, width] or [features], integers in [1, 4096]", v);
    dims[d] = (int)json_integer_value(v);
  }
  spec->in_c = dims[0];
  spec->in_h = dims[1];
  spec->in_w = dims[2];
  const json_t *layers = json_object_get(doc, "layers");
  char exp[64];
  snprintf(exp, sizeof exp, "an array of 1 to %d layers", PS_MODEL_MAX_LAYERS);
  if (!json_is_array(layers) || json_array_size(layers) < 1 ||
      json_array_size(layers) > PS_MODEL_MAX_LAYERS)
    return bad(eb, &w, "layers", exp, layers);
  for (size_t i = 0; i < json_array_size(layers); i++) {
    int rc = parse_layer(json_array_get(layers, i), (int)i, &spec->layers[i], file, eb);
    if (rc != 0)
      return rc;
    spec->nlayers++;
  }
  return ps_model_spec_check(spec, file, eb);
}

/* jansson's own message names the line and column. */
static int load_error(ps_errbuf *eb, const char *what, const json_error_t *je) {
  if (je->line < 0)  /* "unable to open PATH: why" */
    return ps_err_set(eb, -ENOENT, "%s", je->text);
  return ps_err_set(eb, PS_EUSAGE, "%s:%d:%d: %s", what, je->line, je->column, je->text);
}

/* A message quotes what the file holds: control characters in it (a key
 * with a newline) become '?', so that it stays one line. */
static int one_line(int rc, ps_errbuf *eb) {
  for (char *p = eb->msg; rc != 0 && *p != '\0'; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      *p = '?';
  return rc;
}

/* Parse text and hand the document to `from`. */
#define WITH_DOC(load, what, call)                                      \
  do {                                                                  \
    json_error_t je;                                                    \
    json_t *doc = (load);                                               \
    if (doc == NULL)                                                    \
      return one_line(load_error(eb, (what), &je), eb);                 \
    int rc_ = (call);                                                   \
    json_decref(doc);                                                   \
    return one_line(rc_, eb);                                           \
  } while (0)

int ps_modelfile_parse(const char *text, size_t len, const char *what, ps_model_spec *spec,
                       ps_errbuf *eb) {
  WITH_DOC(json_loadb(text, len, JSON_REJECT_DUPLICATES, &je), what,
           layers_from(doc, what, spec, eb));
}

int ps_modelfile_load(const char *path, ps_model_spec *spec, ps_errbuf *eb) {
  WITH_DOC(json_load_file(path, JSON_REJECT_DUPLICATES, &je), path,
           layers_from(doc, path, spec, eb));
}

/* Each key a reader would default, written out, so that the file says
 * everything; numbers as the shortest decimal of their float. */
char *ps_modelfile_text(const ps_model_spec *spec, const char *comment, int indent) {
  int ok = 1;
  json_t *doc = json_object(), *in = json_array(), *layers = json_array();
#define SET(o, k, v) (ok &= json_object_set_new((o), (k), (v)) == 0)
  if (comment != NULL)
    SET(doc, "comment", json_string(comment));
  ok &= json_array_append_new(in, json_integer(spec->in_c)) == 0;
  ok &= json_array_append_new(in, json_integer(spec->in_h)) == 0;
  ok &= json_array_append_new(in, json_integer(spec->in_w)) == 0;
  SET(doc, "input", in);
  for (int i = 0; i < spec->nlayers; i++) {
    const ps_layer_spec *l = &spec->layers[i];
    json_t *o = json_object();
    SET(o, "type", json_string(ps_layer_type_name(l->type)));
    if (l->type == PS_LT_DENSE || l->type == PS_LT_CONV2D) {
      SET(o, "name", json_string(l->name));
      SET(o, "out", json_integer(l->out));
    }
    if (l->type == PS_LT_CONV2D || l->type == PS_LT_MAXPOOL) {
      SET(o, "kernel", json_integer(l->kernel));
      SET(o, "stride", json_integer(l->stride));
      SET(o, "padding", json_integer(l->padding));
    }
    if (l->type == PS_LT_DROPOUT) {
      char b[32];
      SET(o, "p", json_real(strtod(ps_float_format(l->p, b, sizeof b), NULL)));
      SET(o, "channels", json_boolean(l->channels));
    }
    if (l->type == PS_LT_EMBEDDING_BAG) {
      char b[32];
      json_t *f = json_array();
      ok &= json_array_append_new(f, json_integer(l->field_first)) == 0;
      ok &= json_array_append_new(f, json_integer(l->field_last)) == 0;
      SET(o, "name", json_string(l->name));
      SET(o, "fields", f);
      SET(o, "dim", json_integer(l->dim));
      SET(o, "combiner", json_string(COMBINERS[l->combiner]));
      if (l->server_pool)
        SET(o, "pooling", json_string(POOLINGS[l->server_pool]));
      SET(o, "init", json_string(INITS[l->init_kind]));
      if (l->init_kind != 0)
        SET(o, "scale", json_real(strtod(ps_float_format(l->init_scale, b, sizeof b), NULL)));
      SET(o, "optimizer", json_string(l->optimizer));
      if (l->lr > 0)
        SET(o, "lr", json_real(strtod(ps_float_format(l->lr, b, sizeof b), NULL)));
      SET(o, "admit_after", json_integer(l->admit_after));
      SET(o, "idle_steps", json_integer((json_int_t)l->idle_steps));
      SET(o, "max_rows", json_integer(l->max_rows));
    }
    ok &= json_array_append_new(layers, o) == 0;
  }
  SET(doc, "layers", layers);
#undef SET
  size_t flags = JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(16) |
                 (indent > 0 ? JSON_INDENT(indent) : JSON_COMPACT);
  char *text = ok ? json_dumps(doc, flags) : NULL;
  json_decref(doc);
  return text;
}

/* ---------------------------------------------------------- variables */

#define MAX_VAR_FLOATS (1ULL << 31)

static int parse_variable(const json_t *o, int i, ps_vartable *t, XXH64_state_t *h,
                          const char *file, ps_errbuf *eb) {
  where w = {file, ""};
  snprintf(w.at, sizeof w.at, "variable %d", i + 1);
  static const char *const keys[] = {"name", "shape", "init", "scale", NULL};
  if (!json_is_object(o))
    return bad(eb, &w, "variable", "an object with name, shape and init", o);
  const json_t *n = json_object_get(o, "name");
  if (!json_is_string(n) || json_string_length(n) < 1 ||
      json_string_length(n) >= PS_VAR_NAME_MAX ||
      strlen(json_string_value(n)) != json_string_length(n))
    return bad(eb, &w, "name", "a name of 1 to 63 characters", n);
  const char *name = json_string_value(n);
  snprintf(w.at, sizeof w.at, "variable %d (%s)", i + 1, name);
  if (known_keys(o, keys, &w, eb) != 0)
    return PS_EUSAGE;
  if (ps_vartable_find(t, name) >= 0)
    return bad(eb, &w, "name", "a name no other variable has", n);
  const json_t *s = json_object_get(o, "shape");
  uint32_t shape[PS_VAR_MAX_DIMS];
  if (!json_is_array(s) || json_array_size(s) < 1 || json_array_size(s) > PS_VAR_MAX_DIMS)
    return bad(eb, &w, "shape", "an array of 1 to 4 dimensions, as [784, 10]", s);
  uint64_t count = 1;
  for (size_t d = 0; d < json_array_size(s); d++) {
    const json_t *v = json_array_get(s, d);
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > (json_int_t)MAX_VAR_FLOATS)
      return bad(eb, &w, "shape", "dimensions of integers >= 1", v);
    count *= (uint64_t)json_integer_value(v);
    if (count + t->total > MAX_VAR_FLOATS)
      return bad(eb, &w, "shape", "at most 2^31 floats in all the variables", s);
    shape[d] = (uint32_t)json_integer_value(v);
  }
  const json_t *in = json_object_get(o, "init"), *sc = json_object_get(o, "scale");
  ps_init init = {PS_INIT_ZEROS, 0.0f};
  const char *kind = json_string_value(in);
  if (kind == NULL || (strcmp(kind, "zeros") != 0 && strcmp(kind, "uniform") != 0 &&
                       strcmp(kind, "normal") != 0))
    return bad(eb, &w, "init", "\"zeros\", \"uniform\" (in -scale..scale) or \"normal\" "
                               "(standard deviation scale)", in);
  if (strcmp(kind, "zeros") == 0) {
    if (sc != NULL)
      return bad(eb, &w, "scale", "no scale for zeros", sc);
  } else {
    double a = json_number_value(sc);
    if (!json_is_number(sc) || !(a > 0.0 && a <= 1e6))
      return bad(eb, &w, "scale", "a number in (0, 1e6]", sc);
    init.kind = strcmp(kind, "uniform") == 0 ? PS_INIT_UNIFORM : PS_INIT_NORMAL;
    init.a = (float)a;
  }
  int rc = ps_vartable_add(t, name, (int)json_array_size(s), shape, init);
  if (rc < 0)
    return ps_err_set(eb, rc, "%s: %s: %s", file, w.at, ps_strerror(rc));
  char text[160];
  int len = snprintf(text, sizeof text, "%s %zu %u %u %u %u %d %.9g;", name,
                     json_array_size(s), shape[0], json_array_size(s) > 1 ? shape[1] : 0,
                     json_array_size(s) > 2 ? shape[2] : 0, json_array_size(s) > 3 ? shape[3] : 0,
                     (int)init.kind, (double)init.a);
  XXH64_update(h, text, (size_t)len);
  return 0;
}

static int variables_from(const json_t *doc, const char *file, ps_vartable *t, char *desc,
                          size_t desc_len, ps_errbuf *eb) {
  where w = {file, ""};
  static const char *const top[] = {"comment", "variables", NULL};
  if (!json_is_object(doc))
    return bad(eb, &w, "the document", "an object with \"variables\"", doc);
  if (known_keys(doc, top, &w, eb) != 0)
    return PS_EUSAGE;
  const json_t *vars = json_object_get(doc, "variables");
  if (!json_is_array(vars) || json_array_size(vars) < 1 || json_array_size(vars) > 4096)
    return bad(eb, &w, "variables", "an array of 1 to 4096 variables", vars);
  XXH64_state_t *h = XXH64_createState();
  if (h == NULL)
    return ps_err_set(eb, -ENOMEM, "%s: out of memory", file);
  XXH64_reset(h, 0);
  int rc = 0;
  for (size_t i = 0; i < json_array_size(vars) && rc == 0; i++)
    rc = parse_variable(json_array_get(vars, i), (int)i, t, h, file, eb);
  if (rc == 0)
    snprintf(desc, desc_len, "variables %d #%016" PRIx64, t->n, (uint64_t)XXH64_digest(h));
  XXH64_freeState(h);
  if (rc != 0) {
    ps_vartable_close(t);
    ps_vartable_init(t);
  }
  return rc;
}

int ps_varfile_parse(const char *text, size_t len, const char *what, ps_vartable *t, char *desc,
                     size_t desc_len, ps_errbuf *eb) {
  WITH_DOC(json_loadb(text, len, JSON_REJECT_DUPLICATES, &je), what,
           variables_from(doc, what, t, desc, desc_len, eb));
}

int ps_varfile_load(const char *path, ps_vartable *t, char *desc, size_t desc_len,
                    ps_errbuf *eb) {
  WITH_DOC(json_load_file(path, JSON_REJECT_DUPLICATES, &je), path,
           variables_from(doc, path, t, desc, desc_len, eb));
}

/* ------------------------------------------------------------- config */

int ps_model_for_config(const ps_config *cfg, ps_model *m, ps_errbuf *eb) {
  char path[2 * PS_CONFIG_PATH_MAX];
  memset(m, 0, sizeof *m);
  if (cfg->variables_file[0] != '\0') {
    ps_config_file_path(cfg, cfg->variables_file, path, sizeof path);
    ps_vartable_init(&m->vars);
    return ps_varfile_load(path, &m->vars, m->spec.desc, sizeof m->spec.desc, eb);
  }
  ps_model_spec spec;
  int rc;
  if (cfg->model_file[0] != '\0') {
    rc = ps_modelfile_load(ps_config_file_path(cfg, cfg->model_file, path, sizeof path), &spec,
                           eb);
  } else {
    /* [model] hidden has a default; it means something for the mlp only. */
    const char *hidden = strcmp(cfg->model, "mlp") == 0 && cfg->hidden[0] ? cfg->hidden : NULL;
    rc = ps_model_spec_parse(cfg->model, hidden, &spec, eb);
  }
  return rc != 0 ? rc : ps_model_build(&spec, m, eb);
}
