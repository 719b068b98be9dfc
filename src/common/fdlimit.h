/*
 * fdlimit.h -- a listener's share of the process' descriptor limit (RLIMIT_NOFILE).
 *
 * Why: a listener that accepts until the process has no descriptor left takes the rest of the process
 * down with it (libzmq's bind aborts, libmicrohttpd stops accepting: docs/connector.md, "Shares of the
 * descriptor limit"). So the engine's data port and each rank's ROUTERs keep at most a fraction of the
 * limit. Header-only: one getrlimit when a listener starts.
 */
#ifndef PDL_COMMON_FDLIMIT_H
#define PDL_COMMON_FDLIMIT_H

#include <stdint.h>
#include <sys/resource.h>

/* The soft descriptor limit / divisor, at least `min`; UINT64_MAX when the limit is unlimited, `min`
 * when it cannot be read. */
static inline uint64_t pdl__fd_share(uint64_t divisor, uint64_t min)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return min;
    if (rl.rlim_cur == RLIM_INFINITY)
        return UINT64_MAX;
    uint64_t share = (uint64_t)rl.rlim_cur / divisor;
    return share > min ? share : min;
}

#endif
