/*
 * http.c -- libmicrohttpd glue shared by pdlink-node and pdlink-router (see http.h).
 *
 * MHD runs `threads` polling threads (epoll) that own every socket. It calls the access handler several
 * times per request: once with the headers (when *req_cls is still NULL: we allocate the request and
 * charge a declared Content-Length to the body budget), once per chunk of upload data, and once more with
 * no data when the body is complete. Then the request is suspended and queued for a worker; the worker
 * runs the program's handler, whose reply is recorded on the request, and resumes the connection; MHD
 * calls the access handler a last time, which queues the recorded response. Queueing from inside the
 * access handler keeps to MHD's rule that responses are queued from its callbacks.
 *
 *   headers ─▶ READING ─(body complete: suspend, queue)─▶ RUNNING (worker: handler)
 *           ─(resume)─▶ DONE (MHD thread: queue the response)
 *
 * A streamed body is a pump: the worker calls the program's reader into a one-chunk buffer; MHD's content
 * reader copies it out, and when it is empty (the program's reader is blocked upstream) suspends the
 * connection and returns 0, which MHD allows only for a suspended connection; the worker resumes it when
 * the next chunk (or the end) is there. So a blocked stream holds a worker and no polling thread.
 *
 * Bodies grow by doubling up to max_body; past it, or past the listener's body budget, chunks are dropped
 * (still acknowledged, so MHD keeps reading and the client gets the handler's answer rather than a
 * reset). The budget counts bytes received, not declared: a Content-Length costs nothing until its bytes
 * arrive, so clients that announce 64 MiB and trickle hold what they sent. Each client address (IPv6: its
 * /64) also has a share of the budget (CLIENT_SHARE_DIV), kept in CLIENT_SLOTS counters indexed by a keyed
 * hash of the address, so a few addresses cannot take all of it; two addresses that share a slot share a
 * share. A declared length over max_body is answered at the headers (no "100 Continue", no body read);
 * so are duplicate Content-Length headers and Content-Length with Transfer-Encoding (400).
 *
 * Deadlines: MHD's idle timeout (MHD_OPTION_CONNECTION_TIMEOUT, which suspended connections do not count
 * against: a request waiting for its worker or a stream waiting for its upstream is not idle) restarts on
 * every byte. So every connection is also tracked from MHD's connection notification (http_sock_t): its
 * phase (HEADERS from the open or the previous response, BODY from the headers, BUSY once the request is
 * complete) and when that phase began. A reaper thread shuts down (shutdown(2), never close: the socket
 * stays MHD's) the sockets whose HEADERS phase passed header_timeout_s or whose BODY phase passed
 * body_timeout_s; MHD then reads the end of the stream and closes the connection itself. The closed
 * notification unlinks a socket under the same lock the reaper holds, and MHD closes the descriptor only
 * after that notification, so the reaper never shuts down a descriptor number that was reused.
 *
 * Connection counts are MHD's global and per-IP limits. When the process runs out of descriptors MHD
 * itself stops polling the listening socket until a connection closes; its messages about that are
 * logged as warnings at most once per PDL_HTTP_WARN_EVERY_MS.
 */
#include "app/http.h"

#include <netdb.h>
#include <stddef.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>
#include <sodium.h>

#include "app/buf.h"
#include "common/clock.h"
#include "common/siphash.h"
#include "common/workq.h"
#include "common/log.h"

_Static_assert(PDL_HTTP_STREAM_END == MHD_CONTENT_READER_END_OF_STREAM, "reader codes are MHD's");
_Static_assert(PDL_HTTP_STREAM_ERROR == MHD_CONTENT_READER_END_WITH_ERROR, "reader codes are MHD's");
_Static_assert(PDL_HTTP_SIZE_UNKNOWN == MHD_SIZE_UNKNOWN, "unknown size is MHD's");

/* One chunk of a streamed body: what MHD asks for at most per call (its buffer), so one copy per call. */
#define PUMP_CHUNK 16384
/* Resource-limit warnings from MHD come once per rejected or failed accept; one line per 10 s is enough. */
#define PDL_HTTP_WARN_EVERY_MS 10000
/* One client address holds at most 1/PER_CLIENT_DIV of the connections unless the program says
 * otherwise (max_per_client). A node behind a router sees all its traffic from one address, but a router
 * holds about one connection per request in flight, and a node runs at most `workers` requests at once. */
#define PER_CLIENT_DIV 4
/* Counters of body bytes per client address: 32 KiB of atomics per listener, and a collision (two clients
 * sharing a share) has odds of one in this many per pair of addresses. */
#define CLIENT_SLOTS 4096
/* One client address holds at most this fraction of the body budget (but always at least one max_body),
 * so it takes nine addresses sending real bytes, not four trickling ones, to fill the budget. */
