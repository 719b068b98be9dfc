/*
 * test_cli_pairs.c -- the alternating-pairs summary of the benchmarks (bench/pairs.c): median of the
 * per-pair ratios, min-max, the quartile spread, and each verdict; invalid pairs are refused.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "bench/pairs.h"

static void add_all(pdl_pairs_t *p, const double *m, const double *c, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(pdl_pairs_add(p, m[i], c[i]), 0);
}

static void test_pairs_median_of_ratios(void **state)
{
    (void)state;
    pdl_pairs_t p;
    pdl_pairs_init(&p);
    /* Ratios 0.9, 0.8, 1.0, 0.85, 0.95 (not the ratio of the medians, which is 4/4.5). */
    const double m[] = {4.5, 4.0, 3.0, 8.5, 1.9}, c[] = {5.0, 5.0, 3.0, 10.0, 2.0};
    add_all(&p, m, c, 5);
    pdl_pairs_summary_t s;
    pdl_pairs_summarize(&p, PDL_PAIRS_SPREAD_MAX, PDL_PAIRS_ABOVE_TOL, &s);
    assert_int_equal(s.n, 5);
    assert_float_equal(s.ratio_median, 0.9, 1e-12);
    assert_float_equal(s.ratio_min, 0.8, 1e-12);
    assert_float_equal(s.ratio_max, 1.0, 1e-12);
    assert_float_equal(s.measured_median, 4.0, 1e-12);
    assert_float_equal(s.ceiling_median, 5.0, 1e-12);
    /* q1 = 0.85, q3 = 0.95 (2nd and 4th of 5). */
    assert_float_equal(s.spread, 0.1 / 0.9, 1e-12);
    assert_int_equal(s.verdict, PDL_PAIRS_OK);
    assert_string_equal(pdl_pairs_verdict_name(s.verdict), "ok");
}

static void test_pairs_even_count_and_one_outlier(void **state)
{
    (void)state;
    pdl_pairs_t p;
    pdl_pairs_init(&p);
    /* Six pairs, one wild outlier (a neighbour's burst during a ceiling loop): ratios 0.5 .. 7.7. */
    const double m[] = {1.0, 1.0, 1.0, 1.0, 1.0, 7.7}, c[] = {2.0, 1.25, 1.2, 1.1, 1.0, 1.0};
    add_all(&p, m, c, 6);
    pdl_pairs_summary_t s;
    pdl_pairs_summarize(&p, PDL_PAIRS_SPREAD_MAX, PDL_PAIRS_ABOVE_TOL, &s);
    /* sorted: 0.5, 0.8, 0.8333, 0.9091, 1.0, 7.7 -> median (0.8333 + 0.9091) / 2 */
    assert_float_equal(s.ratio_median, (1 / 1.2 + 1 / 1.1) / 2, 1e-12);
    assert_float_equal(s.ratio_max, 7.7, 1e-12);
    assert_float_equal(s.ratio_min, 0.5, 1e-12);
    /* q1 = 2nd (0.8), q3 = 5th (1.0): the outlier does not decide the spread. */
    assert_float_equal(s.spread, 0.2 / s.ratio_median, 1e-12);
    assert_int_equal(s.verdict, PDL_PAIRS_OK);
}

static void test_pairs_unstable(void **state)
{
    (void)state;
    pdl_pairs_t p;
    pdl_pairs_init(&p);
    const double m[] = {0.3, 0.6, 0.9, 1.0, 0.4}, c[] = {1, 1, 1, 1, 1};
    add_all(&p, m, c, 5);
    pdl_pairs_summary_t s;
    pdl_pairs_summarize(&p, PDL_PAIRS_SPREAD_MAX, PDL_PAIRS_ABOVE_TOL, &s);
    assert_float_equal(s.spread, (0.9 - 0.4) / 0.6, 1e-12);
    assert_int_equal(s.verdict, PDL_PAIRS_UNSTABLE);
    /* A looser limit accepts the same pairs. */
    pdl_pairs_summarize(&p, 1.0, PDL_PAIRS_ABOVE_TOL, &s);
    assert_int_equal(s.verdict, PDL_PAIRS_OK);
    assert_string_equal(pdl_pairs_verdict_name(PDL_PAIRS_UNSTABLE), "unstable");
}

