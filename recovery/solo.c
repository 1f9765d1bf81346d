/* Checkpoints of one process that trains alone (see solo.h). */
#include "recovery/solo.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int ps_solo_open(ps_solo *s, const char *dir, const ps_model *m, const ps_optim *o, int64_t keep,
                 ps_errbuf *eb) {
  memset(s, 0, sizeof *s);
  s->dir = dir;
  s->model = m;
  s->optim = *o;
  s->keep = keep;
  s->norm = PS_DATA_NORM;
  /* The layout of a one-shard cluster with the default [layout] (greedy,
   * split auto: never, for one shard), which is a ring's too: their chiefs
   * restore these checkpoints and this run resumes from theirs.  One shard
   * holds its parts in (var, start) order (LAYOUT.md), so its values are
   * the parameters' arena as it is. */
  ps_errbuf why = {0};
  int rc = ps_layout_build(&m->vars, m->spec.desc, 1, PS_LAYOUT_GREEDY, SIZE_MAX, &s->layout,
                           &why);
  if (rc != 0)
    return ps_err_set(eb, rc, "%s: %s", dir, why.msg);
  for (int i = 0; i < s->layout.nparts; i++) {
    const ps_part *p = &s->layout.parts[i];
    if (p->shard_off != m->vars.vars[p->var].offset + p->start) {
      ps_layout_close(&s->layout);
      return ps_err_set(eb, PS_ELAYOUT, "%s: the one-shard layout is not in table order",
                        dir);
    }
  }
  size_t n = m->vars.total;
  s->info = (ps_state_info){.nslots = (uint32_t)ps_optim_nslots(o->kind)};
  s->info.image_floats = ps_state_floats(n, s->info.nslots, 0, 0);
  s->img = calloc((size_t)s->info.image_floats, sizeof *s->img);
  if (s->img == NULL) {
    ps_solo_close(s);
    return ps_err_set(eb, -ENOMEM, "out of memory for a checkpoint of %zu floats",
                      (size_t)s->info.image_floats);
  }
  if ((rc = ps_ckpt_dir_writable(dir, eb)) != 0) {
    ps_solo_close(s);
    return rc;
  }
  return 0;
}

void ps_solo_close(ps_solo *s) {
  if (s == NULL)
    return;
  free(s->img);
  ps_layout_close(&s->layout);
  memset(s, 0, sizeof *s);
}

float *ps_solo_values(ps_solo *s) { return s->img; }

float *ps_solo_slot(ps_solo *s, int k) {
  return ps_state_segment(s->img, s->model->vars.total, (uint32_t)(1 + k));
}

/* What keeps this run from going on from checkpoint c. */
enum { FITS = 0, OTHER_MODEL, OTHER_OPTIMIZER };

/* Can this run go on from checkpoint c: this model and layout, one shard of
 * this optimizer's slots and no accumulator?  @return FITS, or what
 * differs with the particulars in why. */
static int fits(const ps_solo *s, const ps_ckpt *c, ps_errbuf *why) {
  if (c->layout_hash != s->layout.hash || strcmp(c->model, s->model->spec.desc) != 0) {
    ps_err_set(why, PS_ELAYOUT, "'%s', layout %016" PRIx64 "; this run's '%s', layout %016"
               PRIx64, c->model, c->layout_hash, s->model->spec.desc, s->layout.hash);
    return OTHER_MODEL;
  }
  if (c->nshards != 1 || c->shards[0].info.has_accum ||
      c->shards[0].info.nslots != s->info.nslots) {
    ps_err_set(why, PS_ELAYOUT, "%s on %d shard%s%s; this run trains with %s on one shard",
               ps_optim_name(&c->optim), c->nshards, c->nshards == 1 ? "" : "s",
               c->shards[0].info.has_accum ? " (sync)" : "", ps_optim_name(&s->optim));
    return OTHER_OPTIMIZER;
  }
  return FITS;
}

/* A candidate that fits is verified as its file is read into the image. */
static int accept(const ps_ckpt *c, void *arg, ps_errbuf *why) {
  ps_solo *s = arg;
  return fits(s, c, why) != FITS ? PS_ELAYOUT : ps_ckpt_read_shard_into(c, 0, s->img, why);
}