#define CLIENT_SHARE_DIV 8
/* How often the reaper looks at the deadlines; a deadline is met to within this. */
#define REAPER_TICK_MS 250

typedef struct http_pump http_pump_t;

typedef enum { SOCK_HEADERS, SOCK_BODY, SOCK_BUSY } sock_phase_t;

/* One client connection from accept to close (MHD's socket context), for the deadlines and the shares. */
typedef struct http_sock {
    int fd;
    uint32_t slot;          /* the client address's counter in h->client_held */
    sock_phase_t phase;
    uint64_t phase_ms;      /* when the phase began */
    bool cut;               /* shut down by the reaper */
    struct http_sock *prev, *next;
} http_sock_t;

struct pdl_http {
    struct MHD_Daemon *daemon;
    pdl_http_handler_fn handler, refuse;
    void *cls;
    size_t max_body;
    size_t body_budget;
    atomic_size_t body_held;
    atomic_uint_fast64_t refused_body, refused_headers, deadline_closed;
    atomic_uint_fast64_t warn_last_ms, warn_dropped;
    size_t client_share;         /* bytes of bodies one client slot may hold */
    atomic_size_t *client_held;  /* CLIENT_SLOTS counters */
    uint8_t slot_key[PDL_SIPHASH_KEY_LEN];

    unsigned header_timeout_s, body_timeout_s;
    pthread_mutex_t socks_mu;    /* guards socks and every http_sock_t's phase; taken alone */
    http_sock_t *socks;
    pthread_cond_t reaper_cv;
    pthread_t reaper;
    bool reaper_started, reaper_stop;

    pdl_workq_t workers;         /* complete requests waiting for, or run by, a worker */
    pthread_mutex_t mu;          /* guards the two below; taken before the queue's lock */
    http_pump_t *pumps;          /* streams whose reader is still running, to wake at stop */
    bool stopping;               /* no more requests for the queue */
};

typedef enum { CONN_READING, CONN_RUNNING, CONN_DONE } conn_state_t;

struct pdl_http_conn {
    pdl_http_t *h;
    struct MHD_Connection *mc;
    const char *url, *method;
    char *body;
    size_t len, cap, charged; /* charged: bytes counted against h->body_budget and the client's share */
    http_sock_t *sock;        /* the connection's tracking (NULL if it could not be allocated) */
    uint32_t slot;
    bool too_large, over_budget;
    conn_state_t state;
    int ret;                  /* the handler's MHD_Result */
    struct MHD_Response *resp;
    unsigned status;
    http_pump_t *pump;        /* set by pdl_http_reply_stream, run by the worker after the handler */
    pdl_workq_item_t item;    /* in h->workers */
};

struct http_pump {
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* the chunk was drained, or the client is gone, or stopping */
    struct MHD_Connection *mc;
    pdl_http_reader_fn reader;
    void *cls;
    void (*free_fn)(void *cls);
    char buf[PUMP_CHUNK];
    size_t len, off;
    uint64_t pos;
    bool eof, error, gone, stopping, suspended;
    int refs;                 /* the worker and MHD's response */
    http_pump_t *prev, *next; /* in h->pumps */
};

/* ---- the body budget ------------------------------------------------------------------------- */

/* Add n to *ctr unless that passes limit; false (nothing added) then. */
static bool counter_take(atomic_size_t *ctr, size_t limit, size_t n)
{
    size_t held = atomic_load(ctr);
    do {
        if (n > limit || held > limit - n)
            return false;
    } while (!atomic_compare_exchange_weak(ctr, &held, held + n));
    return true;
}

/* Count n more bytes against the budget and the client's share; false (nothing counted) when either would
 * go past its limit. */
static bool budget_take(pdl_http_t *h, pdl_http_conn_t *c, size_t n)
{
    if (!counter_take(&h->client_held[c->slot], h->client_share, n))
        return false;
    if (!counter_take(&h->body_held, h->body_budget, n)) {
        atomic_fetch_sub(&h->client_held[c->slot], n);
        return false;
    }
    c->charged += n;
    return true;
}

static void body_drop(pdl_http_conn_t *c)
{
    atomic_fetch_sub(&c->h->body_held, c->charged);
    atomic_fetch_sub(&c->h->client_held[c->slot], c->charged);
    c->charged = 0;
    free(c->body);
    c->body = NULL;
    c->len = c->cap = 0;
}

