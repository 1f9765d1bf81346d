/* A shard's sparse tables (src/ps/shard.c) and the worker's split of a
 * step's rows by shard (src/worker/sparse_split.c): pushes of rows,
 * a replay of the journal that repeats every admission and eviction, the
 * state image's table section, and the rows coming back to their places. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "layout/hashring.h"
#include "ps/shard.h"
#include "ps/tsec.h"
#include "worker/sparse_split.h"

#include "sparse_rows.h"

static float *image(const ps_shard *s, ps_state_info *in) {
  *in = ps_shard_state_info(s);
  float *img = malloc(in->image_floats * sizeof(float));
  assert_non_null(img);
  ps_shard_state_write(s, img);
  return img;
}

static void assert_same_image(const ps_shard *a, const ps_shard *b) {
  ps_state_info ia, ib;
  float *xa = image(a, &ia), *xb = image(b, &ib);
  assert_int_equal(ia.image_floats, ib.image_floats);
  assert_int_equal(ia.table_floats, ib.table_floats);
  assert_memory_equal(xa, xb, ia.image_floats * sizeof(float));
  free(xa);
  free(xb);
}

/* Pushes with rows, recorded as the journal would hold them; replayed into
 * a fresh shard they give the same image: the same rows, slots, counts,
 * stamps and pending keys, after admissions, evictions for room and
 * expiries. */
static void test_replay_repeats_admissions_and_evictions(void **state) {
  (void)state;
  ps_shard_opts o = opts();
  ps_shard *live = ps_shard_new(&o, NULL), *again = ps_shard_new(&o, NULL);
  assert_non_null(live);
  assert_non_null(again);
  float g[N] = {0.1f, -0.2f, 0.3f, 0.0f, 0.5f};
  enum { STEPS = 30 };
  ps_journal j[STEPS];
  ps_sparse_part part[STEPS];
  make_parts(part, STEPS);
  for (int k = 0; k < STEPS; k++) {
    assert_int_equal(ps_shard_push(live, (uint32_t)(k % 2), 1, (uint64_t)(k / 2 + 1), (uint64_t)k,
                                   g, part[k].bytes, part[k].len, &j[k]),
                     PS_SHARD_APPLIED);
    assert_ptr_equal(j[k].sparse, part[k].bytes);
    assert_int_equal(j[k].sparse_bytes, part[k].len);
  }
  ps_table_stats st = ps_shard_table_stats(live, 1);
  assert_true(st.evicted + st.expired > 0);  /* the test reaches the eviction paths */
  assert_true(st.rows <= 6);
  assert_true(st.pending > 0);
  assert_true(ps_shard_table_stats(live, 0).rows > 6);
  for (int k = 0; k < STEPS; k++)
    assert_int_equal(ps_shard_replay(again, &j[k]), 0);
  assert_same_image(live, again);
  /* A duplicate changes nothing, rows included. */
  assert_int_equal(ps_shard_push(live, 0, 1, 1, 0, g, part[0].bytes, part[0].len, NULL),
                   PS_SHARD_DUPLICATE);
  assert_same_image(live, again);
  for (int k = 0; k < STEPS; k++)
    ps_sparse_part_free(&part[k]);
  ps_shard_free(live);
  ps_shard_free(again);
}

/* An image with tables, loaded piece by piece into a fresh shard: the same
 * image, and the same rows pulled. */
