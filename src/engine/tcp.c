/*
 * tcp.c -- transfer backend over plain TCP, initiator side, and the backend's ops table.
 *
 * A session owns qp_per_transfer connections to the remote engine, each opened with a HELLO naming the
 * engine it expects (a port reused by another engine is refused). A batch is cut into up to that many
 * chunks of about equal bytes (engine.c) and chunk i runs on connection i on a worker thread. On its
 * connection a chunk becomes requests of at most PDL_TCP_MAX_SEGS segments / PDL_TCP_MAX_REQ_BYTES,
 * two in flight at a time so the owner never waits for the next request. Bytes go straight between
 * the socket and the registered memory: a READ response is received with recvmsg(MSG_WAITALL) into
 * the local ranges, a WRITE payload is sent with sendmsg from them (IOV_MAX iovecs per call).
 *
 * Failure model: a refused request (unknown region, range outside it) fails the batch with the owner's
 * message and leaves the connection usable. Any I/O error or EOF loses the framing, so the session
 * becomes broken (sticky): PDL_ERR_PEER_GONE "peer gone" for EOF/reset/refused connections,
 * PDL_ERR_TRANSPORT otherwise. A stalled owner never hangs the caller: pdl_batch_wait has its own
 * timeout, and freeing a running batch shuts the session's sockets down, which wakes the worker.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/tcp.h"
#include "engine/tcp_wire.h"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

#define TCP_CONNECT_TIMEOUT_MS 5000
/* Below this a batch is not striped: one request on one connection beats waking a second worker. */
#define TCP_STRIPE_MIN_BYTES (256u << 10)

typedef struct piece {
    uint8_t hdr[PDL_TCP_REQ_HDR];
    uint8_t segs[PDL_TCP_MAX_SEGS * PDL_TCP_SEG];
    struct iovec data[PDL_TCP_MAX_SEGS];    /* local ranges */
    struct iovec send[PDL_TCP_MAX_SEGS + 2]; /* header, segments, [payload] */
    size_t nseg, nsend;
    uint64_t bytes, tag;
} piece_t;

typedef struct tcp_conn {
    int fd;
    pthread_mutex_t mu;
    uint64_t next_tag;
    piece_t *pc; /* two, allocated on first use */
} tcp_conn_t;

typedef struct tcp_session {
    int n;
    tcp_conn_t *c;
} tcp_session_t;

/* ---------------------------------------------------------------- I/O helpers */

static ssize_t iov_advance(struct iovec *v, size_t *i, size_t n, size_t done)
{
    while (done > 0 && *i < n) {
        if (done >= v[*i].iov_len) {
            done -= v[*i].iov_len;
            (*i)++;
        } else {
            v[*i].iov_base = (uint8_t *)v[*i].iov_base + done;
            v[*i].iov_len -= done;
            done = 0;
        }
    }
    return 0;
}

/*
 * Bytes per recvmsg(MSG_WAITALL). One call for a whole 64 MiB response keeps the socket locked while
 * it copies and delays window updates; 256 KiB calls measured 1.1-1.2x the stream ceiling against 0.6x
 * (with the owner's 1 MiB sends, tcp_server.c).
 */
#define TCP_RECV_CALL_MAX (256u << 10)
#define TCP_SEND_CALL_MAX (1u << 20)

/* 0 on success, else -1 with errno (0 for EOF). */
static int send_all(int fd, struct iovec *v, size_t n)
{
    size_t i = 0;
    while (i < n) {
        /* At most TCP_SEND_CALL_MAX bytes per call (see tcp_server.c): the iovec list is cut there. */
        size_t k = 0, bytes = 0, saved = 0;
        while (i + k < n && k < IOV_MAX && bytes < TCP_SEND_CALL_MAX)
            bytes += v[i + k++].iov_len;
        if (bytes > TCP_SEND_CALL_MAX) {
            saved = v[i + k - 1].iov_len;
            v[i + k - 1].iov_len -= bytes - TCP_SEND_CALL_MAX;
        }
        struct msghdr mh = {0};
        mh.msg_iov = &v[i];
        mh.msg_iovlen = k;
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (saved)
            v[i + k - 1].iov_len = saved;
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        iov_advance(v, &i, n, (size_t)w);
    }
    return 0;
}

