/* Two shard states' fixed fields compared field by field, over the one list
 * in src/ps/state.h (a field added there is compared here too).  Include it
 * after cmocka.h. */
#ifndef PS_TESTS_STATE_ASSERT_H
#define PS_TESTS_STATE_ASSERT_H

#include <inttypes.h>

#include "ps/state.h"

static inline void assert_state_equal(const ps_state_info *got, const ps_state_info *want) {
  for (const ps_state_field *f = ps_state_fields; f < ps_state_fields + PS_STATE_NFIELDS; f++)
    if (ps_state_get(got, f) != ps_state_get(want, f))
      fail_msg("state field %s is %" PRIu64 ", expected %" PRIu64, f->name, ps_state_get(got, f),
               ps_state_get(want, f));
}

#endif
