/* Placement of a variable table onto parameter-server shards: split, place, hash (LAYOUT.md). */
#include "layout/layout.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "nn/modelfile.h"

/* ---------------------------------------------------------------- split --- */

/* The auto split cuts a shard's fair share into this many parts at most.
 * Greedy ends the largest shard at most one part above the mean, so this
 * bounds max/mean by about 1 + 1/16; 4 left the default mlp at 1.12. */
#define AUTO_SPLIT_PER_SHARD 16

/* Fewest parts of at most `split` floats for `count` floats (split 0: one). */
static size_t parts_of(size_t count, size_t split) {
  if (split == 0 || count <= split)
    return 1;
  return count / split + (count % split != 0);
}

/* Cut every variable into its parts, in (var, start) order.  Of the k parts
 * of a variable the first count % k get one element more, so sizes differ by
 * at most one and every process cuts at the same elements. */
static void split_table(const ps_vartable *t, size_t split, ps_part *parts) {
  int n = 0;
  for (int v = 0; v < t->n; v++) {
    size_t count = t->vars[v].count, k = parts_of(count, split);
    size_t base = count / k, extra = count % k, start = 0;
    for (size_t i = 0; i < k; i++) {
      size_t c = base + (i < extra);
      parts[n++] = (ps_part){.var = v, .start = start, .count = c, .shard = -1};
      start += c;
    }
  }
}

/* ------------------------------------------------------------ placement --- */

static void place_round_robin(ps_part *parts, int nparts, int nshards) {
  for (int i = 0; i < nparts; i++)
    parts[i].shard = i % nshards;
}

/* Largest first, then (var, start): a total order, so qsort's instability
 * cannot make two processes place equal-size parts differently. */
static int cmp_greedy(const void *a, const void *b) {
  const ps_part *x = *(const ps_part *const *)a, *y = *(const ps_part *const *)b;
  if (x->count != y->count)
    return x->count > y->count ? -1 : 1;
  if (x->var != y->var)
    return x->var < y->var ? -1 : 1;
  return (x->start > y->start) - (x->start < y->start);
}

/* Longest-processing-time placement: each part onto the shard with the
 * fewest floats so far, the lowest index among equals.  The shard that ends
 * largest was the lightest (at most the mean) when its last part came, so
 * max <= mean + largest part.  A linear scan is enough: nshards <= 256. */
static int place_greedy(ps_part *parts, int nparts, int nshards) {
  ps_part **order = malloc((size_t)nparts * sizeof *order);
  size_t *load = calloc((size_t)nshards, sizeof *load);
  if (order == NULL || load == NULL) {
    free(order);
    free(load);
    return -ENOMEM;
  }
  for (int i = 0; i < nparts; i++)
    order[i] = &parts[i];
  qsort(order, (size_t)nparts, sizeof *order, cmp_greedy);
  for (int i = 0; i < nparts; i++) {
    int best = 0;
    for (int s = 1; s < nshards; s++)
      if (load[s] < load[best])
        best = s;
    order[i]->shard = best;
    load[best] += order[i]->count;
  }
  free(order);
  free(load);
  return 0;
}

/* Lay each shard's parts out back to back in (var, start) order, which is
 * the order of `parts`, so a shard's slice is independent of the strategy's
 * visiting order. */
static void assign_offsets(ps_layout *l) {
  for (int s = 0; s < l->nshards; s++)
    l->shard_floats[s] = 0;
  for (int i = 0; i < l->nparts; i++) {
    ps_part *p = &l->parts[i];
    p->shard_off = l->shard_floats[p->shard];
    l->shard_floats[p->shard] += p->count;
  }
}

/* ----------------------------------------------------------------- hash --- */

/* Integers enter the hash as fixed-width little-endian bytes, whatever the
 * host's size_t or byte order, so every machine computes the same value. */
static void hash_u32(XXH64_state_t *h, uint32_t v) {
  unsigned char b[4];
  for (int i = 0; i < 4; i++)
    b[i] = (unsigned char)(v >> (8 * i));
  XXH64_update(h, b, sizeof b);
}

static void hash_u64(XXH64_state_t *h, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)(v >> (8 * i));
  XXH64_update(h, b, sizeof b);
}

