/* The cluster config of a `paramserv local` run, derived from the user's and written as INI. */
#include "local/runconf.h"

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <ini.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/parse.h"
#include "common/settings.h"

#define SECRET_BYTES 32
#define LINE_MAX_CHARS 198 /* config.c's limit: libinih's line buffer */

/* ------------------------------------------------------------------------ */
/* Which settings the user's file gives                                      */
/* ------------------------------------------------------------------------ */

typedef struct seen {
  const ps_setting *table;
  size_t n;
  unsigned char *given; /* [n] */
} seen;

static int setting_index(const ps_setting *t, size_t n, const char *section, const char *key) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(t[i].section, section) == 0 && strcmp(t[i].key, key) == 0)
      return (int)i;
  return -1;
}

static int on_key(void *user, const char *section, const char *key, const char *value) {
  seen *s = user;
  (void)value;
  int i = setting_index(s->table, s->n, section, key);
  if (i >= 0)
    s->given[i] = 1;
  return 1; /* errors are ps_config_parse's to report */
}

static int given(const seen *s, const char *section, const char *key) {
  int i = setting_index(s->table, s->n, section, key);
  return i >= 0 && s->given[i];
}

/* ------------------------------------------------------------------------ */
/* Ports and the secret                                                      */
/* ------------------------------------------------------------------------ */

/* The lowest port the kernel hands out to outgoing connections. */
static int ephemeral_low(void) {
  int low = 32768, high;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
  if (f != NULL) {
    if (fscanf(f, "%d %d", &low, &high) != 2)
      low = 32768;
    fclose(f);
  }
  return low;
}

/* Where ports are picked: below the ephemeral range (the kernel's own
 * outgoing ports), from 10000 (or 1024 when the range starts low). */
static void port_range(int *bottom, int *top) {
  int low = ephemeral_low();
  *top = low > 2048 ? low : 65536;
  *bottom = *top == low ? (low > 12048 ? 10000 : 1024) : 10000;
}

/* A number in [0, n), n > 0. */
static int random_below(int n) {
  uint32_t r;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
    r = (uint32_t)rand();
  return (int)(r % (uint32_t)n);
}

/* Bind a socket to 127.0.0.1:port into *fd.  @return 0, 1 when the port
 * cannot be bound (taken), or -errno when there is no socket at all. */
static int bind_loopback(int port, int *fd) {
  *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (*fd < 0)
    return -errno;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(*fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(*fd);
    *fd = -1;
    return 1;
  }
  return 0;
}

int ps_runconf_free_ports(int n, uint16_t *out) {
  int bottom, top;
  port_range(&bottom, &top);
  int socks[3 * PS_CONFIG_MAX_NODES], got = 0, rc = 0;
  if (n > (int)(sizeof socks / sizeof socks[0]))
    return -EINVAL;
  /* Ports are tried at random; each stays bound until all are found, so
   * that they are distinct. */
  for (int tries = 0; got < n && tries < 20000; tries++) {
    int port = bottom + random_below(top - bottom), fd, b = bind_loopback(port, &fd);
    if (b < 0) {
      rc = b;
      break;
    }
    if (b > 0)
      continue;
    socks[got] = fd;
    out[got++] = (uint16_t)port;
  }
  for (int i = 0; i < got; i++)
    close(socks[i]);
  if (rc == 0 && got < n)
    rc = -EADDRINUSE;
  return rc;
}

/* A secret from an earlier run in the same directory is kept: a shard's
 * replica in Redis does not care, but a user who reads the run directory
 * finds one secret. */
static int ensure_secret(const char *path, ps_errbuf *eb) {
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && (sb.st_mode & 077) == 0 &&
      sb.st_size >= 16)
    return 0;
  uint8_t raw[SECRET_BYTES];
  char hex[2 * SECRET_BYTES + 2];
  if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
    return ps_err_set(eb, -errno, "secret %s: getrandom: %s", path, strerror(errno));
  for (int i = 0; i < SECRET_BYTES; i++)
    snprintf(hex + 2 * i, 3, "%02x", raw[i]);
  hex[2 * SECRET_BYTES] = '\n';
  explicit_bzero(raw, sizeof raw);
  unlink(path);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ssize_t w = fd >= 0 ? write(fd, hex, 2 * SECRET_BYTES + 1) : -1;
  int e = errno;
  explicit_bzero(hex, sizeof hex);
  if (fd < 0 || w != 2 * SECRET_BYTES + 1 || fsync(fd) != 0) {
    if (fd >= 0)
      close(fd);
    return ps_err_set(eb, -e, "secret %s: cannot write: %s", path, strerror(e));
  }
  close(fd);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Deriving the run's config                                                 */
