/* src/replica/link.c against a real redis-server on a private port: a
 * shard's run-time connection (REDIS.md §5, §8, §11, §12): CLAIM on every
 * connection, AUTH, FENCED, LOST, READONLY, the heartbeat, WAIT and the
 * deadline.  Every wait is for an event (a callback of the link, a key in
 * Redis), with a deadline that only bounds a hang. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/config.h"
#include "common/log.h"
#include "replica/keys.h"
#include "replica/link.h"
#include "redis_server.h"

#define EPOCH 5

typedef struct fx {
  redis_server other;     /* a second server: a password, a replica, a new primary */
  ps_config cfg;
  ps_shard_keys k;
  uv_loop_t loop;
  ps_link link;
  int link_open;
  /* What the link reported. */
  int ups, claimed, downs, fenced;
  char fenced_why[128];
  /* The answer to a command the test sent on the link's connection. */
  int answered;
  char answer[160];
  const char *wait_failure;
} fx;

static void on_up(void *arg, int claimed) {
  fx *f = arg;
  f->ups++;
  f->claimed = claimed;
}
static void on_down(void *arg) { ((fx *)arg)->downs++; }
static void on_fenced(void *arg, const char *why) {
  fx *f = arg;
  f->fenced++;
  snprintf(f->fenced_why, sizeof f->fenced_why, "%s", why);
}
static void on_released(void *arg) { (void)arg; }

/* A config for this test (extra: more of [redis], then other sections),
 * and the link of shard 0, incarnation EPOCH, not connected yet. */
static void open_link(fx *f, const redis_server *s, int meta_expected, const char *extra) {
  redis_server_config(s, at("c.conf"), &f->cfg, "timeout_ms = 1000\n%s"
                      "[replication]\ninterval_ms = 50\n[worker]\nheartbeat_ms = 1000\n", extra);
  ps_shard_keys_init(&f->k, f->cfg.cluster_id, 0);
  ps_shard_keys_log(&f->k, EPOCH);
  ps_link_events ev = {.arg = f, .up = on_up, .down = on_down, .fenced = on_fenced,
                       .released = on_released};
  ps_link_init(&f->link, &f->loop, &f->cfg, 0, EPOCH, &f->k, meta_expected, &ev);
  f->link_open = 1;
}

static int is_up(void *f) { return ps_link_up(&((fx *)f)->link); }
static int is_down(void *f) { return ((fx *)f)->downs > 0; }
static int downs2(void *f) { return ((fx *)f)->downs >= 2; }
static int fenced(void *f) { return ((fx *)f)->fenced > 0; }
static int answered(void *f) { return ((fx *)f)->answered; }
static int link_gone(void *f) { return !ps_link_busy(&((fx *)f)->link); }

/* Connect and wait until CLAIM answered. */
static void connect_up(fx *f) {
  ps_link_connect(&f->link);
  wait_until(&f->loop, is_up, f, "the link up");
}

/* Close the link (the timer, the connection) and check that the loop
 * holds nothing. */
static void close_link(fx *f) {
  if (!f->link_open)
    return;
  f->link_open = 0;
  ps_link_close(&f->link);
  ps_link_disconnect(&f->link);
  wait_until(&f->loop, link_gone, f, "the link's close");
}

/* A command the test sends on the link's connection; its reply goes
 * through ps_link_check_role, as the log's and snapshots' do. */
static void on_checked(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  fx *f = priv;
  redisReply *rep = reply;
  snprintf(f->answer, sizeof f->answer, "%s", rep != NULL && rep->str ? rep->str : "");
  ps_link_check_role(&f->link, rep);
  f->answered = 1;
}

static void send_checked(fx *f, const char *cmd) {
  f->answered = 0;
  assert_int_equal(redisAsyncCommand(ps_link_ac(&f->link), on_checked, f, cmd), REDIS_OK);
  wait_until(&f->loop, answered, f, cmd);
}

