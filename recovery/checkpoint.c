/* Checkpoints as a whole (recovery/FORMAT.md, version 2): writing one (its
 * shard files, its manifest, the commit, then retention), listing a
 * directory's, finding the newest valid one, and retention.  It sits on the
 * manifest (manifest.c: ps_ckpt), the shard files (shardfile.c) and the
 * file-system layer (commit.c), and decides what they only carry out: which
 * checkpoint a restore takes, which ones retention keeps. */
#include "recovery/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "recovery/commit.h"
#include "recovery/manifest.h"
#include "recovery/manifest_build.h"
#include "recovery/shardfile.h"

/* ------------------------------------------------------------------ */
/* Listing a directory                                                */
/* ------------------------------------------------------------------ */

int ps_ckpt_list(const char *dir, ps_ckpt_entry **out, ps_errbuf *eb) {
  int n = ps__ckpt_scan(dir, out, eb);
  for (int i = 0; i < n; i++) {
    ps_ckpt_entry *e = &(*out)[i];
    if (!e->on_disk || e->time >= 0)
      continue;
    /* No time in the index: the manifest's, else the directory's. */
    char path[PATH_MAX];
    ps_ckpt c;
    ps_errbuf ignore = {0};
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->name);
    if (ps_ckpt_open(&c, path, &ignore) == 0)
      e->time = c.wall_time;
    else if (stat(path, &st) == 0)
      e->time = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
    ps_ckpt_close(&c);
  }
  return n;
}

/* ------------------------------------------------------------------ */
/* Finding the newest valid checkpoint                                */
/* ------------------------------------------------------------------ */

typedef struct of_layout {
  uint64_t hash;
  const char *model;
} of_layout;

/* This layout's, and whole. */
static int verify_fn(const ps_ckpt *c, void *arg, ps_errbuf *why) {
  const of_layout *l = arg;
  int rc = l->model != NULL ? ps_ckpt_check_layout(c, l->hash, l->model, why) : 0;
  return rc != 0 ? rc : ps_ckpt_verify(c, why);
}

int ps_ckpt_find_latest(const char *dir, uint64_t layout_hash, const char *model, ps_ckpt *out,
                        ps_errbuf *eb) {
  of_layout l = {layout_hash, model};
  return ps_ckpt_find_latest_with(dir, layout_hash, model, verify_fn, &l, out, NULL, eb);
}

int ps_ckpt_find_latest_with(const char *dir, uint64_t layout_hash, const char *model,
                             ps_ckpt_accept_fn accept, void *arg, ps_ckpt *out,
                             ps_ckpt_skipped *skipped, ps_errbuf *eb) {
  memset(out, 0, sizeof *out);
  ps_ckpt_skipped sk = {0};
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
      /* Another model's is passed over; this model's layout is accept's
       * to judge (the chief lays another one out again). */
      if ((model == NULL || strcmp(out->model, model) == 0 ||
           ps_ckpt_check_layout(out, layout_hash, model, &why) == 0) &&
          accept(out, arg, &why) == 0)
        found_one = 1;
      else
        ps_ckpt_close(out);
    }
    if (found_one) {
      sk.below = e[i].step;
      break;
    }
    if (e[i].on_disk && sk.n++ == 0) {
      snprintf(sk.newest, sizeof sk.newest, "%s", e[i].name);
      snprintf(sk.why, sizeof sk.why, "%s", why.msg);
    }
    int prev = i - 1;
    while (prev >= 0 && !e[prev].on_disk)
      prev--;
    ps_log(PS_LOG_WARN, "checkpoint %s skipped: %s; %s%s", e[i].name, why.msg,
           prev >= 0 ? "falling back to " : "no older checkpoint", prev >= 0 ? e[prev].name : "");
  }
  free(e);
  if (skipped != NULL)
    *skipped = sk;
  return found_one;
}

/* ------------------------------------------------------------------ */
/* Retention                                                          */
/* ------------------------------------------------------------------ */

/* By step, the training's own clock: a wall clock stepped back must not
 * make the newest checkpoint look old. */
static int newer(const ps_ckpt_entry *a, const ps_ckpt_entry *b) {
  if (a->step != b->step)
    return a->step > b->step;
  return a->time > b->time;
}

/* Whether checkpoint `name` in dir is of `model` (NULL: every one is),
 * whatever its layout: one taken with another number of shards restores
 * into this cluster (relayout.h), so it counts among this run's. */
