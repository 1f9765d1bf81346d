/* Model files and variables files (src/nn/MODELFILE.md): the shipped
 * files are the built-in models, another network builds and its gradients
 * match finite differences, and every kind of bad file is one line naming
 * the file, the layer or variable and what was expected. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gradcheck.h"

#include "common/parse.h"

#include "nn/model.h"
#include "nn/modelfile.h"

/* models/X.json has exactly the layers of the built-in X, so it builds the
 * same variables at the same offsets. */
static void shipped_is_builtin(const char *file, const char *name) {
  ps_model_spec fs, bs;
  ps_errbuf eb = {0};
  if (ps_modelfile_load(file, &fs, &eb) != 0)
    fail_msg("%s", eb.msg);
  assert_int_equal(ps_model_spec_parse(name, NULL, &bs, &eb), 0);
  assert_int_equal(fs.nlayers, bs.nlayers);
  assert_int_equal(fs.classes, bs.classes);
  assert_memory_equal(fs.layers, bs.layers, (size_t)fs.nlayers * sizeof fs.layers[0]);
  ps_model fm, bm;
  assert_int_equal(ps_model_build(&fs, &fm, &eb), 0);
  assert_int_equal(ps_model_build(&bs, &bm, &eb), 0);
  assert_int_equal(fm.vars.n, bm.vars.n);
  assert_int_equal(fm.vars.total, bm.vars.total);
  for (int i = 0; i < fm.vars.n; i++) {
    assert_string_equal(fm.vars.vars[i].name, bm.vars.vars[i].name);
    assert_int_equal(fm.vars.vars[i].offset, bm.vars.vars[i].offset);
  }
  assert_int_equal(fm.nlayers, bm.nlayers);
  assert_memory_equal(fm.layers, bm.layers, (size_t)fm.nlayers * sizeof fm.layers[0]);
  /* A file's canonical text is its own: a file model and a built-in never
   * share a replica by accident. */
  assert_string_not_equal(fs.desc, bs.desc);
  assert_non_null(strstr(fs.desc, "model 1x28x28-10 #"));
  ps_model_close(&fm);
  ps_model_close(&bm);
}

static void test_shipped_files(void **state) {
  (void)state;
  shipped_is_builtin("models/mlp.json", "mlp");
  shipped_is_builtin("models/cnn.json", "cnn");
}

static void test_strided_example(void **state) {
  (void)state;
  ps_model m;
  gradcheck_build("models/examples/strided-cnn.json", NULL, &m);
  /* conv 5x5 stride 2 padding 2: 28 -> 14; pool 3 stride 2 padding 1: -> 7. */
  assert_int_equal(m.layers[0].out_size, 16 * 14 * 14);
  assert_int_equal(m.layers[2].out_size, 16 * 7 * 7);
  assert_int_equal(m.vars.n, 6);
  assert_string_equal(m.vars.vars[0].name, "stem.weight");
  assert_string_equal(m.vars.vars[5].name, "classifier.bias");
  assert_int_equal(m.vars.total, 16 * 25 + 16 + 784 * 96 + 96 + 96 * 10 + 10);
  assert_int_equal(m.spec.classes, 10);
  ps_model_close(&m);
  /* Strided, padded windows backward: against central differences. */
  gradcheck_params("models/examples/strided-cnn.json", NULL, PS_DEVICE_CPU, 300, 1e-3f);
}

/* The same text twice gives the same canonical text; one changed number
 * (a dropout probability, which no variable shows) gives another. */
static void test_canonical_text(void **state) {
  (void)state;
  const char *a = "{\"input\":[1,8,8],\"layers\":[{\"type\":\"dropout\",\"p\":0.5},"
                  "{\"type\":\"dense\",\"name\":\"d\",\"out\":3},{\"type\":\"log_softmax\"}]}";
  const char *b = "{\"input\":[1,8,8],\"layers\":[{\"type\":\"dropout\",\"p\":0.25},"
                  "{\"type\":\"dense\",\"name\":\"d\",\"out\":3},{\"type\":\"log_softmax\"}]}";
  ps_model_spec s1, s2, s3;
  ps_errbuf eb = {0};
  assert_int_equal(ps_modelfile_parse(a, strlen(a), "a", &s1, &eb), 0);
  assert_int_equal(ps_modelfile_parse(a, strlen(a), "a", &s2, &eb), 0);
  assert_int_equal(ps_modelfile_parse(b, strlen(b), "b", &s3, &eb), 0);
  assert_string_equal(s1.desc, s2.desc);
  assert_string_not_equal(s1.desc, s3.desc);
  assert_int_equal(s1.classes, 3);
}

