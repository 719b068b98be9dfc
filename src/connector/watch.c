/*
 * watch.c -- an instance notices that a peer a transfer waits on is gone, or was restarted, and ends
 * those transfers within seconds instead of after a timeout (60 s defer, 30 s transfer):
 *
 *   producer: the consumers of its held transfers (READ holds, WRITE pushes) -> freed
 *   consumer in WRITE mode: the producer ranks its receives wait on for write_done -> failed
 *
 * Why: a decode that is killed (or rejects its request without telling us) never releases, and in
 * WRITE mode never sends the remote_blocks a push waits for; a prefill that is killed never sends the
 * write_done a receive waits for. Before, after kill -9 of a decode the prefill held 495 of 496 blocks
 * until the 60 s reaper, and a decode waited out transfer_timeout for a killed prefill.
 *
 * How: holds made with pdl_instance_hold_for name their consumer (the request id's decode address),
 * pushes too (pdl_instance_push: "host:handshake base"); a receive names its producer and so each
 * producer rank it waits on ("host:handshake port of that rank", push_recv.c). Rank 0's service thread
 * probes each named peer at most once per probe interval (consumer_gone_timeout / 4, at most 1 s),
 * without blocking: a TCP connect to its handshake port, then, once that is accepted, pdlink's identity
 * request (PDL_WIRE_GET_IDENTITY) on a DEALER, answered by the peer's service thread with its pid and a
 * fingerprint of its handshake metadata, whose engine key is random per process, and in a frame of its
 * own its age (see "Epochs"). It is counted there in identities_served, not as a handshake (tests and
 * reports count handshakes as the transfers'). Verdicts:
 *
 *   connect accepted (not to itself)   -> alive: refusals = 0
 *   metadata received                  -> its identity; one that differs from the last one seen means
 *                                         a new process on the same address (see "restarts" below)
 *   refused by its host (a TCP reset,  -> refusals + 1; gone at 2 in a row unless other evidence says
 *   or connected to itself)               it lives (see "Evidence")
 *   refused by a filter (ICMP)         -> nothing, as silence (see "Evidence")
 *   no answer within the interval      -> nothing: silence is no proof. A paused peer answers nothing
 *                                         and is alive, and a watcher that was paused itself would
 *                                         judge its peers by its own stall. A host that is down keeps
 *                                         its holds until defer_timeout; the grants protect the
 *                                         blocks either way (a hold given up is refused to readers).
 *
 * Evidence. Refused is not dead: a firewall REJECT, a NetworkPolicy, an agent reloading iptables or a
 * listener paused for descriptors (listen.c pauses a ROUTER for a second) refuse while the process
 * lives, and freeing a live decode's holds fails its pull (before the grant fence, it read reused
 * blocks). So refusals end a peer's items only when nothing else says it lives:
 *
 *   - who refused. A host with no listener on the port answers a SYN with a TCP reset; a filter on
 *     the path (iptables' REJECT by default, a router) with an ICMP port unreachable, which the probe
 *     reads from its error queue (IP_RECVERR). Such a refusal proves as much as silence: not counted.
 *     A filter that answers with a reset (REJECT --reject-with tcp-reset) is caught by the next one.
 *   - its data connections. A process that dies has its sockets closed by its kernel, so an
 *     ESTABLISHED connection between the peer's host and a local rank's tcp engine (READ: the decode
 *     pulls over it, and keeps it between pulls; asked of the kernel, liveness.c) says a process there
 *     lives. Checked at each refusal from the second on; while one is up, the verdict waits.
 *
 * What that costs: the data connections are known by host, not by process, so a dead decode that
 * shares its host with a live one connected to us keeps its holds until another identity answers
 * there (its restart) or defer_timeout; a host that vanished keeps its connections until their
 * keepalive/user timeout ends them (~20 s, engine/tcp.c), and refuses nothing meanwhile anyway. A WRITE
 * producer's pushes and a WRITE consumer's producers have only the first rule (our engine connects
 * out to them). Not used, and why: an identity answered recently (it says nothing about the moment
 * after), the peer's pid on this host (an instance can be destroyed inside a process that lives on,
 * as these tests' restarts are). Whatever a verdict misses, the grants keep a freed block from being
 * read or written (docs/reliability.md), and defer_timeout frees what the watch keeps.
 *
 * Epochs. The identity's second frame says how long ago the answering instance bound its handshake
 * port ("up_ns=N", in its own clock: no clocks are compared between hosts). The answer came after the
 * request was sent (asked_ns), so that instance came up after asked_ns - N in this clock; when that is
 * after a hold was first seen, the hold was made for an earlier process on the address -- killed and
 * restarted before any probe tied the hold to it, even when the hold was the first contact -- and is
 * ended at once. Not applied to items that came while the port refused (born down: the router may
 * give the new process the request; see below), nor on the consumer side (a WRITE decode's receive
 * may be made before its prefill takes the request), nor to peers that send no age (older pdlink:
 * 2 frames; a watcher of an older pdlink reads the 3 frames as no answer and asks get_meta_msg). A
 * decode that comes up in the milliseconds between a prefill's answer and the router's decode leg
 * would lose that request (its pull is refused); a real decode takes seconds from binding its ports
 * to serving requests.
 *
 * Paused, then replaced. An item made while the peer answered, which the peer then stopped answering
 * before any probe tied it (a decode paused, killed and restarted within a second), belongs to the
 * paused process: when another identity answers, it is ended -- unless the port refused in between
 * before the item came (then the item came during the restart and is the new process's).
 *
 * Restarts. A peer restarted faster than two refusals (a second) answers again, so its dead
 * predecessor's transfers looked alive until the timeout. Each transfer ("item") is therefore tied to
 * one incarnation: the identity answered by the first probe that started after the watch first saw
 * the item (a new item makes the next probe start at once). If that probe was refused, the peer died
 * after the transfer was made: the item is DOWN, and the next identity decides (the same one: the
 * listener was only paused; another: it belonged to the dead one). An item of identity X is ended as
 * soon as a probe answers with another identity; an item first seen after the restart takes the new
 * identity and is kept.
 * An item first seen while its peer's port already refuses ("born down": the router chose a decode
 * that was dead or not listening yet; its restarted process may take the request a moment later) is
 * never DOWN, sits out the verdict of that run of refusals (the peer stays watched, its refusals
 * counted again; a second verdict ends it) and is tied to the next identity. Freeing such a hold on the
 * two refusals, or on the next identity as the dead one's, would free it while the restarted decode
 * pulls it: with the shm backend that pull would read blocks already reused. Every probe answered
 * with an identity is counted in watch_identities.
 *
 * Ending an item. Producer, READ: the hold is resolved as expired on every rank, which ends each
 * rank's fan-in of it (events RANK_EXPIRED, then FREED); releases that still come later are parked and
 * dropped like any unknown release. Producer, WRITE: the push is given up (pdl__push_consumer_gone).
 * Either way counted per transfer in consumer_gone_freed. Consumer, WRITE: the consumer ranks waiting
 * on that producer rank fail at once with PDL_ERR_PEER_GONE naming it (pdl__push_producer_gone,
 * counted per receive in producer_gone_failed). A peer is forgotten when nothing names it any more.
 *
 * Both sides ask for identities: a WRITE decode tells a prefill restarted within a second from its
 * dead predecessor, and fails the receives that waited on the dead one at once.
 * Upstream peers do not know the identity request and leave it unanswered (or answer it otherwise). A
 * peer that never answered it is asked twice (one interval each), then: a producer asks that consumer
 * get_meta_msg instead, as before (upstream answers it; it counts as a handshake there), a consumer
 * probes that producer by connect alone (its restarts within a second are then not seen). Nothing is
 * logged above debug for it: an upstream peer is not an error.
 * Holds made with pdl_instance_hold (no request id) are left to the reaper. With DP > 1 a producer
 * probes the decode address's base (DP rank 0 rank 0), which the request id names; another DP rank's
 * death is not seen.
 */
