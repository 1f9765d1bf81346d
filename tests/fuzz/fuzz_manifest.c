/* libFuzzer target for the checkpoint manifest parser (versions 1 to 3,
 * the model file in `network` and an incremental checkpoint's base
 * included): any bytes parse into a checkpoint
 * whose promises hold, or are refused with one clean line. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "recovery/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What a parsed manifest promises ps_ckpt_read_shard and the export. */
static void check(const ps_ckpt *c) {
  if (c->format_version < PS_CKPT_FORMAT_VERSION_MIN ||
      c->format_version > PS_CKPT_FORMAT_VERSION || c->nshards < 1 ||
      c->nshards > PS_LAYOUT_MAX_SHARDS || c->nvars < 1 || c->path != NULL ||
      (c->nworkers > 0 && c->data_pos == NULL))
    __builtin_trap();
  /* What the model is: layers that are the manifest's model, a
   * normalization that divides by nothing but positive numbers. */
  if (c->has_network && (c->network.nlayers < 1 || c->network.nlayers > PS_MODEL_MAX_LAYERS ||
                         strcmp(c->network.desc, c->model) != 0 ||
                         (c->network.layers[c->network.nlayers - 1].type != PS_LT_LOG_SOFTMAX &&
                          c->network.layers[c->network.nlayers - 1].type != PS_LT_SIGMOID)))
    __builtin_trap();
  if (c->builtin[0] != '\0' && !c->has_network)
    __builtin_trap();
  if (c->has_norm && !(c->norm.divide > 0 && c->norm.std > 0 && c->norm.mean == c->norm.mean))
    __builtin_trap();
  if (c->format_version < 2 && (c->has_network || c->has_norm))
    __builtin_trap();
  size_t total = 0;
  for (int v = 0; v < c->nvars; v++) {
    const ps_ckpt_var *var = &c->vars[v];
    size_t count = 1, start = 0;
    if (var->ndim < 1 || var->ndim > PS_VAR_MAX_DIMS || var->offset != total ||
        memchr(var->name, '\0', sizeof var->name) == NULL || var->name[0] == '\0')
      __builtin_trap();
    for (int d = 0; d < var->ndim; d++)
      count *= var->shape[d];
    if (count != var->count || var->nparts < 1)
      __builtin_trap();
    for (int k = 0; k < var->nparts; k++) {
      const ps_ckpt_part *p = &var->parts[k];
      /* Every part lies inside its variable and its shard's values. */
      if (p->start != start || p->count == 0 || p->shard < 0 || p->shard >= c->nshards ||
          p->shard_off + p->count > c->shards[p->shard].floats)
        __builtin_trap();
      start += p->count;
    }
    if (start != var->count)
      __builtin_trap();
    total += var->count;
  }
  if (total != c->total_floats)
    __builtin_trap();
  for (int i = 0; i < c->nshards; i++) {
    const ps_ckpt_shard *s = &c->shards[i];
    const ps_state_info *in = &s->info;
    uint64_t tail = c->base[0] != '\0' ? s->delta_floats : in->table_floats;
    if (s->index != i || s->floats == 0 || ps_state_over(in) != NULL ||
        s->uncompressed_size != (uint64_t)s->floats * 4 * (uint64_t)(1 + in->nslots + in->has_accum) + 4 * tail ||
        in->image_floats != ps_state_image_floats(in, s->floats) ||
        (in->nonce > 0 && s->once == NULL) || strchr(s->file, '/') != NULL ||
        (c->base[0] == '\0' && s->state_xxh64 != s->xxh64))
      __builtin_trap();
  }
  /* Incremental (version 3): an older checkpoint's name as its base. */
  if ((c->format_version >= 3) != (c->base[0] != '\0') ||
      memchr(c->base, '\0', sizeof c->base) == NULL)
    __builtin_trap();
  if (c->base[0] != '\0') {
    char *end = NULL;
    unsigned long long bstep = strncmp(c->base, "ckpt-", 5) == 0 ? strtoull(c->base + 5, &end, 10) : 0;
    if (end == NULL || *end != '\0' || bstep >= c->step)
      __builtin_trap();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ps_ckpt c;
  ps_errbuf eb = {0};
  int rc = ps_ckpt_parse_manifest((const char *)data, size, &c, &eb);
  if (rc == 0) {
    check(&c);
  } else {
    /* Refused: the right code, one printable line, and nothing left allocated. */
    if ((rc != PS_ECORRUPT && rc != PS_EVERSION && rc != -ENOMEM) || eb.code != rc ||
        eb.msg[0] == '\0' || memchr(eb.msg, '\0', sizeof eb.msg) == NULL ||
        c.vars != NULL || c.shards != NULL || c.data_pos != NULL)
      __builtin_trap();
    for (const char *p = eb.msg; *p != '\0'; p++)
      if ((unsigned char)*p < 0x20 || *p == 0x7f)
        __builtin_trap();
  }
  ps_ckpt_close(&c);
  return 0;
}