/* ------------------------------------------------------------------------ */

static char *read_text(const char *path, ps_errbuf *eb) {
  FILE *f = fopen(path, "rbe");
  if (f == NULL) {
    ps_err_set(eb, -errno, "%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 20, len = 0;
  char *text = malloc(cap + 256);
  if (text != NULL)
    len = fread(text, 1, cap, f);
  int bad = text == NULL || ferror(f) || len == cap;
  fclose(f);
  if (bad) {
    free(text);
    ps_err_set(eb, PS_ECONFIG, "%s: cannot read it (or it is over 1 MiB)", path);
    return NULL;
  }
  text[len] = '\0';
  return text;
}

int ps_runconf_free_port_run(int n, uint16_t *base) {
  int bottom, top;
  port_range(&bottom, &top);
  int socks[3 * PS_CONFIG_MAX_NODES];
  if (n < 1 || n > (int)(sizeof socks / sizeof socks[0]) || top - bottom <= n)
    return -EINVAL;
  /* A base at random, kept when all n ports from it bind at once. */
  for (int tries = 0; tries < 2000; tries++) {
    int first = bottom + random_below(top - bottom - n), got = 0;
    while (got < n && bind_loopback(first + got, &socks[got]) == 0)
      got++;
    for (int i = 0; i < got; i++)
      close(socks[i]);
    if (got == n) {
      *base = (uint16_t)first;
      return 0;
    }
  }
  return -EADDRINUSE;
}

/* Appends "ps = 127.0.0.1:P, ..." with n placeholder ports, so that a file
 * without the list parses; the ports are replaced before use. */
static void append_placeholder(char *text, size_t cap, const char *key, int n, int base) {
  size_t at = strlen(text);
  at += (size_t)snprintf(text + at, cap - at, "\n[cluster]\n%s = ", key);
  for (int i = 0; i < n && at < cap; i++)
    at += (size_t)snprintf(text + at, cap - at, "%s127.0.0.1:%d", i ? ",\n  " : "", base + i);
  if (at < cap)
    snprintf(text + at, cap - at, "\n");
}

static int load_user(const ps_runconf_opts *o, ps_config *c, seen *s, ps_errbuf *eb) {
  int nps = o->nps > 0 ? o->nps : 2, nw = o->nworkers > 0 ? o->nworkers : 2;
  if (o->user_path == NULL) {
    ps_config_defaults(c);
    c->nps = nps;
    c->nworkers = nw;
    return 0;
  }
  if (ini_parse(o->user_path, on_key, s) == -1)
    return ps_err_set(eb, -errno, "%s: cannot open: %s", o->user_path, strerror(errno));
  char *text = read_text(o->user_path, eb);
  if (text == NULL)
    return eb->code;
  /* Room for the placeholders: 64 entries of ~20 characters each. */
  size_t len = strlen(text), cap = len + 2 * (PS_CONFIG_MAX_NODES * 24 + 64) + 64;
  char *more = realloc(text, cap);
  if (more == NULL) {
    free(text);
    return ps_err_set(eb, -ENOMEM, "out of memory");
  }
  text = more;
  if (!given(s, "cluster", "ps"))
    append_placeholder(text, cap, "ps", nps, 2);
  if (!given(s, "cluster", "workers"))
    append_placeholder(text, cap, "workers", nw, 2 + PS_CONFIG_MAX_NODES);
  /* --last-step is parsed with the file, so that the settings that need a
   * last step (schedule = cosine) find it. */
  if (o->last_step >= 0 && !given(s, "train", "last_step")) {
    size_t at = strlen(text);
    snprintf(text + at, cap - at, "\n[train]\nlast_step = %" PRId64 "\n", o->last_step);
  }
  int rc = ps_config_parse(o->user_path, text, c, eb);
  free(text);
  if (rc != 0)
    return rc;
  if (o->nps > 0)
    c->nps = o->nps;
  if (o->nworkers > 0)
    c->nworkers = o->nworkers;
  return 0;
}

/* A path of the user's file relative to the file's directory, made
 * absolute (the run's config lives elsewhere). */
static int absolute_beside(const char *config_path, const char *file, char *out, size_t len) {
  char dir[PS_CONFIG_PATH_MAX];
  if (file[0] == '/')
    return snprintf(out, len, "%s", file) < (int)len ? 0 : -ENAMETOOLONG;
  const char *slash = strrchr(config_path, '/');
  if (slash != NULL)
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - config_path), config_path);
  else
    snprintf(dir, sizeof dir, ".");
  char *real = realpath(dir, NULL);
  if (real == NULL)
    return -errno;
  int n = snprintf(out, len, "%s/%s", real, file);
  free(real);
  return n < (int)len ? 0 : -ENAMETOOLONG;
}

