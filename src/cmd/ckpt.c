/* `paramserv ckpt`: list, show, verify and export the checkpoints of a
 * checkpoint directory (recovery/FORMAT.md). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cmd/cli.h"
#include "cmd/cmd.h"
#include "common/config.h"
#include "common/log.h"
#include "recovery/checkpoint.h"
#include "recovery/export.h"

static const char *const consistency_names[] = {"async", "sync", "ssp"};

static void ckpt_usage(FILE *f) {
  fprintf(f,
      "usage: paramserv ckpt ls DIR\n"
      "       paramserv ckpt show CKPT\n"
      "       paramserv ckpt verify CKPT\n"
      "       paramserv ckpt export CKPT --format safetensors|npy [--force] OUT\n"
      "       paramserv ckpt compact CKPT\n"
      "\n"
      "Inspect the checkpoints a chief wrote (format: recovery/FORMAT.md).\n"
      "\n"
      "  ls DIR      every checkpoint of the directory DIR: step, time, size, model, and\n"
      "              whether the index lists it (manifests only: use verify for the files)\n"
      "  show CKPT   a checkpoint's manifest: model (its layers and input normalization),\n"
      "              optimizer, variables, shards, workers\n"
      "  verify CKPT check every shard file: size, LZ4 frame and checksum, XXH64, and\n"
      "              the sparse tables' sections (keys unique, on their shard)\n"
      "  export CKPT the variables' values as one .safetensors file or a directory of .npy\n"
      "              (with the sparse tables' rows), the model file and the input\n"
      "              normalization\n"
      "  compact CKPT an incremental checkpoint (the table rows changed since the one\n"
      "              before it) rewritten as a full one, its chain folded in\n"
      "\n"
      "CKPT is a checkpoint directory (DIR/ckpt-<step>), or a directory DIR of\n"
      "checkpoints: then show, export and compact take its newest valid checkpoint,\n"
      "and verify checks every one.  `paramserv ckpt VERB --help` describes a verb.\n"
      "`paramserv eval CKPT` evaluates a checkpoint on the test set.\n"
      "Exit status: 0 success, 1 failure (damaged or unreadable), 2 bad usage\n"
      "(export: also a target that exists and is not empty).\n");
}

static void sub_usage(FILE *f, const char *verb) {
  if (strcmp(verb, "ls") == 0)
    fprintf(f, "usage: paramserv ckpt ls DIR\n\n"
               "One line per checkpoint of DIR, oldest step first: name, step, time (UTC),\n"
               "shards, stored size, model, and its state: latest / kept (listed in the\n"
               "index), unlisted (a directory the index does not name), missing (named by\n"
               "the index, no directory), or the reason its manifest is unreadable.\n"
               "Shard files are not read: `paramserv ckpt verify DIR` checks them.\n");
  else if (strcmp(verb, "show") == 0)
    fprintf(f, "usage: paramserv ckpt show CKPT\n\n"
               "Print the checkpoint's manifest: format version, step, time, cluster, model,\n"
               "layout hash, optimizer, consistency, filter, every variable with its parts,\n"
               "every shard file with its sizes, checksum and exactly-once table, and every\n"
               "worker's data position.  CKPT may be a directory of checkpoints: its newest\n"
               "valid one is shown.\n");
  else if (strcmp(verb, "verify") == 0)
    fprintf(f, "usage: paramserv ckpt verify CKPT\n\n"
               "Decompress every shard file and check its size, its LZ4 frame (content\n"
               "checksum included) and its XXH64 against the manifest.  For a model with\n"
               "sparse tables, also each file's table section: it parses to its end with\n"
               "every table's dim and optimizer slots, each key appears once in its table,\n"
               "and each key is the file's shard's by the hash ring; the line then counts\n"
               "the rows and pending keys.  CKPT may be a directory of checkpoints: every\n"
               "one is verified, one line each.  Exit status 1 if any fails.\n");
  else if (strcmp(verb, "compact") == 0)
    fprintf(f, "usage: paramserv ckpt compact CKPT\n\n"
               "An incremental checkpoint holds the sparse table rows changed since the\n"
               "checkpoint before it (its base: [checkpoint] full_every), so it needs its\n"
               "chain back to a full one.  compact reads the chain (every file verified),\n"
               "puts each shard's state together and writes it as a full checkpoint of the\n"
               "same step in its place (written beside, then renamed over it); the\n"
               "checkpoints built on it still read, as they name its state, not its files.\n"
               "Run it on a directory no chief is writing into.  CKPT may be a directory of\n"
               "checkpoints: its newest valid one is compacted.  Exit status 1 if the chain\n"
               "does not read or the write fails, 2 for a full checkpoint.\n");
  else
    fprintf(f, "usage: paramserv ckpt export CKPT --format safetensors|npy [--force] OUT\n\n"
               "Reassemble every variable from the shard files (verified on the way) and\n"
               "write its values, float32 in the manifest's shapes, with what the model is:\n"
               "  --format safetensors  one file OUT; its metadata: step, model, layout hash,\n"
               "                        paramserv.network (the model file, JSON) and\n"
               "                        paramserv.normalization (JSON)\n"
               "  --format npy          a directory OUT with one <variable>.npy per variable,\n"
               "                        model.json (a model file: src/nn/MODELFILE.md, which\n"
               "                        paramserv train --model-file takes) and\n"
               "                        normalization.json: each input byte b becomes\n"
               "                        (b / divide - mean) / std; and per sparse table\n"
               "                        <table>.keys.npy (uint64, rows), <table>.values.npy\n"
               "                        (float32, rows x dim) and, for an optimizer with\n"
               "                        slots, <table>.slots.npy (float32, rows x slots x dim):\n"
               "                        every shard's rows by key (keys pending admission\n"
               "                        are not rows); the sections checked as verify does\n"
               "  --force               write into a directory OUT that is not empty (files\n"
               "                        of the same names replaced, others left), or over an\n"
               "                        existing file OUT; without it either is refused\n"
               "                        (exit 2), so that two exports never mix\n"
               "A checkpoint of a model of variables only has no model file to write.\n"
               "The variables' optimizer slots are not exported, nor are the sparse tables\n"
               "to safetensors.  CKPT may be a directory of checkpoints: its newest valid\n"
               "one is exported.\n");
}

/* Parse the verb's options: only --help, plus --format and --force for
 * export (format and force NULL for the others).
 * @return 0, 1 for --help (printed), 2 after a usage error. */
