/*
 * sender.c -- sending notify messages: "tcp://" endpoints, DEALER caches, and the queue through which
 * threads that own no DEALER cache hand messages to their rank's service thread.
 *
 * ZeroMQ sockets are not thread-safe, so each cache belongs to one thread: the service thread's
 * (pdl_rank_svc_t.dealers), the reader's and the writer's (pdl_xfer_side_t.dealers). The reader sends
 * its releases on its own cache: one thread hop less on the release path (measured: the hop cost
 * ~100 us under load on 2 cores).
 *
 * Dead peers: a DEALER whose peer is gone keeps reconnecting, and on loopback a connect to a port
 * nobody listens on can pick that same port as its source (TCP simultaneous open: the socket connects
 * to itself). Linux walks the source ports of repeated connects to one destination, so a DEALER
 * retrying every 100 ms to a dead prefill's notify port inside the ephemeral range (e.g. 40006)
 * eventually connected to itself and held the port: the restarted prefill could not bind it. So the
 * retries back off (100 ms doubling to 5 s, ZMQ_RECONNECT_IVL_MAX) and DEALERs unused for
 * PDL_DEALER_IDLE_MS (internal.h) are closed (pdl__dealers_sweep, run by each owner thread), as are a lane's DEALERs
 * once its peer failed (xfer.c): a dead peer gets a handful of connect attempts, not an endless walk.
 *
 * The budget. Every DEALER is a libzmq socket, and a context has 1,023 by default: without a bound,
 * ~1,100 decode requests naming new notify endpoints (0.5 s of an HTTP client) fill it, after which every
 * pull from a new prefill fails with "Too many open files" for ~75 s. So each DEALER is drawn from the
 * instance's socket budget (budget.h) -- in the small unverified share unless the caller says the peer
 * was verified (PDL_OUT_VERIFIED) -- and a cache holds at most PDL_DEALERS_PER_CACHE. A new DEALER past
 * a bound closes the least recently used one of the same share in its own cache (other threads' caches
 * are not this thread's to touch), with linger 0: a closed socket still lingering would hold its slot,
 * and a flood would then outrun the bound. With nothing to close the message is not sent
 * (dealers_refused). Unverified endpoints can never take more than their share, so verified peers'
 * DEALERs always have room.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "connector/internal.h"
#include "common/clock.h"

#define DEALER_LINGER_MS 1000 /* let releases queued at shutdown reach the producer */
#define DEALER_RECONNECT_MS 100      /* libzmq's default first retry */
#define DEALER_RECONNECT_MAX_MS 5000 /* then doubling up to this */

/* A cached DEALER, when it last sent (its owner thread's clock), and its share of the cap. */
typedef struct dealer {
    void *sock;
    uint64_t used_ns;
    pdl_instance_t *inst;
    bool verified;
} dealer_t;

static void set_int_opt(void *s, int opt, int v) { zmq_setsockopt(s, opt, &v, sizeof(v)); }

int pdl__endpoint(char *buf, size_t cap, const char *host, int port)
{
    int n = strchr(host, ':') ? snprintf(buf, cap, "tcp://[%s]:%d", host, port)
                              : snprintf(buf, cap, "tcp://%s:%d", host, port);
    return (n < 0 || (size_t)n >= cap) ? -1 : n;
}

static pdl_socket_share_t share_of(bool verified) { return verified ? PDL_SOCKETS_VERIFIED : PDL_SOCKETS_UNVERIFIED; }

static void dealer_free(dealer_t *d)
{
    zmq_close(d->sock);
    pdl__budget_put(&d->inst->sockets, share_of(d->verified));
    free(d);
}

static void dealer_close(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    dealer_free(value);
}

typedef struct lru_ctx {
    bool unverified_only;
    const char *key;
    uint64_t used_ns;
} lru_ctx_t;

static void find_lru(void *arg, const char *key, void *value)
{
    lru_ctx_t *c = arg;
    const dealer_t *d = value;
    if ((c->unverified_only && d->verified) || (c->key != NULL && d->used_ns >= c->used_ns))
        return;
    c->key = key;
    c->used_ns = d->used_ns;
}

/* Close this cache's least recently used DEALER (an unverified one when unverified_only, else an
 * unverified one first); false when there is none. */
static bool evict_lru(pdl_rank_t *r, pdl_strmap_t *cache, bool unverified_only)
{
    lru_ctx_t c = {.unverified_only = true};
    pdl__strmap_foreach(cache, find_lru, &c);
    if (c.key == NULL && !unverified_only) {
        c.unverified_only = false;
        pdl__strmap_foreach(cache, find_lru, &c);
    }
    if (c.key == NULL)
        return false;
    char key[PDL_WIRE_HOST_MAX + 32];
    snprintf(key, sizeof(key), "%s", c.key);
    dealer_t *d = pdl__strmap_remove(cache, key);
    set_int_opt(d->sock, ZMQ_LINGER, 0);
    dealer_free(d);
    PDL_CTR_ADD(r, dealers_evicted, 1);
    pdl_debug("rank %d: closed the DEALER to %s to stay under the socket cap", r->rank, key);
    return true;
}

