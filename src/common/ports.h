/*
 * ports.h -- TCP port ranges versus the kernel's ephemeral range.
 *
 * The kernel hands out ports of its ephemeral range (/proc/sys/net/ipv4/ip_local_port_range) to every
 * outgoing connection and every port-0 listener on the machine. A configured port inside that range can
 * be taken by any process between the moment it was chosen and the moment it is bound, so a program
 * (or the connector) that binds a configured range inside it says so (pdl_ports_warn_ephemeral). Where
 * tests and `pdlink run` pick their ports instead is app/ports.h.
 */
#ifndef PDL_COMMON_PORTS_H
#define PDL_COMMON_PORTS_H

#include <stdbool.h>
#include <stddef.h>

/* Linux's default ephemeral range, assumed when /proc cannot be read (another OS, a sandbox). */
#define PDL_PORTS_EPHEMERAL_DEFAULT_LO 32768
#define PDL_PORTS_EPHEMERAL_DEFAULT_HI 60999

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
 * If first..last, configured under `key` (e.g. "kv_connector_extra_config.notify_port"), overlaps
 * `eph`, write into buf a warning naming the key, the ports and the ephemeral range, and return true;
 * otherwise return false and leave buf alone.
 */
bool pdl_ports_ephemeral_message(char *buf, size_t cap, const char *key, int first, int last, pdl_port_range_t eph);

/* Log pdl_ports_ephemeral_message at warn level against the kernel's current range; true if it warned. */
bool pdl_ports_warn_ephemeral(const char *key, int first, int last);

#endif /* PDL_COMMON_PORTS_H */
