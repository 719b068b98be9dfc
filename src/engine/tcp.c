/*
 * tcp.c -- transfer backend over plain TCP, initiator side, and the backend's ops table.
 *
 * A session owns qp_per_transfer connections to the remote engine, each opened with a HELLO naming the
 * engine it expects (a port reused by another engine is refused). A batch is cut into up to that many
 * chunks of about equal bytes (engine.c); chunk i goes to connection i as requests of at most
 * PDL_TCP_MAX_SEGS segments / PDL_TCP_MAX_REQ_BYTES.
 *
 * No hand-off on the hot path: each connection keeps a queue of the chunks ("ops") whose responses are
 * still due, in request order, and whichever thread needs one of them done moves the bytes itself.
 * pdl_session_post sends the requests at once from the posting thread (non-blocking: what the socket
 * does not take now is sent later by a driver); pdl_batch_wait then receives the response straight
 * into the local ranges in the waiting thread, and pdl_batch_poll does a non-blocking pass. So a
 * stop-and-wait batch costs one round trip and two thread wake-ups (the owner's server thread and the
 * waiter), not the four of a worker hand-off. Several batches may be in flight on one connection
 * (pipelining): responses arrive in order, and a thread waiting for a later batch completes the earlier
 * ones on the way. Chunks 1.. of a striped batch of 1 MiB chunks or more are driven by the engine's
 * workers so the receive copies of different connections run in parallel; smaller ones by the waiter.
 *
 * Per connection, one thread at a time sends (tx_busy) and one receives (rx_busy); the flags and the
 * queue are under the connection's mutex, the system calls are made without it. A driver with
 * nothing to send blocks in recvmsg(MSG_WAITALL) (SO_RCVTIMEO slices, so a deadline or a cancel is
 * noticed) and otherwise poll()s for whichever direction it waits on. Bytes go straight between the
 * socket and the registered memory (IOV_MAX iovecs, at most 1 MiB per sendmsg and 256 KiB per recvmsg).
 *
 * Device memory (a CUDA registration, where the driver loads: cudadrv.h) is never touched by the CPU:
 * a session whose local region is on the device gives each connection two stages (stage.h), and a
 * WRITE's payload is sent from staging windows filled by the GPU a window ahead, a READ's response
 * received into windows copied to the device while the next one arrives; a response's op completes
 * only once its last window is on the device. The owner's side is tcp_server.c's business: the wire
 * format does not change.
 *
 * Failure model: a refused request (unknown region, range outside it) fails its batch with the owner's
 * message and leaves the connection usable. Any I/O error, EOF or malformed response loses the
 * framing: the connection is shut down, every op still queued on it fails (once no thread is inside a
 * system call on it, so no failed batch's memory is written after its waiter returns) and the session
 * becomes broken (sticky): PDL_ERR_PEER_GONE "peer gone" for EOF/reset/refused connections,
 * PDL_ERR_TRANSPORT otherwise (a local device copy that fails too: the bytes promised on the wire
 * cannot follow). A stalled owner never hangs the caller: pdl_batch_wait stops at its
 * deadline and leaves the batch queued; freeing a running batch shuts the session's sockets down and
 * drives the batch to its failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "engine/backend.h"
#include "engine/iov.h"
#include "engine/stage.h"
#include "engine/tcp.h"
#include "engine/tcp_wire.h"

#define TCP_CONNECT_TIMEOUT_MS 5000
/* Below this a batch is not striped: one request on one connection beats a second connection (with
 * --qp 2 here: 256 KiB x 1 took 42 us on one connection, 80-170 us striped; one more server thread
 * to wake on two vCPUs). */
#define TCP_STRIPE_MIN_BYTES (1u << 20)
/* Chunks 1.. of a striped batch go to a worker (parallel receive copies) only from this size on;
 * smaller ones are received by the waiting thread after chunk 0 (their bytes wait in the socket
 * buffer meanwhile): a worker hand-off and wake-up cost more than a copy of less than 1 MiB. */
#define TCP_POOL_MIN_BYTES (1u << 20)
/* A blocking receive returns after this long without data, so the driver can check its deadline. */
#define TCP_RCV_SLICE_MS 10

typedef struct cursor {
    size_t i, end;
    uint64_t skip;
} cursor_t;

struct tcp_op;

typedef struct tcp_conn {
    int fd;
    int ci;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* op completed, I/O turn released, connection failed */
    int waiters;                /* threads waiting on cv */
    struct tcp_op *head, *tail; /* ops not yet complete, in request order */
    struct tcp_op *txq;         /* first op with requests still to start */
    bool tx_busy, rx_busy;      /* a thread is sending / receiving (outside mu) */
    pdl_status_t dead;          /* the connection failed: every op still queued fails with this */
    char dead_msg[PDL_ERR_MSG_LEN];
    uint64_t tag_tx, tag_rx;
    /* tx: the request being sent (header + segment table, then a WRITE's payload) */
    bool tx_active;
    struct tcp_op *tx_op;
    uint8_t *frame;
    size_t frame_len, frame_off;
    cursor_t tx_pay;
    uint64_t tx_pay_left;
    struct iovec txv[IOV_MAX];
    /* rx: the response being received */
    int rx_stage;
    struct tcp_op *rx_op; /* op rxc belongs to */
    cursor_t rxc;         /* start of rx_op's next request */
    uint8_t rx_hdr[PDL_TCP_RESP_HDR];
    size_t rx_got;
    pdl_tcp_resp_t resp;
    char rx_msg[PDL_TCP_MAX_MSG + 1];
    uint64_t rx_piece_bytes;
    cursor_t rx_pay;
    uint64_t rx_pay_left;
    struct iovec rxv[IOV_MAX];
    /* Local device memory (stage.h; NULL for host memory): a WRITE's payload is sent from, and a READ's
     * response received into, staging windows; each direction has its own stage and its own list of a
     * request's device ranges (PDL_TCP_MAX_SEGS entries). */
    pdl_stage_t *tx_stg, *rx_stg;
    struct iovec *tx_dev, *rx_dev;
    uint8_t *tx_win, *rx_win;
    size_t tx_win_len, tx_win_off, rx_win_len, rx_win_off;
} tcp_conn_t;

/* One chunk of a batch on one connection (lives in b->priv). */
typedef struct tcp_op {
    pdl_batch_t *b;
    int idx;
    bool pool;          /* driven by a worker, which reports the chunk done (drive_chunk) */
    tcp_conn_t *c;
    struct tcp_op *next;
    cursor_t tx;        /* first descriptor not yet in a request */
    bool tx_done;       /* no more requests will be started */
    uint32_t inflight;  /* requests started and not yet answered */
    uint32_t due;       /* requests completely sent and not yet answered: a response may be arriving */
    bool done;          /* under c->mu */
    pdl_status_t st;    /* first refusal */
    pdl_error_t err;
    pdl_status_t fst;   /* final status (pool ops) */
} tcp_op_t;

