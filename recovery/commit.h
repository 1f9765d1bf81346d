/* Internal to recovery/: crash-safe writes and the commit of a checkpoint
 * directory (FORMAT.md section 5), and the names of its entries.  The
 * listing and retention this module also implements are public:
 * ps_ckpt_list and ps_ckpt_retain in recovery/checkpoint.h. */
#ifndef PS_RECOVERY_COMMIT_H
#define PS_RECOVERY_COMMIT_H

#include <stddef.h>
#include <stdint.h>

#include "recovery/checkpoint.h"

/* Test-only: when PS_CKPT_CRASH_ENV names `stage`, kill this process with
 * SIGKILL, as a crash would. */
void ps__ckpt_crash_point(const char *stage);

/* ps_ckpt_retain as a checkpoint's commit runs it: with the crash points
 * "index" and "retain". */
int ps__ckpt_retain_commit(const char *dir, uint64_t layout_hash, const char *model,
                           int64_t max_to_keep, double keep_every_n_hours, const char *protect,
                           const ps_ckpt_owner *owner, ps_errbuf *eb);

/* Run owner's fence (none: pass) before `step` of the commit in dir.
 * @return 0, or PS_EFENCED with "fenced: not <step> in DIR: <why>" in eb
 * (the caller logs it). */
int ps__ckpt_fence(const char *dir, const ps_ckpt_owner *owner, const char *step, ps_errbuf *eb);

/* Is directory entry `name` a temporary of a checkpoint commit, and may a
 * writer with (token, pid) remove it (FORMAT.md section 6)?  @return -1:
 * not a temporary (never removed); 1: its own (same token and pid) or of
 * an older token (a chief that lost its lease can never commit it); 0: a
 * temporary of a newer token, or of the same token and another pid. */
int ps__ckpt_leftover_removable(const char *name, uint64_t token, long pid);

/* Write all len bytes, retrying short writes and EINTR.  @return 0 or
 * -errno. */
int ps__ckpt_write_all(int fd, const void *buf, size_t len);

/* fsync the directory `path`.  @return 0 or -errno. */
int ps__ckpt_fsync_dir(const char *path);

/* rm -rf path.  @return 0 (also when it did not exist) or the first -errno. */
int ps__ckpt_rm_tree(const char *path);

/* Create `path` and its missing parents (mode 0755).  @return 0 or -errno. */
int ps__ckpt_mkdir_p(const char *path);

/* Write len bytes of each of n buffers to `path` crash-safely: path.tmp,
 * write, fsync, rename, fsync the parent.  @return 0 or -errno with a
 * message naming the step. */
int ps__ckpt_write_file(const char *path, const void *const *bufs, const size_t *lens, int n,
                        ps_errbuf *eb);

/* The directory name of a step: "ckpt-%09<step>". */
void ps__ckpt_name(uint64_t step, char out[PS_CKPT_NAME_MAX]);

/* The step a directory name holds.  Only the canonical spelling counts, so
 * that two names never mean one step.  @return 0, or -1 leaving *step. */
int ps__ckpt_parse_name(const char *s, uint64_t *step);

/* The temporary directory a checkpoint `name` is written into before its
 * commit: DIR/.tmp-<name>-<token>-<pid>, into out (cap bytes).  @return the
 * length of the path, as snprintf: cap or more means it was cut. */
size_t ps__ckpt_tmp_path(char *out, size_t cap, const char *dir, const char *name,
                         uint64_t token);

/* Move the complete temporary directory `tmp` to `final` (DIR/<name>).  A
 * checkpoint of the same step can exist (one that was damaged, or of a
 * timeline that was rolled back to an older checkpoint): it is swapped out
 * atomically and removed, so the name never disappears while the index may
 * list it.  @return 0 or -errno with a message naming the step. */
int ps__ckpt_commit_rename(const char *dir, const char *tmp, const char *final, const char *name,
                           uint64_t token, ps_errbuf *eb);

#endif
