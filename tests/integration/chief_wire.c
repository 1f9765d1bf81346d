/* Talks to a running shard (shard 0 of the config given) as the chief, over
 * a real socket: the shard refuses a chief frame with a fence token lower
 * than the highest it has seen (ERROR naming both, connection closed), and
 * serves a FETCH only from the image of its newest CUT, named by cut id and
 * token. */
#include "tests/integration/wire_peer.h"

/* Send m and read its reply (or an ERROR). */
static ps_msg ask(int fd, ps_msg m) {
  send_msg(fd, &m, ++req_id);
  ps_frame_header h;
  if (!read_msg(fd, &m, &h))
    die("%s: connection closed without a reply", ps_proto_type_name(m.type));
  return m;
}

static void cut(int fd, uint64_t fence, uint64_t id) {
  ps_msg m = {.type = PS_MSG_CUT};
  m.u.cut = (ps_msg_cut){.fence = fence, .cut_id = id, .hold_ms = 2000};
  ps_msg r = ask(fd, m);
  if (r.type != PS_MSG_CUT_REPLY || r.u.cut_reply.cut_id != id)
    die("CUT %" PRIu64 " (token %" PRIu64 "): %s", id, fence,
        r.type == PS_MSG_ERROR ? r.u.error.message : ps_proto_type_name(r.type));
}

static void resume(int fd, uint64_t fence, uint64_t id) {
  ps_msg m = {.type = PS_MSG_RESUME};
  m.u.resume = (ps_msg_resume){.fence = fence, .cut_id = id};
  ps_msg r = ask(fd, m);
  if (r.type != PS_MSG_PONG || r.u.ping.token != id)
    die("RESUME %" PRIu64 ": %s", id, r.type == PS_MSG_ERROR ? r.u.error.message : "no PONG");
}

static ps_msg fetch_msg(uint64_t fence, uint64_t id) {
  ps_msg m = {.type = PS_MSG_FETCH};
  m.u.fetch = (ps_msg_fetch){.fence = fence, .cut_id = id, .offset = 0, .count = 1};
  return m;
}

static void fetch_ok(int fd, uint64_t fence, uint64_t id) {
  ps_msg r = ask(fd, fetch_msg(fence, id));
  if (r.type != PS_MSG_FETCH_REPLY || r.u.fetch_reply.cut_id != id || r.u.fetch_reply.count != 1)
    die("FETCH of cut %" PRIu64 " (token %" PRIu64 "): %s", id, fence,
        r.type == PS_MSG_ERROR ? r.u.error.message : ps_proto_type_name(r.type));
}

/* A shard started when Redis said the newest chief token is t: it
 * refuses t - 1 from its first frame, and serves t. */
static int restarted(uint64_t t) {
  int old = good_client(0, t - 1);
  send_msg(old, &(ps_msg){.type = PS_MSG_CUT, .u.cut = {.fence = t - 1, .cut_id = 1,
                                                        .hold_ms = 2000}}, ++req_id);
  char want[96];
  snprintf(want, sizeof want, "CUT with fence token %" PRIu64 ", but this shard has seen token %"
           PRIu64, t - 1, t);
  expect_refusal(old, "the first CUT, of a token below Redis's", want);
  int a = good_client(0, t);
  cut(a, t, 1);
  fetch_ok(a, t, 1);
  resume(a, t, 1);
  printf("ok: a restarted shard refused token %" PRIu64 " at once and served token %" PRIu64
         " (Redis's newest)\n", t - 1, t);
  close(a);
  peer_close();
  return 0;
}

int main(int argc, char **argv) {
  peer_role = PS_ROLE_CHIEF;
  if (argc != 2 && !(argc == 4 && strcmp(argv[2], "--restarted") == 0))
    die("usage: chief_wire CONFIG [--restarted TOKEN] (shard 0 of CONFIG running, initialized)");
  peer_setup(argv[1]);
  if (argc == 4)
    return restarted(strtoull(argv[3], NULL, 10));

  /* Chief token 5 cuts, fetches and resumes. */
  int a = good_client(0, 5);
  cut(a, 5, 1);
  fetch_ok(a, 5, 1);
  resume(a, 5, 1);
  printf("ok: token 5: CUT, FETCH, RESUME of cut 1 served\n");

  /* An older token is refused, whatever the frame, and changes nothing. */
  static const int types[] = {PS_MSG_CUT, PS_MSG_RESUME, PS_MSG_FETCH, PS_MSG_STOP};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    int old = good_client(0, 4);
    ps_msg m = {.type = (ps_msg_type)types[i]};
    m.u.cut = (ps_msg_cut){.fence = 4, .cut_id = 1, .hold_ms = 2000};
    if (types[i] == PS_MSG_RESUME)
      m.u.resume = (ps_msg_resume){.fence = 4, .cut_id = 1};
    if (types[i] == PS_MSG_FETCH)
      m = fetch_msg(4, 1);
    if (types[i] == PS_MSG_STOP)
      m.u.stop = (ps_msg_stop){.fence = 4, .step = 1};
    send_msg(old, &m, ++req_id);
    char what[64], want[96];
    snprintf(what, sizeof what, "%s with token 4 after token 5", ps_proto_type_name(types[i]));
    snprintf(want, sizeof want, "%s with fence token 4, but this shard has seen token 5",
             ps_proto_type_name(types[i]));
    expect_refusal(old, what, want);
  }
  /* Token 5 is still served: the refusals changed nothing (no STOP). */
  fetch_ok(a, 5, 1);

  /* A FETCH of a cut the shard does not hold is refused. */
  send_msg(a, &(ps_msg){.type = PS_MSG_FETCH, .u.fetch = {.fence = 5, .cut_id = 2, .count = 1}},
           ++req_id);
  expect_refusal(a, "FETCH of cut 2, never cut", "holds cut 1 of token 5 only");

  /* A newer chief (token 6) numbers its cuts from 1 too: its FETCH of cut
   * 1 is not served from token 5's image, and once it has cut, token 5's
   * fetches are refused. */
  int b = good_client(0, 6);
  send_msg(b, &(ps_msg){.type = PS_MSG_FETCH, .u.fetch = {.fence = 6, .cut_id = 1, .count = 1}},
           ++req_id);
  expect_refusal(b, "FETCH of cut 1 by token 6, cut by token 5", "holds cut 1 of token 5 only");
  b = good_client(0, 6);
  cut(b, 6, 1);
  fetch_ok(b, 6, 1);
  resume(b, 6, 1);
  a = good_client(0, 5);
  send_msg(a, &(ps_msg){.type = PS_MSG_FETCH, .u.fetch = {.fence = 5, .cut_id = 1, .count = 1}},
           ++req_id);
  expect_refusal(a, "FETCH by token 5 after token 6 cut", "fence token 5, but this shard has seen token 6");
  close(b);
  peer_close();
  return 0;
}