#include <errno.h>
#include <inttypes.h>
#include <time.h> /* before linux/errqueue.h, which uses struct timespec */
#include <linux/errqueue.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "connector/internal.h"
#include "connector/watch.h"
#include "common/clock.h"
#include "common/siphash.h"
#include "engine/liveness.h"

void pdl__watch_set_connect(pdl_instance_t *inst, pdl_watch_connect_fn fn) { atomic_store(&inst->watch_connect, fn); }

#define NO_EPOCH UINT64_MAX /* an identity answered without its age (an older pdlink) */

/* An item's incarnation: not probed yet, tied to an identity, or seen refused before any identity. */
enum { IT_UNKNOWN = 0, IT_OF = 1, IT_DOWN = 2 };

/* What a watched peer is asked once its connect was accepted (see "Upstream peers" above). */
enum { ASK_IDENTITY = 0, ASK_META = 1, ASK_NOTHING = 2 };
#define ASK_SILENT_MAX 2 /* identity requests a peer may leave unanswered before it is asked no more */
/* Connects a peer that never accepted one may leave unanswered before it is probed no more (see
 * "Sockets" above). */
#define CONNECT_SILENT_MAX 3

typedef struct item {
    uint64_t first_seen_ns;
    uint64_t ident; /* IT_OF: the identity it belongs to */
    int state;
    bool born_down; /* first seen while its peer's current run of refusals went on */
    bool came_refused; /* first seen while its peer refused: born down, for good (see "Epochs") */
    bool seen; /* named during the current collection */
} item_t;

