/* Shard files (recovery/FORMAT.md section 2): a shard's state filtered,
 * LZ4-framed and hashed into shard-<i>.lz4, and read back, unfiltered and
 * checked against its manifest; a whole checkpoint's files verified, and
 * what this process verified or wrote remembered. */
#include "recovery/shardfile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <lz4frame.h>
#include <xxhash.h>

#include "common/pool.h"
#include "recovery/commit.h"
#include "recovery/delta.h"
#include "recovery/manifest.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shard files hold float32 little-endian, copied from memory: a little-endian host is assumed"
#endif

/* One LZ4 block (4 MiB) per compressUpdate, so no input is buffered twice. */
#define CHUNK ((size_t)4 << 20)
/* Compressed bytes read per call while decoding. */
#define IN_CHUNK ((size_t)1 << 20)

/* ------------------------------------------------------------------ */
/* The filters                                                        */
/* ------------------------------------------------------------------ */

/* A float's bits as an integer, read in place: byte k of a little-endian
 * float is bits 8k..8k+7, so a plane is a shift, which compilers vectorize
 * (a strided byte gather they do not). */
typedef uint32_t __attribute__((may_alias)) word32;

/* The uncompressed shard file as equal segments (values, slots, accum),
 * read through a cursor that yields them unfiltered or shuffled, then the
 * sparse tables' section as it is (FORMAT.md 2.1). */
typedef struct stream {
  const unsigned char *seg[2 + PS_OPTIM_MAX_SLOTS];
  int nseg;
  size_t seg_floats;
  const unsigned char *tail;  /* the table section: never filtered */
  size_t tail_bytes, tail_off;
  int s;          /* current segment */
  size_t off;     /* none: byte offset in it; shuffle: float index in it */
  int plane;      /* shuffle: byte plane 0..3 */
} stream;

/* The next piece of the filtered stream, at most cap bytes: a pointer into
 * the segments (none) or into scratch (shuffle).  @return its length, 0 at
 * the end. */
static size_t stream_next(stream *st, ps_ckpt_filter f, unsigned char *scratch, size_t cap,
                          const unsigned char **out) {
  int segs_done = f == PS_CKPT_FILTER_NONE ? st->s == st->nseg : st->plane == 4;
  if (segs_done || st->nseg == 0 || st->seg_floats == 0) {
    size_t n = st->tail_bytes - st->tail_off < cap ? st->tail_bytes - st->tail_off : cap;
    *out = st->tail + st->tail_off;
    st->tail_off += n;
    return n;
  }
  if (f == PS_CKPT_FILTER_NONE) {
    size_t seg_bytes = st->seg_floats * sizeof(float);
    size_t n = seg_bytes - st->off < cap ? seg_bytes - st->off : cap;
    *out = st->seg[st->s] + st->off;
    st->off += n;
    if (st->off == seg_bytes) {
      st->off = 0;
      st->s++;
    }
    return n;
  }
  /* Plane k holds byte k of every float of the file, in file order. */
  size_t n = 0;
  while (n < cap && st->plane < 4) {
    const word32 *src = (const word32 *)st->seg[st->s] + st->off;
    unsigned shift = 8u * (unsigned)st->plane;
    size_t take = st->seg_floats - st->off;
    if (take > cap - n)
      take = cap - n;
    unsigned char *dst = scratch + n;
    for (size_t i = 0; i < take; i++)
      dst[i] = (unsigned char)(src[i] >> shift);
    n += take;
    st->off += take;
    if (st->off == st->seg_floats) {
      st->off = 0;
      if (++st->s == st->nseg) {
        st->s = 0;
        st->plane++;
      }
    }
  }
  *out = scratch;
  return n;
}

/* Undo the shuffle for the next n bytes of the stream into dst (nfloats
 * floats), at cursor (*plane, *f). */
static void unshuffle(const unsigned char *src, size_t n, unsigned char *dst, size_t nfloats,
                      int *plane, size_t *f) {
  size_t i = 0;
  while (i < n && *plane < 4) {
    size_t take = nfloats - *f;
    if (take > n - i)
      take = n - i;
    word32 *d = (word32 *)dst + *f;
    const unsigned char *s = src + i;
    unsigned shift = 8u * (unsigned)*plane;
    if (*plane == 0)  /* the first plane sets each word, the others add their byte */
      for (size_t j = 0; j < take; j++)
        d[j] = s[j];
    else
      for (size_t j = 0; j < take; j++)
        d[j] |= (uint32_t)s[j] << shift;
    i += take;
    *f += take;
    if (*f == nfloats) {
      *f = 0;
      ++*plane;
    }
  }
}

