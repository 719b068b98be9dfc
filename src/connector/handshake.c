/*
 * handshake.c -- the handshake client: fetch a remote rank's metadata, check that its KV layout is
 * compatible, register its engine and open the session transfers go through (docs/protocol.md#handshake).
 * The remote is a producer (READ mode: we read from it) or a consumer (WRITE mode: we write to it);
 * messages name it by its role. No cache and no state: a lane's peer cache (peer.c) and the prewarm
 * (prewarm.c) call it, from their own threads.
 *
 * Fast failure: ZeroMQ never reports a refused connect (it retries silently), so a handshake with a
 * peer whose process is gone would wait the whole handshake_timeout. Before the ZeroMQ exchange a
 * plain TCP connect to the handshake port tells at once: refused means nothing listens
 * (PDL_ERR_PEER_GONE, in microseconds), no answer within the timeout means the host is unreachable
 * (PDL_ERR_TIMEOUT). The probe is closed at once; a ROUTER sees a connection without a greeting.
 *
 * Compatibility (pdlink peers, i.e. a handshake carrying pdlink_version): head_dim, kv_elem_size,
 * block_size, num_layers, total_num_kv_heads, is_mla and layout must equal ours, tp_size/tp_rank/
 * dp_rank must be the ones we dialed, and block_len must match the geometry they imply. A mismatch
 * fails the transfers that need this peer with PDL_ERR_MISMATCH naming the field and both values.
 * Upstream peers (no pdlink keys) are assumed to run the same model, as upstream assumes (reference
 * §3.2); only their block_len is checked against our geometry for their TP.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "connector/internal.h"
#include "common/clock.h"

static pdl_status_t hs_recv_payload(void *s, int timeout_ms, uint64_t deadline_ns, pdl_bytes_t *out,
                                    const char *who, pdl_error_t *err)
{
    zmq_msg_t f[3];
    int n = 0;
    for (;;) {
        int64_t left = (int64_t)(deadline_ns - pdl__clock_now_ns()) / 1000000;
        if (n == 0) {
            zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
            int rc = zmq_poll(&it, 1, left > 0 ? (long)left : 0);
            if (rc <= 0) {
                return pdl_error_set(err, PDL_ERR_TIMEOUT, "handshake with %s: no reply within %d ms", who,
                                     timeout_ms);
            }
        }
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, 0) < 0) {
            zmq_msg_close(&m);
            for (int i = 0; i < n && i < 3; i++)
                zmq_msg_close(&f[i]);
            return pdl_error_set(err, PDL_ERR_TRANSPORT, "handshake with %s: %s", who, zmq_strerror(zmq_errno()));
        }
        int more = zmq_msg_more(&m);
        if (n < 3)
            f[n] = m;
        else
            zmq_msg_close(&m);
        n++;
        if (!more)
            break;
    }
    pdl_status_t st = PDL_OK;
    /* Upstream's client checks exactly this shape: 2 frames, the first empty (docs/protocol.md#handshake). */
    if (n != 2 || zmq_msg_size(&f[0]) != 0) {
        st = pdl_error_set(err, PDL_ERR_PARSE, "handshake with %s: reply of %d frames, expected [\"\", payload]", who, n);
    } else {
        out->len = zmq_msg_size(&f[1]);
        out->data = malloc(out->len ? out->len : 1);
        if (out->data == NULL)
            st = pdl_error_set(err, PDL_ERR_NOMEM, "handshake with %s: out of memory", who);
        else
            memcpy(out->data, zmq_msg_data(&f[1]), out->len);
    }
    for (int i = 0; i < n && i < 3; i++)
        zmq_msg_close(&f[i]);
    return st;
}

static bool same_sockaddr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
    return x->sin6_port == y->sin6_port && memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
}

/* Is anything listening on host:port? PDL_OK yes; PDL_ERR_PEER_GONE refused (or a connect that met
 * itself: on loopback a connect to a free port in the ephemeral range can pick that very port as its
 * source, TCP's simultaneous open, and "succeed" with nobody there); PDL_ERR_TIMEOUT no answer. */
