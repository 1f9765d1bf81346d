/* Reading numpy .npy files strictly, and a data set of the user's own;
 * spec in src/data/NPY.md. */
#include "data/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/endian.h"

static const uint8_t npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* ------------------------------------------------------------------------ */
/* The header dict                                                          */
/* ------------------------------------------------------------------------ */

/* A recursive-descent parser of exactly NPY.md's grammar over the header's
 * bytes: no Python evaluator, so nothing a file says can do more than be
 * refused. */
typedef struct hparse {
  const char *name;   /* the file, for messages */
  const char *s;      /* the header: s[0, n), its last byte the newline */
  size_t n, i;
  size_t base;        /* the header's offset in the file, for messages */
  ps_errbuf *eb;
} hparse;

/* "'x'" for a printable byte, else "0x93": what a message shows of one. */
static const char *show_byte(unsigned char c, char *buf, size_t len) {
  if (c >= 0x20 && c < 0x7f && c != '\'')
    snprintf(buf, len, "'%c'", c);
  else
    snprintf(buf, len, "0x%02x", c);
  return buf;
}

/* The byte at the parser's place is not what the grammar allows there. */
static int syntax(hparse *p, const char *expected) {
  char b[8];
  /* The final newline is where the dict was cut short. */
  if (p->i + 1 >= p->n)
    return ps_err_set(p->eb, PS_EFORMAT, "%s: header ends at offset %zu inside the dict, "
                      "expected %s", p->name, p->base + p->i, expected);
  return ps_err_set(p->eb, PS_EFORMAT, "%s: header: %s at offset %zu, expected %s", p->name,
                    show_byte((unsigned char)p->s[p->i], b, sizeof b), p->base + p->i, expected);
}

static void skip_spaces(hparse *p) {
  while (p->i < p->n && p->s[p->i] == ' ')
    p->i++;
}

/* Whether the next byte (the final newline excluded) is c; consumed if so. */
static int accept(hparse *p, char c) {
  if (p->i + 1 < p->n && p->s[p->i] == c) {
    p->i++;
    return 1;
  }
  return 0;
}

/* A quoted string of printable ASCII, no backslash, into out (at most
 * cap - 1 bytes: a longer one is refused as no key or descr is that long). */
static int parse_string(hparse *p, char *out, size_t cap, const char *what) {
  if (p->i + 1 >= p->n || (p->s[p->i] != '\'' && p->s[p->i] != '"'))
    return syntax(p, what);
  char q = p->s[p->i++];
  size_t start = p->i, len = 0;
  for (; p->i + 1 < p->n && p->s[p->i] != q; p->i++) {
    unsigned char c = (unsigned char)p->s[p->i];
    if (c < 0x20 || c >= 0x7f || c == '\\')
      return syntax(p, "printable ASCII without backslashes in a string");
    if (len + 1 >= cap)
      return ps_err_set(p->eb, PS_EFORMAT, "%s: header: string at offset %zu is longer than "
                        "%zu bytes, expected %s", p->name, p->base + start - 1, cap - 1, what);
    out[len++] = (char)c;
  }
  if (p->i + 1 >= p->n)
    return syntax(p, "the string's closing quote");
  out[len] = '\0';
  p->i++;
  return 0;
}

/* True or False, as a whole word. */
static int parse_bool(hparse *p, int *out) {
  static const char *const words[2] = {"False", "True"};
  for (int v = 0; v < 2; v++) {
    size_t w = strlen(words[v]);
    if (p->i + w < p->n && memcmp(p->s + p->i, words[v], w) == 0) {
      char next = p->s[p->i + w];
      if (!((next >= 'A' && next <= 'Z') || (next >= 'a' && next <= 'z') ||
            (next >= '0' && next <= '9') || next == '_')) {
        p->i += w;
        *out = v;
        return 0;
      }
    }
  }
  return syntax(p, "False or True");
}

/* A decimal integer without sign, underscores or leading zeros, and an
 * optional L (Python 2's long, which numpy wrote under Python 2). */
