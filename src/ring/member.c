/* A worker in ring mode (see member.h; README.md in this directory).
 *
 * The replica is a one-shard state (ps/shard.h) holding the whole model:
 * the all-reduced gradient, divided by the view's size, is applied to it as
 * a shard applies a push, by the same optimizer code, so its bytes, its
 * version (= the global step) and its image are what a shard's would be,
 * and the chief checkpoints it as a one-shard cluster. */
#include "ring/member.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/history.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/notify.h"
#include "common/timeutil.h"
#include "data/idx.h"
#include "data/sampler.h"
#include "layout/layout.h"
#include "nn/compute.h"
#include "nn/model.h"
#include "replica/registry.h"
#include "ring/ring.h"
#include "ring/view.h"
#include "worker/trainer.h"

/* How often a member looks for a newer view between steps (a worker that
 * joins, or one that came back). */
#define VIEW_POLL_MS 200

/* A member's own return: the run ended ({<cluster>}:done in Redis) while
 * this member was out of its ring (paused or cut off through the end, or
 * restarted then). */
#define RUN_ENDED 1

/* Set by SIGTERM and SIGINT (ps_trainer_start_process). */
static volatile sig_atomic_t *stop;

typedef struct member {
  const ps_config *cfg;
  int rank;
  ps_registry *reg;
  ps_ring *ring;
  ps_shard *state;
  ps_data_pos *trained;
  ps_sampler *sampler;
  int holds;             /* the replica holds a state: seeded, fetched or loaded */
  double rate;           /* steps/s, for the heartbeat */
  ps_history *history;   /* [cluster] history_dir: each completed step */
  double view_seen;      /* when Redis last showed the current view (ps_now_s) */
  int cut_off;           /* training waits for Redis */
  uint64_t epoch;        /* the view this member is in; 0: none yet */
  uint64_t views;        /* views entered */
  uint64_t fetched;      /* states fetched from a peer */
} member;

/* The heartbeat; the data position only once the replica holds a state
 * (before, the chief may be writing a checkpoint's positions to restore). */
static void heartbeat(void *arg) {
  member *m = arg;
  ps_notify_watchdog(); /* a wait for a view or a peer is not a hang */
  ps_registry_tick(m->reg, m->holds ? m->trained : NULL, ps_shard_version(m->state), m->rate, 0);
}

/* Heartbeat and data position, and answer peers, while waiting. */
static void wait_a_little(member *m, int ms) {
  heartbeat(m);
  ps_ring_serve(m->ring, ms);
}

/* Say once when training starts waiting for Redis (`why`), and when Redis
 * answers again (why NULL). */
static void redis_wait(member *m, const char *why) {
  if (why != NULL && !m->cut_off)
    ps_log(PS_LOG_WARN, "ring: Redis %s: training waits", why);
  else if (why == NULL && m->cut_off)
    ps_log(PS_LOG_INFO, "ring: Redis answers again");
  m->cut_off = why != NULL;
}

/* This member's proposal for the view after `cur` (NULL: none yet): its
 * members, every worker whose heartbeat is in Redis, and this one, less
 * `suspect`.  A member leaves a view only on evidence (its link failed:
 * `suspect`; or it did not report in time), never because its heartbeat
 * is missing: Redis refusing writes for a while must not split the ring
 * into members that train apart. */
static int propose(member *m, const ps_view *cur, int suspect, ps_view *v) {
  int live[PS_CONFIG_MAX_NODES] = {0}, members[PS_CONFIG_MAX_NODES], n = 0;
  if (ps_view_live(m->reg, live) < 0)
    return -1;
  for (int i = 0; cur != NULL && i < cur->n; i++)
    live[cur->members[i]] = 1;
  live[m->rank] = 1;
  for (int j = 0; j < m->cfg->nworkers; j++)
    if (live[j] && j != suspect)
      members[n++] = j;
  return ps_view_propose(m->reg, cur != NULL ? cur->epoch : 0, members, n, v);
}

