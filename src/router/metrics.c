/*
 * metrics.c -- counters, a duration histogram per route, per-worker leg counts, Prometheus rendering.
 *
 * Per-worker counts live in a small array keyed by (role, url) that only grows; a deployment has a
 * handful of instances, and a worker that comes back keeps its history, as Prometheus counters must.
 * Its size is bounded so that registrations of many fake addresses cannot grow it forever.
 */
#include "router/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdlink/strbuf.h"

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
    "no_workers", "bad_request", "prefill_error", "decode_error", "no_transfer_mode", "client_disconnected"};
static const char *const k_disc_names[PDL_DISC_COUNT_] = {
    "messages", "registrations", "malformed", "mode_mismatch", "rejected", "expired"};

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

/* Label values are addresses we stored; escape anyway, as the exposition format requires. */
static void tb_label(pdl_strbuf_t *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            pdl_strbuf_printf(b, "\\%c", *s);
        else if (*s == '\n')
            pdl_strbuf_printf(b, "\\n");
        else
            pdl_strbuf_printf(b, "%c", *s);
    }
}

pdl_status_t pdl_rt_metrics_render(pdl_rt_metrics_t *m, pdl_registry_t *reg, uint64_t now_ms, char **text_p,
                                   size_t *len_p)
{
    pdl_strbuf_t b = {0};
    b.cap = 8192;
    b.p = malloc(b.cap);
    if (b.p == NULL)
        return PDL_ERR_NOMEM;
    b.p[0] = '\0';
    size_t np = 0, nd = 0;
    pdl_transfer_mode_t mode = PDL_MODE_UNKNOWN;
    if (reg != NULL) {
        pdl_registry_counts(reg, now_ms, &np, &nd);
        mode = pdl_registry_mode(reg);
    }

    pthread_mutex_lock(&m->mu);
    pdl_strbuf_printf(&b, "# HELP vllm_router_pd_requests_total P/D requests received, by route.\n"
                  "# TYPE vllm_router_pd_requests_total counter\n");
    for (int r = 0; r < PDL_ROUTE_COUNT_; r++)
        pdl_strbuf_printf(&b, "vllm_router_pd_requests_total{route=\"%s\"} %llu\n", pdl_rt_route_path((pdl_rt_route_t)r),
                  (unsigned long long)m->requests[r]);
    pdl_strbuf_printf(&b, "# HELP vllm_router_pd_prefill_requests_total Prefill legs sent, by worker.\n"
                  "# TYPE vllm_router_pd_prefill_requests_total counter\n");
    for (size_t i = 0; i < m->nworkers; i++)
        if (m->workers[i].role == 'P') {
            pdl_strbuf_printf(&b, "vllm_router_pd_prefill_requests_total{worker=\"");
            tb_label(&b, m->workers[i].url);
            pdl_strbuf_printf(&b, "\"} %llu\n", (unsigned long long)m->workers[i].legs);
        }
    pdl_strbuf_printf(&b, "# HELP vllm_router_pd_decode_requests_total Decode legs sent, by worker.\n"
                  "# TYPE vllm_router_pd_decode_requests_total counter\n");
    for (size_t i = 0; i < m->nworkers; i++)
        if (m->workers[i].role == 'D') {
            pdl_strbuf_printf(&b, "vllm_router_pd_decode_requests_total{worker=\"");
            tb_label(&b, m->workers[i].url);
            pdl_strbuf_printf(&b, "\"} %llu\n", (unsigned long long)m->workers[i].legs);
        }
    pdl_strbuf_printf(&b, "# HELP vllm_router_pd_errors_total Failed P/D requests, by error type.\n"
                  "# TYPE vllm_router_pd_errors_total counter\n");
    for (int e = 0; e < PDL_RTERR_COUNT_; e++)
        pdl_strbuf_printf(&b, "vllm_router_pd_errors_total{error_type=\"%s\"} %llu\n", k_error_names[e],
                  (unsigned long long)m->errors[e]);
    pdl_strbuf_printf(&b,
              "# HELP vllm_router_pd_prefill_errors_total Prefill legs that failed (transport or non-2xx).\n"
              "# TYPE vllm_router_pd_prefill_errors_total counter\n"
              "vllm_router_pd_prefill_errors_total %llu\n"
              "# HELP vllm_router_pd_decode_errors_total Decode legs that failed (transport or non-2xx).\n"
              "# TYPE vllm_router_pd_decode_errors_total counter\n"
              "vllm_router_pd_decode_errors_total %llu\n",
              (unsigned long long)m->prefill_errors, (unsigned long long)m->decode_errors);
    pdl_strbuf_printf(&b, "# HELP vllm_router_pd_active_requests P/D requests in flight.\n"
                  "# TYPE vllm_router_pd_active_requests gauge\n"
                  "vllm_router_pd_active_requests %lld\n",
              (long long)m->active);
    pdl_strbuf_printf(&b, "# HELP vllm_router_pd_request_duration_seconds Time from request to the end of the response.\n"
                  "# TYPE vllm_router_pd_request_duration_seconds histogram\n");
    for (int r = 0; r < PDL_ROUTE_COUNT_; r++) {
        const char *path = pdl_rt_route_path((pdl_rt_route_t)r);
        uint64_t cum = 0;
        for (size_t i = 0; i < NBUCKETS; i++) {
            cum += m->duration[r].buckets[i];
            pdl_strbuf_printf(&b, "vllm_router_pd_request_duration_seconds_bucket{route=\"%s\",le=\"%g\"} %llu\n", path,
                      k_buckets[i], (unsigned long long)cum);
        }
        pdl_strbuf_printf(&b,
                  "vllm_router_pd_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %llu\n"
                  "vllm_router_pd_request_duration_seconds_sum{route=\"%s\"} %.6f\n"
                  "vllm_router_pd_request_duration_seconds_count{route=\"%s\"} %llu\n",
                  path, (unsigned long long)m->duration[r].count, path, m->duration[r].sum, path,
                  (unsigned long long)m->duration[r].count);
    }
    pdl_strbuf_printf(&b, "# HELP vllm_router_discovery_total Discovery socket events (pdlink), by kind.\n"
                  "# TYPE vllm_router_discovery_total counter\n");
    for (int d = 0; d < PDL_DISC_COUNT_; d++)
        pdl_strbuf_printf(&b, "vllm_router_discovery_total{kind=\"%s\"} %llu\n", k_disc_names[d],
                  (unsigned long long)m->disc[d]);
    pdl_strbuf_printf(&b,
              "# HELP vllm_router_discovery_malformed_total Discovery frames dropped as malformed.\n"
              "# TYPE vllm_router_discovery_malformed_total counter\n"
              "vllm_router_discovery_malformed_total %llu\n",
              (unsigned long long)m->disc[PDL_DISC_MALFORMED]);
    pthread_mutex_unlock(&m->mu);

    pdl_strbuf_printf(&b,
              "# HELP vllm_router_pd_registered_workers Live registered instances, by role.\n"
              "# TYPE vllm_router_pd_registered_workers gauge\n"
              "vllm_router_pd_registered_workers{role=\"prefill\"} %zu\n"
              "vllm_router_pd_registered_workers{role=\"decode\"} %zu\n"
              "# HELP vllm_router_pd_transfer_mode Cluster transfer mode (1 for the locked mode).\n"
              "# TYPE vllm_router_pd_transfer_mode gauge\n"
              "vllm_router_pd_transfer_mode{mode=\"READ\"} %d\n"
              "vllm_router_pd_transfer_mode{mode=\"WRITE\"} %d\n",
              np, nd, mode == PDL_MODE_READ, mode == PDL_MODE_WRITE);
    if (b.failed) {
        free(b.p);
        return PDL_ERR_NOMEM;
    }
    *text_p = b.p;
    *len_p = b.len;
    return PDL_OK;
}
