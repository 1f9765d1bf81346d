/* Tests of the Criteo-format reader, on small files each test writes itself. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zlib.h>

#include <cmocka.h>

#include "tmpdir.h"

#include "data/criteo.h"

#define ND PS_CRITEO_NDENSE
#define NS PS_CRITEO_NSPARSE

/* ------------------------------------------------------------------------ */
/* Fixtures                                                                 */
/* ------------------------------------------------------------------------ */

static int setup(void **state) {
  (void)state;
  return tmpdir_create("test_criteo");
}

static int teardown(void **state) {
  (void)state;
  return tmpdir_remove();
}

/* Writes `len` bytes to `name` in the test's directory, gzipped or not;
 * returns its path (copied: at() reuses its buffer). */
static const char *put(const char *name, const char *buf, size_t len, int gz) {
  static char path[4][512];
  static int next;
  char *p = path[next++ % 4];
  tmpdir_put_bytes(name, buf, len, gz);
  snprintf(p, sizeof path[0], "%s", at(name));
  return p;
}

/* Line i of the generated files: label i % 2, I1 = i, I2 = -i, I13 = 7,
 * C1 = "s<i>" (which identifies it), C2 = "68fd1e64", the rest missing;
 * `eol` ends it. */
static size_t gen_line(char *s, size_t cap, int i, const char *eol) {
  int n = snprintf(s, cap, "%d\t%d\t%d\t\t\t\t\t\t\t\t\t\t\t7\ts%d\t68fd1e64", i % 2, i, -i, i);
  for (int c = 2; c < NS; c++)
    n += snprintf(s + n, cap - (size_t)n, "\t");
  n += snprintf(s + n, cap - (size_t)n, "%s", eol);
  return (size_t)n;
}

/* A file of lines 0..n-1, each ending in `eol`. */
static const char *gen_file(const char *name, int n, const char *eol, int gz) {
  size_t cap = (size_t)n * 128 + 1, len = 0;
  char *buf = malloc(cap);
  assert_non_null(buf);
  for (int i = 0; i < n; i++)
    len += gen_line(buf + len, cap - len, i, eol);
  const char *p = put(name, buf, len, gz);
  free(buf);
  return p;
}

/* Which generated line a sample is (its C1), or -1. */
static int line_of(const uint64_t *keys) {
  char s[16];
  for (int i = 0; i < 1000; i++) {
    snprintf(s, sizeof s, "s%d", i);
    if (keys[0] == XXH3_64bits_withSeed(s, strlen(s), 0))
      return i;
  }
  return -1;
}

/* Samples as read: up to 64. */
typedef struct batch {
  ssize_t n;
  float labels[64], dense[64 * ND];
  uint64_t keys[64 * NS];
} batch;

static ssize_t next(ps_criteo *r, size_t max, batch *b, ps_errbuf *eb) {
  assert_true(max <= 64);
  memset(b, 0, sizeof *b);
  b->n = ps_criteo_next(r, max, b->labels, b->dense, b->keys, eb);
  return b->n;
}

/* Checks that sample k of b is generated line i, value by value. */
static void assert_gen(const batch *b, ssize_t k, int i) {
  char s[16];
  snprintf(s, sizeof s, "s%d", i);
  assert_int_equal(line_of(b->keys + k * NS), i);
  assert_true(b->labels[k] == (float)(i % 2));
  assert_float_equal(b->dense[k * ND], i > 0 ? (float)log1p(i) : 0.0f, 1e-6);
  assert_true(b->dense[k * ND + 1] == 0.0f);
  assert_float_equal(b->dense[k * ND + 12], 2.0794415f, 1e-6);
  assert_true(b->keys[k * NS] == XXH3_64bits_withSeed(s, strlen(s), 0));
  assert_true(b->keys[k * NS + 1] == XXH3_64bits_withSeed("68fd1e64", 8, 1));
  for (int c = 2; c < NS; c++)
    assert_true(b->keys[k * NS + (size_t)c] == XXH3_64bits_withSeed("", 0, (uint64_t)c));
}

static ps_criteo *open_ok(const char *path, int worker, int nworkers) {
  ps_criteo *r = NULL;
  ps_errbuf eb = {0};
  int rc = ps_criteo_open(&r, path, worker, nworkers, &eb);
  if (rc != 0)
    fail_msg("%s", eb.msg);
  return r;
}

