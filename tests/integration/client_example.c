/* An example of a user's own training loop on the paramserv client library
 * (include/paramserv/client.h): a small autoencoder, a model no built-in
 * is, declared by a variables file (models/examples/autoencoder.vars.json)
 * and trained through the cluster's shards.  It computes its gradient
 * itself, in plain C, on synthetic images; the shards apply the optimizer,
 * replicate and checkpoint.  Built and run by tests/integration/client.sh
 * (and out of tree, against an installed library, by install.sh).
 *
 *   client_example CONFIG WORKER STEPS
 *   client_example --options CLUSTER_ID SECRET_FILE VARIABLES_FILE SHARDS WORKER STEPS
 *
 * The first opens the client from the cluster's config file
 * (ps_client_new); the second from those settings alone
 * (ps_client_new_opts): SHARDS is the shards' host:port, comma-separated,
 * and the secret is read here and handed over as bytes, as a program that
 * keeps it elsewhere would.  It prints the mean squared reconstruction
 * error on 500 fresh images before and after training. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paramserv/client.h"

#define IN 784
#define KINDS 10
#define BATCH 32

/* Synthetic images: one of 10 fixed random +-1 patterns plus noise, so a
 * 16-wide code can hold what is not noise. */
static float prototype[KINDS][IN];
static unsigned long long rng_state = 88172645463325252ULL;

static double uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void sample(float *x) {
  int k = (int)(uniform() * KINDS);
  for (int i = 0; i < IN; i++)
    x[i] = prototype[k][i] + (float)(0.6 * uniform() - 0.3);
}

/* The model's variables, as views into one arena. */
typedef struct net {
  int h;                /* code width */
  float *we, *be, *wd, *bd;
} net;

static int views(ps_client *c, float *arena, net *n) {
  const ps_var *v;
  n->we = ps_client_view(c, arena, "encoder.weight", &v);
  n->h = v != NULL && v->ndim == 2 && v->shape[1] == IN ? (int)v->shape[0] : 0;
  n->be = ps_client_view(c, arena, "encoder.bias", NULL);
  n->wd = ps_client_view(c, arena, "decoder.weight", NULL);
  n->bd = ps_client_view(c, arena, "decoder.bias", NULL);
  return n->h > 0 && n->be && n->wd && n->bd ? 0 : -1;
}

/* code = tanh(We x + be), r = Wd code + bd; @return 0.5 * mean (r - x)^2. */
static double forward(const net *p, const float *x, float *code, float *r) {
  for (int j = 0; j < p->h; j++) {
    float z = p->be[j];
    for (int i = 0; i < IN; i++)
      z += p->we[j * IN + i] * x[i];
    code[j] = tanhf(z);
  }
  double err = 0.0;
  for (int i = 0; i < IN; i++) {
    float v = p->bd[i];
    for (int j = 0; j < p->h; j++)
      v += p->wd[i * p->h + j] * code[j];
    r[i] = v;
    err += 0.5 * (double)(v - x[i]) * (v - x[i]);
  }
  return err / IN;
}

static double test_error(const net *p, float *x, float *code, float *r) {
  double sum = 0.0;
  for (int s = 0; s < 500; s++) {
    sample(x);
    sum += forward(p, x, code, r);
  }
  return sum / 500;
}

/* A client from settings alone: argv = CLUSTER_ID SECRET_FILE
 * VARIABLES_FILE SHARDS WORKER. */
static ps_client *client_from_options(char **argv, ps_errbuf *eb) {
  unsigned char secret[4096];
  size_t len = 0;
  FILE *f = fopen(argv[1], "rb");
  if (f != NULL) {
    len = fread(secret, 1, sizeof secret, f);
    fclose(f);
  }
  if (len > 0 && secret[len - 1] == '\n')
    len--;  /* as the library reads a secret_file */
  const char *shards[64];
  int n = 0;
  for (char *p = strtok(argv[3], ","); p != NULL && n < 64; p = strtok(NULL, ","))
    shards[n++] = p;
  ps_client_options o = PS_CLIENT_OPTIONS_INIT;
  o.cluster_id = argv[0];
  o.secret = secret;
  o.secret_len = len;
  o.variables_file = argv[2];
  o.shards = shards;
  o.nshards = n;
  o.worker = atoi(argv[4]);
  return ps_client_new_opts(&o, eb);
}

