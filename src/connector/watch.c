/*
 * watch.c -- a producer notices that a consumer it holds KV for is gone, and frees those transfers
 * within seconds instead of after defer_timeout (60 s): READ holds and WRITE pushes alike.
 *
 * Why: a decode that is killed (or rejects its request without telling us) never releases, and in
 * WRITE mode never sends the remote_blocks a push waits for. Before, after kill -9 of a decode the
 * prefill held 495 of 496 blocks until the 60 s reaper, and new requests waited for blocks meanwhile.
 *
 * How: holds made with pdl_instance_hold_for name their consumer (the request id's decode address),
 * and so do pushes (pdl_instance_push: the consumer it writes to, "host:handshake base").
 * Rank 0's service thread probes each consumer that has holds with a non-blocking TCP connect to its
 * handshake port, at most once per probe interval (consumer_gone_timeout / 4, at most 1 s), checked
 * without blocking on later ticks. Verdicts per consumer:
 *
 *   connect accepted (not to itself)   -> alive: last_ok = now, refusals = 0
 *   refused (or connected to itself)   -> refusals + 1; gone at 2 in a row (a closed port means no
 *                                         process: two looks one interval apart rule out a restart race)
 *   no answer within the interval      -> counts by time only: gone when nothing answered for
 *                                         consumer_gone_timeout (host down, network cut)
 *
 * READ: a gone consumer's holds are resolved as expired on every rank, which ends each rank's fan-in
 * of them (events RANK_EXPIRED, then FREED). Releases that still come later are parked and dropped like any
 * unknown release. WRITE: each push to it is given up (pdl__push_consumer_gone): ranks still waiting for
 * remote_blocks resolve as expired at once, shares queued on a writer lane fail without writing, and a
 * share being written fails by itself against the dead peer and resolves its rank (FREED with the
 * last). Either way counted per transfer in consumer_gone_freed. A consumer is forgotten when it has no
 * held transfers left.
 *
 * The probe is a plain connect that is closed at once: pdlink and upstream consumers alike listen on a
 * ZeroMQ ROUTER there, which drops a connection that never sends a greeting. Holds made with
 * pdl_instance_hold (no request id) are left to the reaper. With DP > 1 the probed port is the decode
 * address's base (DP rank 0 rank 0), which the request id names; another DP rank's death is not seen.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "connector/internal.h"
#include "common/clock.h"

typedef struct watched {
    char host[PDL_WIRE_HOST_MAX + 1];
    int port;
    int fd; /* a connect in progress, or -1 */
    uint64_t probe_started_ns, next_probe_ns, last_ok_ns;
    int refusals;
    bool seen; /* named by a hold during the current collection */
} watched_t;

static uint64_t probe_interval_ns(const pdl_instance_t *inst)
{
    double t = inst->cfg.conn.consumer_gone_timeout_s / 4.0;
    if (t > 1.0)
        t = 1.0;
    if (t < 0.01)
        t = 0.01;
    return (uint64_t)(t * 1e9);
}

/* "host:port" or "[v6]:port" -> host, port; false if malformed. */
static bool split_key(const char *key, char *host, size_t cap, int *port)
{
    const char *colon = strrchr(key, ':');
    if (colon == NULL || colon == key)
        return false;
    const char *h = key;
    size_t n = (size_t)(colon - key);
    if (key[0] == '[' && n >= 2 && key[n - 1] == ']') {
        h++;
        n -= 2;
    }
    if (n >= cap)
        return false;
    memcpy(host, h, n);
    host[n] = '\0';
    *port = atoi(colon + 1);
    return *port > 0 && *port < 65536;
}

typedef struct collect_ctx {
    pdl_strmap_t *watch;
    uint64_t now_ns;
} collect_ctx_t;

static void collect_consumer(void *arg, const char *key, void *value)
{
    (void)key;
    collect_ctx_t *c = arg;
    const pdl_held_t *h = value;
    if (h->consumer[0] == '\0')
        return;
    watched_t *w = pdl__strmap_get(c->watch, h->consumer);
    if (w == NULL) {
        w = calloc(1, sizeof(*w));
        if (w == NULL || !split_key(h->consumer, w->host, sizeof(w->host), &w->port) ||
            pdl__strmap_put(c->watch, h->consumer, w) != 0) {
            free(w);
            return;
        }
        w->fd = -1;
        w->last_ok_ns = c->now_ns; /* it was alive when it was chosen for the request */
    }
    w->seen = true;
}

static void start_probe(watched_t *w, uint64_t now_ns)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%d", w->port);
    w->probe_started_ns = now_ns;
    if (getaddrinfo(w->host, ps, &hints, &ai) != 0)
        return; /* a name, not an address: left to the reaper (no blocking lookups on this thread) */
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        if (errno == ECONNREFUSED)
            w->refusals++;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    w->fd = fd;
}

