/* libFuzzer target for the Criteo reader: the input parsed as one line
 * (ps_criteo_parse_line), then read as a whole file, plain or gzip, by every
 * worker of 1 to 3.  Any input must be taken or refused in one line. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "data/criteo.h"

#define ND PS_CRITEO_NDENSE
#define NS PS_CRITEO_NSPARSE
#define MAXB 4

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(int rc, const ps_errbuf *eb) {
  if (rc >= 0 || eb->code != rc || eb->msg[0] == '\0' ||
      memchr(eb->msg, '\n', sizeof eb->msg) != NULL)
    __builtin_trap();
}

/* The same line as bags separated by ',': taken as well, the same label
 * and integers; each field's keys those of its values between commas
 * (empty ones skipped), at most PS_CRITEO_MAX_BAG of them; a field
 * without a comma the one key it had without bags (an empty one none). */
static void check_bags(const char *line, size_t len, float label, const float *dense,
                       const uint64_t *one) {
  static uint64_t keys[NS * PS_CRITEO_MAX_BAG];
  uint32_t counts[NS];
  float blabel, bdense[ND];
  ps_errbuf eb = {0};
  if (ps_criteo_parse_bags(line, len, "fuzz", 1, ',', &blabel, bdense, keys, counts, &eb) != 0 ||
      blabel != label || memcmp(bdense, dense, sizeof bdense) != 0)
    __builtin_trap();
  if (len > 0 && line[len - 1] == '\r')
    len--;
  const char *f = line;
  for (int k = 0; k <= ND; k++)
    f = memchr(f, '\t', len - (size_t)(f - line)) + 1;
  size_t at = 0;
  for (int c = 0; c < NS; c++) {
    const char *tab = memchr(f, '\t', len - (size_t)(f - line));
    size_t flen = tab != NULL ? (size_t)(tab - f) : len - (size_t)(f - line);
    if (counts[c] > PS_CRITEO_MAX_BAG)
      __builtin_trap();
    if (memchr(f, ',', flen) == NULL && counts[c] != (flen > 0) )
      __builtin_trap();
    if (memchr(f, ',', flen) == NULL && flen > 0 && keys[at] != one[c])
      __builtin_trap();
    uint32_t got = 0;
    for (size_t p = 0; p < flen;) {
      const char *comma = memchr(f + p, ',', flen - p);
      size_t e = comma != NULL ? (size_t)(comma - f) : flen;
      if (e > p && (got >= counts[c] ||
                    keys[at + got++] != XXH3_64bits_withSeed(f + p, e - p, (XXH64_hash_t)c)))
        __builtin_trap();
      p = e + 1;
    }
    if (got != counts[c])
      __builtin_trap();
    at += counts[c];
    if (tab != NULL)
      f = tab + 1;
  }
}

static void check_line(const char *line, size_t len) {
  float label = -1, dense[ND] = {-1};
  uint64_t keys[NS] = {0};
  ps_errbuf eb = {0};
  int rc = ps_criteo_parse_line(line, len, "fuzz", 1, &label, dense, keys, &eb);
  if (rc != 0) {
    /* Refused: one line naming it, and nothing written. */
    check_error(rc, &eb);
    if (rc != PS_EFORMAT || strncmp(eb.msg, "fuzz: line 1", 12) != 0 || label != -1 ||
        dense[0] != -1 || keys[0] != 0)
      __builtin_trap();
    return;
  }
  /* Taken: a label, transformed integers, and each key the hash of its
   * field's bytes (split here independently). */
  size_t whole = len;
  if (label != 0.0f && label != 1.0f)
    __builtin_trap();
  for (int i = 0; i < ND; i++)
    if (!(dense[i] >= 0.0f && dense[i] < 44.0f))
      __builtin_trap();
  if (len > 0 && line[len - 1] == '\r')
    len--;
  const char *f = line, *end = line + len;
  for (int k = 0; k < PS_CRITEO_NFIELDS; k++) {
    const char *tab = f < end ? memchr(f, '\t', (size_t)(end - f)) : NULL;
    const char *fe = tab != NULL ? tab : end;
    if ((k < PS_CRITEO_NFIELDS - 1) != (tab != NULL) || fe - f > PS_CRITEO_MAX_FIELD)
      __builtin_trap();
    if (k > ND && keys[k - 1 - ND] != XXH3_64bits_withSeed(f, (size_t)(fe - f),
                                                          (XXH64_hash_t)(k - 1 - ND)))
      __builtin_trap();
    if (tab != NULL)
      f = tab + 1;
  }
  check_bags(line, whole, label, dense, keys);
}

