/* The network side of sparse models: the logistic loss (a sigmoid model's
 * nll with one logit), the embedding_bag's concatenation and the gradient
 * it hands back for the embedding input, both against finite differences;
 * the same gradients on 1 and 2 threads; model-file keys and refusals;
 * a worker's step of rows (worker/embed.c: dedupe, pool, scatter); AUC. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "nn/auc.h"
#include "nn/backend.h"
#include "nn/compute.h"
#include "nn/model.h"
#include "nn/modelfile.h"
#include "worker/embed.h"

/* input 3 -> dense 4 -> relu -> embedding_bag (fields 2..3, dim 2) -> dense 1 -> sigmoid */
static const char *const SMALL =
    "{\"input\": [3], \"layers\": ["
    "{\"type\": \"dense\", \"name\": \"a\", \"out\": 4}, {\"type\": \"relu\"},"
    "{\"type\": \"embedding_bag\", \"name\": \"E\", \"fields\": [2, 3], \"dim\": 2},"
    "{\"type\": \"dense\", \"name\": \"b\", \"out\": 1}, {\"type\": \"sigmoid\"}]}";

static void build(const char *text, ps_model *m) {
  ps_model_spec spec;
  ps_errbuf eb = {0};
  if (ps_modelfile_parse(text, strlen(text), "m.json", &spec, &eb) != 0)
    fail_msg("%s", eb.msg);
  assert_int_equal(ps_model_build(&spec, m, &eb), 0);
}

static void fill(float *v, size_t n, uint64_t seed, float scale) {
  ps_rng r;
  ps_rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++)
    v[i] = scale * (float)(2.0 * ps_rng_uniform(&r) - 1.0);
}

/* The summed loss of n samples (the mean's gradient scaled back by n). */
static double loss_of(ps_compute *c, int n, const float *p, const float *x, const float *emb,
                      const uint8_t *y, float *grad, float *demb, const ps_model *m) {
  double mean = ps_compute_grad_emb(c, p, x, emb, y, n, 1, 0, grad, demb, NULL);
  for (size_t i = 0; i < m->vars.total; i++)
    grad[i] *= (float)n;
  for (size_t i = 0; i < (size_t)n * m->emb_size; i++)
    demb[i] *= (float)n;
  return mean * n;
}

/* The model's tables, its shape and the gradients of both its parameters
 * and its embedding input against central differences. */
static void test_gradients(void **state) {
  (void)state;
  enum { N = 4 };
  ps_model m;
  build(SMALL, &m);
  assert_int_equal(m.ntables, 2);
  assert_string_equal(m.tables[0].name, "E2");
  assert_string_equal(m.tables[1].name, "E3");
  assert_int_equal(m.tables[0].field, 1);
  assert_int_equal(m.tables[1].offset, 2);
  assert_int_equal(m.emb_size, 4);
  assert_int_equal(m.spec.classes, 1);
  assert_int_equal(m.tables[0].optim.kind, PS_OPTIM_ADAGRAD);
  size_t total = m.vars.total, ne = N * m.emb_size;
  assert_int_equal(total, 3 * 4 + 4 + (4 + 4) * 1 + 1);
  float *p = malloc(total * sizeof *p), *g = malloc(total * sizeof *g), *g2 = malloc(total * sizeof *g2);
  float x[N * 3], emb[N * 4], demb[N * 4], demb2[N * 4];
  uint8_t y[N] = {1, 0, 0, 1};
  fill(p, total, 1, 0.5f);
  fill(x, N * 3, 2, 1.0f);
  fill(emb, ne, 3, 1.0f);
  ps_errbuf eb = {0};
  ps_compute *c = ps_compute_new(&m, 1, N, &eb);
  assert_non_null(c);
  loss_of(c, N, p, x, emb, y, g, demb, &m);
  const float eps = 1e-3f;
  for (size_t i = 0; i < total; i++) {
    float keep = p[i];
    p[i] = keep + eps;
    double up = loss_of(c, N, p, x, emb, y, g2, demb2, &m);
    p[i] = keep - eps;
    double down = loss_of(c, N, p, x, emb, y, g2, demb2, &m);
    p[i] = keep;
    double fd = (up - down) / (2.0 * eps);
    if (fabs(fd - g[i]) > 2e-3 + 2e-2 * fabs(fd))
      fail_msg("parameter %zu: backward %g, finite differences %g", i, (double)g[i], fd);
  }
  for (size_t i = 0; i < ne; i++) {
    float keep = emb[i];
    emb[i] = keep + eps;
    double up = loss_of(c, N, p, x, emb, y, g2, demb2, &m);
    emb[i] = keep - eps;
    double down = loss_of(c, N, p, x, emb, y, g2, demb2, &m);
    emb[i] = keep;
    double fd = (up - down) / (2.0 * eps);
    if (fabs(fd - demb[i]) > 2e-3 + 2e-2 * fabs(fd))
      fail_msg("embedding input %zu: backward %g, finite differences %g", i, (double)demb[i], fd);
  }
  /* The probabilities are the sigmoid of the logits, and the loss is their
   * log loss. */
  float prob[N];
  ps_compute_predict(c, p, x, emb, N, prob);
  double ll = 0;
  for (int i = 0; i < N; i++) {
    assert_true(prob[i] > 0 && prob[i] < 1);
    ll -= y[i] ? log(prob[i]) : log(1 - prob[i]);
  }
  double mean = ps_compute_grad_emb(c, p, x, emb, y, N, 1, 0, g, demb, NULL);
  assert_true(fabs(mean - ll / N) < 1e-5);
  ps_compute_free(c);
  free(p);
  free(g);
  free(g2);
  ps_model_close(&m);
}

