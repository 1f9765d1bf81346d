/* Checkpoint export: a checkpoint's variables as safetensors or .npy files. */
#include "recovery/export.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "nn/modelfile.h"
#include "recovery/commit.h"
#include "recovery/manifest_build.h"

/* What the model is, as an export writes it beside the arrays: the model
 * file and the normalization, each JSON text (NULL when the checkpoint's
 * model has no layers, or a version 1 manifest cannot say them). */
typedef struct model_texts {
  char *network, *norm;
} model_texts;

static void model_texts_free(model_texts *t) {
  free(t->network);
  free(t->norm);
  *t = (model_texts){0};
}

/* ------------------------------------------------------------------ */
/* safetensors                                                        */
/* ------------------------------------------------------------------ */

/* The header is JSON: {"__metadata__": {string: string}, name: {"dtype":
 * "F32", "shape": [...], "data_offsets": [begin, end]}, ...}, offsets in
 * bytes from the start of the data, which follows the header. */
static char *safetensors_header(const ps_ckpt *c, const model_texts *mt, size_t *len) {
  int ok = 1;
  char buf[64];
  json_t *root = json_object(), *meta = json_object();
  ok &= json_object_set_new(meta, "format", json_string("paramserv")) == 0;
  snprintf(buf, sizeof buf, "%d", c->format_version);
  ok &= json_object_set_new(meta, "paramserv.format_version", json_string(buf)) == 0;
  ok &= json_object_set_new(meta, "paramserv.checkpoint", json_string(c->name)) == 0;
  snprintf(buf, sizeof buf, "%" PRIu64, c->step);
  ok &= json_object_set_new(meta, "paramserv.step", json_string(buf)) == 0;
  ok &= json_object_set_new(meta, "paramserv.model", json_string(c->model)) == 0;
  snprintf(buf, sizeof buf, "%016" PRIx64, c->layout_hash);
  ok &= json_object_set_new(meta, "paramserv.layout_hash", json_string(buf)) == 0;
  ok &= json_object_set_new(meta, "paramserv.cluster_id", json_string(c->cluster_id)) == 0;
  if (mt->network != NULL) {
    ok &= json_object_set_new(meta, "paramserv.network", json_string(mt->network)) == 0;
    ok &= json_object_set_new(meta, "paramserv.normalization", json_string(mt->norm)) == 0;
  }
  ok &= json_object_set_new(root, "__metadata__", meta) == 0;
  for (int i = 0; i < c->nvars; i++) {
    const ps_ckpt_var *v = &c->vars[i];
    json_t *t = json_object(), *shape = json_array(), *offs = json_array();
    ok &= json_object_set_new(t, "dtype", json_string("F32")) == 0;
    for (int d = 0; d < v->ndim; d++)
      ok &= json_array_append_new(shape, json_integer(v->shape[d])) == 0;
    ok &= json_object_set_new(t, "shape", shape) == 0;
    ok &= json_array_append_new(offs, json_integer((json_int_t)(v->offset * sizeof(float)))) == 0;
    ok &= json_array_append_new(
              offs, json_integer((json_int_t)((v->offset + v->count) * sizeof(float)))) == 0;
    ok &= json_object_set_new(t, "data_offsets", offs) == 0;
    ok &= json_object_set_new(root, v->name, t) == 0;
  }
  char *text = ok ? json_dumps(root, JSON_COMPACT) : NULL;
  json_decref(root);
  if (text == NULL)
    return NULL;
  /* Spaces pad the header so that the data starts 8-byte aligned. */
  size_t n = strlen(text), padded = (n + 7) / 8 * 8;
  char *out = realloc(text, padded + 1);
  if (out == NULL) {
    free(text);
    return NULL;
  }
  memset(out + n, ' ', padded - n);
  out[padded] = '\0';
  *len = padded;
  return out;
}

static int export_safetensors(const ps_ckpt *c, const float *arena, const model_texts *mt,
                              const char *path, ps_errbuf *eb) {
  for (int i = 0; i < c->nvars; i++)
    if (strcmp(c->vars[i].name, "__metadata__") == 0)
      return ps_err_set(eb, PS_EUSAGE, "%s: the variable name __metadata__ is reserved in "
                        "safetensors", path);
  size_t hlen = 0;
  char *header = safetensors_header(c, mt, &hlen);
  if (header == NULL)
    return ps_err_set(eb, -ENOMEM, "%s: out of memory", path);
  unsigned char len8[8];
  for (int i = 0; i < 8; i++)
    len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  const void *bufs[3] = {len8, header, arena};
  size_t lens[3] = {8, hlen, c->total_floats * sizeof(float)};
  int rc = ps__ckpt_write_file(path, bufs, lens, 3, eb);
  free(header);
  return rc;
}

