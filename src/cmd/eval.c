/* `paramserv eval CKPT`: a checkpoint's test loss and accuracy, from the
 * checkpoint alone: its manifest says the model and the normalization of
 * its inputs (recovery/FORMAT.md section 4.1), so no config is needed. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chief/cut.h"
#include "cmd/cli.h"
#include "cmd/cmd.h"
#include "common/log.h"
#include "common/parse.h"
#include "data/idx.h"
#include "data/npy.h"
#include "nn/compute.h"
#include "recovery/checkpoint.h"

static void eval_usage(FILE *f) {
  fprintf(f,
      "usage: paramserv eval CKPT [OPTIONS]\n"
      "\n"
      "Evaluate a checkpoint on the test set (t10k) of an IDX data set: the mean loss\n"
      "and the accuracy.  The checkpoint says what it needs: its manifest holds the\n"
      "model (layers, or the built-in's name and options) and the normalization its\n"
      "inputs were trained with (recovery/FORMAT.md); no config file is read.\n"
      "CKPT is a checkpoint directory (DIR/ckpt-<step>), written by a cluster's chief\n"
      "or by paramserv train --checkpoint-dir, or a directory DIR of them: then its\n"
      "newest valid one.\n"
      "\n"
      "  --data DIR            IDX directory (default " PS_DATA_DEFAULT_DIR ")\n"
      "  --npy DIR             instead, your own test set: DIR/X.npy and DIR/y.npy, fed\n"
      "                        as they are (src/data/NPY.md)\n"
      "  --model-file PATH     the model file of a format version 1 checkpoint of one\n"
      "                        (version 1 named such a model by a hash only); a later\n"
      "                        checkpoint holds its model and needs none\n"
      "  --device D            cpu, cuda or cuda:N (default cpu)\n"
      "  --threads T           compute threads on the cpu (default: all cores)\n"
      "  --batch B             samples per forward pass (default 256)\n"
      "  --log-level LEVEL     debug|info|warn|error (default warn)\n"
      "  -h, --help            this help\n"
      "\n"
      "The last line is machine-readable:\n"
      "  eval step S samples N test_loss L test_acc A\n"
      "S the checkpoint's step, N test samples, L their mean negative log-likelihood,\n"
      "A the fraction whose most likely class is the label (4 decimals, as train\n"
      "prints it).\n"
      "Exit status: 0 success; 2 a checkpoint that is missing, not one, damaged, of\n"
      "an unknown format version or of a model without layers, a data set that is\n"
      "missing or does not fit the model, bad usage, or a device not here; 1 a\n"
      "failure (out of memory, weights that are not finite).\n");
}

typedef struct eval_opts {
  const char *ckpt, *data, *model_file, *npy;
  int64_t threads, batch;
  int device;
} eval_opts;

/* @return 0, 1 for --help (printed), or 2 after printing an error. */
static int parse_opts(int argc, char **argv, eval_opts *o) {
  enum { O_DATA = 256, O_MODEL_FILE, O_DEVICE, O_THREADS, O_BATCH, O_LOG_LEVEL, O_NPY };
  static const struct option longopts[] = {
      {"data", required_argument, 0, O_DATA},
      {"npy", required_argument, 0, O_NPY},
      {"model-file", required_argument, 0, O_MODEL_FILE},
      {"device", required_argument, 0, O_DEVICE},
      {"threads", required_argument, 0, O_THREADS},
      {"batch", required_argument, 0, O_BATCH},
      {"log-level", required_argument, 0, O_LOG_LEVEL},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  *o = (eval_opts){.data = PS_DATA_DEFAULT_DIR, .threads = cores > 0 ? cores : 1,
                   .batch = 256, .device = PS_DEVICE_CPU};
  ps_log_init("eval", PS_LOG_WARN);
  opterr = 0;
  optind = 1;
  int c, data = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case O_DATA: o->data = optarg; data = 1; break;
    case O_NPY: o->npy = optarg; break;
    case O_MODEL_FILE: o->model_file = optarg; break;
    case O_DEVICE:
      if (ps_parse_device(optarg, &o->device) != 0) {
        ps_cmd_error("--device '%s': expected " PS_DEVICE_FORM, optarg);
        return 2;
      }
      break;
    case O_THREADS:
      if (ps_cmd_flag_i64("threads", optarg, 1, 256, &o->threads) != 0)
        return 2;
      break;
    case O_BATCH:
      if (ps_cmd_flag_i64("batch", optarg, 1, 65536, &o->batch) != 0)
        return 2;
      break;
    case O_LOG_LEVEL: {
      int lv = ps_log_level_parse(optarg);
      if (lv < 0) {
        ps_cmd_error("--log-level '%s': expected debug, info, warn or error", optarg);
        return 2;
      }
      ps_log_init("eval", lv);
      break;
    }
    case 'h': eval_usage(stdout); return 1;
    default: return ps_cmd_bad_option(c, argv, "eval");
    }
  }
  if (optind >= argc) {
    ps_cmd_error("eval: expected a checkpoint CKPT (see paramserv eval --help)");
    return 2;
  }
  if (o->npy != NULL && data) {
    ps_cmd_error("--npy with --data: expected one test set, numpy files (--npy) or IDX (--data)");
    return 2;
  }
  o->ckpt = argv[optind++];
  return ps_cmd_no_operands(argc, argv, "eval");
}