static pdl_status_t hs_probe(const char *host, int port, int timeout_ms, const char *who, pdl_error_t *err)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc != 0)
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "handshake with %s: cannot resolve %s: %s", who, host,
                             gai_strerror(rc));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    pdl_status_t st = PDL_OK;
    if (fd < 0) {
        st = pdl_error_set(err, PDL_ERR_TRANSPORT, "handshake with %s: socket: %s", who, strerror(errno));
    } else if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        st = pdl_error_set(err, errno == ECONNREFUSED ? PDL_ERR_PEER_GONE : PDL_ERR_TRANSPORT,
                           "handshake with %s: connect: %s", who, strerror(errno));
    } else {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int n;
        do
            n = poll(&pf, 1, timeout_ms);
        while (n < 0 && errno == EINTR);
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        struct sockaddr_storage me, them;
        socklen_t ml = sizeof(me), tl = sizeof(them);
        if (n == 0)
            st = pdl_error_set(err, PDL_ERR_TIMEOUT, "handshake with %s: no answer to connect within %d ms", who,
                               timeout_ms);
        else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0)
            st = pdl_error_set(err, soerr == ECONNREFUSED ? PDL_ERR_PEER_GONE : PDL_ERR_TRANSPORT,
                               "handshake with %s: connect: %s", who, strerror(soerr ? soerr : errno));
        else if (getsockname(fd, (struct sockaddr *)&me, &ml) == 0 && getpeername(fd, (struct sockaddr *)&them, &tl) == 0 &&
                 same_sockaddr(&me, &them))
            st = pdl_error_set(err, PDL_ERR_PEER_GONE, "handshake with %s: nothing listens (connected to itself)", who);
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return st;
}

pdl_status_t pdl__peer_listening(const pdl_peer_addr_t *addr, int prank, int timeout_ms)
{
    int port = addr->hs_base + pdl_topo_port_offset(addr->dp, addr->tp, prank);
    return hs_probe(addr->host, port, timeout_ms, "", NULL);
}

/* One get_meta_msg exchange on a socket drawn from the budget (hs_fetch). */
static pdl_status_t hs_exchange(pdl_rank_t *r, const char *host, int port, const char *ep, pdl_bytes_t *meta,
                                pdl_bytes_t *layers, const char *who, pdl_error_t *err)
{
    void *s = pdl__request_dealer(r->inst, host, err);
    if (s == NULL)
        return pdl_error_prefix(err, err ? err->status : PDL_ERR_TRANSPORT, "handshake with %s", who);
    int timeout_ms = (int)(r->inst->cfg.conn.handshake_timeout_s * 1000.0);
    uint64_t deadline = pdl__clock_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    pdl_status_t st = hs_probe(host, port, timeout_ms, who, err);
    if (st != PDL_OK)
        ;
    else if (zmq_connect(s, ep) != 0)
        st = pdl_error_set(err, PDL_ERR_TRANSPORT, "handshake with %s: connect %s: %s", who, ep,
                           zmq_strerror(zmq_errno()));
    else if (zmq_send(s, PDL_WIRE_GET_META, strlen(PDL_WIRE_GET_META), ZMQ_DONTWAIT) < 0)
        st = pdl_error_set(err, PDL_ERR_TRANSPORT, "handshake with %s: send: %s", who, zmq_strerror(zmq_errno()));
    if (st == PDL_OK)
        st = hs_recv_payload(s, timeout_ms, deadline, meta, who, err);
    /* A CURVE handshake refused by the peer (another key, or no authenticated mode there) looks exactly
     * like silence to a DEALER: say what to check. */
    if (st == PDL_ERR_TIMEOUT && r->inst->auth != NULL)
        pdl_error_prefix(err, st, "authenticated mode (does %s use the same auth_key_file?)", who);
    if (st == PDL_OK) {
        st = hs_recv_payload(s, timeout_ms, deadline, layers, who, err);
        if (st != PDL_OK)
            pdl_bytes_free(meta);
    }
    zmq_close(s);
    return st;
}

