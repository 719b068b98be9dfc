/*
 * server.c -- pdlink-router's HTTP front (libmicrohttpd): routing, request bodies, simple endpoints.
 *
 * app/http.c runs each complete request on one of its workers, so a completion is handled with blocking
 * waits: the prefill leg is awaited on the worker, and the decode body is pulled by the stream's reader on
 * that same worker (dispatch.c). Hundreds of concurrent streams are hundreds of mostly sleeping workers;
 * idle client connections cost no thread. POST bodies are collected by app/http.c up to
 * --max-payload-size (413 above) while all bodies held stay under --max-payload-in-flight (503 above).
 * This file depends on dispatch.c, never the other way.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "app/http.h"
#include "app/prom.h"
#include "common/log.h"
#include "router/router.h"
#include "common/clock.h"

/* What the API listener refused or cut (app/http.c), after the router's own counters. */
static char *http_metrics(pdl_router_t *rt, size_t *len)
{
    pdl_http_stats_t st;
    pdl_http_stats(rt->http, &st);
    pdl_prom_t w = {0};
    pdl_prom_family(&w, "pdlink_router_http_connections", PDL_PROM_GAUGE, "Open client connections (--port).");
    pdl_prom_u64(&w, "pdlink_router_http_connections", NULL, 0, st.connections);
    pdl_prom_family(&w, "pdlink_router_http_body_bytes", PDL_PROM_GAUGE,
                    "Request body bytes received and held, counted against --max-payload-in-flight.");
    pdl_prom_u64(&w, "pdlink_router_http_body_bytes", NULL, 0, st.body_bytes);
    pdl_prom_family(&w, "pdlink_router_http_refused_bodies_total", PDL_PROM_COUNTER,
                    "Bodies refused: over --max-payload-size, or over --max-payload-in-flight or the client's share.");
    pdl_prom_u64(&w, "pdlink_router_http_refused_bodies_total", NULL, 0, st.refused_body);
    pdl_prom_family(&w, "pdlink_router_http_refused_headers_total", PDL_PROM_COUNTER,
                    "Requests refused with 400 at their headers: duplicate Content-Length, or with Transfer-Encoding.");
    pdl_prom_u64(&w, "pdlink_router_http_refused_headers_total", NULL, 0, st.refused_headers);
    pdl_prom_family(&w, "pdlink_router_http_deadline_closed_total", PDL_PROM_COUNTER,
                    "Connections shut down past --http-header-timeout or --http-body-timeout.");
    pdl_prom_u64(&w, "pdlink_router_http_deadline_closed_total", NULL, 0, st.deadline_closed);
    return pdl_prom_finish(&w, len);
}

static int serve_metrics(pdl_router_t *rt, pdl_http_conn_t *c)
{
    char *text = NULL, *more = NULL;
    size_t len = 0, mlen = 0;
    if (pdl_rt_metrics_render(rt->metrics, rt->reg, pdl__clock_now_ms(), &text, &len) != PDL_OK ||
        (more = http_metrics(rt, &mlen)) == NULL) {
        free(text);
        return pdl_http_replyf(c, 500, "out of memory rendering metrics");
    }
    char *all = realloc(text, len + mlen + 1);
    if (all == NULL) {
        free(text);
        free(more);
        return pdl_http_replyf(c, 500, "out of memory rendering metrics");
    }
    memcpy(all + len, more, mlen + 1);
    free(more);
    int r = pdl_http_reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", all, len + mlen, NULL);
    free(all);
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
            json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:b, s:I, s:I, s:b}", "http_address", w[i].http_address,
                                  "zmq_address", w[i].zmq_address, "tp_size", (json_int_t)w[i].tp_size, "dp_size",
                                  (json_int_t)w[i].dp_size, "g1", w[i].is_g1, "registrations",
                                  (json_int_t)w[i].registrations, "expires_in_ms",
                                  (json_int_t)(w[i].expires_ms > now ? w[i].expires_ms - now : 0), "api_key",
                                  w[i].api_key && rt->apikey.header[0] != '\0');
            if (o)
                json_array_append_new(arr, o);
        }
    }
    free(w);
    return arr;
}

