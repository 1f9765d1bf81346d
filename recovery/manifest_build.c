/* MANIFEST.json (recovery/FORMAT.md section 4) built from what a
 * checkpoint write recorded, in the names manifest.c reads back. */
#include "recovery/manifest_build.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/parse.h"
#include "nn/modelfile.h"
#include "recovery/manifest.h"

/* ------------------------------------------------------------------ */
/* JSON values as the manifest writes them                            */
/* ------------------------------------------------------------------ */

static json_t *json_u64(uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "%" PRIu64, v);
  return json_string(b);
}

static json_t *json_hex64(uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "%016" PRIx64, v);
  return json_string(b);
}

/* The shortest decimal that reads back as the same float, so that the
 * manifest says "0.001" rather than 0.0010000000474974513. */
static json_t *json_float(float f) {
  char b[32];
  return json_real(strtod(ps_float_format(f, b, sizeof b), NULL));
}

static json_t *json_pair_u64(uint64_t a, uint64_t b) {
  json_t *p = json_array();
  if (p != NULL && (json_array_append_new(p, json_u64(a)) != 0 ||
                    json_array_append_new(p, json_u64(b)) != 0)) {
    json_decref(p);
    return NULL;
  }
  return p;
}

/* ------------------------------------------------------------------ */
/* The manifest                                                       */
/* ------------------------------------------------------------------ */

/* `network`: the layers as a model file (MODELFILE.md), or null. */
static json_t *network_json(const ps_model_spec *spec) {
  if (spec == NULL)
    return json_null();
  char *text = ps_modelfile_text(spec, NULL, 0);
  json_t *j = text != NULL ? json_loads(text, 0, NULL) : NULL;
  free(text);
  return j;
}

/* `builtin`: {"name", "hidden"} when the model is a built-in, else null. */
static json_t *builtin_json(const ps_model_spec *spec) {
  char name[8], hidden[128];
  if (spec == NULL || ps__ckpt_builtin_of(spec->desc, name, sizeof name, hidden, sizeof hidden) != 0)
    return json_null();
  return json_pack("{s:s, s:s?}", "name", name, "hidden", hidden[0] ? hidden : NULL);
}

/* `normalization`: {"divide", "mean", "std"}, or null. */
static json_t *norm_json(const ps_data_norm *n) {
  if (n == NULL)
    return json_null();
  json_t *o = json_object();
  if (o == NULL || json_object_set_new(o, "divide", json_float(n->divide)) != 0 ||
      json_object_set_new(o, "mean", json_float(n->mean)) != 0 ||
      json_object_set_new(o, "std", json_float(n->std)) != 0) {
    json_decref(o);
    return NULL;
  }
  return o;
}

char *ps__ckpt_norm_text(const ps_data_norm *n, const char *comment, int indent) {
  json_t *o = norm_json(n);
  if (o != NULL && comment != NULL && json_object_set_new(o, "comment", json_string(comment)) != 0) {
    json_decref(o);
    return NULL;
  }
  size_t flags = JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(16) |
                 (indent > 0 ? JSON_INDENT(indent) : JSON_COMPACT);
  char *text = o != NULL ? json_dumps(o, flags) : NULL;
  json_decref(o);
  return text;
}

/* Every json_*_set_new / append_new steals its value, also on failure, and
 * fails on a NULL container or value: one flag catches any allocation
 * failure of the whole tree. */
#define SET(obj, key, val) (ok &= json_object_set_new((obj), (key), (val)) == 0)
#define APPEND(arr, val) (ok &= json_array_append_new((arr), (val)) == 0)

