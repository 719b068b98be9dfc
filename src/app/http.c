/*
 * http.c -- libmicrohttpd glue shared by pdlink-node and pdlink-router (see http.h).
 *
 * MHD calls the access handler several times per request: once with the headers (when *req_cls is still
 * NULL, we only allocate the body buffer), once per chunk of upload data, and once more with no data when
 * the body is complete, which is when the program's handler runs. The buffer grows by doubling up to
 * max_body; past it the chunks are dropped (still acknowledged, so MHD keeps reading and the client gets
 * the handler's answer rather than a reset).
 */
#include "app/http.h"

#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "app/buf.h"
#include "pdlink/log.h"

_Static_assert(PDL_HTTP_STREAM_END == MHD_CONTENT_READER_END_OF_STREAM, "reader codes are MHD's");
_Static_assert(PDL_HTTP_STREAM_ERROR == MHD_CONTENT_READER_END_WITH_ERROR, "reader codes are MHD's");
_Static_assert(PDL_HTTP_SIZE_UNKNOWN == MHD_SIZE_UNKNOWN, "unknown size is MHD's");

struct pdl_http {
    struct MHD_Daemon *daemon;
    pdl_http_handler_fn handler;
    void *cls;
    size_t max_body;
};

typedef struct http_body {
    char *p;
    size_t len, cap;
    bool too_large;
} http_body_t;

/* Append a chunk; false only when memory runs out. */
static bool body_append(http_body_t *b, const char *data, size_t n, size_t max)
{
    if (b->too_large || n > max - b->len) {
        b->too_large = true;
        return true;
    }
    if (!pdl_buf_reserve(&b->p, &b->cap, b->len + n + 1, 4096))
        return false;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **req_cls)
{
    (void)version;
    pdl_http_t *h = cls;
    http_body_t *b = *req_cls;
    if (b == NULL) {
        b = calloc(1, sizeof(*b));
        if (b == NULL)
            return MHD_NO;
        *req_cls = b;
        return MHD_YES;
    }
    if (*upload_size != 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        return body_append(b, upload, n, h->max_body) ? MHD_YES : MHD_NO;
    }
    pdl_http_request_t req = {
        .conn = c, .url = url, .method = method, .body = b->p ? b->p : "", .len = b->len, .too_large = b->too_large};
    return h->handler(h->cls, &req) == MHD_YES ? MHD_YES : MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    http_body_t *b = *req_cls;
    if (b != NULL) {
        free(b->p);
        free(b);
        *req_cls = NULL;
    }
}

/* MHD's own complaints (a client that sent garbage, a thread that could not start) at debug level: they
 * are about one connection, and the program reports what matters through its answers. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    if (!pdl_log_enabled(PDL_LOG_DEBUG))
        return;
    char buf[512];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    size_t l = strlen(buf);
    while (l > 0 && buf[l - 1] == '\n')
        buf[--l] = '\0';
    pdl_debug("http: %s", buf);
}

const char *pdl_http_header(const pdl_http_request_t *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

pdl_status_t pdl_http_start(const pdl_http_params_t *p, pdl_http_t **http_p, int *bound_port_p, pdl_error_t *err)
{
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
    h->handler = p->handler;
    h->cls = p->cls;
    h->max_body = p->max_body;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* No idle timeout: a client waiting for a long completion sends nothing for minutes. */
    h->daemon = MHD_start_daemon(
        flags, (uint16_t)p->port, NULL, NULL, &on_access, h, MHD_OPTION_EXTERNAL_LOGGER, &on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, &on_completed, NULL,
        MHD_OPTION_CONNECTION_LIMIT, p->connection_limit, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)0,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_THREAD_STACK_SIZE, p->thread_stack_size,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (h->daemon == NULL) {
        free(h);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "cannot listen for HTTP on %s:%d (address in use or not local?)",
                             p->host, p->port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port_p = info ? (int)info->port : p->port;
    *http_p = h;
    return PDL_OK;
}

void pdl_http_stop(pdl_http_t *http)
{
    if (http == NULL)
        return;
    MHD_stop_daemon(http->daemon);
    free(http);
}

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

int pdl_http_reply_headers(struct MHD_Connection *c, unsigned status, const char *content_type, const char *body,
                           size_t len, const char *const *headers, size_t nheaders)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            content_type ? content_type : "text/plain; charset=utf-8");
    add_header_lines(r, headers, nheaders);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

int pdl_http_reply(struct MHD_Connection *c, unsigned status, const char *content_type, const char *body, size_t len,
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

int pdl_http_vreplyf(struct MHD_Connection *c, unsigned status, const char *fmt, va_list ap)
{
    char buf[2048];
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n >= sizeof(buf) ? sizeof(buf) - 1 : (size_t)n;
    return pdl_http_reply(c, status, NULL, buf, len, NULL);
}

int pdl_http_replyf(struct MHD_Connection *c, unsigned status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ret = pdl_http_vreplyf(c, status, fmt, ap);
    va_end(ap);
    return ret;
}

int pdl_http_reply_json(struct MHD_Connection *c, unsigned status, json_t *obj, const char *request_id)
{
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (s == NULL)
        return pdl_http_reply(c, 500, NULL, "out of memory", 13, request_id);
    int ret = pdl_http_reply(c, status, "application/json", s, strlen(s), request_id);
    free(s);
    return ret;
}

int pdl_http_reply_stream(struct MHD_Connection *c, unsigned status, uint64_t size, pdl_http_reader_fn reader,
                          void *cls, void (*free_fn)(void *cls), const char *const *headers, size_t nheaders)
{
    struct MHD_Response *r = MHD_create_response_from_callback(size, 16384, reader, cls, free_fn);
    if (r == NULL) {
        free_fn(cls);
        return MHD_NO;
    }
    add_header_lines(r, headers, nheaders);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}
