/*
 * test_fanin.c -- the producer-side release fan-in and lease state machine (src/connector/fanin.c),
 * exhaustively over TP pairs, plus every transition: duplicates, legacy, parked, late, reaped,
 * keepalive, failed status, invalid input, bounds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "connector/fanin.h"
#include "pdlink/topo.h"

#define SEC 1000000000ull

static pdl_fanin_t *mkr(int P, int first_rank, int ranks, uint64_t defer_ns, size_t max_parked, uint64_t park_age,
                        size_t max_terminal)
{
    pdl_fanin_config_t c = {.producer_tp = P, .first_rank = first_rank, .ranks = ranks, .defer_timeout_ns = defer_ns,
                            .max_parked = max_parked, .max_park_age_ns = park_age, .max_terminal = max_terminal};
    pdl_fanin_t *f = NULL;
    assert_int_equal(pdl__fanin_create(&c, &f, NULL), PDL_OK);
    return f;
}

/* A table of one rank (rank 0): the state machine of one producer rank. */
static pdl_fanin_t *mk(int P, uint64_t defer_ns, size_t max_parked, uint64_t park_age, size_t max_terminal)
{
    return mkr(P, 0, 1, defer_ns, max_parked, park_age, max_terminal);
}

/* A release to producer rank `prank`. */
static pdl_fanin_result_t relr(pdl_fanin_t *f, int prank, const char *id, int64_t size, int64_t rank, bool failed,
                               uint64_t now)
{
    pdl_fanin_release_t r = {.transfer_id = id, .consumer_tp_size = size, .consumer_tp_rank = rank, .failed = failed};
    return pdl__fanin_release(f, prank, &r, now, NULL);
}

/* A release to the one rank of a one-rank table; a report is resolved at once, as the owner does. */
static pdl_fanin_result_t rel(pdl_fanin_t *f, const char *id, int64_t size, int64_t rank, bool failed, uint64_t now)
{
    pdl_fanin_result_t r = relr(f, 0, id, size, rank, failed, now);
    if (r == PDL_FANIN_REPORTED)
        assert_true(pdl__fanin_resolve(f, id, 0, NULL));
    return r;
}

/* Producer rank `prank` holds id (recorded already); its parked releases may report it. */
static void holdr(pdl_fanin_t *f, const char *id, int prank, uint64_t now, bool expect_reported)
{
    bool rep = !expect_reported;
    assert_int_equal(pdl__fanin_hold(f, id, prank, now, &rep, NULL), PDL_OK);
    assert_int_equal(rep, expect_reported);
}

/* Record id and hold it on rank 0 (one-rank table: a report at the hold is resolved at once). */
static void hold(pdl_fanin_t *f, const char *id, uint64_t now, bool expect_reported)
{
    assert_int_equal(pdl__fanin_add(f, id, NULL, NULL), PDL_OK);
    holdr(f, id, 0, now, expect_reported);
    if (expect_reported)
        assert_true(pdl__fanin_resolve(f, id, 0, NULL));
}

/* The owner resolves rank `prank` of id: is it the record's last (then its data comes back)? */
static bool resolve_last(pdl_fanin_t *f, const char *id, int prank, void *expect_data)
{
    pdl_fanin_outcome_t o = {.last = true, .data = &o};
    assert_true(pdl__fanin_resolve(f, id, prank, &o));
    assert_ptr_equal(o.data, o.last ? expect_data : NULL);
    return o.last;
}

/* Every producer rank of every (P, D) pair, all ranks in one table sharing the transfer's record: the
 * consumers of its group release it; it reports exactly at expected(P, D), duplicates of each rank are
 * not counted, a late one after the report is late; the record leaves with the last rank's report. */
