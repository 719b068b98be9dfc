/*
 * tcp_server.c -- the owner side of the tcp backend: serves READs of registered memory and receives
 * WRITEs into it, straight between the socket and the registered bytes (no intermediate copy) for host
 * memory, through the connection's staging windows (stage.h) for device memory.
 *
 * num_workers server threads each run an epoll loop over their own connections; thread 0 also owns
 * the listening socket and hands each accepted connection to a thread round-robin (through a small
 * queue and an eventfd, so the receiving thread adds it to its own epoll). Sockets are non-blocking and
 * each connection is a state machine, so one slow or hostile peer never stalls the others:
 *
 *   RX_HDR --READ/WRITE--> RX_SEGS --checks ok, READ----> TX (response header + region bytes) --> RX_HDR
 *      |                      |----checks ok, WRITE---> RX_PAYLOAD (readv into region) --> TX --> RX_HDR
 *      |                      `----refused------------> [RX_DRAIN (WRITE payload)] --> TX (error) --> RX_HDR
 *      `--HELLO--> RX_KEY --> TX --> RX_HDR
 *   device memory: RX_SEGS (READ's first window), RX_PAYLOAD (a free window, the last one on the device)
 *      and TX (the next window) --its copy still running--> DEV_WAIT (parked) --copy done--> TX or
 *      RX_PAYLOAD (dev_wait)
 *   authenticated mode (an engine key): RX_HDR --HELLO_AUTH--> RX_KEY --> TX (nonce, MAC) --> RX_HDR
 *      --AUTH--> RX_KEY --MAC ok--> TX --> RX_HDR (served from now on); anything else first, or a wrong
 *      MAC --> TX (PDL_ERR_DENIED) --> closed, counted per peer host, logged once per host.
 *   any state: bad magic/version/op, nseg, total_len or grant_len over the limits, segment lengths not
 *   summing to total_len, or EOF inside a frame → the connection is closed, counted and logged
 *   (rate-limited).
 *
 * RX_SEGS receives the segment table and the grant name together. "checks ok" = a live registration,
 * every segment inside it, and for a guarded registration a grant of that name, op and registration
 * covering every segment (grant.c; docs/security.md); refused otherwise (PDL_ERR_DENIED for the grant).
 * A connection from outside the engine's trusted_hosts is closed at accept, before any state.
 *
 * The grant is checked again at every step that moves the request's bytes, not only when its segment
 * table arrives: a receive that gave up revokes its grant and gives the blocks back while a push may
 * still be on the wire. Each payload system call, and each staging window's device copy of
 * a WRITE, holds the grant of the generation that admitted the request (grant.h); revoke waits until
 * none is held. A WRITE whose grant is gone lands nowhere: the rest of its payload is read away
 * (RX_DRAIN) and it is answered PDL_ERR_DENIED. A READ whose grant is gone before its header left is
 * answered PDL_ERR_DENIED; after, the connection is cut (the header promised the bytes).
 *
 * Out of file descriptors, the listener sheds (accepts and closes at once, with a spare descriptor) or
 * pauses, and logs once per 10 s, instead of spinning (accept_shed).
 *
 * While a request reads or writes a region it holds a reference on it; deregistration shuts down the
 * connections holding one (tcp_server_kick) and waits for the references to drain.
 *
 * Device memory: an admitted request on a CUDA registration runs the same states with its payload in
 * staging windows. READ: the first window is copied before the response header is queued (a failed
 * copy is answered with its error, like a refusal), then TX sends window after window, taking the next
 * (copied while the last was on the socket) when one is out; a copy failing after the header cuts the
 * connection. WRITE: RX_PAYLOAD receives into a window, copies a full one to the device while the
 * next arrives, and answers once every window is on the device; a failed copy is answered with its
 * error after the rest of the payload is read away. The server thread does not wait for these copies:
 * a step whose copy is still running (stage.h, nowait) parks the connection in DEV_WAIT, out of epoll's
 * interest, on its thread's `parked` list; while that list is not empty the thread polls epoll without
 * sleeping and asks each parked connection's stage again after every pass (dev_wait), so the thread's
 * other connections are served meanwhile. Polling costs the thread's core while copies run, as the
 * driver's default spinning synchronisation did; a hang-up of a parked connection closes it, waiting for
 * its copies first. The stage is made at a connection's first device request and freed, its copies
 * finished first, when the connection closes.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "common/clock.h"
#include "common/fdlimit.h"
#include "engine/backend.h"
#include "engine/grant.h"
#include "engine/iov.h"
#include "engine/stage.h"
#include "engine/tcp.h"
#include "engine/tcp_wire.h"

/*
 * Bytes per sendmsg. One call with a whole 64 MiB response ran at 0.6x the TCP-stream ceiling; 1 MiB
 * calls at 1.0-1.2x (4 MiB x 16 READ, loopback, three runs each): a huge call keeps the socket locked
 * while it copies as much as the send buffer takes, so the receiver's ACKs queue up behind it.
 */
#define PDL_TCP_SEND_CALL_MAX (1u << 20)
#define PDL_TCP_RECV_CALL_MAX (256u << 10)

/* Work done on one connection before returning to epoll, so that others get their turn. Small enough
 * that the integration tests (4 MiB batches) cross it, so the return path is exercised. */
#define CONN_TURN_BYTES (1u << 20)

enum { RX_HDR, RX_SEGS, RX_KEY, RX_PAYLOAD, RX_DRAIN, TX, DEV_WAIT };

/* What a connection in DEV_WAIT waits for (the stage call to repeat). */
enum { DEV_OUT_FIRST, DEV_OUT_NEXT, DEV_IN_WINDOW, DEV_IN_END, DEV_IN_FLUSH };

/*
 * The calls that move registered bytes are issued as raw system calls. These accesses are the remote
 * peer's one-sided reads and writes; they are ordered against the owner's own use of the memory by the
 * application's control plane (the peer says "done" over ZeroMQ, the bench over its control socket),
 * i.e. through another process, which ThreadSanitizer cannot see. Its libc interceptors would report
 * every owner write after a served read as a race; the raw syscall is the same kernel operation
 * without the interceptor.
 */
static ssize_t payload_sendmsg(int fd, const struct msghdr *mh, int flags)
{
    return (ssize_t)syscall(SYS_sendmsg, fd, mh, flags);
}

static ssize_t payload_recvmsg(int fd, struct msghdr *mh, int flags)
{
    return (ssize_t)syscall(SYS_recvmsg, fd, mh, flags);
}

typedef struct srv_thread srv_thread_t;

