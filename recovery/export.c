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
 * multiple of 64 bytes. */
static size_t npy_header(const ps_ckpt_var *v, char *out, size_t cap) {
  char shape[128];
  size_t w = 0;
  for (int d = 0; d < v->ndim; d++)
    w += (size_t)snprintf(shape + w, sizeof shape - w, "%s%" PRIu32, d ? ", " : "", v->shape[d]);
  if (v->ndim == 1)
    snprintf(shape + w, sizeof shape - w, ",");
  char dict[256];
  int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }",
                   shape);
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

/* One JSON text into dir/name, ended by a newline. */
static int write_json(const char *dir, const char *name, const char *text, ps_errbuf *eb) {
  char path[PATH_MAX];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
    return ps_err_set(eb, -ENAMETOOLONG, "%s/%s: path too long", dir, name);
  const void *bufs[2] = {text, "\n"};
  size_t lens[2] = {strlen(text), 1};
  return ps__ckpt_write_file(path, bufs, lens, 2, eb);
}

static int export_npy(const ps_ckpt *c, const float *arena, const model_texts *mt,
                      const char *dir, ps_errbuf *eb) {
  for (int i = 0; i < c->nvars; i++) {
    const char *n = c->vars[i].name;
    if (n[0] == '\0' || strcmp(n, ".") == 0 || strcmp(n, "..") == 0 || strchr(n, '/') != NULL)
      return ps_err_set(eb, PS_EUSAGE, "%s: variable '%s' cannot be a file name", dir, n);
  }
  int rc = ps__ckpt_mkdir_p(dir);
  if (rc != 0)
    return ps_err_set(eb, rc, "%s: %s", dir, strerror(-rc));
  for (int i = 0; i < c->nvars; i++) {
    const ps_ckpt_var *v = &c->vars[i];
    char path[PATH_MAX], header[384];
    if ((size_t)snprintf(path, sizeof path, "%s/%s.npy", dir, v->name) >= sizeof path)
      return ps_err_set(eb, -ENAMETOOLONG, "%s/%s.npy: path too long", dir, v->name);
    size_t hlen = npy_header(v, header, sizeof header);
    const void *bufs[2] = {header, arena + v->offset};
    size_t lens[2] = {hlen, v->count * sizeof(float)};
    if ((rc = ps__ckpt_write_file(path, bufs, lens, 2, eb)) != 0)
      return rc;
  }
  if (mt->network != NULL && ((rc = write_json(dir, PS_EXPORT_MODEL_FILE, mt->network, eb)) != 0 ||
                              (rc = write_json(dir, PS_EXPORT_NORM_FILE, mt->norm, eb)) != 0))
    return rc;
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
  float *arena = malloc(c->total_floats * sizeof(float) + 1);
  if (arena == NULL) {
    model_texts_free(&mt);
    return ps_err_set(eb, -ENOMEM, "out of memory for %zu floats", c->total_floats);
  }
  rc = ps_ckpt_read_values(c, arena, eb);
  if (rc == 0)
    rc = st ? export_safetensors(c, arena, &mt, out, eb) : export_npy(c, arena, &mt, out, eb);
  free(arena);
  model_texts_free(&mt);
  return rc;
}
