/*
 * run_ports.h -- free TCP port ranges for a local cluster, found by binding.
 *
 * `pdlink run` needs many listening ports per cluster (HTTP ports, handshake and notify bases with
 * tp_size consecutive ports each, the router's discovery port). They are taken from one contiguous
 * run of ports that could all be bound (and listened on) a moment ago, below the kernel's ephemeral
 * range so outgoing connections of other programs do not take them meanwhile. The search starts at a
 * pseudo-random point (seeded by pid and time) and moves forward, so parallel runs and successive
 * clusters of one run do not pick the same ports.
 */
#ifndef PDL_CLI_RUN_PORTS_H
#define PDL_CLI_RUN_PORTS_H

#include <stdint.h>

#include "pdlink/status.h"

typedef struct pdl_run_ports {
    int lo, hi;      /* search window [lo, hi) */
    int cursor;      /* next port to try */
} pdl_run_ports_t;

/* Initialise the search window below the ephemeral range, starting at a point derived from `seed`. */
void pdl_run_ports_init(pdl_run_ports_t *pp, uint64_t seed);

/*
 * Find `count` consecutive ports on `host` (an IPv4 literal) that can all be bound now; *first_p gets
 * the first. Advances the cursor past the range. PDL_ERR_NOT_FOUND when the window has none.
 */
pdl_status_t pdl_run_ports_take(pdl_run_ports_t *pp, const char *host, int count, int *first_p, pdl_error_t *err);

/* True if `port` can be bound and listened on on `host` right now. */
int pdl_run_port_is_free(const char *host, int port);

#endif
