/*
 * test_node_metrics_counters.c -- the connector's counter table (PDL_RANK_COUNTERS in connector.h)
 * and pdlink-node's /metrics text agree: every counter of pdl_rank_counters_t has a row, and every row
 * appears in the exposition with its HELP text, its TYPE and one sample per rank carrying the rank's
 * value (nanosecond counters in seconds). The node's code comes from its library, pdl_node.
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
    pdl_node_kv_config_t c;
    tn_small_kv_config(&c, 1, 4);
    pdl_node_kv_t *kv = NULL;
    assert_int_equal(pdl_node_kv_create(&c, &kv, NULL), PDL_OK);
    pdl_node_metrics_t *m = pdl_node_metrics_create();
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
        cmocka_unit_test(table_covers_the_struct),
        cmocka_unit_test(exposition_has_every_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