/* ------------------------------------------------------------------ */
/* Writing a shard file                                               */
/* ------------------------------------------------------------------ */

/* Append the zn bytes an LZ4F compression call left in z (or its error
 * code) to the shard file, counting them into *stored. */
static int put_frame_bytes(int fd, const char *path, const unsigned char *z, size_t zn,
                           uint64_t *stored, ps_errbuf *eb) {
  if (LZ4F_isError(zn))
    return ps_err_set(eb, -EIO, "compress %s: lz4: %s", path, LZ4F_getErrorName(zn));
  int rc = ps__ckpt_write_all(fd, z, zn);
  if (rc != 0)
    return ps_err_set(eb, rc, "write %s: %s", path, strerror(-rc));
  *stored += zn;
  return 0;
}

static int write_shard(const char *path, const ps_ckpt_shard_state *sh, ps_ckpt_filter filter,
                       ps__ckpt_shard_rec *rec, ps_errbuf *eb) {
  /* The file holds the image's segments (values, slots, accumulator); the
   * exactly-once rows and the fixed fields are in the manifest. */
  stream st = {.seg_floats = sh->nfloats};
  for (uint32_t k = 0; k < ps_state_segments(&sh->info); k++)
    st.seg[st.nseg++] = (const unsigned char *)ps_state_segment_c(sh->img, sh->nfloats, k);
  st.tail = sh->delta != NULL
                ? (const unsigned char *)sh->delta
                : (const unsigned char *)(sh->img + ps_state_tables_at(&sh->info, sh->nfloats));
  st.tail_bytes = sh->delta != NULL ? (size_t)sh->delta_bytes
                                    : (size_t)sh->info.table_floats * sizeof(float);
  rec->raw = (uint64_t)st.nseg * sh->nfloats * sizeof(float) + st.tail_bytes;

  /* The XXH64 is of the unfiltered bytes, the segments back to back. */
  XXH64_state_t *h = XXH64_createState();
  if (h == NULL)
    return ps_err_set(eb, -ENOMEM, "%s: out of memory", path);
  XXH64_reset(h, 0);
  for (int k = 0; k < st.nseg; k++)
    XXH64_update(h, st.seg[k], sh->nfloats * sizeof(float));
  /* The state's hash (FORMAT.md 2.4): the same bytes for a full file; for
   * a delta, the segments hashed once, then the whole table section. */
  rec->state_xxh64 = 0;
  if (sh->delta != NULL) {
    XXH64_state_t *s = XXH64_createState();
    if (s == NULL) {
      XXH64_freeState(h);
      return ps_err_set(eb, -ENOMEM, "%s: out of memory", path);
    }
    XXH64_copyState(s, h);
    XXH64_update(s, sh->img + ps_state_tables_at(&sh->info, sh->nfloats),
                 (size_t)sh->info.table_floats * sizeof(float));
    rec->state_xxh64 = XXH64_digest(s);
    XXH64_freeState(s);
  }
  XXH64_update(h, st.tail, st.tail_bytes);
  rec->xxh64 = XXH64_digest(h);
  if (sh->delta == NULL)
    rec->state_xxh64 = rec->xxh64;
  XXH64_freeState(h);

  LZ4F_preferences_t prefs;
  memset(&prefs, 0, sizeof prefs);
  prefs.frameInfo.blockSizeID = LZ4F_max4MB;
  prefs.frameInfo.blockMode = LZ4F_blockIndependent;
  prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
  prefs.frameInfo.contentSize = rec->raw;
  size_t zcap = LZ4F_compressBound(CHUNK, &prefs);
  if (zcap < LZ4F_HEADER_SIZE_MAX)
    zcap = LZ4F_HEADER_SIZE_MAX;

  const char *step = "allocate buffers for";
  int rc = 0, fd = -1;
  LZ4F_cctx *cctx = NULL;
  unsigned char *z = malloc(zcap);
  unsigned char *scratch = filter == PS_CKPT_FILTER_SHUFFLE ? malloc(CHUNK) : NULL;
  if (z == NULL || (filter == PS_CKPT_FILTER_SHUFFLE && scratch == NULL) ||
      LZ4F_isError(LZ4F_createCompressionContext(&cctx, LZ4F_VERSION))) {
    rc = -ENOMEM;
    goto err;
  }
  step = "create";
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = -errno;
    goto err;
  }
  rec->stored = 0;
  rc = put_frame_bytes(fd, path, z, LZ4F_compressBegin(cctx, z, zcap, &prefs), &rec->stored, eb);
  const unsigned char *p;
  size_t n;
  while (rc == 0 && (n = stream_next(&st, filter, scratch, CHUNK, &p)) != 0)
    rc = put_frame_bytes(fd, path, z, LZ4F_compressUpdate(cctx, z, zcap, p, n, NULL),
                         &rec->stored, eb);
  if (rc == 0)
    rc = put_frame_bytes(fd, path, z, LZ4F_compressEnd(cctx, z, zcap, NULL), &rec->stored, eb);
  if (rc != 0)
    goto out;
  step = "fsync";
  if (fsync(fd) != 0) {
    rc = -errno;
    goto err;
  }
  step = "close";
  rc = close(fd) == 0 ? 0 : -errno;
  fd = -1;
  if (rc != 0)
    goto err;
  LZ4F_freeCompressionContext(cctx);
  free(z);
  free(scratch);
  return 0;
