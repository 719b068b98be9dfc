/*
 * dispatch.c -- one P/D completion through the router (docs/vllm-router.md#dispatch and the
 * READ/WRITE dispatch sections after it).
 *
 *   parse + validate body ──400──▶ client
 *   snapshot P and D ──503 when either is empty──▶ client
 *   pick P, D (policies); request id "___prefill_addr_{P}___decode_addr_{D}_{hex32}"; transfer_id "tx-{hex32}"
 *   READ : prefill leg (max_tokens 1, stream false, params) ─wait─▶ decode leg (original body +
 *          the prefill's kv_transfer_params verbatim)
 *   WRITE: prefill leg and decode leg at once (both on one curl multi); wait for the whole prefill
 *          and the decode's headers
 *   prefill failed ──500 "Request processing failed: Prefill server error ..."──▶ client (no decode);
 *   a prefill 4xx goes to the client as it is (status and body), as vllm-router does
 *   decode transport error ──500──▶ client;  otherwise the decode's status, headers and body are
 *   passed through, the body pulled by the stream's reader as the client drains it.
 *   decode failed (transport error or non-2xx) ──▶ failed-status releases to every rank of the prefill
 *   (release.c), so its blocks are not held until its 60 s reaper: READ, from the prefill's params;
 *   WRITE, from the transfer id and the prefill's TP (a pdlink prefill drops a push still waiting).
 *
 * validate() refuses, before any leg, what a decode would refuse although the prefill leg accepts it: the
 * fields the router rewrites for the prefill (max_tokens, max_completion_tokens, min_tokens, stream,
 * stream_options) are exactly the ones a prefill cannot check for the decode.
 *
 * The stream object owns the decode leg; MHD frees it when the response ends or the client goes
 * away, which removes the leg from curl and closes an unfinished backend connection (vLLM then
 * aborts the request).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/log.h"
#include "pdlink/wire.h"
#include "router/release.h"
#include "router/router.h"
#include "router/serde_text.h"

#define RT_REQUEST_ID_MAX (4 * PDL_WIRE_HOST_MAX + 128)

void pdl_router_uuid4(uint8_t out[16])
{
    size_t got = 0;
    while (got < 16) {
        ssize_t n = getrandom(out + got, 16 - got, 0);
        if (n <= 0) {
            /* getrandom only fails before the pool is seeded on ancient kernels; ids must still differ. */
            uint64_t t = pdl__clock_now_ns() ^ ((uint64_t)(uintptr_t)out << 17);
            for (size_t i = got; i < 16; i++) {
                t = t * 6364136223846793005ull + 1442695040888963407ull;
                out[i] = (uint8_t)(t >> 56);
            }
            break;
        }
        got += (size_t)n;
    }
    out[6] = (uint8_t)((out[6] & 0x0f) | 0x40);
    out[8] = (uint8_t)((out[8] & 0x3f) | 0x80);
}

static void hex32(const uint8_t u[16], char out[33])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = digits[u[i] >> 4];
        out[2 * i + 1] = digits[u[i] & 15];
    }
    out[32] = '\0';
}

typedef struct rt_stream {
    pdl_router_t *rt;
    pdl_leg_t *dleg;
    pdl_rt_route_t route;
    uint64_t start_ns;
    uint64_t size; /* Content-Length passed to MHD, or PDL_HTTP_SIZE_UNKNOWN */
    bool ended;
} rt_stream_t;

static void finish_request(pdl_router_t *rt, pdl_rt_route_t route, uint64_t start_ns)
{
    pdl_rt_metrics_duration(rt->metrics, route, (double)(pdl__clock_now_ns() - start_ns) / 1e9);
    pdl_rt_metrics_active(rt->metrics, -1);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    rt_stream_t *s = cls;
    bool eof = false;
    long n = pdl_leg_read(s->rt->up, s->dleg, buf, max, &eof);
    if (n > 0) {
        /* With a known length MHD stops calling once it has all bytes: that is the normal end. */
        if (s->size != PDL_HTTP_SIZE_UNKNOWN && pos + (uint64_t)n >= s->size)
            s->ended = true;
        return (ssize_t)n;
    }
    if (n < 0)
        return PDL_HTTP_STREAM_ERROR; /* router stopping */
    if (s->dleg->result != CURLE_OK) {
        pdl_warn("decode %s broke off mid-response: %s", s->dleg->url, pdl_leg_error(s->dleg));
        pdl_rt_metrics_error(s->rt->metrics, s->dleg->timed_out ? PDL_RTERR_DECODE_TIMEOUT : PDL_RTERR_DECODE);
        s->ended = true; /* counted; do not count it again as a client disconnect */
        return PDL_HTTP_STREAM_ERROR;
    }
    s->ended = true;
    return PDL_HTTP_STREAM_END;
}