/* Append a chunk; false only when memory runs out. */
static bool body_append(pdl_http_conn_t *c, const char *data, size_t n)
{
    pdl_http_t *h = c->h;
    if (c->too_large || c->over_budget)
        return true;
    if (n > h->max_body - c->len) {
        c->too_large = true;
        atomic_fetch_add(&h->refused_body, 1);
        body_drop(c);
        return true;
    }
    /* Bytes received are what is charged; the buffer holds at most twice that (it grows by doubling). */
    if (!budget_take(h, c, n)) {
        c->over_budget = true;
        atomic_fetch_add(&h->refused_body, 1);
        body_drop(c);
        return true;
    }
    size_t cap = c->cap;
    char *p = c->body;
    if (!pdl_buf_reserve(&p, &cap, c->len + n + 1, 4096))
        return false;
    c->body = p;
    c->cap = cap;
    memcpy(c->body + c->len, data, n);
    c->len += n;
    c->body[c->len] = '\0';
    return true;
}

/* At the headers: a declared length over max_body is refused before any of it is read. Nothing is
 * charged for a declared length; its bytes are, as they arrive. */
static void body_declare(pdl_http_conn_t *c)
{
    const char *cl = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl == NULL)
        return;
    char *end = NULL;
    unsigned long long v = strtoull(cl, &end, 10);
    if (end == cl || *end != '\0' || v == 0)
        return; /* MHD refuses a malformed length itself */
    if (v > c->h->max_body) {
        c->too_large = true;
        atomic_fetch_add(&c->h->refused_body, 1);
    }
}

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    (void)value;
    unsigned *n = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0)
        n[0]++;
    else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0)
        n[1]++;
    return MHD_YES;
}

/* Framing another parser on the path could read differently (request smuggling): two Content-Length
 * headers (MHD uses the first), or Content-Length with Transfer-Encoding. NULL when the framing is plain. */
static const char *framing_problem(struct MHD_Connection *mc)
{
    unsigned n[2] = {0, 0};
    MHD_get_connection_values(mc, MHD_HEADER_KIND, count_framing, n);
    if (n[0] > 1)
        return "more than one Content-Length header";
    if (n[0] == 1 && n[1] > 0)
        return "Content-Length together with Transfer-Encoding";
    return NULL;
}

/* ---- streamed bodies ---------------------------------------------------------------------------- */

static void pump_unref(http_pump_t *p)
{
    pthread_mutex_lock(&p->mu);
    bool last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (last) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
    }
}

/* MHD's content reader, on a polling thread: never blocks. */
static ssize_t pump_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    http_pump_t *p = cls;
    pthread_mutex_lock(&p->mu);
    ssize_t ret;
    if (p->off < p->len) {
        size_t n = p->len - p->off < max ? p->len - p->off : max;
        memcpy(buf, p->buf + p->off, n);
        p->off += n;
        if (p->off == p->len) {
            p->off = p->len = 0;
            pthread_cond_signal(&p->cv);
        }
        ret = (ssize_t)n;
    } else if (p->eof) {
        ret = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (p->error) {
        ret = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
        /* Nothing yet: park the connection until the worker has a chunk (it resumes under p->suspended). */
        p->suspended = true;
        MHD_suspend_connection(p->mc);
        ret = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return ret;
}

/* MHD is done with the response: the stream ended or the client went away. */
static void pump_gone(void *cls)
{
    http_pump_t *p = cls;
    pthread_mutex_lock(&p->mu);
    p->gone = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pump_unref(p);
}

/* Hand a suspended connection back to MHD. Called without p->mu: MHD takes its own locks in resume. */
static void pump_wake(http_pump_t *p, bool suspended)
{
    if (suspended)
        MHD_resume_connection(p->mc);
}

/* The worker's half: feed the program's reader into the chunk until the end, an error, the client gone or
 * the listener stopping; then free the program's state. */
static void pump_run(pdl_http_t *h, http_pump_t *p)
{
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->len > 0 && !p->gone && !p->stopping)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->gone || p->stopping)
            break;
        pthread_mutex_unlock(&p->mu);
        ssize_t n = p->reader(p->cls, p->pos, p->buf, sizeof(p->buf));
        pthread_mutex_lock(&p->mu);
        if (n >= 0) {
            p->len = (size_t)n;
            p->off = 0;
            p->pos += (uint64_t)n;
        } else if (n == MHD_CONTENT_READER_END_OF_STREAM) {
            p->eof = true;
        } else {
            p->error = true;
        }
        if (n != 0 || p->eof || p->error) {
            bool s = p->suspended && !p->gone;
            p->suspended = false;
            pthread_mutex_unlock(&p->mu);
            pump_wake(p, s);
            pthread_mutex_lock(&p->mu);
        }
        if (p->eof || p->error)
            break;
    }
    /* Stopping mid-stream: MHD must not find the connection suspended at MHD_stop_daemon. */
    bool s = false;
    if (!p->eof && !p->gone) {
        p->error = true;
        s = p->suspended;
        p->suspended = false;
    }
    pthread_mutex_unlock(&p->mu);
    pump_wake(p, s);
    p->free_fn(p->cls);

    pthread_mutex_lock(&h->mu);
    if (p->prev)
        p->prev->next = p->next;
    else
        h->pumps = p->next;
    if (p->next)
        p->next->prev = p->prev;
    pthread_mutex_unlock(&h->mu);
    pump_unref(p);
}

