/*
 * listen.c -- a rank's handshake and notify ROUTERs when the process is out of file descriptors.
 *
 * Why: libzmq accepts on its own I/O thread, and when accept() fails with EMFILE/ENFILE it only reports
 * the failure to a socket monitor and returns (libzmq 4.3 tcp_listener.cpp: "TODO: Handle specific
 * errors like ENFILE/EMFILE"); the listening socket stays in its level-triggered poller with the
 * connection still queued, so the I/O thread spins. Measured (test_fd_exhaustion, a TP1 producer with
 * 64 descriptors, 120 idle connections to its handshake port): ZMQbg/IO/0 at 86 ticks/s of 100, for
 * as long as the connections stay.
 *
 * What: a monitor on each ROUTER for ZMQ_EVENT_ACCEPT_FAILED. On EMFILE/ENFILE the service thread
 * unbinds the ROUTER (the listener goes, and with it the connections it accepted and those still
 * queued, which frees their descriptors), counts listener_pauses, logs once per 10 s, and binds the
 * same endpoint again LISTEN_PAUSE_MS later (retried every pause while the bind fails). Connections
 * the ROUTER made are not touched (the rank's DEALERs are other sockets). While unbound, peers see the
 * port refused: a consumer's handshake fails fast (peer backoff), a DEALER's release waits in its
 * queue and leaves on reconnect. A bound of one spin episode per pause instead of a spinning core.
 *
 * Authenticated mode also watches ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL: a peer without CURVE (mechanism
 * mismatch) or with another cluster's key (its box does not open) fails there, before the ZAP handler
 * is asked, so this is where those refusals are counted (auth_refused) and logged (rate-limited: libzmq
 * names the listening endpoint, not the peer). A client that completed CURVE with a key that is not the
 * cluster's is refused and counted by the ZAP handler (authmode.c), with its address.
 *
 * A ROUTER also pauses once it holds its share of the descriptor limit (cap: ulimit -n / 32 / the
 * process' ranks, at least LISTEN_CAP_MIN; libzmq accepts a burst of up to its listen queue, 32 here,
 * past that before the pause), counted from ZMQ_EVENT_ACCEPTED and _DISCONNECTED: libzmq
 * itself accepts until the process has no descriptor left, and then every other listener of the process
 * fails too -- libmicrohttpd stops accepting until one of its connections closes, which with idle
 * clients is its idle timeout: /health went unanswered for a minute with 1,100 idle connections per
 * port at ulimit -n 1024. With the http server's half and the data port's eighth, the ROUTERs' share
 * keeps the process below the limit.
 *
 * States per ROUTER: BOUND --accept failed EMFILE/ENFILE, or cap connections--> PAUSED --resume_ms passed, bind ok--> BOUND
 * (bind failed: PAUSED for another pause). Everything runs on the rank's service thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fdlimit.h"
#include "connector/internal.h"

/* Descriptors that must be free before the ROUTER is bound again: libzmq 4.3's bind resolves the host
 * as an interface name first (getifaddrs: a netlink socket) and asserts that it got one -- out of
 * descriptors, zmq_bind aborts the process ("Too many open files (src/ip_resolver.cpp:542)"), seen
 * with 1,100 idle connections per port at ulimit -n 1024. So the tick first takes this many with
 * dup() and gives them back just before binding; if it cannot, the port stays closed another pause.
 * The other listeners bound their own share (the http server, the engine's data port), so the room
 * made by dropping the ROUTER's connections stays. */
#define LISTEN_BIND_SPARE 16

/* The fewest connections a ROUTER keeps before it pauses, whatever the descriptor limit: a notify
 * port has one connection per consumer rank that releases to it. */
#define LISTEN_CAP_MIN 32

/* Long enough that a flood that reconnects at once costs a few milliseconds of spin per second, short
 * enough that peers retrying a refused handshake (peer_backoff 2 s) find the port back. */
#define LISTEN_PAUSE_MS 1000

void pdl__listen_watch(pdl_rank_t *r, pdl_listen_t *l, void *router, const char *what)
{
    memset(l, 0, sizeof(*l));
    l->router = router;
    l->what = what;
    l->cap = pdl__fd_share(32 * (uint64_t)(r->inst->hi - r->inst->lo), LISTEN_CAP_MIN);
    size_t n = sizeof(l->endpoint);
    if (zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, l->endpoint, &n) != 0) {
        l->endpoint[0] = '\0';
        return;
    }
    char mon[96];
    snprintf(mon, sizeof(mon), "inproc://pdl-listen-%d-%s", r->rank, what);
    int events = ZMQ_EVENT_ACCEPT_FAILED | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                 (r->inst->auth ? ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL : 0);
    if (zmq_socket_monitor(router, mon, events) != 0)
        goto fail;
    l->mon = zmq_socket(r->inst->zctx, ZMQ_PAIR);
    int zero = 0;
    if (l->mon == NULL || zmq_setsockopt(l->mon, ZMQ_LINGER, &zero, sizeof(zero)) != 0 || zmq_connect(l->mon, mon) != 0)
        goto fail;
    return;
