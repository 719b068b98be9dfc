/*
 * router.h -- the pdlink-router object shared by its modules (server, dispatch, discovery, main).
 *
 * Lifetime: pdl_router_create() builds everything and binds the discovery socket and the HTTP
 * listeners (ports may be 0 and are read back); pdl_router_stop() sets the stop flag, which every
 * waiting loop polls, and pdl_router_destroy() joins the threads and frees the rest.
 */
#ifndef PDL_ROUTER_ROUTER_H
#define PDL_ROUTER_ROUTER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "app/http.h"
#include "pdlink/auth.h"
#include "pdlink/status.h"
#include "router/apikey.h"
#include "router/config.h"
#include "router/metrics.h"
#include "router/policy.h"
#include "router/registry.h"
#include "router/upstream.h"

/*
 * Response header on a completion that failed at a worker: "prefill <http_address>" or "decode
 * <http_address>". The body stays vllm-router's (a decode's non-2xx is passed through unchanged), so
 * this is how a client tells which leg failed; `pdlink run` reports it.
 */
#define PDL_RT_FAILED_LEG_HEADER "X-Pdlink-Failed-Leg"
/* Response headers on every completion answer once the workers were chosen (success, pass-through,
 * failure at a worker): the http_address of the prefill and of the decode that served the request
 * (a pdlink addition), so a client can tell which instance served what; `pdlink run --chaos` does. */
#define PDL_RT_PREFILL_HEADER "X-Pdlink-Prefill"
#define PDL_RT_DECODE_HEADER "X-Pdlink-Decode"

typedef struct pdl_rt_release pdl_rt_release_t;
typedef struct pdl_discovery pdl_discovery_t;

typedef struct pdl_router {
    pdl_router_config_t cfg;
    atomic_bool stop;
    pdl_registry_t *reg;
    pdl_rt_metrics_t *metrics;
    pdl_policy_t *prefill_policy, *decode_policy;
    pdl_upstream_t *up;
    pdl_discovery_t *disc;
    pdl_rt_release_t *rel;        /* failed-status releases when a decode leg fails (release.h) */
    pdl_http_t *http, *prom;      /* the API listener and the --prometheus-port one (or NULL) */
    int http_port, prom_port, disc_port;
    pdl_auth_t *auth;             /* --auth-key-file (NULL: compatible mode): discovery CURVE, release DEALERs */
    pdl_rt_apikey_t apikey;       /* --api-key and which workers get it (apikey.h) */
} pdl_router_t;

pdl_status_t pdl_router_create(const pdl_router_config_t *cfg, pdl_router_t **rt_p, pdl_error_t *err);
void pdl_router_stop(pdl_router_t *rt);
void pdl_router_destroy(pdl_router_t *rt);

/* ---- discovery.c -------------------------------------------------------------------------- */

/* Bind the ROUTER socket on host:port (port 0 = any) and start the receive thread. */
pdl_status_t pdl_discovery_start(pdl_router_t *rt, const char *host, int port, pdl_discovery_t **d_p,
                                 int *bound_port_p, pdl_error_t *err);
/* Join the thread (it exits within ~100 ms of rt->stop) and close the socket. Accepts NULL. */
void pdl_discovery_destroy(pdl_discovery_t *d);

/* ---- server.c ----------------------------------------------------------------------------- */

/* Start an HTTP listener; metrics_only serves just /metrics (the --prometheus-port listener). Stop it
 * with pdl_http_stop. */
pdl_status_t pdl_server_start(pdl_router_t *rt, const char *host, int port, bool metrics_only, pdl_http_t **http_p,
                              int *bound_port_p, pdl_error_t *err);

/* ---- dispatch.c --------------------------------------------------------------------------- */

/*
 * Route one completion request (body complete). trace_headers are "Name: value" strings copied from
 * the client (traceparent, tracestate, baggage). Queues the response; returns an MHD_Result.
 */
int pdl_dispatch_completion(pdl_router_t *rt, pdl_http_conn_t *c, pdl_rt_route_t route, const char *body,
                            size_t len, const char *const *trace_headers, size_t ntrace);

/* GET proxied to one live instance (prefill first): /v1/models and friends. */
int pdl_dispatch_proxy_get(pdl_router_t *rt, pdl_http_conn_t *c, const char *path);

/* 16 random bytes shaped as a uuid4 (version and variant bits), as Python's uuid.uuid4().bytes. */
void pdl_router_uuid4(uint8_t out[16]);

#endif /* PDL_ROUTER_ROUTER_H */
