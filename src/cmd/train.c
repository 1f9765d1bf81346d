/* `paramserv train`: one process, no parameter server.  The reference
 * trainer that the distributed runs are measured against.  IDX data here;
 * Criteo data and sparse tables in train_ctr.c. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cli.h"
#include "cmd/cmd.h"
#include "cmd/train_ctr.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/timeutil.h"
#include "data/idx.h"
#include "data/npy.h"
#include "data/sampler.h"
#include "nn/backend.h"
#include "nn/compute.h"
#include "nn/model.h"
#include "nn/modelfile.h"
#include "optim/optim.h"
#include "recovery/solo.h"

static void train_usage(FILE *f) {
  fprintf(f,
      "usage: paramserv train [OPTIONS]\n"
      "\n"
      "Train a built-in model or a model file on an IDX data set or on your own data\n"
      "as numpy files (--npy), or a CTR model on Criteo data (--train), in this one\n"
      "process (no parameter server) and print, per epoch, the mean loss, the test\n"
      "accuracy (Criteo: the test AUC and log loss) and samples/s.\n"
      "\n"
      "  --model mlp|cnn       model (default mlp)\n"
      "  --hidden SIZES        mlp hidden sizes, comma-separated (default 256,128)\n"
      "  --model-file PATH     a model file (src/nn/MODELFILE.md) instead of --model\n"
      "  --epochs N            epochs over the training set (default 10)\n"
      "  --batch B             samples per step (default 128)\n"
      "  --optimizer NAME      sgd|momentum|nesterov|adagrad|adam (default adam)\n"
      "  --lr X                learning rate (default 0.001); with --train also the\n"
      "                        sparse tables' where the model file gives none\n"
      "  --momentum X          momentum coefficient (default 0.9)\n"
      "  --weight-decay X      L2 penalty added to the gradient (default 0)\n"
      "  --schedule NAME       constant|step|cosine learning-rate schedule (default constant)\n"
      "  --step-epochs X       step schedule: epochs between decays (default 1)\n"
      "  --gamma X             step schedule: factor per decay (default 0.5)\n"
      "  --min-lr X            cosine schedule: final learning rate (default 0)\n"
      "  --warmup-steps N      linear warm-up steps (default 0)\n"
      "  --device D            cpu, cuda or cuda:N: where gradients are computed\n"
      "                        (default cpu; cuda needs a build with make CUDA=1)\n"
      "  --threads T           compute threads on the cpu (default: all cores)\n"
      "  --seed S              seed of initial weights, data order and dropout (default 1)\n"
      "  --data DIR            IDX directory (default " PS_DATA_DEFAULT_DIR ")\n"
      "  --npy DIR             train on DIR/X.npy (float32, N x D) and DIR/y.npy (labels,\n"
      "                        N) instead, fed as they are (src/data/NPY.md)\n"
      "  --npy-test DIR        with --npy: the test set, DIR/X.npy and DIR/y.npy (without\n"
      "                        it, no test accuracy)\n"
      "  --train FILE          Criteo-format training data instead (plain or gzip,\n"
      "                        src/data/CRITEO.md), read in the file's order each\n"
      "                        epoch: the model must take input [13] and end in\n"
      "                        sigmoid, e.g. --model-file models/ctr.json, whose\n"
      "                        embedding_bag layers become sparse tables here\n"
      "  --test FILE           with --train: Criteo test data, for the test AUC and log\n"
      "                        loss at each epoch's end (default: no test)\n"
      "  --bag-separator C     with --train: each categorical field is a bag of values\n"
      "                        separated by the byte C, e.g. , (CRITEO.md, \"Bags\";\n"
      "                        default: one value a field)\n"
      "  --max-steps N         stop after N steps in all (default: no limit)\n"
      "  --train-limit N       use only the first N training samples (default: all)\n"
      "  --no-eval             skip the test-set evaluation\n"
      "  --checkpoint-dir D    write checkpoints into D (recovery/FORMAT.md, the chief's\n"
      "                        format, which paramserv eval and paramserv ckpt read)\n"
      "                        at each epoch's end and at the end; when D holds\n"
      "                        one, resume from its newest: weights, optimizer state,\n"
      "                        step and data position (it must be of this model and\n"
      "                        optimizer, else the run is refused, exit 2); not with\n"
      "                        --train (sparse tables) yet\n"
      "  --checkpoint-every N  with --checkpoint-dir, also every N steps (default 0)\n"
      "  --keep K              checkpoints kept in D, the newest by step (default 5;\n"
      "                        0 keeps all)\n"
      "  --init-from CKPT      start from the weights of a checkpoint (DIR/ckpt-<step>,\n"
      "                        or the newest of a directory; any writer's, whose\n"
      "                        variables are this model's): fresh optimizer state, step\n"
      "                        0; not used when --checkpoint-dir resumes\n"
      "  --log-level LEVEL     debug|info|warn|error (default info)\n"
      "  -h, --help            this help\n"
      "\n"
      "--epochs and --max-steps count from the run's first step: a resumed run\n"
      "trains to where the uninterrupted run would have stopped, the same steps.\n"
      "\n"
      "Ctrl-C (SIGINT) or SIGTERM stops after the step in progress; with\n"
      "--checkpoint-dir a final checkpoint is written there first, so the same\n"
      "command resumes.  The exit status is then 130 (SIGINT) or 143 (SIGTERM);\n"
      "a second signal ends the process at once.\n"
      "\n"
      "The last line is machine-readable:\n"
      "  done steps S samples N seconds T samples/s R test_acc A ms/step M\n"
      "  done steps S samples N seconds T samples/s R test_auc A test_logloss L ms/step M\n"
      "(the second with --train), A and L \"-\" when there was no test;\n"
      "S steps and N samples in all; T seconds of training, R samples/s and M ms\n"
      "per step from step 2 on: step 1 (the warm-up: a GPU loads its kernels and\n"
      "cuBLAS picks its algorithms there) is not timed, unless it is the only one.\n"
      "The epoch lines' samples/s and seconds leave step 1 out the same way.\n");
}

/* @return 0, 1 for --help (printed), or -1 after printing an error. */
static int parse_opts(int argc, char **argv, ps_train_opts *o) {
  enum { O_MODEL = 256, O_HIDDEN, O_MODEL_FILE, O_EPOCHS, O_BATCH, O_OPTIM, O_LR, O_MOMENTUM, O_WD,
         O_SCHED, O_STEP_EPOCHS, O_GAMMA, O_MIN_LR, O_WARMUP, O_THREADS, O_SEED, O_DATA,
         O_MAX_STEPS, O_TRAIN_LIMIT, O_NO_EVAL, O_LOG_LEVEL, O_DEVICE, O_CKPT_DIR, O_CKPT_EVERY,
         O_KEEP, O_INIT_FROM, O_TRAIN, O_TEST, O_NPY, O_NPY_TEST, O_BAG_SEP };
  static const struct option longopts[] = {
      {"model", required_argument, 0, O_MODEL},
      {"hidden", required_argument, 0, O_HIDDEN},
      {"model-file", required_argument, 0, O_MODEL_FILE},
      {"epochs", required_argument, 0, O_EPOCHS},
      {"batch", required_argument, 0, O_BATCH},
      {"optimizer", required_argument, 0, O_OPTIM},
      {"lr", required_argument, 0, O_LR},
      {"momentum", required_argument, 0, O_MOMENTUM},
      {"weight-decay", required_argument, 0, O_WD},
      {"schedule", required_argument, 0, O_SCHED},
      {"step-epochs", required_argument, 0, O_STEP_EPOCHS},
      {"gamma", required_argument, 0, O_GAMMA},
      {"min-lr", required_argument, 0, O_MIN_LR},
      {"warmup-steps", required_argument, 0, O_WARMUP},
      {"threads", required_argument, 0, O_THREADS},
      {"device", required_argument, 0, O_DEVICE},
      {"checkpoint-dir", required_argument, 0, O_CKPT_DIR},
      {"checkpoint-every", required_argument, 0, O_CKPT_EVERY},
      {"keep", required_argument, 0, O_KEEP},
      {"init-from", required_argument, 0, O_INIT_FROM},
      {"seed", required_argument, 0, O_SEED},
      {"data", required_argument, 0, O_DATA},
      {"train", required_argument, 0, O_TRAIN},
      {"test", required_argument, 0, O_TEST},
      {"bag-separator", required_argument, 0, O_BAG_SEP},
      {"npy", required_argument, 0, O_NPY},
      {"npy-test", required_argument, 0, O_NPY_TEST},
      {"max-steps", required_argument, 0, O_MAX_STEPS},
      {"train-limit", required_argument, 0, O_TRAIN_LIMIT},
      {"no-eval", no_argument, 0, O_NO_EVAL},
      {"log-level", required_argument, 0, O_LOG_LEVEL},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  const char *optim_name = "adam", *sched_name = "constant";
  int64_t seed = 1;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  *o = (ps_train_opts){.model = "mlp", .data = PS_DATA_DEFAULT_DIR, .epochs = 10, .batch = 128,
                    .threads = cores > 0 ? cores : 1, .lr = 0.001, .momentum = 0.9,
                    .gamma = 0.5, .step_epochs = 1, .eval = 1, .device = PS_DEVICE_CPU,
                    .keep = 5, .bag_separator = -1};
  opterr = 0;
  optind = 1;
  int c, rc = 0, named = 0, every = 0, keep = 0, data = 0;
  while (rc == 0 && (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case O_MODEL: o->model = optarg; named = 1; break;
    case O_HIDDEN: o->hidden = optarg; break;
    case O_MODEL_FILE: o->model_file = optarg; break;
    case O_EPOCHS: rc = ps_cmd_flag_i64("epochs", optarg, 1, 100000, &o->epochs); break;
    case O_BATCH: rc = ps_cmd_flag_i64("batch", optarg, 1, 65536, &o->batch); break;
    case O_OPTIM: optim_name = optarg; break;
    case O_LR: rc = ps_cmd_flag_double("lr", optarg, 0, 1e3, &o->lr); break;
    case O_MOMENTUM: rc = ps_cmd_flag_double("momentum", optarg, 0, 1, &o->momentum); break;
    case O_WD: rc = ps_cmd_flag_double("weight-decay", optarg, 0, 1, &o->weight_decay); break;
    case O_SCHED: sched_name = optarg; break;
    case O_STEP_EPOCHS: rc = ps_cmd_flag_double("step-epochs", optarg, 0, 1e6, &o->step_epochs); break;
    case O_GAMMA: rc = ps_cmd_flag_double("gamma", optarg, 0, 1, &o->gamma); break;
    case O_MIN_LR: rc = ps_cmd_flag_double("min-lr", optarg, 0, 1e3, &o->min_lr); break;
    case O_WARMUP: rc = ps_cmd_flag_i64("warmup-steps", optarg, 0, INT64_MAX, &o->warmup); break;
    case O_THREADS: rc = ps_cmd_flag_i64("threads", optarg, 1, 256, &o->threads); break;
    case O_DEVICE:
      if (ps_parse_device(optarg, &o->device) != 0) {
        ps_cmd_error("--device '%s': expected " PS_DEVICE_FORM, optarg);
        rc = -1;
      }
      break;
    case O_SEED: rc = ps_cmd_flag_i64("seed", optarg, 0, INT64_MAX, &seed); break;
    case O_DATA: o->data = optarg; data = 1; break;
    case O_TRAIN: o->train = optarg; break;
    case O_TEST: o->test = optarg; break;
    case O_BAG_SEP:
      if (strlen(optarg) != 1 || optarg[0] == '\t' || optarg[0] == '\n' || optarg[0] == '\r') {
        ps_cmd_error("--bag-separator '%s': expected one byte other than a tab", optarg);
        rc = -1;
      } else {
        o->bag_separator = (unsigned char)optarg[0];
      }
      break;
    case O_NPY: o->npy = optarg; break;
    case O_NPY_TEST: o->npy_test = optarg; break;
    case O_MAX_STEPS: rc = ps_cmd_flag_i64("max-steps", optarg, 1, INT64_MAX, &o->max_steps); break;
    case O_TRAIN_LIMIT: rc = ps_cmd_flag_i64("train-limit", optarg, 1, INT64_MAX, &o->train_limit); break;
    case O_NO_EVAL: o->eval = 0; break;
    case O_CKPT_DIR: o->ckpt_dir = optarg; break;
    case O_CKPT_EVERY:
      rc = ps_cmd_flag_i64("checkpoint-every", optarg, 0, INT64_MAX, &o->ckpt_every);
      every = 1;
      break;
    case O_KEEP: rc = ps_cmd_flag_i64("keep", optarg, 0, 1000000, &o->keep); keep = 1; break;
    case O_INIT_FROM: o->init_from = optarg; break;
    case O_LOG_LEVEL: {
      int lv = ps_log_level_parse(optarg);
      if (lv < 0) {
        ps_cmd_error("--log-level '%s': expected debug, info, warn or error", optarg);
        rc = -1;
      } else {
        ps_log_init("train", lv);
      }
      break;
    }
    case 'h': train_usage(stdout); return 1;
    case ':': ps_cmd_error("%s: expected a value", argv[optind - 1]); rc = -1; break;
    default: ps_cmd_error("unknown option '%s' (see paramserv train --help)", argv[optind - 1]);
      rc = -1;
    }
  }
  if (rc != 0)
    return -1;
  if (optind < argc) {
    ps_cmd_error("unexpected argument '%s' (see paramserv train --help)", argv[optind]);
    return -1;
  }
  if (o->model_file != NULL && (named || o->hidden != NULL)) {
    ps_cmd_error("--model-file with --%s: expected one of --model (and --hidden) and --model-file",
                 named ? "model" : "hidden");
    return -1;
  }
  if (o->npy != NULL && (data || o->train != NULL)) {
    ps_cmd_error("--npy with --%s: expected one data set, numpy files (--npy), IDX (--data) or "
                 "Criteo (--train)", data ? "data" : "train");
    return -1;
  }
  if (o->npy_test != NULL && o->npy == NULL) {
    ps_cmd_error("--npy-test without --npy: expected the training data as numpy files too");
    return -1;
  }
  /* The user's own data is evaluated only on the test set they give. */
  if (o->npy != NULL && o->npy_test == NULL)
    o->eval = 0;
  if (o->ckpt_dir == NULL && (every || keep)) {
    ps_cmd_error("--%s without --checkpoint-dir: expected a directory to write checkpoints into",
                 every ? "checkpoint-every" : "keep");
    return -1;
  }
  /* Criteo data (--train) is its own loop: no IDX directory, and no
   * checkpoints of sparse tables yet. */
  if (o->test != NULL && o->train == NULL) {
    ps_cmd_error("--test without --train: expected a Criteo training file too");
    return -1;
  }
  if (o->bag_separator >= 0 && o->train == NULL) {
    ps_cmd_error("--bag-separator without --train: expected a Criteo training file too");
    return -1;
  }
  if (o->train != NULL && (data || o->ckpt_dir != NULL || o->init_from != NULL)) {
    ps_cmd_error(data ? "--data with --train: expected one of --data (IDX) and --train (Criteo)"
                 : o->ckpt_dir != NULL ? "--checkpoint-dir with sparse tables: not yet"
                                       : "--init-from with sparse tables: not yet");
    return -1;
  }
  o->seed = (uint64_t)seed;
  o->optim = ps_optim_default(PS_OPTIM_ADAM, (float)o->lr);
  if (ps_optim_parse(optim_name, &o->optim) != 0) {
    ps_cmd_error("--optimizer '%s': expected sgd, momentum, nesterov, adagrad or adam",
                 optim_name);
    return -1;
  }
  o->optim.lr = (float)o->lr;
  o->optim.momentum = (float)o->momentum;
  o->optim.weight_decay = (float)o->weight_decay;
  memset(&o->sched, 0, sizeof o->sched);
  if (ps_sched_parse(sched_name, &o->sched) != 0) {
    ps_cmd_error("--schedule '%s': expected constant, step or cosine", sched_name);
    return -1;
  }
  return 0;
}

/* The signal that asked this run to stop (SIGINT, SIGTERM), 0 for none. */
static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) {
  stop_signal = sig;
}

