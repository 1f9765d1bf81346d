/* src/replica/snapshot.c and restore.c against a real redis-server on a
 * private port (REDIS.md §6, §7): a snapshot switched in is what a restore
 * loads, to the byte; one that fails on the way leaves the previous one
 * whole; a switch deletes every other snapshot's chunks; a stale
 * incarnation's switch is refused.  The snapshots run on their link
 * (link.c) on a loop of the test's, with no replica.c above them: what
 * they report is checked directly.  Every wait is for an event, with a
 * deadline that only bounds a hang. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/config.h"
#include "common/log.h"
#include "layout/layout.h"
#include "nn/model.h"
#include "ps/shard.h"
#include "replica/keys.h"
#include "replica/link.h"
#include "replica/restore.h"
#include "replica/rows.h"
#include "replica/snapshot.h"
#include "redis_server.h"
#include "sparse_rows.h"

typedef struct fx {
  ps_config cfg;
  ps_model model;
  ps_layout layout;
  ps_shard *shard;
  ps_restore_info ri;
  ps_shard_keys k;
  uv_loop_t loop;
  ps_link link;
  ps_snaps snaps;
  uv_timer_t tick;        /* the replication interval, as replica.c's */
  int open;
  uint64_t seq;           /* worker 0's last push */
  /* What the snapshots and the link reported. */
  int switches, fenced;
  uint64_t switched_n;
  /* A shard of sparse tables (sparse_rows.h) instead of the mlp's. */
  int sparse;
  uint64_t hash;          /* its layout hash */
  int restore_at;         /* the switch whose callback restores a next incarnation (0: none) */
  int want;               /* switches switched_n_idle waits for */
  ps_restore_info at_switch;
  uint64_t backlog_max;   /* the most ps_snaps_backlog said at a drained report */
  int drains;
} fx;

static volatile int no_stop;

static void on_up(void *arg, int claimed) { ps_snaps_connected(&((fx *)arg)->snaps, claimed); }
static void on_down(void *arg) { ps_snaps_owe(&((fx *)arg)->snaps); }
static void on_fenced(void *arg, const char *why) {
  (void)why;
  ((fx *)arg)->fenced++;
}
static void on_nothing(void *arg) { (void)arg; }
static void restore_at_switch(fx *f);
static void on_switched(void *arg, uint64_t n) {
  fx *f = arg;
  f->switches++;
  f->switched_n = n;
  if (f->switches == f->restore_at)
    restore_at_switch(f);
}
static void on_tick(uv_timer_t *t) { ps_snaps_tick(&((fx *)t->data)->snaps); }
static void on_drained(void *arg) {
  fx *f = arg;
  uint64_t b = ps_snaps_backlog(&f->snaps);
  f->backlog_max = b > f->backlog_max ? b : f->backlog_max;
  f->drains++;
}
static int owed_none(void *arg) { (void)arg; return 0; }
static uint64_t count_none(void *arg) { (void)arg; return 0; }

/* A shard of the default mlp (adam: an image of three chunks), restored
 * from Redis as a ps starts (its epoch taken), and its snapshots on a
 * link that connects now. */
/* The shard's options, and its layout hash into f->hash. */
static ps_shard_opts shard_opts(fx *f) {
  if (f->sparse) {
    f->hash = 0x5ba25e5ba25eULL;
    return opts();
  }
  ps_errbuf eb = {0};
  if (f->layout.hash == 0 && ps_layout_for_cluster(&f->cfg, &f->model, &f->layout, &eb) != 0)
    fail_msg("layout: %s", eb.msg);
  f->hash = f->layout.hash;
  return ps_shard_opts_for(&f->cfg, &f->layout, 0);
}

static void start(fx *f) {
  ps_errbuf eb = {0};
  ps_shard_opts so = shard_opts(f);
  f->shard = ps_shard_new(&so, NULL);
  assert_non_null(f->shard);
  if (ps_replica_restore(&f->cfg, 0, f->hash, f->shard, &no_stop, &f->ri, &eb) != 0)
    fail_msg("restore: %s", eb.msg);
  ps_shard_keys_init(&f->k, f->cfg.cluster_id, 0);
  ps_shard_keys_log(&f->k, f->ri.epoch);
  ps_link_events le = {.arg = f, .up = on_up, .down = on_down, .fenced = on_fenced,
                       .released = on_nothing};
  ps_link_init(&f->link, &f->loop, &f->cfg, 0, f->ri.epoch, &f->k, f->ri.loaded, &le);
  ps_snap_events se = {.arg = f, .before_copy = on_nothing, .switched = on_switched,
                       .closed = on_nothing, .owed = owed_none, .nondurable = count_none,
                       .held = count_none, .drained = on_drained};
  ps_snaps_init(&f->snaps, &f->link, f->shard, f->hash, &f->ri, &se);
  uv_timer_init(&f->loop, &f->tick);
  f->tick.data = f;
  uv_timer_start(&f->tick, on_tick, (uint64_t)f->cfg.replicate_interval_ms,
                 (uint64_t)f->cfg.replicate_interval_ms);
  f->open = 1;
  f->switches = 0;
  ps_link_connect(&f->link);
}

