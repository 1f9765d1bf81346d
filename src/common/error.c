/* Error descriptions and the one-line error buffer. */
#include "paramserv/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *ps_strerror(int code) {
  switch (code) {
#define PS__ERR_CASE(name, val, msg) \
  case PS_##name:                    \
    return msg;
    PS_ERRNO_MAP(PS__ERR_CASE)
#undef PS__ERR_CASE
  default:
    break;
  }
  if (code < 0 && code > -4000)
    return strerror(-code);
  return "unknown error";
}

int ps_err_set(ps_errbuf *eb, int code, const char *fmt, ...) {
  if (eb != NULL) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
    va_end(ap);
    eb->code = code;
  }
  return code;
}

int ps_errbuf_code(const ps_errbuf *eb) { return eb->code; }

const char *ps_errbuf_message(const ps_errbuf *eb) { return eb->msg; }
