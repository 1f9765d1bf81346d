/* Opening a data file through zlib (gzfile.h). */
#include "data/gzfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The uncompressed size a file of `size` bytes at fd announces. */
static size_t size_hint_of(int fd, off_t size) {
  unsigned char head[2], tail[4];
  if (size < 18 || pread(fd, head, 2, 0) != 2 || head[0] != 0x1f || head[1] != 0x8b)
    return (size_t)size;
  if (pread(fd, tail, 4, size - 4) != 4)
    return 0;
  uint64_t isize = (uint64_t)tail[0] | (uint64_t)tail[1] << 8 | (uint64_t)tail[2] << 16 |
                   (uint64_t)tail[3] << 24;
  uint64_t most = (uint64_t)size * 1032;
  return (size_t)(isize < most ? isize : most);
}

int ps_gzfile_open(const char *path, gzFile *out, ps_errbuf *eb) {
  return ps_gzfile_open_sized(path, out, NULL, eb);
}

int ps_gzfile_open_sized(const char *path, gzFile *out, size_t *size_hint, ps_errbuf *eb) {
  *out = NULL;
  /* Opened here rather than by gzopen so that errno is ours to report and
   * a directory is refused before zlib tries to read it. */
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return ps_err_set(eb, -e, "%s: cannot open: %s", path, strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return ps_err_set(eb, -e, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    int dir = S_ISDIR(st.st_mode);
    close(fd);
    return ps_err_set(eb, dir ? -EISDIR : -EINVAL, "%s: cannot read: %s, expected a regular file",
                      path, dir ? "is a directory" : "not a regular file");
  }
  if (size_hint != NULL)
    *size_hint = size_hint_of(fd, st.st_size);
  gzFile gz = gzdopen(fd, "rb");
  if (gz == NULL) {
    close(fd);
    return ps_err_set(eb, -ENOMEM, "%s: cannot open: out of memory", path);
  }
  gzbuffer(gz, 1 << 17);
  *out = gz;
  return 0;
}
