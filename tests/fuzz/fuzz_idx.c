/* libFuzzer target for the IDX parser: any input must be accepted or refused cleanly. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "data/idx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* Labels and images are the two shapes the loader asks for. */
  static const int ndims[] = {1, 3};
  for (size_t i = 0; i < sizeof ndims / sizeof ndims[0]; i++) {
    ps_idx idx;
    ps_errbuf eb = {0};
    int rc = ps_idx_parse("fuzz", data, size, ndims[i], &idx, &eb);
    if (rc == 0) {
      /* A success must describe exactly the input: header plus data. */
      size_t n = 1;
      for (int d = 0; d < idx.ndim; d++)
        n *= idx.dims[d];
      if (idx.ndim != ndims[i] || 4 + 4 * (size_t)idx.ndim + n != size ||
          memcmp(idx.data, data + 4 + 4 * idx.ndim, n) != 0)
        __builtin_trap();
    } else if (eb.code != rc || memchr(eb.msg, '\n', sizeof eb.msg) != NULL ||
               idx.data != NULL) {
      /* Errors are one line, carry their code and leave nothing to free. */
      __builtin_trap();
    }
    ps_idx_close(&idx);
  }
  return 0;
}
