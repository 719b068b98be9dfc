/*
 * http.h -- the libmicrohttpd glue of pdlink-node and pdlink-router: a listener, whole request bodies,
 * and the ways to answer (a copied buffer, formatted text, JSON, or a body pulled through a callback).
 *
 * Threading: a few MHD polling threads (epoll) own every connection, so an idle or slow client costs a
 * socket and no thread. A request whose body is complete is suspended and handed to a worker from a pool
 * of at most `workers` threads, started as needed; the handler runs there and may block (the node waits
 * for a KV pull, the router for the prefill leg). A streamed body's reader also runs on that worker,
 * which fills a buffer the polling thread drains, so a reader may block too (the router's reads the
 * decode's body). When every worker is busy, requests wait (suspended, not timed out) for one to free.
 *
 * A handler is called once per request, after the whole body has arrived; a body larger than max_body or
 * one that would take the bodies held at once past body_budget (or its client's share of it) is not kept,
 * and the handler sees too_large or over_budget instead (413 or 503 is its choice, so each program keeps
 * its error shape). A Content-Length over max_body is refused at the headers, before any body byte is
 * read or a "100 Continue" is sent: the params' `refuse` answers it on the polling thread.
 *
 * Deadlines a trickle cannot extend: a connection must deliver a request's headers within header_timeout_s
 * of opening (or of its previous response), and the body within body_timeout_s of the headers; past
 * either, the listener shuts the socket down (counted in deadline_closed). MHD's own idle timeout restarts
 * on every byte, so a client sending one byte per idle period would otherwise hold a connection forever.
 *
 * Every reply function records one response, which is queued when the handler returns, and returns an
 * MHD_Result (MHD_NO closes the connection); bodies are copied, so the caller keeps what it passes.
 */
#ifndef PDL_APP_HTTP_H
#define PDL_APP_HTTP_H

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "app/optab.h"
#include "pdlink/status.h"

typedef struct pdl_http pdl_http_t;
/* One request being answered; valid until the handler returns (or, for a stream, its free_fn runs). */
typedef struct pdl_http_conn pdl_http_conn_t;

typedef struct pdl_http_request {
    pdl_http_conn_t *conn;
    const char *url;
    const char *method;
    const char *body; /* NUL-terminated ("" when none); valid until the handler returns */
    size_t len;
    bool too_large;   /* the body exceeded max_body and was dropped */
    bool over_budget; /* the body would have taken the bodies held at once past body_budget; dropped */
} pdl_http_request_t;

/* A request header's value (case-insensitive name), or NULL; valid until the handler returns. */
const char *pdl_http_header(const pdl_http_request_t *req, const char *name);
/* Does the request carry "Authorization: Bearer <token>" (vLLM's --api-key check)? The token is compared
 * in constant time, so its bytes cannot be guessed one by one from response times. */
bool pdl_http_bearer_ok(const pdl_http_request_t *req, const char *token);

/* Answer one request; returns an MHD_Result. Runs on a worker thread, one call per request. */
typedef int (*pdl_http_handler_fn)(void *cls, const pdl_http_request_t *req);

/*
 * What one listener may hold. Every program sets its own defaults and lets the operator change them
 * with the PDL_HTTP_ROW_* flags (docs/node.md, docs/router.md).
 */
typedef struct pdl_http_limits {
    unsigned idle_timeout_s;  /* --http-idle-timeout: close a connection silent this long (0 = never) */
    unsigned header_timeout_s; /* --http-header-timeout: a request's headers, from the connection's open or
                                  its previous response (0 = never) */
    unsigned body_timeout_s;  /* --http-body-timeout: a request's whole body, from its headers (0 = never) */
    unsigned max_connections; /* --http-max-connections: all clients together */
    unsigned max_per_client;  /* --http-max-connections-per-client: one IP address (0 = 1/4 of the above) */
    unsigned threads;         /* --http-threads: MHD polling threads */
    unsigned workers;         /* --http-workers: at most this many requests run (block) at once */
    size_t body_budget;       /* bytes of request bodies held at once by the whole listener */
} pdl_http_limits_t;

/*
 * The shared flags as rows of a program's option table (app/optab.h): each macro gives a row's name,
 * kind, field and range, with T the program's options struct and M its pdl_http_limits_t member. The
 * program adds .def and .help, since a node and a router differ in their defaults and in what a worker
 * holds: {PDL_HTTP_ROW_THREADS(my_opts_t, http), .def = "2", .help = "polling threads"}.
 */
#define PDL__HTTP_ROW(T, M, NAME, FIELD, META, LO, HI)                                                           \
    .name = NAME, .kind = PDL_OPT_UINT, .metavar = META, .off = offsetof(T, M.FIELD), .lo = LO, .hi = HI
#define PDL_HTTP_ROW_IDLE_TIMEOUT(T, M) PDL__HTTP_ROW(T, M, "http-idle-timeout", idle_timeout_s, "SECONDS", 0, 86400)
#define PDL_HTTP_ROW_HEADER_TIMEOUT(T, M)                                                                        \
    PDL__HTTP_ROW(T, M, "http-header-timeout", header_timeout_s, "SECONDS", 0, 86400)
#define PDL_HTTP_ROW_BODY_TIMEOUT(T, M) PDL__HTTP_ROW(T, M, "http-body-timeout", body_timeout_s, "SECONDS", 0, 86400)
#define PDL_HTTP_ROW_MAX_CONNECTIONS(T, M)                                                                       \
    PDL__HTTP_ROW(T, M, "http-max-connections", max_connections, "N", 1, 1 << 20)
