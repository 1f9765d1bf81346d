/* Checkpoint writing, reading, verification, fallback and retention, as
 * specified in recovery/FORMAT.md (version 1). */
#include "recovery/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <lz4frame.h>
#include <xxhash.h>

#include "common/config.h"
#include "common/log.h"
#include "common/timeutil.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shard files hold float32 little-endian, copied from memory: a little-endian host is assumed"
#endif

#define MANIFEST_FILE "MANIFEST.json"
#define INDEX_FILE "checkpoint"
#define INDEX_TMP "checkpoint.tmp"   /* what ps__ckpt_write_file names its temporary */
#define TMP_PREFIX ".tmp-"            /* .tmp-ckpt-<step>-<pid> */
#define OLD_PREFIX ".old-"            /* .old-ckpt-<step>-<pid>: a replaced checkpoint */

/* One LZ4 block (4 MiB) per compressUpdate, so no input is buffered twice. */
#define CHUNK ((size_t)4 << 20)
/* Compressed bytes read per call while decoding. */
#define IN_CHUNK ((size_t)1 << 20)
/* A manifest larger than this is refused before it is read. */
#define MANIFEST_MAX ((size_t)256 << 20)
/* Floats per shard slice: keeps every byte count of a shard file below 2^53,
 * so that JSON numbers carry them exactly. */
#define MAX_FLOATS ((uint64_t)1 << 48)
#define JSON_SAFE ((int64_t)1 << 53)

#ifndef PS_RENAME_EXCHANGE
#define PS_RENAME_EXCHANGE (1 << 1) /* linux/fs.h RENAME_EXCHANGE */
#endif

static const char *const consistency_names[] = {"async", "sync", "ssp"};

/* ------------------------------------------------------------------ */
/* File system helpers                                                */
/* ------------------------------------------------------------------ */

/* Test-only crash points (PS_CKPT_CRASH_ENV): die as a kill -9 would. */
static void crash_point(const char *stage) {
  const char *at = getenv(PS_CKPT_CRASH_ENV);
  if (at != NULL && strcmp(at, stage) == 0) {
    ps_log(PS_LOG_WARN, "checkpoint: test crash point '%s': killing this process", stage);
    raise(SIGKILL);
  }
}

static int write_all(int fd, const void *buf, size_t len) {
  const unsigned char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Read until len bytes or end of file.  @return bytes read or -errno. */
static ssize_t read_full(int fd, void *buf, size_t len) {
  unsigned char *p = buf;
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, p + got, len - got);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0)
      break;
    got += (size_t)n;
  }
  return (ssize_t)got;
}

static int fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  int rc = fsync(fd) == 0 ? 0 : -errno;
  close(fd);
  return rc;
}

/* The directory part of `path` ("." when it has none). */
static void parent_of(const char *path, char *out, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (slash == NULL)
    snprintf(out, cap, ".");
  else if (slash == path)
    snprintf(out, cap, "/");
  else
    snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

static int rm_tree_at(int dfd, const char *name) {
  if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
    return 0;
  if (errno != EISDIR && errno != EPERM)
    return -errno;
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  DIR *d = fdopendir(fd);
  if (d == NULL) {
    int e = -errno;
    close(fd);
    return e;
  }
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    int r = rm_tree_at(dirfd(d), e->d_name);
    if (r < 0 && rc == 0)
      rc = r;
  }
  closedir(d);
  if (unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT && rc == 0)
    rc = -errno;
  return rc;
}

/* rm -rf path.  @return 0 (also when it did not exist) or the first -errno. */
static int rm_tree(const char *path) { return rm_tree_at(AT_FDCWD, path); }

int ps__ckpt_mkdir_p(const char *path) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0)
    return -EINVAL;
  if (n >= sizeof buf)
    return -ENAMETOOLONG;
  memcpy(buf, path, n + 1);
  for (char *p = buf + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char c = *p;
      *p = '\0';
      if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -errno;
      *p = c;
      if (c == '\0')
        break;
    }
  }
  struct stat st;
  if (stat(path, &st) != 0)
    return -errno;
  return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

static int write_file_atomic(const char *path, const void *const *bufs, const size_t *lens, int n,
                             const char *crash_stage, ps_errbuf *eb) {
  char tmp[PATH_MAX], parent[PATH_MAX];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
    return ps_err_set(eb, -ENAMETOOLONG, "%s: path too long", path);
  parent_of(path, parent, sizeof parent);
  const char *step = "create";
  int rc = 0;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = -errno;
    goto err;
  }
  step = "write";
  for (int i = 0; i < n && rc == 0; i++)
    rc = write_all(fd, bufs[i], lens[i]);
  if (rc == 0) {
    step = "fsync";
    rc = fsync(fd) == 0 ? 0 : -errno;
  }
  if (close(fd) != 0 && rc == 0) {
    step = "close";
    rc = -errno;
  }
  if (rc != 0)
    goto err;
  if (crash_stage != NULL)
    crash_point(crash_stage);
  step = "rename";
  if (rename(tmp, path) != 0) {
    rc = -errno;
    goto err;
  }
  step = "fsync the directory of";
  if ((rc = fsync_dir(parent)) != 0)
    return ps_err_set(eb, rc, "%s %s: %s", step, path, strerror(-rc));
  return 0;
err:
  unlink(tmp);
  return ps_err_set(eb, rc, "%s %s: %s", step, tmp, strerror(-rc));
}

int ps__ckpt_write_file(const char *path, const void *const *bufs, const size_t *lens, int n,
                        ps_errbuf *eb) {
  return write_file_atomic(path, bufs, lens, n, NULL, eb);
}

/* "ckpt-%09<step>". */
static void ckpt_name(uint64_t step, char out[PS_CKPT_NAME_MAX]) {
  snprintf(out, PS_CKPT_NAME_MAX, "ckpt-%09" PRIu64, step);
}

/* Only the canonical spelling counts, so that two names never mean one step. */
static int parse_ckpt_name(const char *s, uint64_t *step) {
  if (strncmp(s, "ckpt-", 5) != 0)
    return -1;
  const char *d = s + 5;
  size_t n = strlen(d);
  if (n < 9 || n > 20)
    return -1;
  for (size_t i = 0; i < n; i++)
    if (d[i] < '0' || d[i] > '9')
      return -1;
  errno = 0;
  unsigned long long v = strtoull(d, NULL, 10);
  if (errno != 0)
    return -1;
  char canon[PS_CKPT_NAME_MAX];
  ckpt_name(v, canon);
  if (strcmp(canon, s) != 0)
    return -1;
  *step = v;
  return 0;
}

static int parse_u64_text(const char *s, uint64_t *out) {
  size_t n = strlen(s);
  if (n == 0 || n > 20 || (n > 1 && s[0] == '0'))
    return -1;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9')
      return -1;
  errno = 0;
  unsigned long long v = strtoull(s, NULL, 10);
  if (errno != 0)
    return -1;
  *out = v;
  return 0;
}

static int parse_hex64(const char *s, uint64_t *out) {
  if (strlen(s) != 16)
    return -1;
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0)
      return -1;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return 0;
}

int ps_ckpt_filter_parse(const char *name, ps_ckpt_filter *out) {
  if (name != NULL && strcmp(name, "none") == 0)
    *out = PS_CKPT_FILTER_NONE;
  else if (name != NULL && strcmp(name, "shuffle") == 0)
    *out = PS_CKPT_FILTER_SHUFFLE;
  else
    return PS_EUSAGE;
  return 0;
}

const char *ps_ckpt_filter_name(ps_ckpt_filter f) {
  switch (f) {
  case PS_CKPT_FILTER_NONE: return "none";
  case PS_CKPT_FILTER_SHUFFLE: return "shuffle";
  }
  return "unknown";
}

/* ------------------------------------------------------------------ */
/* The byte-shuffle filter                                            */
/* ------------------------------------------------------------------ */

/* The uncompressed shard file as equal segments (values, slots, accum),
 * read through a cursor that yields it unfiltered or shuffled. */
typedef struct stream {
  const unsigned char *seg[2 + PS_OPTIM_MAX_SLOTS];
  int nseg;
  size_t seg_floats;
  int s;          /* current segment */
  size_t off;     /* none: byte offset in it; shuffle: float index in it */
  int plane;      /* shuffle: byte plane 0..3 */
} stream;

/* The next piece of the filtered stream, at most cap bytes: a pointer into
 * the segments (none) or into scratch (shuffle).  @return its length, 0 at
 * the end. */
