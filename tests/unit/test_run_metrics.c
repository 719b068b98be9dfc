/*
 * test_run_metrics.c -- `pdlink run`'s Prometheus readers: sums by name and label, histogram buckets
 * summed over nodes by their bound (whatever order and spelling the bounds come in, +Inf left out), and
 * percentiles interpolated inside the bucket that holds them, as Prometheus' histogram_quantile does.
 * It links pdl_cli, the pdlink program's library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cli/run_metrics.h"

static const char *NODE_A =
    "# HELP pdlink_transfer_seconds Wall time of one pull.\n"
    "# TYPE pdlink_transfer_seconds histogram\n"
    "pdlink_transfer_seconds_bucket{role=\"decode\",le=\"0.001\"} 0\n"
    "pdlink_transfer_seconds_bucket{role=\"decode\",le=\"0.01\"} 6\n"
    "pdlink_transfer_seconds_bucket{role=\"decode\",le=\"0.1\"} 9\n"
    "pdlink_transfer_seconds_bucket{role=\"decode\",le=\"+Inf\"} 10\n"
    "pdlink_transfer_seconds_sum{role=\"decode\"} 0.5\n"
    "pdlink_transfer_seconds_count{role=\"decode\"} 10\n"
    "pdlink_transfer_busy_seconds_total{role=\"decode\"} 0.25\n";
/* Another node: bounds in another order and spelling, one extra bound. */
static const char *NODE_B = "pdlink_transfer_seconds_bucket{le=\"1e-1\",role=\"decode\"} 10\n"
                            "pdlink_transfer_seconds_bucket{le=\"0.010\",role=\"decode\"} 4\n"
                            "pdlink_transfer_seconds_bucket{le=\"0.05\",role=\"decode\"} 8\n"
                            "pdlink_transfer_seconds_bucket{le=\"0.001\",role=\"decode\"} 0\n"
                            "pdlink_transfer_seconds_bucket{le=\"+Inf\",role=\"decode\"} 10\n"
                            "pdlink_transfer_seconds_count{role=\"decode\"} 10\n"
                            "pdlink_transfer_busy_seconds_total{role=\"decode\"} 0.5\n";

static void sums_by_name(void **state)
{
    (void)state;
    int found = 0;
    assert_true(pdl_run_metrics_sum(NODE_A, "pdlink_transfer_busy_seconds_total", NULL, NULL, &found) == 0.25);
    assert_int_equal(found, 1);
    assert_true(pdl_run_metrics_sum(NODE_A, "pdlink_transfer_seconds", NULL, NULL, &found) == 0);
    assert_int_equal(found, 0); /* a prefix of longer names is not the name */
    assert_true(pdl_run_metrics_sum(NODE_A, "pdlink_transfer_seconds_bucket", "le", "0.01", &found) == 6);
}

static void buckets_add_up_by_bound(void **state)
{
    (void)state;
    pdl_run_hist_t h;
    memset(&h, 0, sizeof(h));
    assert_int_equal(pdl_run_metrics_hist_add(NODE_A, "pdlink_transfer_seconds_bucket", &h), 3);
    assert_int_equal(pdl_run_metrics_hist_add(NODE_B, "pdlink_transfer_seconds_bucket", &h), 4);
    assert_int_equal(h.n, 4);
    double le[] = {0.001, 0.01, 0.05, 0.1}, cum[] = {0, 10, 8, 19};
    for (int i = 0; i < 4; i++) {
        assert_true(h.le[i] == le[i]);
        assert_true(h.cum[i] == cum[i]);
    }
    /* Node A has no 0.05 bucket: its 6 <= 0.01 are below 0.05 too, which a per-bound sum cannot know;
     * the nodes of one run export the same bounds, so this only shows the merge keeps bounds sorted. */
}

static void quantiles_interpolate_inside_buckets(void **state)
{
    (void)state;
    pdl_run_hist_t h;
    memset(&h, 0, sizeof(h));
    pdl_run_metrics_hist_add(NODE_A, "pdlink_transfer_seconds_bucket", &h);
    pdl_run_metrics_hist_add(NODE_A, "pdlink_transfer_seconds_bucket", &h); /* two identical nodes */
    /* 20 pulls: 12 in (1 ms, 10 ms], 6 in (10 ms, 100 ms], 2 above 100 ms. */
    double p50 = pdl_run_hist_quantile(&h, 20, 0.5); /* rank 10 of 12 in the first bucket */
    assert_true(p50 > 0.001 + 0.009 * 10.0 / 12.0 - 1e-12 && p50 < 0.001 + 0.009 * 10.0 / 12.0 + 1e-12);
    double p80 = pdl_run_hist_quantile(&h, 20, 0.8); /* rank 16: 4th of 6 in (0.01, 0.1] */
    assert_true(p80 > 0.01 + 0.09 * 4.0 / 6.0 - 1e-12 && p80 < 0.01 + 0.09 * 4.0 / 6.0 + 1e-12);
    assert_true(pdl_run_hist_quantile(&h, 20, 0.99) == 0.1); /* above the last finite bound */
    pdl_run_hist_t empty;
    memset(&empty, 0, sizeof(empty));
    assert_true(pdl_run_hist_quantile(&empty, 20, 0.5) < 0);
    assert_true(pdl_run_hist_quantile(&h, 0, 0.5) < 0);
}

static void hostile_bucket_lines_are_skipped(void **state)
{
    (void)state;
    const char *bad = "pdlink_transfer_seconds_bucket{role=\"decode\"} 5\n"          /* no le */
                      "pdlink_transfer_seconds_bucket{le=\"abc\"} 5\n"               /* not a number */
                      "pdlink_transfer_seconds_bucket{le=\"NaN\"} 5\n"
                      "pdlink_transfer_seconds_bucket{le=\"0.5\"} -3\n"              /* negative count */
                      "pdlink_transfer_seconds_bucket{le=\"0.5\" 7\n"                /* unterminated */
                      "pdlink_transfer_seconds_bucket{le=\"0.25\",x=\"}\"} 2\n";     /* brace in a value */
    pdl_run_hist_t h;
    memset(&h, 0, sizeof(h));
    assert_int_equal(pdl_run_metrics_hist_add(bad, "pdlink_transfer_seconds_bucket", &h), 1);
    assert_int_equal(h.n, 1);
    assert_true(h.le[0] == 0.25 && h.cum[0] == 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sums_by_name),
        cmocka_unit_test(buckets_add_up_by_bound),
        cmocka_unit_test(quantiles_interpolate_inside_buckets),
        cmocka_unit_test(hostile_bucket_lines_are_skipped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