err:
  ps_err_set(eb, rc, "%s %s: %s", step, path, strerror(-rc));
out:
  if (fd >= 0)
    close(fd);
  LZ4F_freeCompressionContext(cctx);
  free(z);
  free(scratch);
  return rc;
}

/* The shard files, side by side (ps_pool_for): each thread shuffles,
 * compresses, hashes and fsyncs its own file. */
typedef struct shard_writes {
  const char *tmp;
  const ps_ckpt_write_opts *o;
  ps__ckpt_shard_rec *recs;
  ps_errbuf *eb;  /* one per shard */
  int *rc;
} shard_writes;

static void write_one(void *arg, int i) {
  shard_writes *w = arg;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/shard-%d.lz4", w->tmp, i);
  w->rc[i] = write_shard(path, &w->o->shards[i], w->o->filter, &w->recs[i], &w->eb[i]);
}

int ps__ckpt_write_shards(const char *tmp, const ps_ckpt_write_opts *o, ps__ckpt_shard_rec *recs,
                          ps_errbuf *eb) {
  int n = o->layout->nshards, rc = 0;
  shard_writes w = {.tmp = tmp, .o = o, .recs = recs};
  w.eb = calloc((size_t)n, sizeof *w.eb);
  w.rc = calloc((size_t)n, sizeof *w.rc);
  if (w.eb == NULL || w.rc == NULL) {
    free(w.eb);
    free(w.rc);
    return ps_err_set(eb, -ENOMEM, "out of memory");
  }
  ps_pool_for(n, write_one, &w);
  for (int i = 0; i < n && rc == 0; i++)
    if (w.rc[i] != 0) {
      *eb = w.eb[i];
      rc = w.rc[i];
    }
  free(w.eb);
  free(w.rc);
  return rc;
}

/* ------------------------------------------------------------------ */
/* Reading a shard file                                               */
/* ------------------------------------------------------------------ */

/* Decode the LZ4 frame of an open shard file into dst (dsize bytes),
 * undoing the filter on its first `filtered` bytes (the segments; the
 * table section after them is stored as it is). */
