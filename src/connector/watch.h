/*
 * watch.h -- the connect the consumer-gone watch (watch.c) probes a peer with, as a replaceable call
 * (SQLite's aSyscall): tests make a live peer's handshake port refuse, as a firewall REJECT, a
 * NetworkPolicy or a paused listener would, or make probes learn nothing for a while, without root or
 * iptables. Per instance: production code never sets it.
 */
#ifndef PDL_CONNECTOR_WATCH_H
#define PDL_CONNECTOR_WATCH_H

#include <sys/socket.h>

#include "pdlink/connector.h"

/* connect(2)'s contract: 0, or -1 with errno (EINPROGRESS for a non-blocking connect under way). */
typedef int (*pdl_watch_connect_fn)(int fd, const struct sockaddr *addr, socklen_t len);

/* The call every probe of inst makes from now on (NULL: connect(2), the default). Any thread. */
void pdl__watch_set_connect(pdl_instance_t *inst, pdl_watch_connect_fn fn);

#endif /* PDL_CONNECTOR_WATCH_H */