typedef struct srv_conn {
    int fd;
    int st;
    uint32_t events;
    char peer[64];      /* "host:port", for messages */
    char peer_host[64]; /* numeric host alone: whom a grant was served to */
    srv_thread_t *th;
    uint8_t hdr[PDL_TCP_REQ_HDR];
    size_t got;
    pdl_tcp_req_t req;
    uint8_t *segs;
    size_t seg_need;
    pdl_mem_t *mem; /* reference held while reading or writing it; set under srv->mu */
    struct iovec *iov;
    size_t iov_cap, iov_n, iov_i;
    uint64_t payload;
    uint64_t drain_left;
    /* The generation of the grant that admitted the request (0: an open region, none needed). Every
     * step moving its bytes holds the grant (grant.h), and one that finds it revoked moves nothing. */
    uint64_t grant_gen;
    pdl_grant_t *held;            /* held across a WRITE window's device copy (DEV_IN_FLUSH) */
    uint8_t resp[PDL_TCP_RESP_HDR + PDL_TCP_MAX_MSG];
    char key[PDL_TCP_MAX_KEY + PDL_TCP_AUTH_LEN + 1]; /* HELLO's key; HELLO_AUTH's key and nonce; AUTH's MAC */
    /* authenticated mode: */
    bool hello_auth;                              /* HELLO_AUTH answered: nonces set */
    bool authed;                                  /* AUTH verified: requests are served */
    bool close_after;                             /* close once the response is sent (a refusal) */
    uint8_t nonces[2 * PDL_TCP_AUTH_LEN];         /* Nc, Ns */
    uint8_t auth_out[2 * PDL_TCP_AUTH_LEN];       /* HELLO_AUTH's answer: Ns, the owner's MAC */
    struct srv_conn *next, *prev; /* srv->conns */
    struct srv_conn *pend_next;   /* th->pending */
    atomic_bool heard;            /* a whole request header came: not an idle connection */
    bool evicted;                 /* shut down to make room (under srv->mu) */
    /* A request on device memory moves through staging windows (stage.h); the stage is made at the
     * connection's first such request and kept until it closes. */
    pdl_stage_t *stage;
    bool staged;                  /* the current request's payload goes through the stage */
    uint8_t *win;                 /* the current window (pinned host memory) */
    size_t win_len, win_off;
    uint64_t stage_left;          /* WRITE: payload bytes still to receive */
    int dev_step;                 /* DEV_WAIT: DEV_OUT_FIRST ... DEV_IN_FLUSH */
    bool parked;                  /* on th->parked */
    struct srv_conn *park_next, *park_prev;
} srv_conn_t;

struct srv_thread {
    pdl_tcp_server_t *srv;
    int idx;
    int epfd;
    int evfd;
    pthread_t tid;
    bool started;
    srv_conn_t *pending; /* accepted, not yet in this thread's epoll; under srv->mu */
    srv_conn_t *parked;  /* in DEV_WAIT: asked again after every epoll pass; this thread's own */
};

struct pdl_tcp_server {
    pdl_engine_t *e;
    int lfd;
    int nthreads;
    srv_thread_t *th;
    pthread_mutex_t mu; /* conns list, conn->mem, pending queues */
    srv_conn_t *conns;
    size_t nconns, max_conns; /* open data connections, and the most kept (SRV_CONNS_SHARE) */
    size_t nevicting;         /* shut down to make room, not yet closed by their threads */
    _Atomic bool stop;
    int spare_fd;     /* reserve descriptor for shedding at EMFILE (accept_shed); -1 if lost */
    bool lfd_paused;  /* listener out of thread 0's epoll until resume_ms (accept_shed) */
    uint64_t resume_ms;
    unsigned rr;
    size_t send_max; /* bytes per sendmsg */
    uint8_t drain_buf[65536];
};

static void conn_set_mem(pdl_tcp_server_t *srv, srv_conn_t *c, pdl_mem_t *m)
{
    pthread_mutex_lock(&srv->mu);
    pdl_mem_t *old = c->mem;
    c->mem = m;
    pthread_mutex_unlock(&srv->mu);
    if (old)
        pdl__engine_mem_put(old);
}

static void conn_unpark(srv_conn_t *c)
{
    if (!c->parked)
        return;
    if (c->park_prev)
        c->park_prev->park_next = c->park_next;
    else
        c->th->parked = c->park_next;
    if (c->park_next)
        c->park_next->park_prev = c->park_prev;
    c->park_next = c->park_prev = NULL;
    c->parked = false;
}

/* The grant name the current request carries: in c->segs, after its segment table. */
static const char *req_grant(const srv_conn_t *c)
{
    return (const char *)c->segs + (size_t)c->req.nseg * PDL_TCP_SEG;
}

/* Before a step that moves the request's bytes: true when the request needs no grant (*x NULL) or the
 * one that admitted it is still live (*x held until grant_drop); false when it was revoked since. */
static bool grant_hold(srv_conn_t *c, pdl_grant_t **x)
{
    *x = NULL;
    if (c->grant_gen == 0 || c->mem == NULL) /* no grant needed, or no region bytes left to move */
        return true;
    return pdl__grants_enter(&c->th->srv->e->grants, req_grant(c), c->req.grant_len, c->grant_gen, x);
}

static void grant_drop(srv_conn_t *c, pdl_grant_t *x)
{
    if (x != NULL)
        pdl__grants_leave(&c->th->srv->e->grants, x);
    if (x == c->held)
        c->held = NULL;
}