typedef struct tcp_session {
    int n;
    tcp_conn_t *c;
} tcp_session_t;

/* ---------------------------------------------------------------- I/O helpers */

/*
 * Bytes per recvmsg(MSG_WAITALL). One call for a whole 64 MiB response keeps the socket locked while
 * it copies and delays window updates; 256 KiB calls measured 1.1-1.2x the stream ceiling against 0.6x
 * (with the owner's 1 MiB sends, tcp_server.c).
 */
#define TCP_RECV_CALL_MAX (256u << 10)
#define TCP_SEND_CALL_MAX (1u << 20)

/*
 * Send (receive = false) or receive all bytes of v[0..n) on a blocking socket, at most
 * TCP_SEND_CALL_MAX / TCP_RECV_CALL_MAX bytes per call (see tcp_server.c for why): the iovec list is
 * cut there and restored after each call. 0 on success, else -1 with errno (0 for EOF).
 */
static int io_all(int fd, struct iovec *v, size_t n, bool receive)
{
    size_t i = 0;
    const size_t max = receive ? TCP_RECV_CALL_MAX : TCP_SEND_CALL_MAX;
    while (i < n) {
        /* A call over only empty iovecs returns 0, which for a receive reads as EOF. */
        if (v[i].iov_len == 0) {
            i++;
            continue;
        }
        size_t saved;
        size_t k = pdl__iov_cap(&v[i], n - i, IOV_MAX, max, &saved);
        struct msghdr mh = {0};
        mh.msg_iov = &v[i];
        mh.msg_iovlen = k;
        ssize_t r = receive ? recvmsg(fd, &mh, MSG_WAITALL) : sendmsg(fd, &mh, MSG_NOSIGNAL);
        pdl__iov_uncap(&v[i], k, saved);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0 && receive) {
            errno = 0;
            return -1;
        }
        pdl__iov_advance(v, &i, n, (size_t)r);
    }
    return 0;
}

static pdl_status_t io_fail(pdl_session_t *s, int ci, const char *what, int en, bool cancelled, pdl_error_t *err)
{
    pdl_status_t st;
    tcp_session_t *ts = s->bk;
    if (cancelled)
        st = pdl_error_set(err, PDL_ERR_BAD_STATE, "engine %s: batch to engine %s cancelled during %s", s->engine->key,
                           s->rmem.engine_key, what);
    else if (en == 0 || en == ECONNRESET || en == EPIPE || en == ENOTCONN || en == ESHUTDOWN || en == ECONNREFUSED)
        st = pdl_error_set(err, PDL_ERR_PEER_GONE,
                           "peer gone: engine %s: connection %d/%d to engine %s (%s:%u) %s during %s of region %" PRIu64,
                           s->engine->key, ci + 1, ts->n, s->rmem.engine_key, s->remote->host, s->remote->port,
                           en == 0 ? "closed" : strerror(en), what, s->rmem.id);
    else
        st = pdl_error_set(err, PDL_ERR_TRANSPORT,
                           "engine %s: connection %d/%d to engine %s (%s:%u): %s during %s of region %" PRIu64,
                           s->engine->key, ci + 1, ts->n, s->rmem.engine_key, s->remote->host, s->remote->port,
                           strerror(en), what, s->rmem.id);
    pdl__session_break(s, st, err ? err->msg : "connection lost");
    return st;
}

/* ---------------------------------------------------------------- session */

static int connect_timeout(pdl_session_t *s, const struct addrinfo *ai, int timeout_ms, int *fd_out)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            int en = errno;
            close(fd);
            return en;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int r;
        do
            r = poll(&p, 1, timeout_ms);
        while (r < 0 && errno == EINTR);
        if (r == 0) {
            close(fd);
            return ETIMEDOUT;
        }
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr != 0) {
            close(fd);
            return soerr;
        }
    }
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    pdl__tcp_tune_socket(s->engine, fd);
    *fd_out = fd;
    return 0;
}

/* One blocking request (header + body) and its response header (+ its error text); the setup steps of a
 * connection (HELLO, HELLO_AUTH, AUTH). `what` names the step in errors. */
static pdl_status_t setup_step(pdl_session_t *s, int ci, int fd, uint16_t op, const void *body, size_t len,
                               const char *what, pdl_tcp_resp_t *rr, pdl_error_t *err)
{
    const char *key = s->rmem.engine_key;
    uint8_t hdr[PDL_TCP_REQ_HDR], resp[PDL_TCP_RESP_HDR + PDL_TCP_MAX_MSG + 1];
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, op, 0, 0, 0, len, 0};
    pdl_tcp_req_encode(hdr, &r);
    struct iovec v[2] = {{hdr, sizeof(hdr)}, {(void *)body, len}};
    struct iovec rv[1] = {{resp, PDL_TCP_RESP_HDR}};
    if (io_all(fd, v, 2, false) != 0 || io_all(fd, rv, 1, true) != 0) {
        int en = errno;
        if (en == EAGAIN || en == EWOULDBLOCK)
            return pdl_error_set(err, PDL_ERR_TIMEOUT, "engine %s: engine %s at %s:%u did not answer %s within %d ms",
                                 s->engine->key, key, s->remote->host, s->remote->port, what, TCP_CONNECT_TIMEOUT_MS);
        return pdl_error_set(err, en == 0 || en == ECONNRESET ? PDL_ERR_PEER_GONE : PDL_ERR_TRANSPORT,
                             "engine %s: %s on connection %d to engine %s at %s:%u: %s", s->engine->key, what, ci + 1,
                             key, s->remote->host, s->remote->port, en == 0 ? "connection closed" : strerror(en));
    }
    pdl_tcp_resp_decode(resp, rr);
    if (rr->magic != PDL_TCP_RESP_MAGIC || rr->version != PDL_TCP_VERSION || rr->msg_len > PDL_TCP_MAX_MSG)
        return pdl_error_set(err, PDL_ERR_MISMATCH,
                             "engine %s: %s:%u does not speak pdlink tcp version %d (magic 0x%08x version %u)",
                             s->engine->key, s->remote->host, s->remote->port, PDL_TCP_VERSION, rr->magic, rr->version);
    if (rr->status != 0) {
        struct iovec mv[1] = {{resp + PDL_TCP_RESP_HDR, rr->msg_len}};
        uint32_t mlen = rr->msg_len;
        if (mlen == 0 || io_all(fd, mv, 1, true) != 0)
            mlen = 0;
        resp[PDL_TCP_RESP_HDR + mlen] = '\0';
        return pdl_error_set(err, rr->status == PDL_ERR_DENIED ? PDL_ERR_DENIED : PDL_ERR_MISMATCH,
                             "engine %s: %s:%u refused %s: %s", s->engine->key, s->remote->host, s->remote->port, what,
                             (char *)resp + PDL_TCP_RESP_HDR);
    }
    return PDL_OK;
}