/* The first SIGINT or SIGTERM asks the loop to stop (a final checkpoint,
 * then exit 128 + sig); SA_RESETHAND: a second one ends the process. */
static void catch_stop_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

/* Checkpoint `step` of the weights and optimizer state compute keeps, at
 * data position pos, into solo's directory; one line either way (a failure
 * is logged by the writer).  @return 0 or -1. */
static int save(ps_solo *solo, ps_compute *c, uint64_t step, ps_data_pos pos) {
  float *slots[PS_OPTIM_MAX_SLOTS] = {0};
  for (int k = 0; k < ps_optim_nslots(solo->optim.kind); k++)
    slots[k] = ps_solo_slot(solo, k);
  ps_compute_train_params(c, ps_solo_values(solo));
  ps_compute_train_slots(c, slots);
  ps_ckpt_write_stats st;
  ps_errbuf eb = {0};
  if (ps_solo_write(solo, step, pos, &st, &eb) != 0)
    return -1;
  printf("train: checkpoint %s in %s (step %" PRIu64 ", %" PRIu64 " bytes, %.3f s)\n", st.name,
         solo->dir, step, st.stored_bytes, st.total_s);
  fflush(stdout);
  return 0;
}

/* Whether the spec has an embedding_bag layer: sparse tables, which only
 * Criteo data feeds. */