static void fanin_exhaustive_tp_pairs(void **state)
{
    (void)state;
    const int sizes[] = {1, 2, 3, 4, 6, 8, 16, 32};
    int pairs = 0, marker = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        for (size_t j = 0; j < sizeof(sizes) / sizeof(sizes[0]); j++) {
            int P = sizes[i], D = sizes[j];
            int expected;
            if (pdl_topo_expected_acks(P, D, &expected, NULL) != PDL_OK)
                continue;
            if (D < P && P % D != 0)
                continue;
            pairs++;
            pdl_fanin_t *f = mkr(P, 0, P, 60 * SEC, 0, 0, 0);
            assert_int_equal(pdl__fanin_add(f, "tx", &marker, NULL), PDL_OK);
            for (int p = 0; p < P; p++)
                holdr(f, "tx", p, 0, false);
            for (int p = 0; p < P; p++) {
                int first, count;
                assert_int_equal(pdl_topo_consumers_of(P, D, p, &first, &count, NULL), PDL_OK);
                assert_int_equal(count, expected); /* docs/topology.md#groups: every producer rank is in max(1,D/P) groups */
                int reports = 0;
                for (int d = first; d < first + count; d++) {
                    pdl_fanin_result_t r = relr(f, p, "tx", D, d, false, 1);
                    if (r == PDL_FANIN_REPORTED)
                        reports++;
                    else
                        assert_int_equal(r, PDL_FANIN_COUNTED);
                    /* the same rank again: a duplicate, never a second count */
                    assert_int_equal(relr(f, p, "tx", D, d, false, 1), PDL_FANIN_DUPLICATE);
                }
                assert_int_equal(reports, 1);
                /* reported, not resolved yet: the record stays; resolving the last rank hands back its data */
                assert_int_equal(pdl__fanin_count(f), 1);
                assert_int_equal(resolve_last(f, "tx", p, &marker), p == P - 1);
                /* A rank that did not release this producer: late after the report. */
                if (count < D)
                    assert_int_equal(relr(f, p, "tx", D, (first + count) % D, false, 2), PDL_FANIN_LATE);
                else /* every consumer rank released it: any rank is a duplicate */
                    assert_int_equal(relr(f, p, "tx", D, D - 1, false, 2), PDL_FANIN_DUPLICATE);
                pdl_fanin_counters_t c;
                pdl__fanin_get_counters(f, p, &c);
                assert_int_equal(c.counted, (uint64_t)expected);
                assert_int_equal(c.duplicate, (uint64_t)expected + (count < D ? 0 : 1));
                assert_int_equal(c.reported, 1);
                /* the ranks after p still hold the one record */
                assert_int_equal(pdl__fanin_count(f), p < P - 1 ? 1 : 0);
            }
            pdl__fanin_destroy(f);
        }
    }
    assert_true(pairs >= 30);
}

/* Releases without consumer_tp_rank (upstream peers) all count, even from the same sender: upstream
 * keeps duplicate ACKs (docs/protocol.md#release). */
static void fanin_rankless_releases_each_count(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(4, 60 * SEC, 0, 0, 0);
    hold(f, "tx", 0, false);
    assert_int_equal(rel(f, "tx", 8, -1, false, 1), PDL_FANIN_COUNTED);
    assert_int_equal(pdl__fanin_count_of(f, "tx", 0), 1);
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
    pdl__fanin_get_counters(f, 0, &c);
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
    assert_int_equal(pdl__fanin_count_of(f, "tx", 0), 3);
    assert_int_equal(rel(f, "tx", 16, 3, false, 1), PDL_FANIN_REPORTED);
    assert_int_equal(pdl__fanin_count_of(f, "tx", 0), -1);
    pdl__fanin_destroy(f);
}