static int closed(void *arg) {
  fx *f = arg;
  return !ps_link_busy(&f->link) && !ps_snaps_busy(&f->snaps) && !uv_loop_alive(&f->loop);
}

/* The clean stop (a last snapshot when the state is newer), and the
 * shard freed (not its layout: a restore follows). */
static void stop(fx *f) {
  if (!f->open)
    return;
  f->open = 0;
  uv_close((uv_handle_t *)&f->tick, NULL);
  ps_link_close(&f->link);
  ps_snaps_close(&f->snaps);
  wait_until(&f->loop, closed, f, "the snapshots' close");
  ps_shard_free(f->shard);
  f->shard = NULL;
}

/* Three pushes of worker 0 applied: the state moves on. */
static void push3(fx *f) {
  size_t n = ps_shard_options(f->shard)->nfloats;
  float *g = malloc(n * sizeof *g);
  assert_non_null(g);
  for (int p = 0; p < 3; p++) {
    for (size_t i = 0; i < n; i++)
      g[i] = 0.001f * (float)((i + f->seq) % 13) - 0.006f;
    f->seq++;
    assert_int_equal(ps_shard_push(f->shard, 0, 1, f->seq, ps_shard_version(f->shard), g, NULL, 0, NULL),
                     PS_SHARD_APPLIED);
    ps_snaps_updated(&f->snaps);
  }
  free(g);
}

/* The shard's state image, to compare (free it). */
static float *image_of(const ps_shard *s, uint64_t *floats) {
  ps_state_info in = ps_shard_state_info(s);
  float *img = malloc(in.image_floats * sizeof *img);
  assert_non_null(img);
  ps_shard_state_write(s, img);
  *floats = in.image_floats;
  return img;
}

/* A new incarnation of the shard, started as a ps starts: its restore
 * takes the epoch (fencing every older one) and loads what Redis holds.
 * @return it (free it). */
static ps_shard *restore_next(fx *f, ps_restore_info *ri) {
  ps_shard_opts so = shard_opts(f);
  ps_shard *s = ps_shard_new(&so, NULL);
  assert_non_null(s);
  ps_errbuf eb = {0};
  if (ps_replica_restore(&f->cfg, 0, f->hash, s, &no_stop, ri, &eb) != 0)
    fail_msg("the next incarnation's restore: %s", eb.msg);
  return s;
}

/* A new incarnation's restore loads exactly `want` (and replays
 * nothing: the tests append no log entry). */
static void assert_restores(fx *f, const float *want, uint64_t floats, uint64_t version) {
  ps_restore_info ri;
  ps_shard *s = restore_next(f, &ri);
  assert_int_equal(ri.loaded, 1);
  assert_int_equal(ri.snap_version, version);
  assert_int_equal(ri.replayed, 0);
  assert_int_equal(ps_shard_version(s), version);
  uint64_t got_floats;
  float *got = image_of(s, &got_floats);
  assert_int_equal(got_floats, floats);
  assert_memory_equal(got, want, floats * sizeof *got);
  free(got);
  ps_shard_free(s);
}

static int switched1(void *f) { return ((fx *)f)->switches >= 1; }
static int switched2(void *f) { return ((fx *)f)->switches >= 2; }

/* The id of the snapshot the meta names, into id. */
static void meta_snap(fx *f, char *id, size_t len) {
  assert_true(redis_str(redis, id, len, "HGET %s snap", f->k.meta));
}

/* Each test: an empty Redis, a config whose shards initialize
 * themselves, a fresh loop. */
static int setup(void **state) {
  static fx the;
  fx *f = *state = &the;
  memset(f, 0, sizeof *f);
  redis_ok(redis, "ACL SETUSER default allkeys");
  redis_ok(redis, "FLUSHALL");
  redis_server_config(&server, at("c.conf"), &f->cfg,
                      "timeout_ms = 2000\n[replication]\nmode = snapshot\ninterval_ms = 50\n"
                      "self_init = yes\n");
  return uv_loop_init(&f->loop);
}