static void test_image_round_trip(void **state) {
  (void)state;
  ps_shard_opts o = opts();
  ps_shard *live = ps_shard_new(&o, NULL), *copy = ps_shard_new(&o, NULL);
  float g[N] = {0};
  ps_sparse_part part = {0};
  for (int k = 0; k < 12; k++) {
    step_rows r;
    make_rows(&r, k);
    blocks(&r, &part);
    ps_shard_push(live, 0, 1, (uint64_t)k + 1, (uint64_t)k, g, part.bytes, part.len, NULL);
  }
  ps_state_info in;
  float *img = image(live, &in);
  assert_true(in.table_floats > (uint64_t)NT * 4);
  char why[256];
  assert_int_equal(ps_shard_state_check(copy, &in, why, sizeof why), 0);
  /* In pieces of 7 floats, last to first: any order. */
  for (uint64_t end = in.image_floats; end > 0;) {
    uint64_t off = end >= 7 ? end - 7 : 0;
    ps_shard_state_load_piece(copy, &in, off, img + off, end - off);
    end = off;
  }
  ps_errbuf eb = {0};
  assert_int_equal(ps_shard_state_load_end(copy, &in, &eb), 0);
  assert_same_image(live, copy);
  uint64_t keys[3] = {1000003u, 7000021u, 999};
  float a[3 * DIM], b[3 * DIM];
  for (int t = 0; t < NT; t++) {
    ps_shard_table_pull(live, t, keys, 3, a);
    ps_shard_table_pull(copy, t, keys, 3, b);
    assert_memory_equal(a, b, sizeof a);
  }
  /* A table section cut short is refused, naming it. */
  in.table_floats -= 1;
  in.image_floats -= 1;
  assert_int_not_equal(ps_shard_state_load(copy, &in, img, &eb), 0);
  assert_non_null(strstr(eb.msg, "sparse table"));
  free(img);
  ps_sparse_part_free(&part);
  ps_shard_free(live);
  ps_shard_free(copy);
}

/* A reader gives the image as it was when it began, read in pieces of odd
 * sizes while pushes (admissions, evictions, expiries) change the shard
 * between them; the shard ends as one that took the same pushes without a
 * reader.  One reader at a time. */
static void test_reader(void **state) {
  (void)state;
  ps_shard_opts o = opts();
  ps_shard *live = ps_shard_new(&o, NULL), *twin = ps_shard_new(&o, NULL);
  float g[N] = {0.1f, -0.2f, 0.3f, 0.0f, 0.5f};
  enum { STEPS = 40 };
  ps_sparse_part part[STEPS];
  make_parts(part, STEPS);
  int k = 0;
  for (; k < 15; k++) {
    ps_shard_push(live, 0, 1, (uint64_t)k + 1, (uint64_t)k, g, part[k].bytes, part[k].len, NULL);
    ps_shard_push(twin, 0, 1, (uint64_t)k + 1, (uint64_t)k, g, part[k].bytes, part[k].len, NULL);
  }
  ps_state_info want_in, in;
  float *want = image(live, &want_in);
  ps_shard_reader *rd = ps_shard_reader_begin(live, &in), *rd2 = ps_shard_reader_begin(live, &in);
  assert_non_null(rd);
  assert_non_null(rd2);  /* a snapshot and a checkpoint cut at once */
  assert_memory_equal(&in, &want_in, sizeof in);
  float *got = calloc(in.image_floats, sizeof(float));
  assert_non_null(got);
  for (uint64_t at = 0, piece = 1; at < in.image_floats; piece = piece * 3 % 37 + 1) {
    uint64_t n = piece < in.image_floats - at ? piece : in.image_floats - at;
    assert_int_equal(ps_shard_reader_read(rd, got + at, n), 0);
    at += n;
    if (k < STEPS) {
      ps_shard_push(live, 0, 1, (uint64_t)k + 1, (uint64_t)k, g, part[k].bytes, part[k].len,
                    NULL);
      k++;
    }
  }
  assert_int_equal(ps_shard_reader_read(rd, got, 1), -EINVAL);  /* past its end */
  ps_shard_reader_end(rd);
  assert_memory_equal(got, want, in.image_floats * sizeof(float));
  memset(got, 0, in.image_floats * sizeof(float));
  assert_int_equal(ps_shard_reader_read(rd2, got, in.image_floats), 0);
  assert_memory_equal(got, want, in.image_floats * sizeof(float));
  /* Walks for 3 more readers (4 a table); a fifth copies the image. */
  ps_state_info now_in, in5;
  float *now = image(live, &now_in);
  ps_shard_reader *more[4];
  for (int m = 0; m < 4; m++)
    assert_non_null(more[m] = ps_shard_reader_begin(live, &in5));
  float *got5 = malloc(in5.image_floats * sizeof(float));
  assert_int_equal(ps_shard_reader_read(more[3], got5, in5.image_floats), 0);
  assert_int_equal(in5.image_floats, now_in.image_floats);
  assert_memory_equal(got5, now, in5.image_floats * sizeof(float));
  for (int m = 0; m < 4; m++)
    ps_shard_reader_end(more[m]);
  ps_shard_reader_end(rd2);
  free(now);
  free(got5);
  assert_true(k > 20);  /* pushes did run while it was read */
  assert_true(ps_shard_table_stats(live, 1).evicted + ps_shard_table_stats(live, 1).expired > 0);
  for (int j = 15; j < k; j++)
    ps_shard_push(twin, 0, 1, (uint64_t)j + 1, (uint64_t)j, g, part[j].bytes, part[j].len, NULL);
  assert_same_image(live, twin);
  free(want);
  free(got);
  for (int j = 0; j < STEPS; j++)
    ps_sparse_part_free(&part[j]);
  ps_shard_free(live);
  ps_shard_free(twin);
}

