/* The file-system side of a checkpoint directory (recovery/FORMAT.md
 * sections 1, 3, 5 and 6): files written under a temporary name and
 * fsynced, the directory's names, checkpoints renamed into place, the index
 * read and rewritten, leftovers and deleted checkpoints removed.  It opens
 * no manifest: what to keep is decided above it (checkpoint.c). */
#include "recovery/commit.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
#include <unistd.h>

#include "common/log.h"
#include "common/parse.h"

#define INDEX_FILE "checkpoint"
#define INDEX_TMP "checkpoint.tmp"    /* checkpoint.tmp-<token>-<pid>: the index being rewritten */
#define TMP_PREFIX ".tmp-"            /* .tmp-ckpt-<step>-<token>-<pid> */
#define OLD_PREFIX ".old-"            /* .old-ckpt-<step>-<token>-<pid>: a replaced checkpoint */

#ifndef PS_RENAME_EXCHANGE
#define PS_RENAME_EXCHANGE (1 << 1) /* linux/fs.h RENAME_EXCHANGE */
#endif
#define PS_RENAME_NOREPLACE (1 << 0)  /* linux/fs.h RENAME_NOREPLACE */
#define UNUSABLE_DIR "unusable"       /* checkpoints set aside (ps_ckpt_set_aside) */

/* ------------------------------------------------------------------ */
/* Crash-safe files                                                   */
/* ------------------------------------------------------------------ */

/* Test-only crash points (PS_CKPT_CRASH_ENV): die as a kill -9 would. */
void ps__ckpt_crash_point(const char *stage) {
  const char *at = getenv(PS_CKPT_CRASH_ENV);
  if (at != NULL && strcmp(at, stage) == 0) {
    ps_log(PS_LOG_WARN, "checkpoint: test crash point '%s': killing this process", stage);
    raise(SIGKILL);
  }
}

