/* libFuzzer target for the ring's view as Redis holds it (src/ring/view.h):
 * any text is a view or refused; a view's members are in range and
 * ascending, and its text is what it was read from. */
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring/view.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (text == NULL)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  static const int nworkers[] = {1, 3, 64};
  for (size_t k = 0; k < sizeof nworkers / sizeof nworkers[0]; k++) {
    ps_view v;
    if (ps_view_parse(text, nworkers[k], &v) != 0) {
      if (v.n != 0 || v.epoch != 0)
        __builtin_trap();
      continue;
    }
    if (v.epoch == 0 || v.n < 1 || v.n > nworkers[k])
      __builtin_trap();
    /* The same text back from the parsed fields: nothing was skipped. */
    char again[1024];
    size_t at = (size_t)snprintf(again, sizeof again, "%" PRIu64 " ", v.epoch);
    for (int i = 0; i < v.n; i++) {
      if (v.members[i] < 0 || v.members[i] >= nworkers[k] ||
          (i > 0 && v.members[i] <= v.members[i - 1]))
        __builtin_trap();
      at += (size_t)snprintf(again + at, sizeof again - at, "%s%d", i ? "," : "", v.members[i]);
    }
    if (strcmp(again, text) != 0 && strlen(text) < sizeof again - 1) {
      /* Leading zeros ("07 1") read as the same numbers: allowed. */
      if (strchr(text, '0') == NULL)
        __builtin_trap();
    }
  }
  free(text);
  return 0;
}