static void conn_close(srv_thread_t *th, srv_conn_t *c)
{
    pdl_tcp_server_t *srv = th->srv;
    conn_unpark(c);
    epoll_ctl(th->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    /* The device copies in flight end before the region's reference is dropped: after deregistration
     * returns, nothing touches it. */
    pdl__stage_destroy(c->stage);
    grant_drop(c, c->held);
    conn_set_mem(srv, c, NULL);
    pthread_mutex_lock(&srv->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->nconns--;
    if (c->evicted)
        srv->nevicting--;
    pthread_mutex_unlock(&srv->mu);
    close(c->fd);
    free(c->segs);
    free(c->iov);
    free(c);
}

/* Hostile or broken framing: log (rate-limited), count, and tell the caller to close. */
static int conn_malformed(srv_conn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int conn_malformed(srv_conn_t *c, const char *fmt, ...)
{
    pdl_engine_t *e = c->th->srv->e;
    atomic_fetch_add(&e->st_conn_malformed, 1);
    uint64_t suppressed = 0;
    if (pdl_ratelimit_allow(&e->rl_malformed, &suppressed)) {
        char why[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        pdl_error("engine %s: closing data connection from %s: %s (%" PRIu64 " similar messages suppressed)", e->key,
                  c->peer, why, suppressed);
    }
    return -1;
}

static bool iov_reserve(srv_conn_t *c, size_t n)
{
    if (n <= c->iov_cap)
        return true;
    struct iovec *v = realloc(c->iov, n * sizeof(*v));
    if (v == NULL)
        return false;
    c->iov = v;
    c->iov_cap = n;
    return true;
}

static void set_events(srv_conn_t *c, uint32_t ev)
{
    if (c->events == ev)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    epoll_ctl(c->th->epfd, EPOLL_CTL_MOD, c->fd, &e);
    c->events = ev;
}

/* A device copy the connection needs is still running: out of epoll's interest (a hang-up is still
 * reported) and onto its thread's parked list, which srv_main asks again after every pass. */
static void conn_park(srv_conn_t *c)
{
    set_events(c, 0);
    if (c->parked)
        return;
    c->park_prev = NULL;
    c->park_next = c->th->parked;
    if (c->park_next)
        c->park_next->park_prev = c;
    c->th->parked = c;
    c->parked = true;
}

/* Wait (without blocking) for the stage call `step` before the connection goes on: DEV_WAIT. */
static int dev_step(srv_conn_t *c, int step)
{
    c->dev_step = step;
    c->st = DEV_WAIT;
    return 1;
}

static void start_response(srv_conn_t *c, int32_t status, const char *msg, uint64_t payload)
{
    size_t mlen = msg ? strlen(msg) : 0;
    if (mlen > PDL_TCP_MAX_MSG)
        mlen = PDL_TCP_MAX_MSG;
    pdl_tcp_resp_t r = {PDL_TCP_RESP_MAGIC, PDL_TCP_VERSION, 0, status, (uint32_t)mlen, c->req.tag, payload};
    pdl_tcp_resp_encode(c->resp, &r);
    if (mlen)
        memcpy(c->resp + PDL_TCP_RESP_HDR, msg, mlen);
    c->iov[0] = (struct iovec){c->resp, PDL_TCP_RESP_HDR + mlen};
    if (payload == 0)
        c->iov_n = 1;
    c->iov_i = 0;
    c->st = TX;
}

static void refuse(srv_conn_t *c, pdl_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void refuse(srv_conn_t *c, pdl_status_t st, const char *fmt, ...)
{
    pdl_engine_t *e = c->th->srv->e;
    char msg[PDL_TCP_MAX_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    atomic_fetch_add(&e->st_requests_refused, 1);
    uint64_t suppressed = 0;
    if (pdl_ratelimit_allow(&e->rl_refused, &suppressed))
        pdl_warn("engine %s: refused request from %s: %s (%" PRIu64 " similar suppressed)", e->key, c->peer, msg,
                 suppressed);
    start_response(c, st, msg, 0);
    if (c->req.op == PDL_TCP_OP_WRITE) {
        c->drain_left = c->req.total_len;
        c->st = c->drain_left ? RX_DRAIN : TX;
    }
}

/* Authenticated mode: answer PDL_ERR_DENIED and close; counted per peer host, logged the first time. */
static int auth_refuse(srv_conn_t *c, const char *why)
{
    pdl_engine_t *e = c->th->srv->e;
    if (pdl__engine_peer_auth_refused(e, c->peer_host))
        pdl_warn("engine %s: refused the data connection from %s: %s (authenticated mode: the peer does not hold "
                 "the cluster key; further refusals from %s are counted, not logged)",
                 e->key, c->peer, why, c->peer_host);
    if (!iov_reserve(c, 1))
        return -1;
    char msg[PDL_TCP_MAX_MSG];
    snprintf(msg, sizeof(msg), "engine %.200s refused the connection: %s (authenticated mode: auth_key_file)", e->key,
             why);
    start_response(c, PDL_ERR_DENIED, msg, 0);
    c->close_after = true;
    return 0;
}

static void auth_mac(const pdl_engine_t *e, const srv_conn_t *c, const char *label, uint8_t *out)
{
    const void *parts[] = {e->key, c->nonces, c->nonces + PDL_TCP_AUTH_LEN};
    size_t lens[] = {strlen(e->key), PDL_TCP_AUTH_LEN, PDL_TCP_AUTH_LEN};
    pdl_auth_mac(e->auth, label, parts, lens, 3, out);
}

/* HELLO_AUTH or AUTH received whole (in c->key); see tcp_wire.h. */
static int on_auth_step(srv_conn_t *c)
{
    pdl_engine_t *e = c->th->srv->e;
    char msg[PDL_TCP_MAX_MSG];
    if (c->req.op == PDL_TCP_OP_AUTH) {
        if (e->auth == NULL)
            return conn_malformed(c, "AUTH, but this engine is not in authenticated mode");
        if (!c->hello_auth || c->authed)
            return auth_refuse(c, "AUTH out of order");
        const void *parts[] = {e->key, c->nonces, c->nonces + PDL_TCP_AUTH_LEN};
        size_t lens[] = {strlen(e->key), PDL_TCP_AUTH_LEN, PDL_TCP_AUTH_LEN};
        if (!pdl_auth_verify(e->auth, PDL_TCP_LABEL_CLIENT, parts, lens, 3, (const uint8_t *)c->key))
            return auth_refuse(c, "its proof of the cluster key is wrong");
        c->authed = true;
        start_response(c, 0, NULL, 0);
        return 0;
    }
    size_t klen = c->req.total_len - PDL_TCP_AUTH_LEN;
    memcpy(c->nonces, c->key + klen, PDL_TCP_AUTH_LEN);
    c->key[klen] = '\0';
    if (e->auth == NULL) {
        snprintf(msg, sizeof(msg), "engine %.200s is not in authenticated mode (no auth_key_file)", e->key);
        start_response(c, PDL_ERR_MISMATCH, msg, 0);
        c->close_after = true;
        return 0;
    }
    if (c->hello_auth)
        return auth_refuse(c, "a second HELLO_AUTH");
    if (strcmp(c->key, e->key) != 0) {
        snprintf(msg, sizeof(msg), "this port belongs to engine %.200s, not %.200s", e->key, c->key);
        start_response(c, PDL_ERR_MISMATCH, msg, 0);
        c->close_after = true;
        return 0;
    }
    pdl_auth_nonce(c->nonces + PDL_TCP_AUTH_LEN);
    memcpy(c->auth_out, c->nonces + PDL_TCP_AUTH_LEN, PDL_TCP_AUTH_LEN);
    auth_mac(e, c, PDL_TCP_LABEL_SERVER, c->auth_out + PDL_TCP_AUTH_LEN);
    c->hello_auth = true;
    c->iov[1] = (struct iovec){c->auth_out, sizeof(c->auth_out)};
    c->iov_n = 2;
    start_response(c, 0, NULL, sizeof(c->auth_out));
    return 0;
}

/*
 * A request admitted on device memory failed in the device copies (stage.h): answer it with the error
 * and read a WRITE's unreceived payload away, so the connection stays in step. Logged (rate-limited)
 * because the owner's device is at fault, not the peer.
 */
static void staged_fail(srv_conn_t *c, const pdl_error_t *err)
{
    pdl_engine_t *e = c->th->srv->e;
    uint64_t suppressed = 0;
    if (pdl_ratelimit_allow(&e->rl_refused, &suppressed))
        pdl_warn("engine %s: request from %s failed: %s (%" PRIu64 " similar suppressed)", e->key, c->peer, err->msg,
                 suppressed);
    if (c->stage != NULL)
        pdl__stage_abort(c->stage);
    grant_drop(c, c->held); /* its copies ended with the abort */
    conn_set_mem(c->th->srv, c, NULL);
    c->staged = false;
    c->iov_n = 1;
    start_response(c, err->status, err->msg, 0);
    if (c->req.op == PDL_TCP_OP_WRITE) {
        c->drain_left = c->stage_left;
        c->st = c->drain_left ? RX_DRAIN : TX;
    }
}

/* Serve the admitted request (c->iov[1..nseg] are its device ranges) through the staging windows: a
 * READ has its first window copied before the response header goes out (DEV_OUT_FIRST), so a device
 * that cannot copy is answered with an error rather than a cut connection. */
static int staged_start(srv_conn_t *c)
{
    pdl_engine_t *e = c->th->srv->e;
    bool rd = c->req.op == PDL_TCP_OP_READ;
    pdl_error_t err;
    pdl_status_t st = PDL_OK;
    if (c->stage == NULL)
        st = pdl__stage_create(((pdl_tcp_engine_t *)e->bk)->drv, e->key, true, &c->stage, &err);
    if (st == PDL_OK)
        st = pdl__stage_begin(c->stage, rd, &c->iov[1], c->req.nseg, &err);
    c->win = NULL;
    c->win_len = c->win_off = 0;
    c->stage_left = c->req.total_len;
    if (st != PDL_OK) {
        staged_fail(c, &err);
        return 0;
    }
    c->staged = true;
    if (rd)
        dev_step(c, DEV_OUT_FIRST);
    else
        c->st = RX_PAYLOAD;
    return 0;
}

/* The segment table is in: check every range against the named registration, then serve or refuse. */
static int on_segs(srv_conn_t *c)
{
    pdl_tcp_server_t *srv = c->th->srv;
    pdl_engine_t *e = srv->e;
    const char *opn = c->req.op == PDL_TCP_OP_READ ? "read" : "write";
    uint64_t sum = 0;
    c->grant_gen = 0;
    for (uint32_t i = 0; i < c->req.nseg; i++) {
        uint64_t len = pdl_tcp_get64(c->segs + (size_t)i * PDL_TCP_SEG + 8);
        if (len > UINT64_MAX - sum)
            return conn_malformed(c, "segment lengths overflow");
        sum += len;
    }
    if (sum != c->req.total_len)
        return conn_malformed(c, "segment lengths sum to %" PRIu64 ", header says %" PRIu64, sum, c->req.total_len);
    if (!iov_reserve(c, (size_t)c->req.nseg + 1))
        return conn_malformed(c, "out of memory for %u segments", c->req.nseg);
    bool was_dead = false;
    pdl_mem_t *m = pdl__engine_mem_get(e, c->req.reg_id, &was_dead);
    if (m == NULL) {
        refuse(c, PDL_ERR_NOT_FOUND, "%s of region %" PRIu64 " of engine %s: %s", opn, c->req.reg_id, e->key,
               was_dead ? "region was deregistered" : "no such registration");
        return 0;
    }
    if (atomic_load(&m->dead)) {
        pdl__engine_mem_put(m);
        refuse(c, PDL_ERR_NOT_FOUND, "%s of region %" PRIu64 " of engine %s: region was deregistered", opn,
               c->req.reg_id, e->key);
        return 0;
    }
    for (uint32_t i = 0; i < c->req.nseg; i++) {
        uint64_t off = pdl_tcp_get64(c->segs + (size_t)i * PDL_TCP_SEG);
        uint64_t len = pdl_tcp_get64(c->segs + (size_t)i * PDL_TCP_SEG + 8);
        /* off <= size and len <= size - off together exclude an overflowing off + len. */
        if (len == 0 || off > m->size || len > m->size - off) {
            pdl__engine_mem_put(m);
            refuse(c, PDL_ERR_INVALID, "%s [%" PRIu64 ", +%" PRIu64 ") outside region %" PRIu64 " of engine %s (size %zu)",
                   opn, off, len, c->req.reg_id, e->key, m->size);
            return 0;
        }
        c->iov[i + 1] = (struct iovec){(uint8_t *)m->ptr + off, len};
    }
    char why[PDL_TCP_MAX_MSG / 2];
    if (atomic_load(&m->guarded) &&
        !pdl__grants_check(&e->grants, req_grant(c), c->req.grant_len, m->id,
                           c->req.op == PDL_TCP_OP_READ ? PDL_GRANT_READ : PDL_GRANT_WRITE, c->segs, c->req.nseg,
                           c->peer_host, &c->grant_gen, why, sizeof(why))) {
        pdl__engine_mem_put(m);
        atomic_fetch_add(&e->st_requests_denied, 1);
        refuse(c, PDL_ERR_DENIED, "%s of region %" PRIu64 " of engine %s denied: %s", opn, c->req.reg_id, e->key, why);
        return 0;
    }
    atomic_fetch_add(&e->st_requests_served, 1);
    pdl__engine_peer_served(e, c->peer_host, c->req.total_len);
    conn_set_mem(srv, c, m);
    c->payload = c->req.total_len;
    if (m->type != PDL_MEM_TYPE_HOST)
        return staged_start(c);
    if (c->req.op == PDL_TCP_OP_READ) {
        c->iov_n = (size_t)c->req.nseg + 1;
        start_response(c, 0, NULL, c->req.total_len);
    } else {
        c->iov_n = (size_t)c->req.nseg + 1;
        c->iov_i = 1;
        c->st = RX_PAYLOAD;
    }
    return 0;
}

static int on_header(srv_conn_t *c)
{
    pdl_tcp_req_decode(c->hdr, &c->req);
    const pdl_tcp_req_t *r = &c->req;
    if (r->magic != PDL_TCP_REQ_MAGIC)
        return conn_malformed(c, "bad magic 0x%08x", r->magic);
    if (r->version != PDL_TCP_VERSION)
        return conn_malformed(c, "protocol version %u, this engine speaks %d", r->version, PDL_TCP_VERSION);
    if (r->grant_len > PDL_GRANT_NAME_MAX)
        return conn_malformed(c, "grant name of %u bytes (at most %d)", r->grant_len, PDL_GRANT_NAME_MAX);
    if (r->op == PDL_TCP_OP_HELLO_AUTH || r->op == PDL_TCP_OP_AUTH) {
        bool hello = r->op == PDL_TCP_OP_HELLO_AUTH;
        uint64_t lo = hello ? PDL_TCP_AUTH_LEN + 1 : PDL_TCP_AUTH_LEN;
        uint64_t hi = hello ? PDL_TCP_AUTH_LEN + PDL_TCP_MAX_KEY : PDL_TCP_AUTH_LEN;
        if (r->nseg != 0 || r->grant_len != 0 || r->total_len < lo || r->total_len > hi)
            return conn_malformed(c, "%s with %u segments, a %u-byte grant name and %" PRIu64 " bytes",
                                  hello ? "HELLO_AUTH" : "AUTH", r->nseg, r->grant_len, r->total_len);
        c->got = 0;
        c->st = RX_KEY;
        return 0;
    }
    /* Authenticated mode: nothing but the two steps above until the peer proved the key. */
    if (c->th->srv->e->auth != NULL && !c->authed)
        return auth_refuse(c, r->op == PDL_TCP_OP_HELLO ? "a plain HELLO (the peer has no auth_key_file?)"
                                                        : "a request before proving the cluster key");
    if (r->op == PDL_TCP_OP_HELLO) {
        if (r->nseg != 0 || r->grant_len != 0 || r->total_len == 0 || r->total_len > PDL_TCP_MAX_KEY)
            return conn_malformed(c, "HELLO with %u segments, a %u-byte grant name and a %" PRIu64 "-byte key",
                                  r->nseg, r->grant_len, r->total_len);
        c->got = 0;
        c->st = RX_KEY;
        return 0;
    }
    if (r->op != PDL_TCP_OP_READ && r->op != PDL_TCP_OP_WRITE)
        return conn_malformed(c, "unknown op %u", r->op);
    if (r->nseg == 0 || r->nseg > PDL_TCP_MAX_SEGS)
        return conn_malformed(c, "%u segments (1..%d allowed)", r->nseg, PDL_TCP_MAX_SEGS);
    if (r->total_len > PDL_TCP_MAX_REQ_BYTES)
        return conn_malformed(c, "request of %" PRIu64 " bytes exceeds the %llu-byte limit", r->total_len,
                              PDL_TCP_MAX_REQ_BYTES);
    /* The segment table and the grant name are received as one block. */
    c->seg_need = (size_t)r->nseg * PDL_TCP_SEG + r->grant_len;
    uint8_t *s = realloc(c->segs, c->seg_need);
    if (s == NULL)
        return conn_malformed(c, "out of memory for %u segments", r->nseg);
    c->segs = s;
    c->got = 0;
    c->st = RX_SEGS;
    return 0;
}

static int on_io_error(srv_conn_t *c, ssize_t n, bool mid_frame)
{
    if (n == 0) {
        if (mid_frame)
            return conn_malformed(c, "connection closed inside a frame");
        return -1; /* orderly close between requests */
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return 1;
    pdl_debug("engine %s: data connection from %s: %s", c->th->srv->e->key, c->peer, strerror(errno));
    return -1;
}

/*
 * The payload movers of conn_progress: each makes one system call and returns 1 (go on), 0 (wait for
 * the next event) or -1 (close the connection); *turn counts the bytes moved this turn.
 */

/*
 * The grant of a WRITE still being received was revoked (the receiving side gave up and may reuse the
 * blocks): no further byte of it lands. The rest of the payload (`left` bytes) is read away into the
 * drain buffer, so the connection stays in step, and the request is answered with PDL_ERR_DENIED.
 */
static void write_revoked(srv_conn_t *c, uint64_t left)
{
    pdl_engine_t *e = c->th->srv->e;
    int glen = c->req.grant_len < 200 ? (int)c->req.grant_len : 200;
    atomic_fetch_add(&e->st_requests_denied, 1);
    conn_set_mem(c->th->srv, c, NULL);
    c->iov_n = 1;
    refuse(c, PDL_ERR_DENIED,
           "write of region %" PRIu64 " of engine %s stopped with %" PRIu64 " of %" PRIu64 " bytes to go: grant %.*s "
           "was revoked meanwhile (its receive gave up); the rest was read away, not written",
           c->req.reg_id, e->key, left, c->req.total_len, glen, req_grant(c));
    c->drain_left = left;
    c->st = left ? RX_DRAIN : TX;
}

/* Bytes of the request's iovecs c->iov[c->iov_i..c->iov_n) still to move. */
static uint64_t iov_left(const srv_conn_t *c)
{
    uint64_t left = 0;
    for (size_t i = c->iov_i; i < c->iov_n; i++)
        left += c->iov[i].iov_len;
    return left;
}

/* A WRITE's payload straight into the registered host memory, each call under the request's grant. */
static int rx_payload(srv_conn_t *c, uint64_t *turn)
{
    pdl_tcp_server_t *srv = c->th->srv;
    struct msghdr mh = {0};
    pdl_grant_t *x;
    if (!grant_hold(c, &x)) {
        write_revoked(c, iov_left(c));
        return 1;
    }
    /* At most PDL_TCP_RECV_CALL_MAX bytes per call, for the reason given for sends. */
    size_t saved;
    size_t k = pdl__iov_cap(&c->iov[c->iov_i], c->iov_n - c->iov_i, IOV_MAX, PDL_TCP_RECV_CALL_MAX, &saved);
    mh.msg_iov = &c->iov[c->iov_i];
    mh.msg_iovlen = k;
    ssize_t n = payload_recvmsg(c->fd, &mh, MSG_DONTWAIT);
    grant_drop(c, x);
    pdl__iov_uncap(&c->iov[c->iov_i], k, saved);
    if (n <= 0)
        return on_io_error(c, n, true) > 0 ? 0 : -1;
    *turn += (uint64_t)n;
    atomic_fetch_add(&srv->e->st_bytes_served, (uint64_t)n);
    pdl__iov_advance(c->iov, &c->iov_i, c->iov_n, (size_t)n);
    if (c->iov_i == c->iov_n) {
        conn_set_mem(srv, c, NULL);
        c->iov_n = 1;
        start_response(c, 0, NULL, 0);
    }
    return 1;
}

/* A WRITE's payload into device memory: received into a staging window, which is copied to the device
 * once full while the next one is received (DEV_IN_WINDOW waits until a buffer is free); answered once
 * every window is on the device (DEV_IN_END). Under a grant, each copy is waited for (DEV_IN_FLUSH). */
static int rx_staged(srv_conn_t *c, uint64_t *turn)
{
    pdl_tcp_server_t *srv = c->th->srv;
    pdl_error_t err;
    if (c->win_off == c->win_len)
        return dev_step(c, DEV_IN_WINDOW);
    size_t want = c->win_len - c->win_off < PDL_TCP_RECV_CALL_MAX ? c->win_len - c->win_off : PDL_TCP_RECV_CALL_MAX;
    ssize_t n = recv(c->fd, c->win + c->win_off, want, MSG_DONTWAIT);
    if (n <= 0)
        return on_io_error(c, n, true) > 0 ? 0 : -1;
    *turn += (uint64_t)n;
    atomic_fetch_add(&srv->e->st_bytes_served, (uint64_t)n);
    c->win_off += (size_t)n;
    c->stage_left -= (uint64_t)n;
    if (c->win_off < c->win_len)
        return 1;
    /* The window's copy to the device runs under the grant until it is known done (DEV_IN_FLUSH), so a
     * revoke returns only after it: the copy and the next window's receive do not overlap then. */
    pdl_grant_t *x;
    if (!grant_hold(c, &x)) {
        pdl__stage_abort(c->stage);
        c->staged = false;
        write_revoked(c, c->stage_left);
        return 1;
    }
    c->held = x;
    if (pdl__stage_in_commit(c->stage, &err) != PDL_OK) {
        staged_fail(c, &err);
        return 1;
    }
    if (x != NULL)
        return dev_step(c, DEV_IN_FLUSH);
    return c->stage_left == 0 ? dev_step(c, DEV_IN_END) : 1;
}

/* The response is out: count a served READ, drop the region, and read the next request (or close
 * after a refusal in authenticated mode). */
static int tx_done(srv_conn_t *c)
{
    if (c->mem != NULL && c->req.op == PDL_TCP_OP_READ)
        atomic_fetch_add(&c->th->srv->e->st_bytes_served, c->payload);
    conn_set_mem(c->th->srv, c, NULL);
    c->staged = false;
    if (c->close_after)
        return -1; /* a refusal in authenticated mode, now delivered */
    c->st = RX_HDR;
    c->got = 0;
    return 1;
}

static int tx_failed(srv_conn_t *c)
{
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        set_events(c, EPOLLOUT);
        return 0;
    }
    pdl_debug("engine %s: data connection from %s: send: %s", c->th->srv->e->key, c->peer, strerror(errno));
    return -1;
}

/*
 * The grant of a READ being sent was revoked (its blocks may be reused): no further byte of the region
 * leaves. Nothing sent yet: the request is answered with PDL_ERR_DENIED. Else the header promised
 * bytes that will not come, so the connection is cut (0 ... -1): the initiator's batch fails.
 */
static int read_revoked(srv_conn_t *c)
{
    pdl_engine_t *e = c->th->srv->e;
    int glen = c->req.grant_len < 200 ? (int)c->req.grant_len : 200;
    atomic_fetch_add(&e->st_requests_denied, 1);
    if (c->iov_i == 0 && c->iov[0].iov_base == (void *)c->resp) {
        if (c->staged)
            pdl__stage_abort(c->stage);
        c->staged = false;
        conn_set_mem(c->th->srv, c, NULL);
        c->iov_n = 1;
        refuse(c, PDL_ERR_DENIED, "read of region %" PRIu64 " of engine %s denied: grant %.*s was revoked before "
               "its bytes were sent", c->req.reg_id, e->key, glen, req_grant(c));
        return 1;
    }
    uint64_t suppressed = 0;
    if (pdl_ratelimit_allow(&e->rl_refused, &suppressed))
        pdl_warn("engine %s: closing the data connection from %s in the middle of a read of region %" PRIu64
                 ": grant %.*s was revoked (%" PRIu64 " similar suppressed)",
                 e->key, c->peer, c->req.reg_id, glen, req_grant(c), suppressed);
    return -1;
}

/* The response header and a READ's payload straight from the registered host memory, each call under
 * the request's grant. */
static int tx_plain(srv_conn_t *c, uint64_t *turn)
{
    pdl_tcp_server_t *srv = c->th->srv;
    struct msghdr mh = {0};
    pdl_grant_t *x;
    if (!grant_hold(c, &x))
        return read_revoked(c);
    /* At most send_max payload bytes per call: the iovec list is cut there (and restored). The
     * response header rides on top of the first call: counting it would leave a 32-byte tail
     * of every MiB-multiple response for a second call, one epoll round later (with the turn
     * limit), while the initiator waits for exactly those bytes (+20% on a 1 MiB READ). */
    size_t cap = srv->send_max + (c->iov_i == 0 ? c->iov[0].iov_len : 0);
    size_t saved;
    size_t k = pdl__iov_cap(&c->iov[c->iov_i], c->iov_n - c->iov_i, IOV_MAX, cap, &saved);
    mh.msg_iov = &c->iov[c->iov_i];
    mh.msg_iovlen = k;
    ssize_t n = payload_sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    grant_drop(c, x);
    pdl__iov_uncap(&c->iov[c->iov_i], k, saved);
    if (n < 0)
        return tx_failed(c);
    *turn += (uint64_t)n;
    pdl__iov_advance(c->iov, &c->iov_i, c->iov_n, (size_t)n);
    return c->iov_i == c->iov_n ? tx_done(c) : 1;
}

/* The response header and a READ's payload from device memory, window by window: the window being
 * sent was copied while the one before it was on the socket, and taking the next one queues the copy
 * of the one after. A copy failing now, with the header promising the bytes, can only cut the
 * connection (the initiator's batch fails and its session breaks). */
static int tx_staged(srv_conn_t *c, uint64_t *turn)
{
    pdl_tcp_server_t *srv = c->th->srv;
    struct iovec v[2];
    size_t k = 0;
    if (c->iov_i == 0)
        v[k++] = c->iov[0];
    size_t wl = c->win_len - c->win_off < srv->send_max ? c->win_len - c->win_off : srv->send_max;
    v[k++] = (struct iovec){c->win + c->win_off, wl};
    struct msghdr mh = {.msg_iov = v, .msg_iovlen = k};
    /* The window was copied before it was handed out, so a send under a live grant sends bytes read
     * while it was live. */
    pdl_grant_t *x;
    if (!grant_hold(c, &x))
        return read_revoked(c);
    ssize_t n = payload_sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    grant_drop(c, x);
    if (n < 0)
        return tx_failed(c);
    *turn += (uint64_t)n;
    size_t done = (size_t)n;
    if (c->iov_i == 0) {
        size_t h = done < c->iov[0].iov_len ? done : c->iov[0].iov_len;
        c->iov[0].iov_base = (uint8_t *)c->iov[0].iov_base + h;
        c->iov[0].iov_len -= h;
        done -= h;
        if (c->iov[0].iov_len == 0)
            c->iov_i = 1;
    }
    c->win_off += done;
    return c->win_off < c->win_len ? 1 : dev_step(c, DEV_OUT_NEXT);
}

/*
 * DEV_WAIT: repeat the stage call the connection waits for, without blocking. Still copying: park the
 * connection (0). Done: carry on as the call's caller would have -- a READ's first window sends the
 * response header (or its failure the error), the next window goes on the socket, a free window takes
 * the WRITE payload, the last WRITE window on the device sends the answer -- with epoll's interest
 * restored for the state it leads to (1), or close (-1): a READ window failing after the header.
 * DEV_IN_FLUSH is DEV_IN_END for one window copied under a grant (rx_staged), then the next window.
 */
static int dev_wait(srv_conn_t *c)
{
    pdl_error_t err;
    pdl_status_t st;
    if (c->dev_step == DEV_IN_END || c->dev_step == DEV_IN_FLUSH)
        st = pdl__stage_in_end(c->stage, &err);
    else if (c->dev_step == DEV_IN_WINDOW)
        st = pdl__stage_in_window(c->stage, &c->win, &c->win_len, &err);
    else
        st = pdl__stage_out_next(c->stage, &c->win, &c->win_len, &err);
    if (st == PDL_INPROGRESS) {
        conn_park(c);
        return 0;
    }
    conn_unpark(c);
    if (st != PDL_OK && c->dev_step == DEV_OUT_NEXT) {
        pdl_warn("engine %s: closing the data connection from %s in the middle of a read: %s", c->th->srv->e->key,
                 c->peer, err.msg);
        return -1;
    }
    if (st != PDL_OK) {
        staged_fail(c, &err);
    } else if (c->dev_step == DEV_OUT_FIRST) {
        start_response(c, 0, NULL, c->req.total_len);
        c->iov_n = 1; /* the header; the payload comes from the windows */
    } else if (c->dev_step == DEV_OUT_NEXT) {
        c->win_off = 0;
        if (c->win_len == 0)
            return tx_done(c);
        c->st = TX;
    } else if (c->dev_step == DEV_IN_WINDOW) {
        c->win_off = 0;
        c->st = RX_PAYLOAD;
    } else if (c->dev_step == DEV_IN_FLUSH && c->stage_left > 0) {
        grant_drop(c, c->held); /* the window is on the device: the next one is asked for */
        c->st = RX_PAYLOAD;
    } else { /* every window on the device (DEV_IN_END, or the last one's DEV_IN_FLUSH) */
        grant_drop(c, c->held);
        c->staged = false;
        conn_set_mem(c->th->srv, c, NULL);
        c->iov_n = 1;
        start_response(c, 0, NULL, 0);
    }
    set_events(c, c->st == TX ? EPOLLOUT : EPOLLIN);
    return 1;
}

/* Advance the connection as far as the socket allows. 0: wait for the next event; -1: close it. */
static int conn_progress(srv_conn_t *c)
{
    pdl_tcp_server_t *srv = c->th->srv;
    pdl_engine_t *e = srv->e;
    uint64_t turn = 0;
    for (;;) {
        if (turn >= CONN_TURN_BYTES && c->st != DEV_WAIT) {
            /* Level-triggered epoll calls us again -- for the direction we are waiting on. (DEV_WAIT is
             * asked now: it parks itself or goes on, and no socket event would come for it.) */
            set_events(c, c->st == TX ? EPOLLOUT : EPOLLIN);
            return 0;
        }
        ssize_t n;
        switch (c->st) {
        case RX_HDR:
            set_events(c, EPOLLIN);
            n = recv(c->fd, c->hdr + c->got, PDL_TCP_REQ_HDR - c->got, MSG_DONTWAIT);
            if (n <= 0) {
                int r = on_io_error(c, n, c->got > 0);
                return r > 0 ? 0 : -1;
            }
            c->got += (size_t)n;
            if (c->got == PDL_TCP_REQ_HDR) {
                atomic_store_explicit(&c->heard, true, memory_order_relaxed);
                if (on_header(c) < 0)
                    return -1;
            }
            break;
        case RX_SEGS:
            n = recv(c->fd, c->segs + c->got, c->seg_need - c->got, MSG_DONTWAIT);
            if (n <= 0) {
                int r = on_io_error(c, n, true);
                return r > 0 ? 0 : -1;
            }
            c->got += (size_t)n;
            if (c->got == c->seg_need && on_segs(c) < 0)
                return -1;
            break;
        case RX_KEY:
            n = recv(c->fd, c->key + c->got, c->req.total_len - c->got, MSG_DONTWAIT);
            if (n <= 0) {
                int r = on_io_error(c, n, true);
                return r > 0 ? 0 : -1;
            }
            c->got += (size_t)n;
            if (c->got == c->req.total_len) {
                if (!iov_reserve(c, 2))
                    return -1;
                if (c->req.op != PDL_TCP_OP_HELLO) {
                    if (on_auth_step(c) < 0)
                        return -1;
                    break;
                }
                c->key[c->got] = '\0';
                if (strcmp(c->key, e->key) != 0) {
                    char msg[PDL_TCP_MAX_MSG];
                    snprintf(msg, sizeof(msg), "this port belongs to engine %.200s, not %.200s", e->key, c->key);
                    start_response(c, PDL_ERR_MISMATCH, msg, 0);
                } else {
                    start_response(c, 0, NULL, 0);
                }
            }
            break;
        case RX_PAYLOAD: {
            int r = c->staged ? rx_staged(c, &turn) : rx_payload(c, &turn);
            if (r <= 0)
                return r;
            break;
        }
        case RX_DRAIN: {
            size_t want = c->drain_left < sizeof(srv->drain_buf) ? (size_t)c->drain_left : sizeof(srv->drain_buf);
            /* The drain buffer is shared by the threads: its contents are never read. */
            n = recv(c->fd, c->th->srv->drain_buf, want, MSG_DONTWAIT | MSG_TRUNC);
            if (n <= 0) {
                int r = on_io_error(c, n, true);
                return r > 0 ? 0 : -1;
            }
            turn += (uint64_t)n;
            c->drain_left -= (uint64_t)n;
            if (c->drain_left == 0)
                c->st = TX;
            break;
        }
        case TX: {
            int r = c->staged ? tx_staged(c, &turn) : tx_plain(c, &turn);
            if (r <= 0)
                return r;
            break;
        }
        case DEV_WAIT: {
            int r = dev_wait(c);
            if (r <= 0)
                return r;
            break;
        }
        }
    }
}

/* The data port keeps at most 1/SRV_CONNS_SHARE of the descriptor limit (at least SRV_CONNS_MIN) as
 * connections: past it, the oldest that never sent a request is shut down to make room, else the new
 * one is closed at once (both counted as shed). Without a bound, idle connections to it took every
 * descriptor the process had (1,100 at ulimit -n 1024), and the rank's ZeroMQ ports then could not be
 * bound again after their pause (listen.c). A peer engine opens a handful of connections. */
#define SRV_CONNS_SHARE 8
#define SRV_CONNS_MIN 64
/* Evicted connections still open (their thread closes them on the hang-up) count against nothing
 * else: without a bound, a flood faster than those threads kept descriptors past the share (EMFILE
 * under ASan with 1,100 connections at ulimit -n 1024, 581 evictions in flight). */
#define SRV_EVICT_MAX 16

/* How long the listener rests when the process is out of descriptors and has no spare to shed with. */
#define ACCEPT_PAUSE_MS 100

/*
 * Out of file descriptors (EMFILE/ENFILE), the pending connection stays queued and level-triggered epoll
 * reports the listener again at once: the accept loop spun at 100 % CPU and logged every failure (43.9 M
 * lines in 5 minutes at `ulimit -n 1024`). libuv's answer (uv__emfile_trick): keep one spare
 * descriptor, give it up to accept the pending connection and close it at once, then take it back. The
 * peer sees its connection closed and fails fast instead of hanging in the queue. Returns true if a
 * connection was shed (the caller keeps accepting); false if there was no spare or nothing left to shed
 * -- then, with the queue maybe not empty, the listener leaves thread 0's epoll for ACCEPT_PAUSE_MS.
 */
static bool accept_shed(pdl_tcp_server_t *srv, int why)
{
    pdl_engine_t *e = srv->e;
    uint64_t suppressed = 0;
    if (pdl_ratelimit_allow(&e->rl_shed, &suppressed))
        pdl_warn("engine %s: accept: %s: out of file descriptors (raise ulimit -n); closing new data connections "
                 "at once (%" PRIu64 " shed so far)",
                 e->key, strerror(why), atomic_load(&e->st_conn_shed));
    bool shed = false;
    if (srv->spare_fd >= 0) {
        close(srv->spare_fd);
        int fd = accept4(srv->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            close(fd);
            atomic_fetch_add(&e->st_conn_shed, 1);
            shed = true;
        }
        /* Another thread may have taken the freed number meanwhile: then we pause instead next time. */
        srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (!shed && !srv->lfd_paused) {
        struct epoll_event ev = {.events = 0, .data.ptr = srv};
        epoll_ctl(srv->th[0].epfd, EPOLL_CTL_MOD, srv->lfd, &ev);
        srv->lfd_paused = true;
        srv->resume_ms = pdl__clock_now_ms() + ACCEPT_PAUSE_MS;
    }
    return shed;
}

/* Thread 0, after a pause: the listener back into its epoll, and the spare retaken if it was lost. */
static void accept_resume(pdl_tcp_server_t *srv)
{
    if (srv->spare_fd < 0)
        srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = srv};
    epoll_ctl(srv->th[0].epfd, EPOLL_CTL_MOD, srv->lfd, &ev);
    srv->lfd_paused = false;
}

static void conn_accept(pdl_tcp_server_t *srv)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(srv->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                if (accept_shed(srv, errno))
                    continue;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
                pdl_warn("engine %s: accept: %s", srv->e->key, strerror(errno));
            }
            return;
        }
        if (srv->e->trusted.n > 0 && !pdl__cidrs_match(&srv->e->trusted, (struct sockaddr *)&ss)) {
            char host[INET6_ADDRSTRLEN] = "?";
            getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), NULL, 0, NI_NUMERICHOST);
            atomic_fetch_add(&srv->e->st_conn_untrusted, 1);
            uint64_t suppressed = 0;
            if (pdl_ratelimit_allow(&srv->e->rl_refused, &suppressed))
                pdl_warn("engine %s: closed a data connection from %s: not in trusted_hosts (%" PRIu64
                         " similar suppressed)", srv->e->key, host, suppressed);
            close(fd);
            continue;
        }
        pthread_mutex_lock(&srv->mu);
        bool full = srv->nconns >= srv->max_conns;
        if (full && srv->nevicting < SRV_EVICT_MAX) {
            /* Room is made by the oldest connection that never sent a request (an idle flood must not
             * keep a peer out); its thread closes it on the hang-up. Only if every one spoke, or
             * SRV_EVICT_MAX are still closing, is the new one shed. */
            srv_conn_t *victim = NULL;
            for (srv_conn_t *o = srv->conns; o; o = o->next)
                if (!o->evicted && !atomic_load_explicit(&o->heard, memory_order_relaxed))
                    victim = o; /* the list is newest first: the last found is the oldest */
            if (victim != NULL) {
                victim->evicted = true;
                srv->nevicting++;
                shutdown(victim->fd, SHUT_RDWR);
                full = false;
                atomic_fetch_add(&srv->e->st_conn_shed, 1);
            }
        }
        pthread_mutex_unlock(&srv->mu);
        if (full) { /* shed: the process' other listeners keep descriptors to accept with */
            close(fd);
            atomic_fetch_add(&srv->e->st_conn_shed, 1);
            uint64_t suppressed = 0;
            if (pdl_ratelimit_allow(&srv->e->rl_shed, &suppressed))
                pdl_warn("engine %s: %zu data connections open, the most kept (1/%d of ulimit -n): closing new "
                         "ones at once (%" PRIu64 " shed so far)",
                         srv->e->key, srv->max_conns, SRV_CONNS_SHARE, atomic_load(&srv->e->st_conn_shed));
            continue;
        }
        srv_conn_t *c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        pdl__tcp_tune_socket(srv->e, fd);
        c->fd = fd;
        c->st = RX_HDR;
        char host[INET6_ADDRSTRLEN] = "?";
        char port[8] = "?";
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
        snprintf(c->peer, sizeof(c->peer), "%s:%s", host, port);
        snprintf(c->peer_host, sizeof(c->peer_host), "%s", host);
        pthread_mutex_lock(&srv->mu);
        srv_thread_t *th = &srv->th[srv->rr++ % (unsigned)srv->nthreads];
        c->th = th;
        c->next = srv->conns;
        if (srv->conns)
            srv->conns->prev = c;
        srv->conns = c;
        srv->nconns++;
        /* Hand over: the owning thread adds it to its own epoll when it drains `pending`. */
        c->pend_next = th->pending;
        th->pending = c;
        pthread_mutex_unlock(&srv->mu);
        uint64_t one = 1;
        ssize_t w = write(th->evfd, &one, sizeof(one));
        (void)w;
    }
}

/* Ask every parked connection's stage again; those whose copies finished go on. When none did, the
 * thread yields before polling again, so a spinning wait leaves the core to others that want it. */
static void srv_poll_parked(srv_thread_t *th)
{
    srv_conn_t *c = th->parked;
    bool moved = false;
    while (c != NULL) {
        srv_conn_t *nx = c->park_next; /* c may unpark, or be closed */
        int r = conn_progress(c);
        moved |= !c->parked || r != 0;
        if (r < 0)
            conn_close(th, c);
        c = nx;
    }
    if (th->parked && !moved)
        sched_yield();
}

static void *srv_main(void *arg)
{
    srv_thread_t *th = arg;
    pdl_tcp_server_t *srv = th->srv;
    struct epoll_event evs[64];
    while (!atomic_load(&srv->stop)) {
        /* Parked connections are polled: epoll is only asked what is ready, never waited on. */
        int timeout = th->parked ? 0 : th->idx == 0 && srv->lfd_paused ? ACCEPT_PAUSE_MS : -1;
        int n = epoll_wait(th->epfd, evs, 64, timeout);
        if (th->idx == 0 && srv->lfd_paused && pdl__clock_now_ms() >= srv->resume_ms)
            accept_resume(srv);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            pdl_error("engine %s: epoll_wait: %s", srv->e->key, strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == (void *)th) { /* eventfd: stop, or new connections */
                uint64_t v;
                ssize_t r = read(th->evfd, &v, sizeof(v));
                (void)r;
                pthread_mutex_lock(&srv->mu);
                srv_conn_t *c = th->pending;
                th->pending = NULL;
                pthread_mutex_unlock(&srv->mu);
                while (c) {
                    srv_conn_t *nx = c->pend_next;
                    c->events = EPOLLIN;
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                    if (epoll_ctl(th->epfd, EPOLL_CTL_ADD, c->fd, &ev) != 0)
                        conn_close(th, c);
                    c = nx;
                }
                continue;
            }
            if (p == (void *)srv) {
                conn_accept(srv);
                continue;
            }
            srv_conn_t *c = p;
            /* A parked connection hears only hang-ups and errors: closing waits for its copies. */
            if ((c->st == DEV_WAIT && (evs[i].events & (EPOLLHUP | EPOLLERR))) || conn_progress(c) < 0)
                conn_close(th, c);
        }
        srv_poll_parked(th);
    }
    return NULL;
}