/* Each test starts from an empty Redis and a fresh loop. */
static int setup(void **state) {
  static fx the;
  fx *f = *state = &the;
  memset(f, 0, sizeof *f);
  redis_ok(redis, "REPLICAOF NO ONE");  /* test_readonly's, if it failed as a replica */
  redis_ok(redis, "FLUSHALL");
  return uv_loop_init(&f->loop);
}

static int teardown(void **state) {
  fx *f = *state;
  kill(server.pid, SIGCONT);  /* test_deadline's, if it failed while stopped */
  close_link(f);
  redis_server_stop(&f->other);
  return loop_close_clean(&f->loop);
}

/* The first connection to a Redis that holds none of the shard's keys is
 * CLAIMED: the epoch, the log key and an (empty) stream are written.  A
 * second connection finds them all and is OK. */
static void test_claim(void **state) {
  fx *f = *state;
  open_link(f, &server, 0, "");
  connect_up(f);
  assert_int_equal(f->ups, 1);
  assert_int_equal(f->claimed, 1);
  char v[PS_KEY_MAX];
  assert_true(redis_str(redis, v, sizeof v, "GET %s", f->k.epoch));
  assert_string_equal(v, "5");
  assert_true(redis_str(redis, v, sizeof v, "GET %s", f->k.logkey));
  assert_string_equal(v, f->k.log);
  assert_int_equal(redis_int(redis, "EXISTS %s", f->k.log), 1);
  close_link(f);

  f->ups = 0;
  open_link(f, &server, 0, "");
  connect_up(f);
  assert_int_equal(f->claimed, 0);
}

/* A link told a snapshot is in Redis (meta expected) claims when the meta
 * is gone although the epoch, log key and stream hold, and then expects
 * none any more (nothing of the shard Redis held is left). */
static void test_claim_lost_meta(void **state) {
  fx *f = *state;
  open_link(f, &server, 0, "");
  connect_up(f);
  close_link(f);
  f->ups = 0;
  open_link(f, &server, 1, "");
  connect_up(f);
  assert_int_equal(f->claimed, 1);
  assert_int_equal(f->link.meta_expected, 0);
}

/* A Redis that requires a password: the right one in [redis]
 * password_file connects; a wrong one, or none, never comes up, writes
 * nothing, and is retried (a second down). */
static void test_auth(void **state) {
  fx *f = *state;
  const char *args[] = {"--requirepass", "s3cret", NULL};
  assert_int_equal(redis_server_start(&f->other, tmp, args), 0);
  redisContext *oc = redis_server_connect(&f->other);
  assert_non_null(oc);

  tmpdir_put("right", "s3cret\n", 0600);
  open_link(f, &f->other, 0, "password_file = right\n");
  connect_up(f);
  assert_int_equal(f->claimed, 1);
  close_link(f);

  const char *wrong[] = {"password_file = wrong\n", ""};
  tmpdir_put("wrong", "s3cre7\n", 0600);
  for (int i = 0; i < 2; i++) {
    redis_ok(oc, "FLUSHALL");
    f->ups = f->downs = 0;
    open_link(f, &f->other, 0, wrong[i]);
    ps_link_connect(&f->link);
    wait_until(&f->loop, downs2, f, "a refused connection retried");
    assert_int_equal(f->ups, 0);
    assert_false(ps_link_up(&f->link));
    assert_int_equal(redis_int(oc, "EXISTS %s", f->k.epoch), 0);
    close_link(f);
  }
  redisFree(oc);
}

/* A Redis holding a newer incarnation's epoch: CLAIM answers FENCED, the
 * owner hears it once, the link never comes up and never reconnects. */