static void stream_free(void *cls)
{
    rt_stream_t *s = cls;
    if (!s->ended) {
        pdl_debug("client went away before the end of the response from %s", s->dleg->url);
        pdl_rt_metrics_error(s->rt->metrics, PDL_RTERR_CLIENT_GONE);
    }
    pdl_leg_release(s->rt->up, s->dleg);
    finish_request(s->rt, s->route, s->start_ns);
    free(s);
}

static bool hop_by_hop(const char *h)
{
    static const char *const skip[] = {"content-length:", "transfer-encoding:", "connection:", "keep-alive:",
                                       "date:", "server:", NULL};
    for (int i = 0; skip[i]; i++)
        if (strncasecmp(h, skip[i], strlen(skip[i])) == 0)
            return true;
    return false;
}

/* Queue the decode's response: its status and headers, and its body pulled through stream_read.
 * `failed_leg` (NULL on success) is added as PDL_RT_FAILED_LEG_HEADER to a non-2xx answer; `served`
 * (the two PDL_RT_PREFILL_HEADER / PDL_RT_DECODE_HEADER lines) to every answer. */
static int relay_decode(pdl_router_t *rt, pdl_http_conn_t *c, pdl_leg_t *dleg, pdl_rt_route_t route,
                        uint64_t start_ns, const char *failed_leg, const char *const *served)
{
    rt_stream_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        pdl_leg_release(rt->up, dleg);
        finish_request(rt, route, start_ns);
        return pdl_http_reply(c, 500, NULL, "out of memory", 13, NULL);
    }
    s->rt = rt;
    s->dleg = dleg;
    s->route = route;
    s->start_ns = start_ns;
    uint64_t size = PDL_HTTP_SIZE_UNKNOWN;
    const char *cl = pdl_leg_header(dleg, "content-length");
    if (cl != NULL) {
        char *end = NULL;
        unsigned long long v = strtoull(cl, &end, 10);
        if (end != cl && *end == '\0' && v < (1ull << 40))
            size = v;
    }
    s->size = size;
    const char *headers[PDL_LEG_MAX_HEADERS + 3];
    size_t nh = 0;
    for (size_t i = 0; i < dleg->nheaders && nh < PDL_LEG_MAX_HEADERS; i++)
        if (!hop_by_hop(dleg->headers[i]))
            headers[nh++] = dleg->headers[i];
    char leg_line[700];
    if (failed_leg != NULL) {
        snprintf(leg_line, sizeof(leg_line), PDL_RT_FAILED_LEG_HEADER ": %s", failed_leg);
        headers[nh++] = leg_line;
    }
    headers[nh++] = served[0];
    headers[nh++] = served[1];
    unsigned status = dleg->status >= 200 && dleg->status <= 599 ? (unsigned)dleg->status : 502;
    return pdl_http_reply_stream(c, status, size, &stream_read, s, &stream_free, headers, nh);
}

/* Count the error, finish the request and answer msg[0, len) as text. leg (NULL: none) is
 * "prefill|decode <http_address>" for a leg that failed at a worker: the body stays vllm-router's and
 * PDL_RT_FAILED_LEG_HEADER carries the leg, so a client (pdlink run, the tests) can say which leg and which
 * worker without parsing the text; the two `served` lines (with a leg only) name both workers chosen. */
static int fail_leg(pdl_router_t *rt, pdl_http_conn_t *c, pdl_rt_route_t route, uint64_t start_ns,
                    pdl_rt_error_t kind, unsigned status, const char *leg, const char *const *served,
                    const char *msg, size_t len)
{
    pdl_rt_metrics_error(rt->metrics, kind);
    finish_request(rt, route, start_ns);
    char line[700];
    const char *h[3] = {line, served ? served[0] : NULL, served ? served[1] : NULL};
    if (leg != NULL)
        snprintf(line, sizeof(line), PDL_RT_FAILED_LEG_HEADER ": %s", leg);
    return pdl_http_reply_headers(c, status, NULL, msg, len, h, leg == NULL ? 0 : served ? 3 : 1);
}

static int vfail_leg(pdl_router_t *rt, pdl_http_conn_t *c, pdl_rt_route_t route, uint64_t start_ns,
                     pdl_rt_error_t kind, unsigned status, const char *leg, const char *const *served,
                     const char *fmt, va_list ap) __attribute__((format(printf, 9, 0)));
static int vfail_leg(pdl_router_t *rt, pdl_http_conn_t *c, pdl_rt_route_t route, uint64_t start_ns,
                     pdl_rt_error_t kind, unsigned status, const char *leg, const char *const *served,
                     const char *fmt, va_list ap)
{
    char buf[2048];
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n >= sizeof(buf) ? sizeof(buf) - 1 : (size_t)n;
    return fail_leg(rt, c, route, start_ns, kind, status, leg, served, buf, len);
}

static int failf_leg(pdl_router_t *rt, pdl_http_conn_t *c, pdl_rt_route_t route, uint64_t start_ns,
                     pdl_rt_error_t kind, unsigned status, const char *leg, const char *const *served,
                     const char *fmt, ...) __attribute__((format(printf, 9, 10)));
