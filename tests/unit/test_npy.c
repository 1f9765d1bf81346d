/* Tests of the .npy reader and of npy data set loading (src/data/NPY.md):
 * valid files of each dtype and format version, written here byte by byte
 * and by numpy itself, and every refusal the spec lists. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tmpdir.h"

#include "data/npy.h"
#include "data/sampler.h"
#include "nn/model.h"
#include "nn/modelfile.h"

static int setup(void **state) {
  (void)state;
  return tmpdir_create("test_npy");
}

static int teardown(void **state) {
  (void)state;
  return tmpdir_remove();
}

/* ------------------------------------------------------------------------ */
/* Writers                                                                  */
/* ------------------------------------------------------------------------ */

/* An .npy image: magic, version major.0, the header `dict` padded with
 * spaces and a newline as numpy pads it (the whole preamble and header a
 * multiple of 64) when pad, else just the newline; then dlen bytes of
 * data.  Into a malloc'd buffer, its length in *len. */
static uint8_t *npy_image(int major, const char *dict, int pad, const void *data, size_t dlen,
                          size_t *len) {
  size_t pre = major == 1 ? 10 : 12, d = strlen(dict);
  size_t hlen = d + 1;
  if (pad)
    hlen += (64 - (pre + hlen) % 64) % 64;
  uint8_t *buf = malloc(pre + hlen + dlen + 1);
  assert_non_null(buf);
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (uint8_t)major;
  buf[7] = 0;
  for (size_t i = 0; i < pre - 8; i++)
    buf[8 + i] = (uint8_t)(hlen >> (8 * i));
  memcpy(buf + pre, dict, d);
  memset(buf + pre + d, ' ', hlen - d - 1);
  buf[pre + hlen - 1] = '\n';
  if (dlen > 0)
    memcpy(buf + pre + hlen, data, dlen);
  *len = pre + hlen + dlen;
  return buf;
}

static void put_npy(const char *name, int major, const char *dict, const void *data,
                    size_t dlen) {
  size_t len;
  uint8_t *buf = npy_image(major, dict, 1, data, dlen, &len);
  tmpdir_put_bytes(name, buf, len, 0);
  free(buf);
}

/* The good data set: 4 samples of 3 features, labels 0, 2, 1, 2. */
static const float feats[12] = {0.5f, -1.0f, 2.0f, 3.0f, 4.0f, 5.0f,
                                -6.5f, 7.0f, 1e-3f, 1e30f, -0.0f, 9.0f};
static const uint8_t labels_[4] = {0, 2, 1, 2};
#define X_DICT "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }"
#define Y_DICT "{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }"

static void put_good(void) {
  put_npy("X.npy", 1, X_DICT, feats, sizeof feats);
  put_npy("y.npy", 1, Y_DICT, labels_, sizeof labels_);
}

static void check_good(const ps_dataset *ds, int classes) {
  assert_int_equal(ds->n, 4);
  assert_int_equal(ds->dim, 3);
  assert_int_equal(ds->classes, classes);
  assert_null(ds->images);
  assert_int_equal(ds->rows, 0);
  assert_memory_equal(ds->features, feats, sizeof feats);
  assert_memory_equal(ds->labels, labels_, sizeof labels_);
}

/* The error is `code`, one line, and says each of the pieces given. */
static void check_err_v(int rc, const ps_errbuf *eb, int code, va_list ap) {
  if (rc != code || eb->code != code)
    fail_msg("code %d (eb %d), expected %d: \"%s\"", rc, eb->code, code, eb->msg);
  assert_null(strchr(eb->msg, '\n'));
  for (const char *want; (want = va_arg(ap, const char *)) != NULL;)
    if (strstr(eb->msg, want) == NULL)
      fail_msg("message \"%s\" should say \"%s\"", eb->msg, want);
}

/* Loading the temp directory fails with `code` and a message saying each
 * piece (NULL-terminated); ds is left empty. */