/* A finished connect: alive, refused or self-connected (= nothing listens). */
static void finish_probe(watched_t *w, uint64_t now_ns)
{
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    struct sockaddr_storage me, them;
    socklen_t ml = sizeof(me), tl = sizeof(them);
    if (getsockopt(w->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
        soerr = errno;
    if (soerr == 0 && getsockname(w->fd, (struct sockaddr *)&me, &ml) == 0 &&
        getpeername(w->fd, (struct sockaddr *)&them, &tl) == 0 && ml == tl && memcmp(&me, &them, ml) == 0)
        soerr = ECONNREFUSED;
    if (soerr == 0) {
        w->last_ok_ns = now_ns;
        w->refusals = 0;
    } else if (soerr == ECONNREFUSED) {
        w->refusals++;
    }
    close(w->fd);
    w->fd = -1;
}

typedef struct gone_ctx {
    const char *consumer;
    char **ids;
    size_t n, cap;
} gone_ctx_t;

static void collect_held_of(void *arg, const char *key, void *value)
{
    gone_ctx_t *c = arg;
    const pdl_held_t *h = value;
    if (strcmp(h->consumer, c->consumer) != 0)
        return;
    if (c->n == c->cap) {
        size_t nc = c->cap ? 2 * c->cap : 16;
        char **v = realloc(c->ids, nc * sizeof(*v));
        if (v == NULL)
            return; /* the rest is reaped after defer_timeout */
        c->ids = v;
        c->cap = nc;
    }
    if ((c->ids[c->n] = strdup(key)) != NULL)
        c->n++;
}

static void free_holds_of(pdl_rank_t *r0, const char *consumer, const char *why)
{
    pdl_instance_t *inst = r0->inst;
    gone_ctx_t c = {.consumer = consumer};
    pdl__held_foreach(inst, collect_held_of, &c);
    size_t freed = 0;
    for (size_t i = 0; i < c.n; i++) {
        if (!inst->cfg.conn.read_mode) {
            freed += pdl__push_consumer_gone(r0, c.ids[i]);
            free(c.ids[i]);
            continue;
        }
        freed++;
        /* Counted before its events: whoever sees FREED also sees the count. */
        PDL_CTR_ADD(r0, consumer_gone_freed, 1);
        PDL_FOR_LOCAL(inst, k)
            pdl__held_rank_resolved(inst, c.ids[i], k, true);
        free(c.ids[i]);
    }
    /* Only what was given up now: a push given up on an earlier look whose share is still being written
     * keeps its hold, is found again, and is neither logged nor counted twice. */
    if (freed > 0)
        pdl_warn("consumer %s is gone (%s): giving up its %zu held transfers now (blocks freed; a push being "
                 "written, when its write ends)",
                 consumer, why, freed);
    free(c.ids);
}

typedef struct tick_ctx {
    pdl_rank_t *r;
    uint64_t now_ns, interval_ns, gone_ns;
    char *drop[64]; /* keys to forget after the walk (the map may not change during it) */
    char *gone[64];
    int ndrop, ngone;
} tick_ctx_t;

static void tick_one(void *arg, const char *key, void *value)
{
    tick_ctx_t *t = arg;
    watched_t *w = value;
    if (!w->seen) {
        if (t->ndrop < 64)
            t->drop[t->ndrop++] = strdup(key);
        return;
    }
    w->seen = false;
    if (w->fd >= 0) {
        struct pollfd pf = {.fd = w->fd, .events = POLLOUT};
        if (poll(&pf, 1, 0) > 0) {
            finish_probe(w, t->now_ns);
            w->next_probe_ns = t->now_ns + t->interval_ns;
        } else if (pdl__clock_since(t->now_ns, w->probe_started_ns) >= t->interval_ns) {
            close(w->fd); /* no answer: only the time since the last answer counts */
            w->fd = -1;
            w->next_probe_ns = t->now_ns;
        }
    } else if (t->now_ns >= w->next_probe_ns) {
        start_probe(w, t->now_ns);
        if (w->fd < 0)
            w->next_probe_ns = t->now_ns + t->interval_ns;
    }
    bool gone = w->refusals >= 2 || pdl__clock_since(t->now_ns, w->last_ok_ns) >= t->gone_ns;
    if (gone && t->ngone < 64)
        t->gone[t->ngone++] = strdup(key);
}

static void close_watched(watched_t *w)
{
    if (w && w->fd >= 0)
        close(w->fd);
    free(w);
}

void pdl__watch_tick(pdl_rank_t *r, uint64_t now_ns)
{
    pdl_instance_t *inst = r->inst;
    if (r != pdl__rank_first(inst) || inst->cfg.conn.role != PDL_ROLE_PRODUCER || inst->cfg.conn.consumer_gone_timeout_s <= 0)
        return;
    /* Checked every service tick (10-50 ms) while probes are in flight, otherwise every interval/4. */
    if (now_ns < r->svc.next_watch_ns)
        return;
    uint64_t interval = probe_interval_ns(inst);
    r->svc.next_watch_ns = now_ns + interval / 4;
    collect_ctx_t cc = {.watch = &r->svc.watch, .now_ns = now_ns};
    pdl__held_foreach(inst, collect_consumer, &cc);
    tick_ctx_t t = {.r = r,
                    .now_ns = now_ns,
                    .interval_ns = interval,
                    .gone_ns = (uint64_t)(inst->cfg.conn.consumer_gone_timeout_s * 1e9)};
    pdl__strmap_foreach(&r->svc.watch, tick_one, &t);
    for (int i = 0; i < t.ngone; i++) {
        if (t.gone[i] == NULL)
            continue;
        const watched_t *w = pdl__strmap_get(&r->svc.watch, t.gone[i]);
        char why[96];
        if (w && w->refusals >= 2)
            snprintf(why, sizeof(why), "its handshake port refused %d connects in a row", w->refusals);
        else
            snprintf(why, sizeof(why), "no answer for %.1f s", inst->cfg.conn.consumer_gone_timeout_s);
        free_holds_of(r, t.gone[i], why);
        close_watched(pdl__strmap_remove(&r->svc.watch, t.gone[i]));
        free(t.gone[i]);
    }
    for (int i = 0; i < t.ndrop; i++) {
        if (t.drop[i] != NULL)
            close_watched(pdl__strmap_remove(&r->svc.watch, t.drop[i]));
        free(t.drop[i]);
    }
}

static void close_one(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    close_watched(value);
}

void pdl__watch_fini(pdl_rank_t *r)
{
    pdl__strmap_foreach(&r->svc.watch, close_one, NULL);
    pdl__strmap_free(&r->svc.watch);
}