/* 0 if `name` can be set on a TCP socket of this process, else errno. */
static int cc_settable(const char *name)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno;
    int rc = setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)) == 0 ? 0 : errno;
    close(fd);
    return rc;
}

/*
 * The data sockets carry request/response bursts of up to hundreds of MiB with gaps between them.
 * BBR (this VM's system default) sizes its window from the delivery rate it measures, which those
 * gaps keep low, and paces without a fq qdisc on loopback: a 1 MiB READ took ~2.3x as long under BBR
 * as under cubic or reno (docs/engine.md). A loss-based algorithm keeps the window it has earned.
 * cubic is tried first (the usual Linux default), then reno (always permitted without privileges).
 */
pdl_status_t pdl__tcp_pick_congestion(pdl_engine_t *e, const char *want, pdl_error_t *err)
{
    e->tcp_cc[0] = '\0';
    if (want != NULL && strcmp(want, "system") == 0)
        return PDL_OK;
    if (want == NULL || want[0] == '\0') {
        static const char *const prefs[] = {"cubic", "reno"};
        for (size_t i = 0; i < sizeof(prefs) / sizeof(prefs[0]); i++) {
            if (cc_settable(prefs[i]) == 0) {
                snprintf(e->tcp_cc, sizeof(e->tcp_cc), "%s", prefs[i]);
                return PDL_OK;
            }
        }
        return PDL_OK; /* neither: keep the system default */
    }
    if (strlen(want) >= sizeof(e->tcp_cc))
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: tcp_congestion '%.64s' is too long", e->key, want);
    int en = cc_settable(want);
    if (en != 0)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "engine %s: tcp_congestion '%s' cannot be set: %s (see "
                             "/proc/sys/net/ipv4/tcp_allowed_congestion_control)",
                             e->key, want, strerror(en));
    snprintf(e->tcp_cc, sizeof(e->tcp_cc), "%s", want);
    return PDL_OK;
}