static int parse_uint(hparse *p, uint64_t *out) {
  size_t start = p->i;
  if (p->i + 1 >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
    return syntax(p, "a dimension (a decimal integer)");
  uint64_t v = 0;
  for (; p->i + 1 < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9'; p->i++) {
    unsigned d = (unsigned)(p->s[p->i] - '0');
    if (v > (UINT64_MAX - d) / 10)
      return ps_err_set(p->eb, PS_EFORMAT, "%s: header: the dimension at offset %zu is larger "
                        "than %" PRIu64 ", expected a size", p->name, p->base + start,
                        UINT64_MAX);
    v = v * 10 + d;
  }
  if (p->i - start > 1 && p->s[start] == '0') {
    p->i = start;
    return syntax(p, "a dimension without leading zeros");
  }
  accept(p, 'L');
  *out = v;
  return 0;
}

/* A tuple of dimensions: (), (a,), (a, b), (a, b,), ... */
static int parse_shape(hparse *p, ps_npy *h) {
  if (!accept(p, '('))
    return syntax(p, "a tuple of dimensions, '('");
  skip_spaces(p);
  int n = 0;
  if (accept(p, ')'))
    goto done;
  for (;;) {
    if (n == PS_NPY_MAX_DIMS)
      return ps_err_set(p->eb, PS_EFORMAT, "%s: header: shape has more than %d dimensions, "
                        "expected at most 4", p->name, PS_NPY_MAX_DIMS);
    int rc = parse_uint(p, &h->shape[n++]);
    if (rc != 0)
      return rc;
    skip_spaces(p);
    if (accept(p, ')')) {
      /* (a) is a number in parentheses, not a tuple. */
      if (n == 1)
        return ps_err_set(p->eb, PS_EFORMAT, "%s: header: shape (%" PRIu64 ") is not a tuple, "
                          "expected (%" PRIu64 ",)", p->name, h->shape[0], h->shape[0]);
      break;
    }
    if (!accept(p, ','))
      return syntax(p, "',' or ')' in the shape");
    skip_spaces(p);
    if (accept(p, ')'))
      break;
  }
done:
  h->ndim = n;
  return 0;
}

enum { KEY_DESCR = 1, KEY_FORTRAN = 2, KEY_SHAPE = 4 };

/* The dict: each of the three keys once, in any order. */
static int parse_dict(hparse *p, ps_npy *h, char *descr, size_t descr_cap, int *fortran) {
  static const char *const key_names[3] = {"descr", "fortran_order", "shape"};
  int seen = 0, rc;
  if (!accept(p, '{'))
    return syntax(p, "the dict's '{' first");
  skip_spaces(p);
  while (!accept(p, '}')) {
    char key[32];
    size_t at = p->base + p->i;
    if ((rc = parse_string(p, key, sizeof key,
                           "a key in quotes ('descr', 'fortran_order' or 'shape') or '}'")) != 0)
      return rc;
    int k = -1;
    for (int j = 0; j < 3; j++)
      if (strcmp(key, key_names[j]) == 0)
        k = j;
    if (k < 0)
      return ps_err_set(p->eb, PS_EFORMAT, "%s: header: key '%s' at offset %zu, expected only "
                        "'descr', 'fortran_order' and 'shape'", p->name, key, at);
    if (seen & (1 << k))
      return ps_err_set(p->eb, PS_EFORMAT, "%s: header: key '%s' twice (again at offset %zu), "
                        "expected each key once", p->name, key, at);
    seen |= 1 << k;
    skip_spaces(p);
    if (!accept(p, ':'))
      return syntax(p, "':' after the key");
    skip_spaces(p);
    if (k == 0) {
      if (p->i + 1 < p->n && p->s[p->i] == '[')
        return ps_err_set(p->eb, PS_EFORMAT, "%s: header: descr is a list (a structured "
                          "dtype), expected a plain dtype such as '<f4'", p->name);
      rc = parse_string(p, descr, descr_cap, "the dtype in quotes, e.g. '<f4'");
    } else if (k == 1) {
      rc = parse_bool(p, fortran);
    } else {
      rc = parse_shape(p, h);
    }
    if (rc != 0)
      return rc;
    skip_spaces(p);
    if (accept(p, '}'))
      break;
    if (!accept(p, ','))
      return syntax(p, "',' or '}' after a value");
    skip_spaces(p);
  }
  if (seen != 7) {
    int k = !(seen & KEY_DESCR) ? 0 : !(seen & KEY_FORTRAN) ? 1 : 2;
    return ps_err_set(p->eb, PS_EFORMAT, "%s: header: no key '%s', expected 'descr', "
                      "'fortran_order' and 'shape'", p->name, key_names[k]);
  }
  /* Only the padding may follow: spaces, then the newline. */
  skip_spaces(p);
  if (p->i + 1 != p->n)
    return syntax(p, "only spaces after the dict, then the newline");
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The whole header                                                         */
/* ------------------------------------------------------------------------ */

const char *ps_npy_shape_str(const ps_npy *h, char *buf, size_t len) {
  size_t used = (size_t)snprintf(buf, len, "(");
  for (int i = 0; i < h->ndim && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%" PRIu64, i ? ", " : "", h->shape[i]);
  if (used < len)
    snprintf(buf + used, len - used, "%s)", h->ndim == 1 ? "," : "");
  return buf;
}

/* The dtypes by descr, and which kind takes each. */
static const struct {
  const char *descr;
  ps_npy_dtype dtype;
  size_t size;
  ps_npy_kind kind;
} dtypes[] = {
    {"<f4", PS_NPY_F4, 4, PS_NPY_FEATURES},
    {"|u1", PS_NPY_U1, 1, PS_NPY_LABELS},
    {"|i1", PS_NPY_I1, 1, PS_NPY_LABELS},
    {"<i4", PS_NPY_I4, 4, PS_NPY_LABELS},
    {"<i8", PS_NPY_I8, 8, PS_NPY_LABELS},
};

static int check_dtype(const char *name, const char *descr, ps_npy_kind kind, ps_npy *h,
                       ps_errbuf *eb) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].kind == kind && strcmp(descr, dtypes[i].descr) == 0) {
      h->dtype = dtypes[i].dtype;
      h->itemsize = dtypes[i].size;
      return 0;
    }
  if (kind == PS_NPY_FEATURES)
    return ps_err_set(eb, PS_EFORMAT, "%s: descr '%s': expected '<f4' (float32, little-endian: "
                      "save X.astype('<f4'))", name, descr);
  return ps_err_set(eb, PS_EFORMAT, "%s: descr '%s': expected '|u1', '|i1', '<i4' or '<i8' "
                    "(integer class labels)", name, descr);
}