/* ------------------------------------------------------------------------ */
/* One line                                                                 */
/* ------------------------------------------------------------------------ */

static const char *const exact_ints[ND] = {
    "0", "1", "-5", "", "1000", "3", "2147483647", "-9223372036854775808",
    "9223372036854775807", "007", "", "12", "-0"};
/* log(1 + x) for x > 0, else 0 (computed apart, to 9 digits). */
static const float exact_dense[ND] = {0.0f,       0.693147182f, 0.0f,        0.0f,      6.90875483f,
                                      1.38629436f, 21.4875622f, 0.0f,        43.6682739f, 2.07944155f,
                                      0.0f,       2.56494927f,  0.0f};
static const char *const exact_cats[NS] = {
    "68fd1e64", "80e26c9b", "", "a", "ffffffff", "x y", "\xc3\xa9t\xc3\xa9", "0", "", "", "",
    "", "", "", "", "", "", "", "", "", "", "", "", "", "25c83c98", "last"};

static size_t exact_line(char *s, size_t cap, const char *label) {
  size_t n = (size_t)snprintf(s, cap, "%s", label);
  for (int i = 0; i < ND; i++)
    n += (size_t)snprintf(s + n, cap - n, "\t%s", exact_ints[i]);
  for (int c = 0; c < NS; c++)
    n += (size_t)snprintf(s + n, cap - n, "\t%s", exact_cats[c]);
  return n;
}

static void assert_exact(float label, const float *dense, const uint64_t *keys, float want) {
  assert_true(label == want);
  for (int i = 0; i < ND; i++)
    assert_float_equal(dense[i], exact_dense[i], 1e-6 * (1 + exact_dense[i]));
  for (int c = 0; c < NS; c++)
    assert_true(keys[c] ==
                XXH3_64bits_withSeed(exact_cats[c], strlen(exact_cats[c]), (uint64_t)c));
}

static void test_parse_exact(void **state) {
  (void)state;
  char s[1024];
  float label = -1, dense[ND];
  uint64_t keys[NS];
  ps_errbuf eb = {0};
  size_t n = exact_line(s, sizeof s, "1");
  assert_int_equal(ps_criteo_parse_line(s, n, "f", 1, &label, dense, keys, &eb), 0);
  assert_exact(label, dense, keys, 1.0f);
  /* The key function is the one documented. */
  assert_true(ps_criteo_key(3, "a", 1) == XXH3_64bits_withSeed("a", 1, 3));
  /* The same bytes in another field are another key. */
  assert_true(keys[0] != XXH3_64bits_withSeed("68fd1e64", 8, 1));

  n = exact_line(s, sizeof s, "0");
  assert_int_equal(ps_criteo_parse_line(s, n, "f", 1, &label, dense, keys, &eb), 0);
  assert_exact(label, dense, keys, 0.0f);
}

static void test_parse_missing(void **state) {
  (void)state;
  char s[64];
  s[0] = '0';
  memset(s + 1, '\t', PS_CRITEO_NFIELDS - 1);
  float label = -1, dense[ND];
  uint64_t keys[NS];
  memset(dense, 0xff, sizeof dense);
  assert_int_equal(ps_criteo_parse_line(s, PS_CRITEO_NFIELDS, "f", 1, &label, dense, keys, NULL),
                   0);
  assert_true(label == 0.0f);
  for (int i = 0; i < ND; i++)
    assert_true(dense[i] == 0.0f);
  for (int c = 0; c < NS; c++) {
    assert_true(keys[c] == ps_criteo_key(c, "", 0));
    assert_true(keys[c] == XXH3_64bits_withSeed("", 0, (uint64_t)c));
    /* A distinct missing key per field. */
    for (int d = 0; d < c; d++)
      assert_true(keys[c] != keys[d]);
  }
}

/* One trailing '\r' is the line end's, not C26's. */
static void test_parse_crlf(void **state) {
  (void)state;
  char s[1024];
  size_t n = exact_line(s, sizeof s, "1");
  s[n++] = '\r';
  float label, dense[ND];
  uint64_t keys[NS];
  assert_int_equal(ps_criteo_parse_line(s, n, "f", 1, &label, dense, keys, NULL), 0);
  assert_exact(label, dense, keys, 1.0f);
  /* A second '\r' is C26's. */
  s[n++] = '\r';
  assert_int_equal(ps_criteo_parse_line(s, n, "f", 1, &label, dense, keys, NULL), 0);
  assert_true(keys[NS - 1] == XXH3_64bits_withSeed("last\r", 5, NS - 1));
}

