/*
 * metrics.c -- Prometheus text for pdlink-node (see metrics.h).
 *
 * Request, verification and histogram figures are atomics bumped by the request threads; the connector
 * counters and block gauges are read from the KV store at scrape time. The transfer busy time is the
 * union of the pulls' intervals (pulls overlap at any concurrency above 1, so a sum of pull times
 * would count the same wall time several times): a count of pulls in flight opens a busy period on
 * 0 -> 1 and closes it on 1 -> 0. Every series is always present
 * (0 when nothing happened), so a scraper never has to treat a missing series as zero. Histograms are
 * cumulative as Prometheus wants: bucket i counts observations <= its bound.
 */
#include "node/metrics.h"

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/prom.h"
#include "common/log.h"
#include "common/clock.h"

/* 1-1.5-2-3-5-7 per decade from 100 us to 30 s: fine enough that a percentile interpolated inside a
 * bucket (as `pdlink run` and Prometheus' histogram_quantile do) is within a factor 1.5 of the truth. */
static const double seconds_bounds[] = {0.0001, 0.00015, 0.0002, 0.0003, 0.0005, 0.0007, 0.001, 0.0015, 0.002,
                                        0.003,  0.005,   0.007,  0.01,   0.015,  0.02,   0.03,  0.05,   0.07,
                                        0.1,    0.15,    0.2,    0.3,    0.5,    0.7,    1,     1.5,    2,
                                        3,      5,       7,      10,     15,     20,     30};
#define N_SEC (sizeof(seconds_bounds) / sizeof(seconds_bounds[0]))
static const double bytes_bounds[] = {4096.0,       16384.0,      65536.0,       262144.0,      1048576.0,
                                      4194304.0,    16777216.0,   67108864.0,    268435456.0,   1073741824.0,
                                      4294967296.0, 17179869184.0};
#define N_BYTES (sizeof(bytes_bounds) / sizeof(bytes_bounds[0]))

struct pdl_node_metrics {
    /* Busy time: the union of the pulls' [start, end] intervals, kept as a count of pulls in flight and
     * the start of the current busy period (one mutex: two fields change together). */
    pthread_mutex_t busy_mu;
    int inflight;
    uint64_t busy_start_ns, busy_ns;
    _Atomic uint64_t req_ok, req_failed;
    _Atomic uint64_t unauthorized; /* /v1 requests refused for want of the --api-key bearer token */
    _Atomic uint64_t verified, mismatched;
    _Atomic uint64_t sec_buckets[N_SEC], sec_count, sec_sum_ns;
    _Atomic uint64_t byte_buckets[N_BYTES], byte_count, byte_sum;
};

pdl_node_metrics_t *pdl_node_metrics_create(void)
{
    pdl_node_metrics_t *m = calloc(1, sizeof(*m));
    if (m != NULL)
        pthread_mutex_init(&m->busy_mu, NULL);
    return m;
}

void pdl_node_metrics_destroy(pdl_node_metrics_t *m)
{
    if (m == NULL)
        return;
    pthread_mutex_destroy(&m->busy_mu);
    free(m);
}

void pdl_node_metrics_pull_begin(pdl_node_metrics_t *m, uint64_t now_ns)
{
    pthread_mutex_lock(&m->busy_mu);
    if (m->inflight++ == 0)
        m->busy_start_ns = now_ns;
    pthread_mutex_unlock(&m->busy_mu);
}

void pdl_node_metrics_pull_end(pdl_node_metrics_t *m, uint64_t now_ns)
{
    pthread_mutex_lock(&m->busy_mu);
    if (m->inflight > 0 && --m->inflight == 0 && now_ns > m->busy_start_ns)
        m->busy_ns += now_ns - m->busy_start_ns;
    pthread_mutex_unlock(&m->busy_mu);
}

uint64_t pdl_node_metrics_busy_ns(pdl_node_metrics_t *m, uint64_t now_ns)
{
    pthread_mutex_lock(&m->busy_mu);
    uint64_t v = m->busy_ns;
    if (m->inflight > 0 && now_ns > m->busy_start_ns)
        v += now_ns - m->busy_start_ns; /* the busy period still open */
    pthread_mutex_unlock(&m->busy_mu);
    return v;
}

void pdl_node_metrics_request(pdl_node_metrics_t *m, bool ok)
{
    atomic_fetch_add(ok ? &m->req_ok : &m->req_failed, 1);
}

void pdl_node_metrics_unauthorized(pdl_node_metrics_t *m) { atomic_fetch_add(&m->unauthorized, 1); }

void pdl_node_metrics_verified(pdl_node_metrics_t *m, uint64_t verified, uint64_t mismatched)
{
    atomic_fetch_add(&m->verified, verified);
    atomic_fetch_add(&m->mismatched, mismatched);
}

