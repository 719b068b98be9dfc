/*
 * discovery.c -- the discovery socket: a ZeroMQ ROUTER that instances' DEALERs ping (docs/vllm-router.md#discovery).
 *
 * Receive only; it never replies. Each message arrives as [identity, payload]; like vllm-router we
 * take the part after the identity and ignore any further parts. The payload is decoded by the wire
 * layer (G2, and G1 for compatibility) and put into the registry. Anything that does not decode is
 * dropped, counted (vllm_router_discovery_malformed_total) and logged at a limited rate; the loop
 * never stops for bad input. ZMQ_MAXMSGSIZE makes libzmq drop absurdly large frames (and their
 * sender's connection) before we ever copy them. The loop polls with a 100 ms timeout so that it
 * sweeps expired entries and notices the stop flag.
 *
 * Authenticated mode (--auth-key-file): the ROUTER is a CURVE server under the cluster key pair with a
 * ZAP handler (connector/curve.h), so only holders of the cluster key can register -- that is what signs
 * a registration: a rogue worker without the key never gets a frame through. Refused connections are
 * counted (vllm_router_discovery_total{kind="refused"}): by the ZAP handler (a CURVE key that is not the
 * cluster's, logged with the address) and by the socket's monitor (no CURVE or another cluster's key:
 * the handshake fails before ZAP is asked).
 *
 * Each registration also gets the router's verdict on its --api-key (apikey.h): a worker that is not verified
 * is logged once, when its entry is made, and its legs go without the key.
 *
 * An existing worker is refreshed or changed only by registrations from the peer address that registered
 * it (libzmq's Peer-Address of the frame), or by any key holder in authenticated mode (registry.h); the
 * others are dropped, counted (kind="hijack_refused") and logged at a limited rate.
 *
 * The port's share of the descriptor limit: libzmq accepts every connection until the process is out of
 * descriptors, and then the HTTP listener cannot accept either (/health fails). So a monitor counts the
 * ROUTER's accepted and closed connections, and once it holds DISCOVERY_CONN_DIV-th of ulimit -n (at
 * least DISCOVERY_CONN_MIN), or an accept fails with EMFILE/ENFILE, the socket is unbound for
 * DISCOVERY_PAUSE_MS -- which drops its connections -- and bound again (kind="listener_pauses").
 * Instances' DEALERs reconnect by themselves, so a registration is delayed by a pause, not lost; pings
 * come every few seconds and the TTL is 5 s.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "common/clock.h"
#include "common/fdlimit.h"
#include "connector/curve.h"
#include "common/log.h"
#include "pdlink/wire.h"
#include "router/router.h"

/* A registration is ~200 bytes; anything near this is not one. */
#define DISCOVERY_MAX_MSG 65536
/* The port keeps at most ulimit -n / this many connections (at least DISCOVERY_CONN_MIN): instances keep
 * one DEALER per pinging rank, so a cluster needs tens, and the HTTP listener keeps its 3/8. */
#define DISCOVERY_CONN_DIV 16
#define DISCOVERY_CONN_MIN 64
/* Long enough that a flood reconnecting at once costs little, short against the instances' 5 s TTL. */
#define DISCOVERY_PAUSE_MS 1000
/* Descriptors that must be free before binding again: libzmq's bind opens a netlink socket to resolve
 * the host and aborts the process when it cannot (connector/listen.c has the same rule). */
#define DISCOVERY_BIND_SPARE 16

struct pdl_discovery {
    pdl_router_t *rt;
    void *ctx;
    void *sock;
    pdl_zap_t *zap; /* authenticated mode: admits only holders of the cluster key */
    void *mon;      /* PAIR on the socket's monitor: connections, failed accepts, CURVE handshake failures */
    char endpoint[600]; /* what was bound, to bind again after a pause */
    uint64_t live, cap; /* connections the ROUTER holds; its share of the descriptor limit */
    bool paused;
    uint64_t resume_ms;
    pthread_t thread;
    bool started;
    pdl_ratelimit_t bad_rl, pause_rl;
    pdl_ratelimit_t key_rl; /* workers that do not get the --api-key: its own budget, so floods do not hide them */
};