/* Bags: a field's values between separators, each its field's key; empty
 * values are skipped, an empty field is an empty bag; the longest field
 * holds PS_CRITEO_MAX_BAG values.  Without a separator the same bytes are
 * one value. */
static void test_parse_bags(void **state) {
  (void)state;
  char s[2048];
  size_t n = (size_t)snprintf(s, sizeof s, "1");
  for (int i = 0; i < ND; i++)
    n += (size_t)snprintf(s + n, sizeof s - n, "\t%d", i);
  const char *cats[NS] = {"a,b", "", "a,,a", ",x,", "y"};
  char longest[PS_CRITEO_MAX_FIELD + 1];
  for (int i = 0; i < PS_CRITEO_MAX_FIELD; i++)
    longest[i] = i % 2 ? ',' : 'v';
  longest[PS_CRITEO_MAX_FIELD] = '\0';
  cats[5] = longest;
  for (int c = 0; c < NS; c++)
    n += (size_t)snprintf(s + n, sizeof s - n, "\t%s", cats[c] ? cats[c] : "z");
  float label, dense[ND];
  uint64_t keys[NS * PS_CRITEO_MAX_BAG];
  uint32_t counts[NS];
  ps_errbuf eb = {0};
  assert_int_equal(ps_criteo_parse_bags(s, n, "f", 1, ',', &label, dense, keys, counts, &eb), 0);
  assert_true(label == 1.0f);
  static const uint32_t want_counts[6] = {2, 0, 2, 1, 1, PS_CRITEO_MAX_BAG};
  for (int c = 0; c < NS; c++)
    assert_int_equal(counts[c], c < 6 ? want_counts[c] : 1);
  assert_true(keys[0] == ps_criteo_key(0, "a", 1) && keys[1] == ps_criteo_key(0, "b", 1));
  assert_true(keys[2] == ps_criteo_key(2, "a", 1) && keys[3] == keys[2]);
  assert_true(keys[4] == ps_criteo_key(3, "x", 1) && keys[5] == ps_criteo_key(4, "y", 1));
  for (int j = 0; j < PS_CRITEO_MAX_BAG; j++)
    assert_true(keys[6 + j] == ps_criteo_key(5, "v", 1));
  assert_true(keys[6 + PS_CRITEO_MAX_BAG] == ps_criteo_key(6, "z", 1));
  /* No separator: one key of the field's bytes, an empty field's too. */
  assert_int_equal(ps_criteo_parse_line(s, n, "f", 1, &label, dense, keys, &eb), 0);
  assert_true(keys[0] == ps_criteo_key(0, "a,b", 3) && keys[1] == ps_criteo_key(1, "", 0));

  /* A file read as bags: offsets over the batch, positions as without. */
  size_t len = n;
  s[len++] = '\n';
  memcpy(s + len, s, len);
  const char *p = put("bags", s, 2 * len, 1);
  ps_criteo *r = open_ok(p, 0, 1);
  ps_criteo_keys k;
  float labels[2], dense2[2 * ND];
  assert_int_equal(ps_criteo_keys_init(&k, 2, 0), 0);
  ps_criteo_set_bags(r, ',');
  /* Keys without room for bags are refused, and ps_criteo_next too. */
  assert_int_equal(ps_criteo_next_bags(r, 2, labels, dense2, &k, &eb), -EINVAL);
  assert_int_equal(ps_criteo_next(r, 2, labels, dense2, keys, &eb), -EINVAL);
  ps_criteo_keys_free(&k);
  assert_int_equal(ps_criteo_keys_init(&k, 2, 1), 0);
  assert_int_equal(ps_criteo_next_bags(r, 2, labels, dense2, &k, &eb), 2);
  uint32_t per = 2 + 0 + 2 + 1 + 1 + PS_CRITEO_MAX_BAG + (NS - 6);
  assert_int_equal(k.offs[0], 0);
  assert_int_equal(k.offs[1], 2);
  assert_int_equal(k.offs[2], 2);
  assert_int_equal(k.offs[NS], per);
  assert_int_equal(k.offs[2 * NS], 2 * per);
  assert_true(k.keys[per] == ps_criteo_key(0, "a", 1));
  assert_int_equal(ps_criteo_pos(r).offset, 2);
  /* Without bags the same reader hands out one key a field again. */
  ps_criteo_set_bags(r, -1);
  assert_int_equal(ps_criteo_seek(r, (ps_data_pos){0, 0}, &eb), 0);
  assert_int_equal(ps_criteo_next_bags(r, 1, labels, dense2, &k, &eb), 1);
  assert_int_equal(k.offs[NS], NS);
  ps_criteo_keys_free(&k);
  ps_criteo_close(r);
}