/* The same gradients and embedding gradients on 2 threads as on 1. */
static void test_threads(void **state) {
  (void)state;
  enum { N = 7 };
  ps_model m;
  build(SMALL, &m);
  size_t total = m.vars.total;
  float *p = malloc(total * sizeof *p), *g1 = malloc(total * sizeof *g1),
        *g2 = malloc(total * sizeof *g2);
  float x[N * 3], emb[N * 4], d1[N * 4], d2[N * 4];
  uint8_t y[N] = {1, 0, 1, 1, 0, 0, 1};
  fill(p, total, 4, 0.5f);
  fill(x, N * 3, 5, 1.0f);
  fill(emb, N * 4, 6, 1.0f);
  ps_errbuf eb = {0};
  ps_compute *one = ps_compute_new(&m, 1, N, &eb), *two = ps_compute_new(&m, 2, N, &eb);
  double l1 = ps_compute_grad_emb(one, p, x, emb, y, N, 1, 0, g1, d1, NULL);
  double l2 = ps_compute_grad_emb(two, p, x, emb, y, N, 1, 0, g2, d2, NULL);
  assert_true(fabs(l1 - l2) < 1e-6);
  for (size_t i = 0; i < total; i++)
    assert_true(fabs(g1[i] - g2[i]) < 1e-6);
  assert_memory_equal(d1, d2, sizeof d1);  /* each sample's own rows: no sum across threads */
  ps_compute_free(one);
  ps_compute_free(two);
  free(p);
  free(g1);
  free(g2);
  ps_model_close(&m);
}

/* The backend's logistic loss (nll with one logit) against the formula,
 * far into both tails too. */
static void test_logistic_loss(void **state) {
  (void)state;
  ps_errbuf eb = {0};
  ps_backend *b = ps_backend_new(-1, &eb);
  assert_non_null(b);
  float z[6] = {0.0f, 2.0f, -3.0f, 40.0f, -40.0f, 0.5f}, d[6];
  uint8_t y[6] = {1, 0, 0, 1, 1, 1};
  size_t right = 0;
  double loss = b->ops->nll(b, 6, 1, z, y, 0.5f, d, &right);
  double want = 0;
  for (int i = 0; i < 6; i++) {
    double p = 1.0 / (1.0 + exp(-(double)z[i]));
    want += y[i] ? -log(p > 0 ? p : 1e-300) : -log1p(-p);
    assert_true(fabs(d[i] - 0.5 * (p - y[i])) < 1e-6);
  }
  /* log(1 + e^40) is 40 to the digits a double keeps: no overflow, no inf. */
  assert_true(isfinite(loss));
  assert_true(fabs(loss - want) < 1e-6 * (1 + want));
  assert_int_equal(right, 3);  /* z 2 (y 0), 40 (y 1), 0.5 (y 1) ... and 0 is not > 0 */
  ps_backend_free(b);
}

