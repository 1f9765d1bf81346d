/* Streaming reader of Criteo-format files (plain or gzipped); spec in src/data/CRITEO.md. */
#include "data/criteo.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zlib.h>

#include "data/gzfile.h"

/* The bounded buffer: several lines of the longest kind, so that a line
 * never has to grow it. */
#define CRITEO_BUF (1 << 16)
_Static_assert(CRITEO_BUF > PS_CRITEO_MAX_LINE + 1, "the buffer holds the longest line");

struct ps_criteo {
  char *path;
  int worker, nworkers;
  gzFile gz;
  char *buf;           /* CRITEO_BUF bytes; the unread ones are buf[start, end) */
  size_t start, end;
  int eof;             /* gzread said the file has nothing after buf[end) */
  uint64_t line;       /* 0-based index of the next line in the file */
  uint64_t bytes;      /* uncompressed bytes read from the file so far */
  ps_data_pos pos;
  ps_errbuf err;       /* sticky: code != 0 once a call failed, until a seek */
  int sep;             /* the bags' separator byte, or -1: one value a field */
};

/* ------------------------------------------------------------------------ */
/* One line                                                                 */
/* ------------------------------------------------------------------------ */

uint64_t ps_criteo_key(int c, const void *bytes, size_t len) {
  return XXH3_64bits_withSeed(bytes, len, (XXH64_hash_t)c);
}

/* "label", "I1".."I13", "C1".."C26" for field f (0-based column). */
static const char *field_name(int f, char *s, size_t cap) {
  if (f == 0)
    snprintf(s, cap, "label");
  else if (f <= PS_CRITEO_NDENSE)
    snprintf(s, cap, "I%d", f);
  else
    snprintf(s, cap, "C%d", f - PS_CRITEO_NDENSE);
  return s;
}

/* `n` bytes of `p` as a one-line C-like string literal, at most 24 of them
 * (then "...(N bytes)"), so that a message stays one short line whatever
 * the bytes are. */
static const char *quote(const char *p, size_t n, char *s, size_t cap) {
  size_t k = 0, show = n < 24 ? n : 24;
  s[k++] = '"';
  for (size_t i = 0; i < show && k + 8 < cap; i++) {
    unsigned char ch = (unsigned char)p[i];
    if (ch == '"' || ch == '\\')
      k += (size_t)snprintf(s + k, cap - k, "\\%c", ch);
    else if (ch >= 0x20 && ch < 0x7f)
      s[k++] = (char)ch;
    else
      k += (size_t)snprintf(s + k, cap - k, "\\x%02x", ch);
  }
  s[k++] = '"';
  s[k] = '\0';
  if (show < n)
    snprintf(s + k, cap - k, "...(%zu bytes)", n);
  return s;
}

/* A decimal integer: an optional '-' and at least one digit, in int64
 * range.  @return 0, -1 when it is not one, -2 when it is out of range. */
static int parse_int(const char *p, size_t n, int64_t *out) {
  size_t i = n > 0 && p[0] == '-' ? 1 : 0;
  if (i == n)
    return -1;
  for (size_t k = i; k < n; k++)
    if (p[k] < '0' || p[k] > '9')
      return -1;
  uint64_t lim = i ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
  for (; i < n; i++) {
    unsigned d = (unsigned)(p[i] - '0');
    if (v > (lim - d) / 10)
      return -2;
    v = v * 10 + d;
  }
  /* -(v - 1) - 1 reaches INT64_MIN without overflowing. */
  *out = p[0] == '-' ? (v == 0 ? 0 : -(int64_t)(v - 1) - 1) : (int64_t)v;
  return 0;
}

/* The keys of categorical field c's bytes [b, b + n): one, or with a
 * separator (sep >= 0) one per non-empty value between separators.
 * @return how many were written to keys. */
static uint32_t field_keys(int c, const char *b, size_t n, int sep, uint64_t *keys) {
  if (sep < 0) {
    keys[0] = ps_criteo_key(c, b, n);
    return 1;
  }
  uint32_t k = 0;
  for (size_t pos = 0; pos < n;) {
    const char *e = memchr(b + pos, sep, n - pos);
    size_t end = e != NULL ? (size_t)(e - b) : n;
    if (end > pos)
      keys[k++] = ps_criteo_key(c, b + pos, end - pos);
    pos = end + 1;
  }
  return k;
}

