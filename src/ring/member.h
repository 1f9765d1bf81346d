/* A worker in ring mode ([cluster] mode = ring): it trains a replica of
 * the whole model, all-reduces each step's gradient with the other members
 * of the current view (ring.h), and applies the mean to its replica.
 * Membership comes from Redis (view.h); a member that breaks the ring is
 * left out of the next view, the interrupted step is redone by the rest,
 * and a member that comes back fetches the state from the member furthest
 * on.  README.md in this directory is the spec. */
#ifndef PS_RING_MEMBER_H
#define PS_RING_MEMBER_H

#include "common/config.h"

/* Run worker `index` of cfg as a ring member until the step limit, the
 * chief's STOP or SIGTERM.  @return the exit status (0, 1, or 2 for a
 * device that cannot be used). */
int ps_ring_member_run(const ps_config *cfg, int index);

#endif