int ps_runconf_make(const ps_runconf_opts *o, ps_config *c, ps_errbuf *eb) {
  size_t n;
  const ps_setting *table = ps_config_settings(&n);
  unsigned char given_keys[256] = {0};
  seen s = {.table = table, .n = n, .given = given_keys};
  if (n > sizeof given_keys)
    return ps_err_set(eb, -EINVAL, "settings table larger than expected");
  int rc = load_user(o, c, &s, eb);
  if (rc != 0)
    return rc;
  if (c->mode == PS_MODE_RING)
    c->nps = 0; /* no shards: the workers all-reduce (src/ring/README.md) */

  uint16_t ports[2 * PS_CONFIG_MAX_NODES + 2];
  if ((rc = ps_runconf_free_ports(c->nps + c->nworkers + 2, ports)) != 0)
    return ps_err_set(eb, rc, "cannot find %d free ports on 127.0.0.1: %s",
                      c->nps + c->nworkers + 2, strerror(-rc));
  int k = 0;
  for (int i = 0; i < c->nps; i++)
    c->ps[i] = (ps_addr){.host = "127.0.0.1", .port = ports[k++]};
  for (int i = 0; i < c->nworkers; i++)
    c->workers[i] = (ps_addr){.host = "127.0.0.1", .port = ports[k++]};
  c->chief = (ps_addr){.host = "127.0.0.1", .port = ports[k++]};
  c->redis = (ps_addr){.host = "127.0.0.1", .port = ports[k++]};
  if (c->ncluster > 0 && c->redis_password_file[0] && o->user_path != NULL) {
    /* The file's Redis Cluster, with its user and password: no
     * redis-server of the run's own. */
    char abs[PS_CONFIG_PATH_MAX];
    if ((rc = absolute_beside(o->user_path, c->redis_password_file, abs, sizeof abs)) != 0)
      return ps_err_set(eb, rc, "%s: [redis] password_file = %s: %s", o->user_path,
                        c->redis_password_file, strerror(-rc));
    snprintf(c->redis_password_file, sizeof c->redis_password_file, "%s", abs);
  } else if (c->ncluster == 0) {
    /* The run's redis-server has no ACL user and no password. */
    c->redis_user[0] = '\0';
    c->redis_password_file[0] = '\0';
  }

  if (o->user_path != NULL && given(&s, "cluster", "secret_file")) {
    char abs[PS_CONFIG_PATH_MAX];
    if ((rc = absolute_beside(o->user_path, c->secret_file, abs, sizeof abs)) != 0)
      return ps_err_set(eb, rc, "%s: [cluster] secret_file = %s: %s", o->user_path,
                        c->secret_file, strerror(-rc));
    snprintf(c->secret_file, sizeof c->secret_file, "%s", abs);
  } else {
    char path[PS_CONFIG_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/secret", o->rundir);
    if ((rc = ensure_secret(path, eb)) != 0)
      return rc;
    /* Relative to the run's config, which lives in the same directory. */
    snprintf(c->secret_file, sizeof c->secret_file, "secret");
  }
  /* The model's and the data's paths are beside the user's file, as its
   * secret's are: made absolute, for this process's checks (which read the
   * run's config, elsewhere) as for the children. */
  struct {
    char *value;
    const char *name;
  } paths[] = {{c->model_file, "[model] file"}, {c->variables_file, "[model] variables"},
               {c->train_data, "[data] train"}, {c->test_data, "[data] test"}};
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    char abs[PS_CONFIG_PATH_MAX];
    if (o->user_path == NULL || paths[i].value[0] == '\0' || paths[i].value[0] == '/')
      continue;
    if ((rc = absolute_beside(o->user_path, paths[i].value, abs, sizeof abs)) != 0)
      return ps_err_set(eb, rc, "%s: %s = %s: %s", o->user_path, paths[i].name, paths[i].value,
                        strerror(-rc));
    /* Without its ".." and links when it exists (one that does not is
     * said by whoever opens it). */
    char *real = realpath(abs, NULL);
    snprintf(paths[i].value, PS_CONFIG_PATH_MAX, "%s", real != NULL ? real : abs);
    free(real);
  }
  if (!given(&s, "checkpoint", "dir") &&
      snprintf(c->checkpoint_dir, sizeof c->checkpoint_dir, "%s/checkpoints", o->rundir) >=
          (int)sizeof c->checkpoint_dir)
    return ps_err_set(eb, -ENAMETOOLONG, "run directory %s: path too long", o->rundir);
  if (!given(&s, "replication", "mode"))
    c->replication = PS_REPLICATION_LOG;
  c->ps_self_init = 0;
  if (!given(&s, "train", "threads")) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->threads = cores > c->nworkers ? cores / c->nworkers : 1;
  }
  /* Metrics on: every process at a port of a free run (metrics.h's slots:
   * the chief, the shards, the workers), unless the file sets listen. */
  if (!given(&s, "metrics", "listen")) {
    uint16_t base;
    int nproc = 1 + c->nps + c->nworkers;
    /* Not one of the run's other ports, which are free until used. */
    for (int tries = 0, clash = 1; clash; tries++) {
      if ((rc = tries < 100 ? ps_runconf_free_port_run(nproc, &base) : -EADDRINUSE) != 0)
        return ps_err_set(eb, rc, "cannot find %d consecutive free ports on 127.0.0.1 for "
                          "[metrics] listen: %s", nproc, strerror(-rc));
      clash = 0;
      for (int i = 0; i < k; i++)
        clash |= ports[i] >= base && ports[i] < base + nproc;
    }
    c->metrics_listen = (ps_addr){.host = "127.0.0.1", .port = base};
  }
  /* The live progress line follows the chief's progress summaries. */
  if (!given(&s, "chief", "log_every_steps"))
    c->chief_log_every = 100;
  if (o->last_step >= 0)
    c->last_step = o->last_step;
  if (o->seed >= 0)
    c->seed = o->seed;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Writing INI                                                               */
