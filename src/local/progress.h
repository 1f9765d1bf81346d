/* The chief's summaries file (one JSON object a line: progress,
 * evaluations, events) read as it grows, for `paramserv local`'s progress
 * line and its report. */
#ifndef PS_LOCAL_PROGRESS_H
#define PS_LOCAL_PROGRESS_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/config.h"

typedef struct ps_progress {
  char path[PS_CONFIG_PATH_MAX];
  off_t off;                /* read so far (complete lines) */
  int lines, bad_lines;

  /* The latest progress line: {"time", "step", "steps_per_s"}. */
  int have_progress;
  int64_t step;
  double steps_per_s, progress_time;
  /* Steps per second over the last ~10 s of progress lines (the chief's
   * own figure covers only its last interval). */
  double rate;
  double ring_t[32];
  int64_t ring_step[32];
  int ring_n, ring_at;
  /* The largest time between two progress lines, and the step it ended at. */
  double max_gap;
  int64_t max_gap_step;

  /* The latest evaluation: {"time", "step", "loss", "accuracy"}, or for a
   * model with sparse tables {"time", "step", "loss", "auc"} (have_auc). */
  int have_eval, have_auc;
  int64_t eval_step;
  double loss, accuracy;
  double auc;

  int stopped; /* a "stop" event: the chief is ending the run */

  /* The latest checkpoint event. */
  char checkpoint[64];
  int64_t checkpoint_step;
  int checkpoints;
} ps_progress;

/* Called for each line with an "event" member; obj is valid during the
 * call only. */
typedef void (*ps_progress_event_fn)(void *arg, const char *event, int64_t step, json_t *obj);

/* Follow `path` from its current end (from its start when `from_start`):
 * lines of an earlier run in the same file are not this run's. */
void ps_progress_init(ps_progress *s, const char *path, int from_start);

/* Take one line (len bytes, no newline, no NUL needed): what
 * ps_progress_poll does with each.  Anything that is not a JSON object is
 * counted in bad_lines. */
void ps_progress_line(ps_progress *s, const char *line, size_t len, ps_progress_event_fn on_event,
                      void *arg);

/* Read the lines appended since the last call and update *s; lines that
 * are not JSON objects are counted and skipped. */
void ps_progress_poll(ps_progress *s, ps_progress_event_fn on_event, void *arg);

#endif
