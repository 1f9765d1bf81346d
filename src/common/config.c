/* The cluster configuration: the table of settings (settings.c) drives parsing
 * (libinih), defaults and help. */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/parse.h"
#include "common/settings.h"

#define SECRET_MIN 16
#define CONFIG_MAX_BYTES (1 << 20)
#define ADDR_FORM "host:port (port 1-65535, IPv6 as [::1]:port)"

/* ------------------------------------------------------------------------ */
/* Values                                                                    */
/* ------------------------------------------------------------------------ */

static int choice_index(const char *const *choices, const char *v) {
  for (int i = 0; choices[i] != NULL; i++)
    if (strcmp(choices[i], v) == 0)
      return i;
  return -1;
}

/* "a, b, c" into buf. */
static void join(const char *const *list, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; list[i] != NULL && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s%s", i > 0 ? ", " : "", list[i]);
}

/* Values are echoed in one-line messages: a control byte becomes '?' and a
 * long value is cut, so a hostile file cannot forge or flood log lines. */
static const char *show(const char *v, char *buf, size_t len) {
  size_t n = 0, max = len > 4 ? len - 4 : 0;
  if (*v == '\0')
    return "\"\"";
  for (; v[n] != '\0' && n < max; n++)
    buf[n] = isprint((unsigned char)v[n]) ? v[n] : '?';
  if (v[n] != '\0' && len >= 4) {
    memcpy(buf + n, "...", 3);
    n += 3;
  }
  buf[n] = '\0';
  return buf;
}

/* The expected form of a setting's value, for messages. */
static void describe(const ps_setting *s, char *buf, size_t len) {
  char list[160];
  if (s->choices != NULL) {
    join(s->choices, list, sizeof list);
    snprintf(buf, len, "one of %s", list);
    return;
  }
  switch (s->type) {
  case PS_SETTING_STRING:
    if (s->min > 0)
      snprintf(buf, len, "%.0f to %zu characters", s->min, s->size - 1);
    else
      snprintf(buf, len, "at most %zu characters", s->size - 1);
    break;
  case PS_SETTING_INT:
    snprintf(buf, len, "an integer in [%lld, %lld]", (long long)s->min, (long long)s->max);
    break;
  case PS_SETTING_DOUBLE:
    snprintf(buf, len, "a number in [%.15g, %.15g]", s->min, s->max);
    break;
  case PS_SETTING_BOOL:
    snprintf(buf, len, "yes or no");
    break;
  case PS_SETTING_ENUM: /* described by its choices, above */
    break;
  case PS_SETTING_ADDR:
    snprintf(buf, len, ADDR_FORM);
    break;
  case PS_SETTING_ADDR_LIST:
    snprintf(buf, len, "host:port, host:port, ... (%.0f to %.0f addresses)", s->min, s->max);
    break;
  }
}

/* Appends the comma-separated addresses of v to the list: a list may span
 * several lines, and a trailing comma lets a line say that more follows. */
static int append_addrs(const ps_setting *s, const char *v, ps_config *c, char *why,
                        size_t len) {
  ps_addr *list = (ps_addr *)((char *)c + s->offset);
  int *count = (int *)((char *)c + s->count_offset);
  size_t cap = s->size / sizeof(ps_addr);
  char entry[300], shown[64];
  if (s->max < (double)cap)
    cap = (size_t)s->max;
  for (const char *p = v; *p != '\0';) {
    const char *comma = strchr(p, ',');
    const char *b = p, *e = comma != NULL ? comma : p + strlen(p);
    p = comma != NULL ? comma + 1 : e;
    while (b < e && isspace((unsigned char)*b))
      b++;
    while (e > b && isspace((unsigned char)e[-1]))
      e--;
    if (b == e && comma == NULL)
      break;
    if ((size_t)*count >= cap) {
      snprintf(why, len, "at most %zu addresses", cap);
      return PS_ECONFIG;
    }
    int n = snprintf(entry, sizeof entry, "%.*s", (int)(e - b), b);
    if (n > 0 && (size_t)n < sizeof entry && ps_addr_parse(entry, &list[*count]) == 0) {
      (*count)++;
      continue;
    }
    snprintf(why, len, ADDR_FORM " for each address, not %s", show(entry, shown, sizeof shown));
    return PS_ECONFIG;
  }
  return 0;
}