static int failf_leg(pdl_router_t *rt, pdl_http_conn_t *c, pdl_rt_route_t route, uint64_t start_ns,
                     pdl_rt_error_t kind, unsigned status, const char *leg, const char *const *served,
                     const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ret = vfail_leg(rt, c, route, start_ns, kind, status, leg, served, fmt, ap);
    va_end(ap);
    return ret;
}

static int failf(pdl_router_t *rt, pdl_http_conn_t *c, pdl_rt_route_t route, uint64_t start_ns,
                 pdl_rt_error_t kind, unsigned status, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int failf(pdl_router_t *rt, pdl_http_conn_t *c, pdl_rt_route_t route, uint64_t start_ns,
                 pdl_rt_error_t kind, unsigned status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ret = vfail_leg(rt, c, route, start_ns, kind, status, NULL, NULL, fmt, ap);
    va_end(ap);
    return ret;
}

/* Type checks a typed request parser (vllm-router's serde structs) would do; NULL when fine. */
static const char *validate(const json_t *body, pdl_rt_route_t route, char *buf, size_t cap)
{
    const json_t *v;
    if ((v = json_object_get(body, "stream")) != NULL && !json_is_boolean(v) && !json_is_null(v))
        return "field 'stream' must be a boolean";
    static const char *const ints[] = {"max_tokens", "max_completion_tokens", "min_tokens", NULL};
    for (int i = 0; ints[i]; i++)
        if ((v = json_object_get(body, ints[i])) != NULL && !json_is_integer(v) && !json_is_null(v)) {
            snprintf(buf, cap, "field '%s' must be an integer", ints[i]);
            return buf;
        }
    /* The prefill leg runs with max_tokens 1 whatever the client asked; a decode (vLLM's SamplingParams,
     * pdlink-node) refuses fewer than 1 token, so a request asking for that would pin the prefill's KV. */
    for (int i = 0; i < 2; i++)
        if (json_is_integer(v = json_object_get(body, ints[i])) && json_integer_value(v) < 1) {
            snprintf(buf, cap, "field '%s' must be at least 1, got %lld", ints[i],
                     (long long)json_integer_value(v));
            return buf;
        }
    const json_t *mt = json_object_get(body, "max_tokens"), *mn = json_object_get(body, "min_tokens");
    if (json_is_integer(mn) && json_integer_value(mn) < 0)
        return "field 'min_tokens' must be at least 0";
    if (json_is_integer(mn) && json_is_integer(mt) && json_integer_value(mn) > json_integer_value(mt)) {
        snprintf(buf, cap, "field 'min_tokens' (%lld) must not exceed 'max_tokens' (%lld)",
                 (long long)json_integer_value(mn), (long long)json_integer_value(mt));
        return buf;
    }
    if ((v = json_object_get(body, "n")) != NULL && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return "field 'n' must be 1 (one completion per prefill transfer)";
    /* The prefill leg drops stream_options; vLLM's decode refuses them without stream true. */
    if ((v = json_object_get(body, "stream_options")) != NULL && !json_is_null(v)) {
        if (!json_is_object(v))
            return "field 'stream_options' must be an object";
        const json_t *iu = json_object_get(v, "include_usage");
        if (iu != NULL && !json_is_null(iu) && !json_is_boolean(iu))
            return "field 'stream_options.include_usage' must be a boolean";
        if (!json_is_true(json_object_get(body, "stream")))
            return "field 'stream_options' is only allowed with 'stream': true";
    }
    if ((v = json_object_get(body, "kv_transfer_params")) != NULL && !json_is_object(v) && !json_is_null(v))
        return "field 'kv_transfer_params' must be an object";
    if (route == PDL_ROUTE_CHAT) {
        v = json_object_get(body, "messages");
        if (!json_is_array(v))
            return "field 'messages' is required and must be an array";
    } else {
        v = json_object_get(body, "prompt");
        if (v == NULL || json_is_null(v))
            return "field 'prompt' is required";
        if (!json_is_string(v) && !json_is_array(v))
            return "field 'prompt' must be a string or an array";
        if ((json_is_string(v) && json_string_length(v) == 0) || (json_is_array(v) && json_array_size(v) == 0))
            return "field 'prompt' must not be empty";
    }
    return NULL;
}

/* Prefill leg body: the client's body with the edits of docs/vllm-router.md#dispatch (step 4) and
 * the given params. */
static json_t *prefill_body(const json_t *body, json_t *params)
{
    json_t *p = json_deep_copy(body);
    if (p == NULL)
        return NULL;
    json_object_set_new(p, "max_tokens", json_integer(1));
    if (json_object_get(p, "max_completion_tokens") != NULL)
        json_object_set_new(p, "max_completion_tokens", json_integer(1));
    const json_t *mt = json_object_get(p, "min_tokens");
    if (json_is_integer(mt) && json_integer_value(mt) > 1)
        json_object_set_new(p, "min_tokens", json_integer(1));
    json_object_set_new(p, "stream", json_false());
    json_object_del(p, "stream_options");
    json_object_set_new(p, "kv_transfer_params", params);
    return p;
}

static char *dump(const json_t *j, size_t *len)
{
    char *s = json_dumps(j, JSON_COMPACT);
    *len = s ? strlen(s) : 0;
    return s;
}

static const pdl_worker_t *pick(pdl_policy_t *pol, const pdl_worker_t *w, size_t n, const char *key)
{
    const char **urls = calloc(n, sizeof(*urls));
    char (*store)[600] = calloc(n, sizeof(*store));
    size_t idx = 0;
    if (urls != NULL && store != NULL) {
        for (size_t i = 0; i < n; i++) {
            snprintf(store[i], sizeof(store[i]), "http://%s", w[i].http_address);
            urls[i] = store[i];
        }
        idx = pdl_policy_pick(pol, urls, n, key);
    }
    free(urls);
    free(store);
    return &w[idx < n ? idx : 0];
}

/* One completion request on its way through both legs: what the steps of pdl_dispatch_completion
 * share. A step that fails answers the client (failf and friends) and leaves that result in `ret`. */
typedef struct dispatch {
    pdl_router_t *rt;
    pdl_http_conn_t *c;
    pdl_rt_route_t route;
    uint64_t start_ns;
    int ret;
    json_t *req;
    pdl_worker_t *pw, *dw; /* the registry's snapshots; P and D point into them */
    size_t np, nd;
    const pdl_worker_t *P, *D;
    pdl_transfer_mode_t mode;
    char request_id[RT_REQUEST_ID_MAX], transfer_id[40];
    char rid_header[RT_REQUEST_ID_MAX + 32];
    const char *headers[8]; /* both legs' headers; the --api-key line is per leg (pheaders, dheaders) */
    size_t nh;
    const char *pheaders[9], *dheaders[9];
    size_t pnh, dnh;
    char purl[700], durl[700], pbase[600], dbase[600];
    char pleg_name[608], dleg_name[608];
    char served_p[640], served_d[640]; /* PDL_RT_PREFILL_HEADER / PDL_RT_DECODE_HEADER lines */
    const char *served[2];
    pdl_leg_t *pleg, *dleg;
    json_t *pbody, *dbody, *presp;
    char *ptext, *dtext, *key;
    size_t plen;
    pdl_error_t err;
} dispatch_t;

/* A leg's headers into out[9]: the request's, plus the --api-key line (the nodes' own --api-key, as
 * vllm-router sends it) only for a worker the router verified (apikey.h). Returns the count. */
static size_t leg_headers(const dispatch_t *d, const pdl_worker_t *w, const char **out)
{
    size_t n = 0;
    for (size_t i = 0; i < d->nh; i++)
        out[n++] = d->headers[i];
    const char *auth = pdl_rt_apikey_header(&d->rt->apikey, w->api_key);
    if (auth != NULL)
        out[n++] = auth;
    return n;
}

/* The workers (docs/vllm-router.md#dispatch, steps 1-3), the request and transfer ids, the headers and URLs of both legs. */
static bool dispatch_select(dispatch_t *d, const char *const *trace_headers, size_t ntrace)
{
    pdl_router_t *rt = d->rt;
    uint64_t now = pdl__clock_now_ms();
    pdl_registry_snapshot(rt->reg, 'P', now, &d->pw, &d->np);
    pdl_registry_snapshot(rt->reg, 'D', now, &d->dw, &d->nd);
    if (d->np == 0 || d->nd == 0) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_NO_WORKERS, 503,
                       "No workers available via service discovery: %zu prefill, %zu decode", d->np, d->nd);
        return false;
    }
    d->mode = pdl_registry_mode(rt->reg);
    if (d->mode == PDL_MODE_UNKNOWN) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_NO_MODE, 500,
                       "No MoRI-IO instances have registered a transfer mode (READ or WRITE) yet");
        return false;
    }
    /* The key comes from the request text, not the headers, and that text is vllm-router's serde
     * re-serialisation, so both routers put a request on the same workers (serde_text.h); our own dump
     * only for a body it would refuse or we do not reproduce. */
    size_t tlen = 0;
    char *text = pdl_rt_serde_text(d->req, d->route == PDL_ROUTE_CHAT, &tlen);
    if (text == NULL)
        text = dump(d->req, &tlen);
    d->key = pdl_policy_hash_key(d->req, text ? text : "", tlen);
    free(text);
    d->P = pick(rt->prefill_policy, d->pw, d->np, d->key);
    d->D = pick(rt->decode_policy, d->dw, d->nd, d->key);

    uint8_t u[16];
    char hex[33];
    pdl_router_uuid4(u);
    if (pdl_wire_format_request_id(d->P->zmq_address, d->D->zmq_address, u, d->request_id, sizeof(d->request_id)) <
        0) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL, 500,
                       "Request processing failed: cannot build a request id from %s and %s", d->P->zmq_address,
                       d->D->zmq_address);
        return false;
    }
    pdl_router_uuid4(u);
    hex32(u, hex);
    snprintf(d->transfer_id, sizeof(d->transfer_id), "tx-%s", hex);

    snprintf(d->rid_header, sizeof(d->rid_header), "X-Request-Id: %s", d->request_id);
    d->headers[d->nh++] = "Content-Type: application/json";
    d->headers[d->nh++] = d->rid_header;
    for (size_t i = 0; i < ntrace && d->nh < 8; i++)
        d->headers[d->nh++] = trace_headers[i];
    d->pnh = leg_headers(d, d->P, d->pheaders);
    d->dnh = leg_headers(d, d->D, d->dheaders);

    const char *path = pdl_rt_route_path(d->route);
    snprintf(d->pbase, sizeof(d->pbase), "http://%s", d->P->http_address);
    snprintf(d->dbase, sizeof(d->dbase), "http://%s", d->D->http_address);
    snprintf(d->pleg_name, sizeof(d->pleg_name), "prefill %s", d->P->http_address);
    snprintf(d->dleg_name, sizeof(d->dleg_name), "decode %s", d->D->http_address);
    snprintf(d->served_p, sizeof(d->served_p), PDL_RT_PREFILL_HEADER ": %s", d->P->http_address);
    snprintf(d->served_d, sizeof(d->served_d), PDL_RT_DECODE_HEADER ": %s", d->D->http_address);
    d->served[0] = d->served_p;
    d->served[1] = d->served_d;
    snprintf(d->purl, sizeof(d->purl), "%s%s", d->pbase, path);
    snprintf(d->durl, sizeof(d->durl), "%s%s", d->dbase, path);
    pdl_debug("request %s: prefill %s, decode %s, %s mode, transfer %s", d->request_id, d->P->http_address,
              d->D->http_address, pdl_transfer_mode_name(d->mode), d->transfer_id);
    return true;
}

