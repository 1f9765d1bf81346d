/* Checkpoints of one process that trains alone (`paramserv train
 * --checkpoint-dir`): the format of recovery/FORMAT.md, written and read
 * through ps_ckpt_write and ps_ckpt_find_latest_with, with one shard that
 * holds the whole model in table order (the layout a ring member has:
 * src/layout/LAYOUT.md section 5), the optimizer's slots beside the values,
 * and one data position. */
#ifndef PS_RECOVERY_SOLO_H
#define PS_RECOVERY_SOLO_H

#include <stddef.h>
#include <stdint.h>

#include "recovery/checkpoint.h"

typedef struct ps_solo {
  const char *dir;          /* borrowed */
  const ps_model *model;    /* borrowed */
  ps_optim optim;
  int64_t keep;             /* max_to_keep */
  ps_layout layout;         /* a one-shard cluster's default: parts in table order */
  ps_state_info info;       /* of the image: nslots, no accumulator, no rows */
  float *img;               /* values, then each slot: (1 + nslots) x total floats */
  ps_data_norm norm;        /* what the inputs were fed as: PS_DATA_NORM (ps_solo_open), or
                             * PS_DATA_NORM_NONE for the user's own data (npy) */
} ps_solo;

/* Set up checkpoints of `m` trained with optimizer `o` in dir: the layout,
 * the image, and dir created if missing and checked writable.  @return 0,
 * or -errno / -ENOMEM with one line naming dir.  Free with ps_solo_close. */
int ps_solo_open(ps_solo *s, const char *dir, const ps_model *m, const ps_optim *o, int64_t keep,
                 ps_errbuf *eb);
void ps_solo_close(ps_solo *s);

/* The image's values (the parameters, m->vars.total floats) and slot k:
 * what ps_solo_write writes and ps_solo_resume fills. */
float *ps_solo_values(ps_solo *s);
float *ps_solo_slot(ps_solo *s, int k);

/* Resume from dir's newest checkpoint: it must be of this model (model text
 * and layout) and this optimizer (its slots), and verify; its values and
 * slots are then in the image, its step in *step, its data position in
 * *pos, its name in name.  @return 1 resumed; 0 dir holds no checkpoint;
 * PS_ELAYOUT (checkpoints of another model or optimizer, or damaged: one
 * line naming the newest and why; nothing is changed in dir) or -errno /
 * -ENOMEM with one line. */
int ps_solo_resume(ps_solo *s, uint64_t *step, ps_data_pos *pos, char name[PS_CKPT_NAME_MAX],
                   ps_errbuf *eb);

/* Write checkpoint `step` (DIR/ckpt-<step>) of the image with data position
 * pos, then retention (keep).  @return as ps_ckpt_write. */
int ps_solo_write(ps_solo *s, uint64_t step, ps_data_pos pos, ps_ckpt_write_stats *st,
                  ps_errbuf *eb);

/* Warm start: checkpoint c's values (every shard file read and verified)
 * into params (m->vars.total floats), when c's variables are m's (names,
 * shapes, order: the model may differ elsewhere, as a dropout rate).
 * @return 0, or PS_EUSAGE (other variables) / the shard files' errors, with
 * one line naming the checkpoint. */
int ps_solo_init_from(const ps_ckpt *c, const ps_model *m, float *params, ps_errbuf *eb);

#endif