static size_t stream_next(stream *st, ps_ckpt_filter f, unsigned char *scratch, size_t cap,
                          const unsigned char **out) {
  if (f == PS_CKPT_FILTER_NONE) {
    size_t seg_bytes = st->seg_floats * sizeof(float);
    if (st->s == st->nseg)
      return 0;
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
    const unsigned char *src = st->seg[st->s] + st->plane;
    size_t take = st->seg_floats - st->off;
    if (take > cap - n)
      take = cap - n;
    for (size_t i = 0; i < take; i++)
      scratch[n + i] = src[(st->off + i) * sizeof(float)];
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
    unsigned char *d = dst + *plane;
    for (size_t j = 0; j < take; j++)
      d[(*f + j) * sizeof(float)] = src[i + j];
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

typedef struct shard_rec {
  uint64_t raw, stored, xxh64;
} shard_rec;

static int write_shard(const char *path, const ps_ckpt_shard_state *sh, ps_ckpt_filter filter,
                       shard_rec *rec, ps_errbuf *eb) {
  stream st = {.seg_floats = sh->nfloats};
  st.seg[st.nseg++] = (const unsigned char *)sh->values;
  for (int k = 0; k < sh->nslots; k++)
    st.seg[st.nseg++] = (const unsigned char *)sh->slots[k];
  if (sh->accum != NULL)
    st.seg[st.nseg++] = (const unsigned char *)sh->accum;
  rec->raw = (uint64_t)st.nseg * sh->nfloats * sizeof(float);

  /* The XXH64 is of the unfiltered bytes, the segments back to back. */
  XXH64_state_t *h = XXH64_createState();
  if (h == NULL)
    return ps_err_set(eb, -ENOMEM, "%s: out of memory", path);
  XXH64_reset(h, 0);
  for (int k = 0; k < st.nseg; k++)
    XXH64_update(h, st.seg[k], sh->nfloats * sizeof(float));
  rec->xxh64 = XXH64_digest(h);
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
  size_t zn;
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
  step = "compress";
  zn = LZ4F_compressBegin(cctx, z, zcap, &prefs);
  if (LZ4F_isError(zn))
    goto lz4_err;
  step = "write";
  if ((rc = write_all(fd, z, zn)) != 0)
    goto err;
  rec->stored = zn;
  for (;;) {
    const unsigned char *p;
    size_t n = stream_next(&st, filter, scratch, CHUNK, &p);
    if (n == 0)
      break;
    step = "compress";
    zn = LZ4F_compressUpdate(cctx, z, zcap, p, n, NULL);
    if (LZ4F_isError(zn))
      goto lz4_err;
    step = "write";
    if ((rc = write_all(fd, z, zn)) != 0)
      goto err;
    rec->stored += zn;
  }
  step = "compress";
  zn = LZ4F_compressEnd(cctx, z, zcap, NULL);
  if (LZ4F_isError(zn))
    goto lz4_err;
  step = "write";
  if ((rc = write_all(fd, z, zn)) != 0)
    goto err;
  rec->stored += zn;
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
lz4_err:
  rc = ps_err_set(eb, -EIO, "%s %s: lz4: %s", step, path, LZ4F_getErrorName(zn));
  goto out;
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

/* ------------------------------------------------------------------ */
/* Writing the manifest                                               */
/* ------------------------------------------------------------------ */

static json_t *json_u64(uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "%" PRIu64, v);
  return json_string(b);
}

static json_t *json_hex64(uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "%016" PRIx64, v);
  return json_string(b);
}

/* The shortest decimal that reads back as the same float, so that the
 * manifest says "0.001" rather than 0.0010000000474974513. */
static json_t *json_float(float f) {
  char b[32];
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(b, sizeof b, "%.*g", prec, (double)f);
    if ((float)strtod(b, NULL) == f)
      break;
  }
  return json_real(strtod(b, NULL));
}

static json_t *json_pair_u64(uint64_t a, uint64_t b) {
  json_t *p = json_array();
  if (p != NULL && (json_array_append_new(p, json_u64(a)) != 0 ||
                    json_array_append_new(p, json_u64(b)) != 0)) {
    json_decref(p);
    return NULL;
  }
  return p;
}

/* Every json_*_set_new / append_new steals its value, also on failure, and
 * fails on a NULL container or value: one flag catches any allocation
 * failure of the whole tree. */
#define SET(obj, key, val) (ok &= json_object_set_new((obj), (key), (val)) == 0)
#define APPEND(arr, val) (ok &= json_array_append_new((arr), (val)) == 0)

static char *build_manifest(const ps_ckpt_write_opts *o, const shard_rec *recs, double wall) {
  int ok = 1;
  const ps_layout *l = o->layout;
  const ps_vartable *t = o->vars;
  json_t *root = json_object();
  SET(root, "format", json_string("paramserv-checkpoint"));
  SET(root, "format_version", json_integer(PS_CKPT_FORMAT_VERSION));
  SET(root, "step", json_u64(o->step));
  SET(root, "global_step", json_u64(o->global_step));
  SET(root, "wall_time", json_real(wall));
  SET(root, "cluster_id", json_string(o->cluster_id));
  SET(root, "model", json_string(o->model));
  SET(root, "layout_hash", json_hex64(l->hash));

  json_t *opt = json_object();
  SET(opt, "name", json_string(ps_optim_name(&o->optim)));
  SET(opt, "lr", json_float(o->optim.lr));
  SET(opt, "momentum", json_float(o->optim.momentum));
  SET(opt, "weight_decay", json_float(o->optim.weight_decay));
  SET(opt, "beta1", json_float(o->optim.beta1));
  SET(opt, "beta2", json_float(o->optim.beta2));
  SET(opt, "eps", json_float(o->optim.eps));
  SET(opt, "initial_accumulator", json_float(o->optim.initial_accumulator));
  SET(root, "optimizer", opt);
  SET(root, "consistency", json_string(consistency_names[o->consistency]));
  SET(root, "filter", json_string(ps_ckpt_filter_name(o->filter)));
  SET(root, "nshards", json_integer(l->nshards));

  /* The layout's parts are sorted by (var, start): one run per variable. */
  json_t *vars = json_array();
  int p = 0;
  for (int v = 0; v < t->n; v++) {
    const ps_var *var = &t->vars[v];
    json_t *jv = json_object(), *shape = json_array(), *parts = json_array();
    SET(jv, "name", json_string(var->name));
    for (int d = 0; d < var->ndim; d++)
      APPEND(shape, json_integer(var->shape[d]));
    SET(jv, "shape", shape);
    SET(jv, "dtype", json_string("float32"));
    SET(jv, "offset", json_integer((json_int_t)var->offset));
    SET(jv, "count", json_integer((json_int_t)var->count));
    for (; p < l->nparts && l->parts[p].var == v; p++) {
      const ps_part *pt = &l->parts[p];
      json_t *jp = json_object();
      SET(jp, "shard", json_integer(pt->shard));
      SET(jp, "start", json_integer((json_int_t)pt->start));
      SET(jp, "count", json_integer((json_int_t)pt->count));
      SET(jp, "shard_off", json_integer((json_int_t)pt->shard_off));
      APPEND(parts, jp);
    }
    SET(jv, "parts", parts);
    APPEND(vars, jv);
  }
  SET(root, "variables", vars);

  json_t *shards = json_array();
  for (int i = 0; i < l->nshards; i++) {
    const ps_ckpt_shard_state *s = &o->shards[i];
    char file[PS_CKPT_NAME_MAX];
    snprintf(file, sizeof file, "shard-%d.lz4", i);
    json_t *js = json_object(), *once = json_array();
    SET(js, "index", json_integer(i));
    SET(js, "file", json_string(file));
    SET(js, "version", json_u64(s->version));
    SET(js, "global_step", json_u64(s->global_step));
    SET(js, "floats", json_integer((json_int_t)s->nfloats));
    SET(js, "nslots", json_integer(s->nslots));
    SET(js, "has_accum", json_boolean(s->accum != NULL));
    SET(js, "accum_count", json_integer(s->accum_count));
    SET(js, "target", json_integer(s->target));
    for (int w = 0; w < s->nonce; w++)
      APPEND(once, json_pair_u64(s->once[w].incarnation, s->once[w].last_seq));
    SET(js, "once", once);
    SET(js, "compressed_size", json_integer((json_int_t)recs[i].stored));
    SET(js, "uncompressed_size", json_integer((json_int_t)recs[i].raw));
    SET(js, "xxh64", json_hex64(recs[i].xxh64));
    APPEND(shards, js);
  }
  SET(root, "shards", shards);

  json_t *pos = json_array();
  for (int w = 0; w < o->nworkers; w++)
    APPEND(pos, json_pair_u64(o->data_pos[w].epoch, o->data_pos[w].offset));
  SET(root, "data_positions", pos);

  /* 16 digits: the optimizer's short decimals print as written, and the
   * wall time keeps its microseconds. */
  char *text = ok ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(16)) : NULL;
  json_decref(root);
  return text;
}