/* The prefill leg's body (its kv_transfer_params for the mode) and both legs' connections. */
static bool dispatch_prepare(dispatch_t *d)
{
    pdl_router_t *rt = d->rt;
    json_t *pparams;
    if (d->mode == PDL_MODE_READ)
        pparams = json_pack("{s:b, s:b, s:n, s:n, s:s, s:I}", "do_remote_decode", 1, "do_remote_prefill", 0,
                            "remote_engine_id", "remote_block_ids", "transfer_id", d->transfer_id, "remote_dp_size",
                            (json_int_t)rt->cfg.intra_node_dp_size);
    else
        pparams = json_pack("{s:b, s:b, s:n, s:n, s:I, s:I, s:s}", "do_remote_decode", 1, "do_remote_prefill", 0,
                            "remote_engine_id", "remote_block_ids", "remote_dp_size", (json_int_t)d->D->dp_size,
                            "remote_tp_size", (json_int_t)d->D->tp_size, "transfer_id", d->transfer_id);
    d->pbody = pparams ? prefill_body(d->req, pparams) : NULL;
    d->ptext = d->pbody ? dump(d->pbody, &d->plen) : NULL;
    d->pleg = pdl_leg_acquire(rt->up);
    d->dleg = pdl_leg_acquire(rt->up);
    if (d->ptext == NULL || d->pleg == NULL || d->dleg == NULL) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL, 500, "Request processing failed: out of memory");
        return false;
    }
    pdl_error_clear(&d->err);
    return true;
}

