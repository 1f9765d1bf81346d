/* Monotonic time. */
#ifndef PS_COMMON_TIMEUTIL_H
#define PS_COMMON_TIMEUTIL_H

#include <stdint.h>

/* Nanoseconds on the monotonic clock. */
uint64_t ps_now_ns(void);

/* Seconds on the monotonic clock, as a double. */
double ps_now_s(void);

#endif