static int teardown(void **state) {
  fx *f = *state;
  redis_ok(redis, "ACL SETUSER default allkeys");
  stop(f);
  if (f->layout.hash != 0) {
    ps_layout_close(&f->layout);
    ps_model_close(&f->model);
  }
  return loop_close_clean(&f->loop);
}

/* The first connection writes a snapshot of the fresh state; after three
 * pushes the next one covers them (their journal count), and a new
 * incarnation restores that state to the byte: values, adam's slots,
 * version, exactly-once row. */
static void test_restores_exact_state(void **state) {
  fx *f = *state;
  start(f);
  assert_int_equal(f->ri.loaded, 0);
  wait_until(&f->loop, switched1, f, "the first snapshot");
  assert_int_equal(f->switched_n, 0);
  push3(f);
  ps_snaps_tick(&f->snaps);
  wait_until(&f->loop, switched2, f, "the snapshot of 3 pushes");
  assert_int_equal(f->switched_n, 3);
  assert_int_equal(ps_snaps_lag(&f->snaps), 0);
  char id[64];
  meta_snap(f, id, sizeof id);
  char chunks[16];
  assert_true(redis_str(redis, chunks, sizeof chunks, "HGET %s chunks", f->k.meta));
  assert_string_equal(chunks, "3");  /* the image spans several chunks */

  uint64_t floats, version = ps_shard_version(f->shard);
  float *want = image_of(f->shard, &floats);
  stop(f);
  assert_restores(f, want, floats, version);
  free(want);
}

/* Every key of the shard but the chunks numbered 1 taken from the ACL:
 * the next snapshot is registered, its chunks 0 and 2 stored, its chunk 1
 * refused (NOPERM), and it fails on the way. */
static int refused_chunk(void *arg) {
  fx *f = arg;
  char info[8192];
  redis_str(redis, info, sizeof info, "INFO errorstats");
  return strstr(info, "errorstat_NOPERM") != NULL && !ps_snaps_busy(&f->snaps);
}
static void fail_next_snapshot(fx *f) {
  const char *t = f->k.tag;
  redis_ok(redis, "CONFIG RESETSTAT");
  redis_ok(redis, "ACL SETUSER default resetkeys ~%s:snap:*:0 ~%s:snap:*:2 ~%s:meta ~%s:epoch "
           "~%s:logkey ~%s:log:* ~%s:snaps ~%s:node", t, t, t, t, t, t, t, t);
  ps_snaps_tick(&f->snaps);
  wait_until(&f->loop, refused_chunk, f, "a chunk refused");
}

/* A snapshot that fails on the way (fail_next_snapshot) leaves the meta
 * on the previous snapshot, whose chunks are whole, and a restore loads
 * that one, not the newer state.  (Planted: snapshot.c switching once its
 * chunk SETs were answered, failed or not, made the meta name the
 * half-written snapshot, and this failed.) */
static void test_failed_keeps_previous(void **state) {
  fx *f = *state;
  start(f);
  wait_until(&f->loop, switched1, f, "the first snapshot");
  push3(f);
  ps_snaps_tick(&f->snaps);
  wait_until(&f->loop, switched2, f, "the snapshot of 3 pushes");
  uint64_t floats, version = ps_shard_version(f->shard);
  float *want = image_of(f->shard, &floats);
  char id[64];
  meta_snap(f, id, sizeof id);

  push3(f);
  fail_next_snapshot(f);
  assert_int_equal(f->switches, 2);
  assert_true(ps_snaps_lag(&f->snaps) > 0);
  stop(f);  /* its last snapshot fails too */
  redis_ok(redis, "ACL SETUSER default allkeys");
  /* The failed one was registered and its first chunk stored. */
  char failed[64];
  snprintf(failed, sizeof failed, "%llu.3", (unsigned long long)f->ri.epoch);
  assert_int_equal(redis_int(redis, "HEXISTS %s %s", f->k.snaps, failed), 1);
  assert_int_equal(redis_int(redis, "EXISTS %s%s:0", f->k.snap_prefix, failed), 1);
  char now[64];
  meta_snap(f, now, sizeof now);
  assert_string_equal(now, id);
  for (int c = 0; c < 3; c++)
    assert_int_equal(redis_int(redis, "EXISTS %s%s:%d", f->k.snap_prefix, id, c), 1);
  assert_restores(f, want, floats, version);
  free(want);
}

