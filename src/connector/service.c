/*
 * service.c -- the per-rank service thread: handshake and notify ROUTERs, outbound DEALERs, the
 * discovery ping, and the ticks of the lease reaper (held.c) and the WRITE reaper (push_park.c)
 * (docs/protocol.md).
 *
 * One thread owns the rank's ROUTERs, its ping DEALER and its outbound DEALER cache (ZeroMQ sockets
 * are not thread-safe). It sleeps in zmq_poll on the two ROUTERs and an eventfd; other threads queue
 * outbound messages (sender.c) and write the eventfd. It dispatches WRITE-mode messages to push.c
 * (producer) and push_recv.c (consumer) and resolved transfers to held.c; nothing calls back into it
 * but start and stop. Each wake-up drains at most a budget of frames per socket, so one flooding sender
 * cannot starve the other socket or the reaper.
 *
 * Hostile input (docs/protocol.md#bad-frames: upstream's listener threads die on it): every frame is
 * decoded by the wire codecs, which refuse anything malformed; the frame is then dropped, counted in
 * dropped_malformed and logged through a rate limiter per kind. Frames above 16 MB never reach us:
 * ZMQ_MAXMSGSIZE makes libzmq drop the connection that sent them.
 *
 * Handshake: `get_meta_msg` → two messages [identity, "", payload] (agent metadata, then the layer
 * map), prepared once at start-up. `pop_done_recv` is accepted and ignored together with the one
 * extra message upstream sends after it. Anything else is dropped without a reply.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "connector/digest.h"
#include "connector/internal.h"
#include "common/clock.h"

#define SVC_BUDGET 512            /* frames per socket per wake-up */
#define SVC_MAX_FRAME ((int64_t)PDL_WIRE_MAX_FRAME)
#define SVC_PING_INTERVAL_MS 3000 /* MoRIIO's PING_INTERVAL */
#define SVC_SWEEP_INTERVAL_MS 5000 /* idle DEALERs are looked for this often (idle = 30 s) */

static void set_int_opt(void *s, int opt, int v) { zmq_setsockopt(s, opt, &v, sizeof(v)); }

/* ---- receiving -------------------------------------------------------------------------------- */

#define MP_KEEP 4
typedef struct mp {
    zmq_msg_t part[MP_KEEP];
    int kept;  /* parts initialised in part[] */
    int total; /* frames in the message */
} mp_t;

/* Receive one whole multipart message without blocking; 0 ok, -1 nothing (EAGAIN) or error. */
static int mp_recv(void *sock, mp_t *m)
{
    m->kept = 0;
    m->total = 0;
    for (;;) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, m->total == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&f);
            if (m->total == 0)
                return -1;
            break; /* interrupted mid-message: deliver what we have (it will be judged malformed) */
        }
        int more = zmq_msg_more(&f);
        if (m->kept < MP_KEEP)
            m->part[m->kept++] = f;
        else
            zmq_msg_close(&f);
        m->total++;
        if (!more)
            break;
    }
    return 0;
}

static void mp_close(mp_t *m)
{
    for (int i = 0; i < m->kept; i++)
        zmq_msg_close(&m->part[i]);
    m->kept = 0;
}

static bool frame_is(zmq_msg_t *f, const char *s)
{
    size_t n = strlen(s);
    return zmq_msg_size(f) == n && memcmp(zmq_msg_data(f), s, n) == 0;
}

/* The payload frame of [identity, payload] or [identity, "", payload] (REQ-style senders). */
static zmq_msg_t *mp_payload(mp_t *m)
{
    if (m->total == 2)
        return &m->part[1];
    if (m->total == 3 && zmq_msg_size(&m->part[1]) == 0)
        return &m->part[2];
    return NULL;
}

/* ---- handshake -------------------------------------------------------------------------------- */

static void hs_reply(pdl_rank_t *r, zmq_msg_t *identity, const pdl_bytes_t *payload)
{
    void *s = r->svc.hs_sock;
    if (zmq_send(s, zmq_msg_data(identity), zmq_msg_size(identity), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s, payload->data, payload->len, ZMQ_DONTWAIT) < 0)
        pdl_debug("rank %d: handshake reply not sent: %s", r->rank, zmq_strerror(zmq_errno()));
}

/* [identity, "", who, age]: who answers (pdl__watch_identity, the same for the life of this instance)
 * and, in a frame of its own so that the first stays a stable fingerprint, "up_ns=N": how long ago this
 * rank's handshake port was bound, in its own clock. The watcher subtracts it from when it asked and so
 * knows, without comparing clocks between hosts, whether this instance came up after a hold was made
 * for the address (watch.c, "Epochs"). */
