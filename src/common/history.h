/* A process's history for checkers (`[cluster] history_dir`): one file per
 * process role and index, one line per event, appended with a single
 * write(2) each so that a line is whole even when the process is killed
 * right after.  Line formats are in scripts/check-history, which reads them:
 *   worker-<j>.history: ack <shard> <shard epoch> <worker incarnation> <seq> <version> <status>
 *                       step <view epoch> <global step> <members>  (ring mode)
 *   ps-<i>.history:     start <epoch> <version> <journal> <source>
 *                       apply <epoch> <journal> <version> <worker> <worker incarnation> <seq>
 *                       stale <epoch> <worker> <worker incarnation> <seq>
 *                       chief <fence token> <CUT|LOAD|STOP> <unix ms>
 */
#ifndef PS_COMMON_HISTORY_H
#define PS_COMMON_HISTORY_H

#include "common/config.h"

typedef struct ps_history ps_history;

/* Open `<history_dir>/<role>-<index>.history` for appending; NULL when
 * history_dir is empty or the file cannot be opened (logged). */
ps_history *ps_history_open(const ps_config *cfg, const char *role, int index);

/* Append one line (a newline is added). */
void ps_history_line(ps_history *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ps_history_close(NULL) does nothing. */
void ps_history_close(ps_history *h);

#endif
