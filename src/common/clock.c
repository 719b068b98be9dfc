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