/* Authenticated mode (tcp_wire.h): prove the cluster key and make the owner prove it. */
static pdl_status_t hello_auth(pdl_session_t *s, int ci, int fd, pdl_error_t *err)
{
    const pdl_engine_t *e = s->engine;
    const char *key = s->rmem.engine_key;
    size_t klen = strlen(key);
    uint8_t body[PDL_TCP_MAX_KEY + PDL_TCP_AUTH_LEN];
    uint8_t nonces[2 * PDL_TCP_AUTH_LEN], answer[2 * PDL_TCP_AUTH_LEN];
    memcpy(body, key, klen);
    pdl_auth_nonce(nonces);
    memcpy(body + klen, nonces, PDL_TCP_AUTH_LEN);
    pdl_tcp_resp_t rr;
    pdl_status_t st = setup_step(s, ci, fd, PDL_TCP_OP_HELLO_AUTH, body, klen + PDL_TCP_AUTH_LEN, "HELLO_AUTH", &rr, err);
    if (st != PDL_OK)
        return st;
    struct iovec av[1] = {{answer, sizeof(answer)}};
    if (rr.payload_len != sizeof(answer) || io_all(fd, av, 1, true) != 0)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "engine %s: %s:%u answered HELLO_AUTH with %" PRIu64
                             " bytes instead of a nonce and a MAC", e->key, s->remote->host, s->remote->port,
                             rr.payload_len);
    memcpy(nonces + PDL_TCP_AUTH_LEN, answer, PDL_TCP_AUTH_LEN);
    const void *parts[] = {key, nonces, nonces + PDL_TCP_AUTH_LEN};
    size_t lens[] = {klen, PDL_TCP_AUTH_LEN, PDL_TCP_AUTH_LEN};
    /* An owner that cannot prove the key could be anyone at that address: read nothing from it. */
    if (!pdl_auth_verify(e->auth, PDL_TCP_LABEL_SERVER, parts, lens, 3, answer + PDL_TCP_AUTH_LEN))
        return pdl_error_set(err, PDL_ERR_DENIED, "engine %s: %s:%u (engine %s) failed to prove the cluster key: "
                             "does it use the same auth_key_file?", e->key, s->remote->host, s->remote->port, key);
    uint8_t mac[PDL_TCP_AUTH_LEN];
    pdl_auth_mac(e->auth, PDL_TCP_LABEL_CLIENT, parts, lens, 3, mac);
    return setup_step(s, ci, fd, PDL_TCP_OP_AUTH, mac, sizeof(mac), "AUTH", &rr, err);
}

static pdl_status_t hello(pdl_session_t *s, int ci, int fd, pdl_error_t *err)
{
    const char *key = s->rmem.engine_key;
    size_t klen = strlen(key);
    if (klen == 0 || klen > PDL_TCP_MAX_KEY)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: remote key '%s' too long for the tcp HELLO",
                             s->engine->key, key);
    struct timeval tv = {TCP_CONNECT_TIMEOUT_MS / 1000, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    pdl_tcp_resp_t rr;
    pdl_status_t st = s->engine->auth != NULL ? hello_auth(s, ci, fd, err)
                                              : setup_step(s, ci, fd, PDL_TCP_OP_HELLO, key, klen, "HELLO", &rr, err);
    if (st != PDL_OK)
        return st;
    /* From now on sends are non-blocking calls and receives block in slices (see the header comment). */
    struct timeval slice = {0, TCP_RCV_SLICE_MS * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof(slice));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &slice, sizeof(slice));
    return PDL_OK;
}

static void session_free(tcp_session_t *ts)
{
    for (int i = 0; i < ts->n; i++) {
        if (ts->c[i].fd >= 0)
            close(ts->c[i].fd);
        pthread_mutex_destroy(&ts->c[i].mu);
        pthread_cond_destroy(&ts->c[i].cv);
        free(ts->c[i].frame);
        pdl__stage_destroy(ts->c[i].tx_stg);
        pdl__stage_destroy(ts->c[i].rx_stg);
        free(ts->c[i].tx_dev);
        free(ts->c[i].rx_dev);
    }
    free(ts->c);
    free(ts);
}

/* The local region is device memory: every connection gets its staging windows now (pinned memory,
 * allocated once per session rather than on a request's path). */
static pdl_status_t stages_open(pdl_session_t *s, tcp_session_t *ts, pdl_error_t *err)
{
    pdl_engine_t *e = s->engine;
    pdl_cudadrv_t *d = ((pdl_tcp_engine_t *)e->bk)->drv;
    for (int i = 0; i < ts->n; i++) {
        tcp_conn_t *c = &ts->c[i];
        c->tx_dev = malloc(PDL_TCP_MAX_SEGS * sizeof(struct iovec));
        c->rx_dev = malloc(PDL_TCP_MAX_SEGS * sizeof(struct iovec));
        if (c->tx_dev == NULL || c->rx_dev == NULL)
            return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
        pdl_status_t st = pdl__stage_create(d, e->key, false, &c->tx_stg, err);
        if (st == PDL_OK)
            st = pdl__stage_create(d, e->key, false, &c->rx_stg, err);
        if (st != PDL_OK)
            return st;
    }
    return PDL_OK;
}