/* ------------------------------------------------------------------------ */
/* Files                                                                    */
/* ------------------------------------------------------------------------ */

/* Lines of gen_line ending in \n or \r\n, plain or gzipped, read in
 * batches of 3: the same samples, the values gen_line wrote. */
static void test_plain_gzip_crlf(void **state) {
  (void)state;
  const char *files[4] = {gen_file("lf", 7, "\n", 0), gen_file("lf.gz", 7, "\n", 1),
                          gen_file("crlf", 7, "\r\n", 0), gen_file("crlf.gz", 7, "\r\n", 1)};
  batch first[3], b;
  for (int f = 0; f < 4; f++) {
    ps_criteo *r = open_ok(files[f], 0, 1);
    for (int k = 0; k < 3; k++) {
      ps_errbuf eb = {0};
      ssize_t n = next(r, 3, &b, &eb);
      assert_int_equal(n, k < 2 ? 3 : 1);
      for (ssize_t j = 0; j < n; j++)
        assert_gen(&b, j, k * 3 + (int)j);
      if (f == 0)
        first[k] = b;
      else
        assert_memory_equal(&b, &first[k], sizeof b);
    }
    ps_criteo_close(r);
  }
}

/* A last line without '\n' is a line; an empty file has none. */
static void test_last_line_unterminated(void **state) {
  (void)state;
  char s[256];
  size_t n = gen_line(s, sizeof s, 0, "\n");
  n += gen_line(s + n, sizeof s - n, 1, "");
  const char *p = put("unterminated", s, n, 0);
  uint64_t count = 99;
  assert_int_equal(ps_criteo_count(p, &count, NULL), 0);
  assert_int_equal(count, 2);
  ps_criteo *r = open_ok(p, 0, 1);
  batch b;
  assert_int_equal(next(r, 5, &b, NULL), 2);
  assert_gen(&b, 1, 1);
  ps_criteo_close(r);

  p = put("empty", "", 0, 1);
  assert_int_equal(ps_criteo_count(p, &count, NULL), 0);
  assert_int_equal(count, 0);
}

/* Worker j of M gets exactly the lines i with i mod M == j, in the file's
 * order, whether in batches of one or in one batch; together the parts are
 * the file, once. */
static void test_parts(void **state) {
  (void)state;
  const int n = 8;
  const char *p = gen_file("parts.gz", n, "\n", 1);
  batch b;
  for (int m = 1; m <= 3; m++) {
    int seen[8] = {0};
    for (int j = 0; j < m; j++) {
      int want[8], part = 0;
      for (int i = j; i < n; i += m)
        want[part++] = i;
      ps_criteo *r = open_ok(p, j, m);
      for (int t = 0; t < part; t++) {
        assert_int_equal(next(r, 1, &b, NULL), 1);
        assert_gen(&b, 0, want[t]);
        seen[want[t]]++;
        assert_int_equal(ps_criteo_pos(r).epoch, 0);
        assert_int_equal(ps_criteo_pos(r).offset, (uint64_t)t + 1);
      }
      /* The next one is epoch 1's first. */
      assert_int_equal(next(r, 1, &b, NULL), 1);
      assert_int_equal(line_of(b.keys), j);
      assert_int_equal(ps_criteo_pos(r).epoch, 1);
      ps_criteo_close(r);

      r = open_ok(p, j, m);
      assert_int_equal(next(r, 64, &b, NULL), part);
      for (int t = 0; t < part; t++)
        assert_gen(&b, t, want[t]);
      assert_int_equal(part, ps_criteo_part_size((uint64_t)n, j, m));
      ps_criteo_close(r);
    }
    for (int i = 0; i < n; i++)
      assert_int_equal(seen[i], 1);
  }
}

/* A batch comes back short at an epoch's end; the next call starts the
 * next epoch from the file's start, and the position says (e, part) until
 * then. */