static void load_err(int code, ...) {
  ps_dataset ds;
  ps_errbuf eb = {0};
  int rc = ps_npy_load(tmp, &ds, &eb);
  va_list ap;
  va_start(ap, code);
  check_err_v(rc, &eb, code, ap);
  va_end(ap);
  assert_null(ds.features);
  assert_null(ds.labels);
  assert_int_equal(ds.n, 0);
}

/* Parsing an image of `dict` (numpy's padding, version `major`) and `dlen`
 * zero data bytes as `kind` fails with PS_EFORMAT saying each piece. */
static void parse_err(int major, const char *dict, size_t dlen, ps_npy_kind kind, ...) {
  uint8_t *zero = calloc(1, dlen + 1);
  size_t len;
  uint8_t *buf = npy_image(major, dict, 1, zero, dlen, &len);
  ps_npy h;
  ps_errbuf eb = {0};
  int rc = ps_npy_parse("f.npy", buf, len, len, kind, &h, &eb);
  va_list ap;
  va_start(ap, kind);
  check_err_v(rc, &eb, PS_EFORMAT, ap);
  va_end(ap);
  assert_int_equal(h.count, 0);
  assert_int_equal(h.ndim, 0);
  free(buf);
  free(zero);
}

/* The same for raw bytes, not an image npy_image makes. */
static void parse_raw_err(const void *buf, size_t len, ps_npy_kind kind, ...) {
  ps_npy h;
  ps_errbuf eb = {0};
  int rc = ps_npy_parse("f.npy", buf, len, len, kind, &h, &eb);
  va_list ap;
  va_start(ap, kind);
  check_err_v(rc, &eb, PS_EFORMAT, ap);
  va_end(ap);
}

/* ------------------------------------------------------------------------ */
/* Good input                                                               */
/* ------------------------------------------------------------------------ */

static void test_load_good(void **state) {
  (void)state;
  put_good();
  ps_dataset ds;
  ps_errbuf eb = {0};
  assert_int_equal(ps_npy_load(tmp, &ds, &eb), 0);
  check_good(&ds, 3);
  ps_dataset_close(&ds);
  assert_null(ds.features);
  ps_dataset_close(&ds); /* twice is harmless */

  /* A trailing slash on the directory does not matter. */
  char dir[128];
  snprintf(dir, sizeof dir, "%s/", tmp);
  assert_int_equal(ps_npy_load(dir, &ds, &eb), 0);
  check_good(&ds, 3);
  ps_dataset_close(&ds);
}

/* Every label dtype, in every format version. */
static void test_label_dtypes(void **state) {
  (void)state;
  put_npy("X.npy", 1, X_DICT, feats, sizeof feats);
  const int8_t i1[4] = {0, 2, 1, 2};
  const int32_t i4[4] = {0, 2, 1, 2};  /* this host's order: little-endian (checked below) */
  const int64_t i8[4] = {0, 2, 1, 2};
  const uint16_t one = 1;
  assert_int_equal(*(const uint8_t *)&one, 1);
  const struct {
    const char *descr;
    const void *data;
    size_t size;
  } cases[] = {{"|u1", labels_, sizeof labels_}, {"|i1", i1, sizeof i1},
               {"<i4", i4, sizeof i4}, {"<i8", i8, sizeof i8}};
  for (int major = 1; major <= 3; major++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      char dict[128];
      snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (4,), }",
               cases[c].descr);
      put_npy("y.npy", major, dict, cases[c].data, cases[c].size);
      ps_dataset ds;
      ps_errbuf eb = {0};
      if (ps_npy_load(tmp, &ds, &eb) != 0)
        fail_msg("version %d.0, %s: %s", major, cases[c].descr, eb.msg);
      check_good(&ds, 3);
      ps_dataset_close(&ds);
    }
}

/* X in versions 2.0 and 3.0, and of 3 and 4 dimensions: flattened per
 * sample in C order. */