static pdl_status_t tcp_session_open(pdl_session_t *s, pdl_error_t *err)
{
    pdl_engine_t *e = s->engine;
    pdl_remote_t *r = s->remote;
    if (r->port == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: remote engine %s has no tcp port", e->key, r->key);
    tcp_session_t *ts = calloc(1, sizeof(*ts));
    if (ts == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    ts->c = calloc((size_t)e->qp_per_transfer, sizeof(*ts->c));
    if (ts->c == NULL) {
        free(ts);
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    }
    for (int i = 0; i < e->qp_per_transfer; i++) {
        ts->c[i].fd = -1;
        ts->c[i].ci = i;
        pthread_mutex_init(&ts->c[i].mu, NULL);
        pdl__clock_cond_init(&ts->c[i].cv);
        ts->n++;
        ts->c[i].frame = malloc(PDL_TCP_REQ_HDR + (size_t)PDL_TCP_MAX_SEGS * PDL_TCP_SEG + PDL_GRANT_NAME_MAX);
        if (ts->c[i].frame == NULL) {
            session_free(ts);
            return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
        }
    }
    s->bk = ts;
    pdl_status_t st;
    if (s->local->type != PDL_MEM_TYPE_HOST && (st = stages_open(s, ts, err)) != PDL_OK)
        goto fail;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%u", r->port);
    int rc = getaddrinfo(r->host, port, &hints, &ai);
    if (rc != 0) {
        st = pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: cannot resolve host '%s' of engine %s: %s", e->key,
                           r->host, r->key, gai_strerror(rc));
        goto fail;
    }
    for (int i = 0; i < ts->n; i++) {
        int en = connect_timeout(s, ai, TCP_CONNECT_TIMEOUT_MS, &ts->c[i].fd);
        if (en != 0) {
            freeaddrinfo(ai);
            st = pdl_error_set(err,
                               en == ETIMEDOUT      ? PDL_ERR_TIMEOUT
                               : en == ECONNREFUSED ? PDL_ERR_PEER_GONE
                                                    : PDL_ERR_TRANSPORT,
                               "engine %s: connect %d/%d to engine %s at %s:%u: %s", e->key, i + 1, ts->n, r->key,
                               r->host, r->port, strerror(en));
            goto fail;
        }
        st = hello(s, i, ts->c[i].fd, err);
        if (st != PDL_OK) {
            freeaddrinfo(ai);
            goto fail;
        }
    }
    freeaddrinfo(ai);
    return PDL_OK;
fail:
    session_free(ts);
    s->bk = NULL;
    return st;
}

static void tcp_session_close(pdl_session_t *s)
{
    if (s->bk)
        session_free(s->bk);
    s->bk = NULL;
}

static void tcp_session_kill(pdl_session_t *s)
{
    tcp_session_t *ts = s->bk;
    if (ts == NULL)
        return;
    /* shutdown, not close: the fd number stays ours until the session is closed. */
    for (int i = 0; i < ts->n; i++)
        if (ts->c[i].fd >= 0)
            shutdown(ts->c[i].fd, SHUT_RDWR);
}

static pdl_status_t tcp_session_check(pdl_session_t *s, pdl_error_t *err)
{
    if (s->remote->removed)
        return pdl_error_set(err, PDL_ERR_PEER_GONE, "peer gone: engine %s: remote engine %s was removed",
                             s->engine->key, s->rmem.engine_key);
    return PDL_OK;
}

static int tcp_plan(pdl_session_t *s, pdl_op_t op, uint64_t bytes, size_t n)
{
    (void)op;
    (void)n;
    tcp_session_t *ts = s->bk;
    if (bytes < TCP_STRIPE_MIN_BYTES)
        return 1;
    uint64_t by_size = bytes / (TCP_STRIPE_MIN_BYTES / 2);
    return by_size < (uint64_t)ts->n ? (int)by_size : ts->n;
}

/* ---------------------------------------------------------------- batches */

enum { RX_NONE, RX_HDR, RX_MSG, RX_PAY };
enum { IO_MOVED = 1, IO_AGAIN = 2 }; /* tx_run / rx_run results (bits) */

/*
 * One request's worth of descriptors from cur (at most PDL_TCP_MAX_SEGS segments and
 * PDL_TCP_MAX_REQ_BYTES bytes), its segment table written to segs unless NULL; cur is advanced. The
 * sending and the receiving side both walk it from the same start, so they agree on every request's
 * extent without storing it.
 */
static void piece_walk(const pdl_batch_t *b, cursor_t *cur, uint8_t *segs, uint32_t *nseg_out, uint64_t *bytes_out)
{
    uint32_t nseg = 0;
    uint64_t bytes = 0;
    while (cur->i < cur->end && nseg < PDL_TCP_MAX_SEGS && bytes < PDL_TCP_MAX_REQ_BYTES) {
        const pdl_desc_t *d = &b->d[cur->i];
        uint64_t len = d->len - cur->skip, room = PDL_TCP_MAX_REQ_BYTES - bytes;
        if (len > room)
            len = room;
        if (segs) {
            pdl_tcp_put64(segs + (size_t)nseg * PDL_TCP_SEG, d->remote_off + cur->skip);
            pdl_tcp_put64(segs + (size_t)nseg * PDL_TCP_SEG + 8, len);
        }
        nseg++;
        bytes += len;
        cur->skip += len;
        if (cur->skip == d->len) {
            cur->i++;
            cur->skip = 0;
        }
    }
    *nseg_out = nseg;
    *bytes_out = bytes;
}

/* iovecs (at most cap) for the next min(left, max) bytes of the local ranges from cur; cur is not moved. */
static size_t pay_iov(const pdl_batch_t *b, cursor_t cur, uint64_t left, uint64_t max, struct iovec *v, size_t cap)
{
    uint8_t *local = b->session->local->ptr;
    size_t k = 0;
    uint64_t got = 0;
    if (max > left)
        max = left;
    while (k < cap && got < max && cur.i < cur.end) {
        const pdl_desc_t *d = &b->d[cur.i];
        uint64_t len = d->len - cur.skip;
        if (len > max - got)
            len = max - got;
        v[k++] = (struct iovec){local + d->local_off + cur.skip, len};
        got += len;
        cur.i++;
        cur.skip = 0;
    }
    return k;
}

static void cursor_advance(const pdl_batch_t *b, cursor_t *cur, uint64_t n)
{
    while (n > 0 && cur->i < cur->end) {
        uint64_t len = b->d[cur->i].len - cur->skip;
        if (n >= len) {
            n -= len;
            cur->i++;
            cur->skip = 0;
        } else {
            cur->skip += n;
            n = 0;
        }
    }
}

/* Take op off the queue and report it: a worker-driven op is reported by its worker (drive_chunk),
 * any other at once. The op (and its batch) must not be touched after this. */
static void op_complete_locked(tcp_conn_t *c, tcp_op_t *op, pdl_status_t st, const pdl_error_t *err)
{
    tcp_op_t **pp = &c->head, *prev = NULL;
    while (*pp != op) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = op->next;
    if (c->tail == op)
        c->tail = prev;
    if (c->txq == op)
        c->txq = op->next;
    if (c->rx_op == op)
        c->rx_op = NULL;
    op->done = true;
    if (c->waiters > 0)
        pthread_cond_broadcast(&c->cv);
    if (op->pool) {
        op->fst = st;
        if (st != PDL_OK)
            op->err = *err;
        return;
    }
    pdl__batch_chunk_done(op->b, st, err);
}

/* Complete op if nothing more will be sent or received for it. */
static void op_maybe_complete_locked(tcp_conn_t *c, tcp_op_t *op)
{
    if (op->tx_done && op->inflight == 0)
        op_complete_locked(c, op, op->st, &op->err);
}

/* The connection lost its framing: remember why and shut it down; the ops fail in io_release_locked. */
static void conn_fail_locked(tcp_conn_t *c, pdl_status_t st, const char *msg)
{
    if (c->dead != PDL_OK)
        return;
    c->dead = st;
    snprintf(c->dead_msg, sizeof(c->dead_msg), "%s", msg);
    shutdown(c->fd, SHUT_RDWR); /* wakes a thread blocked on it in the other direction */
}

/* Fail every op still queued. Only when no thread is inside a system call on the connection, so no
 * failed batch's memory is read or written after its waiter has returned. */
static void fail_all_locked(tcp_conn_t *c)
{
    pdl_error_t e;
    pdl_error_set(&e, c->dead, "%s", c->dead_msg);
    while (c->head)
        op_complete_locked(c, c->head, c->dead, &e);
    c->txq = NULL;
    c->tx_active = false;
    c->tx_op = NULL;
    c->rx_stage = RX_NONE;
    c->rx_op = NULL;
    /* Device copies still queued for a failed op end here, before its waiter returns. */
    if (c->tx_stg != NULL)
        pdl__stage_abort(c->tx_stg);
    if (c->rx_stg != NULL)
        pdl__stage_abort(c->rx_stg);
    c->tx_win_len = c->tx_win_off = c->rx_win_len = c->rx_win_off = 0;
}

static void io_release_locked(tcp_conn_t *c, bool *flag)
{
    *flag = false;
    if (c->dead != PDL_OK && !c->tx_busy && !c->rx_busy)
        fail_all_locked(c);
    if (c->waiters > 0)
        pthread_cond_broadcast(&c->cv);
}

static void io_error_locked(pdl_session_t *s, tcp_conn_t *c, const tcp_op_t *op, int en)
{
    pdl_error_t err;
    const char *what = op && op->b->op == PDL_OP_WRITE ? "write" : "read";
    pdl_status_t st = io_fail(s, c->ci, what, en, op && atomic_load(&op->b->cancel), &err);
    conn_fail_locked(c, st, err.msg);
}

static bool tx_pending(const tcp_conn_t *c) { return c->tx_active || c->txq != NULL; }
static bool rx_pending(const tcp_conn_t *c) { return c->head != NULL && c->head->due > 0; }

/* May a call block for a slice before the deadline (0 = never, UINT64_MAX = no deadline)? */
static bool may_block(uint64_t deadline)
{
    return deadline == UINT64_MAX ||
           (deadline != 0 && pdl__clock_now_ns() + (uint64_t)TCP_RCV_SLICE_MS * 1000000u <= deadline);
}

/* What a failed sendmsg/recvmsg (errno en) means for tx_run/rx_run: call again (interrupted, or it
 * would block and the caller may still wait), return IO_AGAIN (it would block and the call must not),
 * stop (the deadline passed), or fail the connection (a real error). */
typedef enum { IO_RETRY, IO_WOULD_BLOCK, IO_TIMED_OUT, IO_BROKEN } io_fail_t;

static io_fail_t io_failure(int en, bool block, uint64_t deadline)
{
    if (en == EINTR)
        return IO_RETRY;
    if (en != EAGAIN && en != EWOULDBLOCK)
        return IO_BROKEN;
    if (!block)
        return IO_WOULD_BLOCK;
    return deadline != UINT64_MAX && pdl__clock_now_ns() >= deadline ? IO_TIMED_OUT : IO_RETRY;
}

/*
 * Local device memory (c->tx_stg / c->rx_stg set). A staging step that fails leaves bytes promised on
 * the wire that cannot follow, so the connection and the session fail with its error. The steps wait
 * for device copies (bounded work no peer can stall), so they run without mu, under tx_busy / rx_busy
 * like the system calls; false when the connection failed meanwhile.
 */
static bool stage_step_locked(pdl_session_t *s, tcp_conn_t *c, pdl_status_t st, const pdl_error_t *err)
{
    if (st != PDL_OK && c->dead == PDL_OK) {
        pdl__session_break(s, st, err->msg);
        conn_fail_locked(c, st, err->msg);
    }
    return c->dead == PDL_OK;
}

/* The request just started (tx) or whose response header just came (rx) moves `bytes` from the cursor:
 * stage its local device ranges. */
static bool stage_begin_locked(pdl_session_t *s, tcp_conn_t *c, bool tx, const pdl_batch_t *b, cursor_t cur,
                               uint64_t bytes)
{
    struct iovec *v = tx ? c->tx_dev : c->rx_dev;
    size_t n = pay_iov(b, cur, bytes, bytes, v, PDL_TCP_MAX_SEGS);
    pdl_error_t err;
    pthread_mutex_unlock(&c->mu);
    pdl_status_t st = pdl__stage_begin(tx ? c->tx_stg : c->rx_stg, tx, v, n, &err);
    pthread_mutex_lock(&c->mu);
    if (tx)
        c->tx_win_len = c->tx_win_off = 0;
    else
        c->rx_win_len = c->rx_win_off = 0;
    return stage_step_locked(s, c, st, &err);
}

/* The window to send from (tx) or receive into (rx) next, taken from the stage once the last is done. */
static bool stage_window_locked(pdl_session_t *s, tcp_conn_t *c, bool tx)
{
    if (tx ? c->tx_win_off < c->tx_win_len : c->rx_win_off < c->rx_win_len)
        return true;
    uint8_t *p = NULL;
    size_t len = 0;
    pdl_error_t err;
    pthread_mutex_unlock(&c->mu);
    pdl_status_t st = tx ? pdl__stage_out_next(c->tx_stg, &p, &len, &err) : pdl__stage_in_window(c->rx_stg, &p, &len, &err);
    pthread_mutex_lock(&c->mu);
    if (tx) {
        c->tx_win = p;
        c->tx_win_len = len;
        c->tx_win_off = 0;
    } else {
        c->rx_win = p;
        c->rx_win_len = len;
        c->rx_win_off = 0;
    }
    return stage_step_locked(s, c, st, &err);
}

/* rx: n bytes came into the window; a full window goes to the device, and the last waits for them all. */
static bool stage_received_locked(pdl_session_t *s, tcp_conn_t *c, size_t n)
{
    c->rx_win_off += n;
    if (c->rx_win_off < c->rx_win_len)
        return true;
    pdl_error_t err;
    bool last = c->rx_pay_left == 0;
    pthread_mutex_unlock(&c->mu);
    pdl_status_t st = pdl__stage_in_commit(c->rx_stg, &err);
    if (st == PDL_OK && last)
        st = pdl__stage_in_end(c->rx_stg, &err);
    pthread_mutex_lock(&c->mu);
    return stage_step_locked(s, c, st, &err);
}

/*
 * Send queued requests until none is left, the socket is full (deadline 0) or the deadline passes
 * (blocking sends in SO_SNDTIMEO slices: only when no response is due, which could be what the owner
 * waits for before it reads more). Called with mu held and tx_busy set; drops mu around calls.
 */
static int tx_run(pdl_session_t *s, tcp_conn_t *c, uint64_t deadline)
{
    int res = 0;
    for (;;) {
        if (c->dead != PDL_OK)
            return res;
        if (!c->tx_active) {
            tcp_op_t *op = c->txq;
            if (op == NULL)
                return res;
            if (op->st != PDL_OK || atomic_load(&op->b->cancel)) {
                /* Refused (or being freed): start no further requests for it. */
                if (op->st == PDL_OK)
                    op->st = pdl_error_set(&op->err, PDL_ERR_BAD_STATE, "engine %s: batch cancelled", s->engine->key);
                op->tx_done = true;
                c->txq = op->next;
                op_maybe_complete_locked(c, op);
                continue;
            }
            cursor_t start = op->tx;
            uint32_t nseg;
            uint64_t bytes;
            piece_walk(op->b, &op->tx, c->frame + PDL_TCP_REQ_HDR, &nseg, &bytes);
            /* The grant name follows the segment table (tcp_wire.h). */
            size_t glen = strlen(op->b->grant);
            memcpy(c->frame + PDL_TCP_REQ_HDR + (size_t)nseg * PDL_TCP_SEG, op->b->grant, glen);
            pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION,
                               (uint16_t)(op->b->op == PDL_OP_READ ? PDL_TCP_OP_READ : PDL_TCP_OP_WRITE),
                               nseg, (uint32_t)glen, s->rmem.id, bytes, ++c->tag_tx};
            pdl_tcp_req_encode(c->frame, &r);
            c->frame_len = PDL_TCP_REQ_HDR + (size_t)nseg * PDL_TCP_SEG + glen;
            c->frame_off = 0;
            c->tx_op = op;
            c->tx_pay = start;
            c->tx_pay_left = op->b->op == PDL_OP_WRITE ? bytes : 0;
            c->tx_active = true;
            op->inflight++;
            if (op->tx.i == op->tx.end) {
                op->tx_done = true;
                c->txq = op->next;
            }
            if (c->tx_stg != NULL && c->tx_pay_left > 0 && !stage_begin_locked(s, c, true, op->b, start, bytes))
                return res;
        }
        /* The frame rides on top of the payload's TCP_SEND_CALL_MAX, so a MiB-multiple WRITE does not
         * leave a frame-sized tail for another call (see tcp_server.c). */
        size_t k = 0;
        if (c->frame_off < c->frame_len)
            c->txv[k++] = (struct iovec){c->frame + c->frame_off, c->frame_len - c->frame_off};
        if (c->tx_pay_left > 0 && c->tx_stg != NULL) {
            if (!stage_window_locked(s, c, true))
                return res;
            size_t w = c->tx_win_len - c->tx_win_off;
            c->txv[k++] = (struct iovec){c->tx_win + c->tx_win_off, w < TCP_SEND_CALL_MAX ? w : TCP_SEND_CALL_MAX};
        } else if (c->tx_pay_left > 0) {
            k += pay_iov(c->tx_op->b, c->tx_pay, c->tx_pay_left, TCP_SEND_CALL_MAX, &c->txv[k], IOV_MAX - k);
        }
        struct msghdr mh = {0};
        mh.msg_iov = c->txv;
        mh.msg_iovlen = k;
        bool block = may_block(deadline);
        pthread_mutex_unlock(&c->mu);
        ssize_t n = sendmsg(c->fd, &mh, (block ? 0 : MSG_DONTWAIT) | MSG_NOSIGNAL);
        int en = errno;
        pthread_mutex_lock(&c->mu);
        if (c->dead != PDL_OK)
            return res;
        if (n < 0) {
            io_fail_t f = io_failure(en, block, deadline);
            if (f == IO_RETRY)
                continue;
            if (f == IO_BROKEN)
                io_error_locked(s, c, c->tx_op, en);
            return f == IO_WOULD_BLOCK ? res | IO_AGAIN : res;
        }
        res |= IO_MOVED;
        size_t done = (size_t)n;
        size_t f = c->frame_len - c->frame_off < done ? c->frame_len - c->frame_off : done;
        c->frame_off += f;
        done -= f;
        if (done > 0) {
            cursor_advance(c->tx_op->b, &c->tx_pay, done);
            c->tx_pay_left -= done;
            c->tx_win_off += c->tx_stg != NULL ? done : 0;
        }
        if (c->frame_off == c->frame_len && c->tx_pay_left == 0) {
            c->tx_op->due++;
            c->tx_active = false;
            c->tx_op = NULL;
        }
    }
}