/* Strings are length-prefixed so that no two different inputs share bytes. */
static void hash_str(XXH64_state_t *h, const char *s) {
  size_t len = strlen(s);
  hash_u32(h, (uint32_t)len);
  XXH64_update(h, s, len);
}

static int hash_layout(const ps_layout *l, const ps_vartable *t, const char *model_desc,
                       uint64_t *out) {
  XXH64_state_t *h = XXH64_createState();
  if (h == NULL)
    return -ENOMEM;
  XXH64_reset(h, 0);
  hash_str(h, model_desc);
  hash_u32(h, (uint32_t)l->nshards);
  for (int i = 0; i < l->nparts; i++) {
    const ps_part *p = &l->parts[i];
    const ps_var *v = &t->vars[p->var];
    hash_str(h, v->name);
    hash_u32(h, (uint32_t)v->ndim);
    for (int d = 0; d < v->ndim; d++)
      hash_u32(h, v->shape[d]);
    hash_u64(h, p->start);
    hash_u64(h, p->count);
    hash_u32(h, (uint32_t)p->shard);
  }
  *out = XXH64_digest(h);
  XXH64_freeState(h);
  return 0;
}

/* ---------------------------------------------------------------- build --- */

int ps_layout_build(const ps_vartable *t, const char *model_desc, int nshards,
                    ps_layout_strategy strategy, size_t split_bytes, ps_layout *out,
                    ps_errbuf *eb) {
  memset(out, 0, sizeof *out);
  if (model_desc == NULL)
    model_desc = "";
  if (nshards < 1 || nshards > PS_LAYOUT_MAX_SHARDS)
    return ps_err_set(eb, PS_ELAYOUT, "layout of '%s': %d shards; expected 1 to %d",
                      model_desc, nshards, PS_LAYOUT_MAX_SHARDS);
  if (strategy != PS_LAYOUT_ROUND_ROBIN && strategy != PS_LAYOUT_GREEDY)
    return ps_err_set(eb, PS_ELAYOUT, "layout of '%s': unknown strategy %d", model_desc,
                      (int)strategy);

  size_t split;
  if (split_bytes == SIZE_MAX && nshards == 1) {
    split = 0;  /* one shard: nothing to balance (LAYOUT.md section 1) */
  } else if (split_bytes == SIZE_MAX) {
    /* Auto: total bytes / (16 * nshards) rounded up to whole floats is
     * ceil(total floats / (16 * nshards)); floats cannot overflow. */
    size_t kn = (size_t)AUTO_SPLIT_PER_SHARD * (size_t)nshards;
    split = t->total / kn + (t->total % kn != 0);
  } else if (split_bytes == 0) {
    split = 0;
  } else if (split_bytes < sizeof(float)) {
    return ps_err_set(eb, PS_ELAYOUT,
                      "layout of '%s': split size %zu bytes; expected 0 (never), at least %zu "
                      "(one float) or SIZE_MAX (auto)",
                      model_desc, split_bytes, sizeof(float));
  } else {
    split = split_bytes / sizeof(float);
  }

  size_t nparts = 0;
  for (int v = 0; v < t->n; v++) {
    nparts += parts_of(t->vars[v].count, split);
    if (nparts > INT_MAX)
      return ps_err_set(eb, PS_ELAYOUT,
                        "layout of '%s': split at %zu floats gives more than %d parts; "
                        "expected a larger split size",
                        model_desc, split, INT_MAX);
  }
  if (nparts < (size_t)nshards) {
    char how[48];
    if (split)
      snprintf(how, sizeof how, "split at %zu floats", split);
    else
      snprintf(how, sizeof how, "split never");
    return ps_err_set(eb, PS_ELAYOUT,
                      "layout of '%s': %d shards but only %zu parts (%d variables, %s); "
                      "expected at most %zu shards, or a smaller split size",
                      model_desc, nshards, nparts, t->n, how, nparts);
  }

  out->nshards = nshards;
  out->nparts = (int)nparts;
  out->split_floats = split;
  out->parts = calloc(nparts, sizeof *out->parts);
  out->shard_floats = calloc((size_t)nshards, sizeof *out->shard_floats);
  if (out->parts == NULL || out->shard_floats == NULL)
    goto nomem;
  split_table(t, split, out->parts);
  if (strategy == PS_LAYOUT_ROUND_ROBIN)
    place_round_robin(out->parts, out->nparts, nshards);
  else if (place_greedy(out->parts, out->nparts, nshards) < 0)
    goto nomem;
  assign_offsets(out);
  if (hash_layout(out, t, model_desc, &out->hash) < 0)
    goto nomem;
  return 0;

nomem:
  ps_layout_close(out);
  return ps_err_set(eb, -ENOMEM, "layout of '%s': out of memory for %zu parts on %d shards",
                    model_desc, nparts, nshards);
}