pdl_status_t pdl__tcp_server_start(pdl_engine_t *e, pdl_tcp_server_t **out, pdl_error_t *err)
{
    pdl_tcp_server_t *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    srv->e = e;
    srv->lfd = -1;
    srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    srv->send_max = PDL_TCP_SEND_CALL_MAX;
    uint64_t share = pdl__fd_share(SRV_CONNS_SHARE, SRV_CONNS_MIN);
    srv->max_conns = share > SIZE_MAX ? SIZE_MAX : (size_t)share;
    pthread_mutex_init(&srv->mu, NULL);
    pdl_status_t st;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%u", e->port);
    int rc = getaddrinfo(e->host, port, &hints, &ai);
    if (rc != 0) {
        st = pdl_error_set(err, PDL_ERR_INVALID, "engine %s: cannot resolve host '%s': %s", e->key, e->host,
                           gai_strerror(rc));
        goto fail;
    }
    if (e->bind_all) { /* the wildcard of host's family, same port */
        if (ai->ai_family == AF_INET6)
            ((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr = in6addr_any;
        else
            ((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr = htonl(INADDR_ANY);
    }
    srv->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (srv->lfd < 0 || setsockopt(srv->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(srv->lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(srv->lfd, 512) != 0) {
        st = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: listen on %s:%u%s: %s", e->key, e->host, e->port,
                           e->bind_all ? " (bind_all: every address)" : "", strerror(errno));
        freeaddrinfo(ai);
        goto fail;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    getsockname(srv->lfd, (struct sockaddr *)&ss, &sl);
    e->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);

    srv->th = calloc((size_t)e->num_workers, sizeof(*srv->th));
    if (srv->th == NULL) {
        st = pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
        goto fail;
    }
    srv->nthreads = e->num_workers; /* only now: stop() walks th[0..nthreads) */
    for (int i = 0; i < srv->nthreads; i++) {
        srv->th[i].epfd = srv->th[i].evfd = -1;
    }
    for (int i = 0; i < srv->nthreads; i++) {
        srv_thread_t *th = &srv->th[i];
        th->srv = srv;
        th->idx = i;
        th->epfd = epoll_create1(EPOLL_CLOEXEC);
        th->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (th->epfd < 0 || th->evfd < 0) {
            st = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: epoll/eventfd: %s", e->key, strerror(errno));
            goto fail;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = th};
        epoll_ctl(th->epfd, EPOLL_CTL_ADD, th->evfd, &ev);
        if (i == 0) {
            struct epoll_event lev = {.events = EPOLLIN, .data.ptr = srv};
            epoll_ctl(th->epfd, EPOLL_CTL_ADD, srv->lfd, &lev);
        }
    }
    for (int i = 0; i < srv->nthreads; i++) {
        rc = pthread_create(&srv->th[i].tid, NULL, srv_main, &srv->th[i]);
        if (rc != 0) {
            st = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: pthread_create for server thread %d: %s", e->key, i,
                               strerror(rc));
            goto fail;
        }
        srv->th[i].started = true;
    }
    *out = srv;
    return PDL_OK;

fail: /* stop() undoes any prefix of the above: threads not started, fds still -1, th not allocated */
    pdl__tcp_server_stop(srv);
    return st;
}

void pdl__tcp_server_stop(pdl_tcp_server_t *srv)
{
    if (srv == NULL)
        return;
    atomic_store(&srv->stop, true);
    for (int i = 0; i < srv->nthreads; i++) {
        srv_thread_t *th = &srv->th[i];
        if (th->evfd >= 0) {
            uint64_t one = 1;
            ssize_t w = write(th->evfd, &one, sizeof(one));
            (void)w;
        }
    }
    for (int i = 0; i < srv->nthreads; i++)
        if (srv->th[i].started)
            pthread_join(srv->th[i].tid, NULL);
    /* Threads are gone: close every connection (pending ones too) and drop their references. */
    while (srv->conns) {
        srv_conn_t *c = srv->conns;
        conn_close(c->th, c);
    }
    for (int i = 0; i < srv->nthreads; i++) {
        if (srv->th[i].epfd >= 0)
            close(srv->th[i].epfd);
        if (srv->th[i].evfd >= 0)
            close(srv->th[i].evfd);
    }
    free(srv->th);
    if (srv->lfd >= 0)
        close(srv->lfd);
    if (srv->spare_fd >= 0)
        close(srv->spare_fd);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
}

void pdl__tcp_server_kick(pdl_tcp_server_t *srv, pdl_mem_t *m)
{
    pthread_mutex_lock(&srv->mu);
    for (srv_conn_t *c = srv->conns; c; c = c->next)
        if (c->mem == m)
            shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&srv->mu);
}