/* A response ended: account it to op and complete op when it was the last one. */
static void finish_piece_locked(pdl_session_t *s, tcp_conn_t *c, tcp_op_t *op, int32_t status, const char *msg)
{
    c->tag_rx++;
    c->rx_stage = RX_NONE;
    op->inflight--;
    op->due--;
    if (status != 0 && op->st == PDL_OK) {
        pdl_status_t st = (status < 0 && status >= PDL_ERR_DENIED) ? (pdl_status_t)status : PDL_ERR_TRANSPORT;
        op->st = pdl_error_set(&op->err, st, "engine %s: %s", s->engine->key, msg);
    }
    op_maybe_complete_locked(c, op);
}

/*
 * Receive responses in order until `want` is done, nothing is due, the deadline passes (0: do not
 * block at all) or the connection fails. Called with mu held and rx_busy set; drops mu around calls.
 */
static int rx_run(pdl_session_t *s, tcp_conn_t *c, const tcp_op_t *want, uint64_t deadline)
{
    int res = 0;
    for (;;) {
        if (c->dead != PDL_OK || want->done)
            return res;
        if (c->rx_stage == RX_NONE) {
            tcp_op_t *op = c->head;
            if (op == NULL || op->due == 0)
                return res;
            if (c->rx_op != op) {
                c->rx_op = op;
                c->rxc = (cursor_t){op->b->chunks[op->idx].first,
                                    op->b->chunks[op->idx].first + op->b->chunks[op->idx].count, 0};
            }
            uint32_t nseg;
            c->rx_pay = c->rxc;
            piece_walk(op->b, &c->rxc, NULL, &nseg, &c->rx_piece_bytes);
            c->rx_got = 0;
            c->rx_stage = RX_HDR;
        }
        tcp_op_t *op = c->rx_op;
        bool block = may_block(deadline);
        struct msghdr mh = {0};
        struct iovec one;
        mh.msg_iov = &one;
        mh.msg_iovlen = 1;
        if (c->rx_stage == RX_HDR) {
            one = (struct iovec){c->rx_hdr + c->rx_got, PDL_TCP_RESP_HDR - c->rx_got};
        } else if (c->rx_stage == RX_MSG) {
            one = (struct iovec){c->rx_msg + c->rx_got, c->resp.msg_len - c->rx_got};
        } else {
            if (c->rx_stg == NULL) {
                mh.msg_iov = c->rxv;
                mh.msg_iovlen = pay_iov(op->b, c->rx_pay, c->rx_pay_left, TCP_RECV_CALL_MAX, c->rxv, IOV_MAX);
            } else {
                if (!stage_window_locked(s, c, false))
                    return res;
                size_t w = c->rx_win_len - c->rx_win_off;
                one = (struct iovec){c->rx_win + c->rx_win_off, w < TCP_RECV_CALL_MAX ? w : TCP_RECV_CALL_MAX};
            }
        }
        pthread_mutex_unlock(&c->mu);
        ssize_t n = recvmsg(c->fd, &mh, block ? MSG_WAITALL : MSG_DONTWAIT);
        int en = errno;
        pthread_mutex_lock(&c->mu);
        if (c->dead != PDL_OK)
            return res;
        if (n == 0) {
            io_error_locked(s, c, op, 0);
            return res;
        }
        if (n < 0) {
            io_fail_t f = io_failure(en, block, deadline);
            if (f == IO_RETRY)
                continue;
            if (f == IO_BROKEN)
                io_error_locked(s, c, op, en);
            return f == IO_WOULD_BLOCK ? res | IO_AGAIN : res;
        }
        res |= IO_MOVED;
        if (c->rx_stage == RX_HDR) {
            c->rx_got += (size_t)n;
            if (c->rx_got < PDL_TCP_RESP_HDR)
                continue;
            pdl_tcp_resp_t *r = &c->resp;
            pdl_tcp_resp_decode(c->rx_hdr, r);
            uint64_t want_payload = op->b->op == PDL_OP_READ && r->status == 0 ? c->rx_piece_bytes : 0;
            if (r->magic != PDL_TCP_RESP_MAGIC || r->version != PDL_TCP_VERSION || r->tag != c->tag_rx + 1 ||
                r->msg_len > PDL_TCP_MAX_MSG || r->payload_len != want_payload) {
                char msg[PDL_ERR_MSG_LEN];
                snprintf(msg, sizeof(msg),
                         "engine %.100s: malformed response from engine %.100s on connection %d (magic 0x%08x tag %" PRIu64
                         "/%" PRIu64 " payload %" PRIu64 "/%" PRIu64 ")",
                         s->engine->key, s->rmem.engine_key, c->ci + 1, r->magic, r->tag, c->tag_rx + 1, r->payload_len,
                         want_payload);
                pdl__session_break(s, PDL_ERR_TRANSPORT, msg);
                conn_fail_locked(c, PDL_ERR_TRANSPORT, msg);
                return res;
            }
            c->rx_got = 0;
            if (r->status != 0 && r->msg_len > 0) {
                c->rx_stage = RX_MSG;
            } else if (want_payload > 0) {
                c->rx_pay_left = want_payload;
                if (c->rx_stg != NULL && !stage_begin_locked(s, c, false, op->b, c->rx_pay, want_payload))
                    return res;
                c->rx_stage = RX_PAY;
            } else {
                finish_piece_locked(s, c, op, r->status, "(no message)");
            }
        } else if (c->rx_stage == RX_MSG) {
            c->rx_got += (size_t)n;
            if (c->rx_got == c->resp.msg_len) {
                c->rx_msg[c->rx_got] = '\0';
                finish_piece_locked(s, c, op, c->resp.status, c->rx_msg);
            }
        } else {
            cursor_advance(op->b, &c->rx_pay, (uint64_t)n);
            c->rx_pay_left -= (uint64_t)n;
            if (c->rx_stg != NULL && !stage_received_locked(s, c, (size_t)n))
                return res;
            if (c->rx_pay_left == 0)
                finish_piece_locked(s, c, op, 0, NULL);
        }
    }
}