#define PDL_HTTP_ROW_MAX_PER_CLIENT(T, M)                                                                        \
    PDL__HTTP_ROW(T, M, "http-max-connections-per-client", max_per_client, "N", 0, 1 << 20)
#define PDL_HTTP_ROW_THREADS(T, M) PDL__HTTP_ROW(T, M, "http-threads", threads, "N", 1, 256)
#define PDL_HTTP_ROW_WORKERS(T, M) PDL__HTTP_ROW(T, M, "http-workers", workers, "N", 1, 1 << 16)

typedef struct pdl_http_params {
    const char *host;           /* bind address, resolved with getaddrinfo (IPv4 or IPv6) */
    int port;                   /* 0 = any free port, read back through *bound_port_p */
    const char *what;           /* names the listener in errors: "--host", "--prometheus-host" */
    size_t max_body;            /* bytes kept per request body */
    pdl_http_limits_t limits;
    size_t thread_stack_size;   /* of the workers; 0 = the system default */
    pdl_http_handler_fn handler;
    /* Answers a request whose Content-Length is over max_body (req->too_large, no body), at its headers and
     * on the polling thread: it must not block or stream. NULL: a plain-text 413. */
    pdl_http_handler_fn refuse;
    void *cls;                  /* passed to handler and refuse; must outlive pdl_http_stop */
} pdl_http_params_t;

/*
 * Listen and serve. *http_p is set before the first request can be served (handlers may read the
 * caller's copy) and reset to NULL on failure. Returns PDL_OK with *http_p and *bound_port_p set, PDL_ERR_INVALID when the host does
 * not resolve or a limit is 0 where it may not be, PDL_ERR_NOMEM, or PDL_ERR_SYSTEM when MHD cannot
 * listen (port in use, address not local); err names the address. max_connections is lowered (with a
 * warning) to leave a quarter of RLIMIT_NOFILE to the rest of the process, so MHD stops accepting at
 * its limit instead of running into EMFILE.
 */
pdl_status_t pdl_http_start(const pdl_http_params_t *p, pdl_http_t **http_p, int *bound_port_p, pdl_error_t *err);
/* Stop: queued requests get 503, running handlers and streams are waited for (a blocking reader must
 * return once its program is stopping), then MHD stops and everything is freed. Accepts NULL. */
void pdl_http_stop(pdl_http_t *http);

/* What a listener holds now, for /metrics. */
typedef struct pdl_http_stats {
    unsigned connections;  /* open client connections */
    unsigned workers;      /* worker threads started */
    unsigned busy;         /* workers running a handler or a stream */
    unsigned queued;       /* complete requests waiting for a worker */
    size_t body_bytes;     /* request body bytes held (counted against body_budget) */
    uint64_t refused_body; /* bodies refused: over max_body or over body_budget */
    uint64_t refused_headers; /* 400 at the headers: duplicate Content-Length, or Content-Length with
                                 Transfer-Encoding (a request another parser could split differently) */
    uint64_t deadline_closed; /* connections shut down past header_timeout_s or body_timeout_s */
} pdl_http_stats_t;
void pdl_http_stats(pdl_http_t *http, pdl_http_stats_t *out);

/* body[0, len) with a Content-Type (NULL: text/plain; charset=utf-8) and the "Name: value" header lines. */
int pdl_http_reply_headers(pdl_http_conn_t *c, unsigned status, const char *content_type, const char *body, size_t len,
                           const char *const *headers, size_t nheaders);
/* pdl_http_reply_headers with, unless request_id is NULL or "", an X-Request-Id header. */
int pdl_http_reply(pdl_http_conn_t *c, unsigned status, const char *content_type, const char *body, size_t len,
                   const char *request_id);
/* text/plain from a format; cut at 2 KiB. */
int pdl_http_replyf(pdl_http_conn_t *c, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int pdl_http_vreplyf(pdl_http_conn_t *c, unsigned status, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
/* application/json of obj, whose reference this takes (NULL means out of memory: a 500). */
int pdl_http_reply_json(pdl_http_conn_t *c, unsigned status, json_t *obj, const char *request_id);

/* Produces the next bytes of a streamed body at pos into buf[0, max): returns the count, or
 * PDL_HTTP_STREAM_END at the end, or PDL_HTTP_STREAM_ERROR to cut the connection. May block. */
typedef ssize_t (*pdl_http_reader_fn)(void *cls, uint64_t pos, char *buf, size_t max);
#define PDL_HTTP_STREAM_END ((ssize_t)-1)
#define PDL_HTTP_STREAM_ERROR ((ssize_t)-2)
#define PDL_HTTP_SIZE_UNKNOWN UINT64_MAX

/*
 * A body pulled through reader (on the handler's worker, after the handler returns) as the client drains
 * it (SSE, or a relayed upstream body). size is the Content-Length or PDL_HTTP_SIZE_UNKNOWN (chunked).
 * headers are "Name: value" lines. free_fn(cls) runs exactly once, on the worker: after the reader's last
 * call (the end, an error, the client gone, or the listener stopping), or before this returns MHD_NO.
 */
int pdl_http_reply_stream(pdl_http_conn_t *c, unsigned status, uint64_t size, pdl_http_reader_fn reader, void *cls,
                          void (*free_fn)(void *cls), const char *const *headers, size_t nheaders);

#endif /* PDL_APP_HTTP_H */
