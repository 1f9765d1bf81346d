/* Opening a data file for reading through zlib, plain or gzip alike: the
 * one way the readers (idx.c, criteo.c) open their files. */
#ifndef PS_DATA_GZFILE_H
#define PS_DATA_GZFILE_H

#include <zlib.h>

#include "paramserv/error.h"

/* Open `path`, a regular file (a directory or a pipe is refused: the
 * readers read a file whole, or again each epoch), for gzread with a 128 KiB
 * buffer.  @return 0 and *out, or -errno with a one-line message naming the
 * path (cannot open, cannot stat, not a regular file, out of memory). */
int ps_gzfile_open(const char *path, gzFile *out, ps_errbuf *eb);

/* ps_gzfile_open, and in *size_hint what the file should hold once read:
 * a plain file's size, or a gzip file's trailer (ISIZE: its uncompressed
 * size mod 2^32), bounded by deflate's best ratio (1032:1) over the
 * compressed bytes; 0 when nothing is known.  A hint only: a reader
 * allocates by it and must still grow past it (several gzip members, a
 * lying trailer) or find less. */
int ps_gzfile_open_sized(const char *path, gzFile *out, size_t *size_hint, ps_errbuf *eb);

#endif