/* ------------------------------------------------------------------------ */

/* One value as the parser reads it back. */
static void format_value(const ps_setting *s, const ps_config *c, char *buf, size_t len) {
  const char *field = (const char *)c + s->offset;
  switch (s->type) {
  case PS_SETTING_STRING:
    snprintf(buf, len, "%s", field);
    break;
  case PS_SETTING_INT: {
    int64_t v = *(const int64_t *)field;
    /* split_bytes and redis_replicas spell -1 "auto", split_bytes 0
     * "never" (config.h), device is a word ("cpu", "cuda:N") and
     * bag_separator a byte (-1: none); their own parsers read them. */
    if (strcmp(s->key, "device") == 0)
      ps_device_format((int)v, buf, len);
    else if (strcmp(s->key, "bag_separator") == 0)
      snprintf(buf, len, "%s", v < 0 ? "" : (char[2]){(char)v, 0});
    else if (v < 0 && s->parse != NULL)
      snprintf(buf, len, "auto");
    else if (strcmp(s->key, "split_bytes") == 0 && v == 0)
      snprintf(buf, len, "never");
    else
      snprintf(buf, len, "%lld", (long long)v);
    break;
  }
  case PS_SETTING_DOUBLE: {
    /* The shortest form that reads back as the same double. */
    double v = *(const double *)field, back;
    for (int prec = 6; prec <= 17; prec++) {
      snprintf(buf, len, "%.*g", prec, v);
      if (ps_parse_double(buf, -1e308, 1e308, &back) == 0 && back == v)
        break;
    }
    break;
  }
  case PS_SETTING_BOOL:
    snprintf(buf, len, "%s", *(const int *)field ? "yes" : "no");
    break;
  case PS_SETTING_ENUM:
    snprintf(buf, len, "%s", s->choices[*(const int *)field]);
    break;
  case PS_SETTING_ADDR:
    /* Port 0 is an address left empty: [metrics] listen off. */
    if (((const ps_addr *)field)->port == 0)
      buf[0] = '\0';
    else
      ps_addr_format((const ps_addr *)field, buf, len);
    break;
  case PS_SETTING_ADDR_LIST:
    buf[0] = '\0'; /* printed entry by entry, see print_list */
    break;
  }
}

