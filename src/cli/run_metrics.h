/*
 * run_metrics.h -- sums over a Prometheus text exposition (format 0.0.4), for `pdlink run`'s report.
 *
 * The scraper needs a handful of figures per node, each summed over the node's TP ranks: it asks for a
 * metric name (exact: "pdlink_kv_bytes_total", "pdlink_transfer_seconds_sum") and, optionally, one
 * label that must match (status="ok"). Lines are `name{labels} value [timestamp]` or `name value`;
 * comments and malformed lines are skipped (the node is a program under test, not trusted). Histograms
 * are summed bucket by bucket, for percentiles estimated from the buckets.
 */
#ifndef PDL_CLI_RUN_METRICS_H
#define PDL_CLI_RUN_METRICS_H

#include <stdbool.h>

/*
 * Sum of the values of every series named `name` in `text` whose labels include label_key="label_val"
 * (label_key NULL: every series). *found_p (may be NULL) gets the number of series that matched, so a
 * metric that is absent can be told from one that is 0.
 */
double pdl_run_metrics_sum(const char *text, const char *name, const char *label_key, const char *label_val,
                           int *found_p);

/* Cumulative histogram buckets summed over series (and nodes) by their `le` bound, bounds ascending. */
#define PDL_RUN_HIST_MAX 64
typedef struct pdl_run_hist {
    int n;
    double le[PDL_RUN_HIST_MAX];
    double cum[PDL_RUN_HIST_MAX];
} pdl_run_hist_t;

/*
 * Add every finite bucket of the series `bucket_name` ("pdlink_transfer_seconds_bucket") in `text` to
 * h, matching bounds by value (+Inf is left out: the total is the histogram's _count). Returns the
 * number of bucket lines added. Start with a zeroed pdl_run_hist_t.
 */
int pdl_run_metrics_hist_add(const char *text, const char *bucket_name, pdl_run_hist_t *h);

/*
 * The q-quantile (0..1) of the observations, `total` of them, interpolated linearly inside the bucket
 * that holds it (Prometheus' histogram_quantile); -1 when there is nothing to estimate from. A quantile
 * beyond the last finite bound returns that bound.
 */
double pdl_run_hist_quantile(const pdl_run_hist_t *h, double total, double q);

#endif