#undef SET
#undef APPEND

/* ------------------------------------------------------------------ */
/* Commit                                                             */
/* ------------------------------------------------------------------ */

static int retain_impl(const char *dir, int64_t max_to_keep, double hours, const char *protect,
                       ps_errbuf *eb);

static int check_write_opts(const char *dir, const ps_ckpt_write_opts *o, ps_errbuf *eb) {
  if (dir == NULL || dir[0] == '\0' || o == NULL || o->vars == NULL || o->layout == NULL ||
      o->shards == NULL || o->cluster_id == NULL || o->model == NULL)
    return ps_err_set(eb, PS_EUSAGE, "checkpoint: missing directory, table, layout or shards");
  if (strlen(o->cluster_id) > 63 || strlen(o->model) > 127 || o->model[0] == '\0')
    return ps_err_set(eb, PS_EUSAGE, "checkpoint: cluster id (<= 63 bytes) or model text "
                                     "(1 to 127 bytes) out of bounds");
  if (o->consistency < 0 || o->consistency > 2 ||
      (o->filter != PS_CKPT_FILTER_NONE && o->filter != PS_CKPT_FILTER_SHUFFLE))
    return ps_err_set(eb, PS_EUSAGE, "checkpoint: consistency %d or filter %d out of range",
                      o->consistency, (int)o->filter);
  if (!(o->wall_time >= 0) || !isfinite(o->wall_time) || o->nworkers < 0 ||
      (o->nworkers > 0 && o->data_pos == NULL) || o->max_to_keep < 0 ||
      !(o->keep_every_n_hours >= 0) || !isfinite(o->keep_every_n_hours))
    return ps_err_set(eb, PS_EUSAGE, "checkpoint: wall time, workers or retention out of range");
  const ps_layout *l = o->layout;
  int nslots = ps_optim_nslots(o->optim.kind);
  if (l->nshards < 1)
    return ps_err_set(eb, PS_EUSAGE, "checkpoint: the layout has no shards");
  for (int p = 0; p < l->nparts; p++)
    if (l->parts[p].var < 0 || l->parts[p].var >= o->vars->n)
      return ps_err_set(eb, PS_EUSAGE, "checkpoint: the layout is not of this variable table");
  for (int i = 0; i < l->nshards; i++) {
    const ps_ckpt_shard_state *s = &o->shards[i];
    if (s->nfloats != l->shard_floats[i] || s->nfloats == 0 || s->nfloats > MAX_FLOATS)
      return ps_err_set(eb, PS_EUSAGE, "checkpoint: shard %d holds %zu floats, the layout %zu", i,
                        s->nfloats, l->shard_floats[i]);
    if (s->nslots != nslots)
      return ps_err_set(eb, PS_EUSAGE, "checkpoint: shard %d has %d optimizer slots, %s has %d",
                        i, s->nslots, ps_optim_name(&o->optim), nslots);
    if (s->values == NULL || s->nonce < 0 || (s->nonce > 0 && s->once == NULL) ||
        s->accum_count < 0 || s->target < 0)
      return ps_err_set(eb, PS_EUSAGE, "checkpoint: shard %d: missing values or once table", i);
    for (int k = 0; k < nslots; k++)
      if (s->slots[k] == NULL)
        return ps_err_set(eb, PS_EUSAGE, "checkpoint: shard %d: slot %d missing", i, k);
  }
  return 0;
}

/* Move the complete temporary directory to its name.  A checkpoint of the
 * same step can exist (one that was damaged, or of a timeline that was
 * rolled back to an older checkpoint): it is swapped out atomically, so the
 * name never disappears while the index may list it. */
static int commit_rename(const char *dir, const char *tmp, const char *final, const char *name,
                         ps_errbuf *eb) {
  if (rename(tmp, final) == 0)
    return 0;
  if (errno != EEXIST && errno != ENOTEMPTY)
    return ps_err_set(eb, -errno, "rename %s to %s: %s", tmp, final, strerror(errno));
  if (syscall(SYS_renameat2, AT_FDCWD, tmp, AT_FDCWD, final, PS_RENAME_EXCHANGE) == 0) {
    int rc = fsync_dir(dir);
    if (rc != 0)
      return ps_err_set(eb, rc, "fsync %s: %s", dir, strerror(-rc));
    rm_tree(tmp);  /* now the replaced checkpoint */
    return 0;
  }
  if (errno != EINVAL && errno != ENOSYS)
    return ps_err_set(eb, -errno, "exchange %s with %s: %s", tmp, final, strerror(errno));
  /* No atomic exchange on this file system: move the old one aside first. */
  char old[PATH_MAX];
  snprintf(old, sizeof old, "%s/" OLD_PREFIX "%s-%ld", dir, name, (long)getpid());
  rm_tree(old);
  if (rename(final, old) != 0)
    return ps_err_set(eb, -errno, "move %s aside: %s", final, strerror(errno));
  if (rename(tmp, final) != 0) {
    int e = errno;
    rename(old, final);  /* put the old one back: the index may name it */
    return ps_err_set(eb, -e, "rename %s to %s: %s", tmp, final, strerror(e));
  }
  int rc = fsync_dir(dir);
  if (rc != 0)
    return ps_err_set(eb, rc, "fsync %s: %s", dir, strerror(-rc));
  rm_tree(old);
  return 0;
}

int ps_ckpt_write(const char *dir, const ps_ckpt_write_opts *o, ps_ckpt_write_stats *st,
                  ps_errbuf *eb) {
  int rc = check_write_opts(dir, o, eb);
  if (rc != 0)
    return rc;
  double t0 = ps_now_s();
  double wall = o->wall_time;
  if (wall == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    wall = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
  }
  char name[PS_CKPT_NAME_MAX], tmp[PATH_MAX], final[PATH_MAX], path[PATH_MAX];
  ckpt_name(o->step, name);
  if ((size_t)snprintf(tmp, sizeof tmp, "%s/" TMP_PREFIX "%s-%ld", dir, name, (long)getpid()) >=
          sizeof tmp - 32 ||
      (size_t)snprintf(final, sizeof final, "%s/%s", dir, name) >= sizeof final)
    return ps_err_set(eb, -ENAMETOOLONG, "checkpoint %s/%s: path too long", dir, name);

  const ps_layout *l = o->layout;
  const char *stage = "create the directory";
  char *manifest = NULL;
  int made_tmp = 0;
  double t1 = t0;
  shard_rec *recs = calloc((size_t)l->nshards, sizeof *recs);
  if (recs == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "out of memory");
    goto err;
  }
  if ((rc = ps__ckpt_mkdir_p(dir)) != 0) {
    ps_err_set(eb, rc, "%s: %s", dir, strerror(-rc));
    goto err;
  }
  rm_tree(tmp);  /* a leftover of an earlier process that had our pid */
  if (mkdir(tmp, 0755) != 0) {
    rc = ps_err_set(eb, -errno, "%s: %s", tmp, strerror(errno));
    goto err;
  }
  made_tmp = 1;

  stage = "write the shard files";
  for (int i = 0; i < l->nshards; i++) {
    if ((size_t)snprintf(path, sizeof path, "%s/shard-%d.lz4", tmp, i) >= sizeof path) {
      rc = ps_err_set(eb, -ENAMETOOLONG, "%s: path too long", tmp);
      goto err;
    }
    if ((rc = write_shard(path, &o->shards[i], o->filter, &recs[i], eb)) != 0)
      goto err;
  }
  crash_point("shards");

  stage = "write the manifest";
  manifest = build_manifest(o, recs, wall);
  if (manifest == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "out of memory building the manifest");
    goto err;
  }
  if ((size_t)snprintf(path, sizeof path, "%s/" MANIFEST_FILE, tmp) >= sizeof path) {
    rc = ps_err_set(eb, -ENAMETOOLONG, "%s: path too long", tmp);
    goto err;
  }
  {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      rc = ps_err_set(eb, -errno, "%s: %s", path, strerror(errno));
      goto err;
    }
    rc = write_all(fd, manifest, strlen(manifest));
    if (rc == 0)
      rc = write_all(fd, "\n", 1);
    if (rc == 0 && fsync(fd) != 0)
      rc = -errno;
    if (close(fd) != 0 && rc == 0)
      rc = -errno;
    if (rc != 0) {
      ps_err_set(eb, rc, "%s: %s", path, strerror(-rc));
      goto err;
    }
  }
  crash_point("manifest");
  t1 = ps_now_s();

  stage = "fsync the temporary directory";
  if ((rc = fsync_dir(tmp)) != 0) {
    ps_err_set(eb, rc, "%s: %s", tmp, strerror(-rc));
    goto err;
  }
  stage = "rename the checkpoint into place";
  if ((rc = commit_rename(dir, tmp, final, name, eb)) != 0)
    goto err;
  made_tmp = 0;
  crash_point("rename");
  stage = "fsync the checkpoint directory";
  if ((rc = fsync_dir(dir)) != 0) {
    ps_err_set(eb, rc, "%s: %s", dir, strerror(-rc));
    goto err;
  }

  /* Committed.  The index is advisory (find_latest also finds unlisted
   * checkpoints), so failing to rewrite it or to prune is a warning. */
  {
    ps_errbuf why = {0};
    if (retain_impl(dir, o->max_to_keep, o->keep_every_n_hours, name, &why) != 0)
      ps_log(PS_LOG_WARN, "checkpoint %s in %s committed, but the index or retention failed: %s",
             name, dir, why.msg);
  }

  if (st != NULL) {
    memset(st, 0, sizeof *st);
    snprintf(st->name, sizeof st->name, "%s", name);
    for (int i = 0; i < l->nshards; i++) {
      st->raw_bytes += recs[i].raw;
      st->stored_bytes += recs[i].stored;
    }
    double t2 = ps_now_s();
    st->compress_s = t1 - t0;
    st->sync_s = t2 - t1;
    st->total_s = t2 - t0;
  }
  free(manifest);
  free(recs);
  return 0;