/* The run ended ({<cluster>}:done) while this member was out of the ring
 * (paused or cut off through the end).  Not for a member at the limit
 * (it ended with the others, whoever recorded the end first), nor one a
 * step short of it: without a chief, members that finished the last
 * all-reduce exit, which breaks it for a member still in it; that one
 * redoes the step as any interrupted step. */
static int ended_without_me(member *m) {
  uint64_t last = m->cfg->last_step > 0 ? (uint64_t)m->cfg->last_step : 0;
  if (last > 0 && ps_shard_version(m->state) + 1 >= last)
    return 0;
  return ps_registry_run_ended(m->reg);
}

/* A new cluster (no view yet): give the other workers up to
 * [cluster] peer_timeout_ms to start, so that the first view holds them
 * all rather than the first to start training alone. */
static void wait_for_everyone(member *m) {
  uint64_t deadline = ps_now_ns() + (uint64_t)m->cfg->peer_timeout_ms * 1000000ULL;
  int live[PS_CONFIG_MAX_NODES];
  while (!*stop && ps_now_ns() < deadline) {
    wait_a_little(m, 20);
    if (ps_view_live(m->reg, live) >= m->cfg->nworkers)
      return;
  }
}

/* The replica holds a state now (fetched or loaded), for the first time
 * in this process: the data position goes on from Redis, where the chief
 * wrote a checkpoint's when it restored one. */
static void became_holder(member *m) {
  m->holds = 1;
  ps_ring_set_holds(m->ring, 1, 0);
  ps_data_pos pos;
  uint64_t clock;
  if (ps_registry_load_pos(m->reg, &pos, &clock) && ps_sampler_seek(m->sampler, pos) == 0) {
    *m->trained = pos;
    ps_log(PS_LOG_INFO, "data position epoch %" PRIu64 " offset %" PRIu64 " from Redis",
           pos.epoch, pos.offset);
  }
}

/* No member of view v holds a state: wait for the chief to load this
 * member (then propose the next view, so that every member reports again
 * and the others fetch it) or for a newer view.  @return 0, -EINTR or
 * RUN_ENDED. */
static int wait_for_a_state(member *m, const ps_view *v) {
  ps_log(PS_LOG_INFO, "ring: no member of view %" PRIu64 " holds a state: waiting for the "
         "chief to load one", v->epoch);
  ps_ring_set_holds(m->ring, 0, 1);
  double next_poll = 0;
  while (!*stop) {
    wait_a_little(m, 50);
    double now = ps_now_s();
    if (now >= next_poll) {
      next_poll = now + VIEW_POLL_MS / 1000.0;
      if (ended_without_me(m))
        return RUN_ENDED;
    }
    ps_view cur;
    if (ps_ring_take_loaded(m->ring)) {
      became_holder(m);
      (void)propose(m, v, -1, &cur);
      return 0;
    }
    if (ps_view_get(m->reg, &cur) == 1 && cur.epoch > v->epoch) {
      ps_ring_set_holds(m->ring, 0, 0);
      return 0;
    }
  }
  return -EINTR;
}

/* Enter a view that holds this member, with the state of its member that
 * is furthest on, after every member reported (README.md, "Views").  A
 * run that ended meanwhile is not trained on alone.
 * @return 0, -EINTR or RUN_ENDED. */