/* ------------------------------------------------------------------ */
/* npy                                                                */
/* ------------------------------------------------------------------ */

/* NPY 1.0: magic, version 1.0, u16 LE header length, then a Python dict
 * literal padded with spaces and ended by '\n' so that the data starts at a
 * multiple of 64 bytes.  descr: '<f4' (float32) or '<u8' (uint64). */
static size_t npy_header(const char *descr, int ndim, const uint64_t *shape, char *out,
                         size_t cap) {
  char dims[160];
  size_t w = 0;
  for (int d = 0; d < ndim; d++)
    w += (size_t)snprintf(dims + w, sizeof dims - w, "%s%" PRIu64, d ? ", " : "", shape[d]);
  if (ndim == 1)
    snprintf(dims + w, sizeof dims - w, ",");
  char dict[256];
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                   descr, dims);
  size_t total = (10 + (size_t)n + 1 + 63) / 64 * 64;  /* magic..len, dict, '\n' */
  size_t hlen = total - 10;
  if (total > cap)
    return 0;
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  out[8] = (char)(hlen & 0xff);
  out[9] = (char)(hlen >> 8);
  memcpy(out + 10, dict, (size_t)n);
  memset(out + 10 + n, ' ', total - 10 - (size_t)n - 1);
  out[total - 1] = '\n';
  return total;
}

/* The one npy writer: dir/<name>.npy, its header, then `bytes` of data in
 * C order (written to a temporary, fsynced, renamed). */
static int write_npy(const char *dir, const char *name, const char *descr, int ndim,
                     const uint64_t *shape, const void *data, size_t bytes, ps_errbuf *eb) {
  char path[PATH_MAX], header[384];
  if ((size_t)snprintf(path, sizeof path, "%s/%s.npy", dir, name) >= sizeof path)
    return ps_err_set(eb, -ENAMETOOLONG, "%s/%s.npy: path too long", dir, name);
  size_t hlen = npy_header(descr, ndim, shape, header, sizeof header);
  const void *bufs[2] = {header, data};
  size_t lens[2] = {hlen, bytes};
  return ps__ckpt_write_file(path, bufs, lens, 2, eb);
}

/* One JSON text into dir/name, ended by a newline. */
static int write_json(const char *dir, const char *name, const char *text, ps_errbuf *eb) {
  char path[PATH_MAX];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
    return ps_err_set(eb, -ENAMETOOLONG, "%s/%s: path too long", dir, name);
  const void *bufs[2] = {text, "\n"};
  size_t lens[2] = {strlen(text), 1};
  return ps__ckpt_write_file(path, bufs, lens, 2, eb);
}

/* ------------------------------------------------------------------ */
/* npy: the sparse tables                                             */
/* ------------------------------------------------------------------ */

/* One table's rows, gathered from every shard file in section order. */
typedef struct table_rows {
  uint64_t n, cap;
  uint64_t *keys;
  float *values;   /* n x dim */
  float *slots;    /* n x nslots x dim: a row's slots are back to back in the section too */
} table_rows;

typedef struct gather {
  const ps_ckpt *c;
  const ps_ckpt_tables *tt;
  table_rows *tr;  /* tt->ntables */
} gather;

static int gather_row(void *arg, int t, const ps_table_entry *e, ps_errbuf *eb) {
  gather *g = arg;
  table_rows *r = &g->tr[t];
  size_t dim = g->tt->t[t].dim, ns = g->tt->t[t].nslots;
  if (r->n == r->cap) {
    uint64_t cap = r->cap ? 2 * r->cap : 1024;
    uint64_t *k = realloc(r->keys, (size_t)cap * sizeof *k);
    if (k != NULL)
      r->keys = k;
    float *v = k != NULL ? realloc(r->values, (size_t)cap * dim * sizeof *v) : NULL;
    if (v != NULL)
      r->values = v;
    float *sl = v != NULL && ns > 0 ? realloc(r->slots, (size_t)cap * ns * dim * sizeof *sl)
                                    : NULL;
    if (sl != NULL)
      r->slots = sl;
    if (k == NULL || v == NULL || (ns > 0 && sl == NULL))
      return ps_err_set(eb, -ENOMEM, "out of memory for %" PRIu64 " rows", cap);
    r->cap = cap;
  }
  r->keys[r->n] = e->key;
  memcpy(r->values + r->n * dim, e->values, dim * sizeof(float));
  for (size_t k = 0; k < ns; k++)
    memcpy(r->slots + (r->n * ns + k) * dim, e->slots[k], dim * sizeof(float));
  r->n++;
  return 0;
}

