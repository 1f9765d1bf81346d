/* The client's construction and end (include/paramserv/client.h): from a
 * config file (ps_client_new, ps_client_new_as) or from options
 * (ps_client_new_opts), the model, layout, loop and a link per shard; and
 * ps_client_free.  The calls that use it: client.c. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "common/settings.h"
#include "common/timeutil.h"
#include "worker/client_internal.h"
#include "worker/control.h"

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (uv_is_closing(h))
    return;
  /* A TCP handle belongs to its ps_conn (its data), which frees itself. */
  if (h->type == UV_TCP)
    ps_conn_close((ps_conn *)h->data);
  else
    uv_close(h, NULL);
}

void ps_client_free(ps_client *c) {
  if (c == NULL)
    return;
  if (c->links != NULL) {
    c->fatal = 1;  /* no reconnects from here on */
    uv_walk(&c->loop, close_walk, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    for (int i = 0; i < c->nlinks; i++) {
      for (int k = 0; k < PUSH_WINDOW; k++) {
        free(c->links[i].push[k].slice);
        ps_sparse_part_free(&c->links[i].push[k].part);
      }
      free(c->links[i].tail);
      ps_sparse_part_free(&c->links[i].pull_part);
    }
    free(c->links);
  }
  ps_history_close(c->history);
  ps_hashring_free(&c->ring);
  ps_layout_close(&c->layout);
  ps_model_close(&c->model);
  free(c);
}

/* The rest of a client, once c->cfg, role, index and the secret are set:
 * the model and layout, the loop and a link per shard.  @return c, or NULL
 * (c freed) with a message in eb. */
static ps_client *client_start(ps_client *c, ps_errbuf *eb) {
  if (ps_layout_for_cluster(&c->cfg, &c->model, &c->layout, eb) != 0) {
    ps_client_free(c);
    return NULL;
  }
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  c->incarnation = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
  if (uv_loop_init(&c->loop) != 0) {
    ps_err_set(eb, -ENOMEM, "cannot start an event loop");
    ps_client_free(c);
    return NULL;
  }
  uv_timer_init(&c->loop, &c->deadline);
  c->deadline.data = c;
  uv_timer_init(&c->loop, &c->wake);
  c->nlinks = c->cfg.nps;
  c->links = calloc((size_t)c->nlinks, sizeof *c->links);
  if (c->links == NULL) {
    uv_loop_close(&c->loop);
    ps_err_set(eb, -ENOMEM, "out of memory");
    ps_client_free(c);  /* no links: it leaves the loop alone */
    return NULL;
  }
  for (int i = 0; i < c->nlinks; i++) {
    link *l = &c->links[i];
    l->cl = c;
    l->index = i;
    size_t floats = c->layout.shard_floats[i] ? c->layout.shard_floats[i] : 1;
    int nomem = 0;
    for (int k = 0; k < PUSH_WINDOW; k++)
      nomem |= (l->push[k].slice = malloc(floats * sizeof(float))) == NULL;
    uv_timer_init(&c->loop, &l->retry);
    l->retry.data = l;
    ps_backoff_init(&l->backoff, BACKOFF_BASE_MS, BACKOFF_CAP_MS,
                    ps_mix64(c->incarnation ^ (uint64_t)c->index) + (uint64_t)i);
    if (nomem) {
      ps_err_set(eb, -ENOMEM, "out of memory for shard %d's slice", i);
      ps_client_free(c);
      return NULL;
    }
  }
  if (ps_hashring_init(&c->ring, c->nlinks, PS_HASHRING_VNODES) != 0) {
    ps_err_set(eb, -ENOMEM, "out of memory for the hash ring");
    ps_client_free(c);
    return NULL;
  }
  if (c->role == PS_ROLE_WORKER)
    c->history = ps_history_open(&c->cfg, "worker", c->index);
  return c;
}

ps_client *ps_client_new(const char *config_path, int worker_index, ps_errbuf *eb) {
  return ps_client_new_as(config_path, PS_ROLE_WORKER, worker_index, eb);
}

ps_client *ps_client_new_as(const char *config_path, int role, int worker_index, ps_errbuf *eb) {
  ps_client *c = calloc(1, sizeof *c);
  if (c == NULL) {
    ps_err_set(eb, -ENOMEM, "out of memory");
    return NULL;
  }
  if (ps_config_load(config_path, &c->cfg, eb) != 0)
    goto fail;
  c->role = role;
  if (role == PS_ROLE_WORKER && (worker_index < 0 || worker_index >= c->cfg.nworkers)) {
    ps_err_set(eb, PS_EUSAGE, "worker index %d: %s lists workers 0..%d", worker_index,
               config_path, c->cfg.nworkers - 1);
    goto fail;
  }
  c->index = worker_index;
  c->give_up_ms = (uint64_t)c->cfg.worker_give_up_s * 1000;
  if (c->cfg.mode == PS_MODE_RING && role != PS_ROLE_WORKER) {
    /* A ring's one "shard" is a member (src/ring/README.md, "The chief"):
     * the first until ps_client_retarget names another. */
    c->cfg.nps = 1;
    c->cfg.ps[0] = c->cfg.workers[0];
  }
  int n = ps_config_read_secret(&c->cfg, c->secret, sizeof c->secret, eb);
  if (n < 0)
    goto fail;
  c->secret_len = (size_t)n;
  return client_start(c, eb);
fail:
  free(c);
  return NULL;
}

/* Options: each string goes through its setting's own rules (the table of
 * common/settings.h), so that it means what the same text means in a
 * config file. */
static int set_text(ps_config *cfg, const char *field, const char *section, const char *key,
                    const char *value, ps_errbuf *eb) {
  size_t n;
  const ps_setting *table = ps_config_settings(&n), *s = NULL;
  for (size_t i = 0; i < n && s == NULL; i++)
    if (strcmp(table[i].section, section) == 0 && strcmp(table[i].key, key) == 0)
      s = &table[i];
  if (s == NULL)
    return ps_err_set(eb, PS_ECONFIG, "ps_client_options.%s: no setting [%s] %s", field, section,
                      key);
  char *dst = (char *)cfg + s->offset, why[256] = "";
  if (s->parse == NULL && s->type != PS_SETTING_STRING) {
    snprintf(why, sizeof why, "not a text setting");
  } else if (s->parse != NULL) {
    if (s->parse(s, value, dst, why, sizeof why) == 0)
      return 0;
  } else {
    int known = s->choices == NULL;
    for (const char *const *ch = s->choices; ch != NULL && *ch != NULL; ch++)
      known |= strcmp(*ch, value) == 0;
    size_t len = strlen(value);
    if (known && len >= (size_t)s->min && len < s->size) {
      memcpy(dst, value, len + 1);
      return 0;
    }
    snprintf(why, sizeof why, "%s",
             !known ? "not one of the choices" : len < (size_t)s->min ? "empty" : "too long");
    if (!known)
      for (const char *const *ch = s->choices; *ch != NULL; ch++)
        snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", ch == s->choices ? ": " : ", ",
                 *ch);
  }
  return ps_err_set(eb, PS_ECONFIG, "ps_client_options.%s = '%s' ([%s] %s): %s", field, value,
                    section, key, why);
}