static void test_fenced_at_claim(void **state) {
  fx *f = *state;
  open_link(f, &server, 0, "");
  redis_ok(redis, "SET %s 6", f->k.epoch);
  ps_link_connect(&f->link);
  wait_until(&f->loop, fenced, f, "the fence");
  assert_true(ps_link_fenced(&f->link));
  assert_int_equal(f->ups, 0);
  assert_string_equal(f->fenced_why, "FENCED epoch is 6");
  /* Dropped from Redis's side now: no reconnection is scheduled. */
  redis_ok(redis, "CLIENT KILL TYPE normal SKIPME yes");
  wait_until(&f->loop, is_down, f, "the connection's loss");
  assert_true(ps_link_fenced(&f->link));
  assert_false(uv_is_active((uv_handle_t *)&f->link.retry));
}

/* Up, then a newer incarnation moves the epoch: two heartbeats in flight
 * are both answered FENCED, and the owner hears it once (planted: without
 * ps_link_fence's "once", fenced counted 2 and this failed). */
static void test_fenced_once(void **state) {
  fx *f = *state;
  open_link(f, &server, 0, "");
  connect_up(f);
  redis_ok(redis, "SET %s 9", f->k.epoch);
  ps_link_heartbeat(&f->link, "one");
  ps_link_heartbeat(&f->link, "two");
  wait_until(&f->loop, fenced, f, "the fence");
  send_checked(f, "PING");  /* both heartbeats are answered before it */
  char v[64];
  assert_false(redis_str(redis, v, sizeof v, "GET %s", f->k.node));
  assert_int_equal(f->fenced, 1);
  assert_string_equal(f->fenced_why, "FENCED epoch is 9");
  assert_false(ps_link_up(&f->link));
}

/* The heartbeat, while every key holds, sets P:node to its payload with a
 * TTL of three heartbeat_ms. */
static int node_set(void *f) {
  char v[64];
  return redis_str(redis, v, sizeof v, "GET %s", ((fx *)f)->k.node) &&
         strcmp(v, "pid 1 step 2") == 0;
}
static void test_heartbeat(void **state) {
  fx *f = *state;
  open_link(f, &server, 0, "");
  connect_up(f);
  ps_link_heartbeat(&f->link, "pid 1 step 2");
  wait_until(&f->loop, node_set, f, "the heartbeat");
  long long ttl = redis_int(redis, "PTTL %s", f->k.node);
  assert_true(ttl > 0 && ttl <= 3000);
  assert_true(ps_link_up(&f->link));
  assert_int_equal(f->downs, 0);
}

/* Redis loses the shard's stream under a live connection: the heartbeat's
 * LOST drops the connection, the reconnection's CLAIM claims it back
 * (CLAIMED), and the heartbeat wrote nothing meanwhile. */
static int two_ups(void *f) { return ((fx *)f)->ups >= 2; }
static void test_lost_reclaimed(void **state) {
  fx *f = *state;
  open_link(f, &server, 0, "");
  connect_up(f);
  assert_int_equal(redis_int(redis, "DEL %s", f->k.log), 1);
  ps_link_heartbeat(&f->link, "lost?");
  wait_until(&f->loop, two_ups, f, "the reconnection");
  assert_int_equal(f->downs, 1);
  assert_int_equal(f->claimed, 1);
  assert_int_equal(redis_int(redis, "EXISTS %s", f->k.log), 1);
  assert_int_equal(redis_int(redis, "EXISTS %s", f->k.node), 0);
}

/* INFO replication of the server says all of `want` (words of arg). */
static int replication_says(void *want) {
  char info[4096];
  redis_str(redis, info, sizeof info, "INFO replication");
  for (const char *const *w = want; *w != NULL; w++)
    if (strstr(info, *w) == NULL)
      return 0;
  return 1;
}
static const char *const replica_online[] = {"connected_slaves:1", "state=online", NULL};
static const char *const synced[] = {"master_link_status:up", NULL};

/* The server is made a replica of an empty primary (a failover demoted
 * it): a write's READONLY drops the connection; CLAIM, which must write
 * the lost keys back, is refused while it is a replica and the link stays
 * down; once it is a primary again the link comes back, CLAIMED.  Another
 * error reply leaves the connection up. */