static void test_feature_shapes(void **state) {
  (void)state;
  put_npy("y.npy", 1, Y_DICT, labels_, sizeof labels_);
  const char *dicts[] = {
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 1, 3), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 1, 3, 1), }",
  };
  for (int major = 1; major <= 3; major++)
    for (size_t d = 0; d < sizeof dicts / sizeof dicts[0]; d++) {
      put_npy("X.npy", major, dicts[d], feats, sizeof feats);
      ps_dataset ds;
      ps_errbuf eb = {0};
      if (ps_npy_load(tmp, &ds, &eb) != 0)
        fail_msg("version %d.0, %s: %s", major, dicts[d], eb.msg);
      check_good(&ds, 3);
      ps_dataset_close(&ds);
    }
}

/* What the grammar allows beyond numpy's own spelling: double quotes, keys
 * in any order, no spaces, no trailing commas, a trailing comma in the
 * shape, Python 2's L, no padding (and data at an offset no float is
 * aligned to). */
static void test_header_variants(void **state) {
  (void)state;
  const char *dicts[] = {
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (4, 3)}",
      "{'shape': (4, 3), 'fortran_order': False, 'descr': '<f4'}",
      "{'descr':'<f4','fortran_order':False,'shape':(4,3)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3,), }",
      "{ 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 4 , 3 ) , }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4L, 3L), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3)}",
  };
  for (size_t d = 0; d < sizeof dicts / sizeof dicts[0]; d++)
    for (int pad = 0; pad < 2; pad++) {
      size_t len;
      uint8_t *buf = npy_image(1, dicts[d], pad, feats, sizeof feats, &len);
      ps_npy h;
      ps_errbuf eb = {0};
      if (ps_npy_parse("x", buf, len, len, PS_NPY_FEATURES, &h, &eb) != 0)
        fail_msg("%s (pad %d): %s", dicts[d], pad, eb.msg);
      assert_int_equal(h.ndim, 2);
      assert_int_equal(h.shape[0], 4);
      assert_int_equal(h.shape[1], 3);
      assert_int_equal(h.count, 12);
      assert_int_equal(h.dtype, PS_NPY_F4);
      assert_int_equal(h.itemsize, 4);
      assert_int_equal(h.offset, len - sizeof feats);
      assert_true(!pad || h.offset % 64 == 0);
      float out[12];
      assert_int_equal(ps_npy_features("x", &h, buf + h.offset, out, &eb), 0);
      assert_memory_equal(out, feats, sizeof feats);
      /* Through a file too. */
      tmpdir_put_bytes("v.npy", buf, len, 0);
      void *data;
      assert_int_equal(ps_npy_read(at("v.npy"), PS_NPY_FEATURES, &h, &data, &eb), 0);
      assert_memory_equal(data, feats, sizeof feats);
      free(data);
      free(buf);
    }
}