/*
 * Move connection c's bytes from the calling thread until op is done or the deadline (CLOCK_MONOTONIC
 * ns) passes; deadline 0 = one non-blocking pass. Whatever direction another thread is already
 * serving is left to it; this thread then waits for it on c->cv.
 */
static void drive(tcp_conn_t *c, tcp_op_t *op, uint64_t deadline)
{
    pdl_session_t *s = op->b->session;
    pthread_mutex_lock(&c->mu);
    while (!op->done) {
        int tx = 0, rx = 0;
        if (c->dead == PDL_OK && !c->tx_busy && tx_pending(c)) {
            c->tx_busy = true;
            tx = tx_run(s, c, rx_pending(c) ? 0 : deadline);
            io_release_locked(c, &c->tx_busy);
        }
        if (!op->done && c->dead == PDL_OK && !c->rx_busy && rx_pending(c)) {
            c->rx_busy = true;
            rx = rx_run(s, c, op, tx_pending(c) ? 0 : deadline);
            io_release_locked(c, &c->rx_busy);
        }
        if (op->done || deadline == 0)
            break;
        uint64_t now = pdl__clock_now_ns();
        if (now >= deadline)
            break;
        if ((tx | rx) & IO_MOVED)
            continue;
        if (((tx | rx) & IO_AGAIN) && c->dead == PDL_OK) {
            struct pollfd p = {.fd = c->fd, .events = (short)(((rx & IO_AGAIN) ? POLLIN : 0) | ((tx & IO_AGAIN) ? POLLOUT : 0))};
            uint64_t left_ms = deadline == UINT64_MAX ? 1000 : (deadline - now + 999999) / 1000000;
            pthread_mutex_unlock(&c->mu);
            poll(&p, 1, (int)(left_ms > 1000 ? 1000 : left_ms));
            pthread_mutex_lock(&c->mu);
            continue;
        }
        /* Another thread is moving what we wait for (or failing the connection): sleep until it says. */
        c->waiters++;
        if (deadline == UINT64_MAX) {
            pthread_cond_wait(&c->cv, &c->mu);
        } else {
            struct timespec ts = pdl__clock_timespec(deadline);
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        c->waiters--;
    }
    pthread_mutex_unlock(&c->mu);
}

static void tcp_submit(pdl_session_t *s, pdl_batch_t *b)
{
    tcp_session_t *ts = s->bk;
    tcp_op_t *ops = b->priv;
    for (int i = 0; i < b->nchunks; i++) {
        tcp_op_t *op = &ops[i];
        memset(op, 0, sizeof(*op));
        op->b = b;
        op->idx = i;
        op->pool = i > 0 && b->chunks[i].bytes >= TCP_POOL_MIN_BYTES;
        op->c = &ts->c[i % ts->n];
        op->tx = (cursor_t){b->chunks[i].first, b->chunks[i].first + b->chunks[i].count, 0};
    }
    for (int i = 0; i < b->nchunks; i++) {
        tcp_op_t *op = &ops[i];
        bool pool = op->pool;
        tcp_conn_t *c = op->c;
        pthread_mutex_lock(&c->mu);
        if (c->tail)
            c->tail->next = op;
        else
            c->head = op;
        c->tail = op;
        if (c->txq == NULL)
            c->txq = op;
        if (c->dead != PDL_OK) {
            if (!c->tx_busy && !c->rx_busy)
                fail_all_locked(c);
        } else if (!c->tx_busy) {
            /* Send the request now, from the posting thread (never blocks: the rest is a driver's). */
            c->tx_busy = true;
            tx_run(s, c, 0);
            io_release_locked(c, &c->tx_busy);
        }
        pthread_mutex_unlock(&c->mu);
        if (pool)
            pdl__engine_pool_drive(b, i);
    }
}

static void tcp_progress(pdl_batch_t *b, uint64_t deadline)
{
    tcp_op_t *ops = b->priv;
    for (int i = 0; i < b->nchunks; i++) {
        if (ops[i].pool)
            continue;
        drive(ops[i].c, &ops[i], deadline);
        if (deadline != 0 && deadline != UINT64_MAX && pdl__clock_now_ns() >= deadline)
            break;
    }
}

static void tcp_drive_chunk(pdl_batch_t *b, int idx)
{
    tcp_op_t *op = &((tcp_op_t *)b->priv)[idx];
    drive(op->c, op, UINT64_MAX);
    pthread_mutex_lock(&op->c->mu);
    pdl_status_t st = op->fst;
    pdl_error_t err = op->err;
    pthread_mutex_unlock(&op->c->mu);
    pdl__batch_chunk_done(b, st, &err);
}

/* ---------------------------------------------------------------- engine hooks */

static pdl_status_t tcp_engine_init(pdl_engine_t *e, pdl_error_t *err)
{
    char want[sizeof(e->tcp_cc)];
    snprintf(want, sizeof(want), "%s", e->tcp_cc);
    pdl_status_t st = pdl__tcp_pick_congestion(e, want, err);
    if (st != PDL_OK)
        return st;
    pdl_tcp_engine_t *te = calloc(1, sizeof(*te));
    if (te == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    /* Device memory where the CUDA driver loads; without it the engine is what it always was. */
    pdl_error_t derr;
    if (pdl__cudadrv_open(e->key, "tcp", &te->drv, &derr) == PDL_OK)
        e->mem_types |= 1u << PDL_MEM_TYPE_CUDA;
    else
        pdl_debug("engine %s: tcp registers host memory only: %s", e->key, derr.msg);
    e->bk = te;
    st = pdl__tcp_server_start(e, &te->srv, err);
    if (st != PDL_OK) {
        pdl__cudadrv_close(te->drv);
        free(te);
        e->bk = NULL;
    }
    return st;
}

static void tcp_engine_fini(pdl_engine_t *e)
{
    pdl_tcp_engine_t *te = e->bk;
    if (te == NULL)
        return;
    pdl__tcp_server_stop(te->srv);
    pdl__cudadrv_close(te->drv);
    free(te);
    e->bk = NULL;
}

/* A CUDA registration: the driver's context is chosen now, and the range must be one allocation of it
 * (cuMemGetAddressRange), so that a mistake shows here and not as a failed copy in a peer's batch. */
static pdl_status_t tcp_mem_init(pdl_engine_t *e, pdl_mem_t *m, pdl_error_t *err)
{
    pdl_tcp_engine_t *te = e->bk;
    if (m->type == PDL_MEM_TYPE_HOST)
        return PDL_OK;
    pdl_status_t st = pdl__cudadrv_ctx(te->drv, e->key, err);
    if (st != PDL_OK)
        return st;
    if (!pdl__cudadrv_push(te->drv))
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: cannot make its CUDA context current", e->key);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)m->ptr, base = 0;
    size_t asize = 0;
    CUresult r = te->drv->api.MemGetAddressRange(&base, &asize, p);
    pdl__cudadrv_pop(te->drv);
    if (r != CUDA_SUCCESS)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "engine %s: %p is not device memory of this engine's CUDA context (cuMemGetAddressRange: "
                             "%s)",
                             e->key, m->ptr, pdl__cudadrv_errname(te->drv, r));
    if (p - base > asize || m->size > asize - (p - base))
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "engine %s: [%p, +%zu) runs past the end of its CUDA allocation (%zu bytes at 0x%llx)",
                             e->key, m->ptr, m->size, asize, base);
    return PDL_OK;
}