/* Once Redis takes writes again the owed snapshot is retried (by the
 * interval's tick); its switch deletes the chunks and registrations of
 * every other snapshot: the one it replaced and the one that failed half
 * written.  (Planted: the GC keeping every registered id left both.) */
static int gc_done(void *arg) {
  fx *f = arg;
  return f->switches >= 2 && redis_int(redis, "HLEN %s", f->k.snaps) == 1;
}
static void test_switch_deletes_others(void **state) {
  fx *f = *state;
  start(f);
  wait_until(&f->loop, switched1, f, "the first snapshot");
  char first[64], failed[64];
  meta_snap(f, first, sizeof first);
  push3(f);
  fail_next_snapshot(f);
  snprintf(failed, sizeof failed, "%llu.2", (unsigned long long)f->ri.epoch);
  redis_ok(redis, "ACL SETUSER default allkeys");
  assert_int_equal(redis_int(redis, "EXISTS %s%s:0", f->k.snap_prefix, failed), 1);
  wait_until(&f->loop, gc_done, f, "the retried snapshot's switch and its GC");
  char id[64];
  meta_snap(f, id, sizeof id);
  assert_int_equal(redis_int(redis, "HEXISTS %s %s", f->k.snaps, id), 1);
  for (int c = 0; c < 3; c++) {
    assert_int_equal(redis_int(redis, "EXISTS %s%s:%d", f->k.snap_prefix, first, c), 0);
    assert_int_equal(redis_int(redis, "EXISTS %s%s:%d", f->k.snap_prefix, failed, c), 0);
    assert_int_equal(redis_int(redis, "EXISTS %s%s:%d", f->k.snap_prefix, id, c), 1);
  }
}

/* A newer incarnation took the shard (its restore's EPOCH): the old one's
 * next snapshot is refused at its switch (FENCED), the owner is told, and
 * the meta still names the snapshot it named. */
static int fenced(void *f) { return ((fx *)f)->fenced > 0; }
static void test_stale_switch_refused(void **state) {
  fx *f = *state;
  start(f);
  wait_until(&f->loop, switched1, f, "the first snapshot");
  char id[64];
  meta_snap(f, id, sizeof id);
  ps_restore_info ri;
  ps_shard_free(restore_next(f, &ri));
  push3(f);
  ps_snaps_tick(&f->snaps);
  wait_until(&f->loop, fenced, f, "the fence");
  assert_int_equal(f->switches, 1);
  char now[64];
  meta_snap(f, now, sizeof now);
  assert_string_equal(now, id);
}

/* In `log` mode a snapshot only compacts the log: every_updates (1 here)
 * starts none until the log appended since the last one holds log_ratio
 * (2 here) times the state image's bytes; a tick with no update since the previous one
 * (an idle shard) starts one at once.  (The ticks here are the test's
 * calls: the interval is an hour.) */
static void test_log_mode_waits_for_the_log(void **state) {
  fx *f = *state;
  f->cfg.replication = PS_REPLICATION_LOG;
  f->cfg.replicate_every_updates = 1;
  f->cfg.replicate_interval_ms = 3600000;
  f->cfg.replicate_log_ratio = 2;
  start(f);
  wait_until(&f->loop, switched1, f, "the first snapshot");
  uint64_t image = 2 * ps_shard_state_info(f->shard).image_floats * sizeof(float);
  push3(f);
  assert_false(ps_snaps_busy(&f->snaps));  /* three updates, no log: none */
  ps_snaps_logged(&f->snaps, image - 1);
  push3(f);
  assert_false(ps_snaps_busy(&f->snaps));  /* a byte short */
  ps_snaps_tick(&f->snaps);                /* updates since the previous tick: busy */
  assert_false(ps_snaps_busy(&f->snaps));
  ps_snaps_logged(&f->snaps, 1);
  push3(f);
  assert_true(ps_snaps_busy(&f->snaps));   /* the log holds two images: compact it */
  wait_until(&f->loop, switched2, f, "the snapshot once the log held two images");
  assert_int_equal(ps_snaps_lag(&f->snaps), 2);  /* it began at the first of the three */
  push3(f);
  assert_false(ps_snaps_busy(&f->snaps));
  ps_snaps_tick(&f->snaps);                /* updates since the previous tick */
  assert_false(ps_snaps_busy(&f->snaps));
  ps_snaps_tick(&f->snaps);                /* none since: idle, so now */
  assert_true(ps_snaps_busy(&f->snaps));
}