/* A release before the hold is parked, counted at the hold; enough parked releases report at the hold. */
static void fanin_early_release_parked(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(4, 60 * SEC, 0, 0, 0);
    assert_int_equal(rel(f, "tx", 8, 0, false, 1), PDL_FANIN_PARKED);
    assert_int_equal(pdl__fanin_parked_count(f, 0), 1);
    hold(f, "tx", 2, false);
    assert_int_equal(pdl__fanin_parked_count(f, 0), 0);
    assert_int_equal(pdl__fanin_count_of(f, "tx", 0), 1);
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
    pdl__fanin_get_counters(f, 0, &c);
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
    assert_int_equal(pdl__fanin_parked_count(f, 0), 8);
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, 0, &c);
    assert_int_equal(c.parked, 20);
    assert_int_equal(c.parked_dropped, 12);
    /* the survivors are 12..19 (arrived at 12..19 s); at 25 s those older than 10 s go */
    pdl__fanin_reap(f, 0, 25 * SEC, SIZE_MAX, NULL, NULL);
    assert_int_equal(pdl__fanin_parked_count(f, 0), 4);
    pdl__fanin_reap(f, 0, 100 * SEC, SIZE_MAX, NULL, NULL);
    assert_int_equal(pdl__fanin_parked_count(f, 0), 0);
    pdl__fanin_get_counters(f, 0, &c);
    assert_int_equal(c.parked_dropped, 20);
    /* an evicted early release does not count at the hold */
    hold(f, "unknown-0", 101 * SEC, false);
    assert_int_equal(pdl__fanin_count_of(f, "unknown-0", 0), 0);
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
    assert_true(pdl__fanin_keepalive(f, "b", 0, 5 * SEC)); /* b now due at 15 s */
    assert_false(pdl__fanin_keepalive(f, "nope", 0, 5 * SEC));
    assert_int_equal(pdl__fanin_next_deadline(f, 0), 10 * SEC);
    expired_log_t l = {0};
    assert_int_equal(pdl__fanin_reap(f, 0, 9 * SEC, SIZE_MAX, on_expired, &l), 0);
    assert_int_equal(pdl__fanin_reap(f, 0, 10 * SEC, SIZE_MAX, on_expired, &l), 1);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.ids[0], "a");
    assert_false(pdl__fanin_is_held(f, "a", 0));
    assert_true(pdl__fanin_resolve(f, "a", 0, NULL)); /* the owner, after reporting the expiry */
    assert_true(pdl__fanin_is_held(f, "b", 0));
    assert_int_equal(pdl__fanin_reap(f, 0, 15 * SEC, SIZE_MAX, on_expired, &l), 1);
    assert_string_equal(l.ids[1], "b");
    assert_true(pdl__fanin_resolve(f, "b", 0, NULL));
    assert_int_equal(rel(f, "a", 8, 1, false, 16 * SEC), PDL_FANIN_LATE);
    assert_int_equal(rel(f, "a", 8, 0, false, 16 * SEC), PDL_FANIN_DUPLICATE); /* rank 0 was counted */
    assert_false(pdl__fanin_keepalive(f, "a", 0, 16 * SEC)); /* no lease after expiry */
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, 0, &c);
    assert_int_equal(c.expired, 2);
    assert_int_equal(c.keepalives, 1);
    assert_int_equal(c.late, 1);
    assert_int_equal(pdl__fanin_count(f), 0);
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
    pdl__fanin_get_counters(f, 0, &c);
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
    assert_int_equal(pdl__fanin_release(f, 0, &r, 1, &e), PDL_FANIN_INVALID);
    assert_non_null(strstr(e.msg, "multiple"));
    r.consumer_tp_size = 0;
    assert_int_equal(pdl__fanin_release(f, 0, &r, 1, &e), PDL_FANIN_INVALID);
    assert_non_null(strstr(e.msg, "consumer_tp_size 0"));
    r.consumer_tp_size = -3;
    assert_int_equal(pdl__fanin_release(f, 0, &r, 1, NULL), PDL_FANIN_INVALID);
    r.consumer_tp_size = 100000;
    assert_int_equal(pdl__fanin_release(f, 0, &r, 1, NULL), PDL_FANIN_INVALID);
    r.consumer_tp_size = 8;
    r.consumer_tp_rank = 8;
    assert_int_equal(pdl__fanin_release(f, 0, &r, 1, &e), PDL_FANIN_INVALID);
    assert_non_null(strstr(e.msg, "consumer_tp_rank 8"));
    r.consumer_tp_rank = -2;
    assert_int_equal(pdl__fanin_release(f, 0, &r, 1, NULL), PDL_FANIN_INVALID);
    r.consumer_tp_rank = 0;
    r.transfer_id = "";
    assert_int_equal(pdl__fanin_release(f, 0, &r, 1, NULL), PDL_FANIN_INVALID);
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, 0, &c);
    assert_int_equal(c.invalid, 7);
    assert_int_equal(c.received, 0);
    assert_int_equal(pdl__fanin_count_of(f, "tx", 0), 0);
    assert_int_equal(pdl__fanin_parked_count(f, 0), 0);
    pdl__fanin_destroy(f);
}