static int sub_opts(int argc, char **argv, const char **format, int *force) {
  enum { O_FORMAT = 256, O_FORCE };
  static const struct option longopts[] = {
      {"format", required_argument, 0, O_FORMAT},
      {"force", no_argument, 0, O_FORCE},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  const char *verb = argv[0];
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'h': sub_usage(stdout, verb); return 1;
    case O_FORMAT:
      if (format != NULL) {
        *format = optarg;
        break;
      }
      ps_cmd_error("ckpt %s: unknown option '--format' (see paramserv ckpt %s --help)", verb,
                   verb);
      return 2;
    case O_FORCE:
      if (force != NULL) {
        *force = 1;
        break;
      }
      ps_cmd_error("ckpt %s: unknown option '--force' (see paramserv ckpt %s --help)", verb,
                   verb);
      return 2;
    case ':': ps_cmd_error("ckpt %s: %s: expected a value", verb, argv[optind - 1]); return 2;
    default:
      ps_cmd_error("ckpt %s: unknown option '%s' (see paramserv ckpt %s --help)", verb,
                   argv[optind - 1], verb);
      return 2;
    }
  }
  return 0;
}

static int want_args(int argc, char **argv, int n, const char *what) {
  if (argc - optind == n)
    return 0;
  ps_cmd_error("ckpt %s: expected %s, got %d argument%s (see paramserv ckpt %s --help)", argv[0],
               what, argc - optind, argc - optind == 1 ? "" : "s", argv[0]);
  return 2;
}