static void handle_payload(pdl_discovery_t *d, const void *buf, size_t len, const char *peer)
{
    pdl_router_t *rt = d->rt;
    pdl_registration_t reg;
    pdl_error_t err;
    pdl_error_clear(&err);
    uint64_t suppressed = 0;
    pdl_status_t dst = pdl_wire_decode_registration(buf, len, &reg, &err);
    if (dst == PDL_ERR_UNSUPPORTED) {
        /* G1's {type: "HELLO"} keep-alive: well-formed, carries nothing (docs/vllm-router.md#discovery). */
        pdl_debug("discovery: ignored a message: %s", err.msg);
        return;
    }
    if (dst != PDL_OK) {
        pdl_rt_metrics_discovery(rt->metrics, PDL_DISC_MALFORMED, 1);
        if (pdl_ratelimit_allow(&d->bad_rl, &suppressed))
            pdl_warn("discovery: dropped a malformed frame of %zu bytes: %s (%llu similar suppressed)", len,
                     err.msg, (unsigned long long)suppressed);
        return;
    }
    bool added = false;
    char why[200] = "";
    bool key_ok = pdl_rt_apikey_verify(&rt->apikey, reg.http_address, why, sizeof(why));
    pdl_status_t st =
        pdl_registry_upsert(rt->reg, &reg, peer, rt->auth != NULL, key_ok, pdl__clock_now_ms(), &added, &err);
    if (st == PDL_ERR_DENIED) {
        pdl_rt_metrics_discovery(rt->metrics, PDL_DISC_HIJACK_REFUSED, 1);
        if (pdl_ratelimit_allow(&d->bad_rl, &suppressed))
            pdl_warn("discovery: %s (%llu similar suppressed)", err.msg, (unsigned long long)suppressed);
        return;
    }
    if (st == PDL_ERR_MISMATCH) {
        pdl_rt_metrics_discovery(rt->metrics, PDL_DISC_MODE_MISMATCH, 1);
        if (pdl_ratelimit_allow(&d->bad_rl, &suppressed))
            pdl_warn("discovery: %s", err.msg);
        return;
    }
    if (st != PDL_OK) {
        pdl_rt_metrics_discovery(rt->metrics, PDL_DISC_REJECTED, 1);
        if (pdl_ratelimit_allow(&d->bad_rl, &suppressed))
            pdl_warn("discovery: registration rejected: %s", err.msg);
        return;
    }
    pdl_rt_metrics_discovery(rt->metrics, PDL_DISC_REGISTRATIONS, 1);
    if (added)
        pdl_info("discovery: %s instance %s registered (zmq %s, tp %lld, dp %lld%s)",
                 reg.type == 'P' ? "prefill" : "decode", reg.http_address, reg.zmq_address, (long long)reg.tp_size,
                 (long long)reg.dp_size, reg.is_g1 ? ", G1 format" : "");
    /* Once per entry (its first registration), so a worker pinging every second is one line, not one per ping. */
    if (added && !key_ok && pdl_ratelimit_allow(&d->key_rl, &suppressed))
        pdl_warn("discovery: %s instance %s (from %s) gets its requests without the router's --api-key: %s (%llu "
                 "similar suppressed)",
                 reg.type == 'P' ? "prefill" : "decode", reg.http_address, peer[0] ? peer : "an unknown address", why,
                 (unsigned long long)suppressed);
}

/* ZAP handler thread: a connection with a CURVE key that is not the cluster's. */
static void on_zap_refused(void *arg, const char *domain, const char *address)
{
    (void)domain;
    (void)address;
    pdl_router_t *rt = arg;
    pdl_rt_metrics_discovery(rt->metrics, PDL_DISC_REFUSED, 1);
}

/* Close the port for DISCOVERY_PAUSE_MS: unbinding drops the connections it accepted. why: the errno of a
 * failed accept, 0 for the share reached. */
static void pause_port(pdl_discovery_t *d, int why, uint64_t now_ms)
{
    if (zmq_unbind(d->sock, d->endpoint) != 0) {
        pdl_warn("discovery: cannot unbind %s to shed connections: %s", d->endpoint, zmq_strerror(zmq_errno()));
        return;
    }
    uint64_t held = d->live, suppressed = 0;
    d->live = 0;
    d->paused = true;
    d->resume_ms = now_ms + DISCOVERY_PAUSE_MS;
    pdl_rt_metrics_discovery(d->rt->metrics, PDL_DISC_LISTENER_PAUSES, 1);
    if (!pdl_ratelimit_allow(&d->pause_rl, &suppressed))
        return;
    if (why != 0)
        pdl_warn("discovery: accept: %s: out of file descriptors (raise ulimit -n); port closed for %d ms, its "
                 "connections dropped (%llu more pauses since the last report)",
                 strerror(why), DISCOVERY_PAUSE_MS, (unsigned long long)suppressed);
    else
        pdl_warn("discovery: %llu connections, the port's share of ulimit -n (%llu); port closed for %d ms, its "
                 "connections dropped (%llu more pauses since the last report)",
                 (unsigned long long)held, (unsigned long long)d->cap, DISCOVERY_PAUSE_MS,
                 (unsigned long long)suppressed);
}