/* ---- workers ---------------------------------------------------------------------------------- */

static void record(pdl_http_conn_t *c, unsigned status, struct MHD_Response *r)
{
    if (c->resp != NULL) /* a handler that answers twice: the first answer stands */
        MHD_destroy_response(r);
    else {
        c->resp = r;
        c->status = status;
    }
}

static void run_request(pdl_http_t *h, pdl_http_conn_t *c, bool stopping)
{
    int ret;
    if (stopping) {
        ret = pdl_http_replyf(c, 503, "shutting down");
    } else {
        pdl_http_request_t req = {.conn = c,
                                  .url = c->url,
                                  .method = c->method,
                                  .body = c->body ? c->body : "",
                                  .len = c->len,
                                  .too_large = c->too_large,
                                  .over_budget = c->over_budget};
        ret = h->handler(h->cls, &req);
    }
    http_pump_t *pump = c->pump;
    c->ret = ret == MHD_YES ? MHD_YES : MHD_NO;
    c->state = CONN_DONE;
    /* From here MHD owns c again (it may free it before this returns): only the pump is ours. */
    MHD_resume_connection(c->mc);
    if (pump != NULL)
        pump_run(h, pump);
}

static pdl_http_conn_t *conn_of(pdl_workq_item_t *job)
{
    return (pdl_http_conn_t *)(void *)((char *)job - offsetof(pdl_http_conn_t, item));
}

static void worker_run(void *arg, pdl_workq_item_t *job, bool stopping) { run_request(arg, conn_of(job), stopping); }

/* Under the queue's lock, before a worker can see the request (MHD thread, inside the access handler). */
static void admit(pdl_workq_item_t *job)
{
    pdl_http_conn_t *c = conn_of(job);
    c->state = CONN_RUNNING;
    MHD_suspend_connection(c->mc);
}

/* Queue a complete request for a worker, starting one when none is idle and the pool is not full.
 * Suspends the connection (MHD thread, inside the access handler). False when no worker exists and none
 * can be started: the caller answers itself. */
static bool enqueue(pdl_http_t *h, pdl_http_conn_t *c)
{
    pthread_mutex_lock(&h->mu);
    bool queued = !h->stopping && pdl__workq_offer(&h->workers, &c->item, admit);
    pthread_mutex_unlock(&h->mu);
    return queued;
}

/* ---- connections: deadlines and client slots ---------------------------------------------------- */

static void sock_phase(pdl_http_t *h, http_sock_t *sk, sock_phase_t phase)
{
    if (sk == NULL)
        return;
    pthread_mutex_lock(&h->socks_mu);
    sk->phase = phase;
    sk->phase_ms = pdl__clock_now_ms();
    pthread_mutex_unlock(&h->socks_mu);
}

/* The counter of a client address: IPv4 by its address, IPv6 by its /64 (one host holds a whole /64). */
static uint32_t client_slot(const pdl_http_t *h, const struct sockaddr *sa)
{
    uint8_t key[8];
    size_t n = 0;
    if (sa != NULL && sa->sa_family == AF_INET) {
        memcpy(key, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
        n = 4;
    } else if (sa != NULL && sa->sa_family == AF_INET6) {
        const uint8_t *a = ((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr.s6_addr;
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(a, v4mapped, 12) == 0) {
            memcpy(key, a + 12, 4);
            n = 4;
        } else {
            memcpy(key, a, 8);
            n = 8;
        }
    }
    return (uint32_t)(pdl__siphash24(h->slot_key, key, n) % CLIENT_SLOTS);
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    pdl_http_t *h = cls;
    http_sock_t *sk = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        sk = calloc(1, sizeof(*sk));
        *socket_context = sk;
        if (sk == NULL)
            return; /* untracked: only MHD's idle timeout applies to it */
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ad = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        sk->fd = fd ? fd->connect_fd : -1;
        sk->slot = client_slot(h, ad ? ad->client_addr : NULL);
        sk->phase = SOCK_HEADERS;
        sk->phase_ms = pdl__clock_now_ms();
        pthread_mutex_lock(&h->socks_mu);
        sk->next = h->socks;
        if (h->socks)
            h->socks->prev = sk;
        h->socks = sk;
        pthread_mutex_unlock(&h->socks_mu);
        return;
    }
    if (sk == NULL)
        return;
    /* MHD closes the descriptor after this returns: once unlinked, the reaper cannot reach it. */
    pthread_mutex_lock(&h->socks_mu);
    if (sk->prev)
        sk->prev->next = sk->next;
    else
        h->socks = sk->next;
    if (sk->next)
        sk->next->prev = sk->prev;
    pthread_mutex_unlock(&h->socks_mu);
    free(sk);
    *socket_context = NULL;
}

static void *reaper_main(void *arg)
{
    pdl_http_t *h = arg;
    uint64_t header_ms = (uint64_t)h->header_timeout_s * 1000, body_ms = (uint64_t)h->body_timeout_s * 1000;
    pthread_mutex_lock(&h->socks_mu);
    while (!h->reaper_stop) {
        uint64_t now = pdl__clock_now_ms(), cut = 0;
        for (http_sock_t *sk = h->socks; sk != NULL; sk = sk->next) {
            uint64_t limit = sk->phase == SOCK_HEADERS ? header_ms : sk->phase == SOCK_BODY ? body_ms : 0;
            if (sk->cut || limit == 0 || sk->fd < 0 || pdl__clock_since(now, sk->phase_ms) < limit)
                continue;
            shutdown(sk->fd, SHUT_RDWR);
            sk->cut = true;
            cut++;
        }
        if (cut > 0) {
            atomic_fetch_add(&h->deadline_closed, cut);
            pdl_debug("http: shut down %llu connection(s) past the header (%u s) or body (%u s) deadline",
                      (unsigned long long)cut, h->header_timeout_s, h->body_timeout_s);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)REAPER_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->reaper_cv, &h->socks_mu, &ts);
    }
    pthread_mutex_unlock(&h->socks_mu);
    return NULL;
}