static const char *utc(double t, char *buf, size_t len) {
  time_t s = (time_t)t;
  struct tm tm;
  if (t < 0 || gmtime_r(&s, &tm) == NULL || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
    snprintf(buf, len, "?");
  return buf;
}

/* ------------------------------------------------------------------ */

static int cmd_ls(int argc, char **argv) {
  int rc = sub_opts(argc, argv, NULL, NULL);
  if (rc != 0)
    return rc == 1 ? 0 : rc;
  if ((rc = want_args(argc, argv, 1, "DIR")) != 0)
    return rc;
  const char *dir = argv[optind];
  ps_ckpt_entry *e = NULL;
  ps_errbuf eb = {0};
  int n = ps_ckpt_list(dir, &e, &eb);
  if (n < 0) {
    ps_cmd_error("%s", eb.msg);
    return 1;
  }
  struct stat st;
  if (n == 0 && stat(dir, &st) != 0) {
    ps_cmd_error("%s: no such directory", dir);
    return 1;
  }
  printf("%-16s %10s  %-20s %6s  %10s  %-20s %s\n", "NAME", "STEP", "TIME", "SHARDS", "SIZE",
         "MODEL", "STATE");
  for (int i = 0; i < n; i++) {
    char tbuf[32], sbuf[32], path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e[i].name);
    if (!e[i].on_disk) {
      printf("%-16s %10" PRIu64 "  %-20s %6s  %10s  %-20s %s\n", e[i].name, e[i].step,
             utc(e[i].time, tbuf, sizeof tbuf), "-", "-", "-",
             "missing (listed in the index)");
      continue;
    }
    ps_ckpt c;
    if (ps_ckpt_open(&c, path, &eb) != 0) {
      printf("%-16s %10" PRIu64 "  %-20s %6s  %10s  %-20s unreadable: %s\n", e[i].name,
             e[i].step, utc(e[i].time, tbuf, sizeof tbuf), "-", "-", "-", eb.msg);
      continue;
    }
    uint64_t bytes = 0;
    for (int s = 0; s < c.nshards; s++)
      bytes += c.shards[s].compressed_size;
    printf("%-16s %10" PRIu64 "  %-20s %6d  %10s  %-20s %s%s%s\n", e[i].name, e[i].step,
           utc(e[i].time, tbuf, sizeof tbuf), c.nshards, ps_cmd_human_bytes(bytes, sbuf, sizeof sbuf),
           c.model, e[i].latest ? "latest" : e[i].in_index ? "kept" : "unlisted",
           c.base[0] ? ", incremental on " : "", c.base);
    ps_ckpt_close(&c);
  }
  free(e);
  return 0;
}

