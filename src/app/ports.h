/*
 * ports.h -- free TCP port ranges for `pdlink run`, the connector bench and the tests: picked in the
 * "safe window" outside the kernel's ephemeral range (common/ports.h says why that range is unsafe),
 * whole ranges at a time, proved free by binding (pdl_port_picker_take).
 *
 * The same rule is implemented for shell and Python tests by tests/tools/free_ports.py; keep the two
 * in step (window floor, fallback range, which side of the ephemeral range is used).
 */
#ifndef PDL_APP_PORTS_H
#define PDL_APP_PORTS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/ports.h"
#include "pdlink/status.h"

/* Lowest port the safe window uses: ports below are left to well-known and registered services. */
#define PDL_PORTS_FLOOR 10000
/* Longest range pdl_port_picker_take hands out. */
#define PDL_PORTS_TAKE_MAX 512

/*
 * Where to pick ports given the ephemeral range `eph`: the larger of [PDL_PORTS_FLOOR, eph.lo - 1] and
 * [eph.hi + 1, 65535] (below it with Linux's default range: 10000-32767). Empty (lo > hi) only if the
 * ephemeral range covers both.
 */
pdl_port_range_t pdl_ports_safe_window(pdl_port_range_t eph);

/*
 * True if every port first..first+count-1 can be bound and listened on on `host` (an IPv4 literal)
 * right now. Binds without SO_REUSEADDR, so a port with connections in TIME_WAIT counts as busy too.
 * All sockets of the range are held until the whole range is proved, then closed together.
 */
bool pdl_ports_range_free(const char *host, int first, int count);

/*
 * A search for free ranges in the safe window. It starts at a pseudo-random point derived from the seed
 * (pass something like pid ^ time, so processes running side by side start far apart) and moves forward,
 * so successive ranges of one process do not overlap. There is still a window between the probe and the
 * program's own bind that no probe can close: callers that can should retry on EADDRINUSE.
 */
typedef struct pdl_port_picker {
    int lo, hi; /* search window [lo, hi) */
    int cursor; /* next port to try */
} pdl_port_picker_t;

/* Search the safe window of the kernel's current ephemeral range. */
void pdl_port_picker_init(pdl_port_picker_t *pp, uint64_t seed);

/*
 * Find `count` (1..PDL_PORTS_TAKE_MAX) consecutive ports on `host` that can all be bound now; *first_p
 * gets the first. PDL_ERR_INVALID for a bad count, PDL_ERR_NOT_FOUND when the window has no such range.
 */
pdl_status_t pdl_port_picker_take(pdl_port_picker_t *pp, const char *host, int count, int *first_p,
                                  pdl_error_t *err);

#endif /* PDL_APP_PORTS_H */
