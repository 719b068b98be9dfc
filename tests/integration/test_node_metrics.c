/*
 * test_node_metrics.c -- pdlink-node's transfer busy time: the union of the pulls' [begin, end]
 * intervals (overlapping pulls count their common wall time once, gaps count nothing, a busy period
 * still open counts up to "now"), fed with explicit timestamps so nothing depends on a clock; and the
 * /metrics text carries it (pdlink_transfer_busy_seconds_total) next to the per-pull histogram.
 * It links pdl_node, the node program's library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "node/kvstore.h"
#include "node_testutil.h"
#include "node/metrics.h"

static void busy_is_the_union_of_intervals(void **state)
{
    (void)state;
    pdl_node_metrics_t *m = pdl_node_metrics_create();
    assert_non_null(m);
    /* [100, 200] and [150, 400] overlap: 300; [500, 550] alone: 50; [600, 700] within [600, 900]: 300. */
    pdl_node_metrics_pull_begin(m, 100);
    pdl_node_metrics_pull_begin(m, 150);
    pdl_node_metrics_pull_end(m, 200);
    assert_int_equal(pdl_node_metrics_busy_ns(m, 300), 200); /* open period counted up to now */
    pdl_node_metrics_pull_end(m, 400);
    assert_int_equal(pdl_node_metrics_busy_ns(m, 450), 300); /* idle time is not busy */
    pdl_node_metrics_pull_begin(m, 500);
    pdl_node_metrics_pull_end(m, 550);
    pdl_node_metrics_pull_begin(m, 600);
    pdl_node_metrics_pull_begin(m, 600);
    pdl_node_metrics_pull_end(m, 700);
    pdl_node_metrics_pull_end(m, 900);
    assert_int_equal(pdl_node_metrics_busy_ns(m, 5000), 650);
    /* A sum of pull times would say 100 + 250 + 50 + 100 + 300 = 800. */
    pdl_node_metrics_pull_end(m, 950); /* an unmatched end changes nothing */
    assert_int_equal(pdl_node_metrics_busy_ns(m, 5000), 650);
    pdl_node_metrics_destroy(m);
}

static void render_has_busy_and_fine_buckets(void **state)
{
    (void)state;
    pdl_node_kv_config_t c;
    tn_small_kv_config(&c, 1, 4);
    pdl_node_kv_t *kv = NULL;
    assert_int_equal(pdl_node_kv_create(&c, &kv, NULL), PDL_OK);
    pdl_node_metrics_t *m = pdl_node_metrics_create();
    pdl_node_metrics_pull_begin(m, 1000000000ull);
    pdl_node_metrics_pull_end(m, 1250000000ull);
    pdl_node_metrics_pull(m, 0.0042, 1000);
    char *text = pdl_node_metrics_render(m, kv, "decode");
    assert_non_null(text);
    assert_non_null(strstr(text, "pdlink_transfer_busy_seconds_total{role=\"decode\"} 0.25\n"));
    /* 4.2 ms falls in (3 ms, 5 ms]: the bucket below holds nothing, the one above holds it. */
    assert_non_null(strstr(text, "pdlink_transfer_seconds_bucket{role=\"decode\",le=\"0.003\"} 0\n"));
    assert_non_null(strstr(text, "pdlink_transfer_seconds_bucket{role=\"decode\",le=\"0.005\"} 1\n"));
    assert_non_null(strstr(text, "pdlink_transfer_seconds_count{role=\"decode\"} 1\n"));
    free(text);
    pdl_node_metrics_destroy(m);
    pdl_node_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(busy_is_the_union_of_intervals),
        cmocka_unit_test(render_has_busy_and_fine_buckets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