static int change_view(member *m, int suspect, const char *why) {
  char buf[400];
  ps_log(PS_LOG_INFO, "ring: leaving view %" PRIu64 ": %s", m->epoch, why);
  for (;;) {
    if (*stop)
      return -EINTR;
    if (ended_without_me(m))
      return RUN_ENDED;
    ps_view v;
    int rc = ps_view_get(m->reg, &v);
    if (rc < 0) {
      redis_wait(m, "does not answer");
      wait_a_little(m, 100);
      continue;
    }
    redis_wait(m, NULL);
    if (rc == 0 && m->epoch == 0)
      wait_for_everyone(m);
    if (rc == 0 || v.epoch <= m->epoch) {
      /* Nobody has moved on from this member's view: propose the next. */
      if (propose(m, rc == 0 ? NULL : &v, suspect, &v) < 0) {
        wait_a_little(m, 100);
        continue;
      }
    }
    if (!ps_view_has(&v, m->rank)) {
      /* Left out (thought dead, or new): ask to be let in, blaming nobody. */
      suspect = -1;
      if (propose(m, &v, -1, &v) < 0)
        wait_a_little(m, 100);
      continue;
    }
    uint64_t mine = ps_shard_version(m->state);
    if (ps_view_report(m->reg, v.epoch, m->rank, mine, m->holds) != 0) {
      wait_a_little(m, 100);
      continue;
    }
    /* Out of the old view at once: closing its links tells the members
     * still in it (waiting for this one's pieces) to look for this view. */
    m->epoch = v.epoch;
    ps_ring_set_view(m->ring, v.epoch, v.members, v.n);
    /* Wait for every member's report; one that does not report in time is
     * left out of the next proposal. */
    uint64_t steps[PS_CONFIG_MAX_NODES];
    int holds[PS_CONFIG_MAX_NODES];
    uint64_t wait_ns = (uint64_t)ps_ring_timeout_ms(m->cfg) * 1000000ULL;
    uint64_t deadline = ps_now_ns() + wait_ns;
    int all = 0, moved = 0;
    while (!*stop) {
      ps_view cur;
      if (ps_view_get(m->reg, &cur) == 1 && cur.epoch > v.epoch) {
        moved = 1;
        break;
      }
      if (ps_view_reports(m->reg, &v, steps, holds) != 0) {
        /* Redis away: nobody could report; the wait starts over. */
        deadline = ps_now_ns() + wait_ns;
      } else {
        all = 1;
        for (int i = 0; i < v.n; i++)
          all &= steps[i] != UINT64_MAX;
        if (all)
          break;
        if (ps_now_ns() > deadline) {
          int members[PS_CONFIG_MAX_NODES], n = 0;
          for (int i = 0; i < v.n; i++)
            if (steps[i] != UINT64_MAX)
              members[n++] = v.members[i];
          ps_log(PS_LOG_WARN, "ring: view %s: %d of %d members reported in %" PRId64
                 " ms; proposing the others", ps_view_format(&v, buf, sizeof buf), n, v.n,
                 ps_ring_timeout_ms(m->cfg));
          (void)ps_view_propose(m->reg, v.epoch, members, n, &cur);
          moved = 1;
          break;
        }
      }
      wait_a_little(m, 5);
    }
    if (*stop)
      return -EINTR;
    if (moved)
      continue;
    /* The state to go on from: the member furthest on (lowest rank among
     * equals) of those that hold one.  Members at the same step hold the
     * same bytes. */
    int src = -1;
    for (int i = 0; i < v.n; i++)
      if (holds[i] && (src < 0 || steps[i] > steps[src]))
        src = i;
    if (src < 0) {
      /* None does: a new cluster with a chief, or every member restarted.
       * The chief loads one (its checkpoint or the seeded state), which
       * then proposes the next view. */
      rc = wait_for_a_state(m, &v);
      if (rc != 0)
        return rc;
      continue;
    }
    if (!m->holds || steps[src] > mine) {
      ps_errbuf eb = {0};
      rc = ps_ring_fetch_state(m->ring, v.members[src], &eb);
      if (rc == -EINTR)
        return rc;
      if (rc != 0) {
        suspect = v.members[src];
        ps_log(PS_LOG_WARN, "ring: state from member %d: %s", suspect, eb.msg);
        continue;
      }
      m->fetched++;
      ps_log(PS_LOG_INFO, "ring: fetched member %d's state at step %" PRIu64, v.members[src],
             ps_shard_version(m->state));
      if (!m->holds)
        became_holder(m);
    }
    m->views++;
    m->view_seen = ps_now_s();
    ps_log(PS_LOG_INFO, "ring: in view %s at step %" PRIu64, ps_view_format(&v, buf, sizeof buf),
           ps_shard_version(m->state));
    return 0;
  }
}