/* Model files: the new keys, their defaults, and each refusal. */
static void test_modelfile(void **state) {
  (void)state;
  ps_model m;
  build("{\"input\": [2], \"layers\": [{\"type\": \"embedding_bag\", \"name\": \"F\", \"field\": 5,"
        "\"dim\": 3, \"combiner\": \"mean\", \"pooling\": \"server\", \"init\": \"zeros\","
        "\"optimizer\": \"adam\","
        "\"lr\": 0.5, \"admit_after\": 3, \"idle_steps\": 100, \"max_rows\": 1000},"
        "{\"type\": \"dense\", \"name\": \"o\", \"out\": 1}, {\"type\": \"sigmoid\"}]}", &m);
  assert_int_equal(m.ntables, 1);
  const ps_sparse_spec *t = &m.tables[0];
  assert_string_equal(t->name, "F5");
  assert_true(t->field == 4 && t->dim == 3 && t->combiner == PS_COMBINER_MEAN && t->server_pool);
  assert_true(t->init_kind == 0 && t->optim.kind == PS_OPTIM_ADAM && t->optim.lr == 0.5f);
  assert_true(t->admit_after == 3 && t->idle_steps == 100 && t->max_rows == 1000);
  assert_int_equal(m.layers[0].out_size, 2 + 3);
  /* Written back and read again: the same model. */
  char *text = ps_modelfile_text(&m.spec, NULL, 0);
  assert_non_null(text);
  ps_model again;
  build(text, &again);
  assert_string_equal(again.spec.desc, m.spec.desc);
  assert_true(again.tables[0].max_rows == 1000 && again.tables[0].optim.kind == PS_OPTIM_ADAM);
  assert_true(again.tables[0].server_pool);
  free(text);
  ps_model_close(&again);
  ps_model_close(&m);

  static const struct {
    const char *layers, *want;
  } bad[] = {
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"fields\":[3,2],\"dim\":2}", "fields: found an array"},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"dim\":2}", "fields: found nothing"},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"field\":1,\"fields\":[1,2],\"dim\":2}", "fields"},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"field\":1,\"dim\":0}", "dim: found 0"},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"field\":1,\"dim\":2,\"combiner\":\"max\"}",
       "combiner: found \"max\", expected sum, mean or sqrtn"},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"field\":1,\"dim\":2,\"pooling\":\"shard\"}",
       "pooling: found \"shard\", expected worker or server"},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"field\":1,\"dim\":2,\"init\":\"zeros\",\"scale\":1}",
       "scale: found 1, expected no scale for zeros"},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"field\":1,\"dim\":2,\"optimizer\":\"ftrl\"}",
       "optimizer: found \"ftrl\""},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"field\":1,\"dim\":2,\"lr\":0}", "lr: found 0"},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"field\":1,\"dim\":2,\"bags\":1}", "unknown key \"bags\""},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"fields\":[1,3],\"dim\":2},"
       "{\"type\":\"embedding_bag\",\"name\":\"G\",\"field\":3,\"dim\":2}",
       "a field already embedded by layer 1 (field 3)"},
      /* Numbers a float rounds to 0: the lr would mean [train] lr, the
       * scale a table a shard refuses. */
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"field\":1,\"dim\":2,\"lr\":1e-50}",
       "lr: found 1e-50, expected a learning rate in (0, 1000]"},
      {"{\"type\":\"embedding_bag\",\"name\":\"E\",\"field\":1,\"dim\":2,\"scale\":1e-50}",
       "scale: found 1e-50, expected a number in (0, 1000]"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char doc[1024];
    snprintf(doc, sizeof doc,
             "{\"input\":[2],\"layers\":[%s,{\"type\":\"dense\",\"name\":\"o\",\"out\":1},"
             "{\"type\":\"sigmoid\"}]}", bad[i].layers);
    ps_model_spec spec;
    ps_errbuf eb = {0};
    int rc = ps_modelfile_parse(doc, strlen(doc), "m.json", &spec, &eb);
    if (rc == 0 || strstr(eb.msg, bad[i].want) == NULL || strchr(eb.msg, '\n') != NULL)
      fail_msg("case %zu: rc %d, \"%s\", expected one containing \"%s\"", i, rc, eb.msg,
               bad[i].want);
  }
  /* sigmoid: last, after one output. */
  static const char *const sig[] = {
      "{\"input\":[2],\"layers\":[{\"type\":\"dense\",\"name\":\"o\",\"out\":2},{\"type\":\"sigmoid\"}]}",
      "{\"input\":[2],\"layers\":[{\"type\":\"dense\",\"name\":\"o\",\"out\":1},{\"type\":\"sigmoid\"},"
      "{\"type\":\"relu\"}]}"};
  static const char *const sig_want[] = {"after a layer of 2 outputs: expected 1",
                                         "the last layer must be log_softmax"};
  for (int i = 0; i < 2; i++) {
    ps_model_spec spec;
    ps_errbuf eb = {0};
    assert_int_not_equal(ps_modelfile_parse(sig[i], strlen(sig[i]), "m.json", &spec, &eb), 0);
    if (strstr(eb.msg, sig_want[i]) == NULL)
      fail_msg("sigmoid case %d: \"%s\"", i, eb.msg);
  }
}