/* An address list, continued on indented lines past the line limit. */
static void print_list(const ps_setting *s, const ps_config *c, FILE *f) {
  const ps_addr *list = (const ps_addr *)((const char *)c + s->offset);
  int count = *(const int *)((const char *)c + s->count_offset);
  if (count == 0 && s->def == NULL)
    return; /* a required list left out: [cluster] ps in ring mode */
  size_t col = (size_t)fprintf(f, "%s =", s->key);
  for (int i = 0; i < count; i++) {
    char a[300];
    ps_addr_format(&list[i], a, sizeof a);
    /* " a," must fit; the comma that ends a line says more follows. */
    if (i > 0 && col + strlen(a) + 3 > LINE_MAX_CHARS) {
      fprintf(f, "\n   ");
      col = 3;
    }
    col += (size_t)fprintf(f, " %s%s", a, i + 1 < count ? "," : "");
  }
  fputc('\n', f);
}

void ps_runconf_print(const ps_config *c, FILE *f) {
  size_t n;
  const ps_setting *t = ps_config_settings(&n);
  char value[PS_CONFIG_PATH_MAX + 64];
  for (size_t i = 0; i < n; i++) {
    if (i == 0 || strcmp(t[i - 1].section, t[i].section) != 0)
      fprintf(f, "%s[%s]\n", i ? "\n" : "", t[i].section);
    if (t[i].type == PS_SETTING_ADDR_LIST) {
      print_list(&t[i], c, f);
      continue;
    }
    int model = strcmp(t[i].section, "model") == 0;
    int other_model = c->model_file[0] != '\0' || c->variables_file[0] != '\0';
    /* One of name, file, variables: a model file leaves out the name. */
    if (model && other_model && (strcmp(t[i].key, "name") == 0 || strcmp(t[i].key, "hidden") == 0))
      continue;
    format_value(&t[i], c, value, sizeof value);
    /* The run's config is elsewhere: a relative path is made absolute. */
    if (model && (strcmp(t[i].key, "file") == 0 || strcmp(t[i].key, "variables") == 0) &&
        value[0] != '\0' && value[0] != '/') {
      char joined[2 * PS_CONFIG_PATH_MAX], *real;
      ps_config_file_path(c, value, joined, sizeof joined);
      if ((real = realpath(joined, NULL)) != NULL) {
        snprintf(value, sizeof value, "%s", real);
        free(real);
      }
    }
    fprintf(f, "%s =%s%s\n", t[i].key, value[0] ? " " : "", value);
  }
}

static char *print_to_string(const ps_config *c) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL)
    return NULL;
  ps_runconf_print(c, f);
  fclose(f);
  return buf;
}

int ps_runconf_write(ps_config *c, const char *path, ps_errbuf *eb) {
  char tmp[PS_CONFIG_PATH_MAX + 16];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "we");
  if (f == NULL)
    return ps_err_set(eb, -errno, "%s: cannot create: %s", tmp, strerror(errno));
  fprintf(f,
          "# Written by `paramserv local`: the cluster config of this run (every setting;\n"
          "# systemd/cluster.conf describes each).  Its processes all read this file.\n\n");
  ps_runconf_print(c, f);
  int bad = fflush(f) != 0 || ferror(f);
  int e = errno;
  if (fclose(f) != 0 || bad) {
    unlink(tmp);
    return ps_err_set(eb, -e, "%s: cannot write: %s", tmp, strerror(e));
  }
  if (rename(tmp, path) != 0) {
    e = errno;
    unlink(tmp);
    return ps_err_set(eb, -e, "%s: cannot rename to %s: %s", tmp, path, strerror(e));
  }
  /* What the processes will read must say what we meant. */
  static ps_config back;
  ps_errbuf why = {0};
  int rc = ps_config_load(path, &back, &why);
  if (rc != 0)
    return ps_err_set(eb, rc, "the run's config does not read back: %s", why.msg);
  char *want = print_to_string(c), *got = print_to_string(&back);
  rc = want == NULL || got == NULL ? -ENOMEM : strcmp(want, got) != 0 ? PS_ECONFIG : 0;
  if (rc == PS_ECONFIG) {
    /* Name the first line that differs. */
    size_t i = 0;
    while (want[i] == got[i])
      i++;
    while (i > 0 && want[i - 1] != '\n')
      i--;
    ps_err_set(eb, rc, "%s: \"%.*s\" reads back as \"%.*s\": a value INI cannot carry", path,
               (int)strcspn(want + i, "\n"), want + i, (int)strcspn(got + i, "\n"), got + i);
  } else if (rc != 0) {
    ps_err_set(eb, rc, "out of memory");
  }
  free(want);
  free(got);
  if (rc == 0)
    snprintf(c->path, sizeof c->path, "%s", path);
  return rc;
}