/* ------------------------------------------------- sparse tables' rows */

/* Pushes k0..k1-1 of rows (sparse_rows.h), worker 0, push k at global
 * step k / 3 (rows touched at one step rank by their order alone), then a
 * tick. */
static void push_rows(fx *f, int k0, int k1) {
  float g[N] = {0.1f, -0.2f, 0.3f, 0.0f, 0.5f};
  for (int k = k0; k < k1; k++) {
    ps_sparse_part part = {0};
    step_rows r;
    make_rows(&r, k);
    blocks(&r, &part);
    f->seq++;
    assert_int_equal(ps_shard_push(f->shard, 0, 1, f->seq, (uint64_t)k / 3, g, part.bytes,
                                   part.len, NULL),
                     PS_SHARD_APPLIED);
    ps_sparse_part_free(&part);
    ps_snaps_updated(&f->snaps);
  }
  ps_snaps_tick(&f->snaps);
}

static void assert_same_state(const ps_shard *a, const ps_shard *b) {
  uint64_t na, nb;
  float *xa = image_of(a, &na), *xb = image_of(b, &nb);
  assert_int_equal(na, nb);
  assert_memory_equal(xa, xb, na * sizeof(float));
  free(xa);
  free(xb);
}

/* In the switched callback, before this incarnation has sent one merge:
 * a new incarnation restores, finishing the merges itself, and holds
 * exactly this state. */
static void restore_at_switch(fx *f) {
  char deltas[24];
  assert_true(redis_str(redis, deltas, sizeof deltas, "HGET %s deltas", f->k.meta));
  ps_shard *s = restore_next(f, &f->at_switch);
  assert_int_equal(f->at_switch.merged, strtoull(deltas, NULL, 10));
  assert_true(f->at_switch.merged > 0);
  assert_same_state(f->shard, s);
  ps_shard_free(s);
}

static int switched_n_idle(void *arg) {
  fx *f = arg;
  return f->switches >= f->want && !ps_snaps_busy(&f->snaps);
}

/* Keyed rows in log mode: a snapshot is due once the log holds
 * [replication] log_max_mb MiB, the replay a restart would do, though
 * log_ratio (1000 here) would wait for a thousand snapshots' worth of
 * log. */
static void test_keyed_log_max(void **state) {
  fx *f = *state;
  f->sparse = 1;
  f->cfg.sparse_rows = PS_SPARSE_ROWS_KEYED;
  f->cfg.replication = PS_REPLICATION_LOG;
  f->cfg.replicate_every_updates = 1;
  f->cfg.replicate_interval_ms = 3600000;
  f->cfg.replicate_log_ratio = 1000;
  f->cfg.replicate_log_budget = 0;
  f->cfg.replicate_log_max_mb = 1;
  start(f);
  f->want = 1;
  wait_until(&f->loop, switched_n_idle, f, "the first snapshot, merged");
  push_rows(f, 0, 1);
  assert_false(ps_snaps_busy(&f->snaps));  /* a push, no log: none */
  ps_snaps_logged(&f->snaps, (1u << 20) - 1);
  push_rows(f, 1, 2);
  assert_false(ps_snaps_busy(&f->snaps));  /* a byte short */
  ps_snaps_logged(&f->snaps, 1);
  push_rows(f, 2, 3);
  assert_true(ps_snaps_busy(&f->snaps));   /* 1 MiB of log: compact it */
  f->want = 2;
  wait_until(&f->loop, switched_n_idle, f, "the snapshot once the log held 1 MiB, merged");
  /* The count starts again at the snapshot's cut. */
  ps_snaps_logged(&f->snaps, (1u << 20) - 1);
  push_rows(f, 3, 4);
  assert_false(ps_snaps_busy(&f->snaps));
  ps_snaps_logged(&f->snaps, 1);
  push_rows(f, 4, 5);
  assert_true(ps_snaps_busy(&f->snaps));
  /* What a restart would replay (the back-pressure's measure): the log
   * since the newest switched cut, and that snapshot's delta chunks until
   * they are merged.  Logged after this cut: 300 bytes. */
  assert_int_equal(ps_snaps_backlog(&f->snaps), 1u << 20);
  ps_snaps_logged(&f->snaps, 300);
  assert_int_equal(ps_snaps_backlog(&f->snaps), (1u << 20) + 300);
  f->backlog_max = 0;
  f->drains = 0;
  f->want = 3;
  wait_until(&f->loop, switched_n_idle, f, "the third snapshot, merged");
  assert_true(f->drains >= 2);  /* the switch, and each merge */
  assert_true(f->backlog_max >= 300 + PS_DELTA_BYTES);  /* its chunk(s) before their merge */
  assert_int_equal(ps_snaps_backlog(&f->snaps), 300);
}