/* A batch's keys: each table's distinct keys ascending, each sample's place
 * among them; pooling puts each sample's row at its table's offset; the
 * rows' gradients sum over the samples that share a key. */
static void test_embed(void **state) {
  (void)state;
  ps_model m;
  build(SMALL, &m);  /* tables E2 (field 1) and E3 (field 2), dim 2 */
  ps_embed e;
  assert_int_equal(ps_embed_init(&e, &m, 4, 3), 0);
  /* 4 samples, 3 fields each: field 1 holds 7, 5, 7, 9; field 2 holds 1 everywhere. */
  uint64_t keys[12] = {100, 7, 1, 101, 5, 1, 102, 7, 1, 103, 9, 1};
  assert_int_equal(ps_embed_keys(&e, keys, NULL, 4), 0);
  assert_int_equal(e.nkeys[0], 3);
  assert_true(e.keys[0][0] == 5 && e.keys[0][1] == 7 && e.keys[0][2] == 9);
  assert_int_equal(e.nkeys[1], 1);
  ps_sparse_batch b;
  ps_embed_batch(&e, &b);
  assert_true(b.ntables == 2 && b.n[0] == 3 && b.dims[1] == 2);
  for (int r = 0; r < 3; r++)
    for (int d = 0; d < 2; d++)
      e.rows[0][r * 2 + d] = (float)(10 * r + d);
  e.rows[1][0] = -1;
  e.rows[1][1] = -2;
  float emb[4 * 4];
  ps_embed_pool(&e, emb);
  static const float want[16] = {10, 11, -1, -2, 0, 1, -1, -2, 10, 11, -1, -2, 20, 21, -1, -2};
  assert_memory_equal(emb, want, sizeof want);
  float demb[16];
  for (int i = 0; i < 16; i++)
    demb[i] = (float)i;
  ps_embed_scatter(&e, demb);
  /* key 7: samples 0 and 2 (0+8, 1+9); key 5: sample 1; key 9: sample 3. */
  static const float g0[6] = {4, 5, 8, 10, 12, 13};
  assert_memory_equal(e.grads[0], g0, sizeof g0);
  static const float g1[2] = {2 + 6 + 10 + 14, 3 + 7 + 11 + 15};
  assert_memory_equal(e.grads[1], g1, sizeof g1);
  ps_embed_free(&e);
  ps_model_close(&m);
}

/* Bags (offsets): a key twice in a bag counts twice, an empty bag pools to
 * zeros and takes no gradient; mean divides by the bag's count, sqrtn by
 * its square root, in the pool and in the gradient alike. */