/* At the step limit with a chief: stay, as a shard does, until the chief
 * ended the run (its STOP, or the end it writes in Redis), answering its
 * last evaluation and checkpoint, and following views so that a member
 * restarted now gets the final state instead of starting alone.
 * @return 0, PS_ESTOPPED or -EINTR. */
static int wait_for_the_end(member *m) {
  double next_poll = 0;
  while (!*stop && ps_ring_stop_step(m->ring) == 0) {
    wait_a_little(m, 50);
    double now = ps_now_s();
    if (now < next_poll)
      continue;
    next_poll = now + VIEW_POLL_MS / 1000.0;
    uint64_t step;
    int nonfinite;
    if (ps_registry_get_done(m->reg, &step, &nonfinite) == 1)
      return 0;
    ps_view v;
    if (ps_view_get(m->reg, &v) == 1 && v.epoch > m->epoch && change_view(m, -1, "a newer view") != 0)
      return -EINTR;
  }
  if (*stop)
    return -EINTR;
  ps_ring_serve(m->ring, 20); /* the STOP's PONG goes out */
  return PS_ESTOPPED;
}

/* A member's series (src/common/METRICS.md), served as worker `index`'s. */
enum { R_STEPS, R_SAMPLES, R_RATE, R_GLOBAL_STEP, R_EPOCH, R_VIEWS, R_MEMBERS, R_FETCHED, R_BROKEN,
       R_REDONE, R_SENT, R_RECEIVED, R_LOSS, R_N };
static const ps_metric_def member_series[R_N] = {
    [R_STEPS] = {PS_METRIC_COUNTER, "paramserv_ring_steps_total",
                 "local steps (batches) this member computed"},
    [R_SAMPLES] = {PS_METRIC_COUNTER, "paramserv_ring_samples_total",
                   "training samples this member computed gradients on"},
    [R_RATE] = {PS_METRIC_GAUGE, "paramserv_ring_samples_per_second",
                "samples per second over the last second or so"},
    [R_GLOBAL_STEP] = {PS_METRIC_GAUGE, "paramserv_ring_global_step",
                       "the step of this member's replica"},
    [R_EPOCH] = {PS_METRIC_GAUGE, "paramserv_ring_view_epoch", "the view this member is in"},
    [R_VIEWS] = {PS_METRIC_COUNTER, "paramserv_ring_views_total", "views this member entered"},
    [R_MEMBERS] = {PS_METRIC_GAUGE, "paramserv_ring_members", "members of the current view"},
    [R_FETCHED] = {PS_METRIC_COUNTER, "paramserv_ring_fetched_states_total",
                   "states fetched from a peer"},
    [R_BROKEN] = {PS_METRIC_COUNTER, "paramserv_ring_broken_steps_total",
                  "all-reduces a peer's failure broke"},
    [R_REDONE] = {PS_METRIC_COUNTER, "paramserv_ring_redone_steps_total",
                  "all-reduces redone with a gradient already computed"},
    [R_SENT] = {PS_METRIC_COUNTER, "paramserv_ring_sent_bytes_total", "bytes sent to peers"},
    [R_RECEIVED] = {PS_METRIC_COUNTER, "paramserv_ring_received_bytes_total",
                    "bytes received from peers"},
    [R_LOSS] = {PS_METRIC_GAUGE, "paramserv_ring_loss",
                "mean training loss of the last logged interval ([train] log_every steps)"},
};