/* Zero ranges of a device registration on the device: one memset each, then wait. */
static pdl_status_t tcp_mem_zero(pdl_mem_t *m, const pdl_range_t *rg, size_t n, pdl_error_t *err)
{
    pdl_engine_t *e = m->engine;
    pdl_cudadrv_t *d = ((pdl_tcp_engine_t *)e->bk)->drv;
    if (!pdl__cudadrv_push(d))
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: cannot make its CUDA context current", e->key);
    CUstream stream = NULL;
    const char *what = "cuStreamCreate";
    CUresult r = d->api.StreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
        what = "cuMemsetD8Async";
        r = d->api.MemsetD8Async((CUdeviceptr)(uintptr_t)m->ptr + rg[i].off, 0, rg[i].len, stream);
    }
    if (stream != NULL) {
        CUresult r2 = d->api.StreamSynchronize(stream);
        if (r == CUDA_SUCCESS && r2 != CUDA_SUCCESS) {
            r = r2;
            what = "cuStreamSynchronize";
        }
        d->api.StreamDestroy(stream);
    }
    pdl__cudadrv_pop(d);
    if (r != CUDA_SUCCESS)
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: zeroing %zu ranges of region %" PRIu64 ": %s: %s",
                             e->key, n, m->id, what, pdl__cudadrv_errname(d, r));
    return PDL_OK;
}