/* Rows kept by key (REDIS.md format 5): the first snapshot writes every
 * row, each next one only the rows changed and removed since (admitted,
 * evicted for room, expired, pending keys counted and forgotten), merged
 * into the rows' hashes after its switch; a restore after a chain of them
 * holds exactly the shard's tables, lists in order, counts and stamps. */
static void test_rows_chain_restores_exact(void **state) {
  fx *f = *state;
  f->sparse = 1;
  f->cfg.sparse_rows = PS_SPARSE_ROWS_KEYED;
  start(f);
  wait_until(&f->loop, switched1, f, "the first snapshot");
  /* One push a snapshot: most rows are not changed by it, and rank
   * below those that are, some at the same step. */
  for (int round = 0; round < 24; round++) {
    push_rows(f, round, round + 1);
    f->want = f->switches + 1;
    wait_until(&f->loop, switched_n_idle, f, "a snapshot of the pushes, merged");
    assert_int_equal(ps_snaps_lag(&f->snaps), 0);
  }
  ps_table_stats st = ps_shard_table_stats(f->shard, 1);
  assert_true(st.evicted + st.expired > 0 && st.pending > 0);
  /* Every delta merged and deleted; the rows in their hashes. */
  char merged[24], deltas[24];
  assert_true(redis_str(redis, merged, sizeof merged, "HGET %s merged", f->k.meta));
  assert_true(redis_str(redis, deltas, sizeof deltas, "HGET %s deltas", f->k.meta));
  assert_string_equal(merged, deltas);
  ps_restore_info ri;
  ps_shard *s = restore_next(f, &ri);
  assert_int_equal(ri.loaded, 1);
  assert_int_equal(ri.merged, 0);
  assert_int_equal(ri.rows, ps_shard_table_stats(f->shard, 0).rows +
                                ps_shard_table_stats(f->shard, 0).pending + st.rows + st.pending);
  assert_same_state(f->shard, s);
  ps_shard_free(s);
}

/* Sparse tables kept in the image (sparse_rows = image, the default):
 * each snapshot holds every row, no hash is written, and a restore holds
 * exactly the shard's tables. */
static void test_rows_in_the_image(void **state) {
  fx *f = *state;
  f->sparse = 1;
  start(f);
  wait_until(&f->loop, switched1, f, "the first snapshot");
  push_rows(f, 0, 9);
  f->want = f->switches + 1;
  wait_until(&f->loop, switched_n_idle, f, "a snapshot of the pushes");
  assert_int_equal(redis_int(redis, "EXISTS %s0", f->k.rows_prefix), 0);
  ps_restore_info ri;
  ps_shard *s = restore_next(f, &ri);
  assert_int_equal(ri.rows, 0);
  assert_same_state(f->shard, s);
  ps_shard_free(s);
}

/* A shard killed between a switch and its merges: the next incarnation's
 * restore merges the delta chunks itself (restore_at_switch), and the
 * stale incarnation's merges, sent after, change nothing. */
static void test_rows_merged_by_the_restore(void **state) {
  fx *f = *state;
  f->sparse = 1;
  f->cfg.sparse_rows = PS_SPARSE_ROWS_KEYED;
  start(f);
  wait_until(&f->loop, switched1, f, "the first snapshot");
  push_rows(f, 0, 6);
  f->want = f->restore_at = f->switches + 1;
  wait_until(&f->loop, switched_n_idle, f, "a snapshot of the pushes");
  assert_int_equal(f->at_switch.loaded, 1);
  /* The stale merges found nothing to do: the state is the same. */
  ps_restore_info ri;
  f->restore_at = 0;
  ps_shard *s = restore_next(f, &ri);
  assert_int_equal(ri.merged, 0);
  assert_same_state(f->shard, s);
  ps_shard_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_restores_exact_state, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failed_keeps_previous, setup, teardown),
      cmocka_unit_test_setup_teardown(test_switch_deletes_others, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stale_switch_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_log_mode_waits_for_the_log, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rows_chain_restores_exact, setup, teardown),
      cmocka_unit_test_setup_teardown(test_keyed_log_max, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rows_merged_by_the_restore, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rows_in_the_image, setup, teardown),
  };
  return cmocka_run_group_tests(tests, redis_group_setup, redis_group_teardown);
}