typedef struct watched {
    char host[PDL_WIRE_HOST_MAX + 1];
    int port;
    int fd;      /* a connect in progress, or -1 */
    void *zsock; /* a get_meta_msg in flight, or NULL */
    uint64_t probe_started_ns, next_probe_ns;
    uint64_t asked_ns; /* when the identity request in flight was sent: its answer came after that */
    uint64_t ident; /* the last identity answered, 0 = none yet */
    /* Since that identity answered: the start of the first probe it left unanswered, and of the first
     * one refused (0 = none); see judge_item. */
    uint64_t stall_since_ns, refused_since_ns;
    int refusals;
    int ask;        /* ASK_*: what a probe asks once connected */
    int silent;     /* identity requests unanswered while none ever was */
    int silent_connects; /* connects neither accepted nor refused in time, while none ever was accepted */
    pdl_socket_share_t fd_share, z_share; /* the budget shares fd and zsock were drawn from */
    bool accepted;  /* a connect was accepted once */
    bool given_up;  /* never answered: probed no more (its items end by their leases) */
    bool answered;  /* an identity request was answered */
    bool filtered_told, alive_told; /* this run of refusals was logged as a filter's / as overruled */
    bool seen; /* named during the current collection */
    pdl_strmap_t items; /* item key -> item_t* */
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

static void free_item(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    free(value);
}

/* A probe's socket drawn from the budget: the verified share once the peer answered an identity
 * request, else the probe share. False (counted) when there is no room: this look is skipped. */
static bool take_socket(pdl_instance_t *inst, const watched_t *w, pdl_socket_share_t *share)
{
    *share = w->answered ? PDL_SOCKETS_VERIFIED : PDL_SOCKETS_PROBE;
    if (pdl__budget_take(&inst->sockets, *share))
        return true;
    pdl__budget_refused(&inst->sockets, *share);
    return false;
}

static void close_fd(pdl_instance_t *inst, watched_t *w)
{
    close(w->fd);
    w->fd = -1;
    pdl__budget_put(&inst->sockets, w->fd_share);
}

static void close_zsock(pdl_instance_t *inst, watched_t *w)
{
    zmq_close(w->zsock);
    w->zsock = NULL;
    pdl__budget_put(&inst->sockets, w->z_share);
}

static void close_watched(pdl_instance_t *inst, watched_t *w)
{
    if (w == NULL)
        return;
    if (w->fd >= 0)
        close_fd(inst, w);
    if (w->zsock != NULL)
        close_zsock(inst, w);
    pdl__strmap_foreach(&w->items, free_item, NULL);
    pdl__strmap_free(&w->items);
    free(w);
}

/* ---- collection: which peers are named, by which items ------------------------------------------ */

typedef struct collect_ctx {
    pdl_strmap_t *watch;
    uint64_t now_ns;
} collect_ctx_t;

/* Peer `peer` ("host:port") is named by item `key`. */
static void collect_item(void *arg, const char *peer, const char *key)
{
    collect_ctx_t *c = arg;
    watched_t *w = pdl__strmap_get(c->watch, peer);
    if (w == NULL) {
        w = calloc(1, sizeof(*w));
        if (w == NULL || !split_key(peer, w->host, sizeof(w->host), &w->port) ||
            pdl__strmap_put(c->watch, peer, w) != 0) {
            free(w);
            return;
        }
        w->fd = -1;
    }
    w->seen = true;
    item_t *it = pdl__strmap_get(&w->items, key);
    if (it == NULL) {
        it = calloc(1, sizeof(*it));
        if (it == NULL || pdl__strmap_put(&w->items, key, it) != 0) {
            free(it);
            return;
        }
        it->first_seen_ns = c->now_ns;
        it->born_down = it->came_refused = w->refusals > 0;
        if (w->fd < 0 && w->zsock == NULL)
            w->next_probe_ns = c->now_ns; /* tie it to an incarnation soon */
    }
    it->seen = true;
}

static void collect_hold(void *arg, const char *key, void *value)
{
    const pdl_held_t *h = value;
    if (h->consumer[0] != '\0')
        collect_item(arg, h->consumer, key);
}

/* ---- probes ------------------------------------------------------------------------------------- */

/* Whether the refusal just seen on `fd` came from a filter on the path: iptables' REJECT (by default),
 * like any router's, answers a SYN with an ICMP port unreachable, which reaches the probe's error
 * queue with its origin; a host whose port nothing listens on answers with a TCP reset. */
static bool refused_by_filter(int fd)
{
    char cbuf[512], byte;
    struct iovec iov = {&byte, sizeof(byte)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    if (recvmsg(fd, &mh, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
        return false;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
        if ((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
            (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR)) {
            const struct sock_extended_err *ee = (const void *)CMSG_DATA(c);
            if (ee->ee_origin == SO_EE_ORIGIN_ICMP || ee->ee_origin == SO_EE_ORIGIN_ICMP6)
                return true;
        }
    }
    return false;
}

/* A refused connect on `fd`: one more refusal in a row, unless a filter sent it (then it proves as
 * much as silence; see "Evidence" above). */
static void count_refusal(watched_t *w, int fd)
{
    if (!refused_by_filter(fd)) {
        w->refusals++;
        return;
    }
    if (!w->filtered_told)
        pdl_info("watch: connects to %s:%d are refused by a filter on the path (an ICMP port unreachable, as a "
                 "firewall REJECT sends): not taken as its process's death",
                 w->host, w->port);
    w->filtered_told = true;
}

static void start_probe(pdl_instance_t *inst, watched_t *w, uint64_t now_ns)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%d", w->port);
    w->probe_started_ns = now_ns;
    if (getaddrinfo(w->host, ps, &hints, &ai) != 0)
        return; /* a name, not an address: left to the reaper (no blocking lookups on this thread) */
    if (!take_socket(inst, w, &w->fd_share)) {
        freeaddrinfo(ai);
        return;
    }
    w->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (w->fd < 0) {
        pdl__budget_put(&inst->sockets, w->fd_share);
        freeaddrinfo(ai);
        return;
    }
    /* The ICMP error that a filter's REJECT sends lands in the socket's error queue with its origin
     * (refused_by_filter); a TCP reset leaves nothing there. */
    int one = 1;
    if (ai->ai_family == AF_INET6)
        setsockopt(w->fd, SOL_IPV6, IPV6_RECVERR, &one, sizeof(one));
    else
        setsockopt(w->fd, SOL_IP, IP_RECVERR, &one, sizeof(one));
    pdl_watch_connect_fn conn = atomic_load(&inst->watch_connect);
    if ((conn ? conn : connect)(w->fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        if (errno == ECONNREFUSED)
            count_refusal(w, w->fd);
        close_fd(inst, w);
    }
    freeaddrinfo(ai);
}

/* The connect was accepted: ask who answers (the peer's service thread replies). A socket that cannot
 * be set up only costs the identity of this look. */
static void start_identity(pdl_instance_t *inst, watched_t *w)
{
    const char *req = w->ask == ASK_META ? PDL_WIRE_GET_META : PDL_WIRE_GET_IDENTITY;
    if (w->ask == ASK_NOTHING)
        return;
    char ep[PDL_WIRE_HOST_MAX + 32];
    if (pdl__endpoint(ep, sizeof(ep), w->host, w->port) < 0)
        return;
    if (!take_socket(inst, w, &w->z_share))
        return;
    void *s = pdl__request_dealer(inst, w->host, NULL);
    if (s == NULL) {
        pdl__budget_put(&inst->sockets, w->z_share);
        return;
    }
    w->asked_ns = pdl__clock_now_ns();
    if (zmq_connect(s, ep) != 0 || zmq_send(s, req, strlen(req), ZMQ_DONTWAIT) < 0) {
        zmq_close(s);
        pdl__budget_put(&inst->sockets, w->z_share);
        return;
    }
    w->zsock = s;
}

/* The reply ["", who] or ["", who, "up_ns=N"] (service.c), when it came: the fingerprint of `who`
 * (never 0), else 0; *up_ns gets N, or NO_EPOCH when the peer sent no age (get_meta_msg, an older
 * pdlink). */
static uint64_t take_identity(void *s, uint64_t *up_ns)
{
    static const uint8_t key[PDL_SIPHASH_KEY_LEN] = {0}; /* a fingerprint, not a secret */
    uint64_t ident = 0;
    int part = 0, more = 1;
    *up_ns = NO_EPOCH;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return 0;
        }
        more = zmq_msg_more(&m);
        if (part == 1)
            ident = pdl__siphash24(key, zmq_msg_data(&m), zmq_msg_size(&m)) | 1;
        if (part == 2) {
            char age[40];
            size_t n = zmq_msg_size(&m) < sizeof(age) - 1 ? zmq_msg_size(&m) : sizeof(age) - 1;
            memcpy(age, zmq_msg_data(&m), n);
            age[n] = '\0';
            if (sscanf(age, "up_ns=%" SCNu64, up_ns) != 1)
                *up_ns = NO_EPOCH;
        }
        part++;
        zmq_msg_close(&m);
    }
    return part == 2 || part == 3 ? ident : 0;
}

/* A finished connect: alive, refused or self-connected (= nothing listens). */
static void finish_probe(pdl_instance_t *inst, watched_t *w)
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
    if (soerr == ECONNREFUSED)
        count_refusal(w, w->fd);
    close_fd(inst, w);
    if (soerr == 0) {
        w->refusals = 0;
        w->filtered_told = w->alive_told = false;
        w->accepted = true;
        w->silent_connects = 0;
        start_identity(inst, w);
    }
}

/* ---- verdicts ------------------------------------------------------------------------------------ */

typedef struct verdict_ctx {
    watched_t *w;
    uint64_t ident; /* the identity answered; 0 = the probe was refused */
    uint64_t up_ns; /* how long ago the answering instance came up, NO_EPOCH = not told */
    bool producer;  /* epochs judge holds only (see "Epochs") */
    char **end;     /* items of a dead incarnation */
    size_t n, cap;
} verdict_ctx_t;

static void push_key(verdict_ctx_t *v, const char *key)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? 2 * v->cap : 16;
        char **nv = realloc(v->end, nc * sizeof(*nv));
        if (nv == NULL)
            return; /* ended by the next identity change, or the timeouts */
        v->end = nv;
        v->cap = nc;
    }
    if ((v->end[v->n] = strdup(key)) != NULL)
        v->n++;
}

