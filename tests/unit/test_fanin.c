/*
 * test_fanin.c -- the producer-side release fan-in and lease state machine (src/connector/fanin.c),
 * exhaustively over TP pairs, plus every transition: duplicates, legacy, parked, late, reaped,
 * keepalive, failed status, invalid input, bounds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "connector/fanin.h"
#include "pdlink/topo.h"

#define SEC 1000000000ull

static pdl_fanin_t *mk(int P, uint64_t defer_ns, size_t max_parked, uint64_t park_age, size_t max_terminal)
{
    pdl_fanin_config_t c = {.producer_tp = P, .defer_timeout_ns = defer_ns, .max_parked = max_parked,
                            .max_park_age_ns = park_age, .max_terminal = max_terminal};
    pdl_fanin_t *f = NULL;
    assert_int_equal(pdl__fanin_create(&c, &f, NULL), PDL_OK);
    return f;
}

static pdl_fanin_result_t rel(pdl_fanin_t *f, const char *id, int64_t size, int64_t rank, bool failed, uint64_t now)
{
    pdl_fanin_release_t r = {.transfer_id = id, .consumer_tp_size = size, .consumer_tp_rank = rank, .failed = failed};
    return pdl__fanin_release(f, &r, now, NULL);
}

static void hold(pdl_fanin_t *f, const char *id, uint64_t now, bool expect_reported)
{
    bool rep = !expect_reported;
    assert_int_equal(pdl__fanin_hold(f, id, now, &rep, NULL), PDL_OK);
    assert_int_equal(rep, expect_reported);
}

/* Every producer rank of every (P, D) pair: the consumers of its group release it; it reports exactly
 * at expected(P, D), duplicates of each rank are not counted, a late one after the report is late. */
static void fanin_exhaustive_tp_pairs(void **state)
{
    (void)state;
    const int sizes[] = {1, 2, 3, 4, 6, 8, 16, 32};
    int pairs = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        for (size_t j = 0; j < sizeof(sizes) / sizeof(sizes[0]); j++) {
            int P = sizes[i], D = sizes[j];
            int expected;
            if (pdl_topo_expected_acks(P, D, &expected, NULL) != PDL_OK)
                continue;
            if (D < P && P % D != 0)
                continue;
            pairs++;
            for (int p = 0; p < P; p++) {
                pdl_fanin_t *f = mk(P, 60 * SEC, 0, 0, 0);
                hold(f, "tx", 0, false);
                int first, count;
                assert_int_equal(pdl_topo_consumers_of(P, D, p, &first, &count, NULL), PDL_OK);
                assert_int_equal(count, expected); /* SPEC §2: every producer rank is in max(1,D/P) groups */
                int reports = 0;
                for (int d = first; d < first + count; d++) {
                    pdl_fanin_result_t r = rel(f, "tx", D, d, false, 1);
                    if (r == PDL_FANIN_REPORTED)
                        reports++;
                    else
                        assert_int_equal(r, PDL_FANIN_COUNTED);
                    /* the same rank again: a duplicate, never a second count */
                    assert_int_equal(rel(f, "tx", D, d, false, 1), PDL_FANIN_DUPLICATE);
                }
                assert_int_equal(reports, 1);
                /* A rank that did not release this producer: late after the report. */
                if (count < D)
                    assert_int_equal(rel(f, "tx", D, (first + count) % D, false, 2), PDL_FANIN_LATE);
                else /* every consumer rank released it: any rank is a duplicate */
                    assert_int_equal(rel(f, "tx", D, D - 1, false, 2), PDL_FANIN_DUPLICATE);
                pdl_fanin_counters_t c;
                pdl__fanin_get_counters(f, &c);
                assert_int_equal(c.counted, (uint64_t)expected);
                assert_int_equal(c.duplicate, (uint64_t)expected + (count < D ? 0 : 1));
                assert_int_equal(c.reported, 1);
                assert_int_equal(pdl__fanin_held_count(f), 0);
                pdl__fanin_destroy(f);
            }
        }
    }
    assert_true(pairs >= 30);
}

/* Releases without consumer_tp_rank (upstream peers) all count, even from the same sender: upstream
 * keeps duplicate ACKs (reference §4.5). */
