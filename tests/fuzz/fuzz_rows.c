/* libFuzzer target for the sparse tables' rows kept in Redis by key
 * (src/replica/rows.h, REDIS.md §3), as a restore reads them: the first
 * byte picks the parser.  Even: the rest is a bucket hash's field (its
 * first 12 bytes) and value (the others), decoded for a shard of two
 * tables or refused with one line; an entry decoded encodes back to the
 * same value and loads into its table.  Odd: the rest is a delta chunk,
 * checked as the merge checks it, or refused with one line; a chunk
 * accepted names a bucket below 2^bits for each of its groups. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ps/table.h"
#include "replica/rows.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Table 0: dim 3, sgd (no slots); table 1: dim 2, adagrad (1 slot). */
static const ps_tsec_table shapes[2] = {{.dim = 3, .nslots = 0, .name = "C1"},
                                        {.dim = 2, .nslots = 1, .name = NULL}};

static void check_row(const uint8_t *data, size_t size) {
  if (size < PS_ROWS_FIELD)
    return;
  float scratch[6];
  ps_table_entry e;
  ps_errbuf eb = {0};
  int t = -1;
  uint64_t rank = 0;
  size_t vlen = size - PS_ROWS_FIELD;
  int rc = ps_rows_decode(data, PS_ROWS_FIELD, data + PS_ROWS_FIELD, vlen, shapes, 2, scratch,
                          &t, &e, &rank, &eb);
  if (rc != 0) {
    if (rc != PS_ECORRUPT || eb.msg[0] == '\0' || strchr(eb.msg, '\n') != NULL)
      abort();
    return;
  }
  if (t < 0 || t > 1 || ps_rows_value_bytes(&shapes[t], e.pending) != vlen)
    abort();
  uint8_t again[PS_ROWS_VALUE_HEAD + 6 * sizeof(float)];
  if ((size_t)(ps_rows_value_put(again, &shapes[t], &e, rank) - again) != vlen ||
      memcmp(again, data + PS_ROWS_FIELD, vlen) != 0)
    abort();
  ps_table_opts o = {.dim = shapes[t].dim, .table_id = (uint32_t)t,
                     .optim = ps_optim_default(t ? PS_OPTIM_ADAGRAD : PS_OPTIM_SGD, 0.1f),
                     .admit_after = 1u << 30};
  ps_table *tb = NULL;
  if (ps_table_new(&o, &tb, &eb) != 0)
    abort();
  /* A pending count out of range is refused by the table, with its line. */
  rc = ps_table_load_ranked(tb, &e, rank, &eb);
  if (rc == 0 && ps_table_link_ranked(tb) != 0)
    abort();
  if (rc != 0 && rc != -ENOMEM && eb.msg[0] == '\0')
    abort();
  ps_table_free(tb);
}

static void check_delta(const uint8_t *data, size_t size) {
  uint32_t *buckets = NULL;
  size_t groups = 0;
  ps_errbuf eb = {0};
  int rc = ps_delta_check(data, size, 4, &buckets, &groups, &eb);
  if (rc != 0) {
    if (rc != -ENOMEM && (rc != PS_ECORRUPT || eb.msg[0] == '\0' || strchr(eb.msg, '\n')))
      abort();
    return;
  }
  for (size_t g = 0; g < groups; g++)
    if (buckets[g] >= 16)
      abort();
  free(buckets);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  if (data[0] % 2 == 0)
    check_row(data + 1, size - 1);
  else
    check_delta(data + 1, size - 1);
  return 0;
}
