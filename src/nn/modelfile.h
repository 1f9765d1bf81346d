/* Model files (MODELFILE.md beside this header): a network as a list of
 * layers ([model] file), or a bare table of variables ([model] variables)
 * for a user's own training loop, both JSON read through jansson. */
#ifndef PS_NN_MODELFILE_H
#define PS_NN_MODELFILE_H

#include <stddef.h>

#include "common/config.h"
#include "nn/model.h"
#include "paramserv/error.h"
#include "paramserv/vartable.h"

/* Read the layers file at `path` into spec, checked (ps_model_spec_check).
 * @return 0, or PS_EUSAGE / -errno with one line in eb that names the
 * file, the layer and what was expected. */
int ps_modelfile_load(const char *path, ps_model_spec *spec, ps_errbuf *eb);

/* The same from text[0..len) (not NUL-terminated); `what` names it in
 * messages. */
int ps_modelfile_parse(const char *text, size_t len, const char *what, ps_model_spec *spec,
                       ps_errbuf *eb);

/* The model file of spec's layers (MODELFILE.md), every key written
 * (defaults too), with a "comment" when comment is not NULL; indented by
 * `indent` spaces, or on one line when 0.  ps_modelfile_parse reads it back
 * to the same layers.  @return NUL-terminated text the caller frees with
 * free(), or NULL when out of memory. */
char *ps_modelfile_text(const ps_model_spec *spec, const char *comment, int indent);

/* Read the variables file at `path`: appends its variables to t (an
 * initialized, empty table) and writes its canonical text ("variables
 * N #<xxh64>") into desc.  @return 0, or PS_EUSAGE / -errno with one line
 * in eb naming the file, the variable and what was expected; t is then
 * empty again. */
int ps_varfile_load(const char *path, ps_vartable *t, char *desc, size_t desc_len,
                    ps_errbuf *eb);
int ps_varfile_parse(const char *text, size_t len, const char *what, ps_vartable *t, char *desc,
                     size_t desc_len, ps_errbuf *eb);

/* The model a cluster config describes: [model] file, [model] variables
 * (a model with variables and no layers: nlayers is 0) or the built-in
 * [model] name.  Relative paths are beside the config.  @return 0, or a
 * code with one line in eb.  Free with ps_model_close. */
int ps_model_for_config(const ps_config *cfg, ps_model *m, ps_errbuf *eb);

#endif