static int has_tables(const ps_model_spec *spec) {
  for (int i = 0; i < spec->nlayers; i++)
    if (spec->layers[i].type == PS_LT_EMBEDDING_BAG)
      return 1;
  return 0;
}

/* --npy DIR and --npy-test DIR (src/data/NPY.md): the data sets, which
 * the model must fit.  @return 0, or the exit status after one line. */
static int load_npy(const ps_train_opts *o, const ps_model *model, ps_dataset *train,
                    ps_dataset *test) {
  ps_errbuf eb = {0};
  if (ps_npy_load(o->npy, train, &eb) != 0 ||
      (o->npy_test != NULL && ps_npy_load(o->npy_test, test, &eb) != 0)) {
    ps_cmd_error("%s", eb.msg);
    return eb.code == -ENOMEM ? 1 : 2;
  }
  if (o->npy_test != NULL && test->dim != train->dim) {
    ps_cmd_error("--npy-test %s: %zu floats a sample, --npy %s %zu: expected the same",
                 o->npy_test, test->dim, o->npy, train->dim);
    return 2;
  }
  int classes = test->classes > train->classes ? test->classes : train->classes;
  if (ps_model_check_inputs(model, train->dim, classes, &eb) != 0) {
    ps_cmd_error("--npy %s: %s", o->npy, eb.msg);
    return 2;
  }
  return 0;
}

