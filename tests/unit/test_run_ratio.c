/*
 * test_run_ratio.c -- pdlink run's ratios to a ceiling from alternating pairs (run_report.c): the median
 * of the per-pair ratios with min-max, pairs without a figure left out, the spread and above-1 flags,
 * and the text cell that says "wide" instead of a number.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "cli/run_report.h"

static void ratio_median_of_pairs(void **state)
{
    (void)state;
    /* One noisy pair (the ceiling measured while another job ran) moves the max, not the median, and
     * not the spread: (q3 - q1) / median ignores one outlier on each side (bench/pairs.h). */
    const double meas[] = {1.0, 1.1, 0.9, 1.0, 1.05, 1.0};
    const double ceil[] = {2.0, 2.0, 2.0, 2.0, 1.0, 2.0};
    pdl_run_ratio_t r;
    pdl_run_ratio_pairs(meas, ceil, 6, &r);
    assert_int_equal(r.pairs, 6);
    assert_true(r.median > 0.499 && r.median < 0.501); /* 0.45 0.5 0.5 0.5 0.55 1.05 -> (0.5 + 0.5) / 2 */
    assert_true(r.min > 0.449 && r.min < 0.451);
    assert_true(r.max > 1.049 && r.max < 1.051);
    assert_false(r.wide);
    assert_false(r.above);
    assert_true(r.ceiling_median > 1.99 && r.ceiling_median < 2.01);
    char cell[64];
    pdl_run_ratio_cell(&r, cell, sizeof(cell));
    assert_string_equal(cell, "50% 45-105");
    /* Pairs all over the place: no figure. */
    const double wild[] = {0.2, 0.9, 0.4, 1.0, 0.3, 0.8};
    const double one[] = {1, 1, 1, 1, 1, 1};
    pdl_run_ratio_pairs(wild, one, 6, &r);
    assert_true(r.wide);
    pdl_run_ratio_cell(&r, cell, sizeof(cell));
    assert_string_equal(cell, "wide 20-100%");
}

static void ratio_odd_count_and_skips(void **state)
{
    (void)state;
    /* A round that moved nothing (-1) and a failed ceiling (0) are no pairs. */
    const double meas[] = {0.6, -1, 0.5, 0.7, 0.55, 0.65, 0.6};
    const double ceil[] = {1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0};
    pdl_run_ratio_t r;
    pdl_run_ratio_pairs(meas, ceil, 7, &r);
    assert_int_equal(r.pairs, 5);
    assert_true(r.median > 0.599 && r.median < 0.601);
    assert_false(r.wide);
    char cell[64];
    pdl_run_ratio_cell(&r, cell, sizeof(cell));
    assert_string_equal(cell, "60% 50-65");
}

static void ratio_above_and_too_few(void **state)
{
    (void)state;
    const double meas[] = {2.5, 2.4, 2.6, 2.5, 2.5};
    const double ceil[] = {2.0, 2.0, 2.0, 2.0, 2.0};
    pdl_run_ratio_t r;
    char cell[64];
    pdl_run_ratio_pairs(meas, ceil, 5, &r);
    assert_true(r.above);
    pdl_run_ratio_cell(&r, cell, sizeof(cell));
    assert_string_equal(cell, "125% 120-130!");
    pdl_run_ratio_pairs(meas, ceil, 3, &r);
    assert_int_equal(r.pairs, 3);
    pdl_run_ratio_cell(&r, cell, sizeof(cell));
    assert_string_equal(cell, "n=3<5 125%");
    pdl_run_ratio_pairs(meas, ceil, 0, &r);
    assert_int_equal(r.pairs, 0);
    assert_true(r.median < 0);
    pdl_run_ratio_cell(&r, cell, sizeof(cell));
    assert_string_equal(cell, "-");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ratio_median_of_pairs),
        cmocka_unit_test(ratio_odd_count_and_skips),
        cmocka_unit_test(ratio_above_and_too_few),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