static http_sock_t *sock_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

/* ---- MHD callbacks ------------------------------------------------------------------------------ */

/* Queue a response from the first call (the headers): MHD then sends no "100 Continue", reads no body and
 * closes the connection after the answer. */
static enum MHD_Result answer_at_headers(pdl_http_conn_t *c, unsigned status, const char *msg)
{
    if (c->resp == NULL) {
        if (pdl_http_replyf(c, status, "%s", msg) != MHD_YES || c->resp == NULL)
            return MHD_NO;
    }
    sock_phase(c->h, c->sock, SOCK_BUSY);
    enum MHD_Result r = MHD_queue_response(c->mc, c->status, c->resp);
    MHD_destroy_response(c->resp);
    c->resp = NULL;
    c->state = CONN_DONE;
    return r;
}

/* The headers are in (first call of a request): refuse what must not be read, else start the body's
 * deadline. */
static enum MHD_Result on_headers(pdl_http_t *h, pdl_http_conn_t *c)
{
    const char *bad = framing_problem(c->mc);
    if (bad != NULL) {
        atomic_fetch_add(&h->refused_headers, 1);
        char msg[160];
        snprintf(msg, sizeof(msg), "bad request framing: %s", bad);
        return answer_at_headers(c, 400, msg);
    }
    body_declare(c);
    if (c->too_large) {
        if (h->refuse != NULL) {
            pdl_http_request_t req = {.conn = c, .url = c->url, .method = c->method, .body = "", .too_large = true};
            h->refuse(h->cls, &req);
        }
        return answer_at_headers(c, 413, "request body too large");
    }
    sock_phase(h, c->sock, SOCK_BODY);
    return MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **req_cls)
{
    (void)version;
    pdl_http_t *h = cls;
    pdl_http_conn_t *c = *req_cls;
    if (c == NULL) {
        c = calloc(1, sizeof(*c));
        if (c == NULL)
            return MHD_NO;
        c->h = h;
        c->mc = mc;
        c->url = url;
        c->method = method;
        c->sock = sock_of(mc);
        c->slot = c->sock ? c->sock->slot : 0;
        *req_cls = c;
        return on_headers(h, c);
    }
    if (c->state == CONN_DONE) {
        if (c->resp == NULL)
            return MHD_NO; /* the handler answered nothing: close rather than hang */
        enum MHD_Result r = MHD_queue_response(mc, c->status, c->resp);
        MHD_destroy_response(c->resp);
        c->resp = NULL;
        return r == MHD_YES && c->ret == MHD_YES ? MHD_YES : MHD_NO;
    }
    if (*upload_size != 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        return body_append(c, upload, n) ? MHD_YES : MHD_NO;
    }
    sock_phase(h, c->sock, SOCK_BUSY);
    if (c->state == CONN_READING && enqueue(h, c))
        return MHD_YES;
    struct MHD_Response *r = MHD_create_response_from_buffer(13, (void *)"shutting down", MHD_RESPMEM_PERSISTENT);
    if (r == NULL)
        return MHD_NO;
    enum MHD_Result ret = MHD_queue_response(mc, 503, r);
    MHD_destroy_response(r);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **req_cls, enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    /* The next request's headers are due header_timeout_s from now (a keep-alive connection). */
    sock_phase(cls, sock_of(mc), SOCK_HEADERS);
    pdl_http_conn_t *c = *req_cls;
    if (c != NULL) {
        body_drop(c);
        if (c->resp != NULL)
            MHD_destroy_response(c->resp);
        free(c);
        *req_cls = NULL;
    }
}