/* Holding an id twice fails; a finished id may be held again and counts afresh. */
static void fanin_hold_twice_and_reuse(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(1, 60 * SEC, 0, 0, 0);
    hold(f, "tx", 0, false);
    pdl_error_t e;
    assert_int_equal(pdl__fanin_add(f, "tx", NULL, &e), PDL_ERR_BAD_STATE);
    assert_non_null(strstr(e.msg, "already held"));
    assert_int_equal(pdl__fanin_hold(f, "tx", 0, 0, NULL, &e), PDL_ERR_BAD_STATE);
    assert_non_null(strstr(e.msg, "already held"));
    assert_int_equal(rel(f, "tx", 1, 0, false, 1), PDL_FANIN_REPORTED);
    hold(f, "tx", 2, false);
    assert_int_equal(rel(f, "tx", 1, 0, false, 3), PDL_FANIN_REPORTED);
    assert_true(pdl__fanin_cancel(f, "tx", NULL) == false);
    hold(f, "tx2", 4, false);
    assert_true(pdl__fanin_cancel(f, "tx2", NULL));
    assert_int_equal(pdl__fanin_count(f), 0);
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
    assert_int_equal(pdl__fanin_count(f), 0);
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

/* ---- several ranks sharing one record ------------------------------------------------------------ */

/* Every counter of rank `prank` is as wanted (fields not named in `want` are 0). */
static void assert_counters(const pdl_fanin_t *f, int prank, pdl_fanin_counters_t want)
{
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, prank, &c);
    assert_memory_equal(&c, &want, sizeof(c));
}

/* P2/D4 (two releases per rank): each rank counts its own releases -- the same consumer rank released
 * to both producer ranks is counted on each -- and one rank's report resolves only that rank. */
static void fanin_ranks_count_separately(void **state)
{
    (void)state;
    int marker = 0;
    pdl_fanin_t *f = mkr(2, 0, 2, 60 * SEC, 0, 0, 0);
    assert_int_equal(pdl__fanin_add(f, "tx", &marker, NULL), PDL_OK);
    assert_ptr_equal(pdl__fanin_data(f, "tx"), &marker);
    holdr(f, "tx", 0, 0, false);
    holdr(f, "tx", 1, 0, false);
    assert_int_equal(relr(f, 0, "tx", 4, 0, false, 1), PDL_FANIN_COUNTED);
    assert_int_equal(pdl__fanin_count_of(f, "tx", 0), 1);
    assert_int_equal(pdl__fanin_count_of(f, "tx", 1), 0);
    /* consumer rank 0 again, to producer rank 1: not a duplicate there */
    assert_int_equal(relr(f, 1, "tx", 4, 0, false, 1), PDL_FANIN_COUNTED);
    assert_int_equal(relr(f, 0, "tx", 4, 1, false, 1), PDL_FANIN_REPORTED);
    assert_false(resolve_last(f, "tx", 0, &marker));
    assert_false(pdl__fanin_resolve(f, "tx", 0, NULL)); /* once */
    /* rank 0 is done, rank 1 still holds the one record */
    assert_int_equal(pdl__fanin_count(f), 1);
    assert_false(pdl__fanin_is_held(f, "tx", 0));
    assert_true(pdl__fanin_is_held(f, "tx", 1));
    assert_int_equal(pdl__fanin_count_of(f, "tx", 0), -1);
    assert_int_equal(pdl__fanin_count_of(f, "tx", 1), 1);
    assert_false(pdl__fanin_keepalive(f, "tx", 0, 2));
    assert_true(pdl__fanin_keepalive(f, "tx", 1, 2));
    assert_ptr_equal(pdl__fanin_data(f, "tx"), &marker);
    /* rank 0's late and duplicate releases while rank 1 still holds */
    assert_int_equal(relr(f, 0, "tx", 4, 1, false, 2), PDL_FANIN_DUPLICATE);
    assert_int_equal(relr(f, 0, "tx", 4, 3, false, 2), PDL_FANIN_LATE);
    /* rank 1's own second release reports it, and resolving it hands the record's data back */
    assert_int_equal(relr(f, 1, "tx", 4, 1, true, 3), PDL_FANIN_REPORTED);
    assert_int_equal(pdl__fanin_count(f), 1); /* reported is not resolved */
    assert_true(resolve_last(f, "tx", 1, &marker));
    assert_int_equal(pdl__fanin_count(f), 0);
    assert_null(pdl__fanin_data(f, "tx"));
    assert_counters(f, 0, (pdl_fanin_counters_t){.received = 4, .counted = 2, .duplicate = 1, .late = 1, .reported = 1});
    assert_counters(f, 1,
                    (pdl_fanin_counters_t){.received = 2, .counted = 2, .failed_status = 1, .reported = 1, .keepalives = 1});
    pdl__fanin_destroy(f);
}