int ps__ckpt_write_all(int fd, const void *buf, size_t len) {
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

ssize_t ps__ckpt_read_full(int fd, void *buf, size_t len) {
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

int ps__ckpt_fsync_dir(const char *path) {
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

int ps__ckpt_rm_tree(const char *path) { return rm_tree_at(AT_FDCWD, path); }

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

/* tmp_suffix: the temporary is path.<tmp_suffix>. */
static int write_file_atomic(const char *path, const char *tmp_suffix, const void *const *bufs,
                             const size_t *lens, int n, const char *crash_stage, ps_errbuf *eb) {
  char tmp[PATH_MAX], parent[PATH_MAX];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.%s", path, tmp_suffix) >= sizeof tmp)
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
    rc = ps__ckpt_write_all(fd, bufs[i], lens[i]);
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
    ps__ckpt_crash_point(crash_stage);
  step = "rename";
  if (rename(tmp, path) != 0) {
    rc = -errno;
    goto err;
  }
  step = "fsync the directory of";
  if ((rc = ps__ckpt_fsync_dir(parent)) != 0)
    return ps_err_set(eb, rc, "%s %s: %s", step, path, strerror(-rc));
  return 0;
err:
  unlink(tmp);
  return ps_err_set(eb, rc, "%s %s: %s", step, tmp, strerror(-rc));
}

int ps__ckpt_write_file(const char *path, const void *const *bufs, const size_t *lens, int n,
                        ps_errbuf *eb) {
  return write_file_atomic(path, "tmp", bufs, lens, n, NULL, eb);
}

/* ------------------------------------------------------------------ */
/* Names in a checkpoint directory                                    */
/* ------------------------------------------------------------------ */

void ps__ckpt_name(uint64_t step, char out[PS_CKPT_NAME_MAX]) {
  snprintf(out, PS_CKPT_NAME_MAX, "ckpt-%09" PRIu64, step);
}

void ps__ckpt_parent(const char *path, char *out, size_t len) {
  snprintf(out, len, "%s", path);
  for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--)
    out[n - 1] = '\0';
  char *slash = strrchr(out, '/');
  if (slash == NULL)
    snprintf(out, len, ".");
  else
    *(slash == out ? slash + 1 : slash) = '\0';
}

int ps__ckpt_parse_name(const char *s, uint64_t *step) {
  if (strncmp(s, "ckpt-", 5) != 0)
    return -1;
  const char *d = s + 5;
  size_t n = strlen(d);
  uint64_t v;
  if (n < 9 || n > 20)
    return -1;
  /* The step is zero-padded; a u64 is not.  The padding is checked below. */
  while (d[0] == '0' && d[1] != '\0')
    d++;
  if (ps_parse_u64(d, &v) != 0)
    return -1;
  char canon[PS_CKPT_NAME_MAX];
  ps__ckpt_name(v, canon);
  if (strcmp(canon, s) != 0)
    return -1;
  *step = v;
  return 0;
}

size_t ps__ckpt_tmp_path(char *out, size_t cap, const char *dir, const char *name,
                         uint64_t token) {
  return (size_t)snprintf(out, cap, "%s/" TMP_PREFIX "%s-%" PRIu64 "-%ld", dir, name, token,
                          (long)getpid());
}

/* "<token>-<pid>" and nothing else, both decimal. */
static int parse_owner(const char *s, uint64_t *token, long *pid) {
  const char *dash = strchr(s, '-');
  char tok[32];
  uint64_t p;
  if (dash == NULL || dash == s || (size_t)(dash - s) >= sizeof tok)
    return -1;
  memcpy(tok, s, (size_t)(dash - s));
  tok[dash - s] = '\0';
  if (ps_parse_u64(tok, token) != 0 || ps_parse_u64(dash + 1, &p) != 0 ||
      p > LONG_MAX)
    return -1;
  *pid = (long)p;
  return 0;
}

int ps__ckpt_leftover_removable(const char *name, uint64_t token, long pid) {
  uint64_t their = 0;
  long their_pid = -1;
  const char *rest = NULL;
  if (strncmp(name, INDEX_TMP, strlen(INDEX_TMP)) == 0) {
    rest = name + strlen(INDEX_TMP);
    if (rest[0] == '\0')
      return 1;  /* version 1's shared name: its writer is gone or fenced */
    if (rest[0] != '-' || parse_owner(rest + 1, &their, &their_pid) != 0)
      return -1;
  } else if (strncmp(name, TMP_PREFIX "ckpt-", strlen(TMP_PREFIX "ckpt-")) == 0 ||
             strncmp(name, OLD_PREFIX "ckpt-", strlen(OLD_PREFIX "ckpt-")) == 0) {
    /* ckpt-<step>-<token>-<pid>, or version 1's ckpt-<step>-<pid> (token 0). */
    rest = name + strlen(TMP_PREFIX);
    const char *d1 = strchr(rest, '-');               /* after "ckpt" */
    const char *d2 = d1 != NULL ? strchr(d1 + 1, '-') : NULL;  /* after the step */
    if (d2 == NULL)
      return -1;
    if (strchr(d2 + 1, '-') == NULL) {
      uint64_t p;
      if (ps_parse_u64(d2 + 1, &p) != 0)
        return -1;
      their = 0;
      their_pid = (long)p;
    } else if (parse_owner(d2 + 1, &their, &their_pid) != 0) {
      return -1;
    }
  } else {
    return -1;
  }
  return their < token || (their == token && their_pid == pid);
}

int ps__ckpt_fence(const char *dir, const ps_ckpt_owner *owner, const char *step, ps_errbuf *eb) {
  char why[400] = "";
  if (owner == NULL || owner->fence == NULL || owner->fence(owner->fence_arg, why, sizeof why) == 0)
    return 0;
  return ps_err_set(eb, PS_EFENCED, "fenced: not %s in %s: %s", step, dir, why);
}

/* ------------------------------------------------------------------ */
/* Committing a checkpoint                                            */
/* ------------------------------------------------------------------ */

int ps__ckpt_commit_rename(const char *dir, const char *tmp, const char *final, const char *name,
                           uint64_t token, ps_errbuf *eb) {
  if (rename(tmp, final) == 0)
    return 0;
  if (errno != EEXIST && errno != ENOTEMPTY)
    return ps_err_set(eb, -errno, "rename %s to %s: %s", tmp, final, strerror(errno));
  if (syscall(SYS_renameat2, AT_FDCWD, tmp, AT_FDCWD, final, PS_RENAME_EXCHANGE) == 0) {
    int rc = ps__ckpt_fsync_dir(dir);
    if (rc != 0)
      return ps_err_set(eb, rc, "fsync %s: %s", dir, strerror(-rc));
    ps__ckpt_rm_tree(tmp);  /* now the replaced checkpoint */
    return 0;
  }
  if (errno != EINVAL && errno != ENOSYS)
    return ps_err_set(eb, -errno, "exchange %s with %s: %s", tmp, final, strerror(errno));
  /* No atomic exchange on this file system: move the old one aside first. */
  char old[PATH_MAX];
  snprintf(old, sizeof old, "%s/" OLD_PREFIX "%s-%" PRIu64 "-%ld", dir, name, token,
           (long)getpid());
  ps__ckpt_rm_tree(old);
  if (rename(final, old) != 0)
    return ps_err_set(eb, -errno, "move %s aside: %s", final, strerror(errno));
  if (rename(tmp, final) != 0) {
    int e = errno;
    rename(old, final);  /* put the old one back: the index may name it */
    return ps_err_set(eb, -e, "rename %s to %s: %s", tmp, final, strerror(e));
  }
  int rc = ps__ckpt_fsync_dir(dir);
  if (rc != 0)
    return ps_err_set(eb, rc, "fsync %s: %s", dir, strerror(-rc));
  ps__ckpt_rm_tree(old);
  return 0;
}

/* ------------------------------------------------------------------ */
/* The index and the directory's entries                              */
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
  /* O_NONBLOCK and a regular file only: a FIFO there is refused, never
   * waited on. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return errno == ENOENT ? 0 : ps_err_set(eb, -errno, "%s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ps_err_set(eb, PS_ECORRUPT, "%s: not a regular file: expected the checkpoint index",
                      path);
  }
  FILE *f = fdopen(fd, "r");
  if (f == NULL) {
    close(fd);
    return ps_err_set(eb, -errno, "%s: %s", path, strerror(errno));
  }
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
    if (ps__ckpt_parse_name(name, &step) != 0) {
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

int ps__ckpt_scan(const char *dir, ps_ckpt_entry **out, ps_errbuf *eb) {
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
    if (ps__ckpt_parse_name(de->d_name, &step) != 0)
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

int ps__ckpt_write_index(const char *dir, const ps_ckpt_entry *e, int n, const int *keep,
                         int latest, uint64_t token, const char *crash_stage, ps_errbuf *eb) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/" INDEX_FILE, dir);
  if (latest < 0) {
    if (unlink(path) == 0)
      ps__ckpt_fsync_dir(dir);
    return 0;
  }
  size_t cap = 64 + (size_t)n * 96, len = 0;  /* a line is at most ~50 bytes */
  char *text = malloc(cap);
  if (text == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory");
  len += (size_t)snprintf(text + len, cap - len, "latest: %s\n", e[latest].name);
  for (int i = 0; i < n; i++)
    if (keep[i])
      len += (size_t)snprintf(text + len, cap - len, "kept: %s %.3f\n", e[i].name, e[i].time);
  const void *bufs[1] = {text};
  char suffix[64];
  snprintf(suffix, sizeof suffix, "tmp-%" PRIu64 "-%ld", token, (long)getpid());
  int rc = write_file_atomic(path, suffix, bufs, &len, 1, crash_stage, eb);
  free(text);
  return rc;
}

int ps__ckpt_remove_leftovers(const char *dir, uint64_t token, ps_errbuf *eb) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return errno == ENOENT ? 0 : ps_err_set(eb, -errno, "%s: %s", dir, strerror(errno));
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    const char *n = de->d_name;
    if (ps__ckpt_leftover_removable(n, token, (long)getpid()) != 1)
      continue;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, n);
    int r = ps__ckpt_rm_tree(path);
    if (r != 0 && rc == 0)
      rc = ps_err_set(eb, r, "remove %s: %s", path, strerror(-r));
    else if (r == 0)
      ps_log(PS_LOG_INFO, "checkpoint: removed %s, left by an interrupted write", path);
  }
  closedir(d);
  return rc;
}