static void test_epoch_boundary(void **state) {
  (void)state;
  const char *p = gen_file("epochs", 5, "\n", 0);
  ps_criteo *r = open_ok(p, 0, 2);  /* lines 0, 2, 4 */
  batch b;
  static const struct {
    ssize_t n;
    int first;
    uint64_t epoch, offset;
  } want[] = {{2, 0, 0, 2}, {1, 4, 0, 3}, {2, 0, 1, 2}, {1, 4, 1, 3}, {2, 0, 2, 2}};
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
    assert_int_equal(next(r, 2, &b, NULL), want[k].n);
    assert_int_equal(line_of(b.keys), want[k].first);
    if (want[k].n == 2)
      assert_int_equal(line_of(b.keys + NS), want[k].first + 2);
    assert_int_equal(ps_criteo_pos(r).epoch, want[k].epoch);
    assert_int_equal(ps_criteo_pos(r).offset, want[k].offset);
  }
  /* A part that batches divide: full batches, and no empty one. */
  assert_int_equal(ps_criteo_seek(r, (ps_data_pos){0, 0}, NULL), 0);
  for (int k = 0; k < 3; k++) {
    assert_int_equal(next(r, 3, &b, NULL), 3);
    assert_int_equal(ps_criteo_pos(r).epoch, (uint64_t)k);
    assert_int_equal(line_of(b.keys + 2 * NS), 4);
  }
  assert_int_equal(next(r, 0, &b, NULL), 0);
  ps_criteo_close(r);
}

/* A second reader seeked to any position the first one passed hands out
 * exactly what the first one handed out next, across epochs. */
static void test_seek(void **state) {
  (void)state;
  const char *files[2] = {gen_file("seek", 10, "\n", 0), gen_file("seek.gz", 10, "\n", 1)};
  for (int f = 0; f < 2; f++) {
    ps_criteo *a = open_ok(files[f], 1, 3);  /* lines 1, 4, 7 */
    ps_criteo *c = open_ok(files[f], 1, 3);
    batch ba, bc;
    for (int k = 0; k < 8; k++) {
      ps_data_pos pos = ps_criteo_pos(a);
      assert_true(next(a, 2, &ba, NULL) > 0);
      ps_errbuf eb = {0};
      if (ps_criteo_seek(c, pos, &eb) != 0)
        fail_msg("%s", eb.msg);
      assert_int_equal(ps_criteo_pos(c).epoch, pos.epoch);
      assert_int_equal(ps_criteo_pos(c).offset, pos.offset);
      assert_int_equal(next(c, 2, &bc, NULL), ba.n);
      assert_memory_equal(&bc, &ba, sizeof ba);
      assert_int_equal(ps_criteo_pos(c).epoch, ps_criteo_pos(a).epoch);
      assert_int_equal(ps_criteo_pos(c).offset, ps_criteo_pos(a).offset);
    }
    /* The end of an epoch: the next call starts epoch 5. */
    assert_int_equal(ps_criteo_seek(c, (ps_data_pos){4, 3}, NULL), 0);
    assert_int_equal(next(c, 1, &bc, NULL), 1);
    assert_int_equal(line_of(bc.keys), 1);
    assert_int_equal(ps_criteo_pos(c).epoch, 5);
    /* Past the part: refused, and the reader starts over. */
    ps_errbuf eb = {0};
    assert_int_equal(ps_criteo_seek(c, (ps_data_pos){2, 4}, &eb), -EINVAL);
    char want[600];
    snprintf(want, sizeof want,
             "%s: position epoch 2 offset 4 is past the 3 samples of worker 1 of 3, expected "
             "an offset <= 3",
             files[f]);
    assert_string_equal(eb.msg, want);
    assert_int_equal(ps_criteo_pos(c).epoch, 0);
    assert_int_equal(next(c, 1, &bc, NULL), 1);
    assert_int_equal(line_of(bc.keys), 1);
    ps_criteo_close(a);
    ps_criteo_close(c);
  }
}

static void test_count(void **state) {
  (void)state;
  uint64_t n = 0;
  assert_int_equal(ps_criteo_count(gen_file("count.gz", 9, "\r\n", 1), &n, NULL), 0);
  assert_int_equal(n, 9);
  assert_int_equal(ps_criteo_part_size(9, 0, 2), 5);
  assert_int_equal(ps_criteo_part_size(9, 1, 2), 4);
  assert_int_equal(ps_criteo_part_size(9, 2, 3), 3);
  assert_int_equal(ps_criteo_part_size(2, 2, 3), 0);
}