/* One get_meta_msg exchange on a fresh DEALER (upstream does the same: a socket per handshake), drawn
 * from the socket budget's handshake share. */
static pdl_status_t hs_fetch(pdl_rank_t *r, const char *host, int port, pdl_bytes_t *meta, pdl_bytes_t *layers,
                             const char *who, pdl_error_t *err)
{
    char ep[PDL_WIRE_HOST_MAX + 32];
    if (pdl__endpoint(ep, sizeof(ep), host, port) < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "handshake with %s: host too long", who);
    pdl_budget_t *b = &r->inst->sockets;
    if (!pdl__budget_take(b, PDL_SOCKETS_HANDSHAKE)) {
        pdl__budget_refused(b, PDL_SOCKETS_HANDSHAKE);
        return pdl_error_set(err, PDL_ERR_TRANSPORT,
                             "handshake with %s not started: %d handshakes are in flight, the socket budget's "
                             "limit (or the instance has %d sockets open)",
                             who, pdl__budget_cap(PDL_SOCKETS_HANDSHAKE), PDL_SOCKETS_MAX);
    }
    pdl_status_t st = hs_exchange(r, host, port, ep, meta, layers, who, err);
    pdl__budget_put(b, PDL_SOCKETS_HANDSHAKE);
    return st;
}

#define CHECK_FIELD(name, mine, theirs)                                                                          \
    do {                                                                                                         \
        if ((int64_t)(mine) != (int64_t)(theirs))                                                                \
            return pdl_error_set(err, PDL_ERR_MISMATCH, "peer %s: %s differs (local %lld, remote %lld)", who, name, \
                                 (long long)(mine), (long long)(theirs));                                        \
    } while (0)

static pdl_status_t check_compat(const pdl_rank_t *r, const pdl_peer_addr_t *addr, int prank, const pdl_agent_meta_t *m,
                                 const pdl_layer_map_t *lm, const char *who, pdl_error_t *err)
{
    const pdl_model_geometry_t *g = &r->inst->cfg.model;
    if (m->has_pdlink) {
        CHECK_FIELD("head_dim", g->head_dim, m->head_dim);
        CHECK_FIELD("kv_elem_size", g->elem_size, m->kv_elem_size);
        CHECK_FIELD("block_size", g->block_size, m->block_size);
        CHECK_FIELD("num_layers", g->num_layers, m->num_layers);
        CHECK_FIELD("total_num_kv_heads", g->total_kv_heads, m->total_num_kv_heads);
        CHECK_FIELD("is_mla", g->is_mla, m->is_mla);
        char mine[32];
        pdl_layout_name(&r->mem.geo, mine, sizeof(mine));
        if (strcmp(mine, m->layout) != 0)
            return pdl_error_set(err, PDL_ERR_MISMATCH,
                                 "peer %s: layout differs (local %s, remote %.16s): head ranges would not line up", who,
                                 mine, m->layout);
        CHECK_FIELD("tp_size (kv_transfer_params vs handshake)", addr->tp, m->tp_size);
        CHECK_FIELD("tp_rank (dialed vs handshake)", prank, m->tp_rank);
        CHECK_FIELD("dp_rank (dialed vs handshake)", addr->dp, m->dp_rank);
    }
    if (m->num_blocks <= 0 || m->num_blocks > (int64_t)UINT32_MAX)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "peer %s: num_blocks %lld unusable", who, (long long)m->num_blocks);
    if (lm->num_layers < 1 || lm->layers[0].num_descs < 1)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "peer %s: layer map without a memory descriptor", who);
    if (m->has_pdlink && (int64_t)lm->num_layers != m->num_layers)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "peer %s: layer map has %zu layers, handshake says %lld", who,
                             lm->num_layers, (long long)m->num_layers);
    for (size_t l = 1; l < lm->num_layers; l++)
        if (lm->layers[l].num_descs < 1)
            return pdl_error_set(err, PDL_ERR_MISMATCH, "peer %s: layer %zu of the layer map has no memory descriptor",
                                 who, l);
    return PDL_OK;
}

