/*
 * clock.h -- the process's one monotonic clock (internal; not part of the public API).
 *
 * Every duration, deadline and timestamp pdlink compares is CLOCK_MONOTONIC in nanoseconds from here,
 * so values taken in different layers (a release time stamped by the connector, a deadline the engine
 * waits on) can be subtracted from one another. Condition variables that wait on such a deadline are
 * created by pdl__clock_cond_init (on CLOCK_MONOTONIC, so a wall-clock step neither cuts nor stretches
 * a wait) and waited on with pdl__clock_cond_wait.
 */
#ifndef PDL_COMMON_CLOCK_H
#define PDL_COMMON_CLOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC now, in nanoseconds / milliseconds. Cannot fail on Linux. */
uint64_t pdl__clock_now_ns(void);
uint64_t pdl__clock_now_ms(void);

/* The time from then to now, 0 when then is later. A timestamp another thread took after this thread
 * read now is later than now; plain now - then would wrap to ~584 years and make, say, a push created
 * a microsecond after the reaper read the clock look expired at once. */
static inline uint64_t pdl__clock_since(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

/* A pdl__clock_now_ns value as a timespec, for pthread_cond_timedwait on a CLOCK_MONOTONIC condvar. */
struct timespec pdl__clock_timespec(uint64_t ns);

/* The pdl__clock_now_ns deadline timeout_ms from now; PDL_CLOCK_NEVER for a negative timeout. */
#define PDL_CLOCK_NEVER UINT64_MAX
uint64_t pdl__clock_deadline_ms(int timeout_ms);

/* Initialise cv on CLOCK_MONOTONIC. Returns pthread_cond_init's result (0, or EAGAIN/ENOMEM). */
int pdl__clock_cond_init(pthread_cond_t *cv);

/* Wait on cv (from pdl__clock_cond_init), with mu held, until signalled or until deadline_ns
 * (PDL_CLOCK_NEVER: no deadline). False once the deadline has passed; spurious wake-ups return true,
 * so callers loop on their own condition. */
bool pdl__clock_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns);

#endif /* PDL_COMMON_CLOCK_H */
