/*
 * metrics.c -- counters, a duration histogram per route, per-worker leg counts, Prometheus rendering.
 *
 * Per-worker counts live in a small array keyed by (role, url) that only grows; a deployment has a
 * handful of instances, and a worker that comes back keeps its history, as Prometheus counters must.
 * Its size is bounded so that registrations of many fake addresses cannot grow it forever.
 */
#include "router/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/prom.h"

#define MAX_WORKER_SERIES 1024

static const double k_buckets[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                                   5.0,   10.0,  15.0, 30.0,  45.0, 60.0, 90.0, 120.0, 180.0, 240.0};
#define NBUCKETS (sizeof(k_buckets) / sizeof(k_buckets[0]))

typedef struct worker_series {
    char role;
    char url[600];
    uint64_t legs, failed;
} worker_series_t;

typedef struct histogram {
    uint64_t buckets[NBUCKETS]; /* non-cumulative; summed when rendered */
    uint64_t count;
    double sum;
} histogram_t;

struct pdl_rt_metrics {
    pthread_mutex_t mu;
    uint64_t requests[PDL_ROUTE_COUNT_];
    uint64_t errors[PDL_RTERR_COUNT_];
    uint64_t prefill_errors, decode_errors;
    uint64_t disc[PDL_DISC_COUNT_];
    int64_t active;
    histogram_t duration[PDL_ROUTE_COUNT_];
    worker_series_t *workers;
    size_t nworkers;
    uint64_t series_overflow;
};

static const char *const k_error_names[PDL_RTERR_COUNT_] = {
    "no_workers",          "bad_request",     "prefill_error",  "decode_error", "no_transfer_mode",
    "client_disconnected", "prefill_timeout", "decode_timeout", "unauthorized"};
static const char *const k_disc_names[PDL_DISC_COUNT_] = {
    "messages", "registrations", "malformed", "mode_mismatch", "rejected", "expired", "refused", "hijack_refused",
    "listener_pauses"};

const char *pdl_rt_route_path(pdl_rt_route_t r)
{
    return r == PDL_ROUTE_CHAT ? "/v1/chat/completions" : "/v1/completions";
}

pdl_status_t pdl_rt_metrics_create(pdl_rt_metrics_t **m_p)
{
    pdl_rt_metrics_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return PDL_ERR_NOMEM;
    m->workers = calloc(MAX_WORKER_SERIES, sizeof(*m->workers));
    if (m->workers == NULL) {
        free(m);
        return PDL_ERR_NOMEM;
    }
    pthread_mutex_init(&m->mu, NULL);
    *m_p = m;
    return PDL_OK;
}

void pdl_rt_metrics_destroy(pdl_rt_metrics_t *m)
{
    if (m == NULL)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m->workers);
    free(m);
}

void pdl_rt_metrics_request(pdl_rt_metrics_t *m, pdl_rt_route_t route)
{
    pthread_mutex_lock(&m->mu);
    m->requests[route]++;
    pthread_mutex_unlock(&m->mu);
}

void pdl_rt_metrics_error(pdl_rt_metrics_t *m, pdl_rt_error_t e)
{
    pthread_mutex_lock(&m->mu);
    m->errors[e]++;
    pthread_mutex_unlock(&m->mu);
}

void pdl_rt_metrics_leg(pdl_rt_metrics_t *m, char role, const char *url, int failed)
{
    pthread_mutex_lock(&m->mu);
    if (failed) {
        if (role == 'P')
            m->prefill_errors++;
        else
            m->decode_errors++;
    }
    worker_series_t *w = NULL;
    for (size_t i = 0; i < m->nworkers; i++)
        if (m->workers[i].role == role && strcmp(m->workers[i].url, url) == 0) {
            w = &m->workers[i];
            break;
        }
    if (w == NULL && m->nworkers < MAX_WORKER_SERIES && strlen(url) < sizeof(w->url)) {
        w = &m->workers[m->nworkers++];
        w->role = role;
        strcpy(w->url, url);
    }
    if (w != NULL) {
        w->legs++;
        w->failed += failed != 0;
    } else {
        m->series_overflow++;
    }
    pthread_mutex_unlock(&m->mu);
}

void pdl_rt_metrics_duration(pdl_rt_metrics_t *m, pdl_rt_route_t route, double seconds)
{
    pthread_mutex_lock(&m->mu);
    histogram_t *h = &m->duration[route];
    for (size_t i = 0; i < NBUCKETS; i++)
        if (seconds <= k_buckets[i]) {
            h->buckets[i]++;
            break;
        }
    h->count++;
    h->sum += seconds;
    pthread_mutex_unlock(&m->mu);
}

void pdl_rt_metrics_active(pdl_rt_metrics_t *m, int delta)
{
    pthread_mutex_lock(&m->mu);
    m->active += delta;
    pthread_mutex_unlock(&m->mu);
}

void pdl_rt_metrics_discovery(pdl_rt_metrics_t *m, pdl_rt_disc_t what, uint64_t n)
{
    pthread_mutex_lock(&m->mu);
    m->disc[what] += n;
    pthread_mutex_unlock(&m->mu);
}

uint64_t pdl_rt_metrics_discovery_get(pdl_rt_metrics_t *m, pdl_rt_disc_t what)
{
    pthread_mutex_lock(&m->mu);
    uint64_t v = m->disc[what];
    pthread_mutex_unlock(&m->mu);
    return v;
}

