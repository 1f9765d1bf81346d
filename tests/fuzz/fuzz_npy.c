/* libFuzzer target for the .npy reader: any input, as features or as
 * labels, must be accepted or refused cleanly, and an accepted one must
 * describe exactly the input. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const ps_npy_kind kinds[] = {PS_NPY_FEATURES, PS_NPY_LABELS};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    ps_npy h;
    ps_errbuf eb = {0};
    int rc = ps_npy_parse("fuzz", data, size, size, kinds[k], &h, &eb);
    if (rc != 0) {
      /* Errors are one line, carry their code and leave nothing behind. */
      if (eb.code != rc || memchr(eb.msg, '\n', sizeof eb.msg) != NULL || h.count != 0 ||
          h.ndim != 0)
        __builtin_trap();
      continue;
    }
    /* A success: the header and the data are the whole input. */
    uint64_t count = 1;
    for (int d = 0; d < h.ndim; d++)
      count *= h.shape[d];
    if (h.ndim < 1 || h.shape[0] == 0 || count != h.count || h.offset > size ||
        h.offset + h.count * h.itemsize != size)
      __builtin_trap();
    /* The values: converted, or refused in one line. */
    const uint8_t *payload = data + h.offset;
    ps_errbuf vb = {0};
    if (kinds[k] == PS_NPY_LABELS) {
      uint8_t *out = malloc(h.count);
      int top = -1;
      if (out == NULL)
        return 0;
      if (ps_npy_labels("fuzz", &h, payload, out, &top, &vb) == 0) {
        for (uint64_t i = 0; i < h.count; i++)
          if (out[i] > top)
            __builtin_trap();
      } else if (vb.code != PS_EFORMAT || memchr(vb.msg, '\n', sizeof vb.msg) != NULL) {
        __builtin_trap();
      }
      free(out);
    } else {
      float *out = malloc(h.count * sizeof *out);
      if (out == NULL)
        return 0;
      if (ps_npy_features("fuzz", &h, payload, out, &vb) == 0) {
        for (uint64_t i = 0; i < h.count; i++)
          if (!isfinite(out[i]))
            __builtin_trap();
      } else if (vb.code != PS_EFORMAT || memchr(vb.msg, '\n', sizeof vb.msg) != NULL) {
        __builtin_trap();
      }
      free(out);
    }
  }
  return 0;
}