/* Each shard file's table section, checked as `ckpt verify` checks it. */
static int gather_shard(void *arg, int i, const ps_ckpt_shard_data *d, ps_errbuf *eb) {
  gather *g = arg;
  return ps_ckpt_shard_tables(g->c, g->tt, i, d, gather_row, g, eb);
}

static void gather_free(gather *g) {
  for (int t = 0; g->tr != NULL && t < g->tt->ntables; t++) {
    free(g->tr[t].keys);
    free(g->tr[t].values);
    free(g->tr[t].slots);
  }
  free(g->tr);
  g->tr = NULL;
}

/* The files of table t: "<table>.keys", ".values", ".slots" (no .npy). */
static const char *const table_files[] = {"keys", "values", "slots"};

/* Would a table's files be another array's?  Tables named alike (two
 * embedding_bag layers can make the same "C12"), or a variable of the same
 * name.  @return 0 or PS_EUSAGE before anything is written. */
static int check_table_names(const ps_ckpt *c, const ps_ckpt_tables *tt, const char *dir,
                             ps_errbuf *eb) {
  for (int t = 0; t < tt->ntables; t++) {
    const char *n = tt->names[t];
    if (n[0] == '\0' || strchr(n, '/') != NULL)
      return ps_err_set(eb, PS_EUSAGE, "%s: sparse table %d '%s' cannot be a file name", dir, t,
                        n);
    for (int u = 0; u < t; u++)
      if (strcmp(tt->names[u], n) == 0)
        return ps_err_set(eb, PS_EUSAGE, "%s: sparse tables %d and %d are both named '%s': "
                          "expected distinct names (their files would be the same)", dir, u, t,
                          n);
    for (size_t k = 0; k < sizeof table_files / sizeof table_files[0]; k++) {
      char f[PS_MODEL_NAME_MAX + 16];
      snprintf(f, sizeof f, "%s.%s", n, table_files[k]);
      for (int v = 0; v < c->nvars; v++)
        if (strcmp(c->vars[v].name, f) == 0)
          return ps_err_set(eb, PS_EUSAGE, "%s: sparse table %d's file %s.npy would be variable "
                            "%s's: expected distinct names", dir, t, f, f);
    }
  }
  return 0;
}

typedef struct key_at {
  uint64_t key, at;
} key_at;

static int by_key(const void *a, const void *b) {
  uint64_t x = ((const key_at *)a)->key, y = ((const key_at *)b)->key;
  return x < y ? -1 : x > y;
}

/* Table t's rows by key ascending, whatever shard held them: keys (uint64,
 * rows), values (float32, rows x dim) and, for an optimizer with slots,
 * slots (float32, rows x nslots x dim). */
static int write_table(const ps_ckpt_tables *tt, int t, const table_rows *r, const char *dir,
                       ps_errbuf *eb) {
  uint64_t n = r->n, dim = tt->t[t].dim, ns = tt->t[t].nslots;
  key_at *order = malloc((size_t)(n ? n : 1) * sizeof *order);
  uint64_t per = dim * (ns > 1 ? ns : 1) * sizeof(float);
  void *sorted = malloc((size_t)(n ? n : 1) * (per > 8 ? per : 8));
  int rc = 0;
  if (order == NULL || sorted == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "%s: out of memory for sparse table %s's %" PRIu64 " rows", dir,
                    tt->names[t], n);
    goto out;
  }
  for (uint64_t i = 0; i < n; i++)
    order[i] = (key_at){r->keys[i], i};
  qsort(order, (size_t)n, sizeof *order, by_key);
  char name[PS_MODEL_NAME_MAX + 16];
  uint64_t *keys = sorted;
  for (uint64_t i = 0; i < n; i++)
    keys[i] = order[i].key;
  snprintf(name, sizeof name, "%s.keys", tt->names[t]);
  if ((rc = write_npy(dir, name, "<u8", 1, &n, sorted, (size_t)n * 8, eb)) != 0)
    goto out;
  float *rows = sorted;
  for (uint64_t i = 0; i < n; i++)
    memcpy(rows + i * dim, r->values + order[i].at * dim, (size_t)dim * sizeof(float));
  snprintf(name, sizeof name, "%s.values", tt->names[t]);
  uint64_t shape[3] = {n, dim};
  if ((rc = write_npy(dir, name, "<f4", 2, shape, sorted, (size_t)(n * dim) * sizeof(float),
                      eb)) != 0 || ns == 0)
    goto out;
  for (uint64_t i = 0; i < n; i++)
    memcpy(rows + i * ns * dim, r->slots + order[i].at * ns * dim,
           (size_t)(ns * dim) * sizeof(float));
  snprintf(name, sizeof name, "%s.slots", tt->names[t]);
  shape[1] = ns;
  shape[2] = dim;
  rc = write_npy(dir, name, "<f4", 3, shape, sorted, (size_t)(n * ns * dim) * sizeof(float), eb);