/* A worker whose part is empty says so instead of spinning. */
static void test_empty_part(void **state) {
  (void)state;
  const char *p = gen_file("one", 1, "\n", 0);
  ps_criteo *r = open_ok(p, 1, 2);
  batch b;
  ps_errbuf eb = {0};
  assert_int_equal(next(r, 4, &b, &eb), -ENODATA);
  char want[600];
  snprintf(want, sizeof want, "%s: 1 line, none of them for worker 1 of 2, expected at least 2 lines",
           p);
  assert_string_equal(eb.msg, want);
  ps_criteo_close(r);
}

/* ------------------------------------------------------------------------ */
/* Bad input                                                                */
/* ------------------------------------------------------------------------ */

/* A file of generated lines 0 and 1, then `bad` as line 3, then line 3:
 * the first two batches of one come back, the third is the error, every
 * later call the same, and the position stays after line 2. */
static void check_bad_line(const char *bad, size_t badlen, const char *want_tail) {
  char *s = malloc(badlen + 512);
  assert_non_null(s);
  size_t n = gen_line(s, 256, 0, "\n");
  n += gen_line(s + n, 256, 1, "\n");
  memcpy(s + n, bad, badlen);
  n += badlen;
  s[n++] = '\n';
  n += gen_line(s + n, 256, 3, "\n");
  const char *p = put("bad.gz", s, n, 1);
  free(s);
  char want[800];
  snprintf(want, sizeof want, "%s: line 3%s", p, want_tail);

  ps_criteo *r = open_ok(p, 0, 1);
  batch b;
  ps_errbuf eb = {0};
  assert_int_equal(next(r, 1, &b, &eb), 1);
  assert_int_equal(next(r, 1, &b, &eb), 1);
  for (int k = 0; k < 2; k++) {
    memset(&eb, 0, sizeof eb);
    assert_int_equal(next(r, 1, &b, &eb), PS_EFORMAT);
    assert_int_equal(eb.code, PS_EFORMAT);
    assert_string_equal(eb.msg, want);
    assert_null(strchr(eb.msg, '\n'));
    assert_int_equal(ps_criteo_pos(r).offset, 2);
  }
  /* A seek clears it, and reading on meets the same line again: a batch
   * that reaches it is not handed out, even its good samples. */
  assert_int_equal(ps_criteo_seek(r, (ps_data_pos){0, 1}, NULL), 0);
  assert_int_equal(next(r, 2, &b, NULL), PS_EFORMAT);
  assert_int_equal(ps_criteo_pos(r).offset, 1);
  assert_int_equal(ps_criteo_seek(r, (ps_data_pos){0, 1}, NULL), 0);
  assert_int_equal(next(r, 1, &b, NULL), 1);
  assert_gen(&b, 0, 1);
  memset(&eb, 0, sizeof eb);
  assert_int_equal(next(r, 1, &b, &eb), PS_EFORMAT);
  assert_string_equal(eb.msg, want);
  ps_criteo_close(r);

  /* The count stops at it with the same line. */
  uint64_t count = 7;
  memset(&eb, 0, sizeof eb);
  assert_int_equal(ps_criteo_count(p, &count, &eb), PS_EFORMAT);
  assert_string_equal(eb.msg, want);
  assert_int_equal(count, 0);

  /* The other worker of two does not read line 3 (index 2): each line is
   * checked by the worker whose part it is. */
  r = open_ok(p, 1, 2);
  assert_int_equal(next(r, 4, &b, NULL), 2);
  ps_criteo_close(r);
}

/* A generated line with field f (1-based) replaced by `v`. */
static size_t line_with(char *s, size_t cap, int f, const char *v) {
  size_t n = 0;
  for (int k = 1; k <= PS_CRITEO_NFIELDS; k++)
    n += (size_t)snprintf(s + n, cap - n, "%s%s", k > 1 ? "\t" : "",
                          k == f ? v : k == 1 ? "1" : k <= 14 ? "5" : "abc");
  return n;
}

#define FIELDS_WANT "expected 40 tab-separated fields (label, I1-I13, C1-C26)"