/* The section's one reader: a walk of an image's section meets every table
 * head with the table's counts and every entry in ps_table_iter order, each
 * row's values the table's own; a callback's refusal is named by table and
 * entry. */
typedef struct walk_seen {
  const ps_shard *s;
  uint64_t heads[NT][2], entries[NT];
  int refuse_at;  /* entry index of table 1 to refuse, or -1 */
} walk_seen;

static int seen_head(void *arg, int t, uint64_t rows, uint64_t pending, ps_errbuf *eb) {
  (void)eb;
  walk_seen *w = arg;
  w->heads[t][0] = rows;
  w->heads[t][1] = pending;
  return 0;
}

static int seen_entry(void *arg, int t, uint64_t i, const ps_table_entry *e, ps_errbuf *eb) {
  walk_seen *w = arg;
  if (t == 1 && (int)i == w->refuse_at)
    return ps_err_set(eb, PS_ECORRUPT, "refused key %" PRIu64, e->key);
  ps_table_entry have;
  assert_true(ps_table_get(ps_shard_table(w->s, t), e->key, &have));
  assert_int_equal(have.pending, e->pending);
  assert_int_equal(have.count, e->count);
  assert_int_equal(have.last_step, e->last_step);
  if (!e->pending) {
    assert_memory_equal(have.values, e->values, DIM * sizeof(float));
    assert_memory_equal(have.slots[0], e->slots[0], DIM * sizeof(float));
  }
  assert_int_equal(i, w->entries[t]);
  w->entries[t]++;
  return 0;
}

static void test_section_walk(void **state) {
  (void)state;
  ps_shard_opts o = opts();
  ps_shard *s = ps_shard_new(&o, NULL);
  float g[N] = {0};
  ps_sparse_part part = {0};
  for (int k = 0; k < 12; k++) {
    step_rows r;
    make_rows(&r, k);
    blocks(&r, &part);
    ps_shard_push(s, 0, 1, (uint64_t)k + 1, (uint64_t)k, g, part.bytes, part.len, NULL);
  }
  ps_state_info in;
  float *img = image(s, &in);
  const float *sec = img + ps_state_tables_at(&in, N);
  uint64_t bytes = in.table_floats * sizeof(float);
  ps_tsec_table shape[NT] = {{DIM, 1, "A1"}, {DIM, 1, "A2"}};
  walk_seen w = {.s = s, .refuse_at = -1};
  ps_tsec_visit v = {.head = seen_head, .entry = seen_entry, .arg = &w};
  ps_errbuf eb = {0};
  assert_int_equal(ps_tsec_walk(sec, bytes, shape, NT, &v, NULL, &eb), 0);
  for (int t = 0; t < NT; t++) {
    ps_table_stats st = ps_shard_table_stats(s, t);
    assert_int_equal(w.heads[t][0], st.rows);
    assert_int_equal(w.heads[t][1], st.pending);
    assert_int_equal(w.entries[t], st.rows + st.pending);
  }
  assert_true(w.heads[1][1] > 0);  /* pending keys walked too */
  w = (walk_seen){.s = s, .refuse_at = 2};
  assert_int_equal(ps_tsec_walk(sec, bytes, shape, NT, &v, NULL, &eb), PS_ECORRUPT);
  assert_non_null(strstr(eb.msg, "sparse table 1 (A2), entry 2: refused key "));
  free(img);
  ps_sparse_part_free(&part);
  ps_shard_free(s);
}