/* Legs sent per worker of one role ('P' or 'D'): the worker URL is the label (escaped by the writer). */
static void render_worker_legs(pdl_prom_t *w, const pdl_rt_metrics_t *m, char role, const char *name,
                               const char *help)
{
    pdl_prom_family(w, name, PDL_PROM_COUNTER, help);
    for (size_t i = 0; i < m->nworkers; i++)
        if (m->workers[i].role == role) {
            const pdl_prom_label_t worker[] = {{"worker", m->workers[i].url}};
            pdl_prom_u64(w, name, worker, 1, m->workers[i].legs);
        }
}

pdl_status_t pdl_rt_metrics_render(pdl_rt_metrics_t *m, pdl_registry_t *reg, uint64_t now_ms, char **text_p,
                                   size_t *len_p)
{
    size_t np = 0, nd = 0;
    pdl_transfer_mode_t mode = PDL_MODE_UNKNOWN;
    if (reg != NULL) {
        pdl_registry_counts(reg, now_ms, &np, &nd);
        mode = pdl_registry_mode(reg);
    }
    pdl_prom_t w;
    pdl_prom_init(&w);

    pthread_mutex_lock(&m->mu);
    pdl_prom_family(&w, "vllm_router_pd_requests_total", PDL_PROM_COUNTER, "P/D requests received, by route.");
    for (int r = 0; r < PDL_ROUTE_COUNT_; r++) {
        const pdl_prom_label_t route[] = {{"route", pdl_rt_route_path((pdl_rt_route_t)r)}};
        pdl_prom_u64(&w, "vllm_router_pd_requests_total", route, 1, m->requests[r]);
    }
    render_worker_legs(&w, m, 'P', "vllm_router_pd_prefill_requests_total", "Prefill legs sent, by worker.");
    render_worker_legs(&w, m, 'D', "vllm_router_pd_decode_requests_total", "Decode legs sent, by worker.");
    pdl_prom_family(&w, "vllm_router_pd_errors_total", PDL_PROM_COUNTER, "Failed P/D requests, by error type.");
    for (int e = 0; e < PDL_RTERR_COUNT_; e++) {
        const pdl_prom_label_t type[] = {{"error_type", k_error_names[e]}};
        pdl_prom_u64(&w, "vllm_router_pd_errors_total", type, 1, m->errors[e]);
    }
    pdl_prom_family(&w, "vllm_router_pd_prefill_errors_total", PDL_PROM_COUNTER,
                    "Prefill legs that failed (transport or non-2xx).");
    pdl_prom_u64(&w, "vllm_router_pd_prefill_errors_total", NULL, 0, m->prefill_errors);
    pdl_prom_family(&w, "vllm_router_pd_decode_errors_total", PDL_PROM_COUNTER,
                    "Decode legs that failed (transport or non-2xx).");
    pdl_prom_u64(&w, "vllm_router_pd_decode_errors_total", NULL, 0, m->decode_errors);
    pdl_prom_family(&w, "vllm_router_pd_active_requests", PDL_PROM_GAUGE, "P/D requests in flight.");
    pdl_prom_i64(&w, "vllm_router_pd_active_requests", NULL, 0, m->active);
    pdl_prom_family(&w, "vllm_router_pd_request_duration_seconds", PDL_PROM_HISTOGRAM,
                    "Time from request to the end of the response.");
    for (int r = 0; r < PDL_ROUTE_COUNT_; r++) {
        uint64_t cumulative[NBUCKETS], sum = 0;
        for (size_t i = 0; i < NBUCKETS; i++)
            cumulative[i] = sum += m->duration[r].buckets[i];
        const pdl_prom_label_t route[] = {{"route", pdl_rt_route_path((pdl_rt_route_t)r)}};
        pdl_prom_histogram(&w, "vllm_router_pd_request_duration_seconds", route, 1, k_buckets, cumulative, NBUCKETS,
                           m->duration[r].count, m->duration[r].sum);
    }
    pdl_prom_family(&w, "vllm_router_discovery_total", PDL_PROM_COUNTER,
                    "Discovery socket events (pdlink), by kind.");
    for (int d = 0; d < PDL_DISC_COUNT_; d++) {
        const pdl_prom_label_t kind[] = {{"kind", k_disc_names[d]}};
        pdl_prom_u64(&w, "vllm_router_discovery_total", kind, 1, m->disc[d]);
    }
    pdl_prom_family(&w, "vllm_router_discovery_malformed_total", PDL_PROM_COUNTER,
                    "Discovery frames dropped as malformed.");
    pdl_prom_u64(&w, "vllm_router_discovery_malformed_total", NULL, 0, m->disc[PDL_DISC_MALFORMED]);
    pthread_mutex_unlock(&m->mu);

    pdl_prom_family(&w, "vllm_router_pd_registered_workers", PDL_PROM_GAUGE, "Live registered instances, by role.");
    const pdl_prom_label_t prefill[] = {{"role", "prefill"}}, decode[] = {{"role", "decode"}};
    pdl_prom_u64(&w, "vllm_router_pd_registered_workers", prefill, 1, np);
    pdl_prom_u64(&w, "vllm_router_pd_registered_workers", decode, 1, nd);
    pdl_prom_family(&w, "vllm_router_pd_transfer_mode", PDL_PROM_GAUGE,
                    "Cluster transfer mode (1 for the locked mode).");
    const pdl_prom_label_t mode_read[] = {{"mode", "READ"}}, mode_write[] = {{"mode", "WRITE"}};
    pdl_prom_u64(&w, "vllm_router_pd_transfer_mode", mode_read, 1, mode == PDL_MODE_READ);
    pdl_prom_u64(&w, "vllm_router_pd_transfer_mode", mode_write, 1, mode == PDL_MODE_WRITE);
    char *text = pdl_prom_finish(&w, len_p);
    if (text == NULL)
        return PDL_ERR_NOMEM;
    *text_p = text;
    return PDL_OK;
}
