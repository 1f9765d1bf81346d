/* Checkpoint export: a checkpoint's variables as safetensors or .npy files. */
#include "recovery/export.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "recovery/commit.h"

/* ------------------------------------------------------------------ */
/* safetensors                                                        */
/* ------------------------------------------------------------------ */

/* The header is JSON: {"__metadata__": {string: string}, name: {"dtype":
 * "F32", "shape": [...], "data_offsets": [begin, end]}, ...}, offsets in
 * bytes from the start of the data, which follows the header. */
static char *safetensors_header(const ps_ckpt *c, size_t *len) {
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

int ps_ckpt_export_safetensors(const ps_ckpt *c, const float *arena, const char *path,
                               ps_errbuf *eb) {
  for (int i = 0; i < c->nvars; i++)
    if (strcmp(c->vars[i].name, "__metadata__") == 0)
      return ps_err_set(eb, PS_EUSAGE, "%s: the variable name __metadata__ is reserved in "
                        "safetensors", path);
  size_t hlen = 0;
  char *header = safetensors_header(c, &hlen);
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

int ps_ckpt_export_npy(const ps_ckpt *c, const float *arena, const char *dir, ps_errbuf *eb) {
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
  return 0;
}

/* ------------------------------------------------------------------ */
/* Both                                                               */
/* ------------------------------------------------------------------ */

int ps_ckpt_export(const ps_ckpt *c, const char *format, const char *out, ps_errbuf *eb) {
  int st = format != NULL && strcmp(format, "safetensors") == 0;
  if (!st && (format == NULL || strcmp(format, "npy") != 0))
    return ps_err_set(eb, PS_EUSAGE, "export format '%s': expected safetensors or npy",
                      format != NULL ? format : "");
  float *arena = malloc(c->total_floats * sizeof(float) + 1);
  if (arena == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory for %zu floats", c->total_floats);
  int rc = ps_ckpt_read_values(c, arena, eb);
  if (rc == 0)
    rc = st ? ps_ckpt_export_safetensors(c, arena, out, eb)
            : ps_ckpt_export_npy(c, arena, out, eb);
  free(arena);
  return rc;
}