static int decode_frame(int fd, const char *path, unsigned char *dst, size_t dsize,
                        size_t filtered, ps_ckpt_filter filter, ps_errbuf *eb) {
  LZ4F_dctx *d = NULL;
  unsigned char *in = malloc(IN_CHUNK);
  unsigned char *scratch = filter == PS_CKPT_FILTER_SHUFFLE ? malloc(CHUNK) : NULL;
  int rc = 0, header = 0, plane = 0;
  size_t produced = 0, hint = 1, uf = 0;
  if (in == NULL || (filter == PS_CKPT_FILTER_SHUFFLE && scratch == NULL) ||
      LZ4F_isError(LZ4F_createDecompressionContext(&d, LZ4F_VERSION))) {
    rc = ps_err_set(eb, -ENOMEM, "%s: out of memory", path);
    goto out;
  }
  for (;;) {
    ssize_t n = ps__ckpt_read_full(fd, in, IN_CHUNK);
    if (n < 0) {
      rc = ps_err_set(eb, (int)n, "%s: cannot read: %s", path, strerror((int)-n));
      goto out;
    }
    if (n == 0)
      break;
    size_t pos = 0;
    if (!header) {
      LZ4F_frameInfo_t info;
      size_t hsz = (size_t)n;
      size_t r = LZ4F_getFrameInfo(d, &info, in, &hsz);
      if (LZ4F_isError(r)) {
        rc = ps_err_set(eb, PS_ECORRUPT, "%s: lz4 frame header: %s", path, LZ4F_getErrorName(r));
        goto out;
      }
      if (info.contentSize != dsize) {
        rc = ps_err_set(eb, PS_ECORRUPT,
                        "%s: lz4 frame of %llu bytes (content size), manifest %zu bytes", path,
                        (unsigned long long)info.contentSize, dsize);
        goto out;
      }
      pos = hsz;
      hint = r;
      header = 1;
    }
    while (pos < (size_t)n) {
      if (hint == 0) {
        rc = ps_err_set(eb, PS_ECORRUPT, "%s: data after the end of the lz4 frame", path);
        goto out;
      }
      unsigned char *o = scratch != NULL ? scratch : dst + produced;
      size_t osz = scratch != NULL ? CHUNK : dsize - produced, isz = (size_t)n - pos;
      hint = LZ4F_decompress(d, o, &osz, in + pos, &isz, NULL);
      if (LZ4F_isError(hint)) {
        rc = ps_err_set(eb, PS_ECORRUPT, "%s: lz4 frame: %s", path, LZ4F_getErrorName(hint));
        goto out;
      }
      if (osz > dsize - produced || (isz == 0 && osz == 0)) {
        rc = ps_err_set(eb, PS_ECORRUPT, "%s: lz4 frame decodes to more than the manifest's "
                                         "%zu bytes", path, dsize);
        goto out;
      }
      if (scratch != NULL) {
        size_t planes = produced < filtered ? filtered - produced : 0;
        if (planes > osz)
          planes = osz;
        unshuffle(scratch, planes, dst, filtered / sizeof(float), &plane, &uf);
        memcpy(dst + produced + planes, scratch + planes, osz - planes);
      }
      produced += osz;
      pos += isz;
    }
  }
  if (!header)
    rc = ps_err_set(eb, PS_ECORRUPT, "%s: empty file", path);
  else if (hint != 0)
    rc = ps_err_set(eb, PS_ECORRUPT, "%s: truncated lz4 frame (%zu of %zu bytes decoded)", path,
                    produced, dsize);
  else if (produced != dsize)
    rc = ps_err_set(eb, PS_ECORRUPT, "%s: lz4 frame decodes to %zu bytes, manifest %zu", path,
                    produced, dsize);
out:
  LZ4F_freeDecompressionContext(d);
  free(in);
  free(scratch);
  return rc;
}

/* Shard i's file alone, decoded into dst (its uncompressed_size bytes):
 * the segments, then the table section, or an incremental checkpoint's
 * delta section. */
static int read_file(const ps_ckpt *c, int i, float *dst, ps_errbuf *eb) {
  const ps_ckpt_shard *s = &c->shards[i];
  char path[PATH_MAX];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", c->path != NULL ? c->path : ".", s->file) >=
      sizeof path)
    return ps_err_set(eb, -ENAMETOOLONG, "%s: path too long", s->file);
  /* O_NONBLOCK: a FIFO put there is refused below, never waited on. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return ps_err_set(eb, -errno, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) != 0)
    rc = ps_err_set(eb, -errno, "%s: %s", path, strerror(errno));
  else if (!S_ISREG(st.st_mode))
    rc = ps_err_set(eb, PS_ECORRUPT, "%s: not a regular file: expected the shard's LZ4 frame",
                    path);
  else if ((uint64_t)st.st_size != s->compressed_size)
    rc = ps_err_set(eb, PS_ECORRUPT, "%s: size mismatch (file %jd bytes, manifest %" PRIu64
                    " bytes)", path, (intmax_t)st.st_size, s->compressed_size);
  size_t dsize = (size_t)s->uncompressed_size;
  uint64_t tail = c->base[0] != '\0' ? s->delta_floats : s->info.table_floats;
  if (rc == 0)
    rc = decode_frame(fd, path, (unsigned char *)dst, dsize,
                      dsize - (size_t)tail * sizeof(float), c->filter, eb);
  close(fd);
  if (rc == 0) {
    uint64_t h = XXH64(dst, dsize, 0);
    if (h != s->xxh64)
      rc = ps_err_set(eb, PS_ECORRUPT, "%s: xxh64 mismatch (file %016" PRIx64 ", manifest %016"
                      PRIx64 ")", path, h, s->xxh64);
  }
  return rc;
}

/* The segments' bytes of shard i's state, and the whole state's (its
 * table section included, an incremental checkpoint's put together). */
