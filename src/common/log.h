/* Leveled logging to stderr, one line per event (journald keeps them under systemd). */
#ifndef PS_COMMON_LOG_H
#define PS_COMMON_LOG_H

enum { PS_LOG_DEBUG = 0, PS_LOG_INFO = 1, PS_LOG_WARN = 2, PS_LOG_ERROR = 3 };

extern int ps__log_level;

/* Set the process's tag (e.g. "ps.1") and the lowest level that is printed. */
void ps_log_init(const char *tag, int level);

/* Parse "debug|info|warn|error"; returns the level or -1. */
int ps_log_level_parse(const char *s);

void ps__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Formatting is skipped entirely below the configured level. */
#define ps_log(level, ...)                 \
  do {                                     \
    if ((level) >= ps__log_level)          \
      ps__log((level), __VA_ARGS__);       \
  } while (0)

#endif