static void fanin_rankless_releases_each_count(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(4, 60 * SEC, 0, 0, 0);
    hold(f, "tx", 0, false);
    assert_int_equal(rel(f, "tx", 8, -1, false, 1), PDL_FANIN_COUNTED);
    assert_int_equal(pdl__fanin_count_of(f, "tx"), 1);
    assert_int_equal(rel(f, "tx", 8, -1, false, 1), PDL_FANIN_REPORTED);
    assert_int_equal(rel(f, "tx", 8, -1, false, 1), PDL_FANIN_LATE);
    pdl__fanin_destroy(f);
}

/* A legacy plain-string completion is one release with consumer_tp_size 1. */
static void fanin_legacy_string_is_one_release(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(4, 60 * SEC, 0, 0, 0);
    hold(f, "tx-plain", 0, false);
    assert_int_equal(rel(f, "tx-plain", 1, -1, false, 1), PDL_FANIN_REPORTED);
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, &c);
    assert_int_equal(c.reported, 1);
    assert_int_equal(c.received, 1);
    pdl__fanin_destroy(f);
}

/* Distinct ranks count each; a true duplicate (same rank before the report) counts once. */
static void fanin_duplicate_before_report(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(4, 60 * SEC, 0, 0, 0); /* P4/D16: expected 4 */
    hold(f, "tx", 0, false);
    assert_int_equal(rel(f, "tx", 16, 0, false, 1), PDL_FANIN_COUNTED);
    assert_int_equal(rel(f, "tx", 16, 0, false, 1), PDL_FANIN_DUPLICATE);
    assert_int_equal(rel(f, "tx", 16, 1, false, 1), PDL_FANIN_COUNTED);
    assert_int_equal(rel(f, "tx", 16, 2, false, 1), PDL_FANIN_COUNTED);
    assert_int_equal(pdl__fanin_count_of(f, "tx"), 3);
    assert_int_equal(rel(f, "tx", 16, 3, false, 1), PDL_FANIN_REPORTED);
    assert_int_equal(pdl__fanin_count_of(f, "tx"), -1);
    pdl__fanin_destroy(f);
}

/* A release before the hold is parked, counted at the hold; enough parked releases report at the hold. */
static void fanin_early_release_parked(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(4, 60 * SEC, 0, 0, 0);
    assert_int_equal(rel(f, "tx", 8, 0, false, 1), PDL_FANIN_PARKED);
    assert_int_equal(pdl__fanin_parked_count(f), 1);
    hold(f, "tx", 2, false);
    assert_int_equal(pdl__fanin_parked_count(f), 0);
    assert_int_equal(pdl__fanin_count_of(f, "tx"), 1);
    assert_int_equal(rel(f, "tx", 8, 1, false, 3), PDL_FANIN_REPORTED);

    /* both releases early: the hold itself reports */
    assert_int_equal(rel(f, "ty", 8, 2, false, 4), PDL_FANIN_PARKED);
    assert_int_equal(rel(f, "ty", 8, 3, false, 4), PDL_FANIN_PARKED);
    hold(f, "ty", 5, true);
    /* more parked than needed: the extra is late */
    assert_int_equal(rel(f, "tz", 4, -1, false, 6), PDL_FANIN_PARKED);
    assert_int_equal(rel(f, "tz", 4, -1, false, 6), PDL_FANIN_PARKED);
    hold(f, "tz", 7, true);
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, &c);
    assert_int_equal(c.parked, 5);
    assert_int_equal(c.late, 1);
    assert_int_equal(c.reported, 3);
    assert_int_equal(c.parked_dropped, 0);
    pdl__fanin_destroy(f);
}

/* Parked releases are bounded in count (oldest dropped) and in age (reaped). */
static void fanin_park_bounds(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(1, 60 * SEC, 8, 10 * SEC, 0);
    char id[32];
    for (int i = 0; i < 20; i++) {
        snprintf(id, sizeof(id), "unknown-%d", i);
        assert_int_equal(rel(f, id, 1, -1, false, (uint64_t)i * SEC), PDL_FANIN_PARKED);
    }
    assert_int_equal(pdl__fanin_parked_count(f), 8);
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, &c);
    assert_int_equal(c.parked, 20);
    assert_int_equal(c.parked_dropped, 12);
    /* the survivors are 12..19 (arrived at 12..19 s); at 25 s those older than 10 s go */
    pdl__fanin_reap(f, 25 * SEC, NULL, NULL);
    assert_int_equal(pdl__fanin_parked_count(f), 4);
    pdl__fanin_reap(f, 100 * SEC, NULL, NULL);
    assert_int_equal(pdl__fanin_parked_count(f), 0);
    pdl__fanin_get_counters(f, &c);
    assert_int_equal(c.parked_dropped, 20);
    /* an evicted early release does not count at the hold */
    hold(f, "unknown-0", 101 * SEC, false);
    assert_int_equal(pdl__fanin_count_of(f, "unknown-0"), 0);
    pdl__fanin_destroy(f);
}

