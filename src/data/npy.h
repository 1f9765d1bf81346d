/* numpy .npy files (format versions 1.0, 2.0 and 3.0), read strictly, and
 * a data set of the user's own (X.npy: float32 features, y.npy: class
 * labels) loaded from a directory.  Spec: src/data/NPY.md. */
#ifndef PS_DATA_NPY_H
#define PS_DATA_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "data/idx.h"
#include "paramserv/error.h"

/* The longest header read (v1's is at most 65535 bytes by its format; a v2
 * or v3 header claiming more is refused): numpy writes under 200 bytes for
 * the shapes accepted here. */
#define PS_NPY_MAX_HEADER 65536
/* The bytes before the header: magic (6), version (2), header length (2 or 4). */
#define PS_NPY_MAX_PREAMBLE 12
/* The most dimensions a shape may list (numpy's own limit before 2.0). */
#define PS_NPY_MAX_DIMS 32

/* What a file holds, which decides the dtypes and shapes accepted. */
typedef enum ps_npy_kind {
  PS_NPY_FEATURES = 0,  /* X: '<f4', shape (N, D), (N, H, W) or (N, C, H, W) */
  PS_NPY_LABELS,        /* y: '|u1', '|i1', '<i4' or '<i8', shape (N,) */
} ps_npy_kind;

/* The dtypes accepted, by their numpy descr. */
typedef enum ps_npy_dtype {
  PS_NPY_F4 = 0,  /* '<f4': float32, little-endian */
  PS_NPY_U1,      /* '|u1': uint8 */
  PS_NPY_I1,      /* '|i1': int8 */
  PS_NPY_I4,      /* '<i4': int32, little-endian */
  PS_NPY_I8,      /* '<i8': int64, little-endian */
} ps_npy_dtype;

/* A parsed header.  The data is the file's bytes [offset, offset + count *
 * itemsize), C order (last dimension fastest), and nothing follows it. */
typedef struct ps_npy {
  int major, minor;                   /* format version: 1.0, 2.0 or 3.0 */
  ps_npy_dtype dtype;
  size_t itemsize;                    /* bytes an element: 4, 1, 1, 4, 8 */
  int ndim;
  uint64_t shape[PS_NPY_MAX_DIMS];    /* each > 0 */
  uint64_t count;                     /* elements: the product of shape */
  size_t offset;                      /* bytes before the data */
} ps_npy;

/* Parse the header of a .npy file of file_size bytes whose first len bytes
 * (len <= file_size; the whole file or at least PS_NPY_MAX_PREAMBLE +
 * PS_NPY_MAX_HEADER bytes of it) are buf: the magic, the version, the
 * header length, the header dict ({'descr': ..., 'fortran_order': False,
 * 'shape': (...)}, a Python literal parsed by NPY.md's grammar), the dtype
 * and shape that `kind` accepts, and a data size of exactly file_size -
 * offset bytes.  Pure: no I/O; `name` is used in messages.  @return 0, or
 * PS_EFORMAT with one line naming the file, what was found and what was
 * expected; *out is zeroed on error. */
int ps_npy_parse(const char *name, const uint8_t *buf, size_t len, uint64_t file_size,
                 ps_npy_kind kind, ps_npy *out, ps_errbuf *eb);

/* The labels of a parsed y file, from its data bytes (h->count * itemsize,
 * any alignment) into out (h->count bytes); *max_label gets the largest.
 * @return 0, or PS_EFORMAT naming the first label outside 0..255 (its
 * index and value). */
int ps_npy_labels(const char *name, const ps_npy *h, const uint8_t *data, uint8_t *out,
                  int *max_label, ps_errbuf *eb);

/* The features of a parsed X file, from its data bytes into out
 * (h->count floats; out may be data itself, when it is float-aligned).
 * @return 0, or PS_EFORMAT naming the first value that is NaN or
 * infinite (its sample and feature). */
int ps_npy_features(const char *name, const ps_npy *h, const uint8_t *data, float *out,
                    ps_errbuf *eb);

/* Read the .npy file at `path` as `kind`: its header into *h and its data
 * into a malloc'd buffer *data (h->count * h->itemsize bytes, float-aligned),
 * which the caller frees.  @return 0, -errno (open or read failures,
 * -EISDIR, -EINVAL for a non-regular file), PS_EFORMAT, -ENOMEM; one line
 * in eb naming the file. */
int ps_npy_read(const char *path, ps_npy_kind kind, ps_npy *h, void **data, ps_errbuf *eb);

/* The file names a data set directory holds. */
#define PS_NPY_X "X.npy"
#define PS_NPY_Y "y.npy"

/* Load the data set in directory `dir`: dir/X.npy (N samples of D floats,
 * any finite values, used as they are) and dir/y.npy (N labels in 0..255).
 * ds gets n = N, dim = D (the product of X's shape after N), features,
 * labels and classes = the largest label + 1 (rows, cols and images stay
 * 0).  A missing or non-directory `dir` gives -ENOENT / -ENOTDIR naming it;
 * errors otherwise as ps_npy_read, and PS_ESHAPE when N differs.  ds is
 * zeroed on error.  Free with ps_dataset_close. */
int ps_npy_load(const char *dir, ps_dataset *ds, ps_errbuf *eb);

/* "(2000, 20)": a shape as numpy prints it, for messages. */
const char *ps_npy_shape_str(const ps_npy *h, char *buf, size_t len);

#endif