/* Room for one more DEALER of this share, taken from the budget, evicting from `cache` as the top of
 * the file says; false (counted as refused) when nothing could be closed. */
static bool dealer_room(pdl_rank_t *r, pdl_strmap_t *cache, bool verified)
{
    pdl_budget_t *b = &r->inst->sockets;
    if (cache->count >= PDL_DEALERS_PER_CACHE && !evict_lru(r, cache, !verified)) {
        pdl__budget_refused(b, share_of(verified));
        return false;
    }
    while (!pdl__budget_take(b, share_of(verified))) {
        if (!evict_lru(r, cache, !verified)) {
            pdl__budget_refused(b, share_of(verified));
            return false;
        }
    }
    return true;
}

static void *dealer_get(pdl_rank_t *r, pdl_strmap_t *cache, const char *endpoint, bool verified, bool *capped)
{
    dealer_t *d = pdl__strmap_get(cache, endpoint);
    if (d) {
        d->used_ns = pdl__clock_now_ns();
        if (verified && !d->verified) {
            d->verified = true;
            pdl__budget_promote(&r->inst->sockets, PDL_SOCKETS_UNVERIFIED);
        }
        return d->sock;
    }
    if (!dealer_room(r, cache, verified)) {
        *capped = true;
        pdl_socket_stats_t st[PDL_SOCKETS_SHARES];
        pdl__budget_stats(&r->inst->sockets, st);
        PDL_CTR_REFUSED(r, dealers_refused,
                        "notify to %s not sent: the socket budget's %s share is full (%d of %d open, %d verified) "
                        "and none of this thread's DEALERs could be closed",
                        endpoint, st[share_of(verified)].name, st[share_of(verified)].open,
                        st[share_of(verified)].cap, st[PDL_SOCKETS_VERIFIED].open);
        return NULL;
    }
    d = calloc(1, sizeof(*d));
    void *s = d ? zmq_socket(r->inst->zctx, ZMQ_DEALER) : NULL;
    if (s == NULL) {
        free(d);
        pdl__budget_put(&r->inst->sockets, share_of(verified));
        return NULL;
    }
    d->sock = s;
    d->inst = r->inst;
    d->verified = verified;
    d->used_ns = pdl__clock_now_ns();
    set_int_opt(s, ZMQ_LINGER, DEALER_LINGER_MS);
    set_int_opt(s, ZMQ_RECONNECT_IVL, DEALER_RECONNECT_MS);
    set_int_opt(s, ZMQ_RECONNECT_IVL_MAX, DEALER_RECONNECT_MAX_MS);
    set_int_opt(s, ZMQ_SNDHWM, 100000);
    set_int_opt(s, ZMQ_TCP_KEEPALIVE, 1);
    set_int_opt(s, ZMQ_TCP_KEEPALIVE_IDLE, 30);
    set_int_opt(s, ZMQ_TCP_KEEPALIVE_INTVL, 10);
    set_int_opt(s, ZMQ_TCP_KEEPALIVE_CNT, 3);
    /* After a partition: a connect whose SYNs were lost is retried every reconnect interval (<= 5 s)
     * instead of waiting out the kernel's SYN backoff (1, 2, 4, ... s), and a connection whose bytes
     * stay unacknowledged for 20 s (TCP_USER_TIMEOUT) is dropped and reconnected, as the tcp engine's
     * data sockets are (engine/tcp.c). Messages still queued here go out on the new connection. */
    set_int_opt(s, ZMQ_CONNECT_TIMEOUT, 2000);
    set_int_opt(s, ZMQ_TCP_MAXRT, 20000);
    if (strchr(endpoint, '['))
        set_int_opt(s, ZMQ_IPV6, 1);
    pdl_error_t e;
    if (pdl_curve_client(s, r->inst->auth, &e) != PDL_OK) {
        pdl_warn("rank %d: %s: %s", r->rank, endpoint, e.msg);
        dealer_free(d);
        return NULL;
    }
    if (zmq_connect(s, endpoint) != 0 || pdl__strmap_put(cache, endpoint, d) != 0) {
        pdl_warn("rank %d: cannot connect to %s: %s", r->rank, endpoint, zmq_strerror(zmq_errno()));
        dealer_free(d);
        return NULL;
    }
    return s;
}