/* WRITE (docs/vllm-router.md#write-dispatch): both legs at once, on the decode leg's multi so one thread drives them;
 * returns once the prefill finished and the decode's headers came. *prefill_ok: the prefill's answer. */
static bool dispatch_write(dispatch_t *d, bool *prefill_ok)
{
    pdl_router_t *rt = d->rt;
    /* The decode's params, plus the prefill's explicit address. */
    json_t *dparams = json_pack("{s:b, s:b, s:n, s:n, s:s, s:I, s:I}", "do_remote_decode", 0, "do_remote_prefill", 1,
                                "remote_engine_id", "remote_block_ids", "transfer_id", d->transfer_id,
                                "remote_dp_size", (json_int_t)d->P->dp_size, "remote_tp_size",
                                (json_int_t)d->P->tp_size);
    if (dparams != NULL && d->P->dp_size > 1)
        json_object_set_new(dparams, "remote_dp_rank", json_integer(0));
    pdl_zmq_addr_t pz;
    if (dparams != NULL && pdl_wire_parse_zmq_address(d->P->zmq_address, &pz, NULL) == PDL_OK) {
        json_object_set_new(dparams, "remote_host", json_string(pz.host));
        json_object_set_new(dparams, "remote_handshake_port", json_integer(pz.handshake_port));
        json_object_set_new(dparams, "remote_notify_port", json_integer(pz.notify_port));
    }
    d->dbody = json_deep_copy(d->req);
    if (d->dbody == NULL || dparams == NULL) {
        json_decref(dparams);
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_DECODE, 500, "Request processing failed: out of memory");
        return false;
    }
    json_object_set_new(d->dbody, "kv_transfer_params", dparams);
    size_t dlen = 0;
    d->dtext = dump(d->dbody, &dlen);
    if (d->dtext == NULL ||
        pdl_leg_start(d->pleg, d->dleg->own_multi, "POST", d->purl, d->ptext, d->plen, d->pheaders, d->pnh, true,
                      &rt->cfg.prefill_timeouts, &d->err) != PDL_OK ||
        pdl_leg_start(d->dleg, NULL, "POST", d->durl, d->dtext, dlen, d->dheaders, d->dnh, false,
                      &rt->cfg.decode_timeouts, &d->err) != PDL_OK) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL, 500, "Request processing failed: %s",
                       d->err.msg[0] ? d->err.msg : "out of memory");
        return false;
    }
    pdl_leg_t *both[2] = {d->pleg, d->dleg};
    const bool headers_only[2] = {false, true};
    if (pdl_leg_wait(rt->up, d->dleg->own_multi, both, headers_only, 2) != PDL_OK) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL, 503, "router is shutting down");
        return false;
    }
    *prefill_ok = pdl_leg_ok(d->pleg);
    pdl_rt_metrics_leg(rt->metrics, 'P', d->pbase, !*prefill_ok);
    return true;
}