static int check_shape(const char *name, ps_npy_kind kind, ps_npy *h, ps_errbuf *eb) {
  char s[128];
  if (kind == PS_NPY_FEATURES && (h->ndim < 2 || h->ndim > 4))
    return ps_err_set(eb, PS_EFORMAT, "%s: shape %s: expected (N, D), (N, H, W) or (N, C, H, W) "
                      "(N samples)", name, ps_npy_shape_str(h, s, sizeof s));
  if (kind == PS_NPY_LABELS && h->ndim != 1)
    return ps_err_set(eb, PS_EFORMAT, "%s: shape %s: expected (N,), one label a sample (save "
                      "y.ravel())", name, ps_npy_shape_str(h, s, sizeof s));
  for (int i = 0; i < h->ndim; i++)
    if (h->shape[i] == 0)
      return ps_err_set(eb, PS_EFORMAT, "%s: shape %s: dimension %d is 0, expected every "
                        "dimension > 0", name, ps_npy_shape_str(h, s, sizeof s), i + 1);
  return 0;
}

int ps_npy_parse(const char *name, const uint8_t *buf, size_t len, uint64_t file_size,
                 ps_npy_kind kind, ps_npy *out, ps_errbuf *eb) {
  memset(out, 0, sizeof *out);
  ps_npy h = {0};
  if (len > file_size)
    return ps_err_set(eb, -EINVAL, "%s: %zu bytes given of a file of %" PRIu64, name, len,
                      file_size);
  /* The magic first, over what there is of it: a file of another kind is
   * said to be one, however short. */
  size_t m = len < sizeof npy_magic ? len : sizeof npy_magic;
  if (memcmp(buf, npy_magic, m) != 0) {
    if (len >= 4 && memcmp(buf, "PK\x03\x04", 4) == 0)
      return ps_err_set(eb, PS_EFORMAT, "%s: a zip archive (an .npz of np.savez?), expected an "
                        ".npy file of one array (np.save)", name);
    char hex[3 * sizeof npy_magic + 1] = "";
    for (size_t i = 0, used = 0; i < m; i++)
      used += (size_t)snprintf(hex + used, sizeof hex - used, "%s%02x", i ? " " : "", buf[i]);
    return ps_err_set(eb, PS_EFORMAT, "%s: not an .npy file: starts with %s, expected the "
                      "magic 93 4e 55 4d 50 59 (\\x93NUMPY)", name, m ? hex : "nothing");
  }
  if (len < 8)
    return ps_err_set(eb, PS_EFORMAT, "%s: truncated header: file has %zu bytes, expected at "
                      "least 10 (magic, version, header length)", name, len);
  h.major = buf[6];
  h.minor = buf[7];
  if (h.minor != 0 || h.major < 1 || h.major > 3)
    return ps_err_set(eb, PS_EFORMAT, "%s: format version %d.%d: expected 1.0, 2.0 or 3.0", name,
                      h.major, h.minor);
  size_t pre = h.major == 1 ? 10 : 12;
  if (len < pre)
    return ps_err_set(eb, PS_EFORMAT, "%s: truncated header: file has %zu bytes, expected at "
                      "least %zu (magic, version %d.0, header length)", name, len, pre, h.major);
  uint32_t hlen = h.major == 1 ? ps_get_le16(buf + 8) : ps_get_le32(buf + 8);
  if (hlen > PS_NPY_MAX_HEADER)
    return ps_err_set(eb, PS_EFORMAT, "%s: header length %" PRIu32 ", more than the limit of "
                      "%d bytes", name, hlen, PS_NPY_MAX_HEADER);
  if (pre + hlen > file_size)
    return ps_err_set(eb, PS_EFORMAT, "%s: truncated header: header length %" PRIu32 " needs "
                      "%zu bytes, file has %" PRIu64, name, hlen, pre + hlen, file_size);
  if (pre + hlen > len)
    return ps_err_set(eb, -EINVAL, "%s: %zu bytes given, the header needs %zu", name, len,
                      pre + hlen);
  const char *hs = (const char *)buf + pre;
  if (hlen == 0 || hs[hlen - 1] != '\n') {
    char b[8];
    return ps_err_set(eb, PS_EFORMAT, "%s: header of %" PRIu32 " bytes ends in %s, expected a "
                      "newline", name, hlen,
                      hlen ? show_byte((unsigned char)hs[hlen - 1], b, sizeof b) : "nothing");
  }

  hparse p = {.name = name, .s = hs, .n = hlen, .base = pre, .eb = eb};
  char descr[32];
  int fortran = 0, rc = parse_dict(&p, &h, descr, sizeof descr, &fortran);
  if (rc != 0)
    return rc;
  if ((rc = check_dtype(name, descr, kind, &h, eb)) != 0)
    return rc;
  if (fortran)
    return ps_err_set(eb, PS_EFORMAT, "%s: fortran_order True: expected False (C order: save "
                      "np.ascontiguousarray(a))", name);
  if ((rc = check_shape(name, kind, &h, eb)) != 0)
    return rc;

  /* The data's size, checked against the file's before anyone allocates
   * it: a header can never make a reader allocate more than the file holds. */
  char s[128];
  uint64_t have = file_size - pre - hlen, count = 1, bytes = 0;
  int over = 0;
  for (int i = 0; i < h.ndim; i++)
    over |= __builtin_mul_overflow(count, h.shape[i], &count);
  over |= __builtin_mul_overflow(count, (uint64_t)h.itemsize, &bytes);
  if (over)
    return ps_err_set(eb, PS_EFORMAT, "%s: truncated: shape %s of '%s' is more than 2^64 data "
                      "bytes, file has %" PRIu64, name, ps_npy_shape_str(&h, s, sizeof s),
                      descr, have);
  if (have < bytes)
    return ps_err_set(eb, PS_EFORMAT, "%s: truncated: shape %s of '%s' is %" PRIu64 " data "
                      "bytes, file has %" PRIu64, name, ps_npy_shape_str(&h, s, sizeof s), descr,
                      bytes, have);
  if (have > bytes)
    return ps_err_set(eb, PS_EFORMAT, "%s: trailing bytes: shape %s of '%s' is %" PRIu64 " data "
                      "bytes, file has %" PRIu64 " (%" PRIu64 " too many)", name,
                      ps_npy_shape_str(&h, s, sizeof s), descr, bytes, have, have - bytes);
  h.count = count;
  h.offset = pre + hlen;
  *out = h;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The data                                                                 */
/* ------------------------------------------------------------------------ */

int ps_npy_labels(const char *name, const ps_npy *h, const uint8_t *data, uint8_t *out,
                  int *max_label, ps_errbuf *eb) {
  int top = 0;
  for (uint64_t i = 0; i < h->count; i++) {
    int64_t v;
    switch (h->dtype) {
    case PS_NPY_U1: v = data[i]; break;
    case PS_NPY_I1: v = (int8_t)data[i]; break;
    case PS_NPY_I4: v = (int32_t)ps_get_le32(data + 4 * i); break;
    case PS_NPY_I8: v = (int64_t)ps_get_le64(data + 8 * i); break;
    default:
      return ps_err_set(eb, -EINVAL, "%s: labels of a dtype that holds no labels", name);
    }
    if (v < 0 || v > 255)
      return ps_err_set(eb, PS_EFORMAT, "%s: label %" PRIu64 " is %" PRId64 ", expected 0..255 "
                        "(a class)", name, i, v);
    out[i] = (uint8_t)v;
    if (v > top)
      top = (int)v;
  }
  *max_label = top;
  return 0;
}

int ps_npy_features(const char *name, const ps_npy *h, const uint8_t *data, float *out,
                    ps_errbuf *eb) {
  if (h->dtype != PS_NPY_F4 || h->ndim < 1)
    return ps_err_set(eb, -EINVAL, "%s: features of a dtype other than '<f4'", name);
  uint64_t dim = h->count / h->shape[0];
  for (uint64_t i = 0; i < h->count; i++) {
    /* Little-endian on any host; on a little-endian one, out == data is a
     * load and a store of the same bytes. */
    uint32_t u = ps_get_le32(data + 4 * i);
    float f;
    memcpy(&f, &u, sizeof f);
    if (!isfinite(f))
      return ps_err_set(eb, PS_EFORMAT, "%s: sample %" PRIu64 " feature %" PRIu64 " is %g, "
                        "expected a finite number", name, i / dim, i % dim, (double)f);
    out[i] = f;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Reading a file                                                           */
/* ------------------------------------------------------------------------ */

/* len bytes at offset off of fd into buf: a file shorter than its fstat
 * said (rewritten while read) is an error of its own. */
static int read_at(int fd, const char *path, void *buf, size_t len, uint64_t off,
                   ps_errbuf *eb) {
  size_t got = 0;
  while (got < len) {
    size_t want = len - got > (1u << 30) ? (1u << 30) : len - got;
    ssize_t n = pread(fd, (char *)buf + got, want, (off_t)(off + got));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int e = errno;
      return ps_err_set(eb, -e, "%s: read error: %s", path, strerror(e));
    }
    if (n == 0)
      return ps_err_set(eb, PS_EFORMAT, "%s: file ends after %" PRIu64 " bytes, shorter than "
                        "when it was opened: expected it unchanged while read", path, off + got);
    got += (size_t)n;
  }
  return 0;
}

int ps_npy_read(const char *path, ps_npy_kind kind, ps_npy *h, void **data, ps_errbuf *eb) {
  memset(h, 0, sizeof *h);
  *data = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return ps_err_set(eb, -e, "%s: cannot open: %s", path, strerror(e));
  }
  struct stat st;
  int rc = 0;
  uint8_t *head = NULL;
  void *buf = NULL;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    rc = ps_err_set(eb, -e, "%s: cannot stat: %s", path, strerror(e));
    goto out;
  }
  if (S_ISDIR(st.st_mode)) {
    rc = ps_err_set(eb, -EISDIR, "%s: cannot read: is a directory, expected a regular file",
                    path);
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = ps_err_set(eb, -EINVAL, "%s: cannot read: not a regular file, expected a regular file",
                    path);
    goto out;
  }
  uint64_t size = (uint64_t)st.st_size;
  size_t hl = size < PS_NPY_MAX_PREAMBLE + PS_NPY_MAX_HEADER
                  ? (size_t)size : PS_NPY_MAX_PREAMBLE + PS_NPY_MAX_HEADER;
  head = malloc(hl + 1);
  if (head == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "%s: out of memory for the header", path);
    goto out;
  }
  if ((rc = read_at(fd, path, head, hl, 0, eb)) != 0 ||
      (rc = ps_npy_parse(path, head, hl, size, kind, h, eb)) != 0)
    goto out;
  /* The parse checked count * itemsize against the file's size. */
  size_t bytes = (size_t)(h->count * h->itemsize);
  buf = malloc(bytes);
  if (buf == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "%s: out of memory for %zu data bytes", path, bytes);
    goto out;
  }
  if ((rc = read_at(fd, path, buf, bytes, h->offset, eb)) != 0)
    goto out;
  *data = buf;
  buf = NULL;