typedef struct expired_log {
    char ids[8][32];
    int n;
} expired_log_t;

static void on_expired(void *arg, const char *id)
{
    expired_log_t *l = arg;
    if (l->n < 8)
        snprintf(l->ids[l->n], sizeof(l->ids[0]), "%s", id);
    l->n++;
}

/* A held transfer with too few releases is reaped at its deadline; keepalive extends it; a release
 * after expiry is late. */
static void fanin_reaper_and_keepalive(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(4, 10 * SEC, 0, 0, 0);
    hold(f, "a", 0, false);
    hold(f, "b", 0, false);
    assert_int_equal(rel(f, "a", 8, 0, false, 1), PDL_FANIN_COUNTED);
    assert_true(pdl__fanin_keepalive(f, "b", 5 * SEC)); /* b now due at 15 s */
    assert_false(pdl__fanin_keepalive(f, "nope", 5 * SEC));
    assert_int_equal(pdl__fanin_next_deadline(f), 10 * SEC);
    expired_log_t l = {0};
    assert_int_equal(pdl__fanin_reap(f, 9 * SEC, on_expired, &l), 0);
    assert_int_equal(pdl__fanin_reap(f, 10 * SEC, on_expired, &l), 1);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.ids[0], "a");
    assert_true(pdl__fanin_is_held(f, "b"));
    assert_int_equal(pdl__fanin_reap(f, 15 * SEC, on_expired, &l), 1);
    assert_string_equal(l.ids[1], "b");
    assert_int_equal(rel(f, "a", 8, 1, false, 16 * SEC), PDL_FANIN_LATE);
    assert_int_equal(rel(f, "a", 8, 0, false, 16 * SEC), PDL_FANIN_DUPLICATE); /* rank 0 was counted */
    assert_false(pdl__fanin_keepalive(f, "a", 16 * SEC)); /* no lease after expiry */
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, &c);
    assert_int_equal(c.expired, 2);
    assert_int_equal(c.keepalives, 1);
    assert_int_equal(c.late, 1);
    assert_int_equal(pdl__fanin_held_count(f), 0);
    pdl__fanin_destroy(f);
}

/* status "failed" counts toward the fan-in (free anyway) and is counted separately. */
static void fanin_failed_status_counts_and_frees(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(2, 60 * SEC, 0, 0, 0);
    hold(f, "tx", 0, false);
    assert_int_equal(rel(f, "tx", 4, 0, true, 1), PDL_FANIN_COUNTED);
    assert_int_equal(rel(f, "tx", 4, 1, false, 1), PDL_FANIN_REPORTED);
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, &c);
    assert_int_equal(c.failed_status, 1);
    assert_int_equal(c.reported, 1);
    pdl__fanin_destroy(f);
}

/* Invalid sizes and ranks are refused with a message, and never touch state. */
static void fanin_invalid_releases(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(4, 60 * SEC, 0, 0, 0);
    hold(f, "tx", 0, false);
    pdl_error_t e;
    pdl_fanin_release_t r = {.transfer_id = "tx", .consumer_tp_size = 6, .consumer_tp_rank = 0};
    assert_int_equal(pdl__fanin_release(f, &r, 1, &e), PDL_FANIN_INVALID);
    assert_non_null(strstr(e.msg, "multiple"));
    r.consumer_tp_size = 0;
    assert_int_equal(pdl__fanin_release(f, &r, 1, &e), PDL_FANIN_INVALID);
    assert_non_null(strstr(e.msg, "consumer_tp_size 0"));
    r.consumer_tp_size = -3;
    assert_int_equal(pdl__fanin_release(f, &r, 1, NULL), PDL_FANIN_INVALID);
    r.consumer_tp_size = 100000;
    assert_int_equal(pdl__fanin_release(f, &r, 1, NULL), PDL_FANIN_INVALID);
    r.consumer_tp_size = 8;
    r.consumer_tp_rank = 8;
    assert_int_equal(pdl__fanin_release(f, &r, 1, &e), PDL_FANIN_INVALID);
    assert_non_null(strstr(e.msg, "consumer_tp_rank 8"));
    r.consumer_tp_rank = -2;
    assert_int_equal(pdl__fanin_release(f, &r, 1, NULL), PDL_FANIN_INVALID);
    r.consumer_tp_rank = 0;
    r.transfer_id = "";
    assert_int_equal(pdl__fanin_release(f, &r, 1, NULL), PDL_FANIN_INVALID);
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, &c);
    assert_int_equal(c.invalid, 7);
    assert_int_equal(c.received, 0);
    assert_int_equal(pdl__fanin_count_of(f, "tx"), 0);
    assert_int_equal(pdl__fanin_parked_count(f), 0);
    pdl__fanin_destroy(f);
}