static int recv_all(int fd, struct iovec *v, size_t n)
{
    size_t i = 0;
    size_t cap = TCP_RECV_CALL_MAX;
    while (i < n) {
        if (v[i].iov_len == 0) {
            i++;
            continue;
        }
        /* At most `cap` bytes per call: the iovec list is cut there (the cut iovec is restored). */
        size_t k = 0, bytes = 0;
        while (i + k < n && k < IOV_MAX && bytes < cap) {
            bytes += v[i + k].iov_len;
            k++;
        }
        size_t saved = 0;
        if (bytes > cap) {
            saved = v[i + k - 1].iov_len;
            v[i + k - 1].iov_len -= bytes - cap;
        }
        struct msghdr mh = {0};
        mh.msg_iov = &v[i];
        mh.msg_iovlen = k;
        ssize_t r = recvmsg(fd, &mh, MSG_WAITALL);
        if (saved)
            v[i + k - 1].iov_len = saved;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0) {
            errno = 0;
            return -1;
        }
        iov_advance(v, &i, n, (size_t)r);
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

static int connect_timeout(const struct addrinfo *ai, int timeout_ms, int *fd_out)
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
    pdl__tcp_tune_socket(fd);
    *fd_out = fd;
    return 0;
}

static pdl_status_t hello(pdl_session_t *s, int ci, int fd, pdl_error_t *err)
{
    const char *key = s->rmem.engine_key;
    size_t klen = strlen(key);
    if (klen == 0 || klen > PDL_TCP_MAX_KEY)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: remote key '%s' too long for the tcp HELLO",
                             s->engine->key, key);
    struct timeval tv = {TCP_CONNECT_TIMEOUT_MS / 1000, 0}, zero = {0, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    uint8_t hdr[PDL_TCP_REQ_HDR], resp[PDL_TCP_RESP_HDR + PDL_TCP_MAX_MSG + 1];
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, PDL_TCP_OP_HELLO, 0, 0, 0, klen, 0};
    pdl_tcp_req_encode(hdr, &r);
    struct iovec v[2] = {{hdr, sizeof(hdr)}, {(void *)key, klen}};
    struct iovec rv[1] = {{resp, PDL_TCP_RESP_HDR}};
    if (send_all(fd, v, 2) != 0 || recv_all(fd, rv, 1) != 0) {
        int en = errno;
        if (en == EAGAIN || en == EWOULDBLOCK)
            return pdl_error_set(err, PDL_ERR_TIMEOUT, "engine %s: engine %s at %s:%u did not answer HELLO within %d ms",
                                 s->engine->key, key, s->remote->host, s->remote->port, TCP_CONNECT_TIMEOUT_MS);
        return pdl_error_set(err, en == 0 || en == ECONNRESET ? PDL_ERR_PEER_GONE : PDL_ERR_TRANSPORT,
                             "engine %s: HELLO on connection %d to engine %s at %s:%u: %s", s->engine->key, ci + 1, key,
                             s->remote->host, s->remote->port, en == 0 ? "connection closed" : strerror(en));
    }
    pdl_tcp_resp_t rr;
    pdl_tcp_resp_decode(resp, &rr);
    if (rr.magic != PDL_TCP_RESP_MAGIC || rr.version != PDL_TCP_VERSION || rr.msg_len > PDL_TCP_MAX_MSG)
        return pdl_error_set(err, PDL_ERR_MISMATCH,
                             "engine %s: %s:%u does not speak pdlink tcp version %d (magic 0x%08x version %u)",
                             s->engine->key, s->remote->host, s->remote->port, PDL_TCP_VERSION, rr.magic, rr.version);
    if (rr.status != 0) {
        struct iovec mv[1] = {{resp + PDL_TCP_RESP_HDR, rr.msg_len}};
        if (rr.msg_len == 0 || recv_all(fd, mv, 1) != 0)
            rr.msg_len = 0;
        resp[PDL_TCP_RESP_HDR + rr.msg_len] = '\0';
        return pdl_error_set(err, PDL_ERR_MISMATCH, "engine %s: %s:%u refused HELLO: %s", s->engine->key,
                             s->remote->host, s->remote->port, (char *)resp + PDL_TCP_RESP_HDR);
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &zero, sizeof(zero));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &zero, sizeof(zero));
    return PDL_OK;
}

