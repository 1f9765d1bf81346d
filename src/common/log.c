/* Leveled logging to stderr. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int ps__log_level = PS_LOG_INFO;
static char log_tag[32] = "paramserv";

void ps_log_init(const char *tag, int level) {
  if (tag != NULL)
    snprintf(log_tag, sizeof log_tag, "%s", tag);
  ps__log_level = level;
}

int ps_log_level_parse(const char *s) {
  static const char *names[] = {"debug", "info", "warn", "error"};
  for (int i = 0; i < 4; i++)
    if (strcmp(s, names[i]) == 0)
      return i;
  return -1;
}

void ps__log(int level, const char *fmt, ...) {
  static const char *names[] = {"debug", "info", "warn", "error"};
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  /* One fprintf per line so that lines from several threads never interleave. */
  fprintf(stderr, "%s: %s: %s\n", log_tag, names[level & 3], line);
}