/* Early releases park on the rank they were sent to: a hold applies only its own rank's; a rank that
 * has not held yet (OPEN) parks too; each rank's park has its own bound. */
static void fanin_parked_per_rank(void **state)
{
    (void)state;
    pdl_fanin_t *f = mkr(2, 0, 2, 60 * SEC, 4, 0, 0); /* P2/D2: one release per rank */
    assert_int_equal(relr(f, 1, "tx", 2, 1, false, 1), PDL_FANIN_PARKED);
    assert_int_equal(pdl__fanin_parked_count(f, 0), 0);
    assert_int_equal(pdl__fanin_parked_count(f, 1), 1);
    assert_int_equal(pdl__fanin_add(f, "tx", NULL, NULL), PDL_OK);
    /* recorded, but rank 0 does not hold yet: parked on rank 0 */
    assert_int_equal(relr(f, 0, "tx", 2, 0, false, 2), PDL_FANIN_PARKED);
    assert_int_equal(pdl__fanin_parked_count(f, 0), 1);
    /* a flood of unknown ids on rank 0 evicts rank 0's oldest, never rank 1's */
    char id[32];
    for (int i = 0; i < 10; i++) {
        snprintf(id, sizeof(id), "flood-%d", i);
        assert_int_equal(relr(f, 0, id, 2, 0, false, 3), PDL_FANIN_PARKED);
    }
    assert_int_equal(pdl__fanin_parked_count(f, 0), 4);
    assert_int_equal(pdl__fanin_parked_count(f, 1), 1);
    assert_counters(f, 0, (pdl_fanin_counters_t){.received = 11, .parked = 11, .parked_dropped = 7});
    assert_counters(f, 1, (pdl_fanin_counters_t){.received = 1, .parked = 1});
    /* rank 0's hold: its early release was evicted, nothing counts; rank 1's hold reports at once */
    holdr(f, "tx", 0, 4, false);
    assert_int_equal(pdl__fanin_count_of(f, "tx", 0), 0);
    holdr(f, "tx", 1, 4, true);
    assert_int_equal(pdl__fanin_parked_count(f, 1), 0);
    assert_int_equal(pdl__fanin_parked_count(f, 0), 4);
    assert_true(pdl__fanin_is_held(f, "tx", 0));
    /* age: each rank's park is reaped by that rank's reap only */
    assert_int_equal(relr(f, 1, "old", 2, 1, false, 5), PDL_FANIN_PARKED);
    pdl__fanin_reap(f, 0, 100 * SEC, SIZE_MAX, NULL, NULL);
    assert_int_equal(pdl__fanin_parked_count(f, 0), 0);
    assert_int_equal(pdl__fanin_parked_count(f, 1), 1);
    pdl__fanin_destroy(f);
}