/* The config that `o` describes, and the secret, into c.  @return 0 or a
 * code with a message naming the option. */
static int options_config(ps_client *c, const ps_client_options *o, ps_errbuf *eb) {
  ps_config *cfg = &c->cfg;
  ps_config_defaults(cfg);
  snprintf(cfg->path, sizeof cfg->path, "ps_client_options");
  if (o->cluster_id == NULL)
    return ps_err_set(eb, PS_ECONFIG, "ps_client_options.cluster_id: required ([cluster] id)");
  int rc = set_text(cfg, "cluster_id", "cluster", "id", o->cluster_id, eb);
  if (rc != 0)
    return rc;
  if (o->shards == NULL || o->nshards < 1 || o->nshards > PS_CONFIG_MAX_NODES)
    return ps_err_set(eb, PS_ECONFIG, "ps_client_options.nshards = %d: expected 1 to %d shards",
                      o->shards == NULL ? 0 : o->nshards, PS_CONFIG_MAX_NODES);
  for (int i = 0; i < o->nshards; i++)
    if (o->shards[i] == NULL || ps_addr_parse(o->shards[i], &cfg->ps[i]) != 0)
      return ps_err_set(eb, PS_ECONFIG,
                        "ps_client_options.shards[%d] = '%s': expected host:port ([v6]:port)", i,
                        o->shards[i] ? o->shards[i] : "(null)");
  cfg->nps = o->nshards;
  if (o->worker < 0)
    return ps_err_set(eb, PS_EUSAGE, "ps_client_options.worker = %d: expected an index from 0",
                      o->worker);
  c->index = o->worker;
  static const struct {
    const char *field, *section, *key;
    size_t offset;
  } texts[] = {
      {"model", "model", "name", offsetof(ps_client_options, model)},
      {"hidden", "model", "hidden", offsetof(ps_client_options, hidden)},
      {"model_file", "model", "file", offsetof(ps_client_options, model_file)},
      {"variables_file", "model", "variables", offsetof(ps_client_options, variables_file)},
      {"layout_strategy", "layout", "strategy", offsetof(ps_client_options, layout_strategy)},
      {"layout_split_bytes", "layout", "split_bytes",
       offsetof(ps_client_options, layout_split_bytes)},
  };
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    const char *v = *(const char *const *)((const char *)o + texts[i].offset);
    if (v != NULL && (rc = set_text(cfg, texts[i].field, texts[i].section, texts[i].key, v, eb)))
      return rc;
  }
  if (o->peer_timeout_ms != 0) {
    if (o->peer_timeout_ms < 1000 || o->peer_timeout_ms > 3600000)
      return ps_err_set(eb, PS_ECONFIG, "ps_client_options.peer_timeout_ms = %" PRIu64
                        ": expected 1000 to 3600000 ([cluster] peer_timeout_ms)", o->peer_timeout_ms);
    cfg->peer_timeout_ms = (int64_t)o->peer_timeout_ms;
  }
  c->give_up_ms = o->give_up_ms;
  cfg->last_step = o->last_step > INT64_MAX ? INT64_MAX : (int64_t)o->last_step;
  if ((o->secret != NULL) == (o->secret_file != NULL))
    return ps_err_set(eb, PS_ECONFIG, "ps_client_options: expected the cluster secret in secret "
                      "(and secret_len) or in secret_file, not %s", o->secret ? "both" : "neither");
  if (o->secret_file != NULL) {
    if ((rc = set_text(cfg, "secret_file", "cluster", "secret_file", o->secret_file, eb)) != 0)
      return rc;
    int n = ps_config_read_secret(cfg, c->secret, sizeof c->secret, eb);
    if (n < 0)
      return n;
    c->secret_len = (size_t)n;
    return 0;
  }
  if (o->secret_len < 16 || o->secret_len > sizeof c->secret)
    return ps_err_set(eb, PS_ECONFIG, "ps_client_options.secret_len = %zu: expected 16 to %zu bytes",
                      o->secret_len, sizeof c->secret);
  memcpy(c->secret, o->secret, o->secret_len);
  c->secret_len = o->secret_len;
  return 0;
}