err:
  ps_log(PS_LOG_ERROR, "checkpoint %s in %s: %s failed: %s", name, dir, stage,
         eb != NULL ? eb->msg : ps_strerror(rc));
  if (made_tmp)
    rm_tree(tmp);
  free(manifest);
  free(recs);
  return rc;
}

/* ------------------------------------------------------------------ */
/* The index, listing and retention                                   */
/* ------------------------------------------------------------------ */

typedef struct entry_list {
  ps_ckpt_entry *e;
  int n, cap;
} entry_list;

static ps_ckpt_entry *entry_get(entry_list *l, const char *name, uint64_t step) {
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->e[i].name, name) == 0)
      return &l->e[i];
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    ps_ckpt_entry *e = realloc(l->e, (size_t)cap * sizeof *e);
    if (e == NULL)
      return NULL;
    l->e = e;
    l->cap = cap;
  }
  ps_ckpt_entry *e = &l->e[l->n++];
  memset(e, 0, sizeof *e);
  snprintf(e->name, sizeof e->name, "%s", name);
  e->step = step;
  e->time = -1;
  return e;
}

/* The index is advisory (the directories are the truth): a line that does
 * not parse is reported and skipped. */
static int read_index(const char *dir, entry_list *l, ps_errbuf *eb) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/" INDEX_FILE, dir);
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return errno == ENOENT ? 0 : ps_err_set(eb, -errno, "%s: %s", path, strerror(errno));
  char line[256];
  int lineno = 0, rc = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    lineno++;
    line[strcspn(line, "\r\n")] = '\0';
    char name[PS_CKPT_NAME_MAX + 8];
    double t = -1;
    uint64_t step;
    int latest = 0;
    if (sscanf(line, "latest: %39s", name) == 1)
      latest = 1;
    else if (sscanf(line, "kept: %39s %lf", name, &t) != 2 || !isfinite(t) || t < 0)
      name[0] = '\0';
    if (parse_ckpt_name(name, &step) != 0) {
      ps_log(PS_LOG_WARN, "%s:%d: ignoring a line that is neither 'latest: ckpt-<step>' nor "
                          "'kept: ckpt-<step> <unix time>'", path, lineno);
      continue;
    }
    ps_ckpt_entry *e = entry_get(l, name, step);
    if (e == NULL) {
      rc = ps_err_set(eb, -ENOMEM, "out of memory");
      break;
    }
    e->in_index = 1;
    if (latest)
      e->latest = 1;
    else
      e->time = t;
  }
  fclose(f);
  return rc;
}

static int cmp_entry_step(const void *a, const void *b) {
  const ps_ckpt_entry *x = a, *y = b;
  return x->step < y->step ? -1 : x->step > y->step;
}

int ps_ckpt_list(const char *dir, ps_ckpt_entry **out, ps_errbuf *eb) {
  entry_list l = {0};
  *out = NULL;
  int rc = read_index(dir, &l, eb);
  if (rc != 0)
    goto fail;
  DIR *d = opendir(dir);
  if (d == NULL) {
    if (errno == ENOENT)
      goto done;
    rc = ps_err_set(eb, -errno, "%s: %s", dir, strerror(errno));
    goto fail;
  }
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    uint64_t step;
    char path[PATH_MAX];
    struct stat st;
    if (parse_ckpt_name(de->d_name, &step) != 0)
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
      continue;
    ps_ckpt_entry *e = entry_get(&l, de->d_name, step);
    if (e == NULL) {
      closedir(d);
      rc = ps_err_set(eb, -ENOMEM, "out of memory");
      goto fail;
    }
    e->on_disk = 1;
    if (e->time < 0) {
      /* Not in the index: the manifest's time, else the directory's. */
      ps_ckpt c;
      ps_errbuf ignore = {0};
      if (ps_ckpt_open(&c, path, &ignore) == 0)
        e->time = c.wall_time;
      else
        e->time = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
      ps_ckpt_close(&c);
    }
  }
  closedir(d);
done:
  if (l.n > 0)
    qsort(l.e, (size_t)l.n, sizeof *l.e, cmp_entry_step);
  *out = l.e;
  return l.n;
fail:
  free(l.e);
  return rc;
}

/* Newer first: by time, then by step. */
static int newer(const ps_ckpt_entry *a, const ps_ckpt_entry *b) {
  if (a->time != b->time)
    return a->time > b->time;
  return a->step > b->step;
}

static int remove_leftovers(const char *dir, ps_errbuf *eb) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return errno == ENOENT ? 0 : ps_err_set(eb, -errno, "%s: %s", dir, strerror(errno));
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    const char *n = de->d_name;
    if (strncmp(n, TMP_PREFIX "ckpt-", strlen(TMP_PREFIX "ckpt-")) != 0 &&
        strncmp(n, OLD_PREFIX "ckpt-", strlen(OLD_PREFIX "ckpt-")) != 0 &&
        strcmp(n, INDEX_TMP) != 0)
      continue;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, n);
    int r = rm_tree(path);
    if (r != 0 && rc == 0)
      rc = ps_err_set(eb, r, "remove %s: %s", path, strerror(-r));
    else if (r == 0)
      ps_log(PS_LOG_INFO, "checkpoint: removed %s, left by an interrupted write", path);
  }
  closedir(d);
  return rc;
}

