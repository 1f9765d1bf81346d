/* libFuzzer target for the reader of the chief's summaries (what `paramserv
 * local` follows): any line is taken or counted as bad, never a crash, and
 * the figures it keeps stay sane. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "local/progress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int events;
static void on_event(void *arg, const char *event, int64_t step, json_t *obj) {
  (void)arg;
  (void)obj;
  if (event == NULL || step < -1)
    __builtin_trap();
  events++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static ps_progress s;
  memset(&s, 0, sizeof s);
  /* Newline-separated lines, as in the file. */
  const char *p = (const char *)data, *end = p + size;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = (size_t)((nl ? nl : end) - p);
    if (len > 0)
      ps_progress_line(&s, p, len, on_event, NULL);
    p += len + 1;
  }
  if (s.step < -1 || s.ring_n < 0 || s.ring_n > 32 || s.ring_at < 0 || s.ring_at >= 32 ||
      s.checkpoint[sizeof s.checkpoint - 1] != '\0')
    __builtin_trap();
  return 0;
}