/* The size of the first ps_client_options, the least a caller may pass. */
#define OPTIONS_MIN_SIZE (offsetof(ps_client_options, last_step) + sizeof(uint64_t))

ps_client *ps_client_new_opts(const ps_client_options *opts, ps_errbuf *eb) {
  if (opts == NULL || opts->size < OPTIONS_MIN_SIZE) {
    ps_err_set(eb, PS_EUSAGE, "ps_client_options: size %zu: expected sizeof (ps_client_options) "
               "(start from PS_CLIENT_OPTIONS_INIT)", opts ? opts->size : 0);
    return NULL;
  }
  /* Fields past the caller's size (a program built with an older header)
   * keep their defaults. */
  ps_client_options o = PS_CLIENT_OPTIONS_INIT;
  memcpy(&o, opts, opts->size < sizeof o ? opts->size : sizeof o);
  ps_client *c = calloc(1, sizeof *c);
  if (c == NULL) {
    ps_err_set(eb, -ENOMEM, "out of memory");
    return NULL;
  }
  c->role = PS_ROLE_WORKER;
  if (options_config(c, &o, eb) != 0) {
    free(c);
    return NULL;
  }
  return client_start(c, eb);
}

#define STR_(x) #x
#define STR(x) STR_(x)

const char *ps_version(int *major, int *minor, int *patch) {
  if (major != NULL)
    *major = PARAMSERV_VERSION_MAJOR;
  if (minor != NULL)
    *minor = PARAMSERV_VERSION_MINOR;
  if (patch != NULL)
    *patch = PARAMSERV_VERSION_PATCH;
  return STR(PARAMSERV_VERSION_MAJOR) "." STR(PARAMSERV_VERSION_MINOR) "." STR(
      PARAMSERV_VERSION_PATCH);
}
