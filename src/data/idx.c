/* Reading IDX files (plain or gzipped) and loading a data set split; spec in src/data/IDX.md. */
#include "data/idx.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "data/gzfile.h"

/* A bound on what one file may hold, so that a corrupt header or a gzip bomb
 * cannot make us allocate without limit.  Fashion-MNIST's largest file holds
 * 47 MB; 1 GiB leaves room for bigger images without trusting any header. */
#define IDX_MAX_DATA ((uint64_t)1 << 30)
#define IDX_MAX_HEADER (4 + 4 * 3)
#define IDX_TYPE_UBYTE 0x08

/* ------------------------------------------------------------------------ */
/* Parsing                                                                  */
/* ------------------------------------------------------------------------ */

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static const char *type_name(unsigned t) {
  switch (t) {
  case 0x08: return "unsigned byte";
  case 0x09: return "signed byte";
  case 0x0B: return "int16";
  case 0x0C: return "int32";
  case 0x0D: return "float32";
  case 0x0E: return "float64";
  default: return "unknown type";
  }
}

/* "60000 x 28 x 28", for messages about sizes. */
static void dims_str(char *s, size_t cap, const uint32_t *dims, int ndim) {
  size_t used = 0;
  s[0] = '\0';
  for (int i = 0; i < ndim && used < cap; i++)
    used += (size_t)snprintf(s + used, cap - used, "%s%" PRIu32, i ? " x " : "", dims[i]);
}

/* Checks buf as an IDX file of want_ndim dimensions: 0 with its dims and
 * the header's length (the data, dims' product of bytes, follows it to the
 * end), or PS_EFORMAT / -EINVAL with the message. */
static int parse_header(const char *name, const uint8_t *buf, size_t len, int want_ndim,
                        uint32_t dims[3], size_t *hdrp, ps_errbuf *eb) {
  if (want_ndim < 1 || want_ndim > 3)
    return ps_err_set(eb, -EINVAL, "%s: asked for %d dimensions, expected 1, 2 or 3",
                      name, want_ndim);

  uint32_t want_magic = IDX_TYPE_UBYTE << 8 | (uint32_t)want_ndim;
  size_t hdr = 4 + 4 * (size_t)want_ndim;
  if (len < 4)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: truncated header: file has %zu bytes, expected %zu "
                      "(magic 0x%08" PRIx32 " and %d dimensions)",
                      name, len, hdr, want_magic, want_ndim);

  /* The magic is checked piece by piece so that the message says which part
   * is wrong: a wrong type or a wrong rank is a likelier mistake (labels
   * passed as images) than random bytes. */
  uint32_t magic = be32(buf);
  unsigned type = (magic >> 8) & 0xff, ndim = magic & 0xff;
  if ((magic >> 16) != 0)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: bad magic 0x%08" PRIx32 ", expected 0x%08" PRIx32
                      " (IDX unsigned-byte, %d dimensions)",
                      name, magic, want_magic, want_ndim);
  if (type != IDX_TYPE_UBYTE)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: bad magic 0x%08" PRIx32 ": data type 0x%02x (%s), "
                      "expected 0x08 (unsigned byte)",
                      name, magic, type, type_name(type));
  if (ndim != (unsigned)want_ndim)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: wrong dimensions: magic 0x%08" PRIx32 " says %u dimensions, "
                      "expected %d (magic 0x%08" PRIx32 ")",
                      name, magic, ndim, want_ndim, want_magic);
  if (len < hdr)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: truncated header: file has %zu bytes, expected %zu "
                      "(magic and %d dimensions)",
                      name, len, hdr, want_ndim);

  char ds[64];
  uint64_t size = 1;
  for (int i = 0; i < want_ndim; i++)
    dims[i] = be32(buf + 4 + 4 * (size_t)i);
  dims_str(ds, sizeof ds, dims, want_ndim);
  for (int i = 0; i < want_ndim; i++) {
    if (dims[i] == 0)
      return ps_err_set(eb, PS_EFORMAT,
                        "%s: wrong dimensions: header says %s, dimension %d is 0, "
                        "expected every dimension > 0",
                        name, ds, i + 1);
    /* size <= 2^30 before this step and dims[i] < 2^32: no uint64 overflow. */
    size *= dims[i];
    if (size > IDX_MAX_DATA)
      return ps_err_set(eb, PS_EFORMAT,
                        "%s: header says %s data bytes, more than the limit of %" PRIu64
                        " (1 GiB)",
                        name, ds, IDX_MAX_DATA);
  }

  /* Checking the length before allocating means a hostile header can never
   * make us allocate more than the input's own size. */
  size_t have = len - hdr;
  if (have < size)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: truncated: header says %s = %" PRIu64 " data bytes, file has %zu",
                      name, ds, size, have);
  if (have > size)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: trailing bytes: header says %s = %" PRIu64
                      " data bytes, file has %zu (%zu too many)",
                      name, ds, size, have, have - (size_t)size);

  *hdrp = hdr;
  return 0;
}

