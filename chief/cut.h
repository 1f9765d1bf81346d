/* A checkpoint as the chief takes it: a consistent cut of every shard
 * (CUT to all, RESUME to all once all have copied: PROTOCOL.md "The
 * chief"), the copies fetched while training goes on, then written as a
 * checkpoint (recovery/checkpoint.h) on any thread, after a check that
 * every weight is finite. */
#ifndef PS_CHIEF_CUT_H
#define PS_CHIEF_CUT_H

#include <stdint.h>

#include "common/config.h"
#include "data/sampler.h"
#include "layout/layout.h"
#include "nn/model.h"
#include "ps/shard.h"
#include "recovery/checkpoint.h"
#include "worker/control.h"

/* What a cut needs: the cluster, how to call the shards (the chief's
 * call renews its lease between requests), and how to read the workers'
 * data positions while the shards hold their pushes. */
typedef struct ps_cut_env {
  const ps_config *cfg;
  ps_client *client;
  const ps_layout *layout;
  const ps_model *model;
  const char *model_text;
  int (*call)(void *arg, ps_msg *reqs, ps_client_reply_fn fn, void *fn_arg);
  void *call_arg;
  /* Fill pos[0..nworkers) from Redis.  @return 0, or -1 with a reason
   * naming the worker in why (a missing position, Redis away). */
  int (*positions)(void *arg, ps_data_pos *pos, char *why, size_t len);
  void *positions_arg;
  /* Names the temporaries and fences the commit (on the writer's thread). */
  const ps_ckpt_owner *owner;
  /* Incremental checkpoints: the writer's chain (NULL: every one full). */
  ps_ckpt_chain *chain;
  /* Test-only, 0 otherwise: wait this long after the CUT replies, as a
   * slow link would ($PS_TEST_CUT_DELAY_MS). */
  int test_delay_ms;
  /* The largest shard image (floats) a CUT reply announced so far: the
   * next cut's hold_ms grows with it (ps_cut_hold_ms).  Updated by
   * ps_cut_take. */
  uint64_t largest_image;
  /* After a cut that failed or came back too late: twice the hold it had
   * (a first cut knows no image yet; a shard may be busy longer than its
   * size says).  0 after a cut that worked.  Updated by ps_cut_take. */
  int retry_hold_ms;
} ps_cut_env;

/* The hold_ms of the next cut: 2000 ms, plus 1 ms per 150 KB of the
 * largest image seen, or retry_hold_ms when larger (a shard copies its image on the loop that answers
 * the CUT, and may be copying one for Redis when the CUT comes: at 5
 * million rows a shard, 750 MB, its replies took up to 2.2 s on 2 cores
 * under faults, past the 1.5 s of a fixed 2000), at most 60 s.  A chief
 * that dies mid-cut stalls training that long. */
int ps_cut_hold_ms(const ps_cut_env *env);

/* The chief accepts a cut only if every CUT reply came back within
 * ps_cut_deadline_ms(hold_ms) of sending the CUTs: a shard resumes by
 * itself hold_ms after it received its CUT, so none has before then
 * (PROTOCOL.md, "A consistent cut").  hold_ms - hold_ms / 4. */
int64_t ps_cut_deadline_ms(int hold_ms);

/* One cut: it owns the copies. */
typedef struct ps_cut {
  const ps_cut_env *env;
  uint64_t step;                                  /* shard 0's global step at the cut */
  float *img[PS_CONFIG_MAX_NODES];                /* each shard's state image */
  ps_state_info info[PS_CONFIG_MAX_NODES];
  ps_data_pos pos[PS_CONFIG_MAX_NODES];           /* the workers', read at the cut */
  double stall_ms;                                /* first CUT sent to last RESUME answered */
  double fetch_s;
  /* Results of ps_cut_write. */
  int rc;
  char err[1024];
  char nonfinite[256];                            /* set: not written */
  ps_ckpt_write_stats st;
} ps_cut;

/* Cut every shard (cut_id new for each cut), read the workers' data
 * positions while they hold pushes, resume them, and fetch the copies.
 * @return the cut, or NULL (one warning logged: a shard failed or
 * reconnected during it, a CUT reply came after ps_cut_deadline_ms, a
 * worker's position is missing; try again later).  Every shard is sent
 * RESUME whatever happened. */
ps_cut *ps_cut_take(ps_cut_env *env, uint64_t cut_id, int hold_ms);

/* Write the cut as checkpoint cut->step into [checkpoint] dir, unless some
 * weight is NaN or Inf (then cut->nonfinite says where and nothing is
 * written).  Results in cut->rc, err, st.  Any thread. */
void ps_cut_write(ps_cut *cut);

void ps_cut_free(ps_cut *cut);

/* The first non-finite value of v[0..n) as "NaN in shard S at element I"
 * (shard < 0: "... of the model") in what.  @return 1 if found. */
int ps_find_nonfinite(const float *v, size_t n, int shard, char *what, size_t len);

#endif
