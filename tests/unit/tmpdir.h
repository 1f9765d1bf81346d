/* A private temporary directory for a unit test's files: created in the
 * test's setup, emptied and removed in its teardown.  Include it after
 * cmocka.h: tmpdir_put asserts. */
#ifndef PS_TESTS_TMPDIR_H
#define PS_TESTS_TMPDIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char tmp[64];

/* mkdtemp /tmp/<prefix>.XXXXXX.  @return 0 or -1 (cmocka's setup rule). */
static inline int tmpdir_create(const char *prefix) {
  snprintf(tmp, sizeof tmp, "/tmp/%s.XXXXXX", prefix);
  return mkdtemp(tmp) != NULL ? 0 : -1;
}

/* Remove the files in the directory (not subdirectories) and it. */
static inline int tmpdir_remove(void) {
  DIR *d = opendir(tmp);
  if (d == NULL)
    return -1;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    snprintf(p, sizeof p, "%s/%s", tmp, e->d_name);
    unlink(p);
  }
  closedir(d);
  return rmdir(tmp);
}

/* The full path of `name` inside the directory, in a static buffer that the
 * next call overwrites: callers copy it when they need it longer. */
static inline const char *at(const char *name) {
  static char p[512];
  snprintf(p, sizeof p, "%s/%s", tmp, name);
  return p;
}

/* Write `text` to the file `name` in the directory, with `mode`. */
static inline void tmpdir_put(const char *name, const char *text, mode_t mode) {
  const char *p = at(name);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
  assert_int_equal(fclose(f), 0);
  assert_int_equal(chmod(p, mode), 0);
}

/* Write `len` bytes to the file `name` in the directory, gzipped (zlib)
 * when `gz`, else as they are. */
static inline void tmpdir_put_bytes(const char *name, const void *buf, size_t len, int gz) {
  const char *p = at(name);
  if (gz) {
    gzFile f = gzopen(p, "wb");
    assert_non_null(f);
    if (len > 0)
      assert_int_equal(gzwrite(f, buf, (unsigned)len), (int)len);
    assert_int_equal(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
  }
}

#endif