/* One probe's answer (started at w->probe_started_ns) applied to one item. */
static void judge_item(void *arg, const char *key, void *value)
{
    verdict_ctx_t *v = arg;
    item_t *it = value;
    bool probed_since = it->first_seen_ns <= v->w->probe_started_ns; /* the probe started after it was seen */
    if (v->ident == 0) { /* refused */
        if (it->state == IT_UNKNOWN && probed_since && !it->born_down)
            it->state = IT_DOWN;
        return;
    }
    /* The instance answering came up after the item was first seen (asked - its age > first seen):
     * the item was made for an earlier one. Not for an item born down (see "Epochs"). */
    if (v->producer && v->up_ns != NO_EPOCH && !it->came_refused &&
        pdl__clock_since(v->w->asked_ns, it->first_seen_ns) > v->up_ns) {
        push_key(v, key);
        return;
    }
    it->born_down = false; /* the run of refusals is over */
    if (it->state == IT_OF && it->ident != v->ident) {
        push_key(v, key);
    } else if (it->state == IT_DOWN) {
        if (v->w->ident != 0 && v->w->ident == v->ident) {
            it->state = IT_OF; /* the same process answers again: its listener was only paused */
            it->ident = v->ident;
        } else {
            push_key(v, key);
        }
    } else if (it->state == IT_UNKNOWN && v->w->ident != 0 && v->w->ident != v->ident && v->w->stall_since_ns != 0 &&
               (v->w->refused_since_ns == 0 || it->first_seen_ns < v->w->refused_since_ns)) {
        /* The process that answered last stopped answering (paused, or dying) and another answers
         * now; the item came while the port never refused, so the old process held it: it is gone. */
        push_key(v, key);
    } else if (it->state == IT_UNKNOWN && probed_since) {
        it->state = IT_OF;
        it->ident = v->ident;
    }
}