/* A fresh shard's image has empty tables; a dense model's has none. */
static void test_shapes(void **state) {
  (void)state;
  ps_shard_opts o = opts();
  ps_state_info shape = ps_shard_state_shape(&o);
  assert_int_equal(shape.table_floats, NT * 4);
  ps_shard *s = ps_shard_new(&o, NULL);
  ps_state_info in = ps_shard_state_info(s);
  assert_int_equal(in.table_floats, NT * 4);
  assert_int_equal(in.image_floats, shape.image_floats);
  ps_shard_free(s);
  o.ntables = 0;
  assert_int_equal(ps_shard_state_shape(&o).table_floats, 0);
}

/* Blocks naming a table the shard does not hold, or another dim, are
 * refused before anything is applied. */
static void test_sparse_check(void **state) {
  (void)state;
  ps_shard_opts o = opts();
  ps_shard *s = ps_shard_new(&o, NULL);
  uint8_t buf[256];
  uint64_t key = 5;
  float row[8] = {0};
  char why[256];
  size_t n = ps_sparse_put(buf, sizeof buf, PS_SPARSE_KV, 2, DIM, 1, &key, row);
  assert_true(n > 0);
  assert_int_equal(ps_shard_sparse_check(s, PS_SPARSE_KV, buf, n, why, sizeof why), PS_ELAYOUT);
  assert_non_null(strstr(why, "table 2"));
  n = ps_sparse_put(buf, sizeof buf, PS_SPARSE_KV, 1, 8, 1, &key, row);
  assert_int_equal(ps_shard_sparse_check(s, PS_SPARSE_KV, buf, n, why, sizeof why), PS_ELAYOUT);
  assert_non_null(strstr(why, "dim 8"));
  n = ps_sparse_put(buf, sizeof buf, PS_SPARSE_KV, 1, DIM, 1, &key, row);
  assert_int_equal(ps_shard_sparse_check(s, PS_SPARSE_KV, buf, n, why, sizeof why), 0);
  ps_shard_free(s);
}

/* Bags pooled on 2 shards (PROTOCOL.md, "Bags"): each shard gets, per
 * sample, only its own keys; the pooled parts summed over the shards are
 * each sample's rows summed (a key twice, twice; an empty bag nothing);
 * a push's per-sample gradients, unbagged by each shard, give each key
 * the sum over the bags that hold it, on its owner only. */
