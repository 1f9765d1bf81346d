/* What include/paramserv/client.h promises a client can still do after
 * -ETIMEDOUT and -EINTR: call again.  Driven by client.sh against 2 shards
 * in sync mode with 2 workers, [worker] give_up_s = 5, shard 1 not yet
 * started; it is worker 0:
 *
 *   1. pull: shard 1 is unreachable past the give-up time: -ETIMEDOUT
 *      ("gave up"; client.sh then starts shard 1);
 *   2. pull again: it waits the give-up time anew and gets the weights;
 *   3. push a gradient of zeros;
 *   4. pull with the stop flag raised 1 s in: the shards hold that pull
 *      until worker 1 pushes, so -EINTR ("interrupted"; client.sh then runs
 *      worker 1 for one step);
 *   5. pull again (the flag clear): the weights of the next step (the
 *      shards refuse a second pull on the connection that holds the first,
 *      so the client must have dropped it).
 *
 *   client_retry CONFIG */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "paramserv/client.h"

static volatile sig_atomic_t stop;

static void on_alarm(int sig) {
  (void)sig;
  stop = 1;
}

static int expect(ps_client *c, int rc, int want, const char *what) {
  if (rc == want)
    return 0;
  fprintf(stderr, "client_retry: %s: %d (%s), expected %d: %s\n", what, rc, ps_strerror(rc), want,
          rc != 0 ? ps_client_error(c) : "");
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: client_retry CONFIG\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  ps_errbuf eb = {0};
  ps_client *c = ps_client_new(argv[1], 0, &eb);
  if (c == NULL) {
    fprintf(stderr, "client_retry: %s\n", ps_errbuf_message(&eb));
    return 1;
  }
  signal(SIGALRM, on_alarm);
  ps_client_set_stop_flag(c, &stop);
  float *params = ps_client_arena_new(c), *grad = ps_client_arena_new(c);
  int bad = params == NULL || grad == NULL;

  bad = bad || expect(c, ps_client_pull(c, params), -ETIMEDOUT, "pull with shard 1 down");
  if (!bad)
    printf("retry: gave up: %s\n", ps_client_error(c));
  bad = bad || expect(c, ps_client_pull(c, params), 0, "pull after giving up");
  if (!bad)
    printf("retry: pulled after giving up\n");
  bad = bad || expect(c, ps_client_push(c, grad), 0, "push");
  alarm(1);
  bad = bad || expect(c, ps_client_pull(c, params), -EINTR, "pull held for worker 1");
  stop = 0;
  if (!bad)
    printf("retry: interrupted: %s\n", ps_client_error(c));
  bad = bad || expect(c, ps_client_pull(c, params), 0, "pull after the interruption");
  if (!bad)
    printf("retry: pulled after the interruption at global step %llu\n",
           (unsigned long long)ps_client_global_step(c));
  free(params);
  free(grad);
  ps_client_free(c);
  return bad;
}