void pdl_node_metrics_pull(pdl_node_metrics_t *m, double seconds, uint64_t bytes)
{
    for (size_t i = 0; i < N_SEC; i++)
        if (seconds <= seconds_bounds[i])
            atomic_fetch_add(&m->sec_buckets[i], 1);
    atomic_fetch_add(&m->sec_count, 1);
    atomic_fetch_add(&m->sec_sum_ns, (uint64_t)(seconds * 1e9));
    for (size_t i = 0; i < N_BYTES; i++)
        if ((double)bytes <= bytes_bounds[i])
            atomic_fetch_add(&m->byte_buckets[i], 1);
    atomic_fetch_add(&m->byte_count, 1);
    atomic_fetch_add(&m->byte_sum, bytes);
}

/* The connector's per-rank counters: one family per counter, a series per rank, all from one snapshot
 * per rank. */
static void render_rank_counters(pdl_prom_t *w, pdl_instance_t *inst, int tp, const char *role)
{
    pdl_rank_counters_t *rc = calloc((size_t)tp, sizeof(*rc));
    if (rc == NULL) {
        w->out.failed = true;
        return;
    }
    if (inst != NULL)
        for (int r = 0; r < tp; r++)
            if (pdl_instance_counters(inst, r, &rc[r], NULL) != PDL_OK)
                memset(&rc[r], 0, sizeof(rc[r]));
    /* Every row of the connector's counter table (connector.h), so no counter misses /metrics. */
    size_t nrows = 0;
    const pdl_counter_info_t *rows = pdl_rank_counters_table(&nrows);
    for (size_t i = 0; i < nrows; i++) {
        const pdl_counter_info_t *rm = &rows[i];
        pdl_prom_family(w, rm->name, PDL_PROM_COUNTER, rm->help);
        for (int r = 0; r < tp; r++) {
            uint64_t v;
            memcpy(&v, (const char *)&rc[r] + rm->offset, sizeof(v));
            char rank[16];
            snprintf(rank, sizeof(rank), "%d", r);
            const pdl_prom_label_t labels[] = {{"rank", rank}, {"role", role}};
            if (rm->kind == PDL_COUNTER_NS)
                pdl_prom_f64(w, rm->name, labels, 2, (double)v / 1e9);
            else
                pdl_prom_u64(w, rm->name, labels, 2, v);
        }
    }
    free(rc);
}

/* Who read or wrote this node's KV, so that an access from a host that should not have one shows
 * (docs/security.md) -- the remote accesses each rank's engine served, per peer host. One family after
 * the other: the text format wants a family's samples together. */
static void render_peer_stats(pdl_prom_t *w, pdl_instance_t *inst, int tp, const char *role)
{
    static const struct {
        const char *name, *help;
        size_t off; /* of the value in pdl_engine_peer_stats_t */
    } fam[] = {{"pdlink_data_peer_requests_total",
                "Remote READ/WRITE requests this rank's engine served, per peer host (\"other\" past 64 hosts).",
                offsetof(pdl_engine_peer_stats_t, requests)},
               {"pdlink_data_peer_bytes_total", "Bytes of those requests, per peer host.",
                offsetof(pdl_engine_peer_stats_t, bytes)},
               {"pdlink_data_peer_auth_refused_total",
                "Authenticated mode: data connections refused for want of the cluster key, per peer host.",
                offsetof(pdl_engine_peer_stats_t, auth_refused)}};
    pdl_engine_peer_stats_t rows[PDL_ENGINE_MAX_PEERS + 1];
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        pdl_prom_family(w, fam[f].name, PDL_PROM_COUNTER, fam[f].help);
        for (int r = 0; inst != NULL && r < tp; r++) {
            size_t n = pdl_instance_peer_stats(inst, r, rows, PDL_ENGINE_MAX_PEERS + 1);
            char rank[16];
            snprintf(rank, sizeof(rank), "%d", r);
            for (size_t i = 0; i < n && i <= PDL_ENGINE_MAX_PEERS; i++) {
                const pdl_prom_label_t labels[] = {{"rank", rank}, {"role", role}, {"peer", rows[i].host}};
                uint64_t v;
                memcpy(&v, (const char *)&rows[i] + fam[f].off, sizeof(v));
                pdl_prom_u64(w, fam[f].name, labels, 3, v);
            }
        }
    }
}

static void render_histogram(pdl_prom_t *w, const char *name, const char *help, const pdl_prom_label_t *role,
                             const double *bounds, size_t nb, _Atomic uint64_t *buckets, uint64_t count, double sum)
{
    uint64_t cumulative[N_SEC > N_BYTES ? N_SEC : N_BYTES];
    for (size_t i = 0; i < nb; i++)
        cumulative[i] = atomic_load(&buckets[i]); /* already cumulative: see pdl_node_metrics_pull */
    pdl_prom_family(w, name, PDL_PROM_HISTOGRAM, help);
    pdl_prom_histogram(w, name, role, 1, bounds, cumulative, nb, count, sum);
}

