/*
 * server.c -- pdlink-router's HTTP front (libmicrohttpd): routing, request bodies, simple endpoints.
 *
 * MHD runs one thread per connection. That is what lets a completion be handled with blocking
 * waits: the prefill leg is awaited in the connection's thread, and the decode body is pulled by the
 * response's content reader in that same thread (dispatch.c), so hundreds of concurrent streams are
 * hundreds of mostly sleeping threads and nothing else. POST bodies are collected in a per-request
 * buffer bounded by PDL_SERVER_MAX_BODY; a larger one gets 413.
 */
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <jansson.h>
#include <microhttpd.h>

#include "common/clock.h"
#include "pdlink/log.h"
#include "router/router.h"

#define PDL_SERVER_MAX_BODY (64u << 20)

typedef struct rt_request {
    char *body;
    size_t len, cap;
    bool too_large;
} rt_request_t;

int pdl_server_reply(struct MHD_Connection *c, unsigned status, const char *content_type, const char *body,
                     size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type ? content_type : "text/plain; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static int reply_text(struct MHD_Connection *c, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int reply_text(struct MHD_Connection *c, unsigned status, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof(buf))
        n = (int)sizeof(buf) - 1;
    return pdl_server_reply(c, status, NULL, buf, (size_t)n);
}

static int reply_json(struct MHD_Connection *c, unsigned status, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (s == NULL)
        return reply_text(c, 500, "out of memory");
    int r = pdl_server_reply(c, status, "application/json", s, strlen(s));
    free(s);
    return r;
}

static int serve_metrics(pdl_router_t *rt, struct MHD_Connection *c)
{
    char *text = NULL;
    size_t len = 0;
    if (pdl_rt_metrics_render(rt->metrics, rt->reg, pdl__clock_now_ms(), &text, &len) != PDL_OK)
        return reply_text(c, 500, "out of memory rendering metrics");
    int r = pdl_server_reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
    return r;
}

static json_t *workers_json(pdl_router_t *rt, char role)
{
    json_t *arr = json_array();
    pdl_worker_t *w = NULL;
    size_t n = 0;
    uint64_t now = pdl__clock_now_ms();
    if (pdl_registry_snapshot(rt->reg, role, now, &w, &n) == PDL_OK) {
        for (size_t i = 0; i < n; i++) {
            json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:b, s:I, s:I}", "http_address", w[i].http_address,
                                  "zmq_address", w[i].zmq_address, "tp_size", (json_int_t)w[i].tp_size, "dp_size",
                                  (json_int_t)w[i].dp_size, "g1", w[i].is_g1, "registrations",
                                  (json_int_t)w[i].registrations, "expires_in_ms",
                                  (json_int_t)(w[i].expires_ms > now ? w[i].expires_ms - now : 0));
            if (o)
                json_array_append_new(arr, o);
        }
    }
    free(w);
    return arr;
}

static int serve_workers(pdl_router_t *rt, struct MHD_Connection *c)
{
    json_t *j = json_pack("{s:o, s:o, s:s}", "prefill", workers_json(rt, 'P'), "decode", workers_json(rt, 'D'),
                          "transfer_mode", pdl_transfer_mode_name(pdl_registry_mode(rt->reg)));
    return j ? reply_json(c, 200, j) : reply_text(c, 500, "out of memory");
}

static int serve_list_workers(pdl_router_t *rt, struct MHD_Connection *c)
{
    json_t *urls = json_array();
    for (int k = 0; k < 2; k++) {
        pdl_worker_t *w = NULL;
        size_t n = 0;
        if (pdl_registry_snapshot(rt->reg, k == 0 ? 'P' : 'D', pdl__clock_now_ms(), &w, &n) == PDL_OK)
            for (size_t i = 0; i < n; i++) {
                char u[600];
                snprintf(u, sizeof(u), "http://%s", w[i].http_address);
                json_array_append_new(urls, json_string(u));
            }
        free(w);
    }
    return reply_json(c, 200, json_pack("{s:o}", "urls", urls));
}

static int serve_health(pdl_router_t *rt, struct MHD_Connection *c, bool readiness)
{
    size_t np = 0, nd = 0;
    pdl_registry_counts(rt->reg, pdl__clock_now_ms(), &np, &nd);
    bool ok = np > 0 && nd > 0;
    if (readiness) {
        json_t *j = json_pack("{s:s, s:{s:I, s:I}, s:{s:I, s:I}}", "status", ok ? "ready" : "not_ready", "prefill",
                              "healthy", (json_int_t)np, "total", (json_int_t)np, "decode", "healthy",
                              (json_int_t)nd, "total", (json_int_t)nd);
        return j ? reply_json(c, ok ? 200 : 503, j) : reply_text(c, 500, "out of memory");
    }
    if (ok)
        return reply_text(c, 200, "All servers healthy: %zu prefill, %zu decode", np, nd);
    return reply_text(c, 503, "No workers available via service discovery: %zu prefill, %zu decode", np, nd);
}

/* Client trace headers forwarded on both legs (router-spec §3.2 step 6). */
static void collect_trace(struct MHD_Connection *c, char out[3][1024], const char **ptrs, size_t *n)
{
    static const char *const names[3] = {"traceparent", "tracestate", "baggage"};
    *n = 0;
    for (int i = 0; i < 3; i++) {
        const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, names[i]);
        if (v == NULL || strlen(v) > 900 || strpbrk(v, "\r\n") != NULL)
            continue;
        snprintf(out[*n], 1024, "%s: %s", names[i], v);
        ptrs[*n] = out[*n];
        (*n)++;
    }
}