out:
  free(buf);
  free(head);
  close(fd);
  if (rc != 0)
    memset(h, 0, sizeof *h);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* A data set directory                                                     */
/* ------------------------------------------------------------------------ */

static int join(const char *dir, const char *base, char *path, size_t cap, ps_errbuf *eb) {
  const char *sep = dir[0] != '\0' && dir[strlen(dir) - 1] == '/' ? "" : "/";
  int n = snprintf(path, cap, "%s%s%s", dir, sep, base);
  if (n < 0 || (size_t)n >= cap)
    return ps_err_set(eb, -ENAMETOOLONG, "%s: path of %s too long, expected at most %zu bytes",
                      dir, base, cap - 1);
  return 0;
}

int ps_npy_load(const char *dir, ps_dataset *ds, ps_errbuf *eb) {
  memset(ds, 0, sizeof *ds);
  if (dir == NULL || dir[0] == '\0')
    return ps_err_set(eb, -EINVAL, "data set directory not given");
  struct stat st;
  if (stat(dir, &st) != 0) {
    int e = errno;
    return ps_err_set(eb, -e, "%s: cannot open data set directory: %s", dir, strerror(e));
  }
  if (!S_ISDIR(st.st_mode))
    return ps_err_set(eb, -ENOTDIR, "%s: not a directory, expected a directory holding "
                      PS_NPY_X " and " PS_NPY_Y, dir);

  char xpath[4096], ypath[4096];
  ps_npy xh, yh;
  void *xdata = NULL, *ydata = NULL;
  uint8_t *labels = NULL;
  int top = 0, rc;
  if ((rc = join(dir, PS_NPY_X, xpath, sizeof xpath, eb)) != 0 ||
      (rc = join(dir, PS_NPY_Y, ypath, sizeof ypath, eb)) != 0 ||
      (rc = ps_npy_read(xpath, PS_NPY_FEATURES, &xh, &xdata, eb)) != 0 ||
      (rc = ps_npy_read(ypath, PS_NPY_LABELS, &yh, &ydata, eb)) != 0)
    goto err;
  if (xh.shape[0] != yh.shape[0]) {
    char xs[128], ys[128];
    rc = ps_err_set(eb, PS_ESHAPE, "%s has %" PRIu64 " samples (shape %s) but %s has %" PRIu64
                    " labels (shape %s), expected the same count", xpath, xh.shape[0],
                    ps_npy_shape_str(&xh, xs, sizeof xs), ypath, yh.shape[0],
                    ps_npy_shape_str(&yh, ys, sizeof ys));
    goto err;
  }
  labels = malloc((size_t)yh.count);
  if (labels == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "%s: out of memory for %" PRIu64 " labels", ypath, yh.count);
    goto err;
  }
  if ((rc = ps_npy_labels(ypath, &yh, ydata, labels, &top, eb)) != 0 ||
      (rc = ps_npy_features(xpath, &xh, xdata, xdata, eb)) != 0)
    goto err;
  free(ydata);
  ds->n = (size_t)xh.shape[0];
  ds->dim = (size_t)(xh.count / xh.shape[0]);
  ds->features = xdata;
  ds->labels = labels;
  ds->classes = top + 1;
  return 0;

err:
  free(xdata);
  free(ydata);
  free(labels);
  return rc;
}