/* READ: the prefill leg, then the decode leg with the prefill's kv_transfer_params verbatim
 * (docs/vllm-router.md#read-dispatch); returns once the decode's headers came. *prefill_ok: the prefill's answer (no decode if false). */
static bool dispatch_read(dispatch_t *d, bool *prefill_ok)
{
    pdl_router_t *rt = d->rt;
    if (pdl_leg_start(d->pleg, NULL, "POST", d->purl, d->ptext, d->plen, d->pheaders, d->pnh, true,
                      &rt->cfg.prefill_timeouts, &d->err) != PDL_OK) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL, 500, "Request processing failed: %s",
                       d->err.msg);
        return false;
    }
    if (pdl_leg_wait(rt->up, d->pleg->own_multi, &d->pleg, NULL, 1) != PDL_OK) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL, 503, "router is shutting down");
        return false;
    }
    *prefill_ok = pdl_leg_ok(d->pleg);
    pdl_rt_metrics_leg(rt->metrics, 'P', d->pbase, !*prefill_ok);
    if (!*prefill_ok)
        return true;
    json_error_t perr;
    d->presp = json_loadb(d->pleg->buf + d->pleg->rpos, d->pleg->len - d->pleg->rpos, 0, &perr);
    if (!json_is_object(d->presp)) {
        d->ret = failf_leg(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL, 500, d->pleg_name, d->served,
                           "Request processing failed: Prefill server %s returned a body that is not a JSON object: %s",
                           d->P->http_address, d->presp ? "wrong type" : perr.text);
        return false;
    }
    json_t *kv = json_object_get(d->presp, "kv_transfer_params");
    if (kv == NULL || json_is_null(kv))
        pdl_debug("request %s: prefill %s returned no kv_transfer_params; the decode will prefill locally",
                  d->request_id, d->P->http_address);
    d->dbody = json_deep_copy(d->req);
    if (d->dbody == NULL) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_DECODE, 500, "Request processing failed: out of memory");
        return false;
    }
    json_object_set(d->dbody, "kv_transfer_params", kv ? kv : json_null());
    size_t dlen = 0;
    d->dtext = dump(d->dbody, &dlen);
    if (d->dtext == NULL ||
        pdl_leg_start(d->dleg, NULL, "POST", d->durl, d->dtext, dlen, d->dheaders, d->dnh, false,
                      &rt->cfg.decode_timeouts, &d->err) != PDL_OK) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_DECODE, 500, "Request processing failed: %s",
                       d->err.msg[0] ? d->err.msg : "out of memory");
        return false;
    }
    pdl_leg_release(rt->up, d->pleg); /* its connection goes back to the pool before the decode streams */
    d->pleg = NULL;
    const bool headers_only = true;
    if (pdl_leg_wait(rt->up, d->dleg->own_multi, &d->dleg, &headers_only, 1) != PDL_OK) {
        d->ret = failf(rt, d->c, d->route, d->start_ns, PDL_RTERR_DECODE, 503, "router is shutting down");
        return false;
    }
    return true;
}

/* The decode answered (or failed to): release what the prefill holds if the decode will not, then relay
 * the decode's answer -- a transport error before any response is a 500, any HTTP status passes through. */
