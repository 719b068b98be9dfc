/*
 * metrics.h -- the router's counters and their Prometheus text rendering (docs/vllm-router.md#health-and-metrics).
 *
 * Names follow vllm-router's PD metrics (vllm_router_pd_*), plus gauges for registered workers and
 * counters for the discovery socket (pdlink additions, named vllm_router_discovery_*). One mutex
 * guards everything: updates are a few per request, far below any contention that would matter.
 */
#ifndef PDL_ROUTER_METRICS_H
#define PDL_ROUTER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"
#include "router/registry.h"

typedef enum pdl_rt_route {
    PDL_ROUTE_COMPLETIONS = 0,
    PDL_ROUTE_CHAT = 1,
    PDL_ROUTE_COUNT_,
} pdl_rt_route_t;

typedef enum pdl_rt_error {
    PDL_RTERR_NO_WORKERS = 0,   /* 503: no prefill or no decode registered */
    PDL_RTERR_BAD_REQUEST,      /* 400: body is not a JSON object, wrong types */
    PDL_RTERR_PREFILL,          /* 500: prefill transport error or non-2xx */
    PDL_RTERR_DECODE,           /* decode transport error (500) or non-2xx (passed through) */
    PDL_RTERR_NO_MODE,          /* 500: no transfer mode known */
    PDL_RTERR_CLIENT_GONE,      /* client disconnected before the response ended */
    PDL_RTERR_PREFILL_TIMEOUT,  /* 504: the prefill leg passed a deadline (--prefill-*-timeout) */
    PDL_RTERR_DECODE_TIMEOUT,   /* 504, or a stream cut: the decode leg passed a deadline */
    PDL_RTERR_UNAUTHORIZED,     /* 401: a /v1 request without the --api-key bearer token */
    PDL_RTERR_COUNT_,
} pdl_rt_error_t;

typedef enum pdl_rt_disc {
    PDL_DISC_MESSAGES = 0,      /* frames received on the discovery socket */
    PDL_DISC_REGISTRATIONS,     /* accepted registrations (new or refresh) */
    PDL_DISC_MALFORMED,         /* dropped: not a registration */
    PDL_DISC_MODE_MISMATCH,     /* dropped: transfer mode differs from the cluster's */
    PDL_DISC_REJECTED,          /* dropped for another reason (table full, bad address) */
    PDL_DISC_EXPIRED,           /* entries removed by the TTL */
    PDL_DISC_REFUSED,           /* authenticated mode: connections without the cluster key (CURVE, ZAP) */
    PDL_DISC_HIJACK_REFUSED,    /* a registration that would change a worker registered from another address */
    PDL_DISC_LISTENER_PAUSES,   /* the discovery port closed for a while: its connection share or EMFILE */
    PDL_DISC_COUNT_,
} pdl_rt_disc_t;

typedef struct pdl_rt_metrics pdl_rt_metrics_t;

pdl_status_t pdl_rt_metrics_create(pdl_rt_metrics_t **m_p);
void pdl_rt_metrics_destroy(pdl_rt_metrics_t *m);

void pdl_rt_metrics_request(pdl_rt_metrics_t *m, pdl_rt_route_t route);
void pdl_rt_metrics_error(pdl_rt_metrics_t *m, pdl_rt_error_t e);
/* One leg sent to worker url ("http://ip:port"); role 'P' or 'D'. failed counts it in *_errors_total. */
void pdl_rt_metrics_leg(pdl_rt_metrics_t *m, char role, const char *url, int failed);
void pdl_rt_metrics_duration(pdl_rt_metrics_t *m, pdl_rt_route_t route, double seconds);
void pdl_rt_metrics_active(pdl_rt_metrics_t *m, int delta);
void pdl_rt_metrics_discovery(pdl_rt_metrics_t *m, pdl_rt_disc_t what, uint64_t n);
uint64_t pdl_rt_metrics_discovery_get(pdl_rt_metrics_t *m, pdl_rt_disc_t what);

/* Prometheus text 0.0.4; *text_p is malloc'ed. reg may be NULL (no worker gauges). */
pdl_status_t pdl_rt_metrics_render(pdl_rt_metrics_t *m, pdl_registry_t *reg, uint64_t now_ms, char **text_p,
                                   size_t *len_p);

const char *pdl_rt_route_path(pdl_rt_route_t r);

#endif /* PDL_ROUTER_METRICS_H */