static void test_bad_files(void **state) {
  (void)state;
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"", "m.json:1:0: "},
      {"[]", "m.json: the document: found an array, expected an object"},
      {"{\"input\":[1,28,28],\"layers\":[],\"x\":1}", "unknown key \"x\": expected one of comment, input, layers"},
      {"{\"layers\":[{\"type\":\"log_softmax\"}]}", "m.json: input: found nothing, expected [channels, height, width]"},
      {"{\"input\":[1,0,28],\"layers\":[{\"type\":\"log_softmax\"}]}", "input: found 0, expected [channels"},
      {"{\"input\":[1,28,28],\"layers\":[]}", "layers: found an array, expected an array of 1 to 32 layers"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"conv3d\"}]}",
       "m.json: layer 1: type: found \"conv3d\", expected dense, conv2d, maxpool"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"dense\",\"out\":10}]}",
       "layer 1 (dense): name: found nothing, expected a name"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"dense\",\"name\":\"a\",\"out\":0}]}",
       "layer 1 (dense a): out: found 0, expected an integer in [1, 1048576]"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"dense\",\"name\":\"a\",\"out\":10,\"kernel\":3}]}",
       "layer 1 (dense a): unknown key \"kernel\": expected one of type, name, out"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\",\"out\":4,\"kernel\":\"3\"}]}",
       "layer 1 (conv2d c): kernel: found \"3\", expected an integer"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\",\"out\":4,\"kernel\":40},"
       "{\"type\":\"log_softmax\"}]}",
       "layer 1 (conv2d c): kernel 40 over an input of side 28: expected it to fit"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\",\"out\":4,\"kernel\":3,"
       "\"padding\":3},{\"type\":\"log_softmax\"}]}",
       "layer 1 (conv2d c): kernel 3, stride, padding: expected kernel >= 1, stride >= 1, 0 <= padding <= 2"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"dropout\",\"p\":1}]}",
       "layer 1 (dropout): p: found 1, expected a probability of dropping in [0, 1)"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"dropout\",\"p\":0.5,\"channels\":1}]}",
       "layer 1 (dropout): channels: found 1, expected true"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"dense\",\"name\":\"a\",\"out\":10}]}",
       "m.json: the last layer must be log_softmax"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"log_softmax\"},{\"type\":\"dense\",\"name\":\"a\","
       "\"out\":10},{\"type\":\"log_softmax\"}]}",
       "m.json: layer 1 (log_softmax): expected log_softmax last only"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"dense\",\"name\":\"a\",\"out\":10},"
       "{\"type\":\"dense\",\"name\":\"a\",\"out\":10},{\"type\":\"log_softmax\"}]}",
       "layer 2 (dense a): name already taken by layer 1"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"dense\",\"name\":\"a.b\",\"out\":10},"
       "{\"type\":\"log_softmax\"}]}",
       "layer 1 (dense a.b): name: expected 1 to 31 of A-Z a-z 0-9 _"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"relu\"},{\"type\":\"log_softmax\"}]}",
       "m.json: no dense or conv2d layer: nothing to train"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"dense\",\"name\":\"a\",\"out\":1},"
       "{\"type\":\"log_softmax\"}]}",
       "layer 2 (log_softmax): 1 classes: expected 2 to 65536"},
      {"{\"input\":[1,28,28],\"input\":[1,28,28],\"layers\":[]}", "m.json:1:"},
      {"{\"input\":[1,28,28],\"layers\":[{\"type\":\"dense\",\"name\":\"a\",\"out\":1048576},"
       "{\"type\":\"dense\",\"name\":\"b\",\"out\":1048576},{\"type\":\"log_softmax\"}]}",
       "more than 2^31 parameters"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ps_model_spec spec;
    ps_errbuf eb = {0};
    int rc = ps_modelfile_parse(cases[i].text, strlen(cases[i].text), "m.json", &spec, &eb);
    if (rc == 0 || strstr(eb.msg, cases[i].want) == NULL || strchr(eb.msg, '\n') != NULL)
      fail_msg("case %zu: rc %d, message \"%s\", expected one containing \"%s\"", i, rc, eb.msg,
               cases[i].want);
  }
  ps_model_spec spec;
  ps_errbuf eb = {0};
  assert_int_equal(ps_modelfile_load("tests/no-such.json", &spec, &eb), -ENOENT);
  assert_non_null(strstr(eb.msg, "tests/no-such.json"));
}