static void test_pairs_above_ceiling(void **state)
{
    (void)state;
    pdl_pairs_t p;
    pdl_pairs_init(&p);
    const double m[] = {7.0, 7.5, 8.0, 7.2, 7.8}, c[] = {2.0, 2.1, 2.0, 2.0, 2.1};
    add_all(&p, m, c, 5);
    pdl_pairs_summary_t s;
    pdl_pairs_summarize(&p, PDL_PAIRS_SPREAD_MAX, PDL_PAIRS_ABOVE_TOL, &s);
    assert_true(s.ratio_median > 3);
    assert_int_equal(s.verdict, PDL_PAIRS_ABOVE_CEILING);
    assert_string_equal(pdl_pairs_verdict_name(s.verdict), "ABOVE CEILING");
    /* Within the tolerance is not flagged. */
    pdl_pairs_init(&p);
    for (int i = 0; i < 5; i++)
        assert_int_equal(pdl_pairs_add(&p, 1.04, 1.0), 0);
    pdl_pairs_summarize(&p, PDL_PAIRS_SPREAD_MAX, PDL_PAIRS_ABOVE_TOL, &s);
    assert_int_equal(s.verdict, PDL_PAIRS_OK);
}

static void test_pairs_too_few_and_invalid(void **state)
{
    (void)state;
    pdl_pairs_t p;
    pdl_pairs_init(&p);
    pdl_pairs_summary_t s;
    pdl_pairs_summarize(&p, PDL_PAIRS_SPREAD_MAX, PDL_PAIRS_ABOVE_TOL, &s);
    assert_int_equal(s.n, 0);
    assert_int_equal(s.verdict, PDL_PAIRS_TOO_FEW);
    assert_int_equal(pdl_pairs_add(&p, 1.0, 0.0), -1);  /* a failed ceiling */
    assert_int_equal(pdl_pairs_add(&p, 1.0, -1.0), -1);
    assert_int_equal(pdl_pairs_add(&p, -1.0, 1.0), -1);
    assert_int_equal(pdl_pairs_add(&p, NAN, 1.0), -1);
    assert_int_equal(pdl_pairs_add(&p, 1.0, INFINITY), -1);
    assert_int_equal(pdl_pairs_count(&p), 0);
    for (int i = 0; i < PDL_PAIRS_MIN - 1; i++)
        assert_int_equal(pdl_pairs_add(&p, 1.0, 2.0), 0);
    pdl_pairs_summarize(&p, PDL_PAIRS_SPREAD_MAX, PDL_PAIRS_ABOVE_TOL, &s);
    assert_int_equal(s.verdict, PDL_PAIRS_TOO_FEW);
    assert_float_equal(s.ratio_median, 0.5, 1e-12); /* filled anyway */
    while (pdl_pairs_count(&p) < PDL_PAIRS_MAX)
        assert_int_equal(pdl_pairs_add(&p, 1.0, 2.0), 0);
    assert_int_equal(pdl_pairs_add(&p, 1.0, 2.0), -1); /* full */
    pdl_pairs_summarize(&p, PDL_PAIRS_SPREAD_MAX, PDL_PAIRS_ABOVE_TOL, &s);
    assert_int_equal(s.n, PDL_PAIRS_MAX);
    assert_int_equal(s.verdict, PDL_PAIRS_OK);
    assert_float_equal(s.spread, 0.0, 1e-12);
}

static void test_median_and_quantile_of_samples(void **state)
{
    (void)state;
    double odd[] = {5, 1, 4, 2, 3};
    assert_float_equal(pdl_pairs_median(odd, 5), 3, 0);
    assert_float_equal(odd[0], 1, 0); /* sorted in place */
    double even[] = {40, 10, 30, 20};
    assert_float_equal(pdl_pairs_median(even, 4), 25, 0);
    double v[100];
    for (int i = 0; i < 100; i++)
        v[i] = 100 - i; /* 100 .. 1 */
    assert_float_equal(pdl_pairs_quantile(v, 100, 0.5), 50, 0);  /* the 50th smallest */
    assert_float_equal(pdl_pairs_quantile(v, 100, 0.99), 99, 0); /* the 99th, not the maximum */
    assert_float_equal(pdl_pairs_quantile(v, 100, 1.0), 100, 0);
    double one[] = {7};
    assert_float_equal(pdl_pairs_quantile(one, 1, 0.99), 7, 0);
    assert_float_equal(pdl_pairs_median(NULL, 0), 0, 0);
    assert_float_equal(pdl_pairs_quantile(NULL, 0, 0.5), 0, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pairs_median_of_ratios),
        cmocka_unit_test(test_pairs_even_count_and_one_outlier),
        cmocka_unit_test(test_pairs_unstable),
        cmocka_unit_test(test_pairs_above_ceiling),
        cmocka_unit_test(test_pairs_too_few_and_invalid),
        cmocka_unit_test(test_median_and_quantile_of_samples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
