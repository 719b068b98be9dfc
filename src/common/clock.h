/*
 * clock.h -- the process's one monotonic clock (internal; not part of the public API).
 *
 * Every duration, deadline and timestamp pdlink compares is CLOCK_MONOTONIC in nanoseconds from here,
 * so values taken in different layers (a release time stamped by the connector, a deadline the engine
 * waits on) can be subtracted from one another. Condition variables that wait on such a deadline are
 * created with pthread_condattr_setclock(CLOCK_MONOTONIC) and get it through pdl__clock_timespec.
 */
#ifndef PDL_COMMON_CLOCK_H
#define PDL_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC now, in nanoseconds / milliseconds. Cannot fail on Linux. */
uint64_t pdl__clock_now_ns(void);
uint64_t pdl__clock_now_ms(void);

/* A pdl__clock_now_ns value as a timespec, for pthread_cond_timedwait on a CLOCK_MONOTONIC condvar. */
struct timespec pdl__clock_timespec(uint64_t ns);

#endif /* PDL_COMMON_CLOCK_H */