int ps_idx_parse(const char *name, const uint8_t *buf, size_t len, int want_ndim,
                 ps_idx *out, ps_errbuf *eb) {
  memset(out, 0, sizeof *out);
  uint32_t dims[3] = {0, 0, 0};
  size_t hdr;
  int rc = parse_header(name, buf, len, want_ndim, dims, &hdr, eb);
  if (rc != 0)
    return rc;
  uint8_t *data = malloc(len - hdr);
  if (data == NULL)
    return ps_err_set(eb, -ENOMEM, "%s: out of memory for %zu data bytes", name, len - hdr);
  memcpy(data, buf + hdr, len - hdr);
  out->ndim = want_ndim;
  memcpy(out->dims, dims, sizeof dims);
  out->data = data;
  return 0;
}

void ps_idx_close(ps_idx *idx) {
  if (idx == NULL)
    return;
  free(idx->data);
  memset(idx, 0, sizeof *idx);
}

/* ------------------------------------------------------------------------ */
/* Reading a file                                                           */
/* ------------------------------------------------------------------------ */

/* Reads all of `path` through zlib (which passes plain files through
 * unchanged) into a malloc'd buffer that the caller frees. */
static int read_all(const char *path, uint8_t **bufp, size_t *lenp, ps_errbuf *eb) {
  gzFile gz;
  size_t hint;
  int orc = ps_gzfile_open_sized(path, &gz, &hint, eb);
  if (orc != 0)
    return orc;

  /* One byte past the largest valid file, so that an oversized file is
   * detected without reading all of it.  The first buffer holds what the
   * file announces and one byte more (the end of file is then read with no
   * copy); a file that holds more grows it by doubling. */
  const size_t limit = IDX_MAX_HEADER + (size_t)IDX_MAX_DATA + 1;
  size_t cap = hint > 0 && hint < limit ? hint + 1 : 1 << 20, len = 0;
  uint8_t *buf = NULL;
  int rc = 0;
  for (;;) {
    if (len == cap || buf == NULL) {
      if (buf != NULL)
        cap = cap * 2 < limit ? cap * 2 : limit;
      uint8_t *nb = realloc(buf, cap);
      if (nb == NULL) {
        rc = ps_err_set(eb, -ENOMEM, "%s: out of memory after reading %zu bytes", path, len);
        goto err;
      }
      buf = nb;
    }
    size_t want = cap - len;
    if (want > (1u << 30))
      want = 1u << 30;
    int n = gzread(gz, buf + len, (unsigned)want);
    if (n < 0) {
      int zerr;
      gzerror(gz, &zerr);
      if (zerr == Z_ERRNO)
        rc = ps_err_set(eb, -EIO, "%s: read error: %s", path, strerror(errno));
      else if (zerr == Z_MEM_ERROR)
        rc = ps_err_set(eb, -ENOMEM, "%s: out of memory while decompressing", path);
      else
        rc = ps_err_set(eb, PS_EFORMAT,
                        "%s: corrupt gzip data after %zu uncompressed bytes, expected a "
                        "valid deflate stream",
                        path, len);
      goto err;
    }
    if (n == 0)
      break;
    len += (size_t)n;
    if (len >= limit) {
      rc = ps_err_set(eb, PS_EFORMAT,
                      "%s: file is larger than %zu bytes, expected at most a %d-byte header "
                      "and 1 GiB of data",
                      path, limit - 1, IDX_MAX_HEADER);
      goto err;
    }
  }
  /* gzread reports a .gz cut short as a plain end of file; only the stream
   * state tells it apart from a complete one. */
  int zerr;
  gzerror(gz, &zerr);
  if (zerr == Z_BUF_ERROR) {
    rc = ps_err_set(eb, PS_EFORMAT,
                    "%s: truncated gzip data: input ends after %zu uncompressed bytes, "
                    "expected the rest of the stream",
                    path, len);
    goto err;
  }
  gzclose(gz);
  *bufp = buf;
  *lenp = len;
  return 0;

err:
  gzclose(gz);
  free(buf);
  return rc;
}

