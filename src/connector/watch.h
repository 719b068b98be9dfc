/*
 * watch.h -- the connect the consumer-gone watch (watch.c) probes a peer with, as a replaceable call
 * (SQLite's aSyscall): tests make a live peer's handshake port refuse, as a firewall REJECT, a
 * NetworkPolicy or a paused listener would, or make probes learn nothing for a while, without root or
 * iptables. Production code never changes it.
 */
#ifndef PDL_CONNECTOR_WATCH_H
#define PDL_CONNECTOR_WATCH_H

#include <sys/socket.h>

/* connect(2)'s contract: 0, or -1 with errno (EINPROGRESS for a non-blocking connect under way). */
typedef int (*pdl_watch_connect_fn)(int fd, const struct sockaddr *addr, socklen_t len);

/* The call every probe makes; connect(2) unless a test replaced it (atomic: the service thread reads it). */
extern _Atomic(pdl_watch_connect_fn) pdl__watch_connect;

#endif /* PDL_CONNECTOR_WATCH_H */
