/* The restore plan (see plan.h). */
#include "recovery/plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"

const char *ps_plan_source_name(ps_plan_source s) {
  switch (s) {
  case PS_PLAN_REDIS: return "redis";
  case PS_PLAN_CHECKPOINT: return "checkpoint";
  case PS_PLAN_INIT: return "init";
  }
  return "unknown";
}

int ps_plan_shard_image(const ps_config *cfg, const ps_layout *layout, const ps_model *model,
                        const ps_ckpt *c, int i, float **img, ps_shard_image_info *info,
                        ps_errbuf *eb) {
  *img = NULL;
  /* A shard of this config, built as the shard process builds it: the
   * image then has exactly the fields the shard expects. */
  ps_shard_opts so = ps_shard_opts_for(cfg, layout, i);
  ps_shard sh;
  if (ps_shard_init(&sh, &so, NULL) != 0)
    return ps_err_set(eb, -ENOMEM, "out of memory for shard %d's state", i);
  int rc = 0;
  if (c == NULL) {
    ps_layout_init_slice(layout, &model->vars, i, (uint64_t)cfg->seed, sh.values);
  } else {
    const ps_ckpt_shard *cs = &c->shards[i];
    ps_ckpt_shard_data d;
    if (cs->nslots != ps_optim_nslots(so.optim.kind) || cs->has_accum != (sh.accum != NULL)) {
      rc = ps_err_set(eb, PS_ELAYOUT,
                      "%s: shard %d has %d optimizer slots and %s accumulator; this cluster's "
                      "optimizer %s in %s mode needs %d and %s",
                      c->name, i, cs->nslots, cs->has_accum ? "a" : "no", cfg->optimizer,
                      cfg->consistency == PS_CONSISTENCY_SYNC ? "sync" : "async/ssp",
                      ps_optim_nslots(so.optim.kind), sh.accum ? "one" : "none");
      goto out;
    }
    if ((rc = ps_ckpt_read_shard(c, i, &d, eb)) != 0)
      goto out;
    memcpy(sh.values, d.values, so.nfloats * sizeof(float));
    for (int k = 0; k < cs->nslots; k++)
      memcpy(sh.slots[k], d.slots[k], so.nfloats * sizeof(float));
    if (sh.accum != NULL)
      memcpy(sh.accum, d.accum, so.nfloats * sizeof(float));
    ps_ckpt_shard_data_close(&d);
    sh.version = cs->version;
    sh.global_step = cs->global_step;
    sh.accum_count = cs->accum_count;
    sh.target = cs->target > 0 ? cs->target : sh.target;
    for (int j = 0; j < so.nworkers && j < cs->nonce; j++) {
      sh.once[j].incarnation = cs->once[j].incarnation;
      sh.once[j].last_seq = cs->once[j].last_seq;
    }
  }
  *info = ps_shard_image_info_of(&sh);
  *img = malloc((size_t)info->image_floats * sizeof(float));
  if (*img == NULL) {
    rc = ps_err_set(eb, -ENOMEM, "out of memory for shard %d's state image", i);
    goto out;
  }
  ps_shard_image_write(&sh, *img);
out:
  ps_shard_close(&sh);
  return rc;
}