static void session_free(tcp_session_t *ts)
{
    for (int i = 0; i < ts->n; i++) {
        if (ts->c[i].fd >= 0)
            close(ts->c[i].fd);
        pthread_mutex_destroy(&ts->c[i].mu);
        free(ts->c[i].pc);
    }
    free(ts->c);
    free(ts);
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
        pthread_mutex_init(&ts->c[i].mu, NULL);
        ts->n++;
    }
    s->bk = ts;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%u", r->port);
    int rc = getaddrinfo(r->host, port, &hints, &ai);
    pdl_status_t st;
    if (rc != 0) {
        st = pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: cannot resolve host '%s' of engine %s: %s", e->key,
                           r->host, r->key, gai_strerror(rc));
        goto fail;
    }
    for (int i = 0; i < ts->n; i++) {
        int en = connect_timeout(ai, TCP_CONNECT_TIMEOUT_MS, &ts->c[i].fd);
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

typedef struct cursor {
    size_t i, end;
    uint64_t skip;
} cursor_t;

static void build_piece(pdl_session_t *s, pdl_batch_t *b, tcp_conn_t *c, piece_t *p, cursor_t *cur)
{
    uint8_t *local = s->local->ptr;
    p->nseg = 0;
    p->bytes = 0;
    while (cur->i < cur->end && p->nseg < PDL_TCP_MAX_SEGS && p->bytes < PDL_TCP_MAX_REQ_BYTES) {
        const pdl_desc_t *d = &b->d[cur->i];
        uint64_t len = d->len - cur->skip;
        uint64_t room = PDL_TCP_MAX_REQ_BYTES - p->bytes;
        if (len > room)
            len = room;
        pdl_tcp_put64(p->segs + p->nseg * PDL_TCP_SEG, d->remote_off + cur->skip);
        pdl_tcp_put64(p->segs + p->nseg * PDL_TCP_SEG + 8, len);
        p->data[p->nseg] = (struct iovec){local + d->local_off + cur->skip, len};
        p->nseg++;
        p->bytes += len;
        cur->skip += len;
        if (cur->skip == d->len) {
            cur->i++;
            cur->skip = 0;
        }
    }
    p->tag = ++c->next_tag;
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION,
                       (uint16_t)(b->op == PDL_OP_READ ? PDL_TCP_OP_READ : PDL_TCP_OP_WRITE),
                       (uint32_t)p->nseg, 0, s->rmem.id, p->bytes, p->tag};
    pdl_tcp_req_encode(p->hdr, &r);
    p->send[0] = (struct iovec){p->hdr, sizeof(p->hdr)};
    p->send[1] = (struct iovec){p->segs, p->nseg * PDL_TCP_SEG};
    p->nsend = 2;
    if (b->op == PDL_OP_WRITE) {
        memcpy(&p->send[2], p->data, p->nseg * sizeof(struct iovec));
        p->nsend += p->nseg;
    }
}

/*
 * Receive the response to piece p. Returns PDL_OK, a refusal status (connection still in sync, err
 * filled), or -1000 on an I/O or framing error (err filled, session broken).
 */
#define IO_BROKEN ((pdl_status_t)-1000)
static pdl_status_t recv_response(pdl_session_t *s, pdl_batch_t *b, int ci, tcp_conn_t *c, piece_t *p,
                                  pdl_error_t *err)
{
    const char *what = b->op == PDL_OP_READ ? "read" : "write";
    uint8_t hdr[PDL_TCP_RESP_HDR];
    char msg[PDL_TCP_MAX_MSG + 1];
    struct iovec hv[1] = {{hdr, sizeof(hdr)}};
    if (recv_all(c->fd, hv, 1) != 0) {
        io_fail(s, ci, what, errno, atomic_load(&b->cancel), err);
        return IO_BROKEN;
    }
    pdl_tcp_resp_t r;
    pdl_tcp_resp_decode(hdr, &r);
    uint64_t want_payload = b->op == PDL_OP_READ && r.status == 0 ? p->bytes : 0;
    if (r.magic != PDL_TCP_RESP_MAGIC || r.version != PDL_TCP_VERSION || r.tag != p->tag ||
        r.msg_len > PDL_TCP_MAX_MSG || r.payload_len != want_payload) {
        pdl_error_set(err, PDL_ERR_TRANSPORT,
                      "engine %s: malformed response from engine %s on connection %d (magic 0x%08x tag %" PRIu64
                      "/%" PRIu64 " payload %" PRIu64 "/%" PRIu64 ")",
                      s->engine->key, s->rmem.engine_key, ci + 1, r.magic, r.tag, p->tag, r.payload_len, want_payload);
        pdl__session_break(s, PDL_ERR_TRANSPORT, err ? err->msg : "malformed response");
        return IO_BROKEN;
    }
    if (r.status != 0) {
        struct iovec mv[1] = {{msg, r.msg_len}};
        if (r.msg_len > 0 && recv_all(c->fd, mv, 1) != 0) {
            io_fail(s, ci, what, errno, atomic_load(&b->cancel), err);
            return IO_BROKEN;
        }
        msg[r.msg_len] = '\0';
        pdl_status_t st = (r.status < 0 && r.status >= PDL_ERR_SYSTEM) ? (pdl_status_t)r.status : PDL_ERR_TRANSPORT;
        return pdl_error_set(err, st, "engine %s: %s", s->engine->key, msg);
    }
    if (b->op == PDL_OP_READ && recv_all(c->fd, p->data, p->nseg) != 0) {
        io_fail(s, ci, what, errno, atomic_load(&b->cancel), err);
        return IO_BROKEN;
    }
    return PDL_OK;
}