/* MHD's complaints about one connection (garbage from a client) at debug level: the program reports what
 * matters through its answers. Running out of connections or descriptors is the operator's business: a
 * warning, at most once per PDL_HTTP_WARN_EVERY_MS with the count of lines held back. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    pdl_http_t *h = cls;
    char buf[512];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    size_t l = strlen(buf);
    while (l > 0 && buf[l - 1] == '\n')
        buf[--l] = '\0';
    bool limit = strstr(buf, "limit") != NULL || strstr(buf, "Too many") != NULL ||
                 strstr(buf, "accept") != NULL;
    if (!limit) {
        if (pdl_log_enabled(PDL_LOG_DEBUG))
            pdl_debug("http: %s", buf);
        return;
    }
    uint64_t now = pdl__clock_now_ms(), last = atomic_load(&h->warn_last_ms);
    if (last != 0 && pdl__clock_since(now, last) < PDL_HTTP_WARN_EVERY_MS) {
        atomic_fetch_add(&h->warn_dropped, 1);
        return;
    }
    if (!atomic_compare_exchange_strong(&h->warn_last_ms, &last, now)) {
        atomic_fetch_add(&h->warn_dropped, 1);
        return;
    }
    uint64_t dropped = atomic_exchange(&h->warn_dropped, 0);
    pdl_warn("http: %s (%llu more such lines in the last %d s)", buf, (unsigned long long)dropped,
             PDL_HTTP_WARN_EVERY_MS / 1000);
}

/* ---- the listener ------------------------------------------------------------------------------- */

const char *pdl_http_header(const pdl_http_request_t *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn->mc, MHD_HEADER_KIND, name);
}

bool pdl_http_bearer_ok(const pdl_http_request_t *req, const char *token)
{
    const char *h = pdl_http_header(req, "Authorization");
    if (h == NULL || strncmp(h, "Bearer ", 7) != 0)
        return false;
    h += 7;
    size_t n = strlen(token);
    return strlen(h) == n && sodium_memcmp(h, token, n) == 0;
}

/* The connection limit that leaves five eighths of the descriptors (at least 64) to the rest of the
 * process: ZeroMQ sockets (each rank's ROUTERs keep a sixteenth each, connector/listen.c, and libzmq
 * accepts a burst past that before the pause), upstream connections, the KV engine (its data port keeps
 * an eighth). Past it MHD stops accepting by itself; it must never meet
 * EMFILE, since MHD then pauses its listener until one of its connections closes (an idle timeout
 * away). */
static unsigned fd_bounded(unsigned want, const char *what)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return want;
    rlim_t reserve = rl.rlim_cur / 8 * 5 > 64 ? rl.rlim_cur / 8 * 5 : 64;
    rlim_t room = rl.rlim_cur > reserve + 16 ? rl.rlim_cur - reserve : 16;
    if ((rlim_t)want <= room)
        return want;
    pdl_warn("%s: --http-max-connections %u lowered to %u: the descriptor limit (ulimit -n) is %llu", what, want,
             (unsigned)room, (unsigned long long)rl.rlim_cur);
    return (unsigned)room;
}

/* Free a listener whose daemon is stopped or was never started (the worker pool is running unless
 * pdl_http_stop stopped it). */
static void http_free(pdl_http_t *h)
{
    if (h->reaper_started) {
        pthread_mutex_lock(&h->socks_mu);
        h->reaper_stop = true;
        pthread_cond_signal(&h->reaper_cv);
        pthread_mutex_unlock(&h->socks_mu);
        pthread_join(h->reaper, NULL);
    }
    if (!h->stopping) /* pdl_http_stop has stopped the pool already */
        pdl__workq_stop(&h->workers);
    pthread_cond_destroy(&h->reaper_cv);
    pthread_mutex_destroy(&h->socks_mu);
    pthread_mutex_destroy(&h->mu);
    free(h->client_held);
    free(h);
}