static int cmd_show(int argc, char **argv) {
  int rc = sub_opts(argc, argv, NULL, NULL);
  if (rc != 0)
    return rc == 1 ? 0 : rc;
  if ((rc = want_args(argc, argv, 1, "CKPT")) != 0)
    return rc;
  ps_ckpt c;
  if (ps_cmd_open_ckpt(argv[optind], &c) != 0)
    return 1;
  char tbuf[32], b1[32], b2[32];
  const ps_optim *o = &c.optim;
  printf("checkpoint   %s\n", c.path);
  printf("format       %d\n", c.format_version);
  if (c.base[0])
    printf("base         %s (incremental: its shard files hold the table entries changed "
           "since it)\n", c.base);
  printf("step         %" PRIu64 " (global step %" PRIu64 ")\n", c.step, c.global_step);
  printf("time         %s (%.3f)\n", utc(c.wall_time, tbuf, sizeof tbuf), c.wall_time);
  printf("cluster      %s\n", c.cluster_id);
  printf("model        %s\n", c.model);
  if (c.has_network) {
    const ps_model_spec *n = &c.network;
    printf("network      input %dx%dx%d, %d layers:", n->in_c, n->in_h, n->in_w, n->nlayers);
    for (int i = 0; i < n->nlayers; i++)
      printf("%s %s%s%s", i ? "," : "", ps_layer_type_name(n->layers[i].type),
             n->layers[i].name[0] ? " " : "", n->layers[i].name);
    printf("\n");
  } else {
    printf("network      %s\n", c.format_version < 2 ? "not recorded (format version 1)"
                                                       : "none (a model of variables only)");
  }
  if (c.builtin[0])
    printf("builtin      %s%s%s\n", c.builtin, c.builtin_hidden[0] ? " --hidden " : "",
           c.builtin_hidden);
  if (c.has_norm)
    printf("normalize    (b / %g - %g) / %g\n", (double)c.norm.divide, (double)c.norm.mean,
           (double)c.norm.std);
  printf("layout       %016" PRIx64 " (%d shards)\n", c.layout_hash, c.nshards);
  printf("optimizer    %s lr %g momentum %g weight_decay %g beta1 %g beta2 %g eps %g "
         "initial_accumulator %g\n", ps_optim_name(o), (double)o->lr, (double)o->momentum,
         (double)o->weight_decay, (double)o->beta1, (double)o->beta2, (double)o->eps,
         (double)o->initial_accumulator);
  printf("consistency  %s\n", consistency_names[c.consistency]);
  printf("filter       %s\n", ps_ckpt_filter_name(c.filter));
  printf("variables    %d, %zu floats\n", c.nvars, c.total_floats);
  for (int v = 0; v < c.nvars; v++) {
    const ps_ckpt_var *var = &c.vars[v];
    char shape[64];
    size_t w = 0;
    for (int d = 0; d < var->ndim; d++)
      w += (size_t)snprintf(shape + w, sizeof shape - w, "%s%" PRIu32, d ? "x" : "",
                            var->shape[d]);
    printf("  %-20s float32[%s] offset %zu, %d part%s:", var->name, shape, var->offset,
           var->nparts, var->nparts == 1 ? "" : "s");
    for (int k = 0; k < var->nparts; k++)
      printf(" %zu+%zu@%d:%zu", var->parts[k].start, var->parts[k].count, var->parts[k].shard,
             var->parts[k].shard_off);
    printf("\n");
  }
  printf("shards\n");
  for (int i = 0; i < c.nshards; i++) {
    const ps_ckpt_shard *s = &c.shards[i];
    const ps_state_info *in = &s->info;
    printf("  %-12s version %" PRIu64 ", global step %" PRIu64 ", %zu floats, %" PRIu32 " slot%s, "
           "accum %s, %s stored of %s (%.3f), xxh64 %016" PRIx64 "\n",
           s->file, in->version, in->global_step, s->floats, in->nslots,
           in->nslots == 1 ? "" : "s", in->has_accum ? "yes" : "no",
           ps_cmd_human_bytes(s->compressed_size, b1, sizeof b1),
           ps_cmd_human_bytes(s->uncompressed_size, b2, sizeof b2),
           (double)s->compressed_size / (double)s->uncompressed_size, s->xxh64);
    if (c.base[0])
      printf("    delta: %s of table entries on state %016" PRIx64 " of %s; state %016" PRIx64
             "\n", ps_cmd_human_bytes(s->delta_floats * 4, b1, sizeof b1), s->base_xxh64, c.base,
             s->state_xxh64);
    if (in->has_accum || c.consistency == PS_CONSISTENCY_SYNC)
      printf("    sync: %" PRIu32 " gradients summed, %" PRIu32 " complete a step\n",
             in->accum_count, in->target);
    for (uint32_t w = 0; w < in->nonce; w++)
      printf("    worker %" PRIu32 ": incarnation %" PRIu64 ", last sequence %" PRIu64 "\n", w,
             s->once[w].incarnation, s->once[w].last_seq);
  }
  printf("workers      %d\n", c.nworkers);
  for (int w = 0; w < c.nworkers; w++)
    printf("  worker %d: epoch %" PRIu64 ", offset %" PRIu64 "\n", w, c.data_pos[w].epoch,
           c.data_pos[w].offset);
  ps_ckpt_close(&c);
  return 0;
}

/* @return 0 when the checkpoint at `path` verifies; prints one line either way. */
static int verify_one(const char *path) {
  ps_ckpt c;
  ps_errbuf eb = {0};
  ps_ckpt_tables_stats ts = {0};
  int rc = ps_ckpt_open(&c, path, &eb);
  if (rc == 0)
    rc = ps_ckpt_verify_tables(&c, &ts, &eb);
  if (rc != 0) {
    ps_cmd_error("%s", eb.msg);
  } else {
    uint64_t stored = 0, raw = 0;
    for (int i = 0; i < c.nshards; i++) {
      stored += c.shards[i].compressed_size;
      raw += c.shards[i].uncompressed_size;
    }
    char tables[128] = "";
    if (ts.ntables > 0)
      snprintf(tables, sizeof tables, ", %d sparse table%s: %" PRIu64 " rows, %" PRIu64
               " pending keys", ts.ntables, ts.ntables == 1 ? "" : "s", ts.rows, ts.pending);
    char chain[96] = "";
    if (c.base[0])
      snprintf(chain, sizeof chain, "; incremental on %s, its chain read and verified", c.base);
    printf("%s: ok (step %" PRIu64 ", %d shard file%s, %" PRIu64 " bytes, %" PRIu64
           " uncompressed%s%s)\n", path, c.step, c.nshards, c.nshards == 1 ? "" : "s", stored, raw,
           tables, chain);
  }
  ps_ckpt_close(&c);
  return rc != 0;
}