static int dispatch_decode_answer(dispatch_t *d)
{
    pdl_router_t *rt = d->rt;
    pdl_leg_t *dleg = d->dleg;
    bool dgone = dleg->done && dleg->result != CURLE_OK && dleg->status == 0;
    bool dfail = dleg->status < 200 || dleg->status >= 300;
    if (d->mode == PDL_MODE_READ && (dgone || dfail))
        pdl_rt_release_send(rt->rel, json_object_get(d->presp, "kv_transfer_params"), d->P->zmq_address,
                            d->request_id);
    if (d->mode == PDL_MODE_WRITE && (dgone || dfail)) {
        /* WRITE: the prefill's push waits for remote_blocks the failed decode may never send. The same
         * failed releases tell a pdlink prefill to drop the push now (its ranks still waiting). */
        json_t *kv = json_pack("{s:s, s:I, s:I}", "transfer_id", d->transfer_id, "tp_size", (json_int_t)d->P->tp_size,
                               "remote_dp_rank", (json_int_t)0);
        pdl_rt_release_send(rt->rel, kv, d->P->zmq_address, d->request_id);
        json_decref(kv);
    }
    if (dgone) {
        pdl_rt_metrics_leg(rt->metrics, 'D', d->dbase, 1);
        if (dleg->timed_out)
            return failf_leg(rt, d->c, d->route, d->start_ns, PDL_RTERR_DECODE_TIMEOUT, 504, d->dleg_name, d->served,
                             "Request processing failed: Decode server timeout: %s: %s (--decode-*-timeout)",
                             d->D->http_address, pdl_leg_error(dleg));
        return failf_leg(rt, d->c, d->route, d->start_ns, PDL_RTERR_DECODE, 500, d->dleg_name, d->served,
                         "Request processing failed: Decode server error: %s: %s", d->D->http_address,
                         pdl_leg_error(dleg));
    }
    pdl_rt_metrics_leg(rt->metrics, 'D', d->dbase, dfail);
    if (dfail) {
        pdl_rt_metrics_error(rt->metrics, PDL_RTERR_DECODE);
        pdl_warn("request %s: decode %s answered %ld; passing it through", d->request_id, d->D->http_address,
                 dleg->status);
    }
    pdl_leg_release(rt->up, d->pleg);
    d->pleg = NULL;
    d->dleg = NULL; /* relay_decode owns it and the request's end */
    return relay_decode(rt, d->c, dleg, d->route, d->start_ns, dfail ? d->dleg_name : NULL, d->served);
}

/* docs/vllm-router.md#errors: 500 with the prefill's status and body; the decode is not used. But a 4xx
 * from the prefill (the request itself is bad: an unknown model, a prompt too long) reaches the client
 * unchanged, status and body, as vllm-router 0.1.17 does: a client then sees a 400 it does not retry
 * rather than a 500 that the openai client and lm-eval retry. */
static int dispatch_prefill_failed(dispatch_t *d)
{
    pdl_router_t *rt = d->rt;
    pdl_leg_t *pleg = d->pleg;
    size_t blen = pleg->len - pleg->rpos;
    int ret;
    if (pleg->status >= 400 && pleg->status < 500) {
        pdl_rt_metrics_error(rt->metrics, PDL_RTERR_PREFILL);
        finish_request(rt, d->route, d->start_ns);
        char line[700];
        snprintf(line, sizeof(line), PDL_RT_FAILED_LEG_HEADER ": %s", d->pleg_name);
        const char *h[3] = {line, d->served[0], d->served[1]};
        ret = pdl_http_reply_headers(d->c, (unsigned)pleg->status, "application/json", pleg->buf + pleg->rpos, blen,
                                     h, 3);
    } else if (pleg->timed_out) {
        /* The prefill may be slow or hung, not dead: it may still finish and hold the KV for this transfer.
         * Failed releases free that hold, as for a failed decode, if its notify port answers within their
         * linger (a stopped process does not: its lease frees the blocks). The request is not retried on
         * another prefill: the policy picked this one, the first may still be computing it, and a client
         * retries a 504 as it would any 5xx. */
        json_t *kv = json_pack("{s:s, s:I, s:I}", "transfer_id", d->transfer_id, "tp_size", (json_int_t)d->P->tp_size,
                               "remote_dp_rank", (json_int_t)0);
        pdl_rt_release_send(rt->rel, kv, d->P->zmq_address, d->request_id);
        json_decref(kv);
        ret = failf_leg(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL_TIMEOUT, 504, d->pleg_name, d->served,
                        "Request processing failed: Prefill server timeout: %s: %s (--prefill-*-timeout)",
                        d->P->http_address, pdl_leg_error(pleg));
    } else if (pleg->done && pleg->result != CURLE_OK && pleg->status == 0) {
        ret = failf_leg(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL, 500, d->pleg_name, d->served,
                        "Request processing failed: Prefill server error: %s: %s", d->P->http_address,
                        pdl_leg_error(pleg));
    } else {
        char head[128];
        int hl = snprintf(head, sizeof(head), "Request processing failed: Prefill server error %ld: ", pleg->status);
        char *msg = malloc((size_t)hl + blen + 1);
        if (msg == NULL) {
            ret = failf_leg(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL, 500, d->pleg_name, d->served, "%s", head);
        } else {
            memcpy(msg, head, (size_t)hl);
            memcpy(msg + hl, pleg->buf + pleg->rpos, blen);
            ret = fail_leg(rt, d->c, d->route, d->start_ns, PDL_RTERR_PREFILL, 500, d->pleg_name, d->served, msg,
                           (size_t)hl + blen);
            free(msg);
        }
    }
    pdl_warn("request %s: prefill %s failed (status %ld, %s)", d->request_id, d->P->http_address, pleg->status,
             pdl_leg_error(pleg));
    return ret;
}

