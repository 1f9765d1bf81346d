/* Tests of IDX reading and data set loading, on small files each test writes itself. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "tmpdir.h"

#include "data/idx.h"

/* ------------------------------------------------------------------------ */
/* Fixtures: a fresh temp directory per test, and writers of IDX files      */
/* ------------------------------------------------------------------------ */

static int setup(void **state) {
  (void)state;
  return tmpdir_create("test_idx");
}

static int teardown(void **state) {
  (void)state;
  return tmpdir_remove();
}


/* Writes an IDX file: `magic`, `ndim` dims, then `dlen` bytes of `data`. */
static void put_idx(const char *name, int gz, uint32_t magic, const uint32_t *dims, int ndim,
                    const uint8_t *data, size_t dlen) {
  size_t hdr = 4 + 4 * (size_t)ndim;
  uint8_t *buf = malloc(hdr + dlen + 1);
  assert_non_null(buf);
  for (int i = 0; i <= ndim; i++) {
    uint32_t v = i == 0 ? magic : dims[i - 1];
    buf[4 * i] = (uint8_t)(v >> 24);
    buf[4 * i + 1] = (uint8_t)(v >> 16);
    buf[4 * i + 2] = (uint8_t)(v >> 8);
    buf[4 * i + 3] = (uint8_t)v;
  }
  if (dlen > 0)
    memcpy(buf + hdr, data, dlen);
  tmpdir_put_bytes(name, buf, hdr + dlen, gz);
  free(buf);
}

/* The good data set: 3 images of 2 x 4 and labels 0, 9, 5. */
static const uint8_t images[24] = {0,  1,  2,  3,  4,  5,  6,   7,   8,   9,   10,  11,
                                   12, 13, 14, 15, 16, 17, 255, 254, 128, 127, 100, 0};
static const uint8_t labels[3] = {0, 9, 5};
static const uint32_t img_dims[3] = {3, 2, 4};
static const uint32_t lab_dims[1] = {3};

static void put_images(int gz) {
  put_idx(gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte", gz, 0x803, img_dims,
          3, images, sizeof images);
}

static void put_labels(int gz) {
  put_idx(gz ? "train-labels-idx1-ubyte.gz" : "train-labels-idx1-ubyte", gz, 0x801, lab_dims,
          1, labels, sizeof labels);
}

/* The error is `code`, one line, and names `path` and `what`. */
static void check_err(int rc, const ps_errbuf *eb, int code, const char *path,
                      const char *what) {
  assert_int_equal(rc, code);
  assert_int_equal(eb->code, code);
  assert_null(strchr(eb->msg, '\n'));
  if (strstr(eb->msg, path) == NULL || strstr(eb->msg, what) == NULL)
    fail_msg("message \"%s\" should name \"%s\" and say \"%s\"", eb->msg, path, what);
}

/* Loads split train from the temp directory and expects an error. */
static void check_load_err(int code, const char *path, const char *what) {
  ps_dataset ds;
  ps_errbuf eb = {0};
  int rc = ps_dataset_load(tmp, "train", &ds, &eb);
  check_err(rc, &eb, code, path, what);
  assert_null(ds.images);
  assert_null(ds.labels);
  assert_int_equal(ds.n, 0);
}

/* ------------------------------------------------------------------------ */
/* Good input                                                               */
/* ------------------------------------------------------------------------ */

static void check_good(const ps_dataset *ds) {
  assert_int_equal(ds->n, 3);
  assert_int_equal(ds->rows, 2);
  assert_int_equal(ds->cols, 4);
  assert_memory_equal(ds->images, images, sizeof images);
  assert_memory_equal(ds->labels, labels, sizeof labels);
}

static void test_load_plain(void **state) {
  (void)state;
  put_images(0);
  put_labels(0);
  ps_dataset ds;
  ps_errbuf eb = {0};
  assert_int_equal(ps_dataset_load(tmp, "train", &ds, &eb), 0);
  check_good(&ds);
  ps_dataset_close(&ds);
  assert_null(ds.images);
  ps_dataset_close(&ds); /* closing twice is harmless */
  ps_dataset_close(NULL);
}

static void test_load_gz(void **state) {
  (void)state;
  put_images(1);
  put_labels(1);
  ps_dataset ds;
  ps_errbuf eb = {0};
  /* A trailing slash on the directory must not matter. */
  char dir[80];
  snprintf(dir, sizeof dir, "%s/", tmp);
  assert_int_equal(ps_dataset_load(dir, "train", &ds, &eb), 0);
  check_good(&ds);
  ps_dataset_close(&ds);
}