/* Holding an id twice fails; a finished id may be held again and counts afresh. */
static void fanin_hold_twice_and_reuse(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(1, 60 * SEC, 0, 0, 0);
    hold(f, "tx", 0, false);
    pdl_error_t e;
    assert_int_equal(pdl__fanin_hold(f, "tx", 0, NULL, &e), PDL_ERR_BAD_STATE);
    assert_non_null(strstr(e.msg, "already held"));
    assert_int_equal(rel(f, "tx", 1, 0, false, 1), PDL_FANIN_REPORTED);
    hold(f, "tx", 2, false);
    assert_int_equal(rel(f, "tx", 1, 0, false, 3), PDL_FANIN_REPORTED);
    assert_true(pdl__fanin_cancel(f, "tx") == false);
    hold(f, "tx2", 4, false);
    assert_true(pdl__fanin_cancel(f, "tx2"));
    assert_int_equal(pdl__fanin_held_count(f), 0);
    pdl__fanin_destroy(f);
}

/* The terminal set is bounded: the oldest ids are forgotten (a very old release is then parked). */
static void fanin_terminal_bounded(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(1, 60 * SEC, 0, 0, 16);
    char id[32];
    for (int i = 0; i < 40; i++) {
        snprintf(id, sizeof(id), "t%d", i);
        hold(f, id, 0, false);
        assert_int_equal(rel(f, id, 1, -1, false, 1), PDL_FANIN_REPORTED);
    }
    assert_int_equal(rel(f, "t39", 1, -1, false, 2), PDL_FANIN_LATE);
    assert_int_equal(rel(f, "t24", 1, -1, false, 2), PDL_FANIN_LATE);
    assert_int_equal(rel(f, "t0", 1, -1, false, 2), PDL_FANIN_PARKED);
    pdl__fanin_destroy(f);
}

/* Many transfers interleaved: each reports exactly once (hash map under load). */
static void fanin_many_transfers(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(2, 60 * SEC, 0, 0, 0);
    char id[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof(id), "tx-%d", i);
        hold(f, id, 0, false);
    }
    int reports = 0;
    for (int d = 0; d < 4; d += 2) /* producer rank 0 of P2/D4 is released by consumers 0 and 1 */
        for (int i = 0; i < 5000; i++) {
            snprintf(id, sizeof(id), "tx-%d", i);
            reports += rel(f, id, 4, d / 2, false, 1) == PDL_FANIN_REPORTED;
        }
    assert_int_equal(reports, 5000);
    assert_int_equal(pdl__fanin_held_count(f), 0);
    pdl__fanin_destroy(f);
}

static void fanin_create_rejects_bad_tp(void **state)
{
    (void)state;
    pdl_fanin_config_t c = {.producer_tp = 0, .defer_timeout_ns = SEC};
    pdl_fanin_t *f = NULL;
    pdl_error_t e;
    assert_int_equal(pdl__fanin_create(&c, &f, &e), PDL_ERR_INVALID);
    assert_null(f);
    assert_string_equal(pdl__fanin_result_name(PDL_FANIN_PARKED), "parked");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fanin_exhaustive_tp_pairs),
        cmocka_unit_test(fanin_rankless_releases_each_count),
        cmocka_unit_test(fanin_legacy_string_is_one_release),
        cmocka_unit_test(fanin_duplicate_before_report),
        cmocka_unit_test(fanin_early_release_parked),
        cmocka_unit_test(fanin_park_bounds),
        cmocka_unit_test(fanin_reaper_and_keepalive),
        cmocka_unit_test(fanin_failed_status_counts_and_frees),
        cmocka_unit_test(fanin_invalid_releases),
        cmocka_unit_test(fanin_hold_twice_and_reuse),
        cmocka_unit_test(fanin_terminal_bounded),
        cmocka_unit_test(fanin_many_transfers),
        cmocka_unit_test(fanin_create_rejects_bad_tp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