static size_t segment_bytes(const ps_ckpt_shard *s) {
  return (size_t)ps_state_segments(&s->info) * s->floats * sizeof(float);
}

static size_t state_bytes(const ps_ckpt_shard *s) {
  return segment_bytes(s) + (size_t)s->info.table_floats * sizeof(float);
}

/* Does base hold the state an incremental checkpoint c builds on? */
static int base_fits(const ps_ckpt *c, const ps_ckpt *b, int i, ps_errbuf *eb) {
  const ps_ckpt_shard *s = &c->shards[i], *bs = &b->shards[i < b->nshards ? i : 0];
  if (b->nshards != c->nshards || b->layout_hash != c->layout_hash ||
      strcmp(b->model, c->model) != 0)
    return ps_err_set(eb, PS_ECORRUPT, "it is of model '%s', layout %016" PRIx64 ", %d shards; "
                      "expected this checkpoint's '%s', %016" PRIx64 ", %d", b->model,
                      b->layout_hash, b->nshards, c->model, c->layout_hash, c->nshards);
  if (bs->state_xxh64 != s->base_xxh64)
    return ps_err_set(eb, PS_ECORRUPT, "it holds another state than the one this checkpoint "
                      "built on, written again since (shard %d's state xxh64 %016" PRIx64
                      ", expected %016" PRIx64 ")", i, bs->state_xxh64, s->base_xxh64);
  if (b->step >= c->step || bs->floats != s->floats || bs->info.nslots != s->info.nslots ||
      bs->info.has_accum != s->info.has_accum)
    return ps_err_set(eb, PS_ECORRUPT, "its step %" PRIu64 " or shard %d's shape (%zu floats, %"
                      PRIu32 " slots) is not what this checkpoint builds on (an older step, "
                      "%zu floats, %" PRIu32 " slots)", b->step, i, bs->floats, bs->info.nslots,
                      s->floats, s->info.nslots);
  return 0;
}

/* Shard i of incremental checkpoint c into dst (state_bytes): its base's
 * state (read the same way: a chain ends at a full checkpoint), its own
 * segments, and the table section its delta makes of the base's. */
static int read_delta(const ps_ckpt *c, int i, float *dst, ps_errbuf *eb) {
  const ps_ckpt_shard *s = &c->shards[i];
  char dir[PATH_MAX], path[PATH_MAX + PS_CKPT_NAME_MAX];
  ps__ckpt_parent(c->path != NULL ? c->path : c->name, dir, sizeof dir);
  snprintf(path, sizeof path, "%s/%s", dir, c->base);
  const char *me = c->path != NULL ? c->path : c->name;
  ps_ckpt b;
  ps_ckpt_shard_data bd = {0};
  ps_errbuf why = {0};
  int rc = ps_ckpt_open(&b, path, &why);
  if (rc == 0 && (rc = base_fits(c, &b, i, &why)) == 0)
    rc = ps_ckpt_read_shard(&b, i, &bd, &why);
  ps_ckpt_close(&b);
  if (rc != 0)
    return ps_err_set(eb, rc, "%s: its base %s: %s", me, c->base, why.msg);
  size_t fsize = (size_t)s->uncompressed_size, seg = segment_bytes(s);
  unsigned char *file = malloc(fsize ? fsize : 1);
  uint8_t *sec = NULL;
  uint64_t sec_bytes = 0;
  if (file == NULL)
    rc = ps_err_set(eb, -ENOMEM, "%s/%s: out of memory for %zu bytes", me, s->file, fsize);
  else if ((rc = read_file(c, i, (float *)(void *)file, eb)) == 0 &&
           (rc = ps_delta_apply(bd.tables, bd.table_bytes, file + seg, fsize - seg, &sec,
                                &sec_bytes, &why)) != 0)
    rc = ps_err_set(eb, rc, "%s/%s: its delta on %s: %s", me, s->file, c->base, why.msg);
  if (rc == 0 && sec_bytes != s->info.table_floats * sizeof(float))
    rc = ps_err_set(eb, PS_ECORRUPT, "%s/%s: its delta on %s makes a table section of %" PRIu64
                    " bytes, expected the manifest's %" PRIu64, me, s->file, c->base, sec_bytes,
                    s->info.table_floats * sizeof(float));
  if (rc == 0) {
    memcpy(dst, file, seg);
    memcpy((unsigned char *)dst + seg, sec, (size_t)sec_bytes);
    uint64_t h = XXH64(dst, seg + (size_t)sec_bytes, 0);
    if (h != s->state_xxh64)
      rc = ps_err_set(eb, PS_ECORRUPT, "%s/%s: put together on %s, its state's xxh64 is %016"
                      PRIx64 ", expected the manifest's %016" PRIx64, me, s->file, c->base, h,
                      s->state_xxh64);
  }
  free(sec);
  free(file);
  ps_ckpt_shard_data_close(&bd);
  return rc;
}