/* Each rank's lease is its own: held at different times, extended by its own keepalives, reaped by its
 * own reap; the record stays until every rank is resolved. */
static void fanin_reap_per_rank(void **state)
{
    (void)state;
    int marker = 0;
    pdl_fanin_t *f = mkr(2, 0, 2, 10 * SEC, 0, 0, 0);
    assert_int_equal(pdl__fanin_add(f, "tx", &marker, NULL), PDL_OK);
    holdr(f, "tx", 0, 0, false);
    holdr(f, "tx", 1, 5 * SEC, false);
    assert_int_equal(pdl__fanin_next_deadline(f, 0), 10 * SEC);
    assert_int_equal(pdl__fanin_next_deadline(f, 1), 15 * SEC);
    assert_true(pdl__fanin_keepalive(f, "tx", 1, 8 * SEC)); /* rank 1 due at 18 s, rank 0 still at 10 s */
    expired_log_t l = {0};
    assert_int_equal(pdl__fanin_reap(f, 1, 10 * SEC, SIZE_MAX, on_expired, &l), 0);
    assert_int_equal(pdl__fanin_reap(f, 0, 10 * SEC, SIZE_MAX, on_expired, &l), 1);
    assert_int_equal(l.n, 1);
    assert_false(pdl__fanin_is_held(f, "tx", 0));
    assert_true(pdl__fanin_is_held(f, "tx", 1));
    assert_int_equal(pdl__fanin_next_deadline(f, 0), UINT64_MAX);
    assert_int_equal(pdl__fanin_reap(f, 0, 100 * SEC, SIZE_MAX, on_expired, &l), 0); /* expires once */
    assert_false(resolve_last(f, "tx", 0, &marker));
    /* rank 0 expired: its later release is late; rank 1 still counts its own */
    assert_int_equal(relr(f, 0, "tx", 2, 0, false, 11 * SEC), PDL_FANIN_LATE);
    assert_int_equal(relr(f, 1, "tx", 4, 2, false, 11 * SEC), PDL_FANIN_COUNTED);
    assert_int_equal(pdl__fanin_reap(f, 1, 17 * SEC, SIZE_MAX, on_expired, &l), 0);
    assert_int_equal(pdl__fanin_reap(f, 1, 18 * SEC, SIZE_MAX, on_expired, &l), 1);
    assert_int_equal(l.n, 2);
    assert_int_equal(pdl__fanin_count(f), 1);
    assert_true(resolve_last(f, "tx", 1, &marker));
    assert_int_equal(pdl__fanin_count(f), 0);
    /* remembered per rank: rank 1 counted consumer rank 2 (a duplicate), rank 0 nothing (late) */
    assert_int_equal(relr(f, 1, "tx", 4, 2, false, 19 * SEC), PDL_FANIN_DUPLICATE);
    assert_int_equal(relr(f, 1, "tx", 4, 3, false, 19 * SEC), PDL_FANIN_LATE);
    assert_int_equal(relr(f, 0, "tx", 4, 2, false, 19 * SEC), PDL_FANIN_LATE);
    assert_counters(f, 0, (pdl_fanin_counters_t){.received = 2, .late = 2, .expired = 1});
    assert_counters(f, 1,
                    (pdl_fanin_counters_t){.received = 3, .counted = 1, .duplicate = 1, .late = 1, .expired = 1, .keepalives = 1});
    pdl__fanin_destroy(f);
}