/* A file for the input: unlinked at once, reopened through /proc. */
static const char *file_of(const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    char tmpl[] = "/tmp/fuzz_criteo.XXXXXX";
    fd = mkstemp(tmpl);
    if (fd < 0)
      abort();
    unlink(tmpl);
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
    abort();
  return path;
}

typedef struct batch {
  ssize_t n;
  float labels[MAXB], dense[MAXB * ND];
  uint64_t keys[MAXB * NS];
} batch;

static void next(ps_criteo *r, size_t max, batch *b) {
  memset(b, 0, sizeof *b);
  ps_errbuf eb = {0};
  b->n = ps_criteo_next(r, max, b->labels, b->dense, b->keys, &eb);
  if (b->n < 0) {
    check_error((int)b->n, &eb);
    /* The error stays. */
    ps_errbuf again = {0};
    if (ps_criteo_next(r, max, b->labels, b->dense, b->keys, &again) != b->n ||
        strcmp(again.msg, eb.msg) != 0)
      __builtin_trap();
  } else if (b->n == 0 || (size_t)b->n > max) {
    __builtin_trap();
  }
}

/* Worker j of m reads one epoch in batches of max.  @return its samples,
 * or -1 when it failed. */
static int64_t read_epoch(const char *path, int j, int m, size_t max) {
  ps_criteo *r;
  ps_errbuf eb = {0};
  int rc = ps_criteo_open(&r, path, j, m, &eb);
  if (rc != 0)
    __builtin_trap();
  batch b;
  int64_t got = 0;
  for (;;) {
    next(r, max, &b);
    if (b.n < 0) {
      got = -1;
      break;
    }
    if (ps_criteo_pos(r).epoch != 0)
      break;
    got += b.n;
    if ((uint64_t)got != ps_criteo_pos(r).offset)
      __builtin_trap();
  }
  ps_criteo_close(r);
  return got;
}

static void check_file(const uint8_t *data, size_t size) {
  const char *path = file_of(data, size);
  int m = 1 + (size > 0 ? data[0] % 3 : 0);
  size_t max = 1 + (size > 1 ? data[1] % MAXB : 0);
  uint64_t n = 0;
  ps_errbuf eb = {0};
  int rc = ps_criteo_count(path, &n, &eb);
  if (rc != 0)
    check_error(rc, &eb);
  int failed = 0;
  for (int j = 0; j < m; j++) {
    int64_t got = read_epoch(path, j, m, max);
    failed |= got < 0;
    /* A file that counts is read whole by every worker, its part each. */
    if (rc == 0 && got != (ps_criteo_part_size(n, j, m) > 0
                               ? (int64_t)ps_criteo_part_size(n, j, m) : -1))
      __builtin_trap();
  }
  /* A file that does not count fails some worker. */
  if (rc != 0 && !failed)
    __builtin_trap();

  /* A reader seeked to where another was hands out what that one did. */
  if (rc == 0 && n > 0) {
    ps_criteo *a, *c;
    if (ps_criteo_open(&a, path, 0, m, NULL) != 0 || ps_criteo_open(&c, path, 0, m, NULL) != 0)
      __builtin_trap();
    batch ba, bc;
    next(a, max, &ba);
    ps_data_pos pos = ps_criteo_pos(a);
    next(a, max, &ba);
    if (ps_criteo_seek(c, pos, NULL) != 0)
      __builtin_trap();
    next(c, max, &bc);
    if (memcmp(&ba, &bc, sizeof ba) != 0 || ps_criteo_pos(a).epoch != ps_criteo_pos(c).epoch ||
        ps_criteo_pos(a).offset != ps_criteo_pos(c).offset)
      __builtin_trap();
    ps_criteo_close(a);
    ps_criteo_close(c);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_line((const char *)data, size);
  check_file(data, size);
  return 0;
}
