/* The version of the paramserv client library.  MAJOR is the number of its
 * ABI: the soname is libparamserv.so.MAJOR (the file
 * libparamserv.so.MAJOR.MINOR.PATCH), and paramserv.pc's Version is
 * MAJOR.MINOR.PATCH; the Makefile reads all three from here.  MAJOR grows
 * when a change breaks the ABI (a program built against an older header
 * would misbehave with the newer library), MINOR when one adds to the API,
 * PATCH for a change that does neither. */
#ifndef PARAMSERV_VERSION_H
#define PARAMSERV_VERSION_H

#include "paramserv/error.h"

#define PARAMSERV_VERSION_MAJOR 2
#define PARAMSERV_VERSION_MINOR 0
#define PARAMSERV_VERSION_PATCH 0

/* One number to compare at compile time:
 * #if PARAMSERV_VERSION_NUMBER >= PARAMSERV_VERSION_ENCODE(2, 0, 0) */
#define PARAMSERV_VERSION_ENCODE(major, minor, patch) \
  ((major) * 1000000L + (minor) * 1000L + (patch))
#define PARAMSERV_VERSION_NUMBER                                            \
  PARAMSERV_VERSION_ENCODE(PARAMSERV_VERSION_MAJOR, PARAMSERV_VERSION_MINOR, \
                           PARAMSERV_VERSION_PATCH)

/* The version of the library the program runs with (which may be newer
 * than the header it was built with), as "MAJOR.MINOR.PATCH"; *major,
 * *minor and *patch (each when not NULL) get its numbers. */
PS_API const char *ps_version(int *major, int *minor, int *patch);

#endif