/* Reap expires at most `max` per call; the rest stay held for the next call. */
static void fanin_reap_bounded_batch(void **state)
{
    (void)state;
    pdl_fanin_t *f = mk(1, 10 * SEC, 0, 0, 0);
    char id[32];
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "tx-%d", i);
        hold(f, id, 0, false);
    }
    expired_log_t l = {0};
    assert_int_equal(pdl__fanin_reap(f, 0, 10 * SEC, 2, on_expired, &l), 2);
    int held = 0;
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "tx-%d", i);
        held += pdl__fanin_is_held(f, id, 0);
    }
    assert_int_equal(held, 3);
    assert_int_equal(pdl__fanin_reap(f, 0, 10 * SEC, 2, on_expired, &l), 2);
    assert_int_equal(pdl__fanin_reap(f, 0, 10 * SEC, 2, on_expired, &l), 1);
    assert_int_equal(pdl__fanin_reap(f, 0, 10 * SEC, 2, on_expired, &l), 0);
    assert_int_equal(l.n, 5);
    for (int i = 0; i < 5; i++)
        assert_true(pdl__fanin_resolve(f, l.ids[i], 0, NULL));
    assert_int_equal(pdl__fanin_count(f), 0);
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, 0, &c);
    assert_int_equal(c.expired, 5);
    pdl__fanin_destroy(f);
}

/* The owner resolves a rank whose fan-in did not finish (a WRITE push that ended, a consumer gone): that
 * rank forgets the id (its releases park), a rank that finished through the fan-in keeps classifying;
 * resolving twice is refused, and so is a hold after it. */
static void fanin_resolve_by_owner(void **state)
{
    (void)state;
    int marker = 0;
    pdl_fanin_t *f = mkr(2, 0, 2, 60 * SEC, 0, 0, 0);
    /* WRITE: never held by the fan-in */
    assert_int_equal(pdl__fanin_add(f, "push", &marker, NULL), PDL_OK);
    assert_false(resolve_last(f, "push", 0, &marker));
    assert_false(pdl__fanin_resolve(f, "push", 0, NULL));
    assert_int_equal(pdl__fanin_hold(f, "push", 0, 0, NULL, NULL), PDL_ERR_BAD_STATE);
    assert_int_equal(relr(f, 0, "push", 2, 0, false, 1), PDL_FANIN_PARKED);
    assert_true(resolve_last(f, "push", 1, &marker));
    assert_false(pdl__fanin_resolve(f, "push", 1, NULL));
    assert_int_equal(relr(f, 1, "push", 2, 1, false, 1), PDL_FANIN_PARKED); /* nothing remembered */
    /* READ: rank 0 reports, rank 1 is given up while it holds */
    assert_int_equal(pdl__fanin_add(f, "tx", &marker, NULL), PDL_OK);
    holdr(f, "tx", 0, 0, false);
    holdr(f, "tx", 1, 0, false);
    assert_int_equal(relr(f, 0, "tx", 2, 0, false, 1), PDL_FANIN_REPORTED);
    assert_false(resolve_last(f, "tx", 0, &marker));
    assert_int_equal(relr(f, 1, "tx", 4, 2, false, 1), PDL_FANIN_COUNTED);
    assert_true(resolve_last(f, "tx", 1, &marker));
    assert_false(pdl__fanin_keepalive(f, "tx", 1, 2));
    assert_int_equal(relr(f, 0, "tx", 2, 0, false, 2), PDL_FANIN_DUPLICATE);
    assert_int_equal(relr(f, 0, "tx", 2, 1, false, 2), PDL_FANIN_LATE);
    assert_int_equal(relr(f, 1, "tx", 4, 2, false, 2), PDL_FANIN_PARKED);
    assert_int_equal(pdl__fanin_count(f), 0);
    pdl__fanin_destroy(f);
}

/* Cancel takes the record out at once, whatever its ranks did, and hands its data back. */
static void fanin_cancel_returns_data(void **state)
{
    (void)state;
    int marker = 0;
    pdl_fanin_t *f = mkr(4, 0, 4, 60 * SEC, 0, 0, 0);
    assert_int_equal(pdl__fanin_add(f, "tx", &marker, NULL), PDL_OK);
    holdr(f, "tx", 2, 0, false);
    assert_int_equal(relr(f, 2, "tx", 4, 2, false, 1), PDL_FANIN_REPORTED);
    void *data = NULL;
    assert_true(pdl__fanin_cancel(f, "tx", &data));
    assert_ptr_equal(data, &marker);
    assert_false(pdl__fanin_cancel(f, "tx", &data));
    assert_null(data);
    assert_false(pdl__fanin_resolve(f, "tx", 2, NULL));
    assert_int_equal(pdl__fanin_count(f), 0);
    assert_int_equal(relr(f, 2, "tx", 4, 2, false, 2), PDL_FANIN_PARKED);
    pdl__fanin_destroy(f);
}