static void test_embed_bags(void **state) {
  (void)state;
  ps_model m;
  build(SMALL, &m);  /* tables E2 (field 1) and E3 (field 2), dim 2 */
  m.tables[0].combiner = PS_COMBINER_MEAN;
  m.tables[1].combiner = PS_COMBINER_SQRTN;
  ps_embed e;
  assert_int_equal(ps_embed_init(&e, &m, 3, 3), 0);
  /* field 0: one key each (unused); field 1: {7, 5}, {}, {7, 7, 9};
   * field 2: {1}, {1, 2}, {2}. */
  uint64_t keys[] = {100, 7, 5, 1, 101, 1, 2, 102, 7, 7, 9, 2};
  uint32_t offs[] = {0, 1, 3, 4, 5, 5, 7, 8, 11, 12};
  assert_int_equal(ps_embed_keys(&e, keys, offs, 3), 0);
  assert_int_equal(e.nkeys[0], 3);  /* 5, 7, 9 */
  assert_true(e.keys[0][0] == 5 && e.keys[0][1] == 7 && e.keys[0][2] == 9);
  assert_int_equal(e.nkeys[1], 2);  /* 1, 2 */
  for (int r = 0; r < 3; r++)
    for (int d = 0; d < 2; d++)
      e.rows[0][r * 2 + d] = (float)(10 * (r + 1) + d);  /* 5: 10,11  7: 20,21  9: 30,31 */
  for (int r = 0; r < 2; r++)
    for (int d = 0; d < 2; d++)
      e.rows[1][r * 2 + d] = (float)(-(r + 1) - d);      /* 1: -1,-2  2: -2,-3 */
  float emb[3 * 4];
  ps_embed_pool(&e, emb);
  float s2 = 1.0f / sqrtf(2.0f);
  const float want[12] = {(20 + 10) / 2.0f, (21 + 11) / 2.0f, -1, -2,
                          0, 0, (-1 - 2) * s2, (-2 - 3) * s2,
                          (20 + 20 + 30) / 3.0f, (21 + 21 + 31) / 3.0f, -2, -3};
  for (int i = 0; i < 12; i++)
    assert_float_equal(emb[i], want[i], 1e-5);
  float demb[12];
  for (int i = 0; i < 12; i++)
    demb[i] = (float)(i + 1);
  ps_embed_scatter(&e, demb);
  /* Table 0 (mean): sample 0's (1, 2) / 2 to 7 and 5; sample 2's (9, 10) / 3
   * to 7 twice and to 9 once; sample 1's empty bag gives nothing. */
  const float g0[6] = {0.5f, 1.0f, 0.5f + 2 * 3.0f, 1.0f + 2 * 10 / 3.0f, 3.0f, 10 / 3.0f};
  for (int i = 0; i < 6; i++)
    assert_float_equal(e.grads[0][i], g0[i], 1e-5);
  /* Table 1 (sqrtn): key 1 gets sample 0's (3, 4) and sample 1's (7, 8) / sqrt 2;
   * key 2 sample 1's / sqrt 2 and sample 2's (11, 12). */
  const float g1[4] = {3 + 7 * s2, 4 + 8 * s2, 7 * s2 + 11, 8 * s2 + 12};
  for (int i = 0; i < 4; i++)
    assert_float_equal(e.grads[1][i], g1[i], 1e-5);
  ps_embed_free(&e);
  ps_model_close(&m);
}

/* AUC: perfect, reversed, all tied, a hand-counted case with ties. */
static void test_auc(void **state) {
  (void)state;
  float s[6] = {0.1f, 0.4f, 0.35f, 0.8f, 0.4f, 0.2f};
  uint8_t y[6] = {0, 1, 0, 1, 0, 1};
  /* Positives 0.4, 0.8, 0.2 against negatives 0.1, 0.35, 0.4: pairs won
   * 0.4: 2 + half a tie, 0.8: 3, 0.2: 1 -> 6.5 of 9. */
  assert_true(fabs(ps_auc(s, y, 6) - 6.5 / 9) < 1e-12);
  float up[4] = {1, 2, 3, 4}, flat[4] = {1, 1, 1, 1};
  uint8_t yy[4] = {0, 0, 1, 1};
  assert_true(ps_auc(up, yy, 4) == 1.0);
  uint8_t rev[4] = {1, 1, 0, 0};
  assert_true(ps_auc(up, rev, 4) == 0.0);
  assert_true(ps_auc(flat, yy, 4) == 0.5);
  assert_true(isnan(ps_auc(up, rev, 2)));  /* one class only */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gradients), cmocka_unit_test(test_threads),
      cmocka_unit_test(test_logistic_loss), cmocka_unit_test(test_modelfile),
      cmocka_unit_test(test_embed),
      cmocka_unit_test(test_embed_bags), cmocka_unit_test(test_auc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
