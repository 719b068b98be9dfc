/*
 * metrics.h -- pdlink-node's Prometheus /metrics: the names of docs/metrics.md (the contract with
 * `pdlink run`), per-rank connector counters plus instance gauges, verification counters, request
 * outcomes and the per-pull transfer histograms.
 */
#ifndef PDL_NODE_METRICS_H
#define PDL_NODE_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "node/kvstore.h"

typedef struct pdl_node_metrics pdl_node_metrics_t;

pdl_node_metrics_t *pdl_node_metrics_create(void);
void pdl_node_metrics_destroy(pdl_node_metrics_t *m);

void pdl_node_metrics_request(pdl_node_metrics_t *m, bool ok);
void pdl_node_metrics_verified(pdl_node_metrics_t *m, uint64_t verified, uint64_t mismatched);
/* A /v1 request refused with 401 (--api-key). */
void pdl_node_metrics_unauthorized(pdl_node_metrics_t *m);
/* A pull starts / ends on this instance (pdl__clock_now_ns times): the busy time is the union of the
 * [begin, end] intervals, exported as pdlink_transfer_busy_seconds_total. Every begin needs an end. */
void pdl_node_metrics_pull_begin(pdl_node_metrics_t *m, uint64_t now_ns);
void pdl_node_metrics_pull_end(pdl_node_metrics_t *m, uint64_t now_ns);
/* Busy nanoseconds so far, counting a busy period still open up to now_ns. */
uint64_t pdl_node_metrics_busy_ns(pdl_node_metrics_t *m, uint64_t now_ns);
/* One observation per pull (successful or not). */
void pdl_node_metrics_pull(pdl_node_metrics_t *m, double seconds, uint64_t bytes);

/* Prometheus text 0.0.4; `role` is "prefill", "decode" or "both". Returns malloc'd text or NULL. */
char *pdl_node_metrics_render(pdl_node_metrics_t *m, pdl_node_kv_t *kv, const char *role);

#endif /* PDL_NODE_METRICS_H */
