/*
 * http.h -- the libmicrohttpd glue of pdlink-node and pdlink-router: a listener, whole request bodies,
 * and the ways to answer (a copied buffer, formatted text, JSON, or a body pulled through a callback).
 *
 * Threading: MHD runs one thread per connection, so a handler may block (the node waits for a KV pull,
 * the router for the prefill leg) without holding up other requests. A handler is called once per
 * request, after the whole body has arrived; a body larger than max_body is not kept, and the handler
 * sees too_large instead (answering 413 is its choice, so each program keeps its own error shape).
 *
 * Every reply function queues one response and returns an MHD_Result (MHD_NO closes the connection);
 * bodies are copied, so the caller keeps ownership of what it passes.
 */
#ifndef PDL_APP_HTTP_H
#define PDL_APP_HTTP_H

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "pdlink/status.h"

struct MHD_Connection;
typedef struct pdl_http pdl_http_t;

typedef struct pdl_http_request {
    struct MHD_Connection *conn;
    const char *url;
    const char *method;
    const char *body; /* NUL-terminated ("" when none); valid until the handler returns */
    size_t len;
    bool too_large;   /* the body exceeded max_body and was dropped */
} pdl_http_request_t;

/* A request header's value (case-insensitive name), or NULL; valid until the handler returns. */
const char *pdl_http_header(const pdl_http_request_t *req, const char *name);

/* Answer one request; returns an MHD_Result. */
typedef int (*pdl_http_handler_fn)(void *cls, const pdl_http_request_t *req);

typedef struct pdl_http_params {
    const char *host;           /* bind address, resolved with getaddrinfo (IPv4 or IPv6) */
    int port;                   /* 0 = any free port, read back through *bound_port_p */
    const char *what;           /* names the listener in errors: "--host", "--prometheus-host" */
    size_t max_body;            /* bytes kept per request body */
    unsigned connection_limit;
    size_t thread_stack_size;   /* 0 = the system default */
    pdl_http_handler_fn handler;
    void *cls;                  /* passed to handler; must outlive pdl_http_stop */
} pdl_http_params_t;

/*
 * Listen and serve. Returns PDL_OK with *http_p and *bound_port_p set, PDL_ERR_INVALID when the host does
 * not resolve, PDL_ERR_NOMEM, or PDL_ERR_SYSTEM when MHD cannot listen (port in use, address not local);
 * err names the address.
 */
pdl_status_t pdl_http_start(const pdl_http_params_t *p, pdl_http_t **http_p, int *bound_port_p, pdl_error_t *err);
/* Stop listening, wait for the connection threads, free. Accepts NULL. */
void pdl_http_stop(pdl_http_t *http);

/* body[0, len) with a Content-Type (NULL: text/plain; charset=utf-8) and the "Name: value" header lines. */
int pdl_http_reply_headers(struct MHD_Connection *c, unsigned status, const char *content_type, const char *body,
                           size_t len, const char *const *headers, size_t nheaders);
/* pdl_http_reply_headers with, unless request_id is NULL or "", an X-Request-Id header. */
int pdl_http_reply(struct MHD_Connection *c, unsigned status, const char *content_type, const char *body, size_t len,
                   const char *request_id);
/* text/plain from a format; cut at 2 KiB. */
int pdl_http_replyf(struct MHD_Connection *c, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int pdl_http_vreplyf(struct MHD_Connection *c, unsigned status, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
/* application/json of obj, whose reference this takes (NULL means out of memory: a 500). */
int pdl_http_reply_json(struct MHD_Connection *c, unsigned status, json_t *obj, const char *request_id);

/* Produces the next bytes of a streamed body at pos into buf[0, max): returns the count, or
 * PDL_HTTP_STREAM_END at the end, or PDL_HTTP_STREAM_ERROR to cut the connection. */
typedef ssize_t (*pdl_http_reader_fn)(void *cls, uint64_t pos, char *buf, size_t max);
#define PDL_HTTP_STREAM_END ((ssize_t)-1)
#define PDL_HTTP_STREAM_ERROR ((ssize_t)-2)
#define PDL_HTTP_SIZE_UNKNOWN UINT64_MAX

/*
 * A body pulled through reader as the client drains it (SSE, or a relayed upstream body). size is the
 * Content-Length or PDL_HTTP_SIZE_UNKNOWN (chunked). headers are "Name: value" lines. free_fn(cls) runs
 * exactly once: when the response ends or the client goes away, or before this returns MHD_NO.
 */
int pdl_http_reply_stream(struct MHD_Connection *c, unsigned status, uint64_t size, pdl_http_reader_fn reader,
                          void *cls, void (*free_fn)(void *cls), const char *const *headers, size_t nheaders);

#endif /* PDL_APP_HTTP_H */