int main(int argc, char **argv) {
  int opts = argc == 8 && strcmp(argv[1], "--options") == 0;
  if (argc != 4 && !opts) {
    fprintf(stderr, "usage: client_example CONFIG WORKER STEPS\n"
                    "       client_example --options CLUSTER_ID SECRET_FILE VARIABLES_FILE "
                    "SHARDS WORKER STEPS\n");
    return 2;
  }
  ps_errbuf eb = {0};
  ps_client *c = opts ? client_from_options(argv + 2, &eb)
                      : ps_client_new(argv[1], atoi(argv[2]), &eb);
  if (c == NULL) {
    fprintf(stderr, "client_example: %s\n", ps_errbuf_message(&eb));
    return 1;
  }
  int major;
  const char *version = ps_version(&major, NULL, NULL);
  if (major != PARAMSERV_VERSION_MAJOR) {
    fprintf(stderr, "client_example: built for libparamserv %d, runs with %s\n",
            PARAMSERV_VERSION_MAJOR, version);
    return 1;
  }
  printf("example: libparamserv %s, %s\n", version,
         opts ? "opened from options (ps_client_new_opts)" : "opened from the config file");
  float *params = ps_client_arena_new(c), *grad = ps_client_arena_new(c);
  net p, g;
  if (params == NULL || grad == NULL || views(c, params, &p) != 0 || views(c, grad, &g) != 0) {
    fprintf(stderr, "client_example: expected [model] variables = "
                    "models/examples/autoencoder.vars.json (encoder.weight [H, 784], ...)\n");
    free(params);
    free(grad);
    ps_client_free(c);
    return 1;
  }
  int h = p.h;
  float *x = malloc(IN * sizeof *x), *r = malloc(IN * sizeof *r);
  float *code = malloc((size_t)h * sizeof *code), *dcode = malloc((size_t)h * sizeof *dcode);
  if (x == NULL || r == NULL || code == NULL || dcode == NULL) {
    fprintf(stderr, "client_example: out of memory\n");
    free(x);
    free(r);
    free(code);
    free(dcode);
    free(params);
    free(grad);
    ps_client_free(c);
    return 1;
  }
  for (int k = 0; k < KINDS; k++)
    for (int i = 0; i < IN; i++)
      prototype[k][i] = uniform() < 0.5 ? -1.0f : 1.0f;

  int steps = atoi(argv[argc - 1]), rc = ps_client_pull(c, params);
  double before = rc == 0 ? test_error(&p, x, code, r) : 0.0;
  for (int step = 0; step < steps && rc == 0; step++) {
    if ((rc = ps_client_pull(c, params)) != 0)
      break;
    memset(grad, 0, ps_client_vars(c)->total * sizeof *grad);
    double loss = 0.0;
    for (int s = 0; s < BATCH; s++) {
      sample(x);
      loss += forward(&p, x, code, r);
      /* Backward of the batch's mean error. */
      memset(dcode, 0, (size_t)h * sizeof *dcode);
      for (int i = 0; i < IN; i++) {
        float dr = (r[i] - x[i]) / (IN * BATCH);
        g.bd[i] += dr;
        for (int j = 0; j < h; j++) {
          g.wd[i * h + j] += dr * code[j];
          dcode[j] += dr * p.wd[i * h + j];
        }
      }
      for (int j = 0; j < h; j++) {
        float dz = dcode[j] * (1.0f - code[j] * code[j]);
        g.be[j] += dz;
        for (int i = 0; i < IN; i++)
          g.we[j * IN + i] += dz * x[i];
      }
    }
    /* The second half overlaps each push's acks with the next gradient. */
    if ((rc = step < steps / 2 ? ps_client_push(c, grad) : ps_client_push_async(c, grad)) != 0)
      break;
    if (step % 50 == 0)
      printf("example: step %d error %.4f global step %llu\n", step, loss / BATCH,
             (unsigned long long)ps_client_global_step(c));
  }
  if (rc == 0)
    rc = ps_client_flush(c);
  if (rc == 0 && ps_client_pushes(c) != (uint64_t)steps) {
    fprintf(stderr, "client_example: %llu pushes acknowledged after %d steps and a flush\n",
            (unsigned long long)ps_client_pushes(c), steps);
    rc = -1;
  }
  if (rc == 0)
    rc = ps_client_pull(c, params);
  if (rc != 0) {
    fprintf(stderr, "client_example: %s\n", ps_client_error(c));
  } else {
    printf("example: duplicates %llu, stale %llu\n",
           (unsigned long long)ps_client_duplicates(c), (unsigned long long)ps_client_stale(c));
    printf("example: reconstruction error %.4f after %d steps (%.4f before)\n",
           test_error(&p, x, code, r), steps, before);
  }
  free(params);
  free(grad);
  free(x);
  free(r);
  free(code);
  free(dcode);
  ps_client_free(c);
  return rc == 0 ? 0 : 1;
}