static int retain_impl(const char *dir, int64_t max_to_keep, double hours, const char *protect,
                       ps_errbuf *eb) {
  ps_ckpt_entry *e = NULL;
  int n = ps_ckpt_list(dir, &e, eb);
  if (n < 0)
    return n;
  int rc = remove_leftovers(dir, eb);
  int *keep = calloc((size_t)n + 1, sizeof *keep);
  if (keep == NULL) {
    free(e);
    return ps_err_set(eb, -ENOMEM, "out of memory");
  }
  double period = hours * 3600.0;
  int latest = -1;
  for (int i = 0; i < n; i++) {
    if (!e[i].on_disk)
      continue;  /* the index named a missing directory: drop it from the index */
    int newer_count = 0, older_in_window = 0;
    for (int j = 0; j < n; j++) {
      if (j == i || !e[j].on_disk)
        continue;
      if (newer(&e[j], &e[i]))
        newer_count++;
      else if (period > 0 && floor(e[j].time / period) == floor(e[i].time / period))
        older_in_window = 1;
    }
    keep[i] = max_to_keep == 0 || newer_count < max_to_keep ||
              (period > 0 && !older_in_window) ||
              (protect != NULL && strcmp(protect, e[i].name) == 0);
    if (keep[i] && (latest < 0 || newer(&e[i], &e[latest])))
      latest = i;
  }
  if (protect != NULL)
    for (int i = 0; i < n; i++)
      if (keep[i] && strcmp(protect, e[i].name) == 0)
        latest = i;

  /* The index first, so that it never names a directory deleted below. */
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/" INDEX_FILE, dir);
  if (latest < 0) {
    if (unlink(path) == 0)
      fsync_dir(dir);
  } else {
    size_t cap = 64 + (size_t)n * 96, len = 0;  /* a line is at most ~50 bytes */
    char *text = malloc(cap);
    if (text == NULL) {
      free(keep);
      free(e);
      return ps_err_set(eb, -ENOMEM, "out of memory");
    }
    len += (size_t)snprintf(text + len, cap - len, "latest: %s\n", e[latest].name);
    for (int i = 0; i < n; i++)
      if (keep[i])
        len += (size_t)snprintf(text + len, cap - len, "kept: %s %.3f\n", e[i].name, e[i].time);
    const void *bufs[1] = {text};
    int r = write_file_atomic(path, bufs, &len, 1, "index", eb);
    free(text);
    if (r != 0) {
      free(keep);
      free(e);
      return r;
    }
  }
  crash_point("retain");
  for (int i = 0; i < n; i++) {
    if (keep[i] || !e[i].on_disk)
      continue;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, e[i].name);
    int r = rm_tree(p);
    if (r != 0 && rc == 0)
      rc = ps_err_set(eb, r, "remove %s: %s", p, strerror(-r));
    else if (r == 0)
      ps_log(PS_LOG_INFO, "checkpoint: deleted %s (retention)", e[i].name);
  }
  int r = fsync_dir(dir);
  if (rc == 0 && r != 0 && r != -ENOENT)
    rc = ps_err_set(eb, r, "fsync %s: %s", dir, strerror(-r));
  free(keep);
  free(e);
  return rc;
}

int ps_ckpt_retain(const char *dir, int64_t max_to_keep, double keep_every_n_hours,
                   const char *protect, ps_errbuf *eb) {
  if (dir == NULL || max_to_keep < 0 || !(keep_every_n_hours >= 0) ||
      !isfinite(keep_every_n_hours))
    return ps_err_set(eb, PS_EUSAGE, "checkpoint retention: bad arguments");
  return retain_impl(dir, max_to_keep, keep_every_n_hours, protect, eb);
}

/* ------------------------------------------------------------------ */
/* Parsing the manifest                                               */
/* ------------------------------------------------------------------ */

/* What a JSON value is, for messages: `a string "abc"`, `an integer 3`. */
static const char *found(const json_t *v, char *buf, size_t cap) {
  if (v == NULL)
    return "nothing (missing)";
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: snprintf(buf, cap, "a string \"%.40s\"", json_string_value(v)); return buf;
  case JSON_INTEGER:
    snprintf(buf, cap, "an integer %" JSON_INTEGER_FORMAT, json_integer_value(v));
    return buf;
  case JSON_REAL: snprintf(buf, cap, "a number %g", json_real_value(v)); return buf;
  case JSON_TRUE: return "true";
  case JSON_FALSE: return "false";
  case JSON_NULL: return "null";
  }
  return "?";
}

/* The dotted name of a field, for messages: "shards[1].xxh64". */
typedef struct fpath {
  char s[96];
} fpath;

/* Append s to p, cut at the buffer's end: a field name only appears in
 * messages. */
static void fpath_add(fpath *p, const char *s) {
  size_t at = strlen(p->s), n = strlen(s);
  if (n > sizeof p->s - 1 - at)
    n = sizeof p->s - 1 - at;
  memcpy(p->s + at, s, n);
  p->s[at + n] = '\0';
}

static fpath fp(const char *prefix, const char *key) {
  fpath p = {{0}};
  if (prefix != NULL && prefix[0] != '\0') {
    fpath_add(&p, prefix);
    fpath_add(&p, ".");
  }
  fpath_add(&p, key);
  return p;
}

static fpath fpi(const char *prefix, const char *key, size_t i) {
  fpath p = fp(prefix, key);
  char idx[24];
  snprintf(idx, sizeof idx, "[%zu]", i);
  fpath_add(&p, idx);
  return p;
}

static int bad(ps_errbuf *eb, const char *field, const char *expected, const json_t *v) {
  char buf[80];
  return ps_err_set(eb, PS_ECORRUPT, "%s: expected %s, found %s", field, expected,
                    found(v, buf, sizeof buf));
}

static json_t *get_type(json_t *obj, const char *prefix, const char *key, json_type type,
                        const char *expected, ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL || json_typeof(v) != type) {
    bad(eb, fp(prefix, key).s, expected, v);
    return NULL;
  }
  return v;
}

static int get_int(json_t *obj, const char *prefix, const char *key, int64_t lo, int64_t hi,
                   int64_t *out, ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL || !json_is_integer(v) || json_integer_value(v) < lo ||
      json_integer_value(v) > hi) {
    char exp[80];
    snprintf(exp, sizeof exp, "an integer in [%" PRId64 ", %" PRId64 "]", lo, hi);
    return bad(eb, fp(prefix, key).s, exp, v);
  }
  *out = json_integer_value(v);
  return 0;
}

static int get_number(json_t *obj, const char *prefix, const char *key, double lo, double hi,
                      double *out, ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  double d = v != NULL && json_is_number(v) ? json_number_value(v) : NAN;
  if (!(d >= lo && d <= hi)) {
    char exp[80];
    snprintf(exp, sizeof exp, "a number in [%g, %g]", lo, hi);
    return bad(eb, fp(prefix, key).s, exp, v);
  }
  *out = d;
  return 0;
}

static int get_bool(json_t *obj, const char *prefix, const char *key, int *out, ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL || !json_is_boolean(v))
    return bad(eb, fp(prefix, key).s, "true or false", v);
  *out = json_is_true(v);
  return 0;
}

/* A string of 1 to max bytes without control characters. */
static int get_str(json_t *obj, const char *prefix, const char *key, size_t min, size_t max,
                   const char **out, ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  if (v != NULL && json_is_string(v)) {
    const char *s = json_string_value(v);
    size_t n = json_string_length(v), i = 0;
    while (i < n && (unsigned char)s[i] >= 0x20 && s[i] != 0x7f)
      i++;
    if (i == n && n >= min && n <= max) {
      *out = s;
      return 0;
    }
  }
  char exp[80];
  snprintf(exp, sizeof exp, "a string of %zu to %zu printable bytes", min, max);
  return bad(eb, fp(prefix, key).s, exp, v);
}

static int u64_value(const json_t *v, const char *field, uint64_t *out, ps_errbuf *eb) {
  if (v == NULL || !json_is_string(v) || parse_u64_text(json_string_value(v), out) != 0)
    return bad(eb, field, "a decimal u64 in a string", v);
  return 0;
}

static int get_u64(json_t *obj, const char *prefix, const char *key, uint64_t *out,
                   ps_errbuf *eb) {
  return u64_value(json_object_get(obj, key), fp(prefix, key).s, out, eb);
}

static int get_hex64(json_t *obj, const char *prefix, const char *key, uint64_t *out,
                     ps_errbuf *eb) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL || !json_is_string(v) || parse_hex64(json_string_value(v), out) != 0)
    return bad(eb, fp(prefix, key).s, "16 lowercase hex digits in a string", v);
  return 0;
}