static bool is_get_route(const char *url)
{
    static const char *const routes[] = {"/health", "/readiness", "/liveness", "/metrics", "/workers",
                                         "/list_workers", "/v1/models", "/get_model_info", "/get_server_info",
                                         NULL};
    for (int i = 0; routes[i]; i++)
        if (strcmp(url, routes[i]) == 0)
            return true;
    return false;
}

static enum MHD_Result handle(pdl_router_t *rt, bool metrics_only, struct MHD_Connection *c, const char *url,
                              const char *method, const char *upload_data, size_t *upload_data_size, void **req_cls)
{
    bool is_post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    bool is_get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    bool is_completion = strcmp(url, "/v1/completions") == 0 || strcmp(url, "/v1/chat/completions") == 0;

    if (is_post && !metrics_only) {
        rt_request_t *req = *req_cls;
        if (req == NULL) {
            req = calloc(1, sizeof(*req));
            if (req == NULL)
                return MHD_NO;
            *req_cls = req;
            return MHD_YES;
        }
        if (*upload_data_size > 0) {
            size_t n = *upload_data_size;
            *upload_data_size = 0;
            if (req->too_large || req->len + n > PDL_SERVER_MAX_BODY) {
                req->too_large = true;
                return MHD_YES;
            }
            if (req->len + n + 1 > req->cap) {
                size_t ncap = req->cap ? req->cap : 4096;
                while (ncap < req->len + n + 1)
                    ncap *= 2;
                char *nb = realloc(req->body, ncap);
                if (nb == NULL)
                    return MHD_NO;
                req->body = nb;
                req->cap = ncap;
            }
            memcpy(req->body + req->len, upload_data, n);
            req->len += n;
            req->body[req->len] = '\0';
            return MHD_YES;
        }
        /* Body complete. */
        if (req->too_large)
            return reply_text(c, 413, "request body exceeds %u bytes", PDL_SERVER_MAX_BODY);
        if (!is_completion)
            return reply_text(c, is_get_route(url) ? 405 : 404,
                              "no POST route %s (pdlink-router serves /v1/completions and /v1/chat/completions)",
                              url);
        char trace_buf[3][1024];
        const char *trace[3];
        size_t ntrace = 0;
        collect_trace(c, trace_buf, trace, &ntrace);
        pdl_rt_route_t route = strcmp(url, "/v1/chat/completions") == 0 ? PDL_ROUTE_CHAT : PDL_ROUTE_COMPLETIONS;
        return pdl_dispatch_completion(rt, c, route, req->body ? req->body : "", req->len, trace, ntrace);
    }

    /* Any other method: no body is expected; ignore one if sent. */
    if (*upload_data_size > 0) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (metrics_only) {
        if (is_get && strcmp(url, "/metrics") == 0)
            return serve_metrics(rt, c);
        return reply_text(c, 404, "only /metrics is served on this port");
    }
    if (!is_get) {
        if (is_completion || is_get_route(url))
            return reply_text(c, 405, "method %s not allowed on %s", method, url);
        return reply_text(c, 404, "no route %s %s", method, url);
    }
    if (strcmp(url, "/health") == 0)
        return serve_health(rt, c, false);
    if (strcmp(url, "/readiness") == 0)
        return serve_health(rt, c, true);
    if (strcmp(url, "/liveness") == 0)
        return reply_text(c, 200, "OK");
    if (strcmp(url, "/metrics") == 0)
        return serve_metrics(rt, c);
    if (strcmp(url, "/workers") == 0)
        return serve_workers(rt, c);
    if (strcmp(url, "/list_workers") == 0)
        return serve_list_workers(rt, c);
    if (strcmp(url, "/v1/models") == 0 || strcmp(url, "/get_model_info") == 0 ||
        strcmp(url, "/get_server_info") == 0)
        return pdl_dispatch_proxy_get(rt, c, url);
    if (is_completion)
        return reply_text(c, 405, "method GET not allowed on %s (use POST)", url);
    return reply_text(c, 404, "no route GET %s", url);
}

static enum MHD_Result on_api(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size, void **req_cls)
{
    (void)version;
    return handle(cls, false, c, url, method, upload_data, upload_data_size, req_cls);
}

static enum MHD_Result on_metrics_port(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                       const char *version, const char *upload_data, size_t *upload_data_size,
                                       void **req_cls)
{
    (void)version;
    return handle(cls, true, c, url, method, upload_data, upload_data_size, req_cls);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    rt_request_t *req = *req_cls;
    if (req != NULL) {
        free(req->body);
        free(req);
        *req_cls = NULL;
    }
}

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

pdl_status_t pdl_server_start(pdl_router_t *rt, const char *host, int port, bool metrics_only,
                              struct MHD_Daemon **d_p, int *bound_port_p, pdl_error_t *err)
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    int gai = getaddrinfo(host, portstr, &hints, &ai);
    if (gai != 0 || ai == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "cannot resolve listen address %s: %s", host, gai_strerror(gai));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, metrics_only ? &on_metrics_port : &on_api, rt, MHD_OPTION_EXTERNAL_LOGGER,
        &on_mhd_log, NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, &on_completed, NULL,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)8192, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)0,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(512 * 1024),
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (d == NULL)
        return pdl_error_set(err, PDL_ERR_SYSTEM, "cannot listen for HTTP on %s:%d (address in use or not local?)",
                             host, port);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port_p = info ? (int)info->port : port;
    *d_p = d;
    return PDL_OK;
}