static pdl_status_t tcp_run_chunk(pdl_session_t *s, pdl_batch_t *b, int idx, pdl_error_t *err)
{
    tcp_session_t *ts = s->bk;
    int ci = idx % ts->n;
    tcp_conn_t *c = &ts->c[ci];
    const char *what = b->op == PDL_OP_READ ? "read" : "write";
    pthread_mutex_lock(&c->mu);
    int broken = atomic_load(&s->broken);
    if (broken != 0) {
        pthread_mutex_lock(&s->mu);
        pdl_status_t st = pdl_error_set(err, (pdl_status_t)broken, "%s", s->broken_msg);
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    if (c->pc == NULL && (c->pc = malloc(2 * sizeof(piece_t))) == NULL) {
        pthread_mutex_unlock(&c->mu);
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", s->engine->key);
    }
    cursor_t cur = {b->chunks[idx].first, b->chunks[idx].first + b->chunks[idx].count, 0};
    pdl_status_t result = PDL_OK;
    pdl_error_t first_err;
    pdl_error_clear(&first_err);
    int k = 0;
    build_piece(s, b, c, &c->pc[k], &cur);
    if (send_all(c->fd, c->pc[k].send, c->pc[k].nsend) != 0) {
        pdl_status_t st = io_fail(s, ci, what, errno, atomic_load(&b->cancel), err);
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    for (;;) {
        /* Keep a second request queued at the owner while the first one's response arrives. */
        bool more = cur.i < cur.end && result == PDL_OK && !atomic_load(&b->cancel);
        if (more) {
            build_piece(s, b, c, &c->pc[1 - k], &cur);
            if (send_all(c->fd, c->pc[1 - k].send, c->pc[1 - k].nsend) != 0) {
                pdl_status_t st = io_fail(s, ci, what, errno, atomic_load(&b->cancel), err);
                pthread_mutex_unlock(&c->mu);
                return st;
            }
        }
        pdl_error_t e1;
        pdl_status_t st = recv_response(s, b, ci, c, &c->pc[k], &e1);
        if (st == IO_BROKEN) {
            if (err)
                *err = e1;
            pthread_mutex_unlock(&c->mu);
            return e1.status;
        }
        if (st != PDL_OK && result == PDL_OK) {
            result = st;
            first_err = e1;
        }
        if (!more)
            break;
        k = 1 - k;
    }
    pthread_mutex_unlock(&c->mu);
    if (result == PDL_OK && cur.i < cur.end)
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "engine %s: batch cancelled", s->engine->key);
    if (result != PDL_OK && err)
        *err = first_err;
    return result;
}

/* ---------------------------------------------------------------- engine hooks */

static pdl_status_t tcp_engine_init(pdl_engine_t *e, pdl_error_t *err)
{
    pdl_tcp_server_t *srv = NULL;
    pdl_status_t st = pdl__tcp_server_start(e, &srv, err);
    if (st == PDL_OK)
        e->bk = srv;
    return st;
}

static void tcp_engine_fini(pdl_engine_t *e)
{
    pdl__tcp_server_stop(e->bk);
    e->bk = NULL;
}

static pdl_status_t tcp_remote_add(pdl_engine_t *e, pdl_remote_t *r, pdl_error_t *err)
{
    if (r->host[0] == '\0' || r->port == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "engine %s: remote engine %s has no tcp host/port", e->key, r->key);
    return PDL_OK;
}

static void tcp_remote_free(pdl_engine_t *e, pdl_remote_t *r)
{
    (void)e;
    (void)r;
}

static void tcp_mem_kick(pdl_engine_t *e, pdl_mem_t *m)
{
    if (e->bk)
        pdl__tcp_server_kick(e->bk, m);
}

const pdl_backend_ops_t pdl__tcp_ops = {
    .name = "tcp",
    .caps = PDL_BACKEND_CAP_SERVER,
    .engine_init = tcp_engine_init,
    .engine_fini = tcp_engine_fini,
    .remote_add = tcp_remote_add,
    .remote_free = tcp_remote_free,
    .mem_kick = tcp_mem_kick,
    .session_open = tcp_session_open,
    .session_close = tcp_session_close,
    .session_kill = tcp_session_kill,
    .session_check = tcp_session_check,
    .plan = tcp_plan,
    .run_chunk = tcp_run_chunk,
};
