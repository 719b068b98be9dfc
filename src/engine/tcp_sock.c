/*
 * tcp_sock.c -- the socket options of the tcp engine's data connections, at both ends (tcp.c's client
 * sessions, tcp_server.c's accepted connections): latency, congestion control, and how soon a
 * connection recovers or ends after its path broke.
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>

#include "engine/tcp.h"

/*
 * How long a data connection may go without progress before it counts as lost, and how soon one
 * resumes after a partition heals. Without these, Linux doubles the retransmission timeout from
 * 200 ms up to 120 s while a link is blackholed: after a 15 s blackhole the next retransmission came
 * 12.2 s after the heal, and every request queued behind it on the connection waited as long
 * (docs/reliability.md). A dead host's connection, idle or not, lingered for the 15 minutes of
 * tcp_retries2.
 *
 *   TCP_RTO_MAX_MS   1 s (the kernel's floor for it; Linux 6.15+, skipped before): after a heal the
 *                    next retransmission is at most 1 s away, so a connection that survived resumes
 *                    within about a second plus one round trip.
 *   TCP_USER_TIMEOUT 20 s: data unacknowledged that long (or a zero window probed that long) ends the
 *                    connection with ETIMEDOUT; the session breaks and the connector's next transfer
 *                    handshakes a new one (xfer.c evicts broken sessions). Longer than the pauses a
 *                    live peer survives here (chaos pauses 6-8 s), shorter than transfer_timeout (30 s).
 *   keepalive        probes after 5 s idle, every 2 s: an idle connection to a host that vanished is
 *                    ended by the user timeout within ~20 s of its last byte, instead of never. The
 *                    consumer-gone watch reads an established data connection as proof that its host
 *                    lives (watch.c), so this also bounds how long a vanished host passes for alive.
 */
#ifndef TCP_RTO_MAX_MS
#define TCP_RTO_MAX_MS 44 /* linux/tcp.h since 6.15; older libc headers lack it */
#endif
#define TCP_BOUND_RTO_MAX_MS 1000
#define TCP_BOUND_USER_TIMEOUT_MS 20000
#define TCP_BOUND_KEEPIDLE_S 5
#define TCP_BOUND_KEEPINTVL_S 2
#define TCP_BOUND_KEEPCNT 3

void pdl__tcp_bound_recovery(int fd)
{
    int one = 1, v;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    v = TCP_BOUND_KEEPIDLE_S;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &v, sizeof(v));
    v = TCP_BOUND_KEEPINTVL_S;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &v, sizeof(v));
    v = TCP_BOUND_KEEPCNT;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &v, sizeof(v));
    unsigned ut = TCP_BOUND_USER_TIMEOUT_MS;
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof(ut));
    v = TCP_BOUND_RTO_MAX_MS;
    setsockopt(fd, IPPROTO_TCP, TCP_RTO_MAX_MS, &v, sizeof(v)); /* ENOPROTOOPT before 6.15: doubling to 120 s */
}


void pdl__tcp_tune_socket(const pdl_engine_t *e, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (e->tcp_cc[0] != '\0')
        setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, e->tcp_cc, (socklen_t)strlen(e->tcp_cc));
    pdl__tcp_bound_recovery(fd);
}
