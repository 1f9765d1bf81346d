/* libFuzzer target for the state image's table section (src/ps/tsec.h), as
 * a shard's restore reads it (a LOAD from the chief, a checkpoint, a Redis
 * snapshot): any bytes are loaded into a shard's two tables or refused with
 * one line; a section loaded is one the shard writes back and loads again
 * to the same bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ps/shard.h"
#include "ps/tsec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N 4  /* dense floats */

/* Table 0: dim 3, sgd (no slots); table 1: dim 2, adagrad (1 slot), a key
 * admitted on its second push, so that pending keys parse too. */
static ps_shard_opts opts(void) {
  ps_shard_opts o = {.index = 0, .nworkers = 1, .nfloats = N, .replicas_to_aggregate = 1,
                     .optim = ps_optim_default(PS_OPTIM_SGD, 0.1f), .ntables = 2};
  o.tables[0] = (ps_table_opts){.dim = 3, .optim = ps_optim_default(PS_OPTIM_SGD, 0.1f)};
  o.tables[1] = (ps_table_opts){.dim = 2, .optim = ps_optim_default(PS_OPTIM_ADAGRAD, 0.1f),
                                .table_id = 1, .admit_after = 2};
  return o;
}

/* Load a section of `bytes` bytes into s.  @return its code; eb the why. */
static int load(ps_shard *s, const ps_shard_opts *o, const void *sec, size_t bytes,
                ps_errbuf *eb) {
  ps_state_info in = ps_shard_state_shape(o);
  in.table_floats = bytes / sizeof(float);
  in.image_floats = ps_state_image_floats(&in, o->nfloats);
  float *img = calloc((size_t)in.image_floats, sizeof(float));
  if (img == NULL)
    return -1;
  memcpy(img + ps_state_tables_at(&in, o->nfloats), sec, bytes);
  int rc = ps_shard_state_load(s, &in, img, eb);
  free(img);
  return rc;
}

/* s's section as it writes it (malloc'd), its length in *bytes. */
static uint8_t *section(const ps_shard *s, size_t *bytes) {
  ps_state_info in = ps_shard_state_info(s);
  float *img = malloc((size_t)in.image_floats * sizeof(float));
  if (img == NULL)
    return NULL;
  ps_shard_state_write(s, img);
  *bytes = (size_t)in.table_floats * sizeof(float);
  uint8_t *sec = malloc(*bytes ? *bytes : 1);
  if (sec != NULL)
    memcpy(sec, img + ps_state_tables_at(&in, N), *bytes);
  free(img);
  return sec;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ps_shard_opts o = opts();
  ps_shard *s = ps_shard_new(&o, NULL), *again = ps_shard_new(&o, NULL);
  if (s == NULL || again == NULL)
    __builtin_trap();
  size_t bytes = size / 4 * 4;  /* a section is whole floats */
  ps_errbuf eb = {0};
  int rc = load(s, &o, data, bytes, &eb);
  if (rc != 0) {
    if (eb.msg[0] == '\0' || strchr(eb.msg, '\n') != NULL)
      __builtin_trap();
  } else {
    /* What it holds now, written and loaded again, writes the same. */
    size_t n1 = 0, n2 = 0;
    uint8_t *one = section(s, &n1);
    if (one == NULL || load(again, &o, one, n1, &eb) != 0)
      __builtin_trap();
    uint8_t *two = section(again, &n2);
    if (two == NULL || n1 != n2 || memcmp(one, two, n1) != 0)
      __builtin_trap();
    free(one);
    free(two);
  }
  ps_shard_free(s);
  ps_shard_free(again);
  return 0;
}