fail:
    /* Without a monitor the rank still works; only fd exhaustion is not handled. */
    pdl_warn("rank %d %s port: no accept monitor (%s): out of file descriptors, libzmq may spin", r->rank, what,
             zmq_strerror(zmq_errno()));
    if (l->mon != NULL)
        zmq_close(l->mon);
    l->mon = NULL;
    zmq_socket_monitor(router, NULL, 0);
}

/* Read one monitor event (two frames: 6 bytes {u16 event, u32 value}, then the endpoint); false if none. */
static bool read_event(void *mon, uint16_t *event, uint32_t *value)
{
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&f);
        return false;
    }
    bool ok = zmq_msg_size(&f) == 6;
    if (ok) {
        memcpy(event, zmq_msg_data(&f), 2);
        memcpy(value, (uint8_t *)zmq_msg_data(&f) + 2, 4);
    }
    while (zmq_msg_more(&f)) {
        zmq_msg_close(&f);
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, mon, 0) < 0)
            break;
    }
    zmq_msg_close(&f);
    return ok;
}

void pdl__listen_on_event(pdl_rank_t *r, pdl_listen_t *l, uint64_t now_ms)
{
    uint16_t event = 0;
    uint32_t value = 0;
    int why = 0;
    /* While libzmq spun before this thread woke, it queued many events (up to the PAIR's HWM). */
    uint64_t refused = 0;
    while (read_event(l->mon, &event, &value)) {
        if (event == ZMQ_EVENT_ACCEPT_FAILED && (value == EMFILE || value == ENFILE))
            why = (int)value;
        if (event == ZMQ_EVENT_ACCEPTED && !l->paused)
            l->live++;
        if (event == ZMQ_EVENT_DISCONNECTED && l->live > 0) /* also ours: DEALERs are other sockets */
            l->live--;
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
            refused++;
    }
    if (refused > 0) {
        PDL_CTR_ADD(r, auth_refused, refused);
        uint64_t sup = 0;
        if (pdl_ratelimit_allow(&r->ctr.refused_rl, &sup))
            pdl_warn("rank %d %s port: refused %" PRIu64 " connection(s) that failed the CURVE handshake: no key or "
                     "another cluster's (auth_key_file; %" PRIu64 " more refusals since the last report)",
                     r->rank, l->what, refused, sup);
    }
    if ((why == 0 && l->live < l->cap) || l->paused)
        return;
    if (zmq_unbind(l->router, l->endpoint) != 0) {
        pdl_warn("rank %d %s port: out of file descriptors, and unbinding %s failed: %s", r->rank, l->what,
                 l->endpoint, zmq_strerror(zmq_errno()));
        return;
    }
    l->paused = true;
    l->resume_ms = now_ms + LISTEN_PAUSE_MS;
    uint64_t held = l->live;
    l->live = 0; /* unbinding dropped them */
    PDL_CTR_ADD(r, listener_pauses, 1);
    uint64_t sup = 0;
    if (!pdl_ratelimit_allow(&r->ctr.listen_rl, &sup))
        return;
    if (why != 0)
        pdl_warn("rank %d %s port: accept: %s: out of file descriptors (raise ulimit -n); port closed for %d ms, "
                 "its connections dropped (%" PRIu64 " more pauses since the last report)",
                 r->rank, l->what, strerror(why), LISTEN_PAUSE_MS, sup);
    else
        pdl_warn("rank %d %s port: %" PRIu64 " connections, its share of ulimit -n (%" PRIu64 "); port closed for "
                 "%d ms, its connections dropped (%" PRIu64 " more pauses since the last report)",
                 r->rank, l->what, held, l->cap, LISTEN_PAUSE_MS, sup);
}

/* True if LISTEN_BIND_SPARE descriptors could be opened (they are closed again before returning). */
static bool descriptors_free(void)
{
    int fds[LISTEN_BIND_SPARE], n = 0;
    while (n < LISTEN_BIND_SPARE && (fds[n] = dup(STDERR_FILENO)) >= 0)
        n++;
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return n == LISTEN_BIND_SPARE;
}

void pdl__listen_tick(pdl_rank_t *r, pdl_listen_t *l, uint64_t now_ms)
{
    if (!l->paused || now_ms < l->resume_ms)
        return;
    bool room = descriptors_free();
    if (room && zmq_bind(l->router, l->endpoint) == 0) {
        l->paused = false;
        return;
    }
    l->resume_ms = now_ms + LISTEN_PAUSE_MS;
    uint64_t sup = 0;
    if (pdl_ratelimit_allow(&r->ctr.listen_rl, &sup))
        pdl_warn("rank %d %s port: binding %s again failed: %s; retrying in %d ms", r->rank, l->what, l->endpoint,
                 room ? zmq_strerror(zmq_errno()) : "still out of file descriptors", LISTEN_PAUSE_MS);
}

void pdl__listen_fini(pdl_listen_t *l)
{
    if (l->mon == NULL)
        return;
    zmq_socket_monitor(l->router, NULL, 0);
    zmq_close(l->mon);
    l->mon = NULL;
}