int ps_ckpt_read_shard_into(const ps_ckpt *c, int i, float *dst, ps_errbuf *eb) {
  if (c == NULL || i < 0 || i >= c->nshards)
    return ps_err_set(eb, -EINVAL, "checkpoint: no shard %d", i);
  return c->base[0] != '\0' ? read_delta(c, i, dst, eb) : read_file(c, i, dst, eb);
}

int ps_ckpt_read_shard(const ps_ckpt *c, int i, ps_ckpt_shard_data *out, ps_errbuf *eb) {
  memset(out, 0, sizeof *out);
  if (c == NULL || i < 0 || i >= c->nshards)
    return ps_err_set(eb, -EINVAL, "checkpoint: no shard %d", i);
  const ps_ckpt_shard *s = &c->shards[i];
  size_t dsize = state_bytes(s);
  float *buf = malloc(dsize ? dsize : 1);
  if (buf == NULL)
    return ps_err_set(eb, -ENOMEM, "%s: out of memory for %zu bytes", s->file, dsize);
  int rc = ps_ckpt_read_shard_into(c, i, buf, eb);
  if (rc != 0) {
    free(buf);
    return rc;
  }
  out->buf = buf;
  out->nfloats = dsize / sizeof(float);
  out->values = out->buf;
  for (uint32_t k = 0; k < s->info.nslots; k++)
    out->slots[k] = out->buf + (size_t)(1 + k) * s->floats;
  if (s->info.has_accum)
    out->accum = out->buf + (size_t)(1 + s->info.nslots) * s->floats;
  out->tables = out->buf + (size_t)ps_state_segments(&s->info) * s->floats;
  out->table_bytes = (size_t)s->info.table_floats * sizeof(float);
  return 0;
}

void ps_ckpt_shard_data_close(ps_ckpt_shard_data *d) {
  if (d == NULL)
    return;
  free(d->buf);
  memset(d, 0, sizeof *d);
}

int ps_ckpt_verify(const ps_ckpt *c, ps_errbuf *eb) {
  for (int i = 0; i < c->nshards; i++) {
    ps_ckpt_shard_data d;
    int rc = ps_ckpt_read_shard(c, i, &d, eb);
    if (rc != 0)
      return rc;
    ps_ckpt_shard_data_close(&d);
  }
  return 0;
}

/* What this process verified or wrote, by the files' identity: the path
 * and, for the manifest and each shard file, device, inode, size and
 * modification time.  A file edited in place or replaced changes it; a bit
 * flipped by the disk under an unchanged inode does not (a restore reads
 * everything again). */