out:
  free(order);
  free(sorted);
  return rc;
}

/* ------------------------------------------------------------------ */
/* npy                                                                */
/* ------------------------------------------------------------------ */

static int export_npy(const ps_ckpt *c, const float *arena, const model_texts *mt,
                      const gather *g, const char *dir, ps_errbuf *eb) {
  int rc = ps__ckpt_mkdir_p(dir);
  if (rc != 0)
    return ps_err_set(eb, rc, "%s: %s", dir, strerror(-rc));
  for (int i = 0; i < c->nvars; i++) {
    const ps_ckpt_var *v = &c->vars[i];
    uint64_t shape[PS_VAR_MAX_DIMS];
    for (int d = 0; d < v->ndim; d++)
      shape[d] = v->shape[d];
    if ((rc = write_npy(dir, v->name, "<f4", v->ndim, shape, arena + v->offset,
                        v->count * sizeof(float), eb)) != 0)
      return rc;
  }
  for (int t = 0; t < g->tt->ntables; t++)
    if ((rc = write_table(g->tt, t, &g->tr[t], dir, eb)) != 0)
      return rc;
  if (mt->network != NULL && ((rc = write_json(dir, PS_EXPORT_MODEL_FILE, mt->network, eb)) != 0 ||
                              (rc = write_json(dir, PS_EXPORT_NORM_FILE, mt->norm, eb)) != 0))
    return rc;
  return 0;
}