static void test_split_bags(void **state) {
  (void)state;
  ps_hashring ring;
  assert_int_equal(ps_hashring_init(&ring, 2, PS_HASHRING_VNODES), 0);
  static const uint64_t keys[5] = {10, 20, 30, 40, 50};
  /* sample 0: 10, 30, 30; sample 1: none; sample 2: 50, 20, 10, 40. */
  static const uint32_t boff[4] = {0, 3, 3, 7}, bag[7] = {0, 2, 2, 4, 1, 0, 3};
  static const float bgrads[6] = {1, 2, 0, 0, 100, 200};
  float pooled[6] = {9, 9, 9, 9, 9, 9};
  ps_sparse_batch b = {.ntables = 1};
  b.dims[0] = 2;
  b.keys[0] = keys;
  b.n[0] = 5;
  b.bags[0] = 1;
  b.nsamples[0] = 3;
  b.boff[0] = boff;
  b.bag[0] = bag;
  b.pooled[0] = pooled;
  b.bgrads[0] = bgrads;
  ps_sparse_part k[2] = {{0}}, *parts[2] = {&k[0], &k[1]};
  assert_int_equal(ps_sparse_split(&ring, &b, PS_SPARSE_K, parts), 0);
  for (int s = 0; s < 2; s++) {
    ps_errbuf eb = {0};
    assert_int_equal(ps_sparse_check(PS_SPARSE_K | PS_SPARSE_BAGS_OK, k[s].bytes, k[s].len, NULL,
                                     &eb), 0);
    /* The shard's pooling: row(key) = (key, -key), summed per bag. */
    uint8_t reply[256];
    size_t len = 0;
    ps_sparse q = {.bytes = k[s].len, .data = k[s].bytes};
    ps_sparse_iter it;
    ps_sparse_block blk;
    ps_sparse_iter_init(&q, &it);
    while (ps_sparse_iter_next(&it, PS_SPARSE_K, &blk)) {
      assert_true(blk.bags && blk.table == 0);
      float vals[6] = {0};
      const uint8_t *kp = blk.keys;
      for (uint64_t i = 0; i < blk.n; i++) {
        uint32_t sample, count;
        memcpy(&sample, blk.heads + 8 * i, 4);
        memcpy(&count, blk.heads + 8 * i + 4, 4);
        assert_true(sample != 1);  /* the empty bag is sent to nobody */
        for (uint32_t c = 0; c < count; c++, kp += 8) {
          uint64_t key;
          memcpy(&key, kp, 8);
          assert_int_equal(ps_hashring_owner(&ring, 0, key), s);
          vals[2 * i] += (float)key;
          vals[2 * i + 1] -= (float)key;
        }
      }
      ps_put_le32(reply, PS_SPARSE_BAGS);
      ps_put_le32(reply + 4, 2);
      ps_put_le64(reply + 8, blk.n);
      memcpy(reply + 16, vals, blk.n * 2 * sizeof(float));
      len = 16 + blk.n * 2 * sizeof(float);
    }
    ps_sparse rep = {.bytes = len, .data = reply};
    char why[256];
    assert_int_equal(ps_sparse_scatter(&k[s], &rep, &b, why, sizeof why), 0);
  }
  static const float want[6] = {70, -70, 0, 0, 120, -120};
  assert_memory_equal(pooled, want, sizeof want);

  /* The push: each shard unbags its part; the keys' sums over both. */
  assert_int_equal(ps_sparse_split(&ring, &b, PS_SPARSE_KV, parts), 0);
  float got[5][2] = {{0}};
  int seen[5] = {0};
  for (int s = 0; s < 2; s++) {
    uint8_t *rows = NULL;
    size_t cap = 0;
    uint64_t rlen = 0;
    assert_int_equal(ps_sparse_unbag(k[s].bytes, k[s].len, &rows, &cap, &rlen), 0);
    ps_sparse q = {.bytes = rlen, .data = rows};
    ps_sparse_iter it;
    ps_sparse_block blk;
    ps_sparse_iter_init(&q, &it);
    while (ps_sparse_iter_next(&it, PS_SPARSE_KV, &blk))
      for (uint64_t i = 0; i < blk.n; i++) {
        uint64_t key;
        memcpy(&key, blk.keys + 8 * i, 8);
        assert_int_equal(ps_hashring_owner(&ring, 0, key), s);
        int at = (int)(key / 10) - 1;
        seen[at]++;
        memcpy(got[at], blk.values + 8 * i, 8);
      }
    free(rows);
  }
  static const float gwant[5][2] = {{101, 202}, {100, 200}, {2, 4}, {100, 200}, {100, 200}};
  for (int i = 0; i < 5; i++)
    assert_int_equal(seen[i], 1);
  assert_memory_equal(got, gwant, sizeof gwant);
  ps_sparse_part_free(&k[0]);
  ps_sparse_part_free(&k[1]);
  ps_hashring_free(&ring);
}

/* A step's rows over 3 shards: each key goes to the shard the ring names,
 * in ascending order; the replies come back to each key's place. */
