/*
 * test_node_metrics.c -- pdlink-node's /metrics:
 *   - the transfer busy time: the union of the pulls' [begin, end] intervals (overlapping pulls count
 *     their common wall time once, gaps count nothing, a busy period still open counts up to "now"), fed
 *     with explicit timestamps so nothing depends on a clock; the text carries it
 *     (pdlink_transfer_busy_seconds_total) next to the per-pull histogram;
 *   - the connector's counter table (PDL_RANK_COUNTERS in connector.h) and the text agree: every counter
 *     of pdl_rank_counters_t has a row, and every row appears with its HELP text, its TYPE and one sample
 *     per rank carrying the rank's value (nanosecond counters in seconds).
 * It links pdl_node, the node program's library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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

/* What /metrics renders from: a one-layer KV store of 4 blocks and its metrics, in *kv and *m. */
static void open_metrics(pdl_node_kv_t **kv, pdl_node_metrics_t **m)
{
    pdl_node_kv_config_t c;
    tn_small_kv_config(&c, 1, 4);
    *kv = NULL;
    assert_int_equal(pdl_node_kv_create(&c, kv, NULL), PDL_OK);
    *m = pdl_node_metrics_create();
    assert_non_null(*m);
}

static void render_has_busy_and_fine_buckets(void **state)
{
    (void)state;
    pdl_node_kv_t *kv;
    pdl_node_metrics_t *m;
    open_metrics(&kv, &m);
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

/* Every uint64_t of the struct has exactly one row, at its own offset, with a distinct name. */
static void table_covers_the_struct(void **state)
{
    (void)state;
    size_t n = 0;
    const pdl_counter_info_t *rows = pdl_rank_counters_table(&n);
    assert_int_equal(n * sizeof(uint64_t), sizeof(pdl_rank_counters_t));
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(rows[i].offset, i * sizeof(uint64_t));
        assert_non_null(strstr(rows[i].name, "pdlink_"));
        assert_true(strlen(rows[i].help) > 0);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(rows[i].name, rows[j].name);
    }
}

static void exposition_has_every_row(void **state)
{
    (void)state;
    pdl_node_kv_t *kv;
    pdl_node_metrics_t *m;
    open_metrics(&kv, &m);
    char *text = pdl_node_metrics_render(m, kv, "prefill");
    assert_non_null(text);
    size_t n = 0;
    const pdl_counter_info_t *rows = pdl_rank_counters_table(&n);
    for (size_t i = 0; i < n; i++) {
        char want[1024];
        snprintf(want, sizeof(want), "# HELP %s %s\n# TYPE %s counter\n", rows[i].name, rows[i].help, rows[i].name);
        if (strstr(text, want) == NULL)
            fail_msg("/metrics lacks the HELP/TYPE of %s", rows[i].name);
        for (int r = 0; r < 2; r++) {
            /* The Prometheus writer prints the shortest exact form: 0 seconds and 0 counts are both "0". */
            snprintf(want, sizeof(want), "%s{rank=\"%d\",role=\"prefill\"} 0\n", rows[i].name, r);
            if (strstr(text, want) == NULL)
                fail_msg("/metrics lacks the rank %d sample of %s", r, rows[i].name);
        }
    }
    /* The six counters that never reached /metrics before the table, and the new write time. */
    const char *added[] = {"pdlink_releases_parked_dropped_total", "pdlink_keepalives_received_total",
                           "pdlink_keepalives_sent_total",         "pdlink_send_failures_total",
                           "pdlink_remote_blocks_dropped_total",   "pdlink_write_done_late_total",
                           "pdlink_write_seconds_total"};
    for (size_t i = 0; i < sizeof(added) / sizeof(added[0]); i++)
        assert_non_null(strstr(text, added[i]));
    free(text);
    pdl_node_metrics_destroy(m);
    pdl_node_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(busy_is_the_union_of_intervals),
        cmocka_unit_test(render_has_busy_and_fine_buckets),
        cmocka_unit_test(table_covers_the_struct),
        cmocka_unit_test(exposition_has_every_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