static int of_model(const char *dir, const char *name, const char *model) {
  if (model == NULL)
    return 1;
  char path[PATH_MAX], got[256];
  uint64_t hash = 0;
  ps_errbuf why = {0};
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return ps__ckpt_manifest_model(path, &hash, NULL, got, sizeof got, &why) == 0 &&
         strcmp(got, model) == 0;
}

/* Whether checkpoint e reads back whole (ps_ckpt_verify_remembered), asked
 * once per retention (*memo: 0 not asked, 1 valid, -1 damaged); a damaged
 * one is said when this process first finds it so. */
static int is_valid(const char *dir, const ps_ckpt_entry *e, signed char *memo) {
  if (*memo == 0) {
    char path[PATH_MAX];
    ps_ckpt c;
    ps_errbuf why = {0};
    int fresh = 1;
    snprintf(path, sizeof path, "%s/%s", dir, e->name);
    int ok = ps_ckpt_open(&c, path, &why) == 0 && ps_ckpt_verify_remembered(&c, &why, &fresh) == 0;
    ps_ckpt_close(&c);
    if (!ok && fresh)
      ps_log(PS_LOG_WARN, "checkpoint %s is damaged (%s): retention keeps it and does not count it",
             path, why.msg);
    *memo = ok ? 1 : -1;
  }
  return *memo > 0;
}

/* in_write: called by a checkpoint's commit, whose crash points (index,
 * retain) fire here; a retention on its own (the chief's start) has none. */
static int retain_impl(const char *dir, const char *model,
                       int64_t max_to_keep, double hours, const char *protect,
                       const ps_ckpt_owner *owner, int in_write, ps_errbuf *eb) {
  uint64_t token = owner != NULL ? owner->token : 0;
  ps_ckpt_entry *e = NULL;
  int n = ps_ckpt_list(dir, &e, eb);
  if (n < 0)
    return n;
  int rc = ps__ckpt_fence(dir, owner, "removing leftovers", eb);
  if (rc != 0) {
    free(e);
    return rc;
  }
  rc = ps__ckpt_remove_leftovers(dir, token, eb);
  int *keep = calloc(2 * ((size_t)n + 1), sizeof *keep);
  if (keep == NULL) {
    free(e);
    return ps_err_set(eb, -ENOMEM, "out of memory");
  }
  /* Another model's checkpoints, and those whose manifest cannot be read,
   * are kept and left out of the count. */
  int *ours = keep + n + 1;
  for (int i = 0; i < n; i++)
    ours[i] = e[i].on_disk && of_model(dir, e[i].name, model);
  /* Validity is asked only where a deletion depends on it: of the newer
   * ones counted against max_to_keep, of the older one that would take a
   * window's place, and of the one to delete. */
  signed char *valid = calloc((size_t)n + 1, 1);
  if (valid == NULL) {
    free(keep);
    free(e);
    return ps_err_set(eb, -ENOMEM, "out of memory");
  }
  double period = hours * 3600.0;
  int latest = -1;
  for (int i = n - 1; i >= 0; i--) {
    if (!e[i].on_disk)
      continue;  /* the index named a missing directory: drop it from the index */
    keep[i] = 1;
    if (!ours[i] || max_to_keep == 0 || (protect != NULL && strcmp(protect, e[i].name) == 0))
      goto kept;
    int newer_valid = 0;
    for (int j = n - 1; j >= 0 && newer_valid < max_to_keep; j--)
      if (j != i && ours[j] && newer(&e[j], &e[i]) && is_valid(dir, &e[j], &valid[j]))
        newer_valid++;
    if (newer_valid < max_to_keep)
      goto kept;
    if (period > 0) {
      int older_in_window = 0;
      for (int j = 0; j < n && !older_in_window; j++)
        if (j != i && ours[j] && !newer(&e[j], &e[i]) &&
            floor(e[j].time / period) == floor(e[i].time / period) &&
            is_valid(dir, &e[j], &valid[j]))
          older_in_window = 1;
      if (!older_in_window)
        goto kept;
    }
    keep[i] = !is_valid(dir, &e[i], &valid[i]);  /* a damaged one is kept */
  kept:;
  }
  /* A kept incremental checkpoint needs its base, and that one its own:
   * newest first, so a base is marked before its turn comes. */
  for (int i = n - 1; i >= 0; i--) {
    char path[PATH_MAX], base[PS_CKPT_NAME_MAX], got[256];
    uint64_t hash = 0;
    ps_errbuf why = {0};
    if (!keep[i] || !e[i].on_disk)
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e[i].name);
    if (ps__ckpt_manifest_model(path, &hash, base, got, sizeof got, &why) != 0 || !base[0])
      continue;
    for (int j = 0; j < i; j++)
      if (strcmp(e[j].name, base) == 0)
        keep[j] = 1;
  }
  /* The newest kept one not found damaged (a newer one's damage may have
   * been found only while counting for an older one). */
  for (int i = 0; i < n; i++)
    if (e[i].on_disk && keep[i] && ours[i] && valid[i] >= 0 &&
        (latest < 0 || newer(&e[i], &e[latest])))
      latest = i;
  free(valid);
  if (protect != NULL)
    for (int i = 0; i < n; i++)
      if (keep[i] && ours[i] && strcmp(protect, e[i].name) == 0)
        latest = i;

  /* The index first, so that it never names a directory deleted below. */
  int fenced = ps__ckpt_fence(dir, owner, "rewriting the index", eb);
  if (fenced == 0)
    fenced = ps__ckpt_write_index(dir, e, n, keep, latest, token, in_write ? "index" : NULL, eb);
  if (fenced != 0) {
    free(keep);
    free(e);
    return fenced;
  }
  if (in_write)
    ps__ckpt_crash_point("retain");
  for (int i = 0; i < n; i++) {
    if (keep[i] || !e[i].on_disk)
      continue;
    char step[64];
    snprintf(step, sizeof step, "deleting %s (retention)", e[i].name);
    if ((fenced = ps__ckpt_fence(dir, owner, step, eb)) != 0) {
      rc = fenced;
      break;
    }
    int r = ps__ckpt_delete(dir, e[i].name, token);
    if (r != 0 && rc == 0)
      rc = ps_err_set(eb, r, "remove %s/%s: %s", dir, e[i].name, strerror(-r));
    else if (r == 0)
      ps_log(PS_LOG_INFO, "checkpoint: deleted %s (retention)", e[i].name);
  }
  int r = ps__ckpt_fsync_dir(dir);
  if (rc == 0 && r != 0 && r != -ENOENT)
    rc = ps_err_set(eb, r, "fsync %s: %s", dir, strerror(-r));
  free(keep);
  free(e);
  return rc;
}

