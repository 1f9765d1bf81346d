/* Opening a data file through zlib (gzfile.h). */
#include "data/gzfile.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ps_gzfile_open(const char *path, gzFile *out, ps_errbuf *eb) {
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
  gzFile gz = gzdopen(fd, "rb");
  if (gz == NULL) {
    close(fd);
    return ps_err_set(eb, -ENOMEM, "%s: cannot open: out of memory", path);
  }
  gzbuffer(gz, 1 << 17);
  *out = gz;
  return 0;
}
