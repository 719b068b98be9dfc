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
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "pdlink/log.h"
#include "pdlink/strbuf.h"

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

typedef struct rank_metric {
    const char *name;
    const char *help;
    size_t offset;
    bool seconds; /* stored in ns, exported in seconds */
} rank_metric_t;

#define RM(n, h, field) {n, h, offsetof(pdl_rank_counters_t, field), false}
static const rank_metric_t rank_metrics[] = {
    RM("pdlink_transfers_total", "Transfers completed by this rank.", transfers),
    RM("pdlink_kv_bytes_total", "KV bytes moved by reads on this rank.", bytes),
    RM("pdlink_descriptors_total", "Transfer descriptors posted by this rank.", descriptors),
    {"pdlink_read_seconds_total", "Wall time of reads on this rank.", offsetof(pdl_rank_counters_t, read_ns), true},
    RM("pdlink_releases_sent_total", "Release messages sent.", releases_sent),
    RM("pdlink_releases_received_total", "Release messages received.", releases_received),
    RM("pdlink_releases_duplicate_total", "Duplicate releases received.", releases_duplicate),
    RM("pdlink_releases_late_total", "Releases for finished or expired transfers.", releases_late),
    RM("pdlink_releases_parked_total", "Releases that arrived before the transfer was held.", releases_parked),
    RM("pdlink_releases_failed_total", "Releases that reported a failed read.", releases_failed_status),
    RM("pdlink_dropped_malformed_total", "Malformed control frames dropped.", dropped_malformed),
    RM("pdlink_expired_total", "Held transfers reaped after defer_timeout.", expired),
    RM("pdlink_handshakes_total", "Handshakes completed.", handshakes),
    RM("pdlink_handshake_failures_total", "Handshakes that failed.", handshake_failures),
    RM("pdlink_read_failures_total", "Reads that failed.", read_failures),
    RM("pdlink_remote_blocks_sent_total", "WRITE mode: remote_blocks messages sent (decode).", remote_blocks_sent),
    RM("pdlink_remote_blocks_received_total", "WRITE mode: remote_blocks messages received (prefill).",
       remote_blocks_received),
    RM("pdlink_remote_blocks_parked_total", "WRITE mode: remote_blocks that arrived before the push.",
       remote_blocks_parked),
    RM("pdlink_write_failures_total", "WRITE mode: pushes whose handshake or write failed.", write_failures),
    RM("pdlink_write_done_sent_total", "WRITE mode: write_done messages sent (prefill).", write_done_sent),
    RM("pdlink_write_done_received_total", "WRITE mode: write_done messages counted (decode).", write_done_received),
    RM("pdlink_write_done_failed_total", "WRITE mode: write_done messages saying failed.", write_done_failed_status),
};
#undef RM

static void histogram(pdl_strbuf_t *b, const char *name, const char *help, const char *role, const double *bounds,
                      size_t nb, _Atomic uint64_t *buckets, uint64_t count, double sum)
{
    pdl_strbuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t i = 0; i < nb; i++)
        pdl_strbuf_printf(b, "%s_bucket{role=\"%s\",le=\"%g\"} %llu\n", name, role, bounds[i],
            (unsigned long long)atomic_load(&buckets[i]));
    pdl_strbuf_printf(b, "%s_bucket{role=\"%s\",le=\"+Inf\"} %llu\n", name, role, (unsigned long long)count);
    pdl_strbuf_printf(b, "%s_sum{role=\"%s\"} %.9g\n", name, role, sum);
    pdl_strbuf_printf(b, "%s_count{role=\"%s\"} %llu\n", name, role, (unsigned long long)count);
}

