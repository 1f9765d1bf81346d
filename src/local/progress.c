/* Following the chief's JSON-lines summaries file (jansson). */
#include "local/progress.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void ps_progress_init(ps_progress *s, const char *path, int from_start) {
  memset(s, 0, sizeof *s);
  snprintf(s->path, sizeof s->path, "%s", path);
  struct stat sb;
  if (!from_start && stat(path, &sb) == 0)
    s->off = sb.st_size;
}

/* A member that is a number (integer or real), or `def`. */
static double number(json_t *obj, const char *key, double def) {
  json_t *v = json_object_get(obj, key);
  return json_is_number(v) ? json_number_value(v) : def;
}

/* A step number: an integer-valued member in [0, 2^62], else -1 (a file
 * anyone can write must not make a cast overflow). */
static int64_t step_of(json_t *obj) {
  double v = number(obj, "step", -1);
  return v >= 0 && v <= 4611686018427387904.0 ? (int64_t)v : -1;
}

void ps_progress_line(ps_progress *s, const char *line, size_t len, ps_progress_event_fn on_event,
                      void *arg) {
  json_error_t err;
  json_t *obj = json_loadb(line, len, 0, &err);
  if (!json_is_object(obj)) {
    s->bad_lines++;
    json_decref(obj);
    return;
  }
  s->lines++;
  double t = number(obj, "time", 0);
  int64_t step = step_of(obj);
  json_t *event = json_object_get(obj, "event");
  if (json_is_string(event)) {
    const char *name = json_string_value(event);
    if (strcmp(name, "stop") == 0)
      s->stopped = 1;
    /* A checkpoint or the stop names a step training has reached. */
    if ((strcmp(name, "stop") == 0 || strcmp(name, "checkpoint") == 0) && step > s->step)
      s->step = step;
    if (strcmp(name, "checkpoint") == 0) {
      const char *ckpt = json_string_value(json_object_get(obj, "name"));
      snprintf(s->checkpoint, sizeof s->checkpoint, "%s", ckpt != NULL ? ckpt : "");
      s->checkpoint_step = step;
      s->checkpoints++;
    }
    if (on_event != NULL)
      on_event(arg, name, step, obj);
  }
  if (json_is_number(json_object_get(obj, "steps_per_s")) && step >= 0) {
    if (s->have_progress && t - s->progress_time > s->max_gap) {
      s->max_gap = t - s->progress_time;
      s->max_gap_step = step;
    }
    /* A step lower than the last is a chief restored from an older
     * state: the window starts again. */
    if (s->have_progress && step < s->step)
      s->ring_n = 0;
    s->ring_t[s->ring_at] = t;
    s->ring_step[s->ring_at] = step;
    s->ring_at = (s->ring_at + 1) % 32;
    if (s->ring_n < 32)
      s->ring_n++;
    int oldest = (s->ring_at - s->ring_n + 32) % 32;
    for (int k = 0; k < s->ring_n - 2 && t - s->ring_t[oldest] > 10.0; k++)
      oldest = (oldest + 1) % 32;
    s->rate = t > s->ring_t[oldest] ? (double)(step - s->ring_step[oldest]) / (t - s->ring_t[oldest])
                                    : 0.0;
    s->have_progress = 1;
    s->step = step;
    s->steps_per_s = number(obj, "steps_per_s", 0);
    s->progress_time = t;
  }
  int auc = json_is_number(json_object_get(obj, "auc"));
  if (json_is_number(json_object_get(obj, "accuracy")) || auc) {
    s->have_eval = 1;
    s->have_auc = auc;
    s->eval_step = step;
    s->accuracy = number(obj, "accuracy", 0);
    s->auc = number(obj, "auc", 0);
    s->loss = number(obj, "loss", -1);
    if (step > s->step)
      s->step = step;
  }
  json_decref(obj);
}

void ps_progress_poll(ps_progress *s, ps_progress_event_fn on_event, void *arg) {
  int fd = open(s->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  struct stat sb;
  /* A file that shrank was started again: follow the new one. */
  if (fstat(fd, &sb) == 0 && sb.st_size < s->off)
    s->off = 0;
  char buf[65536];
  for (;;) {
    ssize_t n = pread(fd, buf, sizeof buf, s->off);
    if (n <= 0)
      break;
    char *start = buf, *end = buf + n, *nl;
    while ((nl = memchr(start, '\n', (size_t)(end - start))) != NULL) {
      if (nl > start)
        ps_progress_line(s, start, (size_t)(nl - start), on_event, arg);
      start = nl + 1;
    }
    if (start == buf) {
      /* One line longer than the buffer: no summary is, so skip it. */
      if (n == (ssize_t)sizeof buf) {
        s->off += n;
        s->bad_lines++;
        continue;
      }
      break; /* a partial last line: read again when it is whole */
    }
    s->off += start - buf;
  }
  close(fd);
}