void *pdl__request_dealer(pdl_instance_t *inst, const char *host, pdl_error_t *err)
{
    void *s = zmq_socket(inst->zctx, ZMQ_DEALER);
    if (s == NULL) {
        pdl_error_set(err, PDL_ERR_TRANSPORT, "no socket for %.64s: %s", host, zmq_strerror(zmq_errno()));
        return NULL;
    }
    set_int_opt(s, ZMQ_LINGER, 0);
    int64_t max = PDL_WIRE_MAX_FRAME;
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    if (strchr(host, ':'))
        set_int_opt(s, ZMQ_IPV6, 1);
    if (pdl_curve_client(s, inst->auth, err) != PDL_OK) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

static void count_kind(pdl_rank_t *r, int kind, int64_t d)
{
    kind = PDL_OUT_KIND(kind);
    if (kind == PDL_OUT_RELEASE)
        r->ctr.v.releases_sent += (uint64_t)d;
    else if (kind == PDL_OUT_KEEPALIVE)
        r->ctr.v.keepalives_sent += (uint64_t)d;
}

bool pdl__dealer_send(pdl_rank_t *r, pdl_strmap_t *cache, const char *endpoint, int kind, const pdl_bytes_t *payload)
{
    bool capped = false;
    void *s = dealer_get(r, cache, endpoint, (kind & PDL_OUT_VERIFIED) != 0, &capped);
    if (capped)
        return false; /* counted and logged by dealer_get */
    /* Counted before the send: once zmq_send returns the peer may already have counted the
     * release, and sent must never lag behind received in a consistent reading. */
    pthread_mutex_lock(&r->ctr.mu);
    count_kind(r, kind, 1);
    pthread_mutex_unlock(&r->ctr.mu);
    bool ok = s && zmq_send(s, payload->data, payload->len, ZMQ_DONTWAIT) >= 0;
    if (ok)
        return true;
    pthread_mutex_lock(&r->ctr.mu);
    count_kind(r, kind, -1);
    r->ctr.v.send_failures++;
    uint64_t sup = 0;
    bool log = pdl_ratelimit_allow(&r->ctr.send_rl, &sup);
    pthread_mutex_unlock(&r->ctr.mu);
    if (log)
        pdl_warn("rank %d: notify to %s failed: %s (socket evicted; %" PRIu64 " similar since)", r->rank, endpoint,
                 s ? zmq_strerror(zmq_errno()) : "no socket", sup);
    if (s)
        dealer_close(NULL, endpoint, pdl__strmap_remove(cache, endpoint));
    return false;
}

void pdl__dealers_close(pdl_strmap_t *cache)
{
    pdl__strmap_foreach(cache, dealer_close, NULL);
    pdl__strmap_free(cache);
}

typedef struct sweep_ctx {
    uint64_t now_ns, idle_ns;
    char *keys[64];
    int n;
} sweep_ctx_t;

static void collect_idle(void *arg, const char *key, void *value)
{
    sweep_ctx_t *c = arg;
    const dealer_t *d = value;
    if (c->n < 64 && (c->idle_ns == 0 || pdl__clock_since(c->now_ns, d->used_ns) >= c->idle_ns))
        c->keys[c->n++] = strdup(key);
}

void pdl__dealers_sweep(pdl_strmap_t *cache, uint64_t now_ns, uint64_t idle_ns)
{
    /* The map may not change during foreach: collect, then close (at most 64 per call; the rest go at
     * the next sweep). */
    sweep_ctx_t c = {.now_ns = now_ns, .idle_ns = idle_ns};
    pdl__strmap_foreach(cache, collect_idle, &c);
    for (int i = 0; i < c.n; i++) {
        if (c.keys[i] != NULL)
            dealer_close(NULL, c.keys[i], pdl__strmap_remove(cache, c.keys[i]));
        free(c.keys[i]);
    }
}

void pdl__outq_init(pdl_outq_t *q)
{
    pthread_mutex_init(&q->mu, NULL);
    q->head = q->tail = NULL;
    q->wake_fd = -1;
}

void pdl__outq_fini(pdl_outq_t *q)
{
    pdl_outmsg_t *o = q->head;
    while (o) {
        pdl_outmsg_t *n = o->next;
        pdl_bytes_free(&o->payload);
        free(o);
        o = n;
    }
    q->head = q->tail = NULL;
    pthread_mutex_destroy(&q->mu);
}

pdl_status_t pdl__outq_send(pdl_rank_t *r, const char *host, int port, int kind, pdl_bytes_t *payload,
                            pdl_error_t *err)
{
    pdl_outmsg_t *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "notify to %.64s:%d: out of memory", host, port);
    if (pdl__endpoint(o->endpoint, sizeof(o->endpoint), host, port) < 0) {
        free(o);
        return pdl_error_set(err, PDL_ERR_INVALID, "notify: host %.64s too long", host);
    }
    o->kind = kind;
    o->payload = *payload;
    payload->data = NULL;
    payload->len = 0;
    pdl_outq_t *q = &r->out;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = o;
    else
        q->head = o;
    q->tail = o;
    pthread_mutex_unlock(&q->mu);
    uint64_t one = 1;
    if (write(q->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        pdl_warn("rank %d: eventfd write: %s", r->rank, strerror(errno));
    return PDL_OK;
}

void pdl__outq_flush(pdl_rank_t *r, pdl_strmap_t *cache)
{
    pthread_mutex_lock(&r->out.mu);
    pdl_outmsg_t *o = r->out.head;
    r->out.head = r->out.tail = NULL;
    pthread_mutex_unlock(&r->out.mu);
    while (o) {
        pdl_outmsg_t *n = o->next;
        pdl__dealer_send(r, cache, o->endpoint, o->kind, &o->payload);
        pdl_bytes_free(&o->payload);
        free(o);
        o = n;
    }
}
