/* The chief's JSON-lines summaries (see summary.h), written with jansson. */
#include "chief/summary.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/log.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ps_summary_open(ps_summary *s, const char *path) {
  memset(s, 0, sizeof *s);
  snprintf(s->path, sizeof s->path, "%s", path);
  /* The directory: every parent, as mkdir -p. */
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  for (char *p = dir + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      mkdir(dir, 0755);
      *p = '/';
    }
  s->f = fopen(path, "a");
  if (s->f == NULL)
    return -errno;
  setvbuf(s->f, NULL, _IOLBF, 0);
  return 0;
}

void ps_summary_close(ps_summary *s) {
  if (s->f != NULL)
    fclose(s->f);
  s->f = NULL;
}

static void emit(ps_summary *s, json_t *o) {
  if (o == NULL)
    return;
  if (s->f != NULL && json_dumpf(o, s->f, JSON_COMPACT | JSON_REAL_PRECISION(15)) == 0) {
    fputc('\n', s->f);
    fflush(s->f);
  }
  json_decref(o);
}

void ps_summary_progress(ps_summary *s, uint64_t step, double steps_per_s) {
  emit(s, json_pack("{s:f, s:I, s:f}", "time", now_s(), "step", (json_int_t)step, "steps_per_s",
                    steps_per_s));
}

void ps_summary_eval(ps_summary *s, uint64_t step, double loss, double accuracy) {
  emit(s, json_pack("{s:f, s:I, s:f, s:f}", "time", now_s(), "step", (json_int_t)step, "loss",
                    loss, "accuracy", accuracy));
}

void ps_summary_eval_auc(ps_summary *s, uint64_t step, double logloss, double auc) {
  emit(s, json_pack("{s:f, s:I, s:f, s:f}", "time", now_s(), "step", (json_int_t)step, "loss",
                    logloss, "auc", auc));
}

void ps_summary_event(ps_summary *s, uint64_t step, const char *event, const char *fmt, ...) {
  json_t *o = json_pack("{s:f, s:I, s:s}", "time", now_s(), "step", (json_int_t)step, "event",
                        event);
  if (o != NULL && fmt != NULL) {
    va_list ap;
    va_start(ap, fmt);
    json_t *extra = json_vpack_ex(NULL, 0, fmt, ap);
    va_end(ap);
    if (extra != NULL)
      json_object_update(o, extra);
    json_decref(extra);
  }
  emit(s, o);
}