static int serve_workers(pdl_router_t *rt, pdl_http_conn_t *c)
{
    json_t *j = json_pack("{s:o, s:o, s:s}", "prefill", workers_json(rt, 'P'), "decode", workers_json(rt, 'D'),
                          "transfer_mode", pdl_transfer_mode_name(pdl_registry_mode(rt->reg)));
    return pdl_http_reply_json(c, 200, j, NULL);
}

static int serve_list_workers(pdl_router_t *rt, pdl_http_conn_t *c)
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
    return pdl_http_reply_json(c, 200, json_pack("{s:o}", "urls", urls), NULL);
}

static int serve_health(pdl_router_t *rt, pdl_http_conn_t *c, bool readiness)
{
    size_t np = 0, nd = 0;
    pdl_registry_counts(rt->reg, pdl__clock_now_ms(), &np, &nd);
    bool ok = np > 0 && nd > 0;
    if (readiness) {
        json_t *j = json_pack("{s:s, s:{s:I, s:I}, s:{s:I, s:I}}", "status", ok ? "ready" : "not_ready", "prefill",
                              "healthy", (json_int_t)np, "total", (json_int_t)np, "decode", "healthy",
                              (json_int_t)nd, "total", (json_int_t)nd);
        return pdl_http_reply_json(c, ok ? 200 : 503, j, NULL);
    }
    if (ok)
        return pdl_http_replyf(c, 200, "All servers healthy: %zu prefill, %zu decode", np, nd);
    return pdl_http_replyf(c, 503, "No workers available via service discovery: %zu prefill, %zu decode", np, nd);
}

/* Client trace headers forwarded on both legs (docs/vllm-router.md#dispatch, step 4). */
static void collect_trace(const pdl_http_request_t *req, char out[3][1024], const char **ptrs, size_t *n)
{
    static const char *const names[3] = {"traceparent", "tracestate", "baggage"};
    *n = 0;
    for (int i = 0; i < 3; i++) {
        const char *v = pdl_http_header(req, names[i]);
        if (v == NULL || strlen(v) > 900 || strpbrk(v, "\r\n") != NULL)
            continue;
        snprintf(out[*n], 1024, "%s: %s", names[i], v);
        ptrs[*n] = out[*n];
        (*n)++;
    }
}

/* A body the router would not hold: over --max-payload-size (413, the client must send less) or over
 * --max-payload-in-flight (503, the router is busy with other bodies: retry). */