int ps__ckpt_delete(const char *dir, const char *name, uint64_t token) {
  char p[PATH_MAX], gone[PATH_MAX];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  snprintf(gone, sizeof gone, "%s/" OLD_PREFIX "%s-%" PRIu64 "-%ld", dir, name, token,
           (long)getpid());
  return rename(p, gone) == 0 ? ps__ckpt_rm_tree(gone) : -errno;
}

/* ------------------------------------------------------------------ */
/* Setting aside, probing                                             */
/* ------------------------------------------------------------------ */

int ps_ckpt_set_aside(const char *dir, const char *name, ps_errbuf *eb) {
  char aside[PATH_MAX], from[PATH_MAX], to[PATH_MAX];
  snprintf(aside, sizeof aside, "%s/" UNUSABLE_DIR, dir);
  if (mkdir(aside, 0755) != 0 && errno != EEXIST)
    return ps_err_set(eb, -errno, "%s: cannot create: %s", aside, strerror(errno));
  snprintf(from, sizeof from, "%s/%s", dir, name);
  for (int k = 0; k < 1000; k++) {
    int len = k == 0 ? snprintf(to, sizeof to, "%s/%s", aside, name)
                     : snprintf(to, sizeof to, "%s/%s.%d", aside, name, k);
    if (len < 0 || (size_t)len >= sizeof to)
      return ps_err_set(eb, -ENAMETOOLONG, "%s/%s: path too long", aside, name);
    /* RENAME_NOREPLACE: never over an earlier one set aside. */
    if (syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, PS_RENAME_NOREPLACE) == 0) {
      ps__ckpt_fsync_dir(aside);
      ps__ckpt_fsync_dir(dir);
      return 0;
    }
    if (errno != EEXIST)
      return ps_err_set(eb, -errno, "move %s to %s: %s", from, to, strerror(errno));
  }
  return ps_err_set(eb, -EEXIST, "move %s into %s: 1000 of that name there already", from, aside);
}

int ps_ckpt_dir_writable(const char *dir, ps_errbuf *eb) {
  int rc = ps__ckpt_mkdir_p(dir);
  if (rc != 0)
    return ps_err_set(eb, rc, "%s: cannot create: %s", dir, strerror(-rc));
  char probe[PATH_MAX];
  if ((size_t)snprintf(probe, sizeof probe, "%s/.probe-%ld", dir, (long)getpid()) >= sizeof probe)
    return ps_err_set(eb, -ENAMETOOLONG, "%s: path too long", dir);
  int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return ps_err_set(eb, -errno, "%s: cannot write a file there: %s", dir, strerror(errno));
  rc = write(fd, "x", 1) == 1 && fsync(fd) == 0 ? 0 : -errno;
  close(fd);
  unlink(probe);
  if (rc != 0)
    return ps_err_set(eb, rc, "%s: cannot write a file there: %s", dir, strerror(-rc));
  return 0;
}