/* Files numpy itself writes, of every dtype and in each version. */
static void test_numpy_written(void **state) {
  (void)state;
  if (system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
    fail_msg("no numpy for /usr/bin/python3: scripts/deps installs it (python3-numpy)");
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 - '%s' <<'EOF'\n"
           "import sys, numpy as np\n"
           "from numpy.lib import format as fmt\n"
           "d = sys.argv[1]\n"
           "X = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3) / 7 - 1\n"
           "y = np.array([3, 0, 255, 1, 7])\n"
           "for v in (1, 2, 3):\n"
           "    with open(f'{d}/X{v}.npy', 'wb') as f:\n"
           "        fmt.write_array(f, X, version=(v, 0))\n"
           "    for t in ('u1', 'i1', 'i4', 'i8'):\n"
           "        a = y.astype(t) if t != 'i1' else np.array([3, 0, 127, 1, 7], dtype=t)\n"
           "        with open(f'{d}/y{v}{t}.npy', 'wb') as f:\n"
           "            fmt.write_array(f, a, version=(v, 0))\n"
           "EOF",
           tmp);
  assert_int_equal(system(cmd), 0);
  for (int v = 1; v <= 3; v++) {
    char name[64];
    ps_npy h;
    ps_errbuf eb = {0};
    void *data;
    snprintf(name, sizeof name, "X%d.npy", v);
    if (ps_npy_read(at(name), PS_NPY_FEATURES, &h, &data, &eb) != 0)
      fail_msg("%s", eb.msg);
    assert_int_equal(h.major, v);
    assert_int_equal(h.ndim, 3);
    assert_int_equal(h.count, 30);
    assert_int_equal(ps_npy_features(name, &h, data, data, &eb), 0);
    for (int i = 0; i < 30; i++)
      assert_true(((float *)data)[i] == (float)i / 7 - 1);
    free(data);
    const char *types[] = {"u1", "i1", "i4", "i8"};
    for (int t = 0; t < 4; t++) {
      snprintf(name, sizeof name, "y%d%s.npy", v, types[t]);
      if (ps_npy_read(at(name), PS_NPY_LABELS, &h, &data, &eb) != 0)
        fail_msg("%s", eb.msg);
      uint8_t out[5];
      int top = -1;
      assert_int_equal(ps_npy_labels(name, &h, data, out, &top, &eb), 0);
      const uint8_t want[5] = {3, 0, t == 1 ? 127 : 255, 1, 7};
      assert_memory_equal(out, want, 5);
      assert_int_equal(top, want[2]);
      free(data);
    }
  }
}

/* The data set feeds the sampler's batches and the inputs as they are. */
static void test_inputs_and_batch(void **state) {
  (void)state;
  put_good();
  ps_dataset ds;
  ps_errbuf eb = {0};
  assert_int_equal(ps_npy_load(tmp, &ds, &eb), 0);
  float out[12];
  const size_t index[3] = {3, 0, 3};
  ps_dataset_inputs(&ds, index, 3, out);
  assert_memory_equal(out, feats + 9, 3 * sizeof(float));
  assert_memory_equal(out + 3, feats, 3 * sizeof(float));
  assert_memory_equal(out + 6, feats + 9, 3 * sizeof(float));
  /* No normalization, whatever one is asked for. */
  ps_data_norm norm = PS_DATA_NORM;
  ps_dataset_images_norm(&ds, NULL, 4, &norm, out);
  assert_memory_equal(out, feats, sizeof feats);

  ps_sampler s;
  assert_int_equal(ps_sampler_init(&s, ds.n, 0, 1, 7), 0);
  size_t idx[4];
  uint8_t y[4];
  assert_int_equal(ps_dataset_batch(&ds, &s, idx, 4, out, y), 4);
  for (int k = 0; k < 4; k++) {
    assert_memory_equal(out + 3 * k, feats + 3 * idx[k], 3 * sizeof(float));
    assert_int_equal(y[k], labels_[idx[k]]);
  }
  ps_sampler_close(&s);
  ps_dataset_close(&ds);
}

/* ------------------------------------------------------------------------ */
/* Refusals                                                                 */
/* ------------------------------------------------------------------------ */