char *ps__ckpt_manifest_build(const ps_ckpt_write_opts *o, const ps__ckpt_shard_rec *recs,
                              double wall) {
  int ok = 1;
  const ps_layout *l = o->layout;
  const ps_vartable *t = o->vars;
  json_t *root = json_object();
  SET(root, "format", json_string("paramserv-checkpoint"));
  SET(root, "format_version",
      json_integer(o->base != NULL ? PS_CKPT_FORMAT_VERSION : PS_CKPT_FORMAT_VERSION_FULL));
  if (o->base != NULL)
    SET(root, "base", json_string(o->base));
  SET(root, "step", json_u64(o->step));
  SET(root, "global_step", json_u64(o->global_step));
  SET(root, "wall_time", json_real(wall));
  SET(root, "cluster_id", json_string(o->cluster_id));
  SET(root, "model", json_string(o->model));
  SET(root, "layout_hash", json_hex64(l->hash));
  SET(root, "network", network_json(o->network));
  SET(root, "builtin", builtin_json(o->network));
  SET(root, "normalization", norm_json(o->network != NULL ? o->norm : NULL));

  json_t *opt = json_object();
  SET(opt, "name", json_string(ps_optim_name(&o->optim)));
  SET(opt, "lr", json_float(o->optim.lr));
  SET(opt, "momentum", json_float(o->optim.momentum));
  SET(opt, "weight_decay", json_float(o->optim.weight_decay));
  SET(opt, "beta1", json_float(o->optim.beta1));
  SET(opt, "beta2", json_float(o->optim.beta2));
  SET(opt, "eps", json_float(o->optim.eps));
  SET(opt, "initial_accumulator", json_float(o->optim.initial_accumulator));
  SET(root, "optimizer", opt);
  SET(root, "consistency", json_string(ps__ckpt_consistency_name(o->consistency)));
  SET(root, "filter", json_string(ps_ckpt_filter_name(o->filter)));
  SET(root, "nshards", json_integer(l->nshards));

  /* The layout's parts are sorted by (var, start): one run per variable. */
  json_t *vars = json_array();
  int p = 0;
  for (int v = 0; v < t->n; v++) {
    const ps_var *var = &t->vars[v];
    json_t *jv = json_object(), *shape = json_array(), *parts = json_array();
    SET(jv, "name", json_string(var->name));
    for (int d = 0; d < var->ndim; d++)
      APPEND(shape, json_integer(var->shape[d]));
    SET(jv, "shape", shape);
    SET(jv, "dtype", json_string("float32"));
    SET(jv, "offset", json_integer((json_int_t)var->offset));
    SET(jv, "count", json_integer((json_int_t)var->count));
    for (; p < l->nparts && l->parts[p].var == v; p++) {
      const ps_part *pt = &l->parts[p];
      json_t *jp = json_object();
      SET(jp, "shard", json_integer(pt->shard));
      SET(jp, "start", json_integer((json_int_t)pt->start));
      SET(jp, "count", json_integer((json_int_t)pt->count));
      SET(jp, "shard_off", json_integer((json_int_t)pt->shard_off));
      APPEND(parts, jp);
    }
    SET(jv, "parts", parts);
    APPEND(vars, jv);
  }
  SET(root, "variables", vars);

  json_t *shards = json_array();
  for (int i = 0; i < l->nshards; i++) {
    const ps_ckpt_shard_state *s = &o->shards[i];
    char file[PS_CKPT_NAME_MAX];
    snprintf(file, sizeof file, "shard-%d.lz4", i);
    json_t *js = json_object(), *once = json_array();
    SET(js, "index", json_integer(i));
    SET(js, "file", json_string(file));
    const ps_state_info *in = &s->info;
    SET(js, "floats", json_integer((json_int_t)s->nfloats));
    /* The stored fixed fields (FORMAT.md; manifest.c's get_state reads them). */
    for (const ps_state_field *f = ps_state_fields; f < ps_state_fields + PS_STATE_NFIELDS; f++) {
      uint64_t v = ps_state_get(in, f);
      if (f->role != PS_STATE_DERIVED)
        SET(js, f->name, f->width == 8 ? json_u64(v)
                         : f->max == 1 ? json_boolean(v)
                                       : json_integer((json_int_t)v));
    }
    for (uint32_t w = 0; w < in->nonce; w++) {
      ps_once row = ps_state_once_get(in, s->nfloats, s->img, w);
      APPEND(once, json_pair_u64(row.incarnation, row.last_seq));
    }
    SET(js, "once", once);
    /* A model with sparse tables: the section the file holds after the
     * segments (absent: none). */
    if (in->table_floats > 0)
      SET(js, "table_floats", json_u64(in->table_floats));
    if (o->base != NULL) {
      SET(js, "delta_floats", json_u64(s->delta_bytes / sizeof(float)));
      SET(js, "base_xxh64", json_hex64(s->base_xxh64));
      SET(js, "state_xxh64", json_hex64(recs[i].state_xxh64));
    }
    SET(js, "compressed_size", json_integer((json_int_t)recs[i].stored));
    SET(js, "uncompressed_size", json_integer((json_int_t)recs[i].raw));
    SET(js, "xxh64", json_hex64(recs[i].xxh64));
    APPEND(shards, js);
  }
  SET(root, "shards", shards);

  json_t *pos = json_array();
  for (int w = 0; w < o->nworkers; w++)
    APPEND(pos, json_pair_u64(o->data_pos[w].epoch, o->data_pos[w].offset));
  SET(root, "data_positions", pos);

  /* 16 digits: the optimizer's short decimals print as written, and the
   * wall time keeps its microseconds. */
  char *text = ok ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(16)) : NULL;
  json_decref(root);
  return text;
}
