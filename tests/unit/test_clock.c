/*
 * test_clock.c -- the monotonic clock's helpers (src/common/clock.h): pdl__clock_since saturates when
 * the earlier-looking timestamp is the later one (the WRITE reaper once read the clock, waited for the
 * push lock while a push was created, and reaped that brand-new push at once because now - created
 * wrapped), deadlines, and the rate limiter's window on that clock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/log.h"

static void since_is_elapsed_time_or_zero(void **state)
{
    (void)state;
    assert_int_equal(pdl__clock_since(7, 5), 2);
    assert_int_equal(pdl__clock_since(5, 5), 0);
    assert_int_equal(pdl__clock_since(5, 7), 0); /* then is later: not UINT64_MAX - 1 */
    assert_int_equal(pdl__clock_since(UINT64_MAX, 0), UINT64_MAX);
    uint64_t defer = 60ull * 1000000000ull;
    uint64_t now = pdl__clock_now_ns();
    /* a stamp taken after now never looks older than the defer timeout */
    assert_true(pdl__clock_since(now, now + 1000) < defer);
}

static void clock_is_monotonic_and_deadlines_are_ahead(void **state)
{
    (void)state;
    uint64_t a = pdl__clock_now_ns(), b = pdl__clock_now_ns();
    assert_true(b >= a);
    uint64_t d = pdl__clock_deadline_ms(50);
    assert_true(d >= b + 50ull * 1000000ull);
    assert_int_equal(pdl__clock_deadline_ms(-1), PDL_CLOCK_NEVER);
}

static void ratelimit_burst_then_suppresses(void **state)
{
    (void)state;
    pdl_ratelimit_t rl;
    pdl_ratelimit_init(&rl, 3600 * 1000, 3);
    uint64_t sup = 99;
    for (int i = 0; i < 3; i++)
        assert_true(pdl_ratelimit_allow(&rl, &sup));
    assert_false(pdl_ratelimit_allow(&rl, &sup));
    assert_false(pdl_ratelimit_allow(&rl, &sup));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(since_is_elapsed_time_or_zero),
        cmocka_unit_test(clock_is_monotonic_and_deadlines_are_ahead),
        cmocka_unit_test(ratelimit_burst_then_suppresses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