int ps_idx_read(const char *path, int want_ndim, ps_idx *out, ps_errbuf *eb) {
  memset(out, 0, sizeof *out);
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = read_all(path, &buf, &len, eb);
  if (rc < 0)
    return rc;
  /* The data stays where it was read: the header moved out of its way, the
   * spare end given back. */
  uint32_t dims[3] = {0, 0, 0};
  size_t hdr;
  rc = parse_header(path, buf, len, want_ndim, dims, &hdr, eb);
  if (rc != 0) {
    free(buf);
    return rc;
  }
  memmove(buf, buf + hdr, len - hdr);
  uint8_t *fit = realloc(buf, len - hdr);
  out->ndim = want_ndim;
  memcpy(out->dims, dims, sizeof dims);
  out->data = fit != NULL ? fit : buf;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Data set splits                                                          */
/* ------------------------------------------------------------------------ */

/* Sets `path` to <dir>/<base> or <dir>/<base>.gz, whichever exists.  When
 * both do, the plain file wins: someone unpacked it on purpose, and it reads
 * faster. */
static int find_file(const char *dir, const char *base, char *path, size_t cap,
                     ps_errbuf *eb) {
  const char *sep = dir[0] != '\0' && dir[strlen(dir) - 1] == '/' ? "" : "/";
  int n = snprintf(path, cap, "%s%s%s.gz", dir, sep, base);
  if (n < 0 || (size_t)n >= cap)
    return ps_err_set(eb, -ENAMETOOLONG, "%s: path of %s too long, expected at most %zu bytes",
                      dir, base, cap - 1);
  size_t plain_len = (size_t)n - 3;
  struct stat st;
  path[plain_len] = '\0';
  if (stat(path, &st) == 0)
    return 0;
  int plain_errno = errno;
  path[plain_len] = '.';
  if (stat(path, &st) == 0)
    return 0;
  if (errno == ENOENT && plain_errno == ENOENT)
    return ps_err_set(eb, -ENOENT, "neither %s nor %.*s exists, expected one of them", path,
                      (int)plain_len, path);
  /* One of them is there but cannot be looked at (EACCES, ...); opening it
   * reports why. */
  if (plain_errno != ENOENT)
    path[plain_len] = '\0';
  return 0;
}

static int load_file(const char *dir, const char *split, const char *kind, int ndim,
                     char *path, size_t cap, ps_idx *out, ps_errbuf *eb) {
  char base[128];
  int n = snprintf(base, sizeof base, "%s-%s-idx%d-ubyte", split, kind, ndim);
  if (n < 0 || (size_t)n >= sizeof base)
    return ps_err_set(eb, -EINVAL, "split name \"%s\" is too long, expected train or t10k",
                      split);
  int rc = find_file(dir, base, path, cap, eb);
  if (rc < 0)
    return rc;
  return ps_idx_read(path, ndim, out, eb);
}

int ps_dataset_load(const char *dir, const char *split, ps_dataset *ds, ps_errbuf *eb) {
  memset(ds, 0, sizeof *ds);
  if (dir == NULL || split == NULL)
    return ps_err_set(eb, -EINVAL, "data set directory or split not given");

  /* Checked first so that a wrong --data names the directory rather than
   * a file the user never typed. */
  struct stat st;
  if (stat(dir, &st) != 0) {
    int e = errno;
    return ps_err_set(eb, -e, "%s: cannot open data set directory: %s", dir, strerror(e));
  }
  if (!S_ISDIR(st.st_mode))
    return ps_err_set(eb, -ENOTDIR, "%s: not a directory, expected a data set directory",
                      dir);

  char ipath[4096], lpath[4096];
  ps_idx img, lab;
  int rc = load_file(dir, split, "images", 3, ipath, sizeof ipath, &img, eb);
  if (rc < 0)
    return rc;
  rc = load_file(dir, split, "labels", 1, lpath, sizeof lpath, &lab, eb);
  if (rc < 0) {
    ps_idx_close(&img);
    return rc;
  }

  if (img.dims[0] != lab.dims[0]) {
    rc = ps_err_set(eb, PS_ESHAPE,
                    "%s has %" PRIu32 " images but %s has %" PRIu32
                    " labels, expected the same count",
                    ipath, img.dims[0], lpath, lab.dims[0]);
    goto err;
  }
  for (uint32_t i = 0; i < lab.dims[0]; i++)
    if (lab.data[i] >= 10) {
      rc = ps_err_set(eb, PS_EFORMAT,
                      "%s: label %" PRIu32 " is %u, expected 0..9", lpath, i, lab.data[i]);
      goto err;
    }

  ds->n = img.dims[0];
  ds->rows = img.dims[1];
  ds->cols = img.dims[2];
  ds->dim = (size_t)ds->rows * ds->cols;
  ds->classes = 10;
  ds->images = img.data;
  ds->labels = lab.data;
  return 0;

err:
  ps_idx_close(&img);
  ps_idx_close(&lab);
  return rc;
}

void ps_dataset_close(ps_dataset *ds) {
  if (ds == NULL)
    return;
  free(ds->images);
  free(ds->features);
  free(ds->labels);
  memset(ds, 0, sizeof *ds);
}

/* dst[j] = src[j] * a + c.  A function of its own so that `restrict` on the
 * parameters tells the compiler the bytes and floats never overlap. */
static void bytes_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n, float a,
                         float c) {
  size_t j = 0;
  /* Fixed-length blocks get vectorized even at -O2, where gcc's cheap cost
   * model refuses a loop of unknown length: 5x faster than the plain loop. */
  for (; j + 16 <= n; j += 16)
    for (size_t t = 0; t < 16; t++)
      dst[j + t] = (float)src[j + t] * a + c;
  for (; j < n; j++)
    dst[j] = (float)src[j] * a + c;
}