static void test_load_mixed_prefers_plain(void **state) {
  (void)state;
  put_images(1);
  put_labels(1);
  /* A plain labels file beside the .gz one, with a different value. */
  const uint8_t other[3] = {1, 2, 3};
  put_idx("train-labels-idx1-ubyte", 0, 0x801, lab_dims, 1, other, 3);
  ps_dataset ds;
  ps_errbuf eb = {0};
  assert_int_equal(ps_dataset_load(tmp, "train", &ds, &eb), 0);
  assert_memory_equal(ds.labels, other, 3);
  assert_memory_equal(ds.images, images, sizeof images);
  ps_dataset_close(&ds);
}

static void test_idx_read_and_parse(void **state) {
  (void)state;
  put_labels(1);
  ps_idx idx;
  ps_errbuf eb = {0};
  assert_int_equal(ps_idx_read(at("train-labels-idx1-ubyte.gz"), 1, &idx, &eb), 0);
  assert_int_equal(idx.ndim, 1);
  assert_int_equal(idx.dims[0], 3);
  assert_memory_equal(idx.data, labels, 3);
  ps_idx_close(&idx);
  ps_idx_close(NULL);

  const uint8_t one[] = {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 1, 42, 43};
  assert_int_equal(ps_idx_parse("mem", one, sizeof one, 2, &idx, &eb), 0);
  assert_int_equal(idx.dims[0], 2);
  assert_int_equal(idx.dims[1], 1);
  assert_int_equal(idx.data[1], 43);
  ps_idx_close(&idx);

  /* A NULL errbuf is allowed: only the code comes back. */
  assert_int_equal(ps_idx_parse("mem", one, 3, 2, &idx, NULL), PS_EFORMAT);
  assert_int_equal(ps_idx_parse("mem", one, sizeof one, 4, &idx, &eb), -EINVAL);
  assert_int_equal(ps_idx_parse("mem", one, sizeof one, 0, &idx, &eb), -EINVAL);
}

/* The reader sizes its buffer by the gzip trailer, which names only the
 * last member's size: a file of two members (gzip -c a >f; gzip -c b >>f)
 * holds more than it announces, and reads whole all the same. */
static void test_gzip_members(void **state) {
  (void)state;
  enum { N = 3000 };
  static uint8_t file[12 + N];
  const uint8_t head[12] = {0, 0, 8, 1, 0, 0, (uint8_t)(N >> 8), (uint8_t)N};
  memcpy(file, head, 8);
  for (int i = 0; i < N; i++)
    file[8 + i] = (uint8_t)(i * 7);
  const char *p = at("two.gz");
  for (int m = 0; m < 2; m++) {
    gzFile gz = gzopen(p, m == 0 ? "wb" : "ab");
    assert_non_null(gz);
    size_t from = m == 0 ? 0 : 1000, to = m == 0 ? 1000 : 8 + N;
    assert_int_equal(gzwrite(gz, file + from, (unsigned)(to - from)), (int)(to - from));
    assert_int_equal(gzclose(gz), Z_OK);
  }
  ps_idx idx;
  ps_errbuf eb = {0};
  assert_int_equal(ps_idx_read(p, 1, &idx, &eb), 0);
  assert_int_equal(idx.dims[0], N);
  assert_memory_equal(idx.data, file + 8, N);
  ps_idx_close(&idx);
  /* A plain file, sized by its length. */
  tmpdir_put_bytes("plain", file, 8 + N, 0);
  assert_int_equal(ps_idx_read(at("plain"), 1, &idx, &eb), 0);
  assert_memory_equal(idx.data, file + 8, N);
  ps_idx_close(&idx);
}

/* ------------------------------------------------------------------------ */
/* Bad input: each gives its code and a one-line message naming the file   */
/* ------------------------------------------------------------------------ */

static void test_bad_magic(void **state) {
  (void)state;
  put_idx("train-images-idx3-ubyte.gz", 1, 0x12345678, img_dims, 3, images, sizeof images);
  put_labels(1);
  char p[512];
  snprintf(p, sizeof p, "%s", at("train-images-idx3-ubyte.gz"));
  check_load_err(PS_EFORMAT, p, "bad magic 0x12345678, expected 0x00000803");

  /* A right-looking magic with another data type (float32). */
  put_idx("train-images-idx3-ubyte.gz", 1, 0xD03, img_dims, 3, images, sizeof images);
  check_load_err(PS_EFORMAT, p, "data type 0x0d (float32)");
}

