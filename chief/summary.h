/* The chief's summaries: one JSON object per line, appended to a file,
 * for plots and dashboards.  Lines (every one has "time", unix seconds):
 *   {"time", "step", "steps_per_s"}                  progress
 *   {"time", "step", "loss", "accuracy"}             an evaluation
 *   {"time", "step", "event", ...}                   restore (source),
 *       checkpoint (name, stall_ms, write_s, mb), node_lost / node_back
 *       (node), stop, nan (reason), chief (token: a chief took the lease) */
#ifndef PS_CHIEF_SUMMARY_H
#define PS_CHIEF_SUMMARY_H

#include <stdint.h>
#include <stdio.h>

typedef struct ps_summary {
  FILE *f;
  char path[4096];
} ps_summary;

/* Open `path` for appending (its directory is created).  @return 0 or
 * -errno (the chief then runs without summaries, saying so). */
int ps_summary_open(ps_summary *s, const char *path);
void ps_summary_close(ps_summary *s);

void ps_summary_progress(ps_summary *s, uint64_t step, double steps_per_s);
void ps_summary_eval(ps_summary *s, uint64_t step, double loss, double accuracy);
/* A model with sparse tables: its test log loss and AUC ("loss", "auc"). */
void ps_summary_eval_auc(ps_summary *s, uint64_t step, double logloss, double auc);
/* An event with extra fields as jansson json_pack pairs, e.g.
 * ps_summary_event(s, 400, "checkpoint", "{s:s, s:f}", "name", n, "stall_ms", ms);
 * fmt NULL: none. */
void ps_summary_event(ps_summary *s, uint64_t step, const char *event, const char *fmt, ...);

#endif
