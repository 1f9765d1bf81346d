/* libFuzzer target for model files and variables files
 * (src/nn/MODELFILE.md): any bytes are a model or refused with one line;
 * a model that is accepted builds, and its last layer gives its classes;
 * an accepted variables file is a table of distinct names within bounds. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "nn/model.h"
#include "nn/modelfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one_line(const ps_errbuf *eb) {
  if (eb->msg[0] == '\0' || strchr(eb->msg, '\n') != NULL)
    __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ps_model_spec spec;
  ps_errbuf eb = {0};
  if (ps_modelfile_parse((const char *)data, size, "fuzz.json", &spec, &eb) == 0) {
    ps_model m;
    if (ps_model_build(&spec, &m, &eb) != 0 || m.nlayers < 1 ||
        m.layers[m.nlayers - 1].out_size != (size_t)spec.classes || spec.desc[0] == '\0')
      __builtin_trap();
    ps_model_close(&m);
  } else {
    one_line(&eb);
  }
  ps_vartable t;
  char desc[128];
  ps_vartable_init(&t);
  memset(&eb, 0, sizeof eb);
  if (ps_varfile_parse((const char *)data, size, "fuzz.json", &t, desc, sizeof desc, &eb) == 0) {
    size_t total = 0;
    for (int i = 0; i < t.n; i++) {
      if (t.vars[i].offset != total || ps_vartable_find(&t, t.vars[i].name) != i)
        __builtin_trap();
      total += t.vars[i].count;
    }
    if (t.n < 1 || total != t.total || total > (1ULL << 31))
      __builtin_trap();
  } else if (t.n != 0) {
    __builtin_trap();
  } else {
    one_line(&eb);
  }
  ps_vartable_close(&t);
  return 0;
}