static int cmd_verify(int argc, char **argv) {
  int rc = sub_opts(argc, argv, NULL, NULL);
  if (rc != 0)
    return rc == 1 ? 0 : rc;
  if ((rc = want_args(argc, argv, 1, "CKPT")) != 0)
    return rc;
  const char *path = argv[optind];
  if (ps_cmd_has_manifest(path))
    return verify_one(path);
  ps_ckpt_entry *e = NULL;
  ps_errbuf eb = {0};
  int n = ps_ckpt_list(path, &e, &eb);
  if (n < 0) {
    ps_cmd_error("%s", eb.msg);
    return 1;
  }
  if (n == 0) {
    free(e);
    ps_cmd_error("%s: no MANIFEST.json and no ckpt-<step> directory", path);
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < n; i++) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", path, e[i].name);
    if (!e[i].on_disk) {
      ps_cmd_error("%s: listed in the index but missing", p);
      bad = 1;
      continue;
    }
    bad |= verify_one(p);
  }
  free(e);
  return bad;
}

static int cmd_export(int argc, char **argv) {
  const char *format = NULL;
  int force = 0;
  int rc = sub_opts(argc, argv, &format, &force);
  if (rc != 0)
    return rc == 1 ? 0 : rc;
  if ((rc = want_args(argc, argv, 2, "CKPT and OUT")) != 0)
    return rc;
  if (format == NULL || (strcmp(format, "safetensors") != 0 && strcmp(format, "npy") != 0)) {
    ps_cmd_error("ckpt export: --format %s%s%s: expected safetensors or npy",
                 format ? "'" : "", format ? format : "missing", format ? "'" : "");
    return 2;
  }
  ps_ckpt c;
  if (ps_cmd_open_ckpt(argv[optind], &c) != 0)
    return 1;
  ps_errbuf eb = {0};
  const char *out = argv[optind + 1];
  char note[512];
  rc = ps_ckpt_export(&c, format, out, force, note, sizeof note, &eb);
  if (rc != 0)
    ps_cmd_error("ckpt export: %s", eb.msg);
  else
    printf("exported %d variables (%zu floats) of %s to %s (%s); %s\n", c.nvars,
           c.total_floats, c.path, out, format, note);
  ps_ckpt_close(&c);
  /* A target in the way is the user's to move: 2, as bad usage. */
  return rc == 0 ? 0 : rc == -EEXIST || rc == -EISDIR || rc == -ENOTDIR ? 2 : 1;
}

static int cmd_compact(int argc, char **argv) {
  int rc = sub_opts(argc, argv, NULL, NULL);
  if (rc != 0)
    return rc == 1 ? 0 : rc;
  if ((rc = want_args(argc, argv, 1, "CKPT")) != 0)
    return rc;
  ps_ckpt c;
  if (ps_cmd_open_ckpt(argv[optind], &c) != 0)
    return 1;
  ps_errbuf eb = {0};
  ps_ckpt_write_stats st;
  rc = ps_ckpt_compact(&c, &st, &eb);
  if (rc != 0)
    ps_cmd_error("ckpt compact: %s", eb.msg);
  else
    printf("%s: compacted: a full checkpoint now (was incremental on %s), %" PRIu64
           " bytes stored, %" PRIu64 " uncompressed\n", c.path, c.base, st.stored_bytes,
           st.raw_bytes);
  ps_ckpt_close(&c);
  return rc == 0 ? 0 : rc == PS_EUSAGE ? 2 : 1;
}

int ps_cmd_ckpt(int argc, char **argv) {
  static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
  } verbs[] = {{"ls", cmd_ls}, {"show", cmd_show}, {"verify", cmd_verify}, {"export", cmd_export},
                {"compact", cmd_compact}};
  if (argc < 2) {
    ckpt_usage(stderr);
    return 2;
  }
  const char *v = argv[1];
  if (strcmp(v, "-h") == 0 || strcmp(v, "--help") == 0 || strcmp(v, "help") == 0) {
    ckpt_usage(stdout);
    return 0;
  }
  /* Warnings of find_latest (a damaged checkpoint skipped) are worth seeing. */
  ps_log_init("paramserv ckpt", PS_LOG_WARN);
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
    if (strcmp(v, verbs[i].name) == 0)
      return verbs[i].run(argc - 1, argv + 1);
  ps_cmd_error("ckpt: unknown verb '%s': expected ls, show, verify, export or compact", v);
  return 2;
}