void ps_dataset_images_f32(const ps_dataset *ds, const size_t *index, size_t count,
                           float mean, float std, float *out) {
  ps_data_norm n = {255.0f, mean, std};
  ps_dataset_images_norm(ds, index, count, &n, out);
}

void ps_dataset_images_norm(const ps_dataset *ds, const size_t *index, size_t count,
                            const ps_data_norm *norm, float *out) {
  if (ds->features != NULL) {
    for (size_t k = 0; k < count; k++)
      memcpy(out + k * ds->dim, ds->features + (index != NULL ? index[k] : k) * ds->dim,
             ds->dim * sizeof *out);
    return;
  }
  /* (b/divide - mean)/std folded into one multiply-add; it differs from the
   * two-step form by an ulp or two. */
  const float a = 1.0f / (norm->divide * norm->std), c = -norm->mean / norm->std;
  const size_t px = (size_t)ds->rows * ds->cols;
  for (size_t k = 0; k < count; k++) {
    size_t i = index != NULL ? index[k] : k;
    bytes_to_f32(ds->images + i * px, out + k * px, px, a, c);
  }
}

void ps_dataset_inputs(const ps_dataset *ds, const size_t *index, size_t count, float *out) {
  ps_data_norm norm = PS_DATA_NORM;
  ps_dataset_images_norm(ds, index, count, &norm, out);
}

size_t ps_dataset_batch(const ps_dataset *ds, ps_sampler *s, size_t *idx, size_t batch, float *x,
                        uint8_t *y) {
  size_t n = ps_sampler_next(s, idx, batch);
  ps_dataset_inputs(ds, idx, n, x);
  for (size_t i = 0; i < n; i++)
    y[i] = ds->labels[idx[i]];
  return n;
}