bool pdl__peer_unreachable(pdl_status_t st)
{
    return st == PDL_ERR_TIMEOUT || st == PDL_ERR_PEER_GONE || st == PDL_ERR_TRANSPORT;
}

void pdl__peer_key(const pdl_peer_addr_t *addr, int prank, char *key, size_t cap)
{
    snprintf(key, cap, "%s|%d|%d", addr->engine_id, addr->dp, prank);
}

void pdl__peer_who(const pdl_peer_addr_t *addr, int prank, char *who, size_t cap)
{
    int port = addr->hs_base + pdl_topo_port_offset(addr->dp, addr->tp, prank);
    snprintf(who, cap, "%s:%d (%s tp rank %d)", addr->host, port,
             addr->role == PDL_ROLE_PRODUCER ? "producer" : "consumer", prank);
}

/* Is the remote's layer l its own registration? Every layer then has a descriptor of its own, where a
 * single registration repeats the same one for every layer (rank.c's build_payloads, upstream's
 * layer maps alike). */
static bool remote_layered(const pdl_layer_map_t *lm)
{
    const pdl_bytes_t *d0 = &lm->layers[0].descs[0];
    for (size_t l = 1; l < lm->num_layers; l++) {
        const pdl_bytes_t *d = &lm->layers[l].descs[0];
        if (d->len != d0->len || memcmp(d->data, d0->data, d0->len) != 0)
            return true;
    }
    return false;
}

static void close_sessions(pdl_peer_t *p)
{
    for (int i = 0; i < p->nsessions; i++)
        pdl_session_close(p->sessions[i]);
    free(p->sessions);
    p->sessions = NULL;
    p->nsessions = 0;
}

/* The peer's sessions: one when both sides register every layer in one region, else one per layer,
 * from our layer's registration to the remote layer's descriptor. */
static pdl_status_t open_sessions(pdl_rank_t *r, pdl_peer_t *p, const pdl_layer_map_t *lm, const char *who,
                                  pdl_error_t *err)
{
    int L = r->inst->cfg.model.num_layers;
    p->remote_layered = remote_layered(lm);
    if (p->remote_layered && (int64_t)lm->num_layers != L)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "peer %s: %zu per-layer memory descriptors, %d layers here", who,
                             lm->num_layers, L);
    int n = p->remote_layered || r->mem.layer_kv != NULL ? L : 1;
    p->sessions = calloc((size_t)n, sizeof(*p->sessions));
    if (p->sessions == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "peer %s: out of memory for %d sessions", who, n);
    for (int l = 0; l < n; l++) {
        const pdl_bytes_t *d = &lm->layers[p->remote_layered ? l : 0].descs[0];
        pdl_status_t st = pdl_session_open(r->mem.engine, pdl__layer_mem(&r->mem, l), d->data, d->len, &p->sessions[l], err);
        if (st != PDL_OK) {
            if (n > 1)
                pdl_error_prefix(err, st, "peer %s: session of layer %d", who, l);
            else
                pdl_error_prefix(err, st, "peer %s: session", who);
            close_sessions(p);
            return st;
        }
        p->nsessions = l + 1;
    }
    return PDL_OK;
}

