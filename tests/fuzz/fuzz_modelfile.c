/* libFuzzer target for model files and variables files
 * (src/nn/MODELFILE.md): any bytes are a model or refused with one line;
 * a model that is accepted builds, its last layer gives its classes, its
 * sparse tables tile the embedding input (each field in one), and
 * the file ps_modelfile_text writes of it reads back as the same model
 * (the same canonical text and tables); an accepted variables file is a
 * table of distinct names within bounds. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
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
    size_t offset = 0;
    for (int t = 0; t < m.ntables; t++) {
      const ps_sparse_spec *tb = &m.tables[t];
      if (tb->offset != offset || tb->dim < 1 || tb->field < 0)
        __builtin_trap();
      for (int u = 0; u < t; u++)
        if (m.tables[u].field == tb->field)
          __builtin_trap();
      offset += (size_t)tb->dim;
    }
    if (offset != m.emb_size)
      __builtin_trap();
    char *text = ps_modelfile_text(&spec, NULL, 0);
    ps_model_spec again;
    ps_model m2;
    if (text == NULL || ps_modelfile_parse(text, strlen(text), "again", &again, &eb) != 0 ||
        strcmp(again.desc, spec.desc) != 0 || ps_model_build(&again, &m2, &eb) != 0)
      __builtin_trap();
    if (m2.ntables != m.ntables ||
        memcmp(m2.tables, m.tables, (size_t)m.ntables * sizeof m.tables[0]) != 0)
      __builtin_trap();
    free(text);
    ps_model_close(&m2);
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
