/* The restore plan: where each shard's first state comes from.  A shard
 * that restored itself from its Redis replica keeps it; one that holds no
 * state gets the newest valid checkpoint's slice, or else the seeded
 * initialization, as a state image (ps/shard.h) that the chief LOADs. */
#ifndef PS_RECOVERY_PLAN_H
#define PS_RECOVERY_PLAN_H

#include "common/config.h"
#include "layout/layout.h"
#include "nn/model.h"
#include "paramserv/error.h"
#include "ps/shard.h"
#include "recovery/checkpoint.h"

typedef enum ps_plan_source {
  PS_PLAN_REDIS = 0,     /* the shard restored its replica itself */
  PS_PLAN_CHECKPOINT,    /* the newest valid checkpoint */
  PS_PLAN_INIT,          /* the model's seeded initializers */
} ps_plan_source;

/* "redis", "checkpoint", "init". */
const char *ps_plan_source_name(ps_plan_source s);

/* Shard i's state image from checkpoint `c` (NULL: the seeded
 * initialization, version 0): *img is malloc'd (the caller frees it) and
 * *info describes it.  The checkpoint must be of this layout (see
 * ps_ckpt_check_layout) and of an optimizer with as many slots as the
 * config's.  @return 0, PS_ELAYOUT (another optimizer or consistency mode,
 * message naming both), the errors of ps_ckpt_read_shard, or -ENOMEM. */
int ps_plan_shard_image(const ps_config *cfg, const ps_layout *layout, const ps_model *model,
                        const ps_ckpt *c, int i, float **img, ps_state_info *info,
                        ps_errbuf *eb);

#endif