static int body_refused(pdl_router_t *rt, pdl_http_conn_t *c, bool too_large)
{
    char msg[200];
    if (too_large)
        snprintf(msg, sizeof(msg), "request body exceeds --max-payload-size (%zu bytes)", rt->cfg.max_payload_size);
    else
        snprintf(msg, sizeof(msg),
                 "request bodies in flight would exceed --max-payload-in-flight (%zu bytes); retry later",
                 rt->cfg.http.body_budget);
    unsigned status = too_large ? 413 : 503;
    return pdl_http_reply_json(c, status,
                               json_pack("{s:{s:s, s:s, s:i}}", "error", "message", msg, "type",
                                         too_large ? "payload_too_large" : "payload_budget_exhausted", "code",
                                         (int)status),
                               NULL);
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

static int handle(pdl_router_t *rt, bool metrics_only, const pdl_http_request_t *req)
{
    pdl_http_conn_t *c = req->conn;
    const char *url = req->url, *method = req->method;
    bool is_post = strcmp(method, "POST") == 0;
    bool is_get = strcmp(method, "GET") == 0;
    bool is_completion = strcmp(url, "/v1/completions") == 0 || strcmp(url, "/v1/chat/completions") == 0;

    /* --api-key guards the /v1 routes, as vLLM's --api-key does; /health, /metrics and friends stay open. */
    if (!metrics_only && rt->cfg.api_key[0] != '\0' && strncmp(url, "/v1/", 4) == 0 &&
        !pdl_http_bearer_ok(req, rt->cfg.api_key)) {
        pdl_rt_metrics_error(rt->metrics, PDL_RTERR_UNAUTHORIZED);
        return pdl_http_reply_json(c, 401,
                                   json_pack("{s:{s:s, s:s, s:i}}", "error", "message",
                                             "missing or wrong Authorization: Bearer token (--api-key)", "type",
                                             "Unauthorized", "code", 401),
                                   NULL);
    }
    if (is_post && !metrics_only) {
        if (req->too_large || req->over_budget)
            return body_refused(rt, c, req->too_large);
        if (!is_completion)
            return pdl_http_replyf(c, is_get_route(url) ? 405 : 404,
                                   "no POST route %s (pdlink-router serves /v1/completions and /v1/chat/completions)",
                                   url);
        char trace_buf[3][1024];
        const char *trace[3];
        size_t ntrace = 0;
        collect_trace(req, trace_buf, trace, &ntrace);
        pdl_rt_route_t route = strcmp(url, "/v1/chat/completions") == 0 ? PDL_ROUTE_CHAT : PDL_ROUTE_COMPLETIONS;
        return pdl_dispatch_completion(rt, c, route, req->body, req->len, trace, ntrace);
    }

    /* Any other method: a body, if one was sent, is ignored. */
    if (metrics_only) {
        if (is_get && strcmp(url, "/metrics") == 0)
            return serve_metrics(rt, c);
        return pdl_http_replyf(c, 404, "only /metrics is served on this port");
    }
    if (!is_get) {
        if (is_completion || is_get_route(url))
            return pdl_http_replyf(c, 405, "method %s not allowed on %s", method, url);
        return pdl_http_replyf(c, 404, "no route %s %s", method, url);
    }
    if (strcmp(url, "/health") == 0)
        return serve_health(rt, c, false);
    if (strcmp(url, "/readiness") == 0)
        return serve_health(rt, c, true);
    if (strcmp(url, "/liveness") == 0)
        return pdl_http_replyf(c, 200, "OK");
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
        return pdl_http_replyf(c, 405, "method GET not allowed on %s (use POST)", url);
    return pdl_http_replyf(c, 404, "no route GET %s", url);
}

static int on_api(void *cls, const pdl_http_request_t *req)
{
    return handle(cls, false, req);
}

static int on_metrics_port(void *cls, const pdl_http_request_t *req)
{
    return handle(cls, true, req);
}

/* A Content-Length over --max-payload-size, at the headers (polling thread: no blocking). */
static int on_refuse(void *cls, const pdl_http_request_t *req)
{
    return body_refused(cls, req->conn, true);
}

pdl_status_t pdl_server_start(pdl_router_t *rt, const char *host, int port, bool metrics_only, pdl_http_t **http_p,
                              int *bound_port_p, pdl_error_t *err)
{
    /* 512 KiB stacks: a router holds a worker per stream, and a thousand 8 MiB default stacks would
     * reserve gigabytes of address space for frames that stay small. The metrics port takes no bodies
     * and a few scrapers: small limits. */
    pdl_http_limits_t limits = rt->cfg.http;
    if (metrics_only) {
        limits.max_connections = 32;
        limits.max_per_client = 0;
        limits.workers = 4;
        limits.threads = 1;
    }
    const pdl_http_params_t p = {.host = host,
                                 .port = port,
                                 .what = metrics_only ? "--prometheus-host" : "--host",
                                 .max_body = metrics_only ? 0 : rt->cfg.max_payload_size,
                                 .limits = limits,
                                 .thread_stack_size = 512 * 1024,
                                 .handler = metrics_only ? on_metrics_port : on_api,
                                 .refuse = metrics_only ? NULL : on_refuse,
                                 .cls = rt};
    return pdl_http_start(&p, http_p, bound_port_p, err);
}