/* ---- ending items -------------------------------------------------------------------------------- */

/* Producer: give up held transfer `id` whose consumer is gone. True when it was given up now (a push
 * given up on an earlier look whose share is still being written is found again: not counted twice). */
static bool end_hold(pdl_rank_t *r0, const char *id)
{
    pdl_instance_t *inst = r0->inst;
    if (!inst->cfg.conn.read_mode)
        return pdl__push_consumer_gone(r0, id);
    if (!pdl__held_exists(inst, id))
        return false;
    /* Counted before its events: whoever sees FREED also sees the count. */
    PDL_CTR_ADD(r0, consumer_gone_freed, 1);
    PDL_FOR_LOCAL(inst, k)
        pdl__held_rank_resolved(inst, id, k, true); /* ends the rank's fan-in of it too */
    return true;
}

/* End items keys[0..n) of peer `peer` ("host:port"), freeing the keys. */
static void end_items(pdl_rank_t *r0, const char *peer, char **keys, size_t n, const char *why)
{
    pdl_instance_t *inst = r0->inst;
    bool producer = inst->cfg.conn.role == PDL_ROLE_PRODUCER;
    size_t ended = 0;
    for (size_t i = 0; i < n; i++) {
        if (producer) {
            ended += end_hold(r0, keys[i]);
        } else {
            /* "producer rank|transfer id" */
            char *bar = strchr(keys[i], '|');
            if (bar != NULL && pdl__push_producer_gone(r0, bar + 1, atoi(keys[i]), peer, why))
                ended++;
        }
        free(keys[i]);
    }
    if (ended == 0)
        return;
    if (producer)
        pdl_warn("consumer %s is gone (%s): giving up its %zu held transfers now (blocks freed; a push being "
                 "written, when its write ends)",
                 peer, why, ended);
    else
        pdl_warn("producer %s is gone (%s): %zu receives waiting for its write_done failed now", peer, why, ended);
}