pdl_status_t pdl__peer_connect(pdl_rank_t *r, const pdl_peer_addr_t *addr, int prank, pdl_peer_t **peer_out,
                               pdl_error_t *err)
{
    int port = addr->hs_base + pdl_topo_port_offset(addr->dp, addr->tp, prank);
    char who[PDL_WIRE_HOST_MAX + 64];
    pdl__peer_who(addr, prank, who, sizeof(who));
    pdl_bytes_t meta_b = {0}, layers_b = {0};
    uint64_t t_fetch = pdl__clock_now_ns();
    pdl_status_t st = hs_fetch(r, addr->host, port, &meta_b, &layers_b, who, err);
    uint64_t t_fetched = pdl__clock_now_ns(), t_added = 0;
    if (st != PDL_OK)
        goto fail_count;
    pdl_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        st = pdl_error_set(err, PDL_ERR_NOMEM, "handshake with %s: out of memory", who);
        goto fail_bytes;
    }
    pdl__peer_key(addr, prank, p->key, sizeof(p->key));
    pdl_layer_map_t lm;
    memset(&lm, 0, sizeof(lm));
    st = pdl_wire_decode_agent_meta(meta_b.data, meta_b.len, &p->meta, err);
    if (st == PDL_OK)
        st = pdl_wire_decode_layer_map(layers_b.data, layers_b.len, &lm, err);
    if (st != PDL_OK) {
        pdl_error_prefix(err, st, "handshake with %s", who);
        goto fail_peer;
    }
    st = check_compat(r, addr, prank, &p->meta, &lm, who, err);
    if (st != PDL_OK)
        goto fail_peer;
    /* Remote geometry: ours with the remote rank's head share and block count. */
    int hfirst, hcount;
    st = pdl_topo_heads(addr->tp, r->inst->cfg.model.total_kv_heads, r->inst->cfg.model.is_mla, prank, &hfirst,
                        &hcount, err);
    if (st != PDL_OK)
        goto fail_peer;
    p->geo = r->mem.geo;
    p->geo.num_blocks = (uint64_t)p->meta.num_blocks;
    p->geo.num_heads = (uint32_t)hcount;
    p->layer_len = pdl_layout_region_len(&p->geo);
    if ((int64_t)pdl_layout_block_len(&p->geo) != p->meta.block_len) {
        st = pdl_error_set(err, PDL_ERR_MISMATCH, "peer %s: block_len differs (local geometry gives %llu, remote %lld)",
                           who, (unsigned long long)pdl_layout_block_len(&p->geo), (long long)p->meta.block_len);
        goto fail_peer;
    }
    st = pdl_engine_add_remote(r->mem.engine, p->meta.agent_metadata.data, p->meta.agent_metadata.len,
                               p->remote_engine_key, sizeof(p->remote_engine_key), err);
    if (st != PDL_OK) {
        pdl_error_prefix(err, st, "peer %s: engine descriptor", who);
        goto fail_peer;
    }
    t_added = pdl__clock_now_ns();
    st = open_sessions(r, p, &lm, who, err);
    if (st != PDL_OK) {
        pdl_engine_remove_remote(r->mem.engine, p->remote_engine_key, NULL);
        goto fail_peer;
    }
    pdl_layer_map_clear(&lm);
    pdl_bytes_free(&meta_b);
    pdl_bytes_free(&layers_b);
    PDL_CTR_ADD(r, handshakes, 1);
    uint64_t t_done = pdl__clock_now_ns();
    pdl_debug("rank %d: handshake with %s done (%s peer, %lld blocks): fetch %.3f ms, checks + add remote %.3f ms, "
              "session open %.3f ms",
              r->rank, who, p->meta.has_pdlink ? "pdlink" : "upstream", (long long)p->meta.num_blocks,
              (t_fetched - t_fetch) / 1e6, (t_added - t_fetched) / 1e6, (t_done - t_added) / 1e6);
    *peer_out = p;
    return PDL_OK;
fail_peer:
    pdl_layer_map_clear(&lm);
    pdl_agent_meta_clear(&p->meta);
    free(p);
fail_bytes:
    pdl_bytes_free(&meta_b);
    pdl_bytes_free(&layers_b);
fail_count:
    PDL_CTR_ADD(r, handshake_failures, 1);
    return st;
}

void pdl__peer_free(pdl_rank_t *r, pdl_peer_t *p)
{
    close_sessions(p);
    pdl_engine_remove_remote(r->mem.engine, p->remote_engine_key, NULL);
    pdl_agent_meta_clear(&p->meta);
    free(p);
}
