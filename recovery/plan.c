/* The restore plan (see plan.h). */
#include "recovery/plan.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>


const char *ps_plan_source_name(ps_plan_source s) {
  switch (s) {
  case PS_PLAN_REDIS: return "redis";
  case PS_PLAN_CHECKPOINT: return "checkpoint";
  case PS_PLAN_INIT: return "init";
  }
  return "unknown";
}

/* The seeded initialization, through a fresh shard: its slots start at the
 * optimizer's initial values. */
static int seed_image(const ps_config *cfg, const ps_layout *layout, const ps_model *model,
                      const ps_shard_opts *so, int i, float **img, ps_state_info *info,
                      ps_errbuf *eb) {
  float *values = malloc((so->nfloats ? so->nfloats : 1) * sizeof(float));
  ps_shard *sh = NULL;
  if (values != NULL) {
    ps_layout_init_slice(layout, &model->vars, i, (uint64_t)cfg->seed, values);
    sh = ps_shard_new(so, values);
  }
  free(values);
  if (sh != NULL) {
    *info = ps_shard_state_info(sh);
    *img = malloc((size_t)info->image_floats * sizeof(float));
    if (*img != NULL)
      ps_shard_state_write(sh, *img);
  }
  ps_shard_free(sh);
  return *img != NULL ? 0 : ps_err_set(eb, -ENOMEM, "out of memory for shard %d's state", i);
}

int ps_plan_shard_image(const ps_config *cfg, const ps_layout *layout, const ps_model *model,
                        const ps_ckpt *c, int i, float **img, ps_state_info *info,
                        ps_errbuf *eb) {
  *img = NULL;
  /* The shape of a shard of this config, built as the shard process builds
   * it: the image then has exactly the fields the shard expects. */
  ps_shard_opts so = ps_shard_opts_for(cfg, layout, i);
  if (c == NULL)
    return seed_image(cfg, layout, model, &so, i, img, info, eb);
  ps_state_info shape = ps_shard_state_shape(&so);
  const ps_ckpt_shard *cs = &c->shards[i];
  if (cs->floats != so.nfloats)
    return ps_err_set(eb, PS_ELAYOUT, "%s: shard %d holds %zu floats, this cluster's %zu",
                      c->name, i, cs->floats, so.nfloats);
  if (cs->info.nslots != shape.nslots || cs->info.has_accum != shape.has_accum)
    return ps_err_set(eb, PS_ELAYOUT,
                      "%s: shard %d has %" PRIu32 " optimizer slots and %s accumulator; this "
                      "cluster's optimizer %s in %s mode needs %" PRIu32 " and %s",
                      c->name, i, cs->info.nslots, cs->info.has_accum ? "a" : "no",
                      cfg->optimizer, cfg->consistency == PS_CONSISTENCY_SYNC ? "sync" : "async/ssp",
                      shape.nslots, shape.has_accum ? "one" : "none");
  /* The file holds the image's segments, then its table section: it
   * decompresses in place, the table section moves past the manifest's
   * rows, which go in between (rows for workers this cluster lacks
   * dropped). */
  *info = shape;
  ps_state_carry(info, &cs->info);
  info->table_floats = cs->info.table_floats;
  info->image_floats = ps_state_image_floats(info, so.nfloats);
  *img = malloc((size_t)info->image_floats * sizeof(float));
  if (*img == NULL)
    return ps_err_set(eb, -ENOMEM, "out of memory for shard %d's state image", i);
  int rc = ps_ckpt_read_shard_into(c, i, *img, eb);
  if (rc != 0) {
    free(*img);
    *img = NULL;
    return rc;
  }
  memmove(*img + ps_state_tables_at(info, so.nfloats),
          *img + (size_t)ps_state_segments(info) * so.nfloats,
          (size_t)info->table_floats * sizeof(float));
  for (uint32_t j = 0; j < info->nonce; j++)
    ps_state_once_put(info, so.nfloats, *img, j,
                      j < cs->info.nonce ? cs->once[j] : (ps_once){0});
  return 0;
}