static pdl_status_t tcp_remote_add(pdl_engine_t *e, pdl_remote_t *r, pdl_error_t *err)
{
    if (r->host[0] == '\0' || r->port == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "engine %s: remote engine %s has no tcp host/port", e->key, r->key);
    return PDL_OK;
}

static void tcp_mem_kick(pdl_engine_t *e, pdl_mem_t *m)
{
    pdl_tcp_engine_t *te = e->bk;
    if (te != NULL && te->srv != NULL)
        pdl__tcp_server_kick(te->srv, m);
}

const pdl_backend_ops_t pdl__tcp_ops = {
    .name = "tcp",
    .caps = PDL_BACKEND_CAP_ABORT_BREAKS,
    .engine_init = tcp_engine_init,
    .engine_fini = tcp_engine_fini,
    .remote_add = tcp_remote_add,
    .mem_kick = tcp_mem_kick,
    .mem_init = tcp_mem_init,
    .session_open = tcp_session_open,
    .session_close = tcp_session_close,
    .session_kill = tcp_session_kill,
    .session_check = tcp_session_check,
    .plan = tcp_plan,
    .chunk_priv = sizeof(tcp_op_t),
    .submit = tcp_submit,
    .progress = tcp_progress,
    .drive_chunk = tcp_drive_chunk,
    .mem_zero = tcp_mem_zero,
};