static void identity_reply(pdl_rank_t *r, zmq_msg_t *identity)
{
    char who[64], age[40];
    size_t n = pdl__watch_identity(r, who, sizeof(who));
    int an = snprintf(age, sizeof(age), "up_ns=%" PRIu64, pdl__clock_since(pdl__clock_now_ns(), r->svc.bound_ns));
    void *s = r->svc.hs_sock;
    if (zmq_send(s, zmq_msg_data(identity), zmq_msg_size(identity), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 || zmq_send(s, who, n, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s, age, (size_t)an, ZMQ_DONTWAIT) < 0)
        pdl_debug("rank %d: identity reply not sent: %s", r->rank, zmq_strerror(zmq_errno()));
}

/* trusted_hosts: a frame from another address is dropped unanswered and counted (untrusted_refused). */
static bool from_trusted(pdl_rank_t *r, mp_t *m, const char *what)
{
    /* The identity frame is made by the ROUTER; the frames after it came off the wire and carry the
     * connection's metadata. */
    const char *peer = m->kept > 1 ? zmq_msg_gets(&m->part[1], "Peer-Address") : NULL;
    if (pdl__trust_addr(&r->inst->trusted, peer))
        return true;
    PDL_CTR_REFUSED(r, untrusted_refused, "dropped a %s message from %s: not in trusted_hosts", what,
                    peer ? peer : "an unknown address");
    return false;
}

static void hs_handle(pdl_rank_t *r, mp_t *m)
{
    if (!from_trusted(r, m, "handshake"))
        return;
    zmq_msg_t *id = &m->part[0];
    if (r->svc.followup_len > 0 && zmq_msg_size(id) == r->svc.followup_len &&
        memcmp(zmq_msg_data(id), r->svc.followup_identity, r->svc.followup_len) == 0) {
        r->svc.followup_len = 0; /* the frame upstream sends after pop_done_recv: logged, ignored */
        pdl_debug("rank %d: ignored the message following pop_done_recv", r->rank);
        return;
    }
    zmq_msg_t *req = mp_payload(m);
    if (req == NULL) {
        pdl__ctr_drop(r, PDL_DROP_HANDSHAKE, "handshake request of %d frames", m->total - 1);
        return;
    }
    if (frame_is(req, PDL_WIRE_GET_META)) {
        hs_reply(r, id, &r->mem.meta_payload);
        hs_reply(r, id, &r->mem.layermap_payload);
        PDL_CTR_ADD(r, handshakes, 1);
        return;
    }
    if (frame_is(req, PDL_WIRE_GET_IDENTITY)) { /* a peer's watch (watch.c): not a handshake */
        identity_reply(r, id);
        PDL_CTR_ADD(r, identities_served, 1);
        return;
    }
    if (pdl_wire_is_digest_request(zmq_msg_data(req), zmq_msg_size(req))) { /* a consumer's check (digest.c) */
        pdl_bytes_t b = {0};
        pdl_error_t e;
        if (pdl__digests_serve(r, zmq_msg_data(req), zmq_msg_size(req), &b, &e) == PDL_OK)
            hs_reply(r, id, &b);
        else
            pdl__ctr_drop(r, PDL_DROP_HANDSHAKE, "digest request: %s", e.msg);
        pdl_bytes_free(&b);
        return;
    }
    if (frame_is(req, PDL_WIRE_POP_DONE_RECV)) {
        size_t n = zmq_msg_size(id);
        if (n <= sizeof(r->svc.followup_identity)) {
            memcpy(r->svc.followup_identity, zmq_msg_data(id), n);
            r->svc.followup_len = n;
        }
        return;
    }
    pdl__ctr_drop(r, PDL_DROP_HANDSHAKE, "unknown handshake request of %zu bytes", zmq_msg_size(req));
}

/* ---- notify ----------------------------------------------------------------------------------- */

static void notify_release(pdl_rank_t *r, const pdl_msg_t *msg, const char *sender)
{
    char expected[64];
    if (!pdl__held_release_allowed(r, msg->transfer_id, sender, expected, sizeof(expected))) {
        /* A forged release would free another transfer's blocks while its consumer still reads them. */
        PDL_CTR_REFUSED(r, releases_refused, "refused a release of transfer %.100s from %s: its consumer is %s",
                        msg->transfer_id, sender, expected);
        return;
    }
    /* WRITE mode holds no fan-in: a failed release there means the consumer gave the push up. */
    if (!r->inst->cfg.conn.read_mode && msg->status == PDL_RELEASE_FAILED) {
        pdl__push_on_abandon(r, msg, sender);
        return;
    }
    pdl_fanin_release_t rel = {.transfer_id = msg->transfer_id,
                               .consumer_tp_size = msg->type == PDL_MSG_LEGACY ? 1 : msg->consumer_tp_size,
                               .consumer_tp_rank = msg->type == PDL_MSG_LEGACY ? -1 : msg->consumer_tp_rank,
                               .failed = msg->status == PDL_RELEASE_FAILED,
                               .sender = sender}; /* parked: checked against the consumer at the hold */
    pdl_error_t e;
    pdl_fanin_result_t res = pdl__held_release(r, &rel, &e);
    switch (res) {
    case PDL_FANIN_INVALID:
        pdl__ctr_drop(r, PDL_DROP_NOTIFY_FANIN, "release: %s", e.msg);
        break;
    case PDL_FANIN_REPORTED: /* resolved by pdl__held_release */
        pdl_debug("rank %d: transfer %s released by all its consumers", r->rank, msg->transfer_id);
        break;
    case PDL_FANIN_LATE: {
        uint64_t sup = 0;
        if (pdl_ratelimit_allow(&r->ctr.late_rl, &sup))
            pdl_info("rank %d: late release for finished or expired transfer %s (counted; %" PRIu64 " more since)",
                     r->rank, msg->transfer_id, sup);
        break;
    }
    case PDL_FANIN_DUPLICATE:
        pdl_debug("rank %d: duplicate release of transfer %s from consumer rank %" PRId64, r->rank, msg->transfer_id,
                  msg->consumer_tp_rank);
        break;
    default:
        break;
    }
}

static void notify_handle(pdl_rank_t *r, mp_t *m)
{
    if (!from_trusted(r, m, "notify"))
        return;
    zmq_msg_t *pl = mp_payload(m);
    if (pl == NULL) {
        pdl__ctr_drop(r, PDL_DROP_NOTIFY_FRAMES, "notify message of %d frames (expected 1)", m->total - 1);
        return;
    }
    pdl_msg_t msg;
    pdl_error_t e;
    if (pdl_wire_decode_msg(zmq_msg_data(pl), zmq_msg_size(pl), &msg, &e) != PDL_OK) {
        pdl__ctr_drop(r, PDL_DROP_NOTIFY_PARSE, "notify frame of %zu bytes: %s", zmq_msg_size(pl), e.msg);
        return;
    }
    switch (msg.type) {
    case PDL_MSG_RELEASE:
    case PDL_MSG_LEGACY:
        notify_release(r, &msg, zmq_msg_gets(pl, "Peer-Address"));
        break;
    case PDL_MSG_KEEPALIVE: {
        /* Bound like a release: a keepalive from anyone else would pin the blocks past defer_timeout. */
        const char *sender = zmq_msg_gets(pl, "Peer-Address");
        char expected[64];
        if (!pdl__held_release_allowed(r, msg.transfer_id, sender, expected, sizeof(expected)))
            PDL_CTR_REFUSED(r, keepalives_refused, "refused a keepalive of transfer %.100s from %s: its consumer is %s",
                            msg.transfer_id, sender, expected);
        else if (!pdl__held_keepalive(r, msg.transfer_id))
            pdl_debug("rank %d: keepalive for transfer %s that is not held", r->rank, msg.transfer_id);
        break;
    }
    case PDL_MSG_REMOTE_BLOCKS:
        if (!r->inst->cfg.conn.read_mode) {
            pdl__push_on_remote_blocks(r, &msg, zmq_msg_gets(pl, "Peer-Address"));
            break;
        }
        pdl__ctr_drop(r, PDL_DROP_NOTIFY_UNSUPPORTED, "%s for transfer %s: WRITE mode is not enabled",
                             pdl_msg_type_name(msg.type), msg.transfer_id);
        break;
    case PDL_MSG_WRITE_DONE:
        if (!r->inst->cfg.conn.read_mode && r->inst->cfg.conn.role == PDL_ROLE_CONSUMER) {
            pdl__push_on_write_done(r, &msg, zmq_msg_gets(pl, "Peer-Address"));
            break;
        }
        pdl__ctr_drop(r, PDL_DROP_NOTIFY_UNSUPPORTED, "%s for transfer %s: WRITE mode is not enabled",
                             pdl_msg_type_name(msg.type), msg.transfer_id);
        break;
    default:
        pdl__ctr_drop(r, PDL_DROP_NOTIFY_PARSE, "notify message of unknown kind %d", (int)msg.type);
        break;
    }
    pdl_msg_clear(&msg);
}

/* ---- discovery ping --------------------------------------------------------------------------- */

static void ping_tick(pdl_rank_t *r, uint64_t now_ms)
{
    if (r->svc.ping_payload.len == 0 || now_ms < r->svc.next_ping_ms)
        return;
    r->svc.next_ping_ms = now_ms + SVC_PING_INTERVAL_MS;
    const pdl_connector_config_t *c = &r->inst->cfg.conn;
    if (r->svc.ping_sock == NULL) {
        char ep[PDL_WIRE_HOST_MAX + 32];
        r->svc.ping_sock = zmq_socket(r->inst->zctx, ZMQ_DEALER);
        if (r->svc.ping_sock == NULL || pdl__endpoint(ep, sizeof(ep), c->proxy_ip, c->proxy_ping_port) < 0)
            return;
        set_int_opt(r->svc.ping_sock, ZMQ_LINGER, 0); /* never hold up shutdown for a ping */
        set_int_opt(r->svc.ping_sock, ZMQ_SNDHWM, 1); /* one stale ping at most while the router is absent */
        set_int_opt(r->svc.ping_sock, ZMQ_SNDTIMEO, 0);
        if (strchr(ep, '['))
            set_int_opt(r->svc.ping_sock, ZMQ_IPV6, 1);
        /* Authenticated mode: only a router holding the cluster key admits the ping (docs/security.md). */
        pdl_error_t e;
        if (pdl_curve_client(r->svc.ping_sock, r->inst->auth, &e) != PDL_OK) {
            pdl_warn("discovery: %s", e.msg);
            zmq_close(r->svc.ping_sock);
            r->svc.ping_sock = NULL;
            return;
        }
        if (zmq_connect(r->svc.ping_sock, ep) != 0) {
            pdl_warn("discovery: cannot connect to %s: %s", ep, zmq_strerror(zmq_errno()));
            zmq_close(r->svc.ping_sock);
            r->svc.ping_sock = NULL;
            return;
        }
    }
    if (zmq_send(r->svc.ping_sock, r->svc.ping_payload.data, r->svc.ping_payload.len, ZMQ_DONTWAIT) < 0) {
        /* The router is absent or slow: keep retrying every interval (upstream counts retries). */
        r->svc.ping_failures++;
        uint64_t sup = 0;
        if (pdl_ratelimit_allow(&r->ctr.ping_rl, &sup))
            pdl_info("discovery: router %s:%d not reachable yet (%" PRIu64 " pings not delivered); retrying",
                     c->proxy_ip, c->proxy_ping_port, r->svc.ping_failures);
    }
}

/* ---- the loop --------------------------------------------------------------------------------- */

static void drain(pdl_rank_t *r, void *sock, void (*handle)(pdl_rank_t *, mp_t *))
{
    for (int i = 0; i < SVC_BUDGET; i++) {
        mp_t m;
        if (mp_recv(sock, &m) != 0)
            return;
        handle(r, &m);
        mp_close(&m);
    }
}

static void *service_main(void *arg)
{
    pdl_rank_t *r = arg;
    double defer = r->inst->cfg.conn.defer_timeout_s;
    long tick_ms = defer < 1.0 ? 10 : 50; /* the reaper's resolution */
    pdl__listen_watch(r, &r->svc.hs_listen, r->svc.hs_sock, "handshake");
    pdl__listen_watch(r, &r->svc.notify_listen, r->svc.notify_sock, "notify");
    /* The accept monitors last: a missing one is polled as fd -1, which poll ignores. */
    zmq_pollitem_t items[5] = {
        {.socket = r->svc.hs_sock, .events = ZMQ_POLLIN},
        {.socket = r->svc.notify_sock, .events = ZMQ_POLLIN},
        {.socket = NULL, .fd = r->out.wake_fd, .events = ZMQ_POLLIN},
        {.socket = r->svc.hs_listen.mon, .fd = -1, .events = ZMQ_POLLIN},
        {.socket = r->svc.notify_listen.mon, .fd = -1, .events = ZMQ_POLLIN},
    };
    while (!atomic_load(&r->svc.stop)) {
        int n = zmq_poll(items, 5, tick_ms);
        if (n < 0 && zmq_errno() != EINTR) {
            pdl_error("rank %d: zmq_poll: %s", r->rank, zmq_strerror(zmq_errno()));
            break;
        }
        if (n > 0 && (items[0].revents & ZMQ_POLLIN))
            drain(r, r->svc.hs_sock, hs_handle);
        if (n > 0 && (items[1].revents & ZMQ_POLLIN))
            drain(r, r->svc.notify_sock, notify_handle);
        if (n > 0 && (items[2].revents & ZMQ_POLLIN)) {
            uint64_t v;
            if (read(r->out.wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                pdl_warn("rank %d: eventfd read: %s", r->rank, strerror(errno));
        }
        if (n > 0 && (items[3].revents & ZMQ_POLLIN))
            pdl__listen_on_event(r, &r->svc.hs_listen, pdl__clock_now_ms());
        if (n > 0 && (items[4].revents & ZMQ_POLLIN))
            pdl__listen_on_event(r, &r->svc.notify_listen, pdl__clock_now_ms());
        pdl__listen_tick(r, &r->svc.hs_listen, pdl__clock_now_ms());
        pdl__listen_tick(r, &r->svc.notify_listen, pdl__clock_now_ms());
        pdl__outq_flush(r, &r->svc.dealers);
        pdl__held_reap(r);
        pdl__push_reap(r);
        uint64_t now_ms = pdl__clock_now_ms();
        ping_tick(r, now_ms);
        pdl__watch_tick(r, pdl__clock_now_ns());
        if (now_ms >= r->svc.next_sweep_ms) {
            r->svc.next_sweep_ms = now_ms + SVC_SWEEP_INTERVAL_MS;
            pdl__dealers_sweep(&r->svc.dealers, pdl__clock_now_ns(), (uint64_t)PDL_DEALER_IDLE_MS * 1000000ull);
            pdl__xfer_lanes_sweep(&r->readers);
            pdl__xfer_lanes_sweep(&r->writers);
        }
    }
    pdl__outq_flush(r, &r->svc.dealers);
    pdl__dealers_close(&r->svc.dealers);
    pdl__watch_fini(r);
    pdl__listen_fini(&r->svc.hs_listen);
    pdl__listen_fini(&r->svc.notify_listen);
    if (r->svc.ping_sock)
        zmq_close(r->svc.ping_sock);
    zmq_close(r->svc.hs_sock);
    zmq_close(r->svc.notify_sock);
    r->svc.ping_sock = r->svc.hs_sock = r->svc.notify_sock = NULL;
    return NULL;
}

static void *bind_router(pdl_rank_t *r, int port, const char *what, pdl_error_t *err)
{
    void *s = zmq_socket(r->inst->zctx, ZMQ_ROUTER);
    if (s == NULL) {
        pdl_error_set(err, PDL_ERR_TRANSPORT, "rank %d %s socket: %s", r->rank, what, zmq_strerror(zmq_errno()));
        return NULL;
    }
    set_int_opt(s, ZMQ_LINGER, 0);
    int64_t max = SVC_MAX_FRAME;
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    /* Default RCVHWM (1000 messages per connection): a flooding sender is slowed by TCP backpressure
     * instead of queueing unbounded memory here. */
    /* host_ip only, unless bind_all: upstream binds every address (the "*" endpoint), which puts the
     * handshake and notify ports on interfaces host_ip never named. libzmq binds only
     * interface names and numeric addresses, so a host name is resolved here first. */
    const pdl_connector_config_t *cc = &r->inst->cfg.conn;
    char host[PDL_WIRE_HOST_MAX + 1] = "*";
    char ep[PDL_WIRE_HOST_MAX + 32];
    if (!cc->bind_all && pdl__host_numeric(cc->host_ip, true, host, sizeof(host)) != 0) {
        pdl_error_set(err, PDL_ERR_INVALID, "rank %d %s port %d: host_ip '%s' does not resolve (set bind_all to listen "
                      "on every address)", r->rank, what, port, cc->host_ip);
        zmq_close(s);
        return NULL;
    }
    if (strchr(cc->bind_all ? cc->host_ip : host, ':'))
        set_int_opt(s, ZMQ_IPV6, 1);
    /* libzmq accepts the whole queue at once; a shorter queue bounds how far a flood overshoots the
     * ROUTER's share of the descriptors before listen.c pauses it (peers retry a dropped SYN). */
    set_int_opt(s, ZMQ_BACKLOG, 32);
    char domain[64];
    pdl__authmode_domain(r, what, domain, sizeof(domain));
    if (pdl_curve_server(s, r->inst->auth, domain, err) != PDL_OK) {
        pdl_error_prefix(err, err ? err->status : PDL_ERR_SYSTEM, "rank %d %s port %d", r->rank, what, port);
        zmq_close(s);
        return NULL;
    }
    if (strcmp(host, "*") == 0)
        snprintf(ep, sizeof(ep), "tcp://*:%d", port);
    else
        pdl__endpoint(ep, sizeof(ep), host, port);
    if (zmq_bind(s, ep) != 0) {
        pdl_error_set(err, PDL_ERR_TRANSPORT, "rank %d %s port %d: bind %s failed: %s", r->rank, what, port, ep,
                      zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    return s;
}

pdl_status_t pdl__service_bind(pdl_rank_t *r, pdl_error_t *err)
{
    /* Before the bind: no peer can have reached this instance earlier than its epoch says. */
    r->svc.bound_ns = pdl__clock_now_ns();
    r->svc.hs_sock = bind_router(r, r->hs_port, "handshake", err);
    if (r->svc.hs_sock == NULL)
        return err ? err->status : PDL_ERR_TRANSPORT;
    r->svc.notify_sock = bind_router(r, r->notify_port, "notify", err);
    if (r->svc.notify_sock == NULL) {
        zmq_close(r->svc.hs_sock);
        r->svc.hs_sock = NULL;
        return err ? err->status : PDL_ERR_TRANSPORT;
    }
    return PDL_OK;
}

pdl_status_t pdl__service_start(pdl_rank_t *r, pdl_error_t *err)
{
    pdl_instance_t *inst = r->inst;
    r->out.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->out.wake_fd < 0) {
        pdl_error_set(err, PDL_ERR_SYSTEM, "rank %d: eventfd: %s", r->rank, strerror(errno));
        goto fail;
    }
    const pdl_connector_config_t *c = &inst->cfg.conn;
    if (r->rank == 0 && c->proxy_ip[0] != '\0') {
        pdl_registration_t reg;
        memset(&reg, 0, sizeof(reg));
        reg.type = c->role == PDL_ROLE_PRODUCER ? 'P' : 'D';
        snprintf(reg.http_address, sizeof(reg.http_address), "%s:%d", c->host_ip, c->http_port);
        snprintf(reg.zmq_address, sizeof(reg.zmq_address), "%s", inst->zmq_address);
        reg.dp_size = inst->cfg.dp_size;
        reg.tp_size = inst->tp;
        reg.write_mode = !c->read_mode;
        if (pdl_wire_encode_registration(&reg, &r->svc.ping_payload, err) != PDL_OK)
            goto fail;
    }
    if (pthread_create(&r->svc.thread, NULL, service_main, r) != 0) {
        pdl_error_set(err, PDL_ERR_SYSTEM, "rank %d: cannot start the service thread", r->rank);
        goto fail;
    }
    r->svc.started = true;
    return PDL_OK;
fail:
    if (r->svc.hs_sock)
        zmq_close(r->svc.hs_sock);
    if (r->svc.notify_sock)
        zmq_close(r->svc.notify_sock);
    r->svc.hs_sock = r->svc.notify_sock = NULL;
    if (r->out.wake_fd >= 0)
        close(r->out.wake_fd);
    r->out.wake_fd = -1;
    return err ? err->status : PDL_ERR_TRANSPORT;
}

void pdl__service_stop(pdl_rank_t *r)
{
    if (!r->svc.started) {
        /* Bound by rank init, never started (a later step of create failed). */
        if (r->svc.hs_sock)
            zmq_close(r->svc.hs_sock);
        if (r->svc.notify_sock)
            zmq_close(r->svc.notify_sock);
        r->svc.hs_sock = r->svc.notify_sock = NULL;
        pdl_bytes_free(&r->svc.ping_payload);
        return;
    }
    atomic_store(&r->svc.stop, true);
    uint64_t one = 1;
    if (write(r->out.wake_fd, &one, sizeof(one)) < 0)
        pdl_debug("rank %d: eventfd write at stop: %s", r->rank, strerror(errno));
    pthread_join(r->svc.thread, NULL);
    r->svc.started = false;
    close(r->out.wake_fd);
    r->out.wake_fd = -1;
    pdl_bytes_free(&r->svc.ping_payload);
}
