/* Internal to recovery/: the file-system side of a checkpoint directory,
 * its lowest layer: crash-safe writes, the names of its entries
 * (FORMAT.md section 1), the commit (section 5), the index (section 3)
 * read and rewritten, leftovers and deleted checkpoints removed (section
 * 6).  It opens no manifest and decides nothing about what to keep: the
 * manifest (manifest.c) and retention (checkpoint.c) sit above it.  The
 * two calls it implements that are public, ps_ckpt_set_aside and
 * ps_ckpt_dir_writable, are declared in recovery/checkpoint.h. */
#ifndef PS_RECOVERY_COMMIT_H
#define PS_RECOVERY_COMMIT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "recovery/checkpoint.h"

/* Test-only: when PS_CKPT_CRASH_ENV names `stage`, kill this process with
 * SIGKILL, as a crash would. */
void ps__ckpt_crash_point(const char *stage);

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

/* Read until len bytes or the end of the file, retrying EINTR.  @return
 * the bytes read, or -errno. */
ssize_t ps__ckpt_read_full(int fd, void *buf, size_t len);

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

/* The directory holding checkpoint directory `path` (its parent: "." for a
 * bare name, "/" for one at the root) into out (len bytes). */
void ps__ckpt_parent(const char *path, char *out, size_t len);

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

/* What dir holds, without opening a checkpoint: every checkpoint the
 * index (DIR/checkpoint) lists or the directory holds as a ckpt-<step>
 * directory, by step ascending, with `time` the index's (-1 where it gives
 * none: ps_ckpt_list fills it in).  A line of the index that does not
 * parse is logged and skipped; a missing dir has none.  @return the count
 * (>= 0) with *out a malloc'd array to free() (NULL when 0), or -errno /
 * -ENOMEM with a message. */
int ps__ckpt_scan(const char *dir, ps_ckpt_entry **out, ps_errbuf *eb);

/* Rewrite dir's index crash-safely (the temporary checkpoint.tmp-<token>-<pid>)
 * to name e[latest] the latest and list every e[i] with keep[i], with its
 * time; latest < 0: remove the index.  crash_stage (NULL: none) is the
 * test crash point between its fsync and its rename.  @return 0 or -errno
 * with a message. */
int ps__ckpt_write_index(const char *dir, const ps_ckpt_entry *e, int n, const int *keep,
                         int latest, uint64_t token, const char *crash_stage, ps_errbuf *eb);

/* Remove the temporaries in dir that a writer of `token` (and this pid)
 * may remove (ps__ckpt_leftover_removable): never another live chief's
 * write in progress.  Each removal is logged.  @return 0, or the first
 * failure (-errno, with a message); it goes on with the rest. */
int ps__ckpt_remove_leftovers(const char *dir, uint64_t token, ps_errbuf *eb);

/* Delete checkpoint `name` of dir: renamed out of the way
 * (.old-<name>-<token>-<pid>) in one atomic step, then removed, so that a
 * crash in between leaves a leftover the next retention removes, never a
 * half-deleted ckpt-<step>.  @return 0 or -errno (no message). */
int ps__ckpt_delete(const char *dir, const char *name, uint64_t token);

#endif