/* Are the variables' names file names?  @return 0 or PS_EUSAGE. */
static int check_var_names(const ps_ckpt *c, const char *dir, ps_errbuf *eb) {
  for (int i = 0; i < c->nvars; i++) {
    const char *n = c->vars[i].name;
    if (n[0] == '\0' || strcmp(n, ".") == 0 || strcmp(n, "..") == 0 || strchr(n, '/') != NULL)
      return ps_err_set(eb, PS_EUSAGE, "%s: variable '%s' cannot be a file name", dir, n);
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* Both                                                               */
/* ------------------------------------------------------------------ */

/* Is `out` free for an export: a safetensors file that does not exist, an
 * npy directory that does not exist or is empty?  force: an existing file
 * is replaced, a non-empty directory written into.  @return 0 or -EEXIST
 * (-ENOTDIR, -EISDIR) with one line. */
static int check_target(const char *out, int st, int force, ps_errbuf *eb) {
  struct stat sb;
  if (stat(out, &sb) != 0)
    return errno == ENOENT ? 0 : ps_err_set(eb, -errno, "%s: %s", out, strerror(errno));
  if (st) {
    if (S_ISDIR(sb.st_mode))
      return ps_err_set(eb, -EISDIR, "%s: a directory: expected the path of a .safetensors "
                        "file", out);
    return force ? 0 : ps_err_set(eb, -EEXIST, "%s: exists: expected a new file (--force "
                                  "replaces it)", out);
  }
  if (!S_ISDIR(sb.st_mode))
    return ps_err_set(eb, -ENOTDIR, "%s: exists and is not a directory: expected a new or "
                      "empty directory", out);
  if (force)
    return 0;
  DIR *d = opendir(out);
  if (d == NULL)
    return ps_err_set(eb, -errno, "%s: %s", out, strerror(errno));
  struct dirent *e;
  char first[NAME_MAX + 1] = "";
  size_t n = 0;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 && n++ == 0)
      snprintf(first, sizeof first, "%s", e->d_name);
  closedir(d);
  if (n == 0)
    return 0;
  return ps_err_set(eb, -EEXIST, "%s: not empty (%s%s, %zu entr%s): expected a new or empty "
                    "directory, so that two exports never mix (--force writes into it)", out,
                    first, n > 1 ? " and more" : "", n, n == 1 ? "y" : "ies");
}

/* The model file and normalization of c, for the export; none (and the
 * reason in note) when its model has no layers or cannot be known. */
static int model_texts_of(const ps_ckpt *c, model_texts *mt, char *note, size_t note_len) {
  ps_model m;
  ps_data_norm norm;
  ps_errbuf why = {0};
  *mt = (model_texts){0};
  if (ps_ckpt_model(c, NULL, &m, &norm, &why) != 0) {
    snprintf(note, note_len, "no model file: %s", why.msg);
    return 0;
  }
  char comment[512];
  snprintf(comment, sizeof comment, "The model %s of checkpoint %s (step %" PRIu64 "), from "
           "`paramserv ckpt export`.  Its inputs: each image byte b as (b / %g - %g) / %g "
           "(%s), in the input's order [channels, height, width].", c->model,
           c->name[0] ? c->name : "?", c->step, (double)norm.divide, (double)norm.mean,
           (double)norm.std, PS_EXPORT_NORM_FILE);
  mt->network = ps_modelfile_text(&m.spec, comment, 2);
  snprintf(comment, sizeof comment, "x = (b / divide - mean) / std for each byte b of an image, "
           "the input of %s (%s)", c->model, PS_EXPORT_MODEL_FILE);
  mt->norm = ps__ckpt_norm_text(&norm, comment, 2);
  ps_model_close(&m);
  if (mt->network == NULL || mt->norm == NULL) {
    model_texts_free(mt);
    return -ENOMEM;
  }
  snprintf(note, note_len, "the model file %s and the normalization %s", PS_EXPORT_MODEL_FILE,
           PS_EXPORT_NORM_FILE);
  return 0;
}

int ps_ckpt_export(const ps_ckpt *c, const char *format, const char *out, int force,
                   char *note, size_t note_len, ps_errbuf *eb) {
  char scratch[8];
  if (note == NULL) {
    note = scratch;
    note_len = sizeof scratch;
  }
  note[0] = '\0';
  int st = format != NULL && strcmp(format, "safetensors") == 0;
  if (!st && (format == NULL || strcmp(format, "npy") != 0))
    return ps_err_set(eb, PS_EUSAGE, "export format '%s': expected safetensors or npy",
                      format != NULL ? format : "");
  int rc = check_target(out, st, force, eb);
  if (rc != 0)
    return rc;
  model_texts mt;
  if (model_texts_of(c, &mt, note, note_len) != 0)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  if (st && mt.network != NULL)
    snprintf(note, note_len, "the model file and the normalization in its metadata "
             "(paramserv.network, paramserv.normalization)");
  ps_ckpt_tables tt = {0};  /* closing it is harmless whatever failed */
  gather g = {.c = c, .tt = &tt};
  if (st) {
    /* The file holds the variables only: say so when there are tables. */
    ps_errbuf ignore = {0};
    if (ps_ckpt_tables_open(c, &tt, &ignore) == 0 && tt.ntables > 0)
      snprintf(note + strlen(note), note_len - strlen(note), "; not its %d sparse tables "
               "(--format npy writes them)", tt.ntables);
    ps_ckpt_tables_close(&tt);
  } else if ((rc = check_var_names(c, out, eb)) == 0 &&
             (rc = ps_ckpt_tables_open(c, &tt, eb)) == 0 &&
             (rc = check_table_names(c, &tt, out, eb)) == 0 && tt.ntables > 0 &&
             (g.tr = calloc((size_t)tt.ntables, sizeof *g.tr)) == NULL) {
    /* npy: the sparse tables too, each shard file's section checked as
     * `ckpt verify` checks it, in the same pass as the values. */
    rc = ps_err_set(eb, -ENOMEM, "out of memory");
  }
  float *arena = rc == 0 ? malloc(c->total_floats * sizeof(float) + 1) : NULL;
  if (rc == 0 && arena == NULL)
    rc = ps_err_set(eb, -ENOMEM, "out of memory for %zu floats", c->total_floats);
  if (rc == 0)
    rc = ps_ckpt_read_values_each(c, arena, g.tr != NULL ? gather_shard : NULL, &g, eb);
  if (rc == 0)
    rc = st ? export_safetensors(c, arena, &mt, out, eb) : export_npy(c, arena, &mt, &g, out, eb);
  if (rc == 0 && !st && tt.ntables > 0) {
    uint64_t rows = 0;
    int slots = 0;
    for (int t = 0; t < tt.ntables; t++) {
      rows += g.tr[t].n;
      slots += tt.t[t].nslots > 0;
    }
    snprintf(note + strlen(note), note_len - strlen(note), "%s%d sparse table%s, %" PRIu64
             " rows: <table>.keys.npy and <table>.values.npy%s", note[0] ? "; " : "",
             tt.ntables, tt.ntables == 1 ? "" : "s", rows,
             slots == 0 ? "" : slots == tt.ntables ? ", <table>.slots.npy"
                                                   : ", <table>.slots.npy for those with slots");
  }
  if (!st) {
    gather_free(&g);
    ps_ckpt_tables_close(&tt);
  }
  free(arena);
  model_texts_free(&mt);
  return rc;
}