char *pdl_node_metrics_render(pdl_node_metrics_t *m, pdl_node_kv_t *kv, const char *role)
{
    pdl_prom_t w;
    pdl_prom_init(&w);
    pdl_instance_t *inst = pdl_node_kv_instance(kv);
    /* The held gauges are read before the counters: a release is counted before the blocks it frees
     * are, so a scrape that shows nothing held also counts every release that freed them. Read after
     * the counters, a release arriving in between showed up as freed blocks but not as received
     * (pdlink run's drain took such a scrape: "96 sent, 88 received" with 0 blocks held). */
    size_t held_transfers = inst ? pdl_instance_held_transfers(inst) : 0;
    size_t held_blocks = inst ? pdl_instance_held_blocks(inst) : 0;
    render_rank_counters(&w, inst, pdl_node_kv_tp_size(kv), role);
    render_peer_stats(&w, inst, pdl_node_kv_tp_size(kv), role);

    const pdl_prom_label_t by_role[] = {{"role", role}};
    pdl_prom_family(&w, "pdlink_held_transfers", PDL_PROM_GAUGE, "Transfers held for a consumer.");
    pdl_prom_u64(&w, "pdlink_held_transfers", by_role, 1, held_transfers);
    pdl_prom_family(&w, "pdlink_held_blocks", PDL_PROM_GAUGE, "KV blocks held for a consumer.");
    pdl_prom_u64(&w, "pdlink_held_blocks", by_role, 1, held_blocks);
    pdl_prom_family(&w, "pdlink_prewarm_pending", PDL_PROM_GAUGE,
                    "Rank pairs the background prewarm still has to connect (a READ decode, a WRITE prefill); 0: no "
                    "transfer waits for a handshake or a mapping.");
    pdl_prom_u64(&w, "pdlink_prewarm_pending", by_role, 1, inst ? pdl_instance_prewarm_pending(inst) : 0);
    pdl_prom_family(&w, "pdlink_free_blocks", PDL_PROM_GAUGE, "Free KV blocks.");
    pdl_prom_u64(&w, "pdlink_free_blocks", by_role, 1, pdl_node_kv_free_count(kv));
    pdl_prom_family(&w, "pdlink_total_blocks", PDL_PROM_GAUGE, "KV blocks per rank.");
    pdl_prom_u64(&w, "pdlink_total_blocks", by_role, 1, pdl_node_kv_total_blocks(kv));
    pdl_prom_family(&w, "pdlink_kv_bytes_verified_total", PDL_PROM_COUNTER,
                    "Received KV bytes verified by the decode.");
    pdl_prom_u64(&w, "pdlink_kv_bytes_verified_total", by_role, 1, atomic_load(&m->verified));
    pdl_prom_family(&w, "pdlink_kv_bytes_mismatched_total", PDL_PROM_COUNTER,
                    "Received KV bytes that did not match.");
    pdl_prom_u64(&w, "pdlink_kv_bytes_mismatched_total", by_role, 1, atomic_load(&m->mismatched));
    pdl_prom_family(&w, "pdlink_requests_total", PDL_PROM_COUNTER, "Completion requests by outcome.");
    const pdl_prom_label_t ok[] = {{"role", role}, {"status", "ok"}};
    const pdl_prom_label_t failed[] = {{"role", role}, {"status", "failed"}};
    pdl_prom_u64(&w, "pdlink_requests_total", ok, 2, atomic_load(&m->req_ok));
    pdl_prom_u64(&w, "pdlink_requests_total", failed, 2, atomic_load(&m->req_failed));
    pdl_prom_family(&w, "pdlink_http_unauthorized_total", PDL_PROM_COUNTER,
                    "Requests to /v1 routes refused with 401: no or a wrong Authorization: Bearer token (--api-key).");
    pdl_prom_u64(&w, "pdlink_http_unauthorized_total", by_role, 1, atomic_load(&m->unauthorized));
    pdl_prom_family(&w, "pdlink_transfer_busy_seconds_total", PDL_PROM_COUNTER,
                    "Wall time during which at least one pull was in flight on this instance (the union of the "
                    "pulls' intervals).");
    pdl_prom_f64(&w, "pdlink_transfer_busy_seconds_total", by_role, 1,
                 (double)pdl_node_metrics_busy_ns(m, pdl__clock_now_ns()) / 1e9);
    render_histogram(&w, "pdlink_transfer_seconds", "Wall time of one pull (all ranks).", by_role, seconds_bounds,
                     N_SEC, m->sec_buckets, atomic_load(&m->sec_count), (double)atomic_load(&m->sec_sum_ns) / 1e9);
    render_histogram(&w, "pdlink_transfer_bytes", "KV bytes of one pull (all ranks).", by_role, bytes_bounds,
                     N_BYTES, m->byte_buckets, atomic_load(&m->byte_count), (double)atomic_load(&m->byte_sum));
    return pdl_prom_finish(&w, NULL);
}
