/*
 * test_prewarm_policy.c -- the prewarm table's eviction rule (src/connector/prewarm_policy.c), with the
 * clock injected: configured and in-use instances are never dropped; a learnt one failing for the ttl
 * is, the longest failing first; a full table drops the longest failing, else the first learnt.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "connector/internal.h"

#define SEC 1000000000ull
#define TTL (60 * SEC)

static pdl_prewarm_cand_t learnt(uint64_t learnt_ns, uint64_t failed_ns)
{
    return (pdl_prewarm_cand_t){.learnt_ns = learnt_ns, .failed_ns = failed_ns};
}

static void nothing_to_drop(void **state)
{
    (void)state;
    assert_int_equal(pdl__prewarm_pick_victim(NULL, 0, 100 * SEC, TTL, true), -1);
    /* healthy, not failed: kept while there is room */
    pdl_prewarm_cand_t c[2] = {learnt(1 * SEC, 0), learnt(2 * SEC, 0)};
    assert_int_equal(pdl__prewarm_pick_victim(c, 2, 1000 * SEC, TTL, false), -1);
}

static void failed_expires_after_ttl(void **state)
{
    (void)state;
    pdl_prewarm_cand_t c[2] = {learnt(1 * SEC, 0), learnt(2 * SEC, 10 * SEC)};
    assert_int_equal(pdl__prewarm_pick_victim(c, 2, 10 * SEC + TTL - 1, TTL, false), -1);
    assert_int_equal(pdl__prewarm_pick_victim(c, 2, 10 * SEC + TTL, TTL, false), 1);
}

static void longest_failing_first(void **state)
{
    (void)state;
    pdl_prewarm_cand_t c[3] = {learnt(1 * SEC, 30 * SEC), learnt(2 * SEC, 20 * SEC), learnt(3 * SEC, 40 * SEC)};
    assert_int_equal(pdl__prewarm_pick_victim(c, 3, 200 * SEC, TTL, false), 1);
    assert_int_equal(pdl__prewarm_pick_victim(c, 3, 25 * SEC, TTL, true), 1);
}

static void configured_and_in_use_never(void **state)
{
    (void)state;
    pdl_prewarm_cand_t c[3] = {learnt(1 * SEC, 5 * SEC), learnt(2 * SEC, 6 * SEC), learnt(3 * SEC, 0)};
    c[0].configured = true;
    c[1].in_use = true;
    c[2].in_use = true;
    assert_int_equal(pdl__prewarm_pick_victim(c, 3, 1000 * SEC, TTL, false), -1);
    assert_int_equal(pdl__prewarm_pick_victim(c, 3, 1000 * SEC, TTL, true), -1);
    c[2].in_use = false;
    assert_int_equal(pdl__prewarm_pick_victim(c, 3, 1000 * SEC, TTL, false), -1);
    assert_int_equal(pdl__prewarm_pick_victim(c, 3, 1000 * SEC, TTL, true), 2);
}

/* Room needed: a failing one goes before a healthy one even when learnt later and failing briefly. */
static void room_prefers_failed_then_oldest(void **state)
{
    (void)state;
    pdl_prewarm_cand_t c[3] = {learnt(5 * SEC, 0), learnt(1 * SEC, 0), learnt(9 * SEC, 99 * SEC)};
    assert_int_equal(pdl__prewarm_pick_victim(c, 3, 100 * SEC, TTL, true), 2);
    c[2].failed_ns = 0;
    assert_int_equal(pdl__prewarm_pick_victim(c, 3, 100 * SEC, TTL, true), 1);
    assert_int_equal(pdl__prewarm_pick_victim(c, 3, 100 * SEC, TTL, false), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nothing_to_drop),
        cmocka_unit_test(failed_expires_after_ttl),
        cmocka_unit_test(longest_failing_first),
        cmocka_unit_test(configured_and_in_use_never),
        cmocka_unit_test(room_prefers_failed_then_oldest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
