/* The ring's membership in Redis (README.md in this directory, "Views";
 * keys in src/replica/REDIS.md §1): the current view, numbered, written
 * only by compare-and-set on its number, and each member's report of its
 * step in a view, from which the view's state source is chosen. */
#ifndef PS_RING_VIEW_H
#define PS_RING_VIEW_H

#include <stdint.h>

#include "common/config.h"
#include "replica/registry.h"

typedef struct ps_view {
  uint64_t epoch;                    /* 0: no view yet */
  int n;
  int members[PS_CONFIG_MAX_NODES];  /* worker indices, ascending */
} ps_view;

/* The current view.  @return 1 found, 0 none yet, -1 Redis away or refusing. */
int ps_view_get(ps_registry *reg, ps_view *v);

/* Write `members` (n, any order) as view expected + 1 if the current view
 * is still `expected` (0: none, or Redis lost it).  *v is then the current
 * view, this one's or the one that came first.  @return 1 written, 0
 * another came first, -1 Redis away or refusing. */
int ps_view_propose(ps_registry *reg, uint64_t expected, const int *members, int n, ps_view *v);

/* live[j] = 1 for each worker j whose heartbeat is in Redis.  @return the
 * count, or -1. */
int ps_view_live(ps_registry *reg, int *live);

/* Report this member's step in view `epoch`, and whether its replica
 * holds a state (not one waiting for the chief's); read every member's
 * (steps[i], holds[i] for v->members[i]; steps[i] UINT64_MAX when not
 * reported).  @return 0 or -1. */
int ps_view_report(ps_registry *reg, uint64_t epoch, int rank, uint64_t step, int holds);
int ps_view_reports(ps_registry *reg, const ps_view *v, uint64_t *steps, int *holds);

/* A view as Redis holds it, "E m,m,m": an epoch of at least 1 and worker
 * indices below `nworkers`, ascending.  Anything else (a key edited by
 * hand, another version's format) is not a view: -1, *v zeroed.
 * @return 0 or -1. */
int ps_view_parse(const char *text, int nworkers, ps_view *v);

/* Does the view hold `rank`? */
int ps_view_has(const ps_view *v, int rank);

/* "3: 0,1,2" into buf. */
const char *ps_view_format(const ps_view *v, char *buf, size_t len);

#endif