static void clear_born_down(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    ((item_t *)value)->born_down = false;
}

/* Every item of a gone peer, but those first seen during its run of refusals (see "born down"). */
static void gone_keys(void *arg, const char *key, void *value)
{
    const item_t *it = value;
    if (!it->born_down)
        push_key(arg, key);
}

/* ---- the tick ------------------------------------------------------------------------------------ */

typedef struct tick_ctx {
    pdl_rank_t *r;
    uint64_t now_ns, interval_ns;
    char *drop[64]; /* keys to forget after the walk (the map may not change during it) */
    char *gone[64];
    char *changed[64]; /* peers whose probe answered (an identity, or a refusal) */
    uint64_t changed_ident[64], changed_up[64];
    int ndrop, ngone, nchanged;
} tick_ctx_t;

static void forget_unseen_items(void *arg, const char *key, void *value)
{
    verdict_ctx_t *v = arg;
    item_t *it = value;
    if (!it->seen)
        push_key(v, key);
    it->seen = false;
}

/* A connect left unanswered by a peer that never accepted one: after CONNECT_SILENT_MAX in a row it is
 * probed no more. */
static void give_up_silent(watched_t *w, const char *key)
{
    if (w->accepted || ++w->silent_connects < CONNECT_SILENT_MAX)
        return;
    w->given_up = true;
    pdl_debug("watch: %s never answered a connect (%d in a row): not probed any more; its transfers end by "
              "their leases",
              key, w->silent_connects);
}

/* Established data connections between the peer's host and a local rank's tcp engine (see
 * "Evidence"): the peer's refusals are then no proof of its death. Logged once per run of refusals. */
