/*
 * test_app_prom.c -- the Prometheus text writer shared by pdlink-node and pdlink-router (src/app/prom.c):
 * HELP/TYPE appear once per family however often it is started, label values and HELP text are escaped
 * as the exposition format requires, numbers read back exactly, histograms are cumulative with le last
 * and +Inf equal to the count, and a document with no labels has no braces.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/prom.h"

static size_t count_of(const char *text, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(text, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void family_header_once(void **state)
{
    (void)state;
    pdl_prom_t w;
    pdl_prom_init(&w);
    for (int r = 0; r < 3; r++) {
        pdl_prom_family(&w, "x_total", PDL_PROM_COUNTER, "Things.");
        char rank[4];
        snprintf(rank, sizeof(rank), "%d", r);
        const pdl_prom_label_t l[] = {{"rank", rank}};
        pdl_prom_u64(&w, "x_total", l, 1, (uint64_t)r * 10);
    }
    pdl_prom_family(&w, "y", PDL_PROM_GAUGE, "Level.");
    pdl_prom_i64(&w, "y", NULL, 0, -4);
    size_t len = 0;
    char *text = pdl_prom_finish(&w, &len);
    assert_non_null(text);
    assert_int_equal(len, strlen(text));
    assert_string_equal(text, "# HELP x_total Things.\n# TYPE x_total counter\n"
                              "x_total{rank=\"0\"} 0\nx_total{rank=\"1\"} 10\nx_total{rank=\"2\"} 20\n"
                              "# HELP y Level.\n# TYPE y gauge\ny -4\n");
    assert_int_equal(count_of(text, "# TYPE"), 2);
    free(text);
}

static void labels_and_help_are_escaped(void **state)
{
    (void)state;
    pdl_prom_t w;
    pdl_prom_init(&w);
    pdl_prom_family(&w, "z", PDL_PROM_COUNTER, "A \\ backslash\nand a newline \"kept\".");
    const pdl_prom_label_t l[] = {{"worker", "http://h:1/\"q\"\\\n"}, {"role", "decode"}};
    pdl_prom_u64(&w, "z", l, 2, UINT64_MAX);
    char *text = pdl_prom_finish(&w, NULL);
    assert_non_null(text);
    /* HELP escapes backslash and newline only; a label value also escapes the double quote. */
    assert_non_null(strstr(text, "# HELP z A \\\\ backslash\\nand a newline \"kept\".\n"));
    assert_non_null(strstr(text, "z{worker=\"http://h:1/\\\"q\\\"\\\\\\n\",role=\"decode\"} 18446744073709551615\n"));
    free(text);
}

static void floats_read_back_exactly(void **state)
{
    (void)state;
    static const double values[] = {0.1, 0.25, 1e-9, 123456.789012345678, 17179869184.0, 1.0 / 3.0};
    pdl_prom_t w;
    pdl_prom_init(&w);
    pdl_prom_family(&w, "f", PDL_PROM_GAUGE, "Floats.");
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++)
        pdl_prom_f64(&w, "f", NULL, 0, values[i]);
    pdl_prom_f64(&w, "f", NULL, 0, 1.0 / 0.0);
    pdl_prom_f64(&w, "f", NULL, 0, 0.0 / 0.0);
    char *text = pdl_prom_finish(&w, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "f 0.1\nf 0.25\nf 1e-09\n"));   /* shortest form, not %.9f */
    assert_non_null(strstr(text, "f 17179869184\n"));             /* %g would have said 1.71799e+10 */
    assert_non_null(strstr(text, "f +Inf\nf NaN\n"));
    const char *p = text;
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        p = strstr(p, "\nf ") + 3;
        assert_true(strtod(p, NULL) == values[i]);
    }
    free(text);
}

static void histogram_is_cumulative_with_le_last(void **state)
{
    (void)state;
    static const double bounds[] = {0.001, 0.5, 4096};
    static const uint64_t cumulative[] = {1, 3, 3};
    pdl_prom_t w;
    pdl_prom_init(&w);
    pdl_prom_family(&w, "h_seconds", PDL_PROM_HISTOGRAM, "Durations.");
    const pdl_prom_label_t l[] = {{"route", "/v1/completions"}};
    pdl_prom_histogram(&w, "h_seconds", l, 1, bounds, cumulative, 3, 5, 12.5);
    pdl_prom_histogram(&w, "h_seconds", NULL, 0, bounds, cumulative, 0, 0, 0);
    char *text = pdl_prom_finish(&w, NULL);
    assert_non_null(text);
    assert_string_equal(text, "# HELP h_seconds Durations.\n# TYPE h_seconds histogram\n"
                              "h_seconds_bucket{route=\"/v1/completions\",le=\"0.001\"} 1\n"
                              "h_seconds_bucket{route=\"/v1/completions\",le=\"0.5\"} 3\n"
                              "h_seconds_bucket{route=\"/v1/completions\",le=\"4096\"} 3\n"
                              "h_seconds_bucket{route=\"/v1/completions\",le=\"+Inf\"} 5\n"
                              "h_seconds_sum{route=\"/v1/completions\"} 12.5\n"
                              "h_seconds_count{route=\"/v1/completions\"} 5\n"
                              "h_seconds_bucket{le=\"+Inf\"} 0\nh_seconds_sum 0\nh_seconds_count 0\n");
    free(text);
}

static void empty_document_is_not_an_error(void **state)
{
    (void)state;
    pdl_prom_t w;
    pdl_prom_init(&w);
    size_t len = 99;
    char *text = pdl_prom_finish(&w, &len);
    assert_non_null(text);
    assert_string_equal(text, "");
    assert_int_equal(len, 0);
    free(text);
    pdl_prom_init(&w);
    pdl_prom_family(&w, "a", PDL_PROM_GAUGE, "A.");
    pdl_prom_free(&w); /* abandoning a document frees everything (checked under ASan) */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(family_header_once),
        cmocka_unit_test(labels_and_help_are_escaped),
        cmocka_unit_test(floats_read_back_exactly),
        cmocka_unit_test(histogram_is_cumulative_with_le_last),
        cmocka_unit_test(empty_document_is_not_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
