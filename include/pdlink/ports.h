/*
 * ports.h -- TCP port ranges versus the kernel's ephemeral range, and finding free ranges by binding.
 *
 * The kernel hands out ports of its ephemeral range (/proc/sys/net/ipv4/ip_local_port_range) to every
 * outgoing connection and every port-0 listener on the machine. A configured port inside that range can
 * be taken by any process between the moment it was chosen and the moment it is bound, so:
 * - a program that binds a configured range inside it says so (pdl_ports_warn_ephemeral), and
 * - tests and `pdlink run` pick their ports in the "safe window" outside it (pdl_ports_safe_window),
 *   whole ranges at a time, proved free by binding (pdl_port_picker_take).
 * The same rule is implemented for shell and Python tests by tests/tools/free_ports.py; keep the two
 * in step (window floor, fallback range, which side of the ephemeral range is used).
 */
#ifndef PDLINK_PORTS_H
#define PDLINK_PORTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Lowest port the safe window uses: ports below are left to well-known and registered services. */
#define PDL_PORTS_FLOOR 10000
/* Linux's default ephemeral range, assumed when /proc cannot be read (another OS, a sandbox). */
#define PDL_PORTS_EPHEMERAL_DEFAULT_LO 32768
#define PDL_PORTS_EPHEMERAL_DEFAULT_HI 60999
/* Longest range pdl_port_picker_take hands out. */
#define PDL_PORTS_TAKE_MAX 512

typedef struct pdl_port_range {
    int lo, hi; /* inclusive; empty when lo > hi */
} pdl_port_range_t;

/*
 * Parse the text of ip_local_port_range ("32768\t60999\n"). Returns false, leaving *out alone, unless
 * it holds two ports 1..65535 with lo <= hi.
 */
bool pdl_ports_parse_range(const char *text, pdl_port_range_t *out);

/* The kernel's ephemeral range, read on every call (it can be changed at run time); the Linux default
 * when the file cannot be read or parsed. */
pdl_port_range_t pdl_ports_ephemeral(void);

/* True if the ports first..last (inclusive) share at least one port with `r`. */
bool pdl_ports_overlap(int first, int last, pdl_port_range_t r);

/*
 * Where to pick ports given the ephemeral range `eph`: the larger of [PDL_PORTS_FLOOR, eph.lo - 1] and
 * [eph.hi + 1, 65535] (below it with Linux's default range: 10000-32767). Empty (lo > hi) only if the
 * ephemeral range covers both.
 */
pdl_port_range_t pdl_ports_safe_window(pdl_port_range_t eph);

/*
 * If first..last, configured under `key` (e.g. "kv_connector_extra_config.notify_port"), overlaps
 * `eph`, write into buf a warning naming the key, the ports and the ephemeral range, and return true;
 * otherwise return false and leave buf alone.
 */
bool pdl_ports_ephemeral_message(char *buf, size_t cap, const char *key, int first, int last, pdl_port_range_t eph);

/* Log pdl_ports_ephemeral_message at warn level against the kernel's current range; true if it warned. */
bool pdl_ports_warn_ephemeral(const char *key, int first, int last);

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

#ifdef __cplusplus
}
#endif

#endif