static void test_bad_field_count(void **state) {
  (void)state;
  char s[512];
  size_t n = line_with(s, sizeof s, 0, "");
  check_bad_line(s, n - 4, ": found 39 fields, " FIELDS_WANT);  /* "\tabc" off */
  memcpy(s + n, "\tx", 2);
  check_bad_line(s, n + 2, ": found more than 40 fields (a tab after C26), " FIELDS_WANT);
  check_bad_line("", 0, ": found 1 field, " FIELDS_WANT);
  check_bad_line("\r", 1, ": found 1 field, " FIELDS_WANT);
  check_bad_line("1 2 3", 5, ": found 1 field, " FIELDS_WANT);
}

static void test_bad_label(void **state) {
  (void)state;
  char s[512];
  size_t n = line_with(s, sizeof s, 1, "2");
  check_bad_line(s, n, ", field 1 (label): found \"2\", expected 0 or 1");
  n = line_with(s, sizeof s, 1, "");
  check_bad_line(s, n, ", field 1 (label): found \"\", expected 0 or 1");
  n = line_with(s, sizeof s, 1, "1.0");
  check_bad_line(s, n, ", field 1 (label): found \"1.0\", expected 0 or 1");
}

static void test_bad_integer(void **state) {
  (void)state;
  char s[512];
  static const struct {
    int field;
    const char *v, *want;
  } cases[] = {
      {5, "1x", ", field 5 (I4): found \"1x\", expected a decimal integer or nothing (missing)"},
      {2, "-", ", field 2 (I1): found \"-\", expected a decimal integer or nothing (missing)"},
      {14, " 3", ", field 14 (I13): found \" 3\", expected a decimal integer or nothing "
                 "(missing)"},
      {6, "+3", ", field 6 (I5): found \"+3\", expected a decimal integer or nothing (missing)"},
      {7, "0x1\x01", ", field 7 (I6): found \"0x1\\x01\", expected a decimal integer or "
                     "nothing (missing)"},
      {3, "9223372036854775808", ", field 3 (I2): found \"9223372036854775808\", expected an "
                                 "integer in [-9223372036854775808, 9223372036854775807]"},
      {4, "-9223372036854775809", ", field 4 (I3): found \"-9223372036854775809\", expected "
                                  "an integer in [-9223372036854775808, 9223372036854775807]"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    size_t n = line_with(s, sizeof s, cases[k].field, cases[k].v);
    check_bad_line(s, n, cases[k].want);
  }
}

/* A field over PS_CRITEO_MAX_FIELD bytes, and lines longer than the
 * reader's buffer holds for one line. */
static void test_bad_length(void **state) {
  (void)state;
  char big[300];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  char s[1024];
  size_t n = line_with(s, sizeof s, 17, big);
  check_bad_line(s, n, ", field 17 (C3): found more than 256 bytes (starting "
                       "\"aaaaaaaaaaaaaaaaaaaaaaaa\"), expected at most 256");
  /* Exactly 256 bytes is fine. */
  big[256] = '\0';
  n = line_with(s, sizeof s, 17, big);
  float label, dense[ND];
  uint64_t keys[NS];
  assert_int_equal(ps_criteo_parse_line(s, n, "f", 1, &label, dense, keys, NULL), 0);
  assert_true(keys[2] == XXH3_64bits_withSeed(big, 256, 2));

  /* 100000 bytes without a tab, and a good line with a 100000-byte C26. */
  size_t huge = 100000;
  char *h = malloc(huge + 512);
  assert_non_null(h);
  memset(h, '7', huge);
  check_bad_line(h, huge, ", field 1 (label): found more than 256 bytes (starting "
                          "\"777777777777777777777777\"), expected at most 256");
  n = line_with(h, 512, 40, "");
  memset(h + n, 'c', huge);
  check_bad_line(h, n + huge, ", field 40 (C26): found more than 256 bytes (starting "
                              "\"cccccccccccccccccccccccc\"), expected at most 256");
  free(h);
}

/* What the parser says names the file and line it was given. */
static void test_parse_error_names(void **state) {
  (void)state;
  char s[512];
  float label = 5, dense[ND] = {5};
  uint64_t keys[NS] = {5};
  ps_errbuf eb = {0};
  size_t n = line_with(s, sizeof s, 9, "x");
  assert_int_equal(ps_criteo_parse_line(s, n, "day_0.gz", 123456789012ULL, &label, dense, keys,
                                        &eb),
                   PS_EFORMAT);
  assert_string_equal(eb.msg, "day_0.gz: line 123456789012, field 9 (I8): found \"x\", expected "
                              "a decimal integer or nothing (missing)");
  /* Nothing was written. */
  assert_true(label == 5 && dense[0] == 5 && keys[0] == 5);
}

static void test_gzip_damage(void **state) {
  (void)state;
  const char *p = gen_file("damaged.gz", 50, "\n", 1);
  FILE *f = fopen(p, "rb");
  assert_non_null(f);
  char buf[8192];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  assert_true(len > 40 && len < sizeof buf);

  /* Cut short: no trailer. */
  p = put("cut.gz", buf, len - 12, 0);
  ps_criteo *r = open_ok(p, 0, 1);
  batch b;
  ps_errbuf eb = {0};
  ssize_t k;
  while ((k = next(r, 64, &b, &eb)) > 0 && ps_criteo_pos(r).epoch == 0) {
  }
  assert_int_equal(k, PS_EFORMAT);
  assert_non_null(strstr(eb.msg, "truncated gzip data: input ends after "));
  assert_non_null(strstr(eb.msg, p));
  ps_criteo_close(r);

  /* The trailer's CRC wrong. */
  buf[len - 8] ^= 0x55;
  p = put("crc.gz", buf, len, 0);
  uint64_t n = 0;
  memset(&eb, 0, sizeof eb);
  assert_int_equal(ps_criteo_count(p, &n, &eb), PS_EFORMAT);
  char want[600];
  snprintf(want, sizeof want,
           "%s: corrupt gzip data after 0 uncompressed bytes (line 1 or later), expected a "
           "valid deflate stream",
           p);
  assert_string_equal(eb.msg, want);
  /* zlib will not rewind a stream it found corrupt: a seek keeps the error. */
  r = open_ok(p, 0, 1);
  memset(&eb, 0, sizeof eb);
  assert_int_equal(next(r, 1, &b, &eb), PS_EFORMAT);
  assert_string_equal(eb.msg, want);
  memset(&eb, 0, sizeof eb);
  assert_int_equal(ps_criteo_seek(r, (ps_data_pos){0, 0}, &eb), PS_EFORMAT);
  assert_string_equal(eb.msg, want);
  assert_int_equal(next(r, 1, &b, NULL), PS_EFORMAT);
  ps_criteo_close(r);
}

static void test_open_errors(void **state) {
  (void)state;
  ps_criteo *r = (ps_criteo *)1;
  ps_errbuf eb = {0};
  char want[600];
  assert_int_equal(ps_criteo_open(&r, at("nope"), 0, 1, &eb), -ENOENT);
  assert_null(r);
  snprintf(want, sizeof want, "%s: cannot open: No such file or directory", at("nope"));
  assert_string_equal(eb.msg, want);
  assert_int_equal(ps_criteo_open(&r, tmp, 0, 1, &eb), -EISDIR);
  snprintf(want, sizeof want, "%s: cannot read: is a directory, expected a regular file", tmp);
  assert_string_equal(eb.msg, want);
  const char *p = gen_file("ok", 1, "\n", 0);
  assert_int_equal(ps_criteo_open(&r, p, 2, 2, &eb), -EINVAL);
  assert_int_equal(ps_criteo_open(&r, p, 0, 0, &eb), -EINVAL);
  assert_null(r);
  ps_criteo_close(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_exact),
      cmocka_unit_test(test_parse_missing),
      cmocka_unit_test(test_parse_crlf),
      cmocka_unit_test(test_parse_bags),
      cmocka_unit_test(test_parse_error_names),
      cmocka_unit_test_setup_teardown(test_plain_gzip_crlf, setup, teardown),
      cmocka_unit_test_setup_teardown(test_last_line_unterminated, setup, teardown),
      cmocka_unit_test_setup_teardown(test_parts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_epoch_boundary, setup, teardown),
      cmocka_unit_test_setup_teardown(test_seek, setup, teardown),
      cmocka_unit_test_setup_teardown(test_count, setup, teardown),
      cmocka_unit_test_setup_teardown(test_empty_part, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_field_count, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_label, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_integer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_length, setup, teardown),
      cmocka_unit_test_setup_teardown(test_gzip_damage, setup, teardown),
      cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