void ps_layout_close(ps_layout *l) {
  if (l == NULL)
    return;
  free(l->parts);
  free(l->shard_floats);
  memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------- strategy --- */

static const char *const strategy_names[] = {
    [PS_LAYOUT_ROUND_ROBIN] = "round-robin",
    [PS_LAYOUT_GREEDY] = "greedy",
};

int ps_layout_strategy_parse(const char *name, ps_layout_strategy *out) {
  for (size_t i = 0; name != NULL && i < sizeof strategy_names / sizeof *strategy_names; i++)
    if (strcmp(name, strategy_names[i]) == 0) {
      *out = (ps_layout_strategy)i;
      return 0;
    }
  return PS_EUSAGE;
}

const char *ps_layout_strategy_name(ps_layout_strategy s) {
  if ((unsigned)s < sizeof strategy_names / sizeof *strategy_names)
    return strategy_names[s];
  return "unknown";
}

/* ----------------------------------------------------------- slice copy --- */

void ps_layout_gather(const ps_layout *l, const ps_vartable *t, int shard, const float *arena,
                      float *slice) {
  for (int i = 0; i < l->nparts; i++) {
    const ps_part *p = &l->parts[i];
    if (p->shard == shard)
      memcpy(slice + p->shard_off, arena + t->vars[p->var].offset + p->start,
             p->count * sizeof *slice);
  }
}

void ps_layout_scatter(const ps_layout *l, const ps_vartable *t, int shard, const float *slice,
                       float *arena) {
  for (int i = 0; i < l->nparts; i++) {
    const ps_part *p = &l->parts[i];
    if (p->shard == shard)
      memcpy(arena + t->vars[p->var].offset + p->start, slice + p->shard_off,
             p->count * sizeof *arena);
  }
}

void ps_layout_init_slice(const ps_layout *l, const ps_vartable *t, int shard, uint64_t seed,
                          float *slice) {
  for (int i = 0; i < l->nparts; i++) {
    const ps_part *p = &l->parts[i];
    if (p->shard == shard)
      ps_vartable_init_values(t, p->var, seed, p->start, p->count, slice + p->shard_off);
  }
}

double ps_layout_imbalance(const ps_layout *l) {
  size_t max = 0, total = 0;
  for (int s = 0; s < l->nshards; s++) {
    total += l->shard_floats[s];
    if (l->shard_floats[s] > max)
      max = l->shard_floats[s];
  }
  if (total == 0)
    return 1.0;
  /* Every shard holds floats, so the ratio of floats is the ratio of bytes. */
  return (double)max * l->nshards / (double)total;
}

int ps_layout_for_cluster(const ps_config *cfg, ps_model *model, ps_layout *layout,
                          ps_errbuf *eb) {
  ps_errbuf inner = {0};
  memset(layout, 0, sizeof *layout);
  if (ps_model_for_config(cfg, model, &inner) != 0)
    return ps_err_set(eb, inner.code, "%s: [model]: %s", cfg->path, inner.msg);
  ps_layout_strategy strategy = PS_LAYOUT_GREEDY;
  ps_layout_strategy_parse(cfg->layout_strategy, &strategy);
  char desc[128];
  /* A ring member holds the whole model as one slice in table order: the
   * shard image its peers and the chief fetch. */
  int ring = cfg->mode == PS_MODE_RING;
  size_t split = ring ? 0 : cfg->split_bytes < 0 ? SIZE_MAX : (size_t)cfg->split_bytes;
  int rc = ps_layout_build(&model->vars, ps_model_spec_format(&model->spec, desc, sizeof desc),
                           ring ? 1 : cfg->nps, ring ? PS_LAYOUT_ROUND_ROBIN : strategy, split,
                           layout, &inner);
  if (rc != 0) {
    ps_model_close(model);
    return ps_err_set(eb, rc, "%s: [layout]: %s", cfg->path, inner.msg);
  }
  return 0;
}