int ps_criteo_parse_line(const char *line, size_t len, const char *file, uint64_t lineno,
                         float *label, float *dense, uint64_t *keys, ps_errbuf *eb) {
  uint32_t counts[PS_CRITEO_NSPARSE];
  return ps_criteo_parse_bags(line, len, file, lineno, -1, label, dense, keys, counts, eb);
}

int ps_criteo_parse_bags(const char *line, size_t len, const char *file, uint64_t lineno,
                         int sep, float *label, float *dense, uint64_t *keys, uint32_t *counts,
                         ps_errbuf *eb) {
  char name[16], q[160];
  if (len > 0 && line[len - 1] == '\r')
    len--;

  /* Fields first, counted and measured, then their contents: a line cut
   * short by the reader (longer than PS_CRITEO_MAX_LINE) always fails here,
   * on a field too long or a 41st field. */
  const char *f[PS_CRITEO_NFIELDS];
  size_t flen[PS_CRITEO_NFIELDS];
  int nf = 0;
  for (size_t pos = 0;;) {
    const char *tab = pos < len ? memchr(line + pos, '\t', len - pos) : NULL;
    size_t end = tab != NULL ? (size_t)(tab - line) : len;
    if (nf == PS_CRITEO_NFIELDS)
      return ps_err_set(eb, PS_EFORMAT,
                        "%s: line %" PRIu64 ": found more than %d fields (a tab after C%d), "
                        "expected %d tab-separated fields (label, I1-I%d, C1-C%d)",
                        file, lineno, PS_CRITEO_NFIELDS, PS_CRITEO_NSPARSE, PS_CRITEO_NFIELDS,
                        PS_CRITEO_NDENSE, PS_CRITEO_NSPARSE);
    if (end - pos > PS_CRITEO_MAX_FIELD)
      return ps_err_set(eb, PS_EFORMAT,
                        "%s: line %" PRIu64 ", field %d (%s): found more than %d bytes "
                        "(starting %s), expected at most %d",
                        file, lineno, nf + 1, field_name(nf, name, sizeof name),
                        PS_CRITEO_MAX_FIELD, quote(line + pos, 24, q, sizeof q),
                        PS_CRITEO_MAX_FIELD);
    f[nf] = line + pos;
    flen[nf++] = end - pos;
    if (tab == NULL)
      break;
    pos = end + 1;
  }
  if (nf < PS_CRITEO_NFIELDS)
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: line %" PRIu64 ": found %d field%s, expected %d tab-separated "
                      "fields (label, I1-I%d, C1-C%d)",
                      file, lineno, nf, nf == 1 ? "" : "s", PS_CRITEO_NFIELDS, PS_CRITEO_NDENSE,
                      PS_CRITEO_NSPARSE);

  if (flen[0] != 1 || (f[0][0] != '0' && f[0][0] != '1'))
    return ps_err_set(eb, PS_EFORMAT,
                      "%s: line %" PRIu64 ", field 1 (label): found %s, expected 0 or 1", file,
                      lineno, quote(f[0], flen[0], q, sizeof q));
  float d[PS_CRITEO_NDENSE];
  for (int i = 0; i < PS_CRITEO_NDENSE; i++) {
    int c = 1 + i;
    int64_t x = 0;
    int rc = flen[c] == 0 ? 0 : parse_int(f[c], flen[c], &x);
    if (rc < 0)
      return ps_err_set(eb, PS_EFORMAT,
                        "%s: line %" PRIu64 ", field %d (%s): found %s, expected %s", file,
                        lineno, c + 1, field_name(c, name, sizeof name),
                        quote(f[c], flen[c], q, sizeof q),
                        rc == -1 ? "a decimal integer or nothing (missing)"
                                 : "an integer in [-9223372036854775808, 9223372036854775807]");
    /* DLRM's transform: log(1 + x) for x > 0; 0 for x <= 0 and missing. */
    d[i] = x > 0 ? (float)log1p((double)x) : 0.0f;
  }
  *label = f[0][0] == '1' ? 1.0f : 0.0f;
  memcpy(dense, d, sizeof d);
  uint32_t k = 0;
  for (int i = 0; i < PS_CRITEO_NSPARSE; i++) {
    counts[i] = field_keys(i, f[1 + PS_CRITEO_NDENSE + i], flen[1 + PS_CRITEO_NDENSE + i], sep,
                           keys + k);
    k += counts[i];
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The stream                                                               */
/* ------------------------------------------------------------------------ */

/* Fails r with (code, message); the code stays until a seek. */
#define FAIL(r, code, ...) ps_err_set(&(r)->err, (code), __VA_ARGS__)

/* Reads more of the file after buf[end), moving the unread bytes to the
 * front first.  @return bytes read, 0 at the end of the file (r->eof set),
 * or a negative code (r->err set). */
static int fill(ps_criteo *r) {
  if (r->start > 0) {
    memmove(r->buf, r->buf + r->start, r->end - r->start);
    r->end -= r->start;
    r->start = 0;
  }
  int n = gzread(r->gz, r->buf + r->end, (unsigned)(CRITEO_BUF - r->end));
  /* gzread reports a .gz cut short as a plain end (0); only the stream
   * state tells it apart from a complete one. */
  int zerr = Z_OK;
  if (n <= 0)
    gzerror(r->gz, &zerr);
  /* The buffer is ahead of the lines handed out: a failure is somewhere
   * from line r->line + 1 on. */
  if (zerr == Z_ERRNO)
    return FAIL(r, -EIO, "%s: read error after %" PRIu64 " uncompressed bytes (line %" PRIu64
                " or later): %s", r->path, r->bytes, r->line + 1, strerror(errno));
  if (zerr == Z_MEM_ERROR)
    return FAIL(r, -ENOMEM, "%s: out of memory while decompressing", r->path);
  if (zerr == Z_BUF_ERROR)
    return FAIL(r, PS_EFORMAT,
                "%s: truncated gzip data: input ends after %" PRIu64 " uncompressed bytes "
                "(line %" PRIu64 " or later), expected the rest of the stream",
                r->path, r->bytes, r->line + 1);
  if (n < 0 || zerr != Z_OK)
    return FAIL(r, PS_EFORMAT,
                "%s: corrupt gzip data after %" PRIu64 " uncompressed bytes (line %" PRIu64
                " or later), expected a valid deflate stream",
                r->path, r->bytes, r->line + 1);
  if (n == 0)
    r->eof = 1;
  r->end += (size_t)n;
  r->bytes += (uint64_t)n;
  return n;
}

/* Moves past the next line.  With `keep`, points *p at it (valid until the
 * next call; at most PS_CRITEO_MAX_LINE + 1 bytes, *cut set when the line is
 * longer and this is its start); without, the line may be of any length.
 * A last line without '\n' counts.  @return 1, 0 at the end of the file, or
 * a negative code (r->err set). */
static int next_line(ps_criteo *r, int keep, const char **p, size_t *len, int *cut) {
  size_t scanned = 0;
  int dropped = 0;
  for (;;) {
    char *from = r->buf + r->start + scanned;
    char *nl = memchr(from, '\n', r->end - r->start - scanned);
    if (nl != NULL || (r->eof && (r->end > r->start || dropped)) ||
        (keep && r->end - r->start > PS_CRITEO_MAX_LINE)) {
      size_t n = nl != NULL ? (size_t)(nl - (r->buf + r->start)) : r->end - r->start;
      if (keep) {
        *cut = nl == NULL && !r->eof;
        *p = r->buf + r->start;
        *len = *cut ? PS_CRITEO_MAX_LINE + 1 : n;
      }
      r->start += nl != NULL ? n + 1 : n;
      r->line++;
      return 1;
    }
    if (r->eof)
      return 0;
    scanned = r->end - r->start;
    if (!keep) {
      /* A skipped line needs no room: what was searched is dropped. */
      dropped |= scanned > 0;
      r->start = r->end;
      scanned = 0;
    }
    int rc = fill(r);
    if (rc < 0)
      return rc;
  }
}

/* Back to the file's start, with no error held.  zlib refuses to rewind a
 * stream it found corrupt: the error that says so is then kept (reading
 * again would meet the same damage). */
static int rewind_file(ps_criteo *r) {
  if (gzrewind(r->gz) != 0)
    return r->err.code != 0 ? r->err.code
                            : FAIL(r, -EIO, "%s: cannot go back to the start: %s", r->path,
                                   strerror(errno));
  memset(&r->err, 0, sizeof r->err);
  r->start = r->end = 0;
  r->eof = 0;
  r->line = 0;
  r->bytes = 0;
  return 0;
}

int ps_criteo_open(ps_criteo **out, const char *path, int worker, int nworkers, ps_errbuf *eb) {
  *out = NULL;
  if (nworkers < 1 || worker < 0 || worker >= nworkers)
    return ps_err_set(eb, -EINVAL, "%s: worker %d of %d, expected 0 <= worker < workers", path,
                      worker, nworkers);
  /* A regular file: a pipe cannot be re-read each epoch. */
  gzFile gz;
  int rc = ps_gzfile_open(path, &gz, eb);
  if (rc != 0)
    return rc;
  ps_criteo *r = calloc(1, sizeof *r);
  if (r == NULL || (r->path = strdup(path)) == NULL || (r->buf = malloc(CRITEO_BUF)) == NULL) {
    gzclose(gz);
    ps_criteo_close(r);
    return ps_err_set(eb, -ENOMEM, "%s: cannot open: out of memory", path);
  }
  r->gz = gz;
  r->worker = worker;
  r->sep = -1;
  r->nworkers = nworkers;
  *out = r;
  return 0;
}

void ps_criteo_close(ps_criteo *r) {
  if (r == NULL)
    return;
  if (r->gz != NULL)
    gzclose(r->gz);
  free(r->buf);
  free(r->path);
  free(r);
}

/* Skips other workers' lines up to this worker's next one.  @return as
 * next_line. */
static int next_own_line(ps_criteo *r, const char **p, size_t *len, int *cut) {
  for (;;) {
    int own = r->line % (uint64_t)r->nworkers == (uint64_t)r->worker;
    int rc = next_line(r, own, p, len, cut);
    if (rc <= 0 || own)
      return rc;
  }
}

/* Parses the line next_line kept (r->line is its 1-based number now) into
 * the outputs; its error goes to r->err. */
static int parse_kept(ps_criteo *r, const char *p, size_t len, int cut, float *label,
                      float *dense, uint64_t *keys, uint32_t *counts) {
  int rc = ps_criteo_parse_bags(p, len, r->path, r->line, r->sep, label, dense, keys, counts,
                                &r->err);
  /* A cut line always fails in the parser (see there); kept as a guard. */
  if (rc == 0 && cut)
    rc = FAIL(r, PS_EFORMAT, "%s: line %" PRIu64 ": longer than %d bytes, expected at most %d",
              r->path, r->line, PS_CRITEO_MAX_LINE, PS_CRITEO_MAX_LINE);
  return rc;
}

static ssize_t failed(ps_criteo *r, ps_errbuf *eb) {
  if (eb != NULL)
    *eb = r->err;
  return r->err.code;
}

/* The loop of ps_criteo_next and _next_bags: the keys into keys[] and,
 * with counts, each sample's fields' counts into counts[k * 26 ..]
 * (without: one key a field). */
static ssize_t next_samples(ps_criteo *r, size_t max, float *labels, float *dense, uint64_t *keys,
                            uint32_t *counts, ps_errbuf *eb) {
  if (r->err.code != 0)
    return failed(r, eb);
  ps_data_pos pos = r->pos;
  size_t k = 0, nkeys = 0;
  while (k < max) {
    const char *p = NULL;
    size_t len = 0;
    int cut = 0;
    int rc = next_own_line(r, &p, &len, &cut);
    if (rc < 0)
      return failed(r, eb);
    if (rc == 0) {
      if (k > 0)
        break;
      /* The epoch was over when this call began: the next one starts. */
      if (pos.offset == 0) {
        FAIL(r, -ENODATA, "%s: %" PRIu64 " line%s, none of them for worker %d of %d, expected "
             "at least %d lines", r->path, r->line, r->line == 1 ? "" : "s", r->worker,
             r->nworkers, r->worker + 1);
        return failed(r, eb);
      }
      if (rewind_file(r) < 0)
        return failed(r, eb);
      pos.epoch++;
      pos.offset = 0;
      continue;
    }
    uint32_t one[PS_CRITEO_NSPARSE];
    uint32_t *cnt = counts != NULL ? counts + k * PS_CRITEO_NSPARSE : one;
    rc = parse_kept(r, p, len, cut, labels + k, dense + k * PS_CRITEO_NDENSE, keys + nkeys, cnt);
    if (rc < 0)
      return failed(r, eb);
    for (int c = 0; c < PS_CRITEO_NSPARSE; c++)
      nkeys += cnt[c];
    k++;
    pos.offset++;
  }
  r->pos = pos;
  return (ssize_t)k;
}

ssize_t ps_criteo_next(ps_criteo *r, size_t max, float *labels, float *dense, uint64_t *keys,
                       ps_errbuf *eb) {
  if (r->sep >= 0)
    return ps_err_set(eb, -EINVAL, "%s: a reader of bags hands them out with ps_criteo_next_bags",
                      r->path);
  return next_samples(r, max, labels, dense, keys, NULL, eb);
}

int ps_criteo_keys_init(ps_criteo_keys *k, size_t max, int bags) {
  memset(k, 0, sizeof *k);
  k->max = max;
  k->bags = bags;
  size_t m = max > 0 ? max : 1;
  k->offs = malloc((m * PS_CRITEO_NSPARSE + 1) * sizeof *k->offs);
  k->keys = malloc(m * PS_CRITEO_NSPARSE * (bags ? PS_CRITEO_MAX_BAG : 1) * sizeof *k->keys);
  if (k->offs == NULL || k->keys == NULL) {
    ps_criteo_keys_free(k);
    return -ENOMEM;
  }
  return 0;
}

void ps_criteo_keys_free(ps_criteo_keys *k) {
  free(k->offs);
  free(k->keys);
  memset(k, 0, sizeof *k);
}

ssize_t ps_criteo_next_bags(ps_criteo *r, size_t max, float *labels, float *dense,
                            ps_criteo_keys *out, ps_errbuf *eb) {
  if (max > out->max)
    max = out->max;
  if (r->sep >= 0 && !out->bags)
    return ps_err_set(eb, -EINVAL, "%s: a reader of bags needs keys with room for bags", r->path);
  /* The counts go where the offsets will be (one slot later), then add up. */
  ssize_t n = next_samples(r, max, labels, dense, out->keys, out->offs + 1, eb);
  if (n < 0)
    return n;
  out->offs[0] = 0;
  for (size_t i = 1; i <= (size_t)n * PS_CRITEO_NSPARSE; i++)
    out->offs[i] += out->offs[i - 1];
  return n;
}

void ps_criteo_set_bags(ps_criteo *r, int sep) { r->sep = sep; }

ps_data_pos ps_criteo_pos(const ps_criteo *r) { return r->pos; }

int ps_criteo_seek(ps_criteo *r, ps_data_pos pos, ps_errbuf *eb) {
  if (rewind_file(r) < 0)
    return (int)failed(r, eb);
  r->pos = (ps_data_pos){0, 0};
  for (uint64_t skipped = 0; skipped < pos.offset;) {
    const char *p;
    size_t len;
    int cut;
    int own = r->line % (uint64_t)r->nworkers == (uint64_t)r->worker;
    int rc = next_line(r, 0, &p, &len, &cut);
    if (rc < 0)
      return (int)failed(r, eb);
    if (rc == 0) {
      int e = ps_err_set(eb, -EINVAL,
                         "%s: position epoch %" PRIu64 " offset %" PRIu64 " is past the %" PRIu64
                         " samples of worker %d of %d, expected an offset <= %" PRIu64,
                         r->path, pos.epoch, pos.offset, skipped, r->worker, r->nworkers,
                         skipped);
      if (rewind_file(r) < 0)
        return (int)failed(r, eb);
      return e;
    }
    skipped += (uint64_t)own;
  }
  r->pos = pos;
  return 0;
}

int ps_criteo_count(const char *path, uint64_t *n, ps_errbuf *eb) {
  *n = 0;
  ps_criteo *r;
  int rc = ps_criteo_open(&r, path, 0, 1, eb);
  if (rc < 0)
    return rc;
  for (;;) {
    const char *p;
    size_t len;
    int cut;
    float label, dense[PS_CRITEO_NDENSE];
    uint64_t keys[PS_CRITEO_NSPARSE];
    uint32_t counts[PS_CRITEO_NSPARSE];
    rc = next_line(r, 1, &p, &len, &cut);
    if (rc == 0)
      break;
    if (rc > 0)
      rc = parse_kept(r, p, len, cut, &label, dense, keys, counts);
    if (rc < 0) {
      failed(r, eb);
      break;
    }
  }
  if (rc == 0)
    *n = r->line;
  ps_criteo_close(r);
  return rc;
}