static void test_split_and_scatter(void **state) {
  (void)state;
  ps_hashring ring;
  assert_int_equal(ps_hashring_init(&ring, 3, PS_HASHRING_VNODES), 0);
  step_rows r;
  make_rows(&r, 3);
  ps_sparse_part k[3] = {{0}}, *parts[3] = {&k[0], &k[1], &k[2]};
  assert_int_equal(ps_sparse_split(&ring, &r.b, PS_SPARSE_K, parts), 0);
  float rows[NT][MAXK * DIM];
  for (int t = 0; t < NT; t++)
    r.b.rows[t] = rows[t];
  memset(rows, 0, sizeof rows);
  size_t seen = 0;
  for (int s = 0; s < 3; s++) {
    /* The shard's answer: each row holds its key's low bits and its table. */
    uint8_t reply[4096];
    size_t len = 0;
    ps_sparse q = {.bytes = k[s].len, .data = k[s].bytes};
    ps_sparse_iter it;
    ps_sparse_block b;
    ps_sparse_iter_init(&q, &it);
    while (ps_sparse_iter_next(&it, PS_SPARSE_K, &b)) {
      float vals[MAXK * DIM];
      for (uint64_t i = 0; i < b.n; i++) {
        uint64_t key;
        memcpy(&key, b.keys + 8 * i, 8);
        assert_int_equal(ps_hashring_owner(&ring, b.table, key), s);
        for (int d = 0; d < DIM; d++)
          vals[i * DIM + (uint64_t)d] = (float)(key % 100000) + (float)b.table * 0.25f;
      }
      seen += b.n;
      len += ps_sparse_put(reply + len, sizeof reply - len, PS_SPARSE_V, b.table, b.dim, b.n, NULL,
                           vals);
    }
    ps_sparse rep = {.bytes = len, .data = reply};
    char why[256];
    assert_int_equal(ps_sparse_scatter(&k[s], &rep, &r.b, why, sizeof why), 0);
  }
  assert_int_equal(seen, r.b.n[0] + r.b.n[1]);
  for (int t = 0; t < NT; t++)
    for (size_t i = 0; i < r.b.n[t]; i++)
      assert_true(rows[t][i * DIM + DIM - 1] ==
                  (float)(r.keys[t][i] % 100000) + (float)t * 0.25f);
  /* A reply for another table is refused. */
  uint8_t bad[256];
  float vals[MAXK * DIM] = {0};
  ps_sparse q = {.bytes = k[0].len, .data = k[0].bytes};
  ps_sparse_iter it;
  ps_sparse_block b;
  ps_sparse_iter_init(&q, &it);
  assert_true(ps_sparse_iter_next(&it, PS_SPARSE_K, &b));
  size_t len = ps_sparse_put(bad, sizeof bad, PS_SPARSE_V, b.table + 5, b.dim, b.n, NULL, vals);
  ps_sparse rep = {.bytes = len, .data = bad};
  char why[256];
  assert_int_equal(ps_sparse_scatter(&k[0], &rep, &r.b, why, sizeof why), PS_EFORMAT);
  for (int s = 0; s < 3; s++)
    ps_sparse_part_free(&k[s]);
  ps_hashring_free(&ring);
}

/* Sync: a step's rows wait for its gradients; the step applies each key's
 * mean over the pushes that carry it (a key in one push only: its
 * gradient halved, as the dense part's mean over both), as one push of
 * those means to a table would.  An image cut in the open step carries its
 * rows: loaded into another shard, the step completes there the same. */