/* Parses v into the setting's field; on failure writes the expected form. */
static int set_value(const ps_setting *s, const char *v, ps_config *c, char *why, size_t len) {
  char *field = (char *)c + s->offset;
  size_t n = strlen(v);
  int k;
  if (s->parse != NULL)
    return s->parse(s, v, field, why, len);
  switch (s->type) {
  case PS_SETTING_STRING:
    if (n >= (size_t)s->min && n < s->size &&
        (s->choices == NULL || choice_index(s->choices, v) >= 0)) {
      memcpy(field, v, n + 1);
      return 0;
    }
    break;
  case PS_SETTING_INT: /* the parsers store only on success */
    if (ps_parse_i64(v, (int64_t)s->min, (int64_t)s->max, (int64_t *)field) == 0)
      return 0;
    break;
  case PS_SETTING_DOUBLE:
    if (ps_parse_double(v, s->min, s->max, (double *)field) == 0)
      return 0;
    break;
  case PS_SETTING_BOOL: {
    static const char *const words[] = {"no", "yes", "false", "true", "off", "on", "0", "1", NULL};
    if ((k = choice_index(words, v)) >= 0) {
      *(int *)field = k % 2;
      return 0;
    }
    break;
  }
  case PS_SETTING_ENUM:
    if ((k = choice_index(s->choices, v)) >= 0) {
      *(int *)field = k;
      return 0;
    }
    break;
  case PS_SETTING_ADDR:
    if (ps_addr_parse(v, (ps_addr *)field) == 0)
      return 0;
    break;
  case PS_SETTING_ADDR_LIST:
    return append_addrs(s, v, c, why, len);
  }
  describe(s, why, len);
  return PS_ECONFIG;
}

void ps_config_defaults(ps_config *c) {
  char why[256];
  memset(c, 0, sizeof *c);
  /* The table's defaults are valid by construction (the unit test loads
   * each), so there is no error to report here. */
  for (size_t i = 0; i < ps_nsettings; i++)
    if (ps_settings[i].def != NULL)
      (void)set_value(&ps_settings[i], ps_settings[i].def, c, why, sizeof why);
}

/* ------------------------------------------------------------------------ */
/* Parsing: libinih splits the lines, we feed them and keep the line count   */
/* ------------------------------------------------------------------------ */

/* Debian's libinih is built without INI_HANDLER_LINENO, so the handler is
 * not told the line.  We hand inih one line per reader call and count them;
 * inih calls the handler for a line before it asks for the next one. */
typedef struct parse_state {
  const char *name;        /* for messages */
  const char *next;        /* the text not yet handed to inih */
  const char *line;        /* the line inih is working on, and its length */
  size_t line_len;
  int lineno;
  int prev;                /* setting of the last key line; -1 after a [section] */
  int nkeys;
  int err, err_line;       /* the first error, which stops the parse */
  int line_of[PS_SETTINGS_MAX];  /* where each setting was given; 0 = not given */
  ps_config *c;
  ps_errbuf *eb;
} parse_state;

__attribute__((format(printf, 3, 4))) static int fail(parse_state *st, int line,
                                                      const char *fmt, ...) {
  char msg[448];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  st->err = PS_ECONFIG;
  st->err_line = line;
  if (line > 0)
    return ps_err_set(st->eb, PS_ECONFIG, "%s:%d: %s", st->name, line, msg);
  return ps_err_set(st->eb, PS_ECONFIG, "%s: %s", st->name, msg);
}