/* One process per rank (local_rank 3 of P4): the table counts rank 3 only; other ranks are refused. */
static void fanin_local_rank_table(void **state)
{
    (void)state;
    pdl_fanin_t *f = mkr(4, 3, 1, 60 * SEC, 0, 0, 0);
    assert_int_equal(pdl__fanin_add(f, "tx", &f, NULL), PDL_OK);
    pdl_error_t e;
    assert_int_equal(pdl__fanin_hold(f, "tx", 0, 0, NULL, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "rank 0"));
    holdr(f, "tx", 3, 0, false);
    assert_int_equal(relr(f, 0, "tx", 1, 0, false, 1), PDL_FANIN_INVALID);
    assert_false(pdl__fanin_resolve(f, "tx", 0, NULL));
    assert_int_equal(relr(f, 3, "tx", 1, 0, false, 1), PDL_FANIN_REPORTED);
    assert_true(resolve_last(f, "tx", 3, &f));
    pdl_fanin_counters_t c;
    pdl__fanin_get_counters(f, 0, &c);
    assert_int_equal(c.invalid, 0); /* zeros for a rank not counted here */
    pdl__fanin_get_counters(f, 3, &c);
    assert_int_equal(c.reported, 1);
    pdl__fanin_destroy(f);
    pdl_fanin_config_t bad = {.producer_tp = 4, .first_rank = 2, .ranks = 3, .defer_timeout_ns = SEC};
    assert_int_equal(pdl__fanin_create(&bad, &f, &e), PDL_ERR_INVALID);
    bad.first_rank = -1;
    bad.ranks = 1;
    assert_int_equal(pdl__fanin_create(&bad, &f, &e), PDL_ERR_INVALID);
    bad.first_rank = 0;
    bad.ranks = 0;
    assert_int_equal(pdl__fanin_create(&bad, &f, &e), PDL_ERR_INVALID);
}

/* Memory bounds with several ranks: the table remembers max_terminal finished ids in all (each with
 * every rank's state), and the oldest are forgotten on every rank at once. */
static void fanin_terminal_bounded_ranks(void **state)
{
    (void)state;
    pdl_fanin_t *f = mkr(4, 0, 4, 60 * SEC, 0, 0, 16);
    char id[32];
    for (int i = 0; i < 40; i++) {
        snprintf(id, sizeof(id), "t%d", i);
        assert_int_equal(pdl__fanin_add(f, id, NULL, NULL), PDL_OK);
        for (int p = 0; p < 4; p++) {
            holdr(f, id, p, 0, false);
            assert_int_equal(relr(f, p, id, 4, p, false, 1), PDL_FANIN_REPORTED);
            assert_true(pdl__fanin_resolve(f, id, p, NULL));
        }
    }
    assert_int_equal(pdl__fanin_count(f), 0);
    for (int p = 0; p < 4; p++) {
        assert_int_equal(relr(f, p, "t39", 4, p, false, 2), PDL_FANIN_DUPLICATE);
        assert_int_equal(relr(f, p, "t24", 4, (p + 1) % 4, false, 2), PDL_FANIN_LATE);
        assert_int_equal(relr(f, p, "t0", 4, p, false, 2), PDL_FANIN_PARKED);
    }
    pdl__fanin_destroy(f);
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
        cmocka_unit_test(fanin_ranks_count_separately),
        cmocka_unit_test(fanin_parked_per_rank),
        cmocka_unit_test(fanin_reap_per_rank),
        cmocka_unit_test(fanin_reap_bounded_batch),
        cmocka_unit_test(fanin_resolve_by_owner),
        cmocka_unit_test(fanin_cancel_returns_data),
        cmocka_unit_test(fanin_local_rank_table),
        cmocka_unit_test(fanin_terminal_bounded_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