/* A list of [u64, u64] pairs. */
static int get_pairs(json_t *obj, const char *prefix, const char *key, uint64_t **out, int *n,
                     ps_errbuf *eb) {
  json_t *a = get_type(obj, prefix, key, JSON_ARRAY, "an array of [u64, u64] pairs", eb);
  if (a == NULL)
    return PS_ECORRUPT;
  size_t len = json_array_size(a);
  if (len > INT_MAX / 2)
    return bad(eb, fp(prefix, key).s, "a shorter array", a);
  *out = calloc(len * 2 + 1, sizeof **out);
  if (*out == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  *n = (int)len;
  for (size_t i = 0; i < len; i++) {
    json_t *p = json_array_get(a, i);
    fpath f = fpi(prefix, key, i);
    if (!json_is_array(p) || json_array_size(p) != 2)
      return bad(eb, f.s, "a pair [\"<u64>\", \"<u64>\"]", p);
    fpath f0 = fp(f.s, "0"), f1 = fp(f.s, "1");
    if (u64_value(json_array_get(p, 0), f0.s, &(*out)[2 * i], eb) != 0 ||
        u64_value(json_array_get(p, 1), f1.s, &(*out)[2 * i + 1], eb) != 0)
      return PS_ECORRUPT;
  }
  return 0;
}

static int parse_optimizer(json_t *root, ps_ckpt *c, ps_errbuf *eb) {
  json_t *o = get_type(root, "", "optimizer", JSON_OBJECT, "an object", eb);
  const char *name;
  if (o == NULL || get_str(o, "optimizer", "name", 1, 15, &name, eb) != 0)
    return PS_ECORRUPT;
  c->optim.lr = 0;
  if (ps_optim_parse(name, &c->optim) != 0)
    return bad(eb, "optimizer.name", "sgd, momentum, nesterov, adagrad or adam",
               json_object_get(o, "name"));
  static const char *const keys[] = {"lr",   "momentum", "weight_decay",       "beta1",
                                     "beta2", "eps",     "initial_accumulator"};
  float *fields[] = {&c->optim.lr,    &c->optim.momentum, &c->optim.weight_decay,
                     &c->optim.beta1, &c->optim.beta2,    &c->optim.eps,
                     &c->optim.initial_accumulator};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    double d;
    if (get_number(o, "optimizer", keys[i], -FLT_MAX, FLT_MAX, &d, eb) != 0)
      return PS_ECORRUPT;
    *fields[i] = (float)d;
  }
  return 0;
}