static bool lives_elsewhere(pdl_instance_t *inst, watched_t *w, const char *key)
{
    int n = 0;
    PDL_FOR_LOCAL(inst, k)
    {
        pdl_engine_t *e = inst->ranks[k].mem.engine;
        uint16_t port = e != NULL ? pdl_engine_port(e) : 0;
        int c = port != 0 ? pdl__tcp_established(port, w->host) : 0;
        if (c > 0)
            n += c;
    }
    if (n > 0 && !w->alive_told)
        pdl_info("watch: %s refused %d connects in a row, but %d data connections from %s to this instance's "
                 "engine are established: taken as a live peer whose handshake port is filtered or paused, "
                 "not as gone",
                 key, w->refusals, n, w->host);
    w->alive_told = w->alive_told || n > 0;
    return n > 0;
}

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
    verdict_ctx_t unseen = {.w = w}; /* items no longer named: their transfer ended */
    pdl__strmap_foreach(&w->items, forget_unseen_items, &unseen);
    for (size_t k = 0; k < unseen.n; k++) {
        free(pdl__strmap_remove(&w->items, unseen.end[k]));
        free(unseen.end[k]);
    }
    free(unseen.end);
    int refusals_before = w->refusals;
    uint64_t ident = 0, up = NO_EPOCH;
    if (w->zsock != NULL) {
        zmq_pollitem_t it = {.socket = w->zsock, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 0) > 0 && (it.revents & ZMQ_POLLIN))
            ident = take_identity(w->zsock, &up);
        if (ident != 0) {
            w->answered = true;
            close_zsock(t->r->inst, w);
        } else if (pdl__clock_since(t->now_ns, w->probe_started_ns) >= t->interval_ns) {
            close_zsock(t->r->inst, w); /* no answer in time: this look only proved the port open */
            if (w->answered && w->ident != 0 && w->stall_since_ns == 0)
                w->stall_since_ns = w->probe_started_ns;
            if (!w->answered && w->ask == ASK_IDENTITY && ++w->silent >= ASK_SILENT_MAX) {
                bool producer = t->r->inst->cfg.conn.role == PDL_ROLE_PRODUCER;
                w->ask = producer ? ASK_META : ASK_NOTHING;
                pdl_debug("watch: %s does not answer pdlink's identity request (an upstream peer?): %s", key,
                          producer ? "asking it get_meta_msg instead" : "probing it by connect only");
            }
        }
    } else if (w->fd >= 0) {
        struct pollfd pf = {.fd = w->fd, .events = POLLOUT};
        if (poll(&pf, 1, 0) > 0) {
            finish_probe(t->r->inst, w);
            w->next_probe_ns = t->now_ns + t->interval_ns;
        } else if (pdl__clock_since(t->now_ns, w->probe_started_ns) >= t->interval_ns) {
            close_fd(t->r->inst, w); /* no answer: only the time since the last answer counts */
            w->next_probe_ns = t->now_ns;
            give_up_silent(w, key);
        }
    } else if (!w->given_up && t->now_ns >= w->next_probe_ns) {
        start_probe(t->r->inst, w, t->now_ns);
        if (w->fd < 0)
            w->next_probe_ns = t->now_ns + t->interval_ns;
    }
    if (w->refusals > refusals_before) {
        PDL_CTR_ADD(t->r, watch_refused, 1);
        if (w->ident != 0 && w->refused_since_ns == 0)
            w->refused_since_ns = w->probe_started_ns;
    }
    if ((ident != 0 || w->refusals > refusals_before) && t->nchanged < 64) {
        t->changed_ident[t->nchanged] = ident;
        t->changed_up[t->nchanged] = up;
        t->changed[t->nchanged++] = strdup(key);
    }
    /* Silence is no proof: a paused peer (or a watcher that was paused itself) answers nothing for a
     * while and is alive. Only a closed port is, while nothing else says the peer lives (see
     * "Evidence"); identities catch restarts (judge_item). */
    bool gone = w->refusals >= 2 && w->refusals > refusals_before && !lives_elsewhere(t->r->inst, w, key);
    if (gone && t->ngone < 64)
        t->gone[t->ngone++] = strdup(key);
}

/* A probe of `peer` answered: apply it to the peer's items; end those of a dead incarnation. */
static void apply_answer(pdl_rank_t *r0, watched_t *w, const char *peer, uint64_t ident, uint64_t up_ns)
{
    verdict_ctx_t v = {.w = w, .ident = ident, .up_ns = up_ns,
                       .producer = r0->inst->cfg.conn.role == PDL_ROLE_PRODUCER};
    pdl__strmap_foreach(&w->items, judge_item, &v);
    if (ident != 0) {
        PDL_CTR_ADD(r0, watch_identities, 1);
        w->ident = ident;
        w->stall_since_ns = w->refused_since_ns = 0;
    }
    for (size_t i = 0; i < v.n; i++)
        free(pdl__strmap_remove(&w->items, v.end[i]));
    end_items(r0, peer, v.end, v.n,
              "another process answers on its handshake port, or one that came up after the hold was made: it "
              "was restarted");
    free(v.end);
}

