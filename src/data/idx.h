/* IDX files (the MNIST format): reading images and labels, plain or gzipped,
 * and loading a data set split from a directory.  Spec: src/data/IDX.md. */
#ifndef PS_DATA_IDX_H
#define PS_DATA_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "data/sampler.h"
#include "paramserv/error.h"

/* The Debian data set (package dataset-fashion-mnist). */
#define PS_DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/* Fashion-MNIST's pixel mean and standard deviation (of b / 255), the
 * normalization every process applies to its inputs. */
#define PS_DATA_MEAN 0.2860f
#define PS_DATA_STD 0.3530f

/* An input normalization: each pixel byte b becomes (b / divide - mean) /
 * std.  A checkpoint's manifest records it (recovery/FORMAT.md), so that
 * `paramserv eval` and an export's reader feed the model what it trained
 * on. */
typedef struct ps_data_norm {
  float divide, mean, std;
} ps_data_norm;

/* The one every process applies: (b / 255 - PS_DATA_MEAN) / PS_DATA_STD. */
#define PS_DATA_NORM ((ps_data_norm){255.0f, PS_DATA_MEAN, PS_DATA_STD})

/* None: the inputs as they are, (x / 1 - 0) / 1, what a run on the user's
 * own float32 data (npy: src/data/NPY.md) records in its checkpoints. */
#define PS_DATA_NORM_NONE ((ps_data_norm){1.0f, 0.0f, 1.0f})

/* One IDX file of unsigned bytes: dims[0] items, each dims[1]*...*dims[ndim-1]. */
typedef struct ps_idx {
  int ndim;            /* 1 (labels) or 3 (images) */
  uint32_t dims[3];
  uint8_t *data;       /* dims product bytes, owned, freed by ps_idx_close */
} ps_idx;

/* Read the IDX file at `path` (gzip or plain: zlib reads both).  Expects an
 * unsigned-byte IDX with `want_ndim` (1..3) dimensions, each > 0, at most
 * 1 GiB of data and nothing after it.  On error fills `eb` (may be NULL)
 * with one line naming the file, what was found and what was expected, and
 * returns a negative code: -errno for open/read failures (-ENOENT, -EISDIR,
 * ...), PS_EFORMAT for a bad file, -EINVAL for a bad want_ndim, -ENOMEM;
 * `out` is then left empty (zeroed).  Caller frees with ps_idx_close. */
int ps_idx_read(const char *path, int want_ndim, ps_idx *out, ps_errbuf *eb);

/* Parse an IDX image from memory (same checks and codes as ps_idx_read;
 * `name` is used in messages).  Pure: no I/O.  Copies the data out, so `buf`
 * need only stay valid during the call.  Used by ps_idx_read and by the fuzz
 * target. */
int ps_idx_parse(const char *name, const uint8_t *buf, size_t len, int want_ndim,
                 ps_idx *out, ps_errbuf *eb);

/* Frees idx->data and zeroes *idx; NULL or an emptied idx is fine. */
void ps_idx_close(ps_idx *idx);

/* A split of a data set: n samples of dim floats each and their labels.
 * IDX (ps_dataset_load): images of rows x cols bytes, which become floats
 * through PS_DATA_NORM as they are handed out; npy (data/npy.h,
 * ps_npy_load): the user's float32 features, handed out as they are. */
typedef struct ps_dataset {
  size_t n;
  uint32_t rows, cols;  /* idx: the images' size; npy: 0 */
  uint8_t *images;      /* idx: n * rows * cols, owned; npy: NULL */
  float *features;      /* npy: n * dim, owned, every one finite; idx: NULL */
  size_t dim;           /* floats a sample: rows * cols (idx), D (npy) */
  uint8_t *labels;      /* n, owned, each < classes */
  int classes;          /* idx: 10; npy: the largest label + 1 */
} ps_dataset;

/* Load split `split` ("train" or "t10k") from `dir`: files
 * <split>-images-idx3-ubyte[.gz] and <split>-labels-idx1-ubyte[.gz] (the
 * plain file when both exist).  Checks that counts match (else PS_ESHAPE)
 * and that every label is in [0, 10) (else PS_EFORMAT).  A missing or
 * non-directory `dir` gives -ENOENT / -ENOTDIR naming it; a split with
 * neither file gives -ENOENT naming the .gz path.  Errors as ps_idx_read;
 * `ds` is zeroed on error.  Caller frees with ps_dataset_close. */
int ps_dataset_load(const char *dir, const char *split, ps_dataset *ds, ps_errbuf *eb);

/* Frees both arrays and zeroes *ds; NULL or an emptied ds is fine. */
void ps_dataset_close(ps_dataset *ds);

/* Convert images index[0..count) (or images [0, count) when index is NULL)
 * to floats (b/255 - mean) / std, std > 0, into out: count * rows * cols
 * floats, image k at out + k * rows * cols, owned by the caller.  Indices
 * must be < ds->n.  Computed as one multiply-add per pixel, within 1e-6
 * relative of the two-step formula. */
void ps_dataset_images_f32(const ps_dataset *ds, const size_t *index, size_t count,
                           float mean, float std, float *out);

/* The same with any normalization: (b / norm->divide - mean) / std,
 * divide > 0 and std > 0, as one multiply-add per pixel.  An npy data set
 * has no bytes to normalize: its features are copied as they are. */
void ps_dataset_images_norm(const ps_dataset *ds, const size_t *index, size_t count,
                            const ps_data_norm *norm, float *out);

/* What a model is fed of samples index[0..count) (or [0, count) when index
 * is NULL), count * ds->dim floats into out: IDX images normalized with
 * PS_DATA_NORM, npy features as they are. */
void ps_dataset_inputs(const ps_dataset *ds, const size_t *index, size_t count, float *out);

/* The sampler's next batch of at most `batch` samples: their indices into
 * idx, their inputs (ps_dataset_inputs) into x, their labels into y.
 * @return the samples in it (fewer at an epoch's end). */
size_t ps_dataset_batch(const ps_dataset *ds, ps_sampler *s, size_t *idx, size_t batch, float *x,
                        uint8_t *y);

#endif