static void test_sync_step(void **state) {
  (void)state;
  ps_shard_opts o = opts();
  o.consistency = PS_CONSISTENCY_SYNC;
  o.replicas_to_aggregate = 2;
  o.tables[1] = o.tables[0];  /* no admission or eviction: the means alone */
  o.tables[1].table_id = 1;
  ps_shard *live = ps_shard_new(&o, NULL), *copy = ps_shard_new(&o, NULL);
  float g[N] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  step_rows r[2];
  ps_sparse_part part[2] = {{0}};
  for (int w = 0; w < 2; w++) {
    make_rows(&r[w], w + 1);
    blocks(&r[w], &part[w]);
  }
  ps_journal j[2];
  assert_int_equal(ps_shard_push(live, 0, 1, 1, 0, g, part[0].bytes, part[0].len, &j[0]),
                   PS_SHARD_APPLIED);
  /* Nothing applied yet: a row reads as its initial values. */
  uint64_t k0 = r[0].keys[0][0];
  float before[DIM], init[DIM];
  ps_shard_table_pull(live, 0, &k0, 1, before);
  ps_table_init_row(&o.tables[0], k0, init);
  assert_memory_equal(before, init, sizeof init);
  /* The image of the open step, into another shard. */
  ps_state_info in, rin;
  float *img = image(live, &in);
  ps_errbuf eb = {0};
  assert_int_equal(ps_shard_state_load(copy, &in, img, &eb), 0);
  /* A reader gives the same image, the open step's rows at its end. */
  ps_shard_reader *rd = ps_shard_reader_begin(live, &rin);
  assert_non_null(rd);
  assert_int_equal(rin.image_floats, in.image_floats);
  float *read = malloc(in.image_floats * sizeof(float));
  assert_non_null(read);
  assert_int_equal(ps_shard_reader_read(rd, read, in.image_floats), 0);
  ps_shard_reader_end(rd);
  assert_memory_equal(read, img, in.image_floats * sizeof(float));
  free(read);
  free(img);
  assert_int_equal(ps_shard_push(live, 1, 1, 1, 0, g, part[1].bytes, part[1].len, &j[1]),
                   PS_SHARD_APPLIED);
  assert_int_equal(ps_shard_version(live), 1);
  assert_int_equal(ps_shard_push(copy, 1, 1, 1, 0, g, part[1].bytes, part[1].len, NULL),
                   PS_SHARD_APPLIED);
  assert_same_image(live, copy);
  /* The reference: each key's mean pushed to a table of the same options. */
  for (int t = 0; t < NT; t++) {
    ps_table *ref = NULL;
    assert_int_equal(ps_table_new(&o.tables[t], &ref, NULL), 0);
    uint64_t keys[2 * MAXK];
    float grads[2 * MAXK * DIM];
    size_t n = 0;
    for (uint64_t key = 1; key <= 40; key++) {
      uint64_t k = key * 1000003u;
      int seen = 0;
      float sum[DIM] = {0};
      for (int w = 0; w < 2; w++)
        for (size_t i = 0; i < r[w].b.n[t]; i++)
          if (r[w].keys[t][i] == k) {
            seen = 1;
            for (int d = 0; d < DIM; d++)
              sum[d] += r[w].grads[t][i * DIM + (size_t)d];
          }
      if (!seen)
        continue;
      keys[n] = k;
      for (int d = 0; d < DIM; d++)
        grads[n * DIM + (size_t)d] = sum[d] * 0.5f;
      n++;
    }
    assert_int_equal(ps_table_push(ref, keys, grads, n, o.table_lr[t], 0, NULL), 0);
    float a[2 * MAXK * DIM], b[2 * MAXK * DIM];
    ps_table_pull(ref, keys, n, a);
    ps_shard_table_pull(live, t, keys, n, b);
    assert_memory_equal(a, b, n * DIM * sizeof(float));
    ps_table_free(ref);
  }
  /* The journal replays to the same state. */
  ps_shard *again = ps_shard_new(&o, NULL);
  for (int k = 0; k < 2; k++)
    assert_int_equal(ps_shard_replay(again, &j[k]), 0);
  assert_same_image(live, again);
  for (int w = 0; w < 2; w++)
    ps_sparse_part_free(&part[w]);
  ps_shard_free(live);
  ps_shard_free(copy);
  ps_shard_free(again);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_replay_repeats_admissions_and_evictions),
      cmocka_unit_test(test_image_round_trip),
      cmocka_unit_test(test_reader),
      cmocka_unit_test(test_section_walk),
      cmocka_unit_test(test_shapes),
      cmocka_unit_test(test_sparse_check),
      cmocka_unit_test(test_split_and_scatter),
      cmocka_unit_test(test_split_bags),
      cmocka_unit_test(test_sync_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