static void collect(pdl_rank_t *r, uint64_t now_ns)
{
    pdl_instance_t *inst = r->inst;
    collect_ctx_t cc = {.watch = &r->svc.watch, .now_ns = now_ns};
    if (inst->cfg.conn.role == PDL_ROLE_PRODUCER) {
        pdl__held_foreach(inst, collect_hold, &cc);
    } else {
        pdl__push_watch_producers(inst, collect_item, &cc);
    }
}

void pdl__watch_tick(pdl_rank_t *r, uint64_t now_ns)
{
    pdl_instance_t *inst = r->inst;
    bool consumer_write = inst->cfg.conn.role == PDL_ROLE_CONSUMER && !inst->cfg.conn.read_mode;
    if (r != pdl__rank_first(inst) || (inst->cfg.conn.role != PDL_ROLE_PRODUCER && !consumer_write) ||
        inst->cfg.conn.consumer_gone_timeout_s <= 0)
        return;
    /* Checked every service tick (10-50 ms) while probes are in flight, otherwise every interval/4. */
    if (now_ns < r->svc.next_watch_ns)
        return;
    uint64_t interval = probe_interval_ns(inst);
    r->svc.next_watch_ns = now_ns + interval / 4;
    collect(r, now_ns);
    tick_ctx_t t = {.r = r,
                    .now_ns = now_ns,
                    .interval_ns = interval};
    pdl__strmap_foreach(&r->svc.watch, tick_one, &t);
    for (int i = 0; i < t.nchanged; i++) {
        watched_t *w = t.changed[i] ? pdl__strmap_get(&r->svc.watch, t.changed[i]) : NULL;
        if (w != NULL)
            apply_answer(r, w, t.changed[i], t.changed_ident[i], t.changed_up[i]);
        free(t.changed[i]);
    }
    for (int i = 0; i < t.ngone; i++) {
        watched_t *w = t.gone[i] ? pdl__strmap_get(&r->svc.watch, t.gone[i]) : NULL;
        if (w != NULL) {
            char why[96];
            snprintf(why, sizeof(why), "its handshake port refused %d connects in a row", w->refusals);
            verdict_ctx_t v = {.w = w};
            pdl__strmap_foreach(&w->items, gone_keys, &v);
            for (size_t k = 0; k < v.n; k++)
                free(pdl__strmap_remove(&w->items, v.end[k]));
            end_items(r, t.gone[i], v.end, v.n, why);
            free(v.end);
            if (w->items.count == 0) {
                close_watched(inst, pdl__strmap_remove(&r->svc.watch, t.gone[i]));
            } else {
                /* Items born down sat this verdict out: the next run of refusals (or an identity)
                 * judges them, keeping the identity seen before. */
                pdl__strmap_foreach(&w->items, clear_born_down, NULL);
                w->refusals = 0;
            }
        }
        free(t.gone[i]);
    }
    for (int i = 0; i < t.ndrop; i++) {
        if (t.drop[i] != NULL)
            close_watched(inst, pdl__strmap_remove(&r->svc.watch, t.drop[i]));
        free(t.drop[i]);
    }
}

size_t pdl__watch_identity(const pdl_rank_t *r, char *buf, size_t cap)
{
    static const uint8_t key[PDL_SIPHASH_KEY_LEN] = {0}; /* a fingerprint, not a secret */
    uint64_t fp = pdl__siphash24(key, r->mem.meta_payload.data, r->mem.meta_payload.len);
    int n = snprintf(buf, cap, "pid=%ld meta=%016" PRIx64, (long)getpid(), fp);
    if (n < 0 || cap == 0)
        return 0;
    return (size_t)n < cap ? (size_t)n : cap - 1;
}

static void close_one(void *arg, const char *key, void *value)
{
    (void)key;
    close_watched(arg, value);
}

void pdl__watch_fini(pdl_rank_t *r)
{
    pdl__strmap_foreach(&r->svc.watch, close_one, r->inst);
    pdl__strmap_free(&r->svc.watch);
}