int ps_cmd_eval(int argc, char **argv) {
  eval_opts o;
  int rc = parse_opts(argc, argv, &o);
  if (rc != 0)
    return rc == 1 ? 0 : 2;

  ps_ckpt c;
  if (ps_cmd_open_ckpt(o.ckpt, &c) != 0)
    return 2;
  int status = 2;
  ps_errbuf eb = {0};
  ps_model model = {0};
  ps_data_norm norm;
  ps_dataset test = {0};
  ps_compute *compute = NULL;
  float *params = NULL, *x = NULL;

  if (ps_ckpt_model(&c, o.model_file, &model, &norm, &eb) != 0) {
    ps_cmd_error("%s", eb.msg);
    goto out;
  }
  /* The values, each shard file verified as it is read: a damaged
   * checkpoint says which file and why. */
  params = malloc(c.total_floats * sizeof *params + 1);
  if (params == NULL) {
    ps_cmd_error("out of memory for the %zu values of %s", c.total_floats, c.path);
    status = 1;
    goto out;
  }
  if (ps_ckpt_read_values(&c, params, &eb) != 0) {
    ps_cmd_error("%s", eb.msg);
    goto out;
  }
  char what[256];
  if (ps_find_nonfinite(params, c.total_floats, -1, what, sizeof what)) {
    ps_cmd_error("%s: %s: nothing to evaluate", c.path, what);
    status = 1;
    goto out;
  }
  if (o.npy != NULL ? ps_npy_load(o.npy, &test, &eb) != 0
                    : ps_dataset_load(o.data, "t10k", &test, &eb) != 0) {
    ps_cmd_error("%s", eb.msg);
    status = eb.code == -ENOMEM ? 1 : 2;
    goto out;
  }
  if (o.npy != NULL ? ps_model_check_inputs(&model, test.dim, test.classes, &eb) != 0
                    : ps_model_check_data(&model, test.rows, test.cols, 10, &eb) != 0) {
    ps_cmd_error("%s: %s", o.npy != NULL ? o.npy : o.data, eb.msg);
    goto out;
  }
  compute = ps_compute_new_on(&model, o.device, (int)o.threads, (int)o.batch, &eb);
  if (compute == NULL) {
    ps_cmd_error("%s", eb.msg);
    status = eb.code == -ENODEV ? 2 : 1;
    goto out;
  }
  x = malloc(test.n * model.in_size * sizeof *x + 1);
  if (x == NULL) {
    ps_cmd_error("out of memory for the test set");
    status = 1;
    goto out;
  }
  /* npy features are fed as they are, whatever the checkpoint says of IDX bytes. */
  ps_dataset_images_norm(&test, NULL, test.n, &norm, x);
  if (o.npy != NULL)
    printf("eval: %s (step %" PRIu64 ", format version %d): model %s, %zu parameters; inputs "
           "as they are (npy)\n", c.path, c.step, c.format_version, c.model, model.vars.total);
  else
    printf("eval: %s (step %" PRIu64 ", format version %d): model %s, %zu parameters; inputs "
           "(b / %g - %g) / %g\n", c.path, c.step, c.format_version, c.model, model.vars.total,
           (double)norm.divide, (double)norm.mean, (double)norm.std);
  printf("eval: data %s: %zu test samples; %s\n", o.npy != NULL ? o.npy : o.data, test.n,
         ps_compute_describe(compute));
  fflush(stdout);
  size_t right = 0;
  double loss = ps_compute_eval(compute, params, x, test.labels, test.n, &right);
  printf("eval step %" PRIu64 " samples %zu test_loss %.6f test_acc %.4f\n", c.step, test.n, loss,
         (double)right / (double)test.n);
  status = 0;
out:
  free(x);
  free(params);
  ps_compute_free(compute);
  ps_dataset_close(&test);
  ps_model_close(&model);
  ps_ckpt_close(&c);
  return status;
}