static void test_variables(void **state) {
  (void)state;
  const char *good = "{\"comment\":\"logistic regression\",\"variables\":["
                     "{\"name\":\"w\",\"shape\":[784,10],\"init\":\"normal\",\"scale\":0.01},"
                     "{\"name\":\"b\",\"shape\":[10],\"init\":\"zeros\"}]}";
  ps_vartable t;
  char desc[128];
  ps_errbuf eb = {0};
  ps_vartable_init(&t);
  assert_int_equal(ps_varfile_parse(good, strlen(good), "v.json", &t, desc, sizeof desc, &eb), 0);
  assert_int_equal(t.n, 2);
  assert_int_equal(t.total, 7850);
  assert_int_equal(t.vars[0].init.kind, PS_INIT_NORMAL);
  assert_int_equal(t.vars[1].offset, 7840);
  assert_non_null(strstr(desc, "variables 2 #"));
  ps_vartable_close(&t);

  static const struct {
    const char *text, *want;
  } cases[] = {
      {"{\"variables\":[]}", "v.json: variables: found an array, expected an array of 1 to 4096"},
      {"{\"variables\":[{\"name\":\"w\",\"shape\":[0],\"init\":\"zeros\"}]}",
       "variable 1 (w): shape: found 0, expected dimensions of integers >= 1"},
      {"{\"variables\":[{\"name\":\"w\",\"shape\":[1,2,3,4,5],\"init\":\"zeros\"}]}",
       "variable 1 (w): shape: found an array, expected an array of 1 to 4 dimensions"},
      {"{\"variables\":[{\"name\":\"w\",\"shape\":[65536,65536],\"init\":\"zeros\"}]}",
       "at most 2^31 floats"},
      {"{\"variables\":[{\"name\":\"w\",\"shape\":[3],\"init\":\"uniform\"}]}",
       "variable 1 (w): scale: found nothing, expected a number in (0, 1e6]"},
      {"{\"variables\":[{\"name\":\"w\",\"shape\":[3],\"init\":\"zeros\",\"scale\":1}]}",
       "variable 1 (w): scale: found 1, expected no scale for zeros"},
      {"{\"variables\":[{\"name\":\"w\",\"shape\":[3],\"init\":\"he\"}]}",
       "variable 1 (w): init: found \"he\", expected \"zeros\""},
      {"{\"variables\":[{\"name\":\"w\",\"shape\":[3],\"init\":\"zeros\"},"
       "{\"name\":\"w\",\"shape\":[3],\"init\":\"zeros\"}]}",
       "variable 2 (w): name: found \"w\", expected a name no other variable has"},
      {"{\"variables\":[{\"name\":\"w\",\"shape\":[3],\"init\":\"zeros\",\"dtype\":\"f16\"}]}",
       "variable 1 (w): unknown key \"dtype\": expected one of name, shape, init, scale"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ps_vartable_init(&t);
    int rc = ps_varfile_parse(cases[i].text, strlen(cases[i].text), "v.json", &t, desc,
                              sizeof desc, &eb);
    if (rc == 0 || strstr(eb.msg, cases[i].want) == NULL || t.n != 0)
      fail_msg("case %zu: rc %d, message \"%s\", expected one containing \"%s\"", i, rc, eb.msg,
               cases[i].want);
    ps_vartable_close(&t);
  }
}

/* A model of variables only cannot train in paramserv worker; a model of
 * other inputs cannot train on Fashion-MNIST. */
static void test_check_data(void **state) {
  (void)state;
  ps_model m;
  ps_errbuf eb = {0};
  gradcheck_build("mlp", NULL, &m);
  assert_int_equal(ps_model_check_data(&m, 28, 28, 10, &eb), 0);
  assert_int_equal(ps_model_check_data(&m, 32, 32, 10, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "takes 1x28x28 inputs: expected 1x32x32"));
  assert_int_equal(ps_model_check_data(&m, 28, 28, 100, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "has 10 classes: expected at least 100"));
  ps_model_close(&m);
  memset(&m, 0, sizeof m);
  assert_int_equal(ps_model_check_data(&m, 28, 28, 10, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "variables and no layers"));
  /* Sparse tables, even on image-shaped inputs of 10 classes: an image
   * has no categorical fields to fill their embedding input with. */
  const char *sparse = "{\"input\":[1,28,28],\"layers\":[{\"type\":\"embedding_bag\","
                       "\"name\":\"C\",\"fields\":[1,2],\"dim\":4},{\"type\":\"dense\","
                       "\"name\":\"o\",\"out\":10},{\"type\":\"log_softmax\"}]}";
  ps_model_spec spec;
  assert_int_equal(ps_modelfile_parse(sparse, strlen(sparse), "m.json", &spec, &eb), 0);
  assert_int_equal(ps_model_build(&spec, &m, &eb), 0);
  assert_int_equal(ps_model_check_data(&m, 28, 28, 10, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "has sparse tables (C1..C2): it trains on Criteo-format data"));
  assert_non_null(strstr(eb.msg, "not on images"));
  assert_int_equal(ps_model_check_inputs(&m, 784, 10, &eb), PS_EUSAGE);
  assert_non_null(strstr(eb.msg, "has sparse tables (C1..C2)"));
  assert_non_null(strstr(eb.msg, "not on numpy files"));
  ps_model_close(&m);
}

/* A model without the sparse model's layer types keeps the canonical text
 * it had before they came (the golden manifest
 * tests/fuzz/seeds/fuzz_manifest/model-file-v2.json holds this file's), so
 * its replicas and checkpoints keep their layout hash. */
static void test_dense_text_kept(void **state) {
  (void)state;
  ps_model_spec spec;
  ps_errbuf eb = {0};
  assert_int_equal(ps_modelfile_load("models/examples/strided-cnn.json", &spec, &eb), 0);
  assert_string_equal(spec.desc, "model 1x28x28-10 #4a092447815ae4e5");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shipped_files),   cmocka_unit_test(test_strided_example),
      cmocka_unit_test(test_canonical_text),  cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_variables),       cmocka_unit_test(test_check_data),
      cmocka_unit_test(test_dense_text_kept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
