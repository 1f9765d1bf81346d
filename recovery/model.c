/* The model a checkpoint is of, from its manifest alone (FORMAT.md 4.1):
 * what `paramserv eval` and `paramserv train --init-from` build. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/modelfile.h"
#include "recovery/checkpoint.h"
#include "recovery/manifest.h"

int ps_ckpt_check_vars(const ps_ckpt *c, const ps_vartable *t, ps_errbuf *eb) {
  const char *where = c->path != NULL ? c->path : "the checkpoint";
  if (t->n != c->nvars || t->total != c->total_floats)
    return ps_err_set(eb, PS_EUSAGE, "%s: the model has %d variables of %zu floats, the "
                      "checkpoint (%s) %d of %zu", where, t->n, t->total, c->model, c->nvars,
                      c->total_floats);
  for (int i = 0; i < t->n; i++) {
    const ps_var *v = &t->vars[i];
    const ps_ckpt_var *w = &c->vars[i];
    int same = strcmp(v->name, w->name) == 0 && v->ndim == w->ndim && v->offset == w->offset;
    for (int d = 0; same && d < v->ndim; d++)
      same = v->shape[d] == w->shape[d];
    if (!same) {
      char a[128];
      return ps_err_set(eb, PS_EUSAGE, "%s: variable %d of the model is %s, the checkpoint's "
                        "(%s) %s", where, i + 1, ps_var_describe(v, a, sizeof a), c->model,
                        w->name);
    }
  }
  return 0;
}

int ps_ckpt_model(const ps_ckpt *c, const char *model_file, ps_model *m, ps_data_norm *norm,
                  ps_errbuf *eb) {
  const char *where = c->path != NULL ? c->path : "the checkpoint";
  ps_model_spec spec;
  int from_file = 0;
  memset(m, 0, sizeof *m);
  if (c->has_network) {
    spec = c->network;
  } else if (c->format_version >= 2) {
    return ps_err_set(eb, PS_EUSAGE, "%s: the model %s has no layers (network: null, a model "
                      "of variables only): nothing to run", where, c->model);
  } else {
    /* Version 1 named the model by its text only: a built-in's text says
     * everything; another model file's must be given. */
    char name[8], hidden[128];
    if (ps__ckpt_builtin_of(c->model, name, sizeof name, hidden, sizeof hidden) == 0) {
      if (ps_model_spec_parse(name, hidden[0] ? hidden : NULL, &spec, eb) != 0)
        return PS_EUSAGE;
    } else if (model_file != NULL) {
      int rc = ps_modelfile_load(model_file, &spec, eb);
      if (rc != 0)
        return rc;
      from_file = 1;
      if (strcmp(spec.desc, c->model) != 0)
        return ps_err_set(eb, PS_EUSAGE, "%s: the model file is the model '%s', the checkpoint "
                          "'%s'", model_file, spec.desc, c->model);
    } else {
      return ps_err_set(eb, PS_EUSAGE, "%s: a format version %d checkpoint names its model only "
                        "as '%s' (no layers in it): give its model file (--model-file)",
                        where, c->format_version, c->model);
    }
  }
  if (model_file != NULL && !from_file) {
    /* A model file given for a checkpoint whose model is known without it:
     * it must be that model. */
    ps_model_spec given;
    int rc = ps_modelfile_load(model_file, &given, eb);
    if (rc != 0)
      return rc;
    char *a = ps_modelfile_text(&given, NULL, 0), *b = ps_modelfile_text(&spec, NULL, 0);
    int same = a != NULL && b != NULL && strcmp(a, b) == 0;
    free(a);
    free(b);
    if (!same)
      return ps_err_set(eb, PS_EUSAGE, "%s: not the checkpoint's model (%s): leave out "
                        "--model-file, the checkpoint holds its model", model_file, c->model);
  }
  int rc = ps_model_build(&spec, m, eb);
  if (rc != 0)
    return rc;
  /* The variables the model builds must be the manifest's, in its order. */
  if ((rc = ps_ckpt_check_vars(c, &m->vars, eb)) != 0) {
    ps_model_close(m);
    return rc;
  }
  /* Version 1 writers all applied the one normalization. */
  *norm = c->has_norm ? c->norm : PS_DATA_NORM;
  return 0;
}