/* True if DISCOVERY_BIND_SPARE descriptors could be opened (closed again before returning). */
static bool descriptors_free(void)
{
    int fds[DISCOVERY_BIND_SPARE], n = 0;
    while (n < DISCOVERY_BIND_SPARE && (fds[n] = dup(STDERR_FILENO)) >= 0)
        n++;
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return n == DISCOVERY_BIND_SPARE;
}

static void resume_port(pdl_discovery_t *d, uint64_t now_ms)
{
    if (!d->paused || now_ms < d->resume_ms)
        return;
    bool room = descriptors_free();
    if (room && zmq_bind(d->sock, d->endpoint) == 0) {
        d->paused = false;
        return;
    }
    d->resume_ms = now_ms + DISCOVERY_PAUSE_MS;
    uint64_t suppressed = 0;
    if (pdl_ratelimit_allow(&d->pause_rl, &suppressed))
        pdl_warn("discovery: binding %s again failed: %s; retrying in %d ms", d->endpoint,
                 room ? zmq_strerror(zmq_errno()) : "still out of file descriptors", DISCOVERY_PAUSE_MS);
}

/* The monitor's events (two frames each: {u16 event, u32 value}, endpoint): connections accepted and
 * closed, failed accepts, failed CURVE handshakes. */
static void on_monitor(pdl_discovery_t *d)
{
    uint64_t refused = 0;
    int why = 0;
    for (;;) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, d->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            break;
        }
        uint16_t ev = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&f) == 6) {
            memcpy(&ev, zmq_msg_data(&f), 2);
            memcpy(&value, (uint8_t *)zmq_msg_data(&f) + 2, 4);
        }
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
            refused++;
        if (ev == ZMQ_EVENT_ACCEPTED && !d->paused)
            d->live++;
        if (ev == ZMQ_EVENT_DISCONNECTED && d->live > 0)
            d->live--;
        if (ev == ZMQ_EVENT_ACCEPT_FAILED && (value == EMFILE || value == ENFILE))
            why = (int)value;
        while (zmq_msg_more(&f)) {
            zmq_msg_close(&f);
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, d->mon, 0) < 0)
                break;
        }
        zmq_msg_close(&f);
    }
    if (!d->paused && (why != 0 || d->live >= d->cap))
        pause_port(d, why, pdl__clock_now_ms());
    if (refused == 0)
        return;
    pdl_rt_metrics_discovery(d->rt->metrics, PDL_DISC_REFUSED, refused);
    uint64_t suppressed = 0;
    if (pdl_ratelimit_allow(&d->bad_rl, &suppressed))
        pdl_warn("discovery: refused %llu connection(s) that failed the CURVE handshake: no key or another "
                 "cluster's (--auth-key-file; %llu similar suppressed)",
                 (unsigned long long)refused, (unsigned long long)suppressed);
}

static void *discovery_main(void *arg)
{
    pdl_discovery_t *d = arg;
    pdl_router_t *rt = d->rt;
    char *payload = malloc(DISCOVERY_MAX_MSG);
    if (payload == NULL) {
        pdl_error("discovery: out of memory; no instance can register");
        return NULL;
    }
    while (!atomic_load(&rt->stop)) {
        zmq_pollitem_t items[2] = {{.socket = d->sock, .events = ZMQ_POLLIN}, {.socket = d->mon, .events = ZMQ_POLLIN}};
        int rc = zmq_poll(items, d->mon ? 2 : 1, 100);
        resume_port(d, pdl__clock_now_ms());
        size_t expired = pdl_registry_sweep(rt->reg, pdl__clock_now_ms());
        if (expired)
            pdl_rt_metrics_discovery(rt->metrics, PDL_DISC_EXPIRED, expired);
        if (rc <= 0)
            continue;
        if (d->mon && (items[1].revents & ZMQ_POLLIN))
            on_monitor(d);
        if (!(items[0].revents & ZMQ_POLLIN))
            continue;
        /* Drain what is queued, one multipart message at a time. */
        for (int burst = 0; burst < 1000; burst++) {
            int part = 0, more = 0;
            size_t plen = 0;
            bool have = false, truncated = false;
            char peer[64] = "";
            do {
                zmq_msg_t msg;
                zmq_msg_init(&msg);
                if (zmq_msg_recv(&msg, d->sock, ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&msg);
                    if (part == 0)
                        goto drained;
                    break; /* parts of one message arrive atomically; defensive only */
                }
                if (part == 1) {
                    const char *pa = zmq_msg_gets(&msg, "Peer-Address");
                    snprintf(peer, sizeof(peer), "%s", pa ? pa : "");
                    size_t n = zmq_msg_size(&msg);
                    if (n > DISCOVERY_MAX_MSG) {
                        truncated = true;
                    } else {
                        memcpy(payload, zmq_msg_data(&msg), n);
                        plen = n;
                        have = true;
                    }
                }
                more = zmq_msg_more(&msg);
                zmq_msg_close(&msg);
                part++;
            } while (more);
            pdl_rt_metrics_discovery(rt->metrics, PDL_DISC_MESSAGES, 1);
            if (!have || truncated) {
                pdl_rt_metrics_discovery(rt->metrics, PDL_DISC_MALFORMED, 1);
                continue;
            }
            handle_payload(d, payload, plen, peer);
        }
    drained:;
    }
    free(payload);
    return NULL;
}