static int find_setting(const char *section, const char *key) {
  for (size_t i = 0; i < ps_nsettings; i++)
    if (strcmp(ps_settings[i].section, section) == 0 && strcmp(ps_settings[i].key, key) == 0)
      return (int)i;
  return -1;
}

/* The name of an ENUM setting's value. */
static const char *choice_name(const char *section, const char *key, int index) {
  return ps_settings[find_setting(section, key)].choices[index];
}

/* The table's sections, or one section's keys, as "a, b, c". */
static void list_names(const char *section, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < ps_nsettings && at < len; i++) {
    const char *name;
    if (section == NULL && (i == 0 || strcmp(ps_settings[i - 1].section, ps_settings[i].section) != 0))
      name = ps_settings[i].section;
    else if (section != NULL && strcmp(ps_settings[i].section, section) == 0)
      name = ps_settings[i].key;
    else
      continue;
    at += (size_t)snprintf(buf + at, len - at, "%s%s", at > 0 ? ", " : "", name);
  }
}

static int is_indented(const parse_state *st) {
  return st->line_len > 0 && isspace((unsigned char)st->line[0]);
}

/* inih never calls the handler for a [section] line, so an unknown section
 * with no keys would pass unseen, and one with keys would be reported at a
 * key's line: the reader looks at section lines itself.  As in inih, an
 * indented line after a key continues that key's value (not a section), and
 * a line without ']' is left to inih to report. */
static void check_section_line(parse_state *st) {
  const char *p = st->line, *end = st->line + st->line_len;
  if (st->lineno == 1 && st->line_len >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0)
    p += 3;
  if (is_indented(st) && st->prev >= 0)
    return;
  while (p < end && isspace((unsigned char)*p))
    p++;
  if (p == end || *p != '[')
    return;
  const char *name = ++p;
  while (p < end && *p != ']')
    p++;
  if (p == end)
    return;
  size_t n = (size_t)(p - name);
  st->prev = -1;
  for (size_t i = 0; i < ps_nsettings; i++)
    if (strlen(ps_settings[i].section) == n && memcmp(ps_settings[i].section, name, n) == 0)
      return;
  char shown[64], raw[64], sections[160];
  snprintf(raw, sizeof raw, "%.*s", (int)n, name);
  list_names(NULL, sections, sizeof sections);
  fail(st, st->lineno, "unknown section [%s]: expected one of %s", show(raw, shown, sizeof shown),
       sections);
}

/* inih's reader: the next line, without cutting it (a line longer than
 * inih's buffer is an error here, since inih would split it silently), or
 * NULL at the end and after the first error. */
static char *next_line(char *buf, int num, void *stream) {
  parse_state *st = stream;
  if (st->err != 0 || *st->next == '\0')
    return NULL;
  size_t n = strcspn(st->next, "\n");
  st->line = st->next;
  st->line_len = n;
  st->lineno++;
  st->next += n + (st->next[n] == '\n');
  /* Room for the line, its newline and the NUL: inih takes a full buffer
   * without a newline for a cut line. */
  if (num < 3 || n > (size_t)num - 2) {
    fail(st, st->lineno,
         "line is %zu characters long: expected at most %d (a list continues on indented lines)",
         n, num - 2);
    return NULL;
  }
  check_section_line(st);
  if (st->err != 0)
    return NULL;
  memcpy(buf, st->line, n);
  buf[n] = '\n';
  buf[n + 1] = '\0';
  return buf;
}