int ps_solo_resume(ps_solo *s, uint64_t *step, ps_data_pos *pos, char name[PS_CKPT_NAME_MAX],
                   ps_errbuf *eb) {
  const char *model = s->model->spec.desc;
  ps_ckpt_entry *e = NULL;
  int n = ps_ckpt_list(s->dir, &e, eb);
  if (n <= 0)
    return n;
  /* A newest of another model or optimizer is said at once, in one line:
   * nothing of this run can go beside it (the chief refuses the same way).
   * One whose manifest cannot be read is the search's to say. */
  int rc = 0;
  for (int i = n - 1; i >= 0; i--) {
    if (!e[i].on_disk)
      continue;
    char path[PATH_MAX];
    ps_ckpt c;
    ps_errbuf why = {0};
    snprintf(path, sizeof path, "%s/%s", s->dir, e[i].name);
    if (ps_ckpt_open(&c, path, &why) == 0) {
      int f = fits(s, &c, &why);
      if (f != FITS)
        rc = ps_err_set(eb, PS_ELAYOUT, "%s holds checkpoints of another %s (the newest, %s: "
                        "%s): refusing to train beside them; give this run another "
                        "--checkpoint-dir", s->dir, f == OTHER_MODEL ? "model" : "optimizer",
                        e[i].name, why.msg);
      ps_ckpt_close(&c);
    }
    break;
  }
  free(e);
  if (rc != 0)
    return rc;
  ps_ckpt c;
  ps_ckpt_skipped sk;
  int found = ps_ckpt_find_latest_with(s->dir, s->layout.hash, model, accept, s, &c, &sk, eb);
  if (found < 0)
    return found;
  if (sk.n > 0) {
    /* Newer than what could be resumed, or all there is: never trained
     * over nor beside without a word. */
    if (found)
      ps_ckpt_close(&c);
    return ps_err_set(eb, PS_ELAYOUT, "%s holds %d checkpoint%s this run cannot resume (the "
                      "newest, %s: %s): refusing to train beside %s; move %s away or give this "
                      "run another --checkpoint-dir", s->dir, sk.n, sk.n == 1 ? "" : "s",
                      sk.newest, sk.why, sk.n == 1 ? "it" : "them", sk.n == 1 ? "it" : "them");
  }
  if (!found)
    return 0;
  *step = c.step;
  *pos = c.nworkers > 0 ? c.data_pos[0] : (ps_data_pos){0, 0};
  snprintf(name, PS_CKPT_NAME_MAX, "%s", c.name);
  ps_ckpt_close(&c);
  return 1;
}

int ps_solo_write(ps_solo *s, uint64_t step, ps_data_pos pos, ps_ckpt_write_stats *st,
                  ps_errbuf *eb) {
  ps_state_info in = s->info;
  in.version = step;
  in.global_step = step;
  ps_ckpt_shard_state shard = {.nfloats = s->model->vars.total, .info = in, .img = s->img};
  ps_data_norm norm = s->norm;
  ps_ckpt_write_opts o = {
      .step = step,
      .cluster_id = "train",
      .model = s->model->spec.desc,
      .vars = &s->model->vars,
      .layout = &s->layout,
      .optim = s->optim,
      .consistency = 0, /* async: one process, no accumulator */
      .filter = PS_CKPT_FILTER_SHUFFLE,
      .shards = &shard,
      .nworkers = 1,
      .data_pos = &pos,
      .global_step = step,
      .network = s->model->nlayers > 0 ? &s->model->spec : NULL,
      .norm = &norm,
      .max_to_keep = s->keep,
  };
  return ps_ckpt_write(s->dir, &o, st, eb);
}

int ps_solo_init_from(const ps_ckpt *c, const ps_model *m, float *params, ps_errbuf *eb) {
  int rc = ps_ckpt_check_vars(c, &m->vars, eb);
  return rc != 0 ? rc : ps_ckpt_read_values(c, params, eb);
}