pdl_status_t pdl_discovery_start(pdl_router_t *rt, const char *host, int port, pdl_discovery_t **d_p,
                                 int *bound_port_p, pdl_error_t *err)
{
    pdl_discovery_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "discovery: out of memory");
    d->rt = rt;
    pdl_ratelimit_init(&d->bad_rl, 10000, 5);
    pdl_ratelimit_init(&d->pause_rl, 10000, 1);
    pdl_ratelimit_init(&d->key_rl, 10000, 5);
    d->cap = pdl__fd_share(DISCOVERY_CONN_DIV, DISCOVERY_CONN_MIN);
    d->ctx = zmq_ctx_new();
    if (d->ctx == NULL) {
        free(d);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "discovery: zmq_ctx_new: %s", zmq_strerror(errno));
    }
    d->sock = zmq_socket(d->ctx, ZMQ_ROUTER);
    if (d->sock == NULL) {
        pdl_discovery_destroy(d);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "discovery: zmq_socket(ROUTER): %s", zmq_strerror(errno));
    }
    int linger = 0, ipv6 = strchr(host, ':') != NULL;
    int64_t maxmsg = DISCOVERY_MAX_MSG;
    zmq_setsockopt(d->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(d->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    zmq_setsockopt(d->sock, ZMQ_IPV6, &ipv6, sizeof(ipv6));
    if (rt->auth != NULL) {
        /* The ZAP handler binds before the ROUTER does: no connection is ever admitted without it. */
        pdl_status_t st = pdl_curve_zap_start(d->ctx, rt->auth, "router discovery", on_zap_refused, rt, &d->zap, err);
        if (st == PDL_OK)
            st = pdl_curve_server(d->sock, rt->auth, "discovery", err);
        if (st != PDL_OK) {
            pdl_discovery_destroy(d);
            return st;
        }
    }
    int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_ACCEPT_FAILED |
                 (rt->auth != NULL ? ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL : 0);
    if (zmq_socket_monitor(d->sock, "inproc://pdl-discovery-mon", events) != 0 ||
        (d->mon = zmq_socket(d->ctx, ZMQ_PAIR)) == NULL ||
        zmq_setsockopt(d->mon, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_connect(d->mon, "inproc://pdl-discovery-mon") != 0) {
        pdl_status_t st = pdl_error_set(err, PDL_ERR_SYSTEM, "discovery: monitor: %s", zmq_strerror(zmq_errno()));
        pdl_discovery_destroy(d);
        return st;
    }
    char ep[600];
    if (port == 0)
        snprintf(ep, sizeof(ep), ipv6 ? "tcp://[%s]:*" : "tcp://%s:*", host);
    else
        snprintf(ep, sizeof(ep), ipv6 ? "tcp://[%s]:%d" : "tcp://%s:%d", host, port);
    if (zmq_bind(d->sock, ep) != 0) {
        int e = errno;
        pdl_discovery_destroy(d);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "discovery: cannot bind %s: %s", ep, zmq_strerror(e));
    }
    char last[600];
    size_t ll = sizeof(last);
    int bound = port;
    if (zmq_getsockopt(d->sock, ZMQ_LAST_ENDPOINT, last, &ll) == 0) {
        const char *c = strrchr(last, ':');
        if (c != NULL)
            bound = atoi(c + 1);
        snprintf(d->endpoint, sizeof(d->endpoint), "%s", last);
    } else {
        snprintf(d->endpoint, sizeof(d->endpoint), "%s", ep);
    }
    if (pthread_create(&d->thread, NULL, discovery_main, d) != 0) {
        pdl_discovery_destroy(d);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "discovery: cannot start its thread");
    }
    d->started = true;
    *bound_port_p = bound;
    *d_p = d;
    return PDL_OK;
}

void pdl_discovery_destroy(pdl_discovery_t *d)
{
    if (d == NULL)
        return;
    if (d->started)
        pthread_join(d->thread, NULL);
    if (d->mon) {
        zmq_socket_monitor(d->sock, NULL, 0);
        zmq_close(d->mon);
    }
    if (d->sock)
        zmq_close(d->sock);
    pdl_curve_zap_stop(d->zap);
    if (d->ctx)
        zmq_ctx_term(d->ctx);
    free(d);
}