static void test_count_mismatch(void **state) {
  (void)state;
  put_images(0);
  const uint32_t two[1] = {2};
  put_idx("train-labels-idx1-ubyte", 0, 0x801, two, 1, labels, 2);
  char p[512];
  snprintf(p, sizeof p, "%s", at("train-images-idx3-ubyte"));
  check_load_err(PS_ESHAPE, p, "has 3 images");
  check_load_err(PS_ESHAPE, at("train-labels-idx1-ubyte"), "has 2 labels");
}

static void test_wrong_dims(void **state) {
  (void)state;
  /* Images with 2 dimensions (3 x 8). */
  const uint32_t d2[2] = {3, 8};
  put_idx("train-images-idx3-ubyte", 0, 0x802, d2, 2, images, sizeof images);
  put_labels(0);
  char p[512];
  snprintf(p, sizeof p, "%s", at("train-images-idx3-ubyte"));
  check_load_err(PS_EFORMAT, p, "says 2 dimensions, expected 3");

  /* Labels with 3 dimensions. */
  put_images(0);
  put_idx("train-labels-idx1-ubyte", 0, 0x803, img_dims, 3, images, sizeof images);
  snprintf(p, sizeof p, "%s", at("train-labels-idx1-ubyte"));
  check_load_err(PS_EFORMAT, p, "says 3 dimensions, expected 1");

  /* A zero dimension. */
  const uint32_t d0[3] = {3, 0, 4};
  put_idx("train-images-idx3-ubyte", 0, 0x803, d0, 3, NULL, 0);
  put_labels(0);
  snprintf(p, sizeof p, "%s", at("train-images-idx3-ubyte"));
  check_load_err(PS_EFORMAT, p, "dimension 2 is 0");
}

static void test_too_large(void **state) {
  (void)state;
  ps_idx idx;
  ps_errbuf eb = {0};
  /* 65536 x 65536 x 1 = 4 GiB, and 2^32-1 cubed overflows 64 bits. */
  const uint8_t big[] = {0, 0, 8, 3, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1};
  check_err(ps_idx_parse("big", big, sizeof big, 3, &idx, &eb), &eb, PS_EFORMAT, "big",
            "more than the limit");
  const uint8_t huge[] = {0, 0, 8, 3, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255};
  check_err(ps_idx_parse("huge", huge, sizeof huge, 3, &idx, &eb), &eb, PS_EFORMAT, "huge",
            "more than the limit");
  assert_null(idx.data);
}

static void test_truncated_data(void **state) {
  (void)state;
  put_idx("train-images-idx3-ubyte", 0, 0x803, img_dims, 3, images, 20);
  put_labels(0);
  char p[512];
  snprintf(p, sizeof p, "%s", at("train-images-idx3-ubyte"));
  check_load_err(PS_EFORMAT, p, "truncated: header says 3 x 2 x 4 = 24 data bytes, file has 20");
}

static void test_truncated_header(void **state) {
  (void)state;
  /* Magic and one of three dimensions. */
  const uint8_t h[] = {0, 0, 8, 3, 0, 0, 0, 3};
  tmpdir_put_bytes("train-images-idx3-ubyte", h, sizeof h, 0);
  put_labels(0);
  char p[512];
  snprintf(p, sizeof p, "%s", at("train-images-idx3-ubyte"));
  check_load_err(PS_EFORMAT, p, "truncated header: file has 8 bytes, expected 16");

  /* Not even a whole magic; an empty gzipped file. */
  tmpdir_put_bytes("train-images-idx3-ubyte", h, 2, 0);
  check_load_err(PS_EFORMAT, p, "truncated header: file has 2 bytes");
  unlink(p);
  tmpdir_put_bytes("train-images-idx3-ubyte.gz", h, 0, 1);
  check_load_err(PS_EFORMAT, at("train-images-idx3-ubyte.gz"), "file has 0 bytes");
}

static void test_trailing_bytes(void **state) {
  (void)state;
  put_images(0);
  uint8_t lab4[4] = {0, 9, 5, 7};
  put_idx("train-labels-idx1-ubyte", 0, 0x801, lab_dims, 1, lab4, 4);
  check_load_err(PS_EFORMAT, at("train-labels-idx1-ubyte"), "trailing bytes: header says 3 = 3 data bytes, file has 4 (1 too many)");
}

static void test_label_out_of_range(void **state) {
  (void)state;
  put_images(1);
  const uint8_t bad[3] = {0, 10, 5};
  put_idx("train-labels-idx1-ubyte.gz", 1, 0x801, lab_dims, 1, bad, 3);
  check_load_err(PS_EFORMAT, at("train-labels-idx1-ubyte.gz"), "label 1 is 10, expected 0..9");
}