static void test_readonly(void **state) {
  fx *f = *state;
  open_link(f, &server, 0, "");
  connect_up(f);
  redis_ok(redis, "SET {test}:x text");
  send_checked(f, "INCR {test}:x");
  assert_true(strstr(f->answer, "not an integer") != NULL);
  assert_true(ps_link_up(&f->link));

  /* A replica of an empty primary, synced: the shard's keys are gone. */
  assert_int_equal(redis_server_start(&f->other, tmp, NULL), 0);
  redis_ok(redis, "REPLICAOF 127.0.0.1 %d", f->other.port);
  wait_until(NULL, replication_says, (void *)synced, "the replica's sync");
  send_checked(f, "SET {test}:x 1");
  assert_true(strncmp(f->answer, "READONLY", 8) == 0);
  wait_until(&f->loop, downs2, f, "the drop, and a reconnection refused");
  assert_int_equal(f->ups, 1);
  assert_false(ps_link_up(&f->link));

  redis_ok(redis, "REPLICAOF NO ONE");
  wait_until(&f->loop, two_ups, f, "the reconnection to the primary again");
  assert_int_equal(f->claimed, 1);
}

/* WAIT with [replication] redis_replicas = 1: with no replica the answer
 * names the shortfall; with one online it is confirmed.  With 0 a WAIT is
 * confirmed at once.  (Planted: ps_link_wait_failure asking for more than
 * redis_replicas failed the confirmed case.) */
static void on_waited(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  fx *f = priv;
  f->wait_failure = ps_link_wait_failure(&f->link, reply, f->answer, sizeof f->answer);
  f->answered = 1;
}

static const char *send_wait(fx *f) {
  f->answered = 0;
  assert_int_equal(ps_link_send_wait(&f->link, ps_link_ac(&f->link), on_waited, f), 0);
  wait_until(&f->loop, answered, f, "WAIT's answer");
  return f->wait_failure;
}

static void test_wait(void **state) {
  fx *f = *state;
  open_link(f, &server, 0, "");
  connect_up(f);
  assert_int_equal(ps_link_wait_replicas(&f->link), 0);
  assert_null(send_wait(f));
  close_link(f);

  open_link(f, &server, 0, "[replication]\nredis_replicas = 1\n");
  connect_up(f);
  assert_int_equal(ps_link_wait_replicas(&f->link), 1);
  const char *why = send_wait(f);
  assert_non_null(why);
  assert_true(strncmp(why, "0 of 1 Redis replicas confirmed it", 34) == 0);

  char port[16];
  snprintf(port, sizeof port, "%d", server.port);
  const char *args[] = {"--replicaof", "127.0.0.1", port, NULL};
  assert_int_equal(redis_server_start(&f->other, tmp, args), 0);
  wait_until(NULL, replication_says, (void *)replica_online, "the replica online");
  assert_null(send_wait(f));
}

/* A Redis that stops answering (SIGSTOP) is noticed by the deadline: the
 * pending heartbeat's connection is dropped; once Redis runs again the
 * link reconnects. */
static void test_deadline(void **state) {
  fx *f = *state;
  open_link(f, &server, 0, "");
  connect_up(f);
  assert_int_equal(kill(server.pid, SIGSTOP), 0);
  ps_link_heartbeat(&f->link, "stopped");
  wait_until(&f->loop, is_down, f, "the deadline's drop");
  assert_int_equal(kill(server.pid, SIGCONT), 0);
  assert_int_equal(f->fenced, 0);
  wait_until(&f->loop, two_ups, f, "the reconnection");
  assert_int_equal(f->claimed, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_claim, setup, teardown),
      cmocka_unit_test_setup_teardown(test_claim_lost_meta, setup, teardown),
      cmocka_unit_test_setup_teardown(test_auth, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fenced_at_claim, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fenced_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_heartbeat, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lost_reclaimed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_readonly, setup, teardown),
      cmocka_unit_test_setup_teardown(test_wait, setup, teardown),
      cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
  };
  return cmocka_run_group_tests(tests, redis_group_setup, redis_group_teardown);
}