pdl_status_t pdl_http_start(const pdl_http_params_t *p, pdl_http_t **http_p, int *bound_port_p, pdl_error_t *err)
{
    const pdl_http_limits_t *l = &p->limits;
    if (l->max_connections == 0 || l->threads == 0 || l->workers == 0 || l->body_budget == 0)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "%s: HTTP limits must be > 0 (connections %u, threads %u, workers %u, body budget %zu)",
                             p->what, l->max_connections, l->threads, l->workers, l->body_budget);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof(port), "%d", p->port);
    int gai = getaddrinfo(p->host, port, &hints, &ai);
    if (gai != 0 || ai == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': cannot resolve: %s", p->what, p->host,
                             gai_strerror(gai));
    pdl_http_t *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        freeaddrinfo(ai);
        return pdl_error_set(err, PDL_ERR_NOMEM, "http: out of memory");
    }
    pdl_status_t st = pdl__workq_start_elastic(&h->workers, (int)l->workers, p->thread_stack_size, worker_run, h,
                                               p->what, err);
    if (st != PDL_OK) {
        free(h);
        freeaddrinfo(ai);
        return st;
    }
    h->handler = p->handler;
    h->refuse = p->refuse;
    h->cls = p->cls;
    h->max_body = p->max_body;
    h->body_budget = l->body_budget;
    h->client_share = l->body_budget / CLIENT_SHARE_DIV > p->max_body ? l->body_budget / CLIENT_SHARE_DIV : p->max_body;
    if (h->client_share > l->body_budget)
        h->client_share = l->body_budget;
    h->header_timeout_s = l->header_timeout_s;
    h->body_timeout_s = l->body_timeout_s;
    atomic_init(&h->body_held, 0);
    atomic_init(&h->refused_body, 0);
    atomic_init(&h->refused_headers, 0);
    atomic_init(&h->deadline_closed, 0);
    atomic_init(&h->warn_last_ms, 0);
    atomic_init(&h->warn_dropped, 0);
    pthread_mutex_init(&h->mu, NULL);
    pthread_mutex_init(&h->socks_mu, NULL);
    pthread_cond_init(&h->reaper_cv, NULL);
    randombytes_buf(h->slot_key, sizeof(h->slot_key));
    h->client_held = calloc(CLIENT_SLOTS, sizeof(*h->client_held));
    if (h->client_held == NULL) {
        http_free(h);
        freeaddrinfo(ai);
        return pdl_error_set(err, PDL_ERR_NOMEM, "http: out of memory");
    }
    if ((l->header_timeout_s > 0 || l->body_timeout_s > 0) && pthread_create(&h->reaper, NULL, reaper_main, h) != 0) {
        http_free(h);
        freeaddrinfo(ai);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "%s: cannot start the HTTP deadline thread", p->what);
    }
    h->reaper_started = l->header_timeout_s > 0 || l->body_timeout_s > 0;

    unsigned max_conn = fd_bounded(l->max_connections, p->what);
    /* A quarter each: two addresses trickling headers hold at most half the slots (at 3/4 each, two took
     * them all and every other client was refused until the header deadline cut them). */
    unsigned per_client = l->max_per_client != 0 ? l->max_per_client : max_conn / PER_CLIENT_DIV;
    if (per_client == 0)
        per_client = 1;
    if (per_client > max_conn)
        per_client = max_conn;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* Published before the daemon's threads start: a request may arrive at once, and its handler reads
     * the caller's copy of this pointer (e.g. the router's /metrics reads rt->http). */
    *http_p = h;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)p->port, NULL, NULL, &on_access, h, MHD_OPTION_EXTERNAL_LOGGER, &on_mhd_log, h,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, &on_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, &on_connection, h,
        MHD_OPTION_THREAD_POOL_SIZE, l->threads, MHD_OPTION_CONNECTION_LIMIT, max_conn,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_client, MHD_OPTION_CONNECTION_TIMEOUT, l->idle_timeout_s,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_END);
    freeaddrinfo(ai);
    pthread_mutex_lock(&h->mu); /* handlers already running read it (pdl_http_stats) */
    h->daemon = d;
    pthread_mutex_unlock(&h->mu);
    if (h->daemon == NULL) {
        *http_p = NULL;
        http_free(h);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "cannot listen for HTTP on %s:%d (address in use or not local?)",
                             p->host, p->port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port_p = info ? (int)info->port : p->port;
    pdl_debug("http %s:%d: %u polling threads, up to %u workers, %u connections (%u per client), idle timeout "
              "%u s, header deadline %u s, body deadline %u s, body budget %zu bytes (%zu per client)",
              p->host, *bound_port_p, l->threads, l->workers, max_conn, per_client, l->idle_timeout_s,
              l->header_timeout_s, l->body_timeout_s, l->body_budget, h->client_share);
    return PDL_OK;
}

void pdl_http_stop(pdl_http_t *http)
{
    if (http == NULL)
        return;
    pdl_http_t *h = http;
    pthread_mutex_lock(&h->mu);
    h->stopping = true;
    for (http_pump_t *p = h->pumps; p != NULL; p = p->next) {
        pthread_mutex_lock(&p->mu);
        p->stopping = true;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&h->mu);
    /* Workers answer what is queued with 503, finish their handler and stream, and resume every connection
     * they suspended: MHD_stop_daemon must find none suspended. MHD's threads, still running, queue
     * nothing more (h->stopping), so the queue is not touched once stopped. */
    pdl__workq_stop(&h->workers);
    MHD_stop_daemon(h->daemon);
    h->daemon = NULL;
    http_free(h);
}