static void test_bad_preamble(void **state) {
  (void)state;
  parse_raw_err("PK\x03\x04rest of a zip", 18, PS_NPY_FEATURES, "zip archive", "np.save", NULL);
  parse_raw_err("\x93NUMPX\x01\x00", 8, PS_NPY_FEATURES, "not an .npy file",
                "93 4e 55 4d 50 58", "\\x93NUMPY", NULL);
  parse_raw_err("%PDF", 4, PS_NPY_FEATURES, "not an .npy file", "starts with 25 50 44 46",
                NULL);
  parse_raw_err("", 0, PS_NPY_FEATURES, "truncated header", "file has 0 bytes", NULL);
  parse_raw_err("\x93NUM", 4, PS_NPY_FEATURES, "truncated header", "at least 10", NULL);
  parse_raw_err("\x93NUMPY\x01\x00\x10", 9, PS_NPY_FEATURES, "truncated header",
                "expected at least 10", NULL);
  parse_raw_err("\x93NUMPY\x02\x00\x10\x00\x00", 11, PS_NPY_FEATURES, "truncated header",
                "at least 12", NULL);
  parse_raw_err("\x93NUMPY\x04\x00\x10\x00", 10, PS_NPY_FEATURES, "format version 4.0",
                "expected 1.0, 2.0 or 3.0", NULL);
  parse_raw_err("\x93NUMPY\x01\x01\x10\x00", 10, PS_NPY_FEATURES, "format version 1.1", NULL);
  /* A header length past the file, or past the limit. */
  parse_raw_err("\x93NUMPY\x01\x00\x40\x00{'descr'", 18, PS_NPY_FEATURES,
                "truncated header: header length 64 needs 74 bytes, file has 18", NULL);
  parse_raw_err("\x93NUMPY\x02\x00\x00\x00\x02\x00", 12, PS_NPY_FEATURES,
                "header length 131072, more than the limit of 65536", NULL);
  /* A header that does not end in its newline. */
  parse_raw_err("\x93NUMPY\x01\x00\x04\x00{}  ", 14, PS_NPY_FEATURES, "ends in ' '",
                "expected a newline", NULL);
  parse_raw_err("\x93NUMPY\x01\x00\x00\x00", 10, PS_NPY_FEATURES, "ends in nothing", NULL);
}

static void test_bad_header_syntax(void **state) {
  (void)state;
  ps_npy_kind X = PS_NPY_FEATURES;
  parse_err(1, "('descr', '<f4')", 0, X, "'(' at offset 10", "expected the dict's '{' first",
            NULL);
  parse_err(1, " {'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }", 4, X,
            "' ' at offset 10", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), 'extra': 1}", 4, X,
            "key 'extra'", "expected only 'descr', 'fortran_order' and 'shape'", NULL);
  parse_err(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1, 1)}", 4,
            X, "key 'descr' twice", NULL);
  parse_err(1, "{'descr': '<f4', 'shape': (1, 1)}", 4, X, "no key 'fortran_order'", NULL);
  parse_err(1, "{}", 0, X, "no key 'descr'", NULL);
  parse_err(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", 4, X,
            "descr is a list (a structured dtype)", NULL);
  parse_err(1, "{'descr': '<f4\\n', 'fortran_order': False, 'shape': (1, 1)}", 4, X,
            "without backslashes", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': Flase, 'shape': (1, 1)}", 4, X,
            "expected False or True", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (1, 1)}", 4, X,
            "expected False or True", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (1, 1)}", 4, X,
            "expected False or True", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [1, 1]}", 4, X,
            "'[' at offset", "a tuple of dimensions", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4)}", 16, X,
            "shape (4) is not a tuple, expected (4,)", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (01, 1)}", 4, X,
            "without leading zeros", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 1)}", 4, X,
            "'-' at offset", "a dimension (a decimal integer)", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1_0, 1)}", 4, X,
            "'_' at offset", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551616, 1)}",
            4, X, "larger than 18446744073709551615", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1)} x", 4, X,
            "'x' at offset", "only spaces after the dict", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1)", 4, X,
            "header ends at offset", "inside the dict", NULL);
  parse_err(1, "{'descr': '<f4' 'fortran_order': False, 'shape': (1, 1)}", 4, X,
            "expected ',' or '}' after a value", NULL);
  parse_err(1, "{'descr' '<f4'}", 0, X, "expected ':' after the key", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1),,}", 4, X,
            "a key in quotes", NULL);
  parse_err(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), '\xc3\xa9': 1}", 4, X,
            "0xc3", "printable ASCII", NULL);
  /* More dimensions than any array has. */
  char dict[512];
  int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
  for (int i = 0; i < 33; i++)
    n += snprintf(dict + n, sizeof dict - (size_t)n, "1, ");
  snprintf(dict + n, sizeof dict - (size_t)n, ")}");
  parse_err(2, dict, 4, X, "more than 32 dimensions", NULL);
}