#define VERIFIED_MAX 64
static struct {
  pthread_mutex_t mu;
  int n, next;
  struct {
    uint64_t fp;
    int rc;
    char why[sizeof(((ps_errbuf *)0)->msg)];
  } e[VERIFIED_MAX];
} verified = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int file_identity(XXH64_state_t *h, const char *dir, const char *file) {
  char path[PATH_MAX];
  struct stat st;
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, file) >= sizeof path ||
      stat(path, &st) != 0)
    return -1;
  uint64_t id[5] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size,
                    (uint64_t)st.st_mtim.tv_sec, (uint64_t)st.st_mtim.tv_nsec};
  XXH64_update(h, file, strlen(file) + 1);
  XXH64_update(h, id, sizeof id);
  return 0;
}

/* 0 with *fp set, or -1 when a file cannot be stat'ed (not remembered). */
static int ckpt_fingerprint(const ps_ckpt *c, uint64_t *fp) {
  if (c->path == NULL)
    return -1;
  XXH64_state_t *h = XXH64_createState();
  if (h == NULL)
    return -1;
  XXH64_reset(h, 0);
  XXH64_update(h, c->path, strlen(c->path) + 1);
  int rc = file_identity(h, c->path, MANIFEST_FILE);
  for (int i = 0; rc == 0 && i < c->nshards; i++)
    rc = file_identity(h, c->path, c->shards[i].file);
  *fp = XXH64_digest(h);
  XXH64_freeState(h);
  return rc;
}

static void remember(uint64_t fp, int rc, const char *why) {
  pthread_mutex_lock(&verified.mu);
  int at = -1;
  for (int i = 0; i < verified.n; i++)
    if (verified.e[i].fp == fp)
      at = i;
  if (at < 0) {
    at = verified.n < VERIFIED_MAX ? verified.n++ : verified.next;
    verified.next = (at + 1) % VERIFIED_MAX;
  }
  verified.e[at].fp = fp;
  verified.e[at].rc = rc;
  snprintf(verified.e[at].why, sizeof verified.e[at].why, "%s", why != NULL ? why : "");
  pthread_mutex_unlock(&verified.mu);
}

void ps__ckpt_note_written(const char *path) {
  ps_ckpt c;
  ps_errbuf ignore = {0};
  uint64_t fp;
  if (ps_ckpt_open(&c, path, &ignore) == 0 && ckpt_fingerprint(&c, &fp) == 0)
    remember(fp, 0, NULL);
  ps_ckpt_close(&c);
}

int ps_ckpt_verify_remembered(const ps_ckpt *c, ps_errbuf *eb, int *fresh) {
  uint64_t fp;
  int have_fp = ckpt_fingerprint(c, &fp) == 0;
  if (fresh != NULL)
    *fresh = 1;
  if (have_fp) {
    int found = 0, rc = 0;
    pthread_mutex_lock(&verified.mu);
    for (int i = 0; i < verified.n && !found; i++)
      if (verified.e[i].fp == fp) {
        found = 1;
        rc = verified.e[i].rc;
        if (rc != 0)
          ps_err_set(eb, rc, "%s", verified.e[i].why);
      }
    pthread_mutex_unlock(&verified.mu);
    if (found) {
      if (fresh != NULL)
        *fresh = 0;
      return rc;
    }
  }
  int rc = ps_ckpt_verify(c, eb);
  if (have_fp)
    remember(fp, rc, rc != 0 ? eb->msg : NULL);
  return rc;
}

int ps_ckpt_read_values(const ps_ckpt *c, float *arena, ps_errbuf *eb) {
  return ps_ckpt_read_values_each(c, arena, NULL, NULL, eb);
}

int ps_ckpt_read_values_each(const ps_ckpt *c, float *arena, ps_ckpt_shard_fn *fn, void *arg,
                             ps_errbuf *eb) {
  for (int i = 0; i < c->nshards; i++) {
    ps_ckpt_shard_data d;
    int rc = ps_ckpt_read_shard(c, i, &d, eb);
    if (rc != 0)
      return rc;
    if (fn != NULL && (rc = fn(arg, i, &d, eb)) != 0) {
      ps_ckpt_shard_data_close(&d);
      return rc;
    }
    for (int v = 0; v < c->nvars; v++) {
      const ps_ckpt_var *var = &c->vars[v];
      for (int k = 0; k < var->nparts; k++) {
        const ps_ckpt_part *p = &var->parts[k];
        if (p->shard == i)
          memcpy(arena + var->offset + p->start, d.values + p->shard_off,
                 p->count * sizeof(float));
      }
    }
    ps_ckpt_shard_data_close(&d);
  }
  return 0;
}