void pdl_http_stats(pdl_http_t *http, pdl_http_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    if (http == NULL)
        return;
    pthread_mutex_lock(&http->mu);
    struct MHD_Daemon *d = http->daemon;
    pthread_mutex_unlock(&http->mu);
    const union MHD_DaemonInfo *info = d ? MHD_get_daemon_info(d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS) : NULL;
    out->connections = info ? info->num_connections : 0;
    int workers, busy, queued;
    pdl__workq_stats(&http->workers, &workers, &busy, &queued);
    out->workers = (unsigned)workers;
    out->busy = (unsigned)busy;
    out->queued = (unsigned)queued;
    out->body_bytes = atomic_load(&http->body_held);
    out->refused_body = atomic_load(&http->refused_body);
    out->refused_headers = atomic_load(&http->refused_headers);
    out->deadline_closed = atomic_load(&http->deadline_closed);
}

/* ---- replies ------------------------------------------------------------------------------------- */

/* Adds "Name: value" lines to r; a line without a name, or a name of 128 bytes or more, is skipped. */
static void add_header_lines(struct MHD_Response *r, const char *const *headers, size_t nheaders)
{
    for (size_t i = 0; i < nheaders; i++) {
        const char *colon = strchr(headers[i], ':');
        char name[128];
        size_t nl = colon ? (size_t)(colon - headers[i]) : 0;
        if (nl == 0 || nl >= sizeof(name))
            continue;
        memcpy(name, headers[i], nl);
        name[nl] = '\0';
        const char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        MHD_add_response_header(r, name, v);
    }
}

int pdl_http_reply_headers(pdl_http_conn_t *c, unsigned status, const char *content_type, const char *body, size_t len,
                           const char *const *headers, size_t nheaders)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            content_type ? content_type : "text/plain; charset=utf-8");
    add_header_lines(r, headers, nheaders);
    record(c, status, r);
    return MHD_YES;
}

int pdl_http_reply(pdl_http_conn_t *c, unsigned status, const char *content_type, const char *body, size_t len,
                   const char *request_id)
{
    if (request_id == NULL || request_id[0] == '\0')
        return pdl_http_reply_headers(c, status, content_type, body, len, NULL, 0);
    char stack[320];
    size_t n = strlen("X-Request-Id: ") + strlen(request_id) + 1;
    char *line = n <= sizeof(stack) ? stack : malloc(n);
    if (line == NULL)
        return MHD_NO;
    snprintf(line, n, "X-Request-Id: %s", request_id);
    const char *h[1] = {line};
    int ret = pdl_http_reply_headers(c, status, content_type, body, len, h, 1);
    if (line != stack)
        free(line);
    return ret;
}

int pdl_http_vreplyf(pdl_http_conn_t *c, unsigned status, const char *fmt, va_list ap)
{
    char buf[2048];
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n >= sizeof(buf) ? sizeof(buf) - 1 : (size_t)n;
    return pdl_http_reply(c, status, NULL, buf, len, NULL);
}

int pdl_http_replyf(pdl_http_conn_t *c, unsigned status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ret = pdl_http_vreplyf(c, status, fmt, ap);
    va_end(ap);
    return ret;
}

int pdl_http_reply_json(pdl_http_conn_t *c, unsigned status, json_t *obj, const char *request_id)
{
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (s == NULL)
        return pdl_http_reply(c, 500, NULL, "out of memory", 13, request_id);
    int ret = pdl_http_reply(c, status, "application/json", s, strlen(s), request_id);
    free(s);
    return ret;
}

int pdl_http_reply_stream(pdl_http_conn_t *c, unsigned status, uint64_t size, pdl_http_reader_fn reader, void *cls,
                          void (*free_fn)(void *cls), const char *const *headers, size_t nheaders)
{
    http_pump_t *p = c->pump == NULL && c->resp == NULL ? calloc(1, sizeof(*p)) : NULL;
    if (p == NULL) {
        free_fn(cls);
        return MHD_NO;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->mc = c->mc;
    p->reader = reader;
    p->cls = cls;
    p->free_fn = free_fn;
    p->refs = 2;
    struct MHD_Response *r = MHD_create_response_from_callback(size, PUMP_CHUNK, pump_read, p, pump_gone);
    if (r == NULL) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        free_fn(cls);
        return MHD_NO;
    }
    add_header_lines(r, headers, nheaders);
    pdl_http_t *h = c->h;
    pthread_mutex_lock(&h->mu);
    p->stopping = h->stopping;
    p->next = h->pumps;
    if (h->pumps)
        h->pumps->prev = p;
    h->pumps = p;
    pthread_mutex_unlock(&h->mu);
    record(c, status, r);
    c->pump = p;
    return MHD_YES;
}