static void test_missing_path(void **state) {
  (void)state;
  ps_idx idx;
  ps_errbuf eb = {0};
  char p[512];
  snprintf(p, sizeof p, "%s", at("nothing-here"));
  check_err(ps_idx_read(p, 1, &idx, &eb), &eb, -ENOENT, p,
            "cannot open: No such file or directory");
  assert_null(idx.data);

  /* A directory where a file should be. */
  check_err(ps_idx_read(tmp, 1, &idx, &eb), &eb, -EISDIR, tmp, "is a directory");

  /* A split without its images file names the .gz and the plain path. */
  put_labels(0);
  snprintf(p, sizeof p, "%s", at("train-images-idx3-ubyte.gz"));
  check_load_err(-ENOENT, p, "neither ");
  check_load_err(-ENOENT, at("train-images-idx3-ubyte exists"), "expected one of them");
}

static void test_missing_dir(void **state) {
  (void)state;
  char p[512];
  snprintf(p, sizeof p, "%s", at("no-such-dir"));
  ps_dataset ds;
  ps_errbuf eb = {0};
  check_err(ps_dataset_load(p, "train", &ds, &eb), &eb, -ENOENT, p,
            "cannot open data set directory: No such file or directory");

  /* A file given as the directory. */
  put_labels(0);
  snprintf(p, sizeof p, "%s", at("train-labels-idx1-ubyte"));
  check_err(ps_dataset_load(p, "train", &ds, &eb), &eb, -ENOTDIR, p, "not a directory");
}

static void test_bad_gzip(void **state) {
  (void)state;
  /* A good .gz cut short: zlib sees the end of input mid-stream. */
  put_images(1);
  put_labels(0);
  const char *p = at("train-images-idx3-ubyte.gz");
  uint8_t buf[256];
  FILE *f = fopen(p, "rb");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  assert_true(n > 20);
  tmpdir_put_bytes("train-images-idx3-ubyte.gz", buf, n - 12, 0);
  char path[512];
  snprintf(path, sizeof path, "%s", p);
  check_load_err(PS_EFORMAT, path, "truncated gzip data");

  /* A gzip header followed by garbage. */
  const uint8_t junk[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  tmpdir_put_bytes("train-images-idx3-ubyte.gz", junk, sizeof junk, 0);
  check_load_err(PS_EFORMAT, path, "corrupt gzip data");
}

/* ------------------------------------------------------------------------ */
/* Conversion to floats                                                     */
/* ------------------------------------------------------------------------ */

static void test_images_f32(void **state) {
  (void)state;
  /* 5 x 7 = 35 pixels: two vector blocks of 16 and a tail of 3. */
  enum { N = 4, PX = 35 };
  uint8_t img[N * PX];
  for (int i = 0; i < N * PX; i++)
    img[i] = (uint8_t)(i * 37 + 11);
  img[0] = 0;
  img[1] = 255;
  ps_dataset ds = {.n = N, .rows = 5, .cols = 7, .images = img, .labels = NULL};
  const float mean = 0.2860f, std = 0.3530f;
  float out[N * PX];

  const size_t index[3] = {2, 0, 2};
  ps_dataset_images_f32(&ds, index, 3, mean, std, out);
  for (int k = 0; k < 3; k++)
    for (int j = 0; j < PX; j++) {
      double want = ((double)img[index[k] * PX + (size_t)j] / 255.0 - mean) / std;
      assert_float_equal(out[k * PX + j], want, 1e-5);
    }
  assert_float_equal(out[PX], -mean / std, 1e-6);
  assert_float_equal(out[PX + 1], (1.0 - mean) / std, 1e-6);

  /* NULL index: the first `count` images in order. */
  ps_dataset_images_f32(&ds, NULL, N, 0.0f, 1.0f, out);
  for (int i = 0; i < N * PX; i++)
    assert_float_equal(out[i], img[i] / 255.0, 1e-6);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_load_plain, setup, teardown),
      cmocka_unit_test_setup_teardown(test_load_gz, setup, teardown),
      cmocka_unit_test_setup_teardown(test_load_mixed_prefers_plain, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idx_read_and_parse, setup, teardown),
      cmocka_unit_test_setup_teardown(test_gzip_members, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_magic, setup, teardown),
      cmocka_unit_test_setup_teardown(test_count_mismatch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_wrong_dims, setup, teardown),
      cmocka_unit_test_setup_teardown(test_too_large, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated_data, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated_header, setup, teardown),
      cmocka_unit_test_setup_teardown(test_trailing_bytes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_label_out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing_path, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing_dir, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_gzip, setup, teardown),
      cmocka_unit_test(test_images_f32),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
