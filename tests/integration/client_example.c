/* An example of a user's own training loop on the paramserv client API
 * (include/paramserv/client.h): it computes the gradient of a one-hidden-
 * layer mlp itself, in plain C, on synthetic data, and trains it through
 * the cluster's shards.  Built and run by tests/integration/client.sh.
 *
 *   client_example CONFIG WORKER STEPS
 *
 * The config's [model] must be `name = mlp` with one hidden layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paramserv/client.h"

#define IN 784
#define CLASSES 10
#define BATCH 32

/* Synthetic data: class c is a fixed random +-1 pattern plus noise. */
static float prototype[CLASSES][IN];
static unsigned long long rng_state = 88172645463325252ULL;

static double uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

static int sample(float *x) {
  int c = (int)(uniform() * CLASSES);
  for (int i = 0; i < IN; i++)
    x[i] = prototype[c][i] + (float)(6.0 * uniform() - 3.0);
  return c;
}

/* Where the variables live in the arena, by name (the layout the client
 * gives; every process of the cluster agrees on it). */
static const float *var(const ps_vartable *t, const float *arena, const char *name) {
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->vars[i].name, name) == 0)
      return arena + t->vars[i].offset;
  fprintf(stderr, "client_example: the model has no variable %s\n", name);
  exit(1);
}

/* Accuracy of the weights on 1000 fresh samples. */
static double accuracy(int h, const float *w1, const float *b1, const float *w2, const float *b2,
                       float *x, float *a) {
  int right = 0;
  for (int s = 0; s < 1000; s++) {
    int y = sample(x), best = 0;
    float z[CLASSES];
    for (int j = 0; j < h; j++) {
      float v = b1[j];
      for (int i = 0; i < IN; i++)
        v += w1[j * IN + i] * x[i];
      a[j] = v > 0 ? v : 0;
    }
    for (int k = 0; k < CLASSES; k++) {
      z[k] = b2[k];
      for (int j = 0; j < h; j++)
        z[k] += w2[k * h + j] * a[j];
      if (z[k] > z[best])
        best = k;
    }
    right += best == y;
  }
  return right / 1000.0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: client_example CONFIG WORKER STEPS\n");
    return 2;
  }
  ps_errbuf eb = {0};
  ps_client *c = ps_client_new(argv[1], atoi(argv[2]), &eb);
  if (c == NULL) {
    fprintf(stderr, "client_example: %s\n", eb.msg);
    return 1;
  }
  const ps_vartable *t = ps_client_vars(c);
  int h = -1;
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->vars[i].name, "fc1.weight") == 0)
      h = (int)t->vars[i].shape[0];
  if (h < 1 || t->n != 4) {
    fprintf(stderr, "client_example: expected an mlp with one hidden layer\n");
    return 1;
  }
  float *params = malloc(t->total * sizeof *params), *grad = malloc(t->total * sizeof *grad);
  float *x = malloc(IN * sizeof *x), *a = malloc((size_t)h * sizeof *a);
  float *da = malloc((size_t)h * sizeof *da);
  for (int k = 0; k < CLASSES; k++)
    for (int i = 0; i < IN; i++)
      prototype[k][i] = uniform() < 0.5 ? -1.0f : 1.0f;
  /* Gradients are written at the same offsets as the weights. */
  float *g1 = (float *)var(t, grad, "fc1.weight"), *gb1 = (float *)var(t, grad, "fc1.bias");
  float *g2 = (float *)var(t, grad, "fc2.weight"), *gb2 = (float *)var(t, grad, "fc2.bias");
  const float *w1 = var(t, params, "fc1.weight"), *b1 = var(t, params, "fc1.bias");
  const float *w2 = var(t, params, "fc2.weight"), *b2 = var(t, params, "fc2.bias");

  int steps = atoi(argv[3]), rc = ps_client_pull(c, params);
  double before = rc == 0 ? accuracy(h, w1, b1, w2, b2, x, a) : 0.0;
  for (int step = 0; step < steps && rc == 0; step++) {
    if ((rc = ps_client_pull(c, params)) != 0)
      break;
    memset(grad, 0, t->total * sizeof *grad);
    double loss = 0.0;
    for (int s = 0; s < BATCH; s++) {
      int y = sample(x);
      /* Forward: a = relu(W1 x + b1), z = W2 a + b2, softmax. */
      for (int j = 0; j < h; j++) {
        float v = b1[j];
        for (int i = 0; i < IN; i++)
          v += w1[j * IN + i] * x[i];
        a[j] = v > 0 ? v : 0;
      }
      float z[CLASSES], zmax = -1e30f;
      for (int k = 0; k < CLASSES; k++) {
        z[k] = b2[k];
        for (int j = 0; j < h; j++)
          z[k] += w2[k * h + j] * a[j];
        if (z[k] > zmax)
          zmax = z[k];
      }
      double sum = 0.0;
      for (int k = 0; k < CLASSES; k++)
        sum += exp(z[k] - zmax);
      loss += log(sum) + zmax - z[y];
      /* Backward of the mean loss over the batch. */
      memset(da, 0, (size_t)h * sizeof *da);
      for (int k = 0; k < CLASSES; k++) {
        float dz = (float)(exp(z[k] - zmax) / sum) - (k == y);
        dz /= BATCH;
        gb2[k] += dz;
        for (int j = 0; j < h; j++) {
          g2[k * h + j] += dz * a[j];
          da[j] += dz * w2[k * h + j];
        }
      }
      for (int j = 0; j < h; j++) {
        if (a[j] <= 0)
          continue;
        gb1[j] += da[j];
        for (int i = 0; i < IN; i++)
          g1[j * IN + i] += da[j] * x[i];
      }
    }
    /* The second half overlaps each push's acks with the next gradient. */
    if ((rc = step < steps / 2 ? ps_client_push(c, grad) : ps_client_push_async(c, grad)) != 0)
      break;
    if (step % 50 == 0)
      printf("example: step %d loss %.4f global step %llu\n", step, loss / BATCH,
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
    ps_client_free(c);
    return 1;
  }
  printf("example: test accuracy %.3f after %d steps (%.3f before)\n",
         accuracy(h, w1, b1, w2, b2, x, a), steps, before);
  free(params);
  free(grad);
  free(x);
  free(a);
  free(da);
  ps_client_free(c);
  return 0;
}
