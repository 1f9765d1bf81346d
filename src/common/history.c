/* A process's history for checkers (see history.h). */
#include "common/history.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

struct ps_history {
  int fd;
};

ps_history *ps_history_open(const ps_config *cfg, const char *role, int index) {
  if (cfg->history_dir[0] == '\0')
    return NULL;
  char path[PS_CONFIG_PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s-%d.history", cfg->history_dir, role, index);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    ps_log(PS_LOG_WARN, "%s: cannot open the history file: %s; no history kept", path,
           strerror(errno));
    return NULL;
  }
  ps_history *h = malloc(sizeof *h);
  if (h == NULL) {
    close(fd);
    return NULL;
  }
  h->fd = fd;
  return h;
}

void ps_history_line(ps_history *h, const char *fmt, ...) {
  if (h == NULL)
    return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  if (n > (int)sizeof line - 2)
    n = (int)sizeof line - 2;
  line[n++] = '\n';
  /* O_APPEND: one write is one whole line, even with several writers. */
  if (write(h->fd, line, (size_t)n) != n)
    ps_log(PS_LOG_WARN, "history: write failed: %s", strerror(errno));
}

void ps_history_close(ps_history *h) {
  if (h == NULL)
    return;
  close(h->fd);
  free(h);
}
