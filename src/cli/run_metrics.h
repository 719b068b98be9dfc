/*
 * run_metrics.h -- sums over a Prometheus text exposition (format 0.0.4), for `pdlink run`'s report.
 *
 * The scraper needs a handful of figures per node, each summed over the node's TP ranks: it asks for a
 * metric name (exact: "pdlink_kv_bytes_total", "pdlink_transfer_seconds_sum") and, optionally, one
 * label that must match (status="ok"). Lines are `name{labels} value [timestamp]` or `name value`;
 * comments and malformed lines are skipped (the node is a program under test, not trusted).
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

#endif