char *pdl_node_metrics_render(pdl_node_metrics_t *m, pdl_node_kv_t *kv, const char *role)
{
    pdl_strbuf_t b = {0};
    int tp = pdl_node_kv_tp_size(kv);
    pdl_instance_t *inst = pdl_node_kv_instance(kv);
    pdl_rank_counters_t *rc = calloc((size_t)tp, sizeof(*rc));
    if (rc == NULL) {
        return NULL;
    }
    if (inst != NULL)
        for (int r = 0; r < tp; r++)
            if (pdl_instance_counters(inst, r, &rc[r], NULL) != PDL_OK)
                memset(&rc[r], 0, sizeof(rc[r]));
    for (size_t i = 0; i < sizeof(rank_metrics) / sizeof(rank_metrics[0]); i++) {
        const rank_metric_t *rm = &rank_metrics[i];
        pdl_strbuf_printf(&b, "# HELP %s %s\n# TYPE %s counter\n", rm->name, rm->help, rm->name);
        for (int r = 0; r < tp; r++) {
            uint64_t v;
            memcpy(&v, (const char *)&rc[r] + rm->offset, sizeof(v));
            if (rm->seconds)
                pdl_strbuf_printf(&b, "%s{rank=\"%d\",role=\"%s\"} %.9f\n", rm->name, r, role, (double)v / 1e9);
            else
                pdl_strbuf_printf(&b, "%s{rank=\"%d\",role=\"%s\"} %llu\n", rm->name, r, role, (unsigned long long)v);
        }
    }
    free(rc);

    size_t held_t = inst ? pdl_instance_held_transfers(inst) : 0;
    size_t held_b = inst ? pdl_instance_held_blocks(inst) : 0;
    pdl_strbuf_printf(&b, "# HELP pdlink_held_transfers Transfers held for a consumer.\n# TYPE pdlink_held_transfers gauge\n");
    pdl_strbuf_printf(&b, "pdlink_held_transfers{role=\"%s\"} %zu\n", role, held_t);
    pdl_strbuf_printf(&b, "# HELP pdlink_held_blocks KV blocks held for a consumer.\n# TYPE pdlink_held_blocks gauge\n");
    pdl_strbuf_printf(&b, "pdlink_held_blocks{role=\"%s\"} %zu\n", role, held_b);
    pdl_strbuf_printf(&b, "# HELP pdlink_free_blocks Free KV blocks.\n# TYPE pdlink_free_blocks gauge\n");
    pdl_strbuf_printf(&b, "pdlink_free_blocks{role=\"%s\"} %zu\n", role, pdl_node_kv_free_count(kv));
    pdl_strbuf_printf(&b, "# HELP pdlink_total_blocks KV blocks per rank.\n# TYPE pdlink_total_blocks gauge\n");
    pdl_strbuf_printf(&b, "pdlink_total_blocks{role=\"%s\"} %u\n", role, pdl_node_kv_total_blocks(kv));
    pdl_strbuf_printf(&b, "# HELP pdlink_kv_bytes_verified_total Received KV bytes verified by the decode.\n"
            "# TYPE pdlink_kv_bytes_verified_total counter\n");
    pdl_strbuf_printf(&b, "pdlink_kv_bytes_verified_total{role=\"%s\"} %llu\n", role,
        (unsigned long long)atomic_load(&m->verified));
    pdl_strbuf_printf(&b, "# HELP pdlink_kv_bytes_mismatched_total Received KV bytes that did not match.\n"
            "# TYPE pdlink_kv_bytes_mismatched_total counter\n");
    pdl_strbuf_printf(&b, "pdlink_kv_bytes_mismatched_total{role=\"%s\"} %llu\n", role,
        (unsigned long long)atomic_load(&m->mismatched));
    pdl_strbuf_printf(&b, "# HELP pdlink_requests_total Completion requests by outcome.\n# TYPE pdlink_requests_total counter\n");
    pdl_strbuf_printf(&b, "pdlink_requests_total{role=\"%s\",status=\"ok\"} %llu\n", role,
        (unsigned long long)atomic_load(&m->req_ok));
    pdl_strbuf_printf(&b, "pdlink_requests_total{role=\"%s\",status=\"failed\"} %llu\n", role,
        (unsigned long long)atomic_load(&m->req_failed));
    pdl_strbuf_printf(&b, "# HELP pdlink_transfer_busy_seconds_total Wall time during which at least one pull was in flight "
            "on this instance (the union of the pulls' intervals).\n"
            "# TYPE pdlink_transfer_busy_seconds_total counter\n");
    pdl_strbuf_printf(&b, "pdlink_transfer_busy_seconds_total{role=\"%s\"} %.9f\n", role,
        (double)pdl_node_metrics_busy_ns(m, pdl__clock_now_ns()) / 1e9);
    histogram(&b, "pdlink_transfer_seconds", "Wall time of one pull (all ranks).", role, seconds_bounds, N_SEC,
              m->sec_buckets, atomic_load(&m->sec_count), (double)atomic_load(&m->sec_sum_ns) / 1e9);
    histogram(&b, "pdlink_transfer_bytes", "KV bytes of one pull (all ranks).", role, bytes_bounds, N_BYTES,
              m->byte_buckets, atomic_load(&m->byte_count), (double)atomic_load(&m->byte_sum));
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
