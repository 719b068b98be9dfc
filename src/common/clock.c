/*
 * clock.c -- the monotonic clock (see clock.h).
 */
#include "common/clock.h"

uint64_t pdl__clock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t pdl__clock_now_ms(void) { return pdl__clock_now_ns() / 1000000ull; }

struct timespec pdl__clock_timespec(uint64_t ns)
{
    return (struct timespec){.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
}

uint64_t pdl__clock_deadline_ms(int timeout_ms)
{
    return timeout_ms < 0 ? PDL_CLOCK_NEVER : pdl__clock_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

int pdl__clock_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
}

bool pdl__clock_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns)
{
    if (deadline_ns == PDL_CLOCK_NEVER) {
        pthread_cond_wait(cv, mu);
        return true;
    }
    if (pdl__clock_now_ns() >= deadline_ns)
        return false;
    struct timespec ts = pdl__clock_timespec(deadline_ns);
    pthread_cond_timedwait(cv, mu, &ts);
    return true;
}