static void metrics_update(ps_metric **x, const member *m, uint64_t local, uint64_t samples,
                           uint64_t broken, uint64_t redone) {
  if (x[0] == NULL)
    return;
  uint64_t in, out = ps_ring_bytes(m->ring, &in);
  ps_metric_set(x[R_STEPS], (double)local);
  ps_metric_set(x[R_SAMPLES], (double)samples);
  ps_metric_rate(x[R_RATE], (double)samples);
  ps_metric_set(x[R_GLOBAL_STEP], (double)ps_shard_version(m->state));
  ps_metric_set(x[R_EPOCH], (double)m->epoch);
  ps_metric_set(x[R_VIEWS], (double)m->views);
  ps_metric_set(x[R_MEMBERS], ps_ring_size(m->ring));
  ps_metric_set(x[R_FETCHED], (double)m->fetched);
  ps_metric_set(x[R_BROKEN], (double)broken);
  ps_metric_set(x[R_REDONE], (double)redone);
  ps_metric_set(x[R_SENT], (double)out);
  ps_metric_set(x[R_RECEIVED], (double)in);
}

int ps_ring_member_run(const ps_config *cfg, int index) {
  stop = ps_trainer_start_process(cfg, index);
  int status = 1;
  ps_errbuf eb = {0};
  ps_model model = {0};
  ps_layout layout = {0};
  ps_trainer t = {0};
  ps_shard *state = NULL;
  ps_ring *ring = NULL;
  ps_registry *reg = NULL;
  ps_history *history = NULL;
  float *work = NULL, *init = NULL;
  ps_metrics *metrics = NULL;
  ps_metric *series[R_N];
  if (ps_layout_for_cluster(cfg, &model, &layout, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    return 1;
  }
  if (ps_metrics_start(cfg, "worker", index, member_series, R_N, series, &metrics, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    goto out;
  }
  if ((status = ps_trainer_open(&t, cfg, &model, index)) != 0)
    goto out;
  status = 1;
  float *params = t.params, *grad = t.grad;
  size_t total = model.vars.total;
  ps_shard_opts o = ps_shard_opts_for(cfg, &layout, 0);
  o.consistency = PS_CONSISTENCY_ASYNC; /* each step's mean is applied as it comes */
  o.sync_sum = 0;
  init = malloc((total ? total : 1) * sizeof *init);
  work = malloc((total ? total : 1) * sizeof *work);
  if (init != NULL)
    ps_layout_init_slice(&layout, &model.vars, 0, (uint64_t)cfg->seed, init);
  state = init ? ps_shard_new(&o, init) : NULL;
  if (state == NULL || work == NULL) {
    ps_log(PS_LOG_ERROR, "out of memory (%zu parameters)", total);
    goto out;
  }
  reg = ps_registry_new(cfg, "worker", index);
  uint64_t incarnation = 0;
  if (reg == NULL ||
      ps_registry_new_epoch(reg, (volatile int *)stop, &incarnation, &eb) != 0) {
    ps_log(PS_LOG_ERROR, "%s", reg ? eb.msg : "out of memory");
    goto out;
  }
  if (ps_registry_run_ended(reg)) {
    ps_notify_done("ring member %d: the run has ended", index);
    status = 0;
    goto out;
  }
  ring = ps_ring_new(cfg, index, incarnation, layout.hash, state, &eb);
  if (ring == NULL) {
    ps_log(PS_LOG_ERROR, "%s", eb.msg);
    goto out;
  }
  ps_ring_set_stop_flag(ring, stop);
  ps_data_pos pos;
  uint64_t clock;
  if (ps_registry_load_pos(reg, &pos, &clock) && ps_sampler_seek(&t.sampler, pos) == 0)
    ps_log(PS_LOG_INFO, "resumed data position epoch %" PRIu64 " offset %" PRIu64
           " from Redis (incarnation %" PRIu64 ")", pos.epoch, pos.offset, incarnation);
  ps_data_pos trained = t.sampler.pos;
  /* Without a chief the seeded state is the start; with one, a member
   * holds a state once it fetched one or the chief loaded it. */
  member m = {.cfg = cfg, .rank = index, .reg = reg, .ring = ring, .state = state,
              .trained = &trained, .sampler = &t.sampler, .holds = cfg->ps_self_init};
  ps_ring_set_holds(ring, m.holds, 0);
  ps_ring_set_idle(ring, heartbeat, &m);
  history = m.history = ps_history_open(cfg, "worker", index);
  uint64_t last = cfg->last_step > 0 ? (uint64_t)cfg->last_step : 0;
  ps_log(PS_LOG_INFO, "ring member %d of %d: %zu samples a epoch, batch %d, %d threads, step "
         "limit %" PRIu64 "; %s", index, cfg->nworkers, ps_sampler_part_size(&t.sampler), t.batch,
         ps_compute_threads(t.compute), last, ps_compute_describe(t.compute));
  int rc = change_view(&m, -1, "starting");
  if (rc == 0)
    ps_notify_ready("ring member %d training from step %" PRIu64, index, ps_shard_version(state));

  uint64_t local = 0, samples = 0, redone = 0, broken = 0;
  double t0 = ps_now_s(), tlog = t0, loss_sum = 0.0, next_poll = t0;
  uint64_t samples_log = 0, steps_log = 0;
  int have_grad = 0;
  uint64_t grad_step = 0;
  size_t n = 0;
  while (rc == 0 && !*stop && (last == 0 || ps_shard_version(state) < last)) {
    metrics_update(series, &m, local, samples, broken, redone);
    uint64_t step = ps_shard_version(state);
    if (!have_grad || grad_step != step) {
      n = ps_trainer_batch(&t);
      ps_layout_scatter(&layout, &model.vars, 0, ps_shard_values(state), params);
      uint64_t first = ((uint64_t)index << 48) + samples;
      double loss = ps_compute_grad(t.compute, params, t.x, t.y, (int)n, (uint64_t)cfg->seed, first,
                                    grad, NULL);
      local++;
      samples += n;
      loss_sum += loss;
      steps_log++;
      samples_log += n;
      have_grad = 1;
      grad_step = step;
      ps_notify_watchdog();
    } else {
      redone++;
    }
    ps_layout_gather(&layout, &model.vars, 0, grad, work);
    rc = ps_ring_allreduce(ring, work, total, step);
    if (rc == -EPIPE) {
      broken++;
      char why[600];
      snprintf(why, sizeof why, "%s", ps_ring_error(ring));
      rc = change_view(&m, ps_ring_suspect(ring), why);
      continue;
    }
    if (rc != 0)
      break;
    if (ps_ring_size(ring) == 1) {
      /* Alone, nothing but Redis says the view is still this one: a member
       * left out of a newer view must not train on by itself.  Redis away:
       * the step waits (it is redone). */
      ps_view v;
      int got = ps_view_get(reg, &v);
      if (got != 1 || v.epoch != m.epoch) {
        if (got == 1)
          rc = change_view(&m, -1, "a newer view");
        else
          wait_a_little(&m, 100);
        continue;
      }
    }
    float inv = 1.0f / (float)ps_ring_size(ring);
    for (size_t i = 0; i < total; i++)
      work[i] *= inv;
    ps_shard_push(state, 0, 1, step + 1, step, work, NULL, 0, NULL);
    ps_history_line(m.history, "step %" PRIu64 " %" PRIu64 " %d", m.epoch, step + 1,
                    ps_ring_size(ring));
    have_grad = 0;
    trained = t.sampler.pos;
    double now = ps_now_s();
    m.rate = (double)local / (now - t0);
    ps_registry_tick(reg, &trained, ps_shard_version(state), m.rate, 0);
    if (now >= next_poll) {
      next_poll = now + VIEW_POLL_MS / 1000.0;
      ps_view v;
      if (ps_view_get(reg, &v) == 1) {
        m.view_seen = now;
        if (ended_without_me(&m))
          rc = RUN_ENDED;
        else if (v.epoch > m.epoch)
          rc = change_view(&m, -1, "a newer view");
      }
    }
    /* Cut off from Redis, this member cannot know whether the others went
     * on in a view without it: past the ring's timeout it stops training
     * until Redis answers, so that a partition leaves at most that long of
     * work on a branch that the next view drops. */
    while (rc == 0 && !*stop && ps_now_s() - m.view_seen > ps_ring_timeout_ms(cfg) / 1000.0) {
      ps_view v;
      char why[64];
      snprintf(why, sizeof why, "has not answered for %" PRId64 " ms", ps_ring_timeout_ms(cfg));
      redis_wait(&m, why);
      wait_a_little(&m, 100);
      if (ps_view_get(reg, &v) == 1) {
        m.view_seen = ps_now_s();
        redis_wait(&m, NULL);
        if (v.epoch > m.epoch)
          rc = change_view(&m, -1, "a newer view");
      }
    }
    if (steps_log >= (uint64_t)cfg->log_every) {
      ps_log(PS_LOG_INFO, "step %" PRIu64 " global %" PRIu64 " loss %.4f samples/s %.1f epoch %"
             PRIu64 " members %d", local, ps_shard_version(state), loss_sum / (double)steps_log,
             (double)samples_log / (now - tlog), t.sampler.pos.epoch, ps_ring_size(ring));
      ps_metric_set(series[R_LOSS], loss_sum / (double)steps_log);
      tlog = now;
      loss_sum = 0.0;
      steps_log = samples_log = 0;
    }
  }
  metrics_update(series, &m, local, samples, broken, redone);
  if (rc == 0 && !*stop && !cfg->ps_self_init)
    rc = wait_for_the_end(&m);
  uint64_t gstep = ps_shard_version(state);
  if (rc == RUN_ENDED) {
    /* Its step's work is in no view's state: the run's final state is the
     * one the others ended with (and the chief checkpointed). */
    ps_log(PS_LOG_INFO, "this member was at global step %" PRIu64 " and out of the ring when "
           "the run ended: it stops without training on alone", gstep);
    status = 0;
    goto out;
  }
  if (rc == PS_ESTOPPED)
    ps_log(PS_LOG_INFO, "the chief ended the run at global step %" PRIu64,
           ps_ring_stop_step(ring));
  else if (rc == -EINTR || *stop)
    ps_log(PS_LOG_INFO, "stopped at global step %" PRIu64, gstep);
  else if (rc != 0)
    goto out;
  if (last > 0 && gstep >= last && rc == 0 && cfg->ps_self_init)
    ps_registry_set_done(reg, gstep, 0); /* no chief to end the run */
  double secs = ps_now_s() - t0;
  ps_registry_tick(reg, &trained, gstep, (double)local / secs, 1);
  uint64_t bytes_in, bytes_out = ps_ring_bytes(ring, &bytes_in);
  /* Scripts read this line by its words, as a ps-mode worker's. */
  printf("worker %d done: %" PRIu64 " local steps, global step %" PRIu64 ", %" PRIu64
         " samples, %.1f s, samples/s %.1f, bytes out %" PRIu64 " in %" PRIu64 ", views %" PRIu64
         ", fetched %" PRIu64 ", broken %" PRIu64 ", redone %" PRIu64 "\n",
         index, local, gstep, samples, secs, secs > 0 ? (double)samples / secs : 0.0, bytes_out,
         bytes_in, m.views, m.fetched, broken, redone);
  if (index == 0 && !*stop) {
    ps_layout_scatter(&layout, &model.vars, 0, ps_shard_values(state), params);
    if (ps_trainer_final_test(&t, params, gstep) != 0)
      goto out;
  }
  fflush(stdout);
  status = 0;
out:
  ps_metrics_free(metrics);
  ps_history_close(history);
  ps_ring_free(ring);
  ps_shard_free(state);
  free(init);
  free(work);
  ps_trainer_close(&t);
  ps_registry_free(reg);
  ps_layout_close(&layout);
  ps_model_close(&model);
  return status;
}