int ps_ckpt_retain(const char *dir, const char *model, int64_t max_to_keep,
                   double keep_every_n_hours, const char *protect, const ps_ckpt_owner *owner,
                   ps_errbuf *eb) {
  if (dir == NULL || max_to_keep < 0 || !(keep_every_n_hours >= 0) ||
      !isfinite(keep_every_n_hours))
    return ps_err_set(eb, PS_EUSAGE, "checkpoint retention: bad arguments");
  return retain_impl(dir, model, max_to_keep, keep_every_n_hours, protect, owner, 0,
                     eb);
}

/* ------------------------------------------------------------------ */
/* Writing a checkpoint                                               */
/* ------------------------------------------------------------------ */

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
  if (o->network != NULL && strcmp(o->network->desc, o->model) != 0)
    return ps_err_set(eb, PS_EUSAGE, "checkpoint: the network is the model '%s', the model "
                      "text '%s'", o->network->desc, o->model);
  if (o->network != NULL && o->norm != NULL &&
      !(o->norm->divide > 0 && o->norm->std > 0 && isfinite(o->norm->mean) &&
        isfinite(o->norm->divide) && isfinite(o->norm->std)))
    return ps_err_set(eb, PS_EUSAGE, "checkpoint: normalization divide %g mean %g std %g: "
                      "expected finite, divide and std > 0", (double)o->norm->divide,
                      (double)o->norm->mean, (double)o->norm->std);
  const ps_layout *l = o->layout;
  int nslots = ps_optim_nslots(o->optim.kind);
  if (l->nshards < 1)
    return ps_err_set(eb, PS_EUSAGE, "checkpoint: the layout has no shards");
  for (int p = 0; p < l->nparts; p++)
    if (l->parts[p].var < 0 || l->parts[p].var >= o->vars->n)
      return ps_err_set(eb, PS_EUSAGE, "checkpoint: the layout is not of this variable table");
  for (int i = 0; i < l->nshards; i++) {
    const ps_ckpt_shard_state *s = &o->shards[i];
    if (s->nfloats != l->shard_floats[i] || s->nfloats == 0 || s->nfloats > PS_CKPT_MAX_FLOATS)
      return ps_err_set(eb, PS_EUSAGE, "checkpoint: shard %d holds %zu floats, the layout %zu", i,
                        s->nfloats, l->shard_floats[i]);
    const ps_state_info *in = &s->info;
    if (in->nslots != (uint32_t)nslots)
      return ps_err_set(eb, PS_EUSAGE, "checkpoint: shard %d has %" PRIu32 " optimizer slots, %s "
                        "has %d", i, in->nslots, ps_optim_name(&o->optim), nslots);
    if (s->img == NULL || in->has_accum > 1 ||
        in->image_floats != ps_state_image_floats(in, s->nfloats))
      return ps_err_set(eb, PS_EUSAGE, "checkpoint: shard %d: no image, or one of %" PRIu64
                        " floats that its fields do not describe", i, in->image_floats);
  }
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
  ps__ckpt_name(o->step, name);
  uint64_t token = o->owner != NULL ? o->owner->token : 0;
  if (ps__ckpt_tmp_path(tmp, sizeof tmp, dir, name, token) >= sizeof tmp - 32 ||
      (size_t)snprintf(final, sizeof final, "%s/%s", dir, name) >= sizeof final)
    return ps_err_set(eb, -ENAMETOOLONG, "checkpoint %s/%s: path too long", dir, name);

  const ps_layout *l = o->layout;
  const char *stage = "create the directory";
  char *manifest = NULL;
  int made_tmp = 0;
  double t1 = t0;
  ps__ckpt_shard_rec *recs = calloc((size_t)l->nshards, sizeof *recs);
  if (recs == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "out of memory");
    goto err;
  }
  if ((rc = ps__ckpt_mkdir_p(dir)) != 0) {
    ps_err_set(eb, rc, "%s: %s", dir, strerror(-rc));
    goto err;
  }
  ps__ckpt_rm_tree(tmp);  /* a leftover of an earlier process that had our pid */
  if (mkdir(tmp, 0755) != 0) {
    rc = ps_err_set(eb, -errno, "%s: %s", tmp, strerror(errno));
    goto err;
  }
  made_tmp = 1;

  stage = "write the shard files";
  if ((size_t)snprintf(path, sizeof path, "%s/shard-%d.lz4", tmp, l->nshards) >= sizeof path) {
    rc = ps_err_set(eb, -ENAMETOOLONG, "%s: path too long", tmp);
    goto err;
  }
  if ((rc = ps__ckpt_write_shards(tmp, o, recs, eb)) != 0)
    goto err;
  ps__ckpt_crash_point("shards");

  stage = "write the manifest";
  manifest = ps__ckpt_manifest_build(o, recs, wall);
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
    rc = ps__ckpt_write_all(fd, manifest, strlen(manifest));
    if (rc == 0)
      rc = ps__ckpt_write_all(fd, "\n", 1);
    if (rc == 0 && fsync(fd) != 0)
      rc = -errno;
    if (close(fd) != 0 && rc == 0)
      rc = -errno;
    if (rc != 0) {
      ps_err_set(eb, rc, "%s: %s", path, strerror(-rc));
      goto err;
    }
  }
  ps__ckpt_crash_point("manifest");
  t1 = ps_now_s();

  stage = "fsync the temporary directory";
  if ((rc = ps__ckpt_fsync_dir(tmp)) != 0) {
    ps_err_set(eb, rc, "%s: %s", tmp, strerror(-rc));
    goto err;
  }
  stage = "rename the checkpoint into place";
  /* The fence, as late as it can be: a writer that lost its lease must not
   * replace or add what its successor's readers see. */
  if ((rc = ps__ckpt_fence(dir, o->owner, "renaming it into place", eb)) != 0 ||
      (rc = ps__ckpt_commit_rename(dir, tmp, final, name, token, eb)) != 0)
    goto err;
  made_tmp = 0;
  ps__ckpt_crash_point("rename");
  stage = "fsync the checkpoint directory";
  if ((rc = ps__ckpt_fsync_dir(dir)) != 0) {
    ps_err_set(eb, rc, "%s: %s", dir, strerror(-rc));
    goto err;
  }

  /* Committed.  The index is advisory (find_latest also finds unlisted
   * checkpoints), so failing to rewrite it or to prune is a warning.  What
   * was just written from memory counts as verified for the retention. */
  ps__ckpt_note_written(final);
  {
    ps_errbuf why = {0};
    if (retain_impl(dir, o->model, o->max_to_keep, o->keep_every_n_hours, name,
                    o->owner, 1, &why) != 0)
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
    ps__ckpt_rm_tree(tmp);
  free(manifest);
  free(recs);
  return rc;
}