int pdl_dispatch_completion(pdl_router_t *rt, pdl_http_conn_t *c, pdl_rt_route_t route, const char *body,
                            size_t len, const char *const *trace_headers, size_t ntrace)
{
    uint64_t start_ns = pdl__clock_now_ns();
    pdl_rt_metrics_request(rt->metrics, route);
    pdl_rt_metrics_active(rt->metrics, +1);

    json_error_t jerr;
    json_t *req = json_loadb(body, len, 0, &jerr);
    if (req == NULL)
        return failf(rt, c, route, start_ns, PDL_RTERR_BAD_REQUEST, 400,
                     "invalid JSON in request body: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    if (!json_is_object(req)) {
        json_decref(req);
        return failf(rt, c, route, start_ns, PDL_RTERR_BAD_REQUEST, 400, "request body must be a JSON object");
    }
    char vbuf[128];
    const char *bad = validate(req, route, vbuf, sizeof(vbuf));
    if (bad != NULL) {
        json_decref(req);
        return failf(rt, c, route, start_ns, PDL_RTERR_BAD_REQUEST, 400, "invalid request: %s", bad);
    }

    dispatch_t *d = calloc(1, sizeof(*d));
    if (d == NULL) {
        json_decref(req);
        return failf(rt, c, route, start_ns, PDL_RTERR_PREFILL, 500, "Request processing failed: out of memory");
    }
    *d = (dispatch_t){.rt = rt, .c = c, .route = route, .start_ns = start_ns, .req = req};
    bool prefill_ok = false;
    int ret;
    if (!dispatch_select(d, trace_headers, ntrace) || !dispatch_prepare(d) ||
        !(d->mode == PDL_MODE_WRITE ? dispatch_write(d, &prefill_ok) : dispatch_read(d, &prefill_ok)))
        ret = d->ret;
    else
        ret = prefill_ok ? dispatch_decode_answer(d) : dispatch_prefill_failed(d);

    pdl_leg_release(rt->up, d->pleg);
    pdl_leg_release(rt->up, d->dleg);
    json_decref(d->req);
    json_decref(d->pbody);
    json_decref(d->dbody);
    json_decref(d->presp);
    free(d->ptext);
    free(d->dtext);
    free(d->key);
    free(d->pw);
    free(d->dw);
    free(d);
    return ret;
}

int pdl_dispatch_proxy_get(pdl_router_t *rt, pdl_http_conn_t *c, const char *path)
{
    pdl_worker_t *w = NULL;
    size_t n = 0;
    uint64_t now = pdl__clock_now_ms();
    pdl_registry_snapshot(rt->reg, 'P', now, &w, &n);
    if (n == 0) {
        free(w);
        w = NULL;
        pdl_registry_snapshot(rt->reg, 'D', now, &w, &n);
    }
    if (n == 0) {
        free(w);
        const char *msg = "No workers available via service discovery";
        return pdl_http_reply(c, 503, NULL, msg, strlen(msg), NULL);
    }
    char url[700];
    snprintf(url, sizeof(url), "http://%s%s", w[0].http_address, path);
    const char *auth[] = {pdl_rt_apikey_header(&rt->apikey, w[0].api_key)};
    size_t nauth = auth[0] != NULL ? 1 : 0;
    free(w);
    pdl_leg_t *leg = pdl_leg_acquire(rt->up);
    pdl_error_t err;
    pdl_error_clear(&err);
    if (leg == NULL || pdl_leg_start(leg, NULL, "GET", url, NULL, 0, auth, nauth, true, &rt->cfg.prefill_timeouts, &err) != PDL_OK ||
        pdl_leg_wait(rt->up, leg->own_multi, &leg, NULL, 1) != PDL_OK) {
        pdl_leg_release(rt->up, leg);
        return pdl_http_reply(c, 503, NULL, "router is shutting down or out of memory", 40, NULL);
    }
    int ret;
    if (leg->result != CURLE_OK || leg->status < 100) {
        ret = pdl_http_replyf(c, 502, "GET %s failed: %s", url, pdl_leg_error(leg));
    } else {
        const char *ct = pdl_leg_header(leg, "content-type");
        ret = pdl_http_reply(c, (unsigned)leg->status, ct ? ct : "application/json", leg->buf + leg->rpos,
                               leg->len - leg->rpos, NULL);
    }
    pdl_leg_release(rt->up, leg);
    return ret;
}