static int on_value(void *user, const char *section, const char *key, const char *value) {
  parse_state *st = user;
  char why[256], shown[96], keys[400], name[64];
  if (st->err != 0)
    return 0;
  st->nkeys++;
  /* inih hands an indented line after a key to the handler as more of that
   * key's value; only address lists may take more. */
  int cont = is_indented(st) && st->prev >= 0 && strcmp(ps_settings[st->prev].key, key) == 0;
  if (section[0] == '\0')
    return !fail(st, st->lineno, "%s = %s before any [section]: expected a [section] line first",
                 show(key, name, sizeof name), show(value, shown, sizeof shown));
  int i = cont ? st->prev : find_setting(section, key);
  if (i < 0) {
    list_names(section, keys, sizeof keys);
    return !fail(st, st->lineno, "unknown key [%s] %s: expected one of %s", section,
                 show(key, name, sizeof name), keys);
  }
  const ps_setting *s = &ps_settings[i];
  if (cont && s->type != PS_SETTING_ADDR_LIST)
    return !fail(st, st->lineno,
                 "[%s] %s: indented line %s continues a value: expected one line per value "
                 "(only address lists continue)",
                 section, key, show(value, shown, sizeof shown));
  if (!cont && st->line_of[i] != 0)
    return !fail(st, st->lineno, "[%s] %s = %s: expected each key once (first given on line %d)",
                 section, key, show(value, shown, sizeof shown), st->line_of[i]);
  if (!cont) {
    st->line_of[i] = st->lineno;
    if (s->type == PS_SETTING_ADDR_LIST)
      *(int *)((char *)st->c + s->count_offset) = 0;
  }
  st->prev = i;
  /* inih up to r55 keeps an inline comment on a continuation line (later
   * releases strip it as on a key line): drop it the same way. */
  char tail[256];
  if (cont && strlen(value) < sizeof tail) {
    value = strcpy(tail, value);
    for (char *p = tail + 1; (p = strchr(p, ';')) != NULL; p++)
      if (isspace((unsigned char)p[-1])) {
        *p = '\0';
        break;
      }
  }
  if (set_value(s, value, st->c, why, sizeof why) != 0)
    return !fail(st, st->lineno, "[%s] %s = %s: expected %s", section, key,
                 show(value, shown, sizeof shown), why);
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Checks after parsing                                                      */
/* ------------------------------------------------------------------------ */

static int addr_equal(const ps_addr *a, const ps_addr *b) {
  return a->port == b->port && strcasecmp(a->host, b->host) == 0;
}

/* Required settings, list lengths, lists without repeats: for every setting
 * of the table by its type. */
static int check_settings(parse_state *st) {
  char form[256], a[300];
  for (size_t i = 0; i < ps_nsettings; i++) {
    const ps_setting *s = &ps_settings[i];
    describe(s, form, sizeof form);
    /* A ring has no shards (src/ring/README.md). */
    int ring_ps = st->c->mode == PS_MODE_RING && strcmp(s->key, "ps") == 0;
    if (s->def == NULL && st->line_of[i] == 0 && !ring_ps)
      return fail(st, 0, "[%s] %s is required: expected %s", s->section, s->key, form);
    if (s->type != PS_SETTING_ADDR_LIST || st->line_of[i] == 0)
      continue;
    const ps_addr *list = (const ps_addr *)((const char *)st->c + s->offset);
    int n = *(const int *)((const char *)st->c + s->count_offset);
    if (n < s->min)
      return fail(st, st->line_of[i], "[%s] %s has %d addresses: expected %s", s->section, s->key,
                  n, form);
    for (int j = 0; j < n; j++)
      for (int k = j + 1; k < n; k++)
        if (addr_equal(&list[j], &list[k]))
          return fail(st, st->line_of[i],
                      "[%s] %s lists %s twice (entries %d and %d): expected distinct addresses",
                      s->section, s->key, ps_addr_format(&list[j], a, sizeof a), j + 1, k + 1);
  }
  return 0;
}

/* Rules that tie one setting to another. */
static int check_cross(parse_state *st) {
  const ps_config *c = st->c;
  char a[300];
  int mode_line = st->line_of[find_setting("cluster", "mode")];
  if (c->mode == PS_MODE_RING && c->algorithm != PS_ALGO_GRADIENTS)
    return fail(st, mode_line, "[cluster] mode = ring with algorithm = %s: expected algorithm = "
                "gradients (the ring sums every member's gradient each step)",
                choice_name("train", "algorithm", c->algorithm));
  if (c->mode == PS_MODE_RING && (c->window > 1 || c->adag))
    return fail(st, mode_line, "[cluster] mode = ring with window = %lld%s: expected window = 1 "
                "(the ring sums every member's gradient each step)", (long long)c->window,
                c->adag ? " and adag" : "");
  int name_line = st->line_of[find_setting("model", "name")];
  int file_line = c->model_file[0] ? st->line_of[find_setting("model", "file")] : 0;
  int vars_line = c->variables_file[0] ? st->line_of[find_setting("model", "variables")] : 0;
  if ((name_line > 0) + (file_line > 0) + (vars_line > 0) > 1)
    return fail(st, name_line > 0 && file_line > 0 ? file_line : vars_line,
                "[model] %s and %s both set: expected one of name, file, variables",
                name_line > 0 ? "name" : "file", vars_line > 0 ? "variables" : "file");
  if (c->data_format == PS_DATA_CRITEO && c->train_data[0] == '\0')
    return fail(st, st->line_of[find_setting("data", "format")],
                "[data] format = criteo without [data] train: expected the training file");
  if (c->data_format == PS_DATA_NPY && c->train_data[0] == '\0')
    return fail(st, st->line_of[find_setting("data", "format")],
                "[data] format = npy without [data] train: expected the directory of X.npy and "
                "y.npy (src/data/NPY.md)");
  if (c->data_format == PS_DATA_CRITEO && c->mode == PS_MODE_RING)
    return fail(st, mode_line, "[cluster] mode = ring with [data] format = criteo: expected mode "
                "= ps (sparse tables live on the shards)");
  if (c->mode == PS_MODE_RING && vars_line > 0)
    return fail(st, vars_line, "[model] variables with [cluster] mode = ring: expected a model "
                "with layers (ring members compute the gradient themselves)");
  if (c->nsentinels > 0 && c->ncluster > 0)
    return fail(st, st->line_of[find_setting("redis", "cluster")],
                "[redis] cluster with sentinels both set: expected one of them (a Redis Cluster "
                "fails over by itself)");
  for (int j = 0; j < c->nps; j++) {
    if (addr_equal(&c->chief, &c->ps[j])) {
      int line = st->line_of[find_setting("cluster", "chief")];
      return fail(st, line > 0 ? line : st->line_of[find_setting("cluster", "ps")],
                  "[cluster] chief = %s is also ps %d's address: expected distinct listening "
                  "addresses",
                  ps_addr_format(&c->chief, a, sizeof a), j);
    }
  }
  if (c->replicas_to_aggregate > c->nworkers)
    return fail(st, st->line_of[find_setting("train", "replicas_to_aggregate")],
                "[train] replicas_to_aggregate = %lld: expected at most the number of workers (%d)",
                (long long)c->replicas_to_aggregate, c->nworkers);
  if (c->algorithm == PS_ALGO_AVERAGING && c->consistency != PS_CONSISTENCY_SYNC)
    return fail(st, st->line_of[find_setting("train", "algorithm")],
                "[train] algorithm = averaging with consistency = %s: expected consistency = "
                "sync (averaging is per round of every live worker)",
                choice_name("train", "consistency", c->consistency));
  if (c->algorithm != PS_ALGO_GRADIENTS && c->adag)
    return fail(st, st->line_of[find_setting("train", "adag")],
                "[train] adag = yes with algorithm = %s: expected adag with algorithm = "
                "gradients (it divides a summed gradient)", choice_name("train", "algorithm", c->algorithm));
  int sched_line = st->line_of[find_setting("train", "schedule")];
  if (strcmp(c->schedule, "step") == 0 && c->decay_steps == 0)
    return fail(st, sched_line, "[train] schedule = step with decay_steps = 0: expected "
                "decay_steps, the global steps between decays of the learning rate");
  if (strcmp(c->schedule, "cosine") == 0 && c->last_step == 0)
    return fail(st, sched_line, "[train] schedule = cosine with last_step = 0: expected a "
                "last_step, the global step where the cosine reaches 0");
  /* Every process listens at the base port plus its slot (metrics.h). */
  int last_slot = c->nps + c->nworkers;
  if (c->metrics_listen.port != 0 && c->metrics_listen.port + last_slot > 65535)
    return fail(st, st->line_of[find_setting("metrics", "listen")],
                "[metrics] listen = %s: expected a port of at most %d (each of the %d processes "
                "listens at the port plus its slot)",
                ps_addr_format(&c->metrics_listen, a, sizeof a), 65535 - last_slot, last_slot + 1);
  /* staleness only matters under ssp; a value left from another mode is
   * harmless, so it is not an error. */
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */
/* ------------------------------------------------------------------------ */

static int syntax_error(parse_state *st, const char *text, int line) {
  char raw[128], shown[96];
  for (int l = 1; l < line && *text != '\0'; l++)
    text += strcspn(text, "\n") + (text[strcspn(text, "\n")] == '\n');
  snprintf(raw, sizeof raw, "%.*s", (int)strcspn(text, "\n"), text);
  return fail(st, line, "cannot parse \"%s\": expected [section], key = value, or a # comment",
              show(raw, shown, sizeof shown));
}

int ps_config_parse(const char *name, const char *text, ps_config *c, ps_errbuf *eb) {
  if (name == NULL)
    name = "config";
  ps_config_defaults(c);
  size_t n = strlen(name);
  if (n >= sizeof c->path)
    return ps_err_set(eb, PS_ECONFIG, "config path of %zu bytes: expected at most %zu", n,
                      sizeof c->path - 1);
  memcpy(c->path, name, n + 1);

  parse_state st = {.name = name, .next = text, .prev = -1, .c = c, .eb = eb};
  int r = ini_parse_stream(next_line, &st, on_value, &st);
  if (r == -2)
    return ps_err_set(eb, -ENOMEM, "%s: out of memory", name);
  /* inih does not stop at a syntax error, but we stop at our first error:
   * whichever came first is the one to report. */
  if (r > 0 && (st.err == 0 || r < st.err_line))
    return syntax_error(&st, text, r);
  if (st.err != 0)
    return st.err;
  if (st.nkeys == 0)
    return fail(&st, 0, "no settings found: expected at least [cluster] ps and workers");
  int rc = check_settings(&st);
  return rc != 0 ? rc : check_cross(&st);
}

int ps_config_load(const char *path, ps_config *c, ps_errbuf *eb) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    int e = errno;
    return ps_err_set(eb, -e, "%s: cannot open: %s", path, strerror(e));
  }
  /* One byte more than the limit tells a file over it; one more for the NUL. */
  char *text = malloc(CONFIG_MAX_BYTES + 2);
  size_t len = 0;
  errno = 0;
  if (text != NULL) {
    len = fread(text, 1, CONFIG_MAX_BYTES + 1, f);
    text[len] = '\0';
  }
  int rc = 0, e = errno != 0 ? errno : EIO;
  if (text == NULL)
    rc = ps_err_set(eb, -ENOMEM, "%s: out of memory", path);
  else if (ferror(f))
    rc = ps_err_set(eb, -e, "%s: cannot read: %s", path, strerror(e));
  else if (len > CONFIG_MAX_BYTES)
    rc = ps_err_set(eb, PS_ECONFIG, "%s: more than %d bytes: expected a small text file", path,
                    CONFIG_MAX_BYTES);
  else if (strlen(text) < len)
    rc = ps_err_set(eb, PS_ECONFIG, "%s: NUL byte at offset %zu: expected a text file", path,
                    strlen(text));
  fclose(f);
  if (rc == 0)
    rc = ps_config_parse(path, text, c, eb);
  free(text);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The secret and addresses                                                  */
/* ------------------------------------------------------------------------ */

/* Read a private file named in the config (relative paths: to the
 * config's directory): a regular file no one but its owner may read, at
 * least `min` bytes, one trailing newline stripped.  `what` names it in
 * messages.  @return its length or a negative code. */
const char *ps_config_file_path(const ps_config *c, const char *file, char *buf, size_t len) {
  const char *slash = strrchr(c->path, '/');
  if (file[0] == '/' || slash == NULL)
    snprintf(buf, len, "%s", file);
  else
    snprintf(buf, len, "%.*s/%s", (int)(slash - c->path), c->path, file);
  return buf;
}

static int read_private(const ps_config *c, const char *what, const char *file, size_t min,
                        uint8_t *buf, size_t cap, ps_errbuf *eb) {
  char path[2 * PS_CONFIG_PATH_MAX], more[2];
  ps_config_file_path(c, file, path, sizeof path);
  cap = cap > INT_MAX ? INT_MAX : cap;

  struct stat sb;
  size_t n = 0, extra = 0;
  int rc = 0;
  FILE *f = fopen(path, "rbe"); /* e: close on exec */
  if (f == NULL || fstat(fileno(f), &sb) != 0) {
    int e = errno;
    rc = ps_err_set(eb, -e, "%s %s: cannot open: %s", what, path, strerror(e));
  } else if (!S_ISREG(sb.st_mode)) {
    rc = ps_err_set(eb, PS_ECONFIG, "%s %s: not a regular file: expected a file of %zu+ bytes",
                    what, path, min);
  } else if ((sb.st_mode & 077) != 0) {
    rc = ps_err_set(eb, PS_ECONFIG,
                    "%s %s has mode %04o: expected no access for group and others "
                    "(chmod 600 %s)",
                    what, path, (unsigned)(sb.st_mode & 07777), path);
  } else {
    errno = 0;
    n = fread(buf, 1, cap, f);
    extra = fread(more, 1, sizeof more, f);
    /* One trailing newline is what `echo > file` leaves; it is not part of
     * the secret, even when it is the byte past cap. */
    if (extra == 1 && more[0] == '\n' && n == cap)
      extra = 0;
    else if (extra == 0 && n > 0 && buf[n - 1] == '\n')
      n--;
    int e = errno != 0 ? errno : EIO;
    if (ferror(f))
      rc = ps_err_set(eb, -e, "%s %s: cannot read: %s", what, path, strerror(e));
    else if (extra > 0)
      rc = ps_err_set(eb, PS_ECONFIG, "%s %s is longer than %zu bytes: expected at most %zu",
                      what, path, cap, cap);
    else if (n < min)
      rc = ps_err_set(eb, PS_ECONFIG,
                      "%s %s is %zu bytes: expected at least %zu (e.g. "
                      "head -c 32 /dev/urandom | base64 > %s)",
                      what, path, n, min, path);
  }
  if (f != NULL)
    fclose(f);
  if (rc != 0) {
    /* Leave nothing of a refused secret behind in the caller's buffer. */
    explicit_bzero(buf, n);
    return rc;
  }
  return (int)n;
}

int ps_config_read_secret(const ps_config *c, uint8_t *buf, size_t cap, ps_errbuf *eb) {
  return read_private(c, "secret", c->secret_file, SECRET_MIN, buf, cap, eb);
}

int ps_config_read_redis_password(const ps_config *c, char *buf, size_t cap, ps_errbuf *eb) {
  buf[0] = '\0';
  if (c->redis_password_file[0] == '\0')
    return 0;
  int n = read_private(c, "[redis] password_file", c->redis_password_file, 1, (uint8_t *)buf,
                       cap - 1, eb);
  if (n < 0)
    return n;
  buf[n] = '\0';
  return n;
}
