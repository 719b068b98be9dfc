/*
 * curve.c -- authenticated mode on ZeroMQ sockets: CURVE options from the cluster key pair and the ZAP
 * handler thread that admits only cluster members (connector/curve.h; docs/security.md).
 *
 * ZAP (ZeroMQ RFC 27): for every connection to a CURVE server socket, libzmq sends a request on the
 * context's inproc://zeromq.zap.01 and waits for the reply before the connection may carry a message:
 *   request  version "1.0", request id, domain, address, routing id, mechanism, credentials... (CURVE:
 *            one frame, the client's 32-byte public key)
 *   reply    version "1.0", request id, status code ("200" admits, "400" refuses), status text, user
 *            id, metadata
 * Without a handler libzmq admits any client that completed the CURVE handshake, i.e. anyone who knows
 * the server's public key; the handler narrows that to the holders of the cluster's secret key.
 */
#include "connector/curve.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/log.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_POLL_MS 100        /* how often the thread looks at its stop flag */
#define ZAP_LOGGED_PEERS 64    /* addresses remembered for "logged once per peer" */
#define ZAP_MAX_FRAMES 8

struct pdl_zap {
    void *sock;
    const pdl_auth_t *auth;
    char who[64];
    pdl_zap_refused_fn on_refused;
    void *arg;
    pthread_t thread;
    atomic_bool stop;
    _Atomic uint64_t refused;
    char logged[ZAP_LOGGED_PEERS][64]; /* thread only */
    int nlogged;
    pdl_ratelimit_t rl; /* refusals past the table, or from peers already logged */
};

static pdl_status_t zmq_fail(pdl_error_t *err, const char *what)
{
    return pdl_error_set(err, PDL_ERR_SYSTEM, "CURVE: %s: %s", what, zmq_strerror(zmq_errno()));
}

static pdl_status_t curve_check(pdl_error_t *err)
{
    if (!zmq_has("curve"))
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "auth_key_file: this libzmq has no CURVE security (built without libsodium); install "
                             "Debian's libzmq5, whose zmq_has(\"curve\") is true");
    return PDL_OK;
}

pdl_status_t pdl_curve_server(void *sock, const pdl_auth_t *auth, const char *zap_domain, pdl_error_t *err)
{
    if (auth == NULL)
        return PDL_OK;
    pdl_status_t st = curve_check(err);
    if (st != PDL_OK)
        return st;
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, pdl_auth_curve_secret(auth), PDL_AUTH_KEY_LEN) != 0)
        return zmq_fail(err, "server socket options");
    /* A domain makes libzmq consult the handler even where it would not by default; it also names the
     * socket in the handler's log and counters. */
    const char *d = zap_domain && zap_domain[0] ? zap_domain : "pdlink";
    if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, d, strlen(d)) != 0)
        return zmq_fail(err, "ZMQ_ZAP_DOMAIN");
    return PDL_OK;
}

pdl_status_t pdl_curve_client(void *sock, const pdl_auth_t *auth, pdl_error_t *err)
{
    if (auth == NULL)
        return PDL_OK;
    pdl_status_t st = curve_check(err);
    if (st != PDL_OK)
        return st;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, pdl_auth_curve_public(auth), PDL_AUTH_KEY_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pdl_auth_curve_public(auth), PDL_AUTH_KEY_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, pdl_auth_curve_secret(auth), PDL_AUTH_KEY_LEN) != 0)
        return zmq_fail(err, "client socket options");
    return PDL_OK;
}

/* ---- the handler ------------------------------------------------------------------------------- */

static void frame_text(const zmq_msg_t *f, char *buf, size_t cap)
{
    size_t n = zmq_msg_size((zmq_msg_t *)f);
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, zmq_msg_data((zmq_msg_t *)f), n);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (buf[i] < 0x20 || buf[i] > 0x7e)
            buf[i] = '?';
}