static void test_bad_dtype_order_shape(void **state) {
  (void)state;
  ps_npy_kind X = PS_NPY_FEATURES, Y = PS_NPY_LABELS;
  parse_err(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", 32, X,
            "f.npy: descr '<f8': expected '<f4' (float32", NULL);
  parse_err(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }", 16, X,
            "descr '>f4': expected '<f4'", NULL);
  parse_err(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2), }", 4, X,
            "descr '|u1': expected '<f4'", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 16, Y,
            "descr '<f4': expected '|u1', '|i1', '<i4' or '<i8'", NULL);
  parse_err(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }", 8, Y,
            "descr '<u2'", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, X,
            "fortran_order True: expected False", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 16, X,
            "shape (4,): expected (N, D), (N, H, W) or (N, C, H, W)", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, X, "shape ()",
            NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1), }", 4, X,
            "shape (1, 1, 1, 1, 1): expected", NULL);
  parse_err(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (4, 1), }", 4, Y,
            "shape (4, 1): expected (N,)", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 0, X,
            "shape (0, 3): dimension 1 is 0", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 0), }", 0, X,
            "dimension 2 is 0", NULL);
}

static void test_bad_data_size(void **state) {
  (void)state;
  ps_npy_kind X = PS_NPY_FEATURES;
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", 47, X,
            "truncated: shape (4, 3) of '<f4' is 48 data bytes, file has 47", NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", 50, X,
            "trailing bytes: shape (4, 3) of '<f4' is 48 data bytes, file has 50 (2 too many)",
            NULL);
  parse_err(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
            8, X, "more than 2^64 data bytes", NULL);
  parse_err(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2305843009213693952,), }", 8,
            PS_NPY_LABELS, "more than 2^64", NULL);
}

static void test_bad_values(void **state) {
  (void)state;
  /* Labels outside 0..255, of each signed dtype. */
  put_npy("X.npy", 1, X_DICT, feats, sizeof feats);
  const int8_t i1[4] = {0, 2, -1, 2};
  put_npy("y.npy", 1, "{'descr': '|i1', 'fortran_order': False, 'shape': (4,), }", i1, 4);
  load_err(PS_EFORMAT, "y.npy: label 2 is -1, expected 0..255", NULL);
  const int32_t i4[4] = {0, 256, 1, 2};
  put_npy("y.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", i4, 16);
  load_err(PS_EFORMAT, "label 1 is 256", NULL);
  const int64_t i8[4] = {0, 1, 1, INT64_MIN};
  put_npy("y.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", i8, 32);
  load_err(PS_EFORMAT, "label 3 is -9223372036854775808", NULL);

  /* Features that are not finite. */
  put_npy("y.npy", 1, Y_DICT, labels_, sizeof labels_);
  float f[12];
  memcpy(f, feats, sizeof f);
  f[7] = NAN;
  put_npy("X.npy", 1, X_DICT, f, sizeof f);
  load_err(PS_EFORMAT, "X.npy: sample 2 feature 1 is nan, expected a finite number", NULL);
  f[7] = 1;
  f[11] = -INFINITY;
  put_npy("X.npy", 1, X_DICT, f, sizeof f);
  load_err(PS_EFORMAT, "sample 3 feature 2 is -inf", NULL);
}

