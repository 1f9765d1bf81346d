/* Error codes shared by every paramserv module, and the buffer that carries a one-line message. */
#ifndef PARAMSERV_ERROR_H
#define PARAMSERV_ERROR_H

#include <stddef.h>

/* Marks the functions of the public API (include/paramserv/): the only
 * symbols libparamserv.so exports, as it is built with -fvisibility=hidden.
 * Every function declared in these headers carries it. */
#define PS_API __attribute__((visibility("default")))

/* The project's own codes.  Functions return 0 or a negative number: either
 * -errno from the C library or one of these, all far below any errno value. */
#define PS_ERRNO_MAP(X)                                                   \
  X(EFORMAT,  -4001, "malformed input")                                   \
  X(ECORRUPT, -4002, "data failed an integrity check")                    \
  X(EVERSION, -4003, "unsupported format version")                        \
  X(ELAYOUT,  -4004, "layout does not match")                             \
  X(ECONFIG,  -4005, "invalid configuration")                             \
  X(EUSAGE,   -4006, "invalid command-line usage")                        \
  X(ESHAPE,   -4007, "shape mismatch")                                    \
  X(ENAN,     -4008, "non-finite value")                                  \
  X(ESTOPPED, -4009, "the run was ended by the chief")                    \
  X(EFENCED,  -4010, "fenced out: a newer lease holder acts")

enum {
#define PS__ERR_ENUM(name, val, msg) PS_##name = val,
  PS_ERRNO_MAP(PS__ERR_ENUM)
#undef PS__ERR_ENUM
};

/* A short, static description of `code` (a PS_E* value or a -errno).
 * Never NULL; the string lives for the whole program. */
PS_API const char *ps_strerror(int code);

/* A one-line error for the user: names the thing, what was found and what was
 * expected.  A function that can fail before there is an object to ask
 * (ps_client_new) fills one in and returns its code.  Declare it zeroed
 * (`ps_errbuf eb = {0};`) and read it with ps_errbuf_code and
 * ps_errbuf_message: its members are the library's, and only its size is
 * part of the ABI. */
typedef struct ps_errbuf {
  int code;
  char msg[512];
} ps_errbuf;

/* The code of the error held (0: none). */
PS_API int ps_errbuf_code(const ps_errbuf *eb);

/* The message held: one line, no newline, "" when none; valid while *eb
 * is. */
PS_API const char *ps_errbuf_message(const ps_errbuf *eb);

/* Format `fmt` into eb->msg (when eb is not NULL), store `code` and return it,
 * so that a parser can write `return ps_err_set(eb, PS_EFORMAT, "...", ...);`. */
PS_API int ps_err_set(ps_errbuf *eb, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