static int parse_shards(json_t *root, ps_ckpt *c, ps_errbuf *eb) {
  json_t *a = get_type(root, "", "shards", JSON_ARRAY, "an array", eb);
  if (a == NULL)
    return PS_ECORRUPT;
  if (json_array_size(a) != (size_t)c->nshards) {
    char exp[48];
    snprintf(exp, sizeof exp, "an array of nshards (%d) entries", c->nshards);
    return bad(eb, "shards", exp, a);
  }
  c->shards = calloc((size_t)c->nshards, sizeof *c->shards);
  if (c->shards == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  int nslots = ps_optim_nslots(c->optim.kind);
  for (int i = 0; i < c->nshards; i++) {
    json_t *s = json_array_get(a, (size_t)i);
    ps_ckpt_shard *sh = &c->shards[i];
    fpath pre = fpi("", "shards", (size_t)i);
    if (!json_is_object(s))
      return bad(eb, pre.s, "an object", s);
    int64_t v;
    const char *file;
    char want[PS_CKPT_NAME_MAX];
    snprintf(want, sizeof want, "shard-%d.lz4", i);
    if (get_int(s, pre.s, "index", i, i, &v, eb) != 0 ||
        get_str(s, pre.s, "file", 1, PS_CKPT_NAME_MAX - 1, &file, eb) != 0)
      return PS_ECORRUPT;
    if (strcmp(file, want) != 0) {
      char exp[48];
      snprintf(exp, sizeof exp, "\"%s\"", want);
      return bad(eb, fp(pre.s, "file").s, exp, json_object_get(s, "file"));
    }
    snprintf(sh->file, sizeof sh->file, "%s", file);
    sh->index = i;
    if (get_u64(s, pre.s, "version", &sh->version, eb) != 0 ||
        get_u64(s, pre.s, "global_step", &sh->global_step, eb) != 0 ||
        get_int(s, pre.s, "floats", 1, (int64_t)MAX_FLOATS, &v, eb) != 0)
      return PS_ECORRUPT;
    sh->floats = (size_t)v;
    if (get_int(s, pre.s, "nslots", nslots, nslots, &v, eb) != 0)
      return PS_ECORRUPT;
    sh->nslots = (int)v;
    if (get_bool(s, pre.s, "has_accum", &sh->has_accum, eb) != 0 ||
        get_int(s, pre.s, "accum_count", 0, INT_MAX, &v, eb) != 0)
      return PS_ECORRUPT;
    sh->accum_count = (int)v;
    if (get_int(s, pre.s, "target", 0, INT_MAX, &v, eb) != 0)
      return PS_ECORRUPT;
    sh->target = (int)v;
    uint64_t *pairs = NULL;
    int rc = get_pairs(s, pre.s, "once", &pairs, &sh->nonce, eb);
    if (pairs != NULL) {
      sh->once = calloc((size_t)sh->nonce + 1, sizeof *sh->once);
      for (int w = 0; sh->once != NULL && w < sh->nonce; w++)
        sh->once[w] = (ps_ckpt_once){pairs[2 * w], pairs[2 * w + 1]};
      free(pairs);
      if (sh->once == NULL && rc == 0)
        rc = ps_err_set(eb, -ENOMEM, "out of memory");
    }
    if (rc != 0)
      return rc;
    uint64_t raw = (uint64_t)sh->floats * sizeof(float) * (uint64_t)(1 + nslots + sh->has_accum);
    if (get_int(s, pre.s, "compressed_size", 0, JSON_SAFE, &v, eb) != 0)
      return PS_ECORRUPT;
    sh->compressed_size = (uint64_t)v;
    if (get_int(s, pre.s, "uncompressed_size", (int64_t)raw, (int64_t)raw, &v, eb) != 0)
      return PS_ECORRUPT;
    sh->uncompressed_size = raw;
    if (get_hex64(s, pre.s, "xxh64", &sh->xxh64, eb) != 0)
      return PS_ECORRUPT;
  }
  return 0;
}

static int cmp_name_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

typedef struct part_ref {
  int shard;
  size_t off, count;
} part_ref;

static int cmp_part_ref(const void *a, const void *b) {
  const part_ref *x = a, *y = b;
  if (x->shard != y->shard)
    return x->shard < y->shard ? -1 : 1;
  return x->off < y->off ? -1 : x->off > y->off;
}

static int parse_variables(json_t *root, ps_ckpt *c, ps_errbuf *eb) {
  json_t *a = get_type(root, "", "variables", JSON_ARRAY, "an array", eb);
  if (a == NULL)
    return PS_ECORRUPT;
  size_t n = json_array_size(a);
  if (n == 0 || n > INT_MAX / 2)
    return bad(eb, "variables", "a non-empty array", a);
  c->vars = calloc(n, sizeof *c->vars);
  if (c->vars == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  c->nvars = (int)n;
  size_t total = 0, nparts = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *jv = json_array_get(a, i);
    ps_ckpt_var *v = &c->vars[i];
    fpath pre = fpi("", "variables", i);
    if (!json_is_object(jv))
      return bad(eb, pre.s, "an object", jv);
    const char *name, *dtype;
    if (get_str(jv, pre.s, "name", 1, PS_VAR_NAME_MAX - 1, &name, eb) != 0)
      return PS_ECORRUPT;
    snprintf(v->name, sizeof v->name, "%s", name);
    json_t *shape = get_type(jv, pre.s, "shape", JSON_ARRAY, "an array of 1 to 4 dimensions", eb);
    if (shape == NULL)
      return PS_ECORRUPT;
    if (json_array_size(shape) < 1 || json_array_size(shape) > PS_VAR_MAX_DIMS)
      return bad(eb, fp(pre.s, "shape").s, "an array of 1 to 4 dimensions", shape);
    v->ndim = (int)json_array_size(shape);
    uint64_t count = 1;
    for (int d = 0; d < v->ndim; d++) {
      json_t *x = json_array_get(shape, (size_t)d);
      if (!json_is_integer(x) || json_integer_value(x) < 1 ||
          json_integer_value(x) > (json_int_t)UINT32_MAX)
        return bad(eb, fpi(pre.s, "shape", (size_t)d).s, "an integer in [1, 4294967295]", x);
      v->shape[d] = (uint32_t)json_integer_value(x);
      if (count > MAX_FLOATS / v->shape[d])
        return bad(eb, fp(pre.s, "shape").s, "at most 2^48 elements", shape);
      count *= v->shape[d];
    }
    v->count = (size_t)count;
    if (get_str(jv, pre.s, "dtype", 1, 16, &dtype, eb) != 0)
      return PS_ECORRUPT;
    if (strcmp(dtype, "float32") != 0)
      return bad(eb, fp(pre.s, "dtype").s, "\"float32\"", json_object_get(jv, "dtype"));
    int64_t x;
    /* Variables are back to back in the arena, in this order. */
    if (get_int(jv, pre.s, "offset", (int64_t)total, (int64_t)total, &x, eb) != 0 ||
        get_int(jv, pre.s, "count", (int64_t)count, (int64_t)count, &x, eb) != 0)
      return PS_ECORRUPT;
    v->offset = total;
    total += v->count;
    if (total > JSON_SAFE)
      return bad(eb, fp(pre.s, "count").s, "a total below 2^53 elements", json_object_get(jv, "count"));

    json_t *parts = get_type(jv, pre.s, "parts", JSON_ARRAY, "a non-empty array", eb);
    if (parts == NULL)
      return PS_ECORRUPT;
    size_t np = json_array_size(parts);
    if (np == 0 || np > (size_t)INT_MAX)
      return bad(eb, fp(pre.s, "parts").s, "a non-empty array", parts);
    v->parts = calloc(np, sizeof *v->parts);
    if (v->parts == NULL)
      return ps_err_set(eb, -ENOMEM, "out of memory");
    v->nparts = (int)np;
    nparts += np;
    size_t start = 0;
    for (size_t k = 0; k < np; k++) {
      json_t *jp = json_array_get(parts, k);
      fpath pp = fpi(pre.s, "parts", k);
      ps_ckpt_part *p = &v->parts[k];
      if (!json_is_object(jp))
        return bad(eb, pp.s, "an object", jp);
      /* Parts tile the variable in order: each starts where the last ended. */
      if (get_int(jp, pp.s, "shard", 0, c->nshards - 1, &x, eb) != 0)
        return PS_ECORRUPT;
      p->shard = (int)x;
      if (get_int(jp, pp.s, "start", (int64_t)start, (int64_t)start, &x, eb) != 0)
        return PS_ECORRUPT;
      p->start = start;
      if (get_int(jp, pp.s, "count", 1, (int64_t)(v->count - start), &x, eb) != 0)
        return PS_ECORRUPT;
      p->count = (size_t)x;
      size_t fl = c->shards[p->shard].floats;
      if (p->count > fl || get_int(jp, pp.s, "shard_off", 0, (int64_t)(fl - p->count), &x, eb) != 0) {
        if (p->count > fl)
          bad(eb, fp(pp.s, "count").s, "at most the shard's floats", json_object_get(jp, "count"));
        return PS_ECORRUPT;
      }
      p->shard_off = (size_t)x;
      start += p->count;
    }
    if (start != v->count)
      return bad(eb, fp(pre.s, "parts").s, "parts that cover the variable", parts);
  }
  c->total_floats = total;

  /* Unique names. */
  const char **names = malloc(n * sizeof *names);
  if (names == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    names[i] = c->vars[i].name;
  qsort(names, n, sizeof *names, cmp_name_ptr);
  for (size_t i = 1; i < n; i++)
    if (strcmp(names[i - 1], names[i]) == 0) {
      int rc = ps_err_set(eb, PS_ECORRUPT, "variables: the name \"%s\" appears twice", names[i]);
      free(names);
      return rc;
    }
  free(names);

  /* Each shard's parts tile its slice from 0, without gap or overlap. */
  part_ref *refs = malloc(nparts * sizeof *refs);
  if (refs == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  size_t r = 0;
  for (int i = 0; i < c->nvars; i++)
    for (int k = 0; k < c->vars[i].nparts; k++)
      refs[r++] = (part_ref){c->vars[i].parts[k].shard, c->vars[i].parts[k].shard_off,
                             c->vars[i].parts[k].count};
  qsort(refs, nparts, sizeof *refs, cmp_part_ref);
  int rc = 0;
  size_t k = 0;
  for (int s = 0; s < c->nshards && rc == 0; s++) {
    size_t at = 0;
    for (; k < nparts && refs[k].shard == s; k++) {
      if (refs[k].off != at)
        break;
      at += refs[k].count;
    }
    if (at != c->shards[s].floats || (k < nparts && refs[k].shard == s))
      rc = ps_err_set(eb, PS_ECORRUPT,
                      "variables: the parts on shard %d do not tile its %zu floats from 0 "
                      "(a gap or an overlap at float %zu)", s, c->shards[s].floats, at);
  }
  free(refs);
  return rc;
}

static int parse_root(json_t *root, ps_ckpt *c, ps_errbuf *eb) {
  if (!json_is_object(root))
    return bad(eb, "the manifest", "a JSON object", root);
  const char *s;
  int64_t v;
  if (get_str(root, "", "format", 1, 64, &s, eb) != 0)
    return PS_ECORRUPT;
  if (strcmp(s, "paramserv-checkpoint") != 0)
    return bad(eb, "format", "\"paramserv-checkpoint\"", json_object_get(root, "format"));
  json_t *ver = json_object_get(root, "format_version");
  if (ver == NULL || !json_is_integer(ver))
    return bad(eb, "format_version", "an integer", ver);
  if (json_integer_value(ver) != PS_CKPT_FORMAT_VERSION)
    return ps_err_set(eb, PS_EVERSION,
                      "format_version %" JSON_INTEGER_FORMAT " is not supported: this build "
                      "reads version %d",
                      json_integer_value(ver), PS_CKPT_FORMAT_VERSION);
  c->format_version = PS_CKPT_FORMAT_VERSION;
  if (get_u64(root, "", "step", &c->step, eb) != 0 ||
      get_u64(root, "", "global_step", &c->global_step, eb) != 0 ||
      get_number(root, "", "wall_time", 0, 1e12, &c->wall_time, eb) != 0 ||
      get_str(root, "", "cluster_id", 0, sizeof c->cluster_id - 1, &s, eb) != 0)
    return PS_ECORRUPT;
  snprintf(c->cluster_id, sizeof c->cluster_id, "%s", s);
  if (get_str(root, "", "model", 1, sizeof c->model - 1, &s, eb) != 0)
    return PS_ECORRUPT;
  snprintf(c->model, sizeof c->model, "%s", s);
  if (get_hex64(root, "", "layout_hash", &c->layout_hash, eb) != 0 ||
      parse_optimizer(root, c, eb) != 0 || get_str(root, "", "consistency", 1, 8, &s, eb) != 0)
    return PS_ECORRUPT;
  c->consistency = -1;
  for (int i = 0; i < 3; i++)
    if (strcmp(s, consistency_names[i]) == 0)
      c->consistency = i;
  if (c->consistency < 0)
    return bad(eb, "consistency", "async, sync or ssp", json_object_get(root, "consistency"));
  if (get_str(root, "", "filter", 1, 16, &s, eb) != 0)
    return PS_ECORRUPT;
  if (ps_ckpt_filter_parse(s, &c->filter) != 0)
    return bad(eb, "filter", "none or shuffle", json_object_get(root, "filter"));
  if (get_int(root, "", "nshards", 1, PS_LAYOUT_MAX_SHARDS, &v, eb) != 0)
    return PS_ECORRUPT;
  c->nshards = (int)v;
  int rc = parse_shards(root, c, eb);
  if (rc == 0)
    rc = parse_variables(root, c, eb);
  if (rc != 0)
    return rc;
  uint64_t *pairs = NULL;
  rc = get_pairs(root, "", "data_positions", &pairs, &c->nworkers, eb);
  if (pairs != NULL) {
    c->data_pos = calloc((size_t)c->nworkers + 1, sizeof *c->data_pos);
    for (int w = 0; c->data_pos != NULL && w < c->nworkers; w++)
      c->data_pos[w] = (ps_data_pos){pairs[2 * w], pairs[2 * w + 1]};
    free(pairs);
    if (c->data_pos == NULL && rc == 0)
      rc = ps_err_set(eb, -ENOMEM, "out of memory");
  }
  return rc;
}

/* Keep a message one line whatever the input held. */
static void mask_controls(ps_errbuf *eb) {
  if (eb == NULL)
    return;
  for (char *p = eb->msg; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      *p = '?';
}

int ps_ckpt_parse_manifest(const char *json, size_t len, ps_ckpt *out, ps_errbuf *eb) {
  memset(out, 0, sizeof *out);
  json_error_t je;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
  if (root == NULL) {
    int rc = ps_err_set(eb, PS_ECORRUPT, "not valid JSON (line %d column %d: %s)", je.line,
                        je.column, je.text);
    mask_controls(eb);
    return rc;
  }
  int rc = parse_root(root, out, eb);
  json_decref(root);
  if (rc != 0) {
    mask_controls(eb);
    ps_ckpt_close(out);
  }
  return rc;
}

void ps_ckpt_close(ps_ckpt *c) {
  if (c == NULL)
    return;
  for (int i = 0; c->vars != NULL && i < c->nvars; i++)
    free(c->vars[i].parts);
  for (int i = 0; c->shards != NULL && i < c->nshards; i++)
    free(c->shards[i].once);
  free(c->vars);
  free(c->shards);
  free(c->data_pos);
  free(c->path);
  memset(c, 0, sizeof *c);
}

/* ------------------------------------------------------------------ */
/* Reading a checkpoint                                               */
/* ------------------------------------------------------------------ */

static void prefix_msg(ps_errbuf *eb, const char *prefix) {
  if (eb == NULL)
    return;
  char msg[sizeof eb->msg];
  /* Truncation is fine: the message stays one NUL-terminated line. */
  if (snprintf(msg, sizeof msg, "%s: %s", prefix, eb->msg) >= 0)
    memcpy(eb->msg, msg, sizeof msg);
}

int ps_ckpt_open(ps_ckpt *c, const char *path, ps_errbuf *eb) {
  memset(c, 0, sizeof *c);
  char mpath[PATH_MAX];
  if ((size_t)snprintf(mpath, sizeof mpath, "%s/" MANIFEST_FILE, path) >= sizeof mpath)
    return ps_err_set(eb, -ENAMETOOLONG, "%s: path too long", path);
  int fd = open(mpath, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return ps_err_set(eb, -errno, "%s: cannot open: %s", mpath, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MANIFEST_MAX) {
    close(fd);
    return ps_err_set(eb, PS_ECORRUPT, "%s: not a regular file of at most %zu bytes", mpath,
                      MANIFEST_MAX);
  }
  char *text = malloc((size_t)st.st_size + 1);
  if (text == NULL) {
    close(fd);
    return ps_err_set(eb, -ENOMEM, "%s: out of memory", mpath);
  }
  ssize_t n = read_full(fd, text, (size_t)st.st_size);
  close(fd);
  if (n < 0) {
    free(text);
    return ps_err_set(eb, (int)n, "%s: cannot read: %s", mpath, strerror((int)-n));
  }
  int rc = ps_ckpt_parse_manifest(text, (size_t)n, c, eb);
  free(text);
  if (rc != 0) {
    prefix_msg(eb, mpath);
    return rc;
  }
  c->path = strdup(path);
  if (c->path == NULL) {
    ps_ckpt_close(c);
    return ps_err_set(eb, -ENOMEM, "out of memory");
  }
  /* A trailing slash is not part of the name. */
  size_t end = strlen(path);
  while (end > 1 && path[end - 1] == '/')
    end--;
  size_t start = end;
  while (start > 0 && path[start - 1] != '/')
    start--;
  snprintf(c->name, sizeof c->name, "%.*s",
           (int)(end - start < sizeof c->name ? end - start : sizeof c->name - 1), path + start);
  /* A directory named ckpt-<step> holds that step (a renamed copy does not). */
  uint64_t named;
  if (parse_ckpt_name(c->name, &named) == 0 && named != c->step) {
    rc = ps_err_set(eb, PS_ECORRUPT, "%s: the directory is step %" PRIu64 ", the manifest says "
                    "step %" PRIu64, path, named, c->step);
    ps_ckpt_close(c);
    return rc;
  }
  return 0;
}

int ps_ckpt_check_layout(const ps_ckpt *c, uint64_t layout_hash, const char *model,
                         ps_errbuf *eb) {
  if (c->layout_hash == layout_hash && model != NULL && strcmp(c->model, model) == 0)
    return 0;
  return ps_err_set(eb, PS_ELAYOUT,
                    "%s: layout mismatch (checkpoint: model '%s' layout %016" PRIx64
                    "; this cluster: model '%s' layout %016" PRIx64 ")",
                    c->path != NULL ? c->path : c->name, c->model, c->layout_hash,
                    model != NULL ? model : "", layout_hash);
}

/* Decode the LZ4 frame of an open shard file into dst (dsize bytes),
 * undoing the filter. */
static int decode_frame(int fd, const char *path, unsigned char *dst, size_t dsize,
                        ps_ckpt_filter filter, ps_errbuf *eb) {
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
    ssize_t n = read_full(fd, in, IN_CHUNK);
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
      if (scratch != NULL)
        unshuffle(scratch, osz, dst, dsize / sizeof(float), &plane, &uf);
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

int ps_ckpt_read_shard(const ps_ckpt *c, int i, ps_ckpt_shard_data *out, ps_errbuf *eb) {
  memset(out, 0, sizeof *out);
  if (c == NULL || i < 0 || i >= c->nshards)
    return ps_err_set(eb, -EINVAL, "checkpoint: no shard %d", i);
  const ps_ckpt_shard *s = &c->shards[i];
  char path[PATH_MAX];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", c->path != NULL ? c->path : ".", s->file) >=
      sizeof path)
    return ps_err_set(eb, -ENAMETOOLONG, "%s: path too long", s->file);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return ps_err_set(eb, -errno, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int rc = ps_err_set(eb, -errno, "%s: %s", path, strerror(errno));
    close(fd);
    return rc;
  }
  if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != s->compressed_size) {
    close(fd);
    return ps_err_set(eb, PS_ECORRUPT, "%s: size mismatch (file %jd bytes, manifest %" PRIu64
                      " bytes)", path, (intmax_t)st.st_size, s->compressed_size);
  }
  size_t dsize = (size_t)s->uncompressed_size;
  unsigned char *buf = malloc(dsize);
  if (buf == NULL) {
    close(fd);
    return ps_err_set(eb, -ENOMEM, "%s: out of memory for %zu bytes", path, dsize);
  }
  int rc = decode_frame(fd, path, buf, dsize, c->filter, eb);
  close(fd);
  if (rc == 0) {
    uint64_t h = XXH64(buf, dsize, 0);
    if (h != s->xxh64)
      rc = ps_err_set(eb, PS_ECORRUPT, "%s: xxh64 mismatch (file %016" PRIx64 ", manifest %016"
                      PRIx64 ")", path, h, s->xxh64);
  }
  if (rc != 0) {
    free(buf);
    return rc;
  }
  out->buf = (float *)buf;
  out->nfloats = dsize / sizeof(float);
  out->values = out->buf;
  for (int k = 0; k < s->nslots; k++)
    out->slots[k] = out->buf + (size_t)(1 + k) * s->floats;
  if (s->has_accum)
    out->accum = out->buf + (size_t)(1 + s->nslots) * s->floats;
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

int ps_ckpt_read_values(const ps_ckpt *c, float *arena, ps_errbuf *eb) {
  for (int i = 0; i < c->nshards; i++) {
    ps_ckpt_shard_data d;
    int rc = ps_ckpt_read_shard(c, i, &d, eb);
    if (rc != 0)
      return rc;
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

/* ------------------------------------------------------------------ */
/* Finding the newest valid checkpoint                                */
/* ------------------------------------------------------------------ */

int ps_ckpt_find_latest(const char *dir, uint64_t layout_hash, const char *model, ps_ckpt *out,
                        ps_errbuf *eb) {
  memset(out, 0, sizeof *out);
  ps_ckpt_entry *e = NULL;
  int n = ps_ckpt_list(dir, &e, eb);
  if (n < 0)
    return n;
  int found_one = 0;
  for (int i = n - 1; i >= 0 && !found_one; i--) {
    ps_errbuf why = {0};
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, e[i].name);
    if (!e[i].on_disk) {
      ps_err_set(&why, -ENOENT, "listed in the index but its directory is missing");
    } else if (ps_ckpt_open(out, path, &why) == 0) {
      if ((model == NULL || ps_ckpt_check_layout(out, layout_hash, model, &why) == 0) &&
          ps_ckpt_verify(out, &why) == 0)
        found_one = 1;
      else
        ps_ckpt_close(out);
    }
    if (found_one)
      break;
    int prev = i - 1;
    while (prev >= 0 && !e[prev].on_disk)
      prev--;
    ps_log(PS_LOG_WARN, "checkpoint %s skipped: %s; %s%s", e[i].name, why.msg,
           prev >= 0 ? "falling back to " : "no older checkpoint", prev >= 0 ? e[prev].name : "");
  }
  free(e);
  return found_one;
}