int ps_cmd_train(int argc, char **argv) {
  ps_train_opts o;
  int rc = parse_opts(argc, argv, &o);
  if (rc != 0)
    return rc > 0 ? 0 : 2;

  ps_errbuf eb = {0};
  ps_model_spec spec;
  if ((o.model_file != NULL ? ps_modelfile_load(o.model_file, &spec, &eb)
                            : ps_model_spec_parse(o.model, o.hidden, &spec, &eb)) != 0) {
    ps_cmd_error("%s", eb.msg);
    return 2;
  }
  if (o.train != NULL) {
    catch_stop_signals();
    return ps_train_ctr(&o, &spec, &stop_signal);
  }
  if (has_tables(&spec)) {
    ps_cmd_error("--model-file %s has sparse tables: expected --train FILE (Criteo data)",
                 o.model_file);
    return 2;
  }
  int status = 1;
  ps_dataset train = {0}, test = {0};
  ps_model model = {0};
  ps_sampler sampler = {0};
  ps_compute *compute = NULL;
  float *params = NULL, *x = NULL, *warm = NULL;
  float *test_x = NULL;
  uint8_t *y = NULL;
  size_t *index = NULL;
  ps_solo solo = {0};
  int resumed = 0;
  uint64_t start_step = 0;
  ps_data_pos start_pos = {0, 0};
  char from[PS_CKPT_NAME_MAX] = "";

  if (ps_model_build(&spec, &model, &eb) != 0) {
    ps_cmd_error("%s", eb.msg);
    goto out;
  }
  /* Checkpoints before the seconds of loading data: a directory that cannot
   * be written, or that holds another model's, and a checkpoint to start
   * from that does not fit, are each one line and exit 2. */
  if (o.ckpt_dir != NULL &&
      (ps_solo_open(&solo, o.ckpt_dir, &model, &o.optim, o.keep, &eb) != 0 ||
       (resumed = ps_solo_resume(&solo, &start_step, &start_pos, from, &eb)) < 0)) {
    ps_cmd_error("%s", eb.msg);
    status = 2;
    goto out;
  }
  if (o.npy != NULL)
    solo.norm = PS_DATA_NORM_NONE;  /* what its checkpoints say the inputs were */
  if (o.init_from != NULL && !resumed) {
    ps_ckpt c;
    if (ps_cmd_open_ckpt(o.init_from, &c) != 0) {
      status = 2;
      goto out;
    }
    warm = malloc(model.vars.total * sizeof *warm + 1);
    int wrc = warm == NULL ? ps_err_set(&eb, -ENOMEM, "out of memory for %s's weights", c.path)
                           : ps_solo_init_from(&c, &model, warm, &eb);
    if (wrc == 0)
      printf("train: weights from %s (step %" PRIu64 ", model %s)\n", c.path, c.step, c.model);
    else
      ps_cmd_error("--init-from %s", eb.msg);
    ps_ckpt_close(&c);
    if (wrc != 0) {
      status = wrc == -ENOMEM ? 1 : 2;
      goto out;
    }
  }
  /* The device first: a GPU that is not there is said in one line at once,
   * before seconds of loading data, and it is the environment's problem (2),
   * not a failure of the run (1). */
  compute = ps_compute_new_on(&model, o.device, (int)o.threads, (int)o.batch, &eb);
  if (compute == NULL) {
    ps_cmd_error("%s", eb.msg);
    if (eb.code == -ENODEV)
      status = 2;
    goto out;
  }
  int lrc = o.npy != NULL ? load_npy(&o, &model, &train, &test) : 0;
  if (lrc != 0) {
    status = lrc;
    goto out;
  }
  if (o.npy == NULL && (ps_dataset_load(o.data, "train", &train, &eb) != 0 ||
                        (o.eval && ps_dataset_load(o.data, "t10k", &test, &eb) != 0))) {
    ps_cmd_error("%s", eb.msg);
    status = eb.code == -ENOMEM ? 1 : 2;
    goto out;
  }
  if (o.npy == NULL && o.eval && (test.rows != train.rows || test.cols != train.cols)) {
    ps_cmd_error("%s: training images are %ux%u, test images %ux%u: expected the same size",
                 o.data, train.rows, train.cols, test.rows, test.cols);
    status = 2;
    goto out;
  }
  if (o.npy == NULL && ps_model_check_data(&model, train.rows, train.cols, 10, &eb) != 0) {
    ps_cmd_error("%s: %s", o.data, eb.msg);
    status = 2;
    goto out;
  }
  if (o.train_limit > 0 && (size_t)o.train_limit < train.n)
    train.n = (size_t)o.train_limit;
  size_t total = model.vars.total;
  /* The parameters, their gradient and the optimizer's slots live where the
   * computation runs (ps_compute_train_init: on a GPU, in its memory);
   * params holds their initial values.  The batch goes to the device every
   * step: it lives in the device's fastest host memory (pinned, on a GPU). */
  params = malloc(total * sizeof *params);
  x = ps_compute_host_alloc(compute, (size_t)o.batch * model.in_size * sizeof *x);
  y = malloc((size_t)o.batch);
  index = malloc((size_t)o.batch * sizeof *index);
  int failed = params == NULL || x == NULL || y == NULL || index == NULL;
  if (failed || ps_sampler_init(&sampler, train.n, 0, 1, o.seed) != 0) {
    ps_cmd_error("out of memory for the %s model at batch %" PRId64, spec.desc, o.batch);
    goto out;
  }
  if (o.eval) {
    test_x = malloc(test.n * model.in_size * sizeof *test_x);
    if (test_x == NULL) {
      ps_cmd_error("out of memory for the test set");
      goto out;
    }
    ps_dataset_inputs(&test, NULL, test.n, test_x);
  }
  /* The weights: a resumed checkpoint's (with its optimizer state), a
   * warm start's, or the seeded initialization. */
  ps_vartable_init_arena(&model.vars, o.seed, params);
  if (ps_compute_train_init(compute, resumed ? ps_solo_values(&solo) : warm ? warm : params,
                            &o.optim) != 0) {
    ps_cmd_error("out of %s memory for the %s model's parameters and optimizer slots",
                 o.device >= 0 ? "GPU" : "host", spec.desc);
    goto out;
  }
  if (resumed) {
    const float *slots[PS_OPTIM_MAX_SLOTS] = {0};
    for (int k = 0; k < ps_optim_nslots(o.optim.kind); k++)
      slots[k] = ps_solo_slot(&solo, k);
    ps_compute_train_load_slots(compute, slots);
    if (ps_sampler_seek(&sampler, start_pos) != 0) {
      ps_cmd_error("%s/%s: its data position (epoch %" PRIu64 ", sample %" PRIu64 ") is past "
                   "this run's %zu training samples: expected the --train-limit it was "
                   "trained with", o.ckpt_dir, from, start_pos.epoch + 1, start_pos.offset,
                   train.n);
      status = 2;
      goto out;
    }
  }

  size_t part = ps_sampler_part_size(&sampler);
  uint64_t steps_per_epoch = (part + (size_t)o.batch - 1) / (size_t)o.batch;
  ps_train_sched_setup(&o, steps_per_epoch);

  char desc[128];
  printf("train: model %s, %zu parameters, %s lr %g (%s), batch %" PRId64 ", %" PRId64
         " threads, seed %" PRIu64 "\n",
         ps_model_spec_format(&spec, desc, sizeof desc), total, ps_optim_name(&o.optim), o.lr,
         ps_sched_name(&o.sched), o.batch, (int64_t)ps_compute_threads(compute), o.seed);
  if (o.npy != NULL)
    printf("train: data %s (npy, %zu floats a sample, %d classes, used as they are)%s%s: %zu "
           "training, %zu test samples; %s\n", o.npy, train.dim, train.classes,
           o.npy_test ? ", test " : "", o.npy_test ? o.npy_test : "", train.n, test.n,
           ps_compute_describe(compute));
  else
    printf("train: data %s: %zu training, %zu test samples; %s\n", o.data, train.n, test.n,
           ps_compute_describe(compute));
  fflush(stdout);

  /* A resumed run goes on where the checkpoint stood: its step, the
   * samples handed out (the dropout stream's position), and the epoch and
   * step in it that its data position says (an epoch handed out whole is
   * done). */
  uint64_t start_samples = start_pos.epoch * part + start_pos.offset;
  int64_t first_epoch = (int64_t)start_pos.epoch + (start_pos.offset >= part);
  uint64_t first_s = start_pos.offset >= part ? 0 : (start_pos.offset + (size_t)o.batch - 1) /
                                                        (size_t)o.batch;
  if (resumed) {
    printf("train: resumed from %s/%s: step %" PRIu64 ", data at epoch %" PRId64 " sample %"
           PRIu64 " of %zu\n", o.ckpt_dir, from, start_step,
           first_epoch + (start_pos.offset < part), start_pos.offset >= part ? part :
           start_pos.offset, part);
    fflush(stdout);
  }

  /* Timed from the end of the first step (see train_usage): the step
   * counts and samples of the timed steps, in all and in the epoch. */
  uint64_t step = start_step, samples = start_samples, timed_steps = 0, timed_samples = 0;
  uint64_t saved = resumed ? start_step : UINT64_MAX;
  double train_seconds = 0.0, first_step_seconds = 0.0, test_acc = -1.0;
  int stopped = 0;
  catch_stop_signals();
  for (int64_t epoch = first_epoch; epoch < o.epochs && !stopped; epoch++) {
    double t0 = ps_now_s(), loss_sum = 0.0, paused = 0.0;
    size_t correct = 0, seen = 0, epoch_timed = 0;
    for (uint64_t s = epoch == first_epoch ? first_s : 0; s < steps_per_epoch; s++) {
      if ((o.max_steps > 0 && step >= (uint64_t)o.max_steps) || stop_signal != 0) {
        stopped = 1;
        break;
      }
      size_t n = ps_dataset_batch(&train, &sampler, index, (size_t)o.batch, x, y);
      float lr = ps_sched_lr(&o.sched, o.optim.lr, step);
      double loss = ps_compute_train_step(compute, x, y, (int)n, o.seed, samples, lr, step + 1,
                                          &correct);
      if (!(loss == loss) || loss > 1e30) {
        ps_cmd_error("step %" PRIu64 ": loss is %g; stopping (lower --lr?)", step, loss);
        goto out;
      }
      loss_sum += loss * (double)n;
      seen += n;
      samples += n;
      step++;
      if (o.ckpt_dir != NULL && o.ckpt_every > 0 && step % (uint64_t)o.ckpt_every == 0) {
        double c0 = ps_now_s();
        if (save(&solo, compute, step, sampler.pos) == 0)
          saved = step;
        paused += ps_now_s() - c0;  /* not training time */
      }
      if (step == start_step + 1) {
        double t1 = ps_now_s();
        first_step_seconds = t1 - t0;
        t0 = t1;  /* the clock starts after the warm-up step */
      } else {
        timed_steps++;
        timed_samples += n;
        epoch_timed += n;
      }
    }
    double secs = ps_now_s() - t0 - paused;
    if (epoch_timed == 0) /* only the warm-up step: time that one */
      secs = first_step_seconds, epoch_timed = seen;
    else
      train_seconds += secs;
    if (seen == 0)
      break;
    char acc[32] = "-";
    if (o.eval && stop_signal == 0) {
      size_t right = 0;
      ps_compute_eval(compute, NULL, test_x, test.labels, test.n, &right);
      test_acc = (double)right / (double)test.n;
      snprintf(acc, sizeof acc, "%.4f", test_acc);
    }
    printf("epoch %" PRId64 "/%" PRId64 " loss %.4f train_acc %.4f test_acc %s samples/s %.1f "
           "seconds %.3f\n",
           epoch + 1, o.epochs, loss_sum / (double)seen, (double)correct / (double)seen, acc,
           secs > 0 ? (double)epoch_timed / secs : 0.0, secs);
    fflush(stdout);
    if (o.ckpt_dir != NULL && saved != step && save(&solo, compute, step, sampler.pos) == 0)
      saved = step;
  }
  /* The last checkpoint is the run's result: one that cannot be written
   * fails the run. */
  if (o.ckpt_dir != NULL && saved != step && save(&solo, compute, step, sampler.pos) != 0) {
    ps_cmd_error("the final checkpoint (step %" PRIu64 ") could not be written into %s",
                 step, o.ckpt_dir);
    goto out;
  }
  if (stop_signal != 0) {
    int sig = stop_signal;
    if (o.ckpt_dir != NULL)
      printf("train: stopped by %s at step %" PRIu64 "; the same command resumes from %s\n",
             sig == SIGINT ? "SIGINT" : "SIGTERM", step, o.ckpt_dir);
    else
      printf("train: stopped by %s at step %" PRIu64 " (no --checkpoint-dir: nothing kept)\n",
             sig == SIGINT ? "SIGINT" : "SIGTERM", step);
    fflush(stdout);
    status = 128 + sig;
    goto out;
  }
  char acc[32] = "-";
  if (test_acc >= 0)
    snprintf(acc, sizeof acc, "%.4f", test_acc);
  if (timed_steps == 0 && step > start_step) { /* only the warm-up step ran: time that one */
    train_seconds = first_step_seconds;
    timed_steps = step - start_step;
    timed_samples = samples - start_samples;
  }
  printf("done steps %" PRIu64 " samples %" PRIu64 " seconds %.3f samples/s %.1f test_acc %s "
         "ms/step %.4f\n",
         step, samples, train_seconds,
         train_seconds > 0 ? (double)timed_samples / train_seconds : 0.0, acc,
         timed_steps > 0 ? train_seconds * 1e3 / (double)timed_steps : 0.0);
  status = 0;
out:
  free(index);
  free(y);
  free(test_x);
  free(params);
  free(warm);
  ps_solo_close(&solo);
  if (compute != NULL)
    ps_compute_host_free(compute, x);
  ps_compute_free(compute);
  ps_sampler_close(&sampler);
  ps_model_close(&model);
  ps_dataset_close(&test);
  ps_dataset_close(&train);
  return status;
}