static void test_bad_set(void **state) {
  (void)state;
  /* Counts that differ. */
  put_npy("X.npy", 1, X_DICT, feats, sizeof feats);
  put_npy("y.npy", 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", labels_, 3);
  load_err(PS_ESHAPE, "X.npy has 4 samples (shape (4, 3)) but ", "y.npy has 3 labels (shape (3,))",
           "expected the same count", NULL);
  /* Files of the wrong kind: each names its file. */
  put_npy("y.npy", 1, X_DICT, feats, sizeof feats);
  load_err(PS_EFORMAT, "y.npy: descr '<f4'", NULL);
  put_npy("X.npy", 1, Y_DICT, labels_, sizeof labels_);
  load_err(PS_EFORMAT, "X.npy: descr '|u1'", NULL);
  /* A file missing, or a directory in its place. */
  unlink(at("X.npy"));
  load_err(-ENOENT, "X.npy: cannot open: No such file or directory", NULL);
  assert_int_equal(mkdir(at("X.npy"), 0700), 0);
  load_err(-EISDIR, "X.npy: cannot read: is a directory", NULL);
  assert_int_equal(rmdir(at("X.npy")), 0);

  /* The directory missing, or a file. */
  ps_dataset ds;
  ps_errbuf eb = {0};
  char missing[128];
  snprintf(missing, sizeof missing, "%s/none", tmp);
  assert_int_equal(ps_npy_load(missing, &ds, &eb), -ENOENT);
  assert_non_null(strstr(eb.msg, "none: cannot open data set directory"));
  assert_int_equal(ps_npy_load(at("y.npy"), &ds, &eb), -ENOTDIR);
  assert_non_null(strstr(eb.msg, "not a directory, expected a directory holding X.npy and y.npy"));
  assert_int_equal(ps_npy_load("", &ds, &eb), -EINVAL);
}

/* ------------------------------------------------------------------------ */
/* The model's check of the data                                            */
/* ------------------------------------------------------------------------ */

static void build(const char *text, ps_model *m) {
  ps_model_spec spec;
  ps_errbuf eb = {0};
  if (ps_modelfile_parse(text, strlen(text), "m.json", &spec, &eb) != 0 ||
      ps_model_build(&spec, m, &eb) != 0)
    fail_msg("%s", eb.msg);
}

static void test_model_check_inputs(void **state) {
  (void)state;
  ps_model m;
  ps_errbuf eb = {0};
  build("{\"input\": [20], \"layers\": [{\"type\": \"dense\", \"name\": \"fc\", \"out\": 3}, "
        "{\"type\": \"log_softmax\"}]}", &m);
  assert_int_equal(ps_model_check_inputs(&m, 20, 3, &eb), 0);
  assert_int_equal(ps_model_check_inputs(&m, 20, 1, &eb), 0);
  assert_int_equal(ps_model_check_inputs(&m, 21, 3, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "takes 20 inputs (input 20x1x1): expected 21"));
  assert_int_equal(ps_model_check_inputs(&m, 20, 4, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "has 3 classes: expected at least 4"));
  ps_model_close(&m);
  build("{\"input\": [2, 2, 5], \"layers\": [{\"type\": \"dense\", \"name\": \"fc\", \"out\": 1}, "
        "{\"type\": \"sigmoid\"}]}", &m);
  assert_int_equal(ps_model_check_inputs(&m, 20, 2, &eb), 0);
  assert_int_equal(ps_model_check_inputs(&m, 20, 3, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "one output (sigmoid): expected labels 0 and 1"));
  ps_model_close(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_load_good, setup, teardown),
      cmocka_unit_test_setup_teardown(test_label_dtypes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_feature_shapes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_header_variants, setup, teardown),
      cmocka_unit_test_setup_teardown(test_numpy_written, setup, teardown),
      cmocka_unit_test_setup_teardown(test_inputs_and_batch, setup, teardown),
      cmocka_unit_test(test_bad_preamble),
      cmocka_unit_test(test_bad_header_syntax),
      cmocka_unit_test(test_bad_dtype_order_shape),
      cmocka_unit_test(test_bad_data_size),
      cmocka_unit_test_setup_teardown(test_bad_values, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_set, setup, teardown),
      cmocka_unit_test(test_model_check_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