static void zap_refused(pdl_zap_t *z, const char *domain, const char *address, const char *why)
{
    atomic_fetch_add(&z->refused, 1);
    if (z->on_refused)
        z->on_refused(z->arg, domain, address);
    bool first = true;
    for (int i = 0; i < z->nlogged && first; i++)
        if (strcmp(z->logged[i], address) == 0)
            first = false;
    if (first && z->nlogged < ZAP_LOGGED_PEERS) {
        snprintf(z->logged[z->nlogged++], sizeof(z->logged[0]), "%s", address);
        pdl_warn("%s: refused a ZeroMQ connection from %s on %s: %s (auth_key_file: only holders of the cluster "
                 "key may connect; further refusals from this address are counted, not logged)",
                 z->who, address, domain, why);
        return;
    }
    uint64_t sup = 0;
    if (!first || !pdl_ratelimit_allow(&z->rl, &sup))
        return;
    pdl_warn("%s: refused a ZeroMQ connection from %s on %s: %s (%" PRIu64 " similar suppressed)", z->who, address,
             domain, why, sup);
}

/* Answer one request (frames f[0..n)); malformed requests get no reply (libzmq then drops the peer). */
static void zap_answer(pdl_zap_t *z, zmq_msg_t *f, int n)
{
    if (n < 6)
        return;
    char domain[64], address[64], mech[16];
    frame_text(&f[2], domain, sizeof(domain));
    frame_text(&f[3], address, sizeof(address));
    frame_text(&f[5], mech, sizeof(mech));
    const char *why = NULL;
    if (strcmp(mech, "CURVE") != 0)
        why = "not a CURVE client";
    else if (n != 7 || zmq_msg_size(&f[6]) != PDL_AUTH_KEY_LEN ||
             memcmp(zmq_msg_data(&f[6]), pdl_auth_curve_public(z->auth), PDL_AUTH_KEY_LEN) != 0)
        why = "its CURVE key is not the cluster's";
    if (why != NULL)
        zap_refused(z, domain, address, why);
    const char *code = why ? "400" : "200";
    const char *text = why ? why : "OK";
    zmq_send(z->sock, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(z->sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    zmq_send(z->sock, code, 3, ZMQ_SNDMORE);
    zmq_send(z->sock, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(z->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(z->sock, "", 0, 0);
}

static void *zap_main(void *arg)
{
    pdl_zap_t *z = arg;
    while (!atomic_load(&z->stop)) {
        zmq_pollitem_t it = {z->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, ZAP_POLL_MS) <= 0)
            continue;
        zmq_msg_t f[ZAP_MAX_FRAMES];
        int n = 0;
        int more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, z->sock, 0) < 0) {
                zmq_msg_close(&m);
                break;
            }
            more = zmq_msg_more(&m);
            if (n < ZAP_MAX_FRAMES)
                f[n++] = m;
            else
                zmq_msg_close(&m);
        }
        /* A REP socket must answer before it can receive again; a request too short to answer leaves
         * it stuck, but libzmq only ever sends complete requests on this inproc endpoint. */
        zap_answer(z, f, n);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
    }
    return NULL;
}

pdl_status_t pdl_curve_zap_start(void *zctx, const pdl_auth_t *auth, const char *who, pdl_zap_refused_fn on_refused,
                                 void *arg, pdl_zap_t **out, pdl_error_t *err)
{
    if (zctx == NULL || auth == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "ZAP handler: no context, key or output");
    pdl_zap_t *z = calloc(1, sizeof(*z));
    if (z == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "ZAP handler: out of memory");
    z->auth = auth;
    snprintf(z->who, sizeof(z->who), "%s", who ? who : "pdlink");
    z->on_refused = on_refused;
    z->arg = arg;
    pdl_ratelimit_init(&z->rl, 10000, 5);
    z->sock = zmq_socket(zctx, ZMQ_REP);
    int zero = 0;
    if (z->sock == NULL || zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_bind(z->sock, ZAP_ENDPOINT) != 0) {
        pdl_status_t st = zmq_fail(err, "ZAP handler socket (" ZAP_ENDPOINT ")");
        if (z->sock)
            zmq_close(z->sock);
        free(z);
        return st;
    }
    if (pthread_create(&z->thread, NULL, zap_main, z) != 0) {
        zmq_close(z->sock);
        free(z);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "ZAP handler: pthread_create failed");
    }
    *out = z;
    return PDL_OK;
}

uint64_t pdl_curve_zap_refused(const pdl_zap_t *zap) { return zap ? atomic_load(&zap->refused) : 0; }

void pdl_curve_zap_stop(pdl_zap_t *zap)
{
    if (zap == NULL)
        return;
    atomic_store(&zap->stop, true);
    pthread_join(zap->thread, NULL);
    zmq_close(zap->sock);
    free(zap);
}
