/*
 * test_peerhealth.c -- the failed-peer memory and its backoff (src/connector/peerhealth.c) with an
 * injected clock: every transition of the state diagram in peerhealth.h, the doubling and its cap
 * over a long run of failures, the reason text, independence of keys, the entry bound, and the early
 * readmission of a refused peer that listens again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "connector/peerhealth.h"

#define SEC 1000000000ull
#define MS 1000000ull

static void healthy_admits_and_ok_is_idempotent(void **state)
{
    (void)state;
    pdl_peerhealth_t h;
    pdl__health_init(&h, 2 * SEC, 30 * SEC, 16);
    for (uint64_t t = 0; t < 10; t++)
        assert_true(pdl__health_admit(&h, "p|0|0", t * SEC, NULL, NULL, 0));
    pdl__health_ok(&h, "p|0|0");
    assert_int_equal(pdl__health_state(&h, "p|0|0", NULL, NULL), PDL_HEALTH_HEALTHY);
    assert_int_equal(pdl__health_count(&h), 0);
    pdl__health_fini(&h);
}

/* One failure: refused with the reason until retry_at, then exactly one probe is let through. */
static void failure_backs_off_then_one_probe(void **state)
{
    (void)state;
    pdl_peerhealth_t h;
    pdl__health_init(&h, 2 * SEC, 30 * SEC, 16);
    uint64_t t0 = 100 * SEC;
    pdl__health_failed(&h, "k", t0, PDL_ERR_TIMEOUT, "handshake with 127.0.0.1:5001 (producer tp rank 2): no reply");
    int fails;
    uint64_t at;
    assert_int_equal(pdl__health_state(&h, "k", &fails, &at), PDL_HEALTH_BACKOFF);
    assert_int_equal(fails, 1);
    assert_int_equal(at, t0 + 2 * SEC);
    char why[256];
    pdl_status_t st = PDL_OK;
    assert_false(pdl__health_admit(&h, "k", t0 + 900 * MS, &st, why, sizeof(why)));
    assert_int_equal(st, PDL_ERR_TIMEOUT);
    assert_string_equal(why, "handshake with 127.0.0.1:5001 (producer tp rank 2): no reply, 0.9 s ago; retry in 1.1 s");
    assert_false(pdl__health_admit(&h, "k", t0 + 2 * SEC - 1, NULL, NULL, 0));
    /* At retry_at: one caller probes, the next is refused while the probe runs. */
    assert_true(pdl__health_admit(&h, "k", t0 + 2 * SEC, NULL, NULL, 0));
    assert_int_equal(pdl__health_state(&h, "k", NULL, NULL), PDL_HEALTH_PROBING);
    assert_false(pdl__health_admit(&h, "k", t0 + 3 * SEC, &st, why, sizeof(why)));
    assert_non_null(strstr(why, "a retry is under way"));
    /* The probe succeeds: healthy again, no memory left. */
    pdl__health_ok(&h, "k");
    assert_true(pdl__health_admit(&h, "k", t0 + 3 * SEC, NULL, NULL, 0));
    assert_int_equal(pdl__health_count(&h), 0);
    pdl__health_fini(&h);
}

/* Consecutive failures double the backoff up to the cap; success resets the doubling. */
static void backoff_doubles_to_cap_and_resets(void **state)
{
    (void)state;
    pdl_peerhealth_t h;
    pdl__health_init(&h, 1 * SEC, 30 * SEC, 16);
    uint64_t now = 0;
    uint64_t expect[] = {1, 2, 4, 8, 16, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30,
                         30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30,
                         30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30,
                         30, 30, 30, 30, 30, 30, 30, 30, 30, 30}; /* 70 failures: no overflow of the doubling */
    for (size_t i = 0; i < sizeof(expect) / sizeof(expect[0]); i++) {
        pdl__health_failed(&h, "k", now, PDL_ERR_PEER_GONE, "refused");
        uint64_t at;
        int fails;
        assert_int_equal(pdl__health_state(&h, "k", &fails, &at), PDL_HEALTH_BACKOFF);
        assert_int_equal(fails, (int)i + 1);
        assert_int_equal(at - now, expect[i] * SEC);
        assert_false(pdl__health_admit(&h, "k", at - 1, NULL, NULL, 0));
        now = at;
        assert_true(pdl__health_admit(&h, "k", now, NULL, NULL, 0));
    }
    pdl__health_ok(&h, "k");
    pdl__health_failed(&h, "k", now, PDL_ERR_PEER_GONE, "refused");
    uint64_t at;
    pdl__health_state(&h, "k", NULL, &at);
    assert_int_equal(at - now, 1 * SEC);
    pdl__health_fini(&h);
}

/* Keys are independent: one dead rank does not refuse its sibling or another instance. */
static void keys_are_independent(void **state)
{
    (void)state;
    pdl_peerhealth_t h;
    pdl__health_init(&h, 2 * SEC, 30 * SEC, 16);
    pdl__health_failed(&h, "a|0|0", 0, PDL_ERR_TIMEOUT, "no reply");
    assert_false(pdl__health_admit(&h, "a|0|0", 1 * SEC, NULL, NULL, 0));
    assert_true(pdl__health_admit(&h, "a|0|1", 1 * SEC, NULL, NULL, 0));
    assert_true(pdl__health_admit(&h, "b|0|0", 1 * SEC, NULL, NULL, 0));
    assert_int_equal(pdl__health_count(&h), 1);
    pdl__health_fini(&h);
}

/* Bounded: failures beyond max_entries are not remembered (those peers are just tried again). */
static void entries_are_bounded(void **state)
{
    (void)state;
    pdl_peerhealth_t h;
    pdl__health_init(&h, 2 * SEC, 30 * SEC, 4);
    char key[32];
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "peer%d", i);
        pdl__health_failed(&h, key, 0, PDL_ERR_TIMEOUT, "no reply");
    }
    assert_int_equal(pdl__health_count(&h), 4);
    assert_false(pdl__health_admit(&h, "peer3", 1, NULL, NULL, 0));
    assert_true(pdl__health_admit(&h, "peer4", 1, NULL, NULL, 0));
    /* A remembered key still counts its failures when the map is full. */
    pdl__health_failed(&h, "peer0", 10, PDL_ERR_TIMEOUT, "again");
    int fails;
    pdl__health_state(&h, "peer0", &fails, NULL);
    assert_int_equal(fails, 2);
    pdl__health_fini(&h);
}

/* A long reason is cut, never overflowed; the reason of the latest failure is the one reported. */
static void reason_truncated_and_latest(void **state)
{
    (void)state;
    pdl_peerhealth_t h;
    pdl__health_init(&h, 2 * SEC, 30 * SEC, 4);
    char big[1000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    pdl__health_failed(&h, "k", 0, PDL_ERR_TIMEOUT, big);
    char why[64];
    assert_false(pdl__health_admit(&h, "k", 1, NULL, why, sizeof(why)));
    assert_int_equal(strlen(why), sizeof(why) - 1);
    assert_true(pdl__health_admit(&h, "k", 2 * SEC, NULL, NULL, 0));
    pdl__health_failed(&h, "k", 2 * SEC, PDL_ERR_PEER_GONE, "connection refused");
    char why2[256];
    pdl_status_t st;
    assert_false(pdl__health_admit(&h, "k", 3 * SEC, &st, why2, sizeof(why2)));
    assert_int_equal(st, PDL_ERR_PEER_GONE);
    assert_string_equal(why2, "connection refused, 1.0 s ago; retry in 3.0 s");
    pdl__health_fini(&h);
}

/* A refused peer is rechecked at most once per interval; when it listens again it is let through at
 * once (PROBING), and its failure then doubles the backoff as after an admit. A timed-out peer is never
 * rechecked (a connect to it could cost the timeout again). */
static void refused_peer_rechecked_and_readmitted(void **state)
{
    (void)state;
    pdl_peerhealth_t h;
    pdl__health_init(&h, 2 * SEC, 30 * SEC, 16);
    uint64_t t0 = 50 * SEC;
    pdl__health_failed(&h, "gone", t0, PDL_ERR_PEER_GONE, "connect: Connection refused");
    pdl__health_failed(&h, "slow", t0, PDL_ERR_TIMEOUT, "no reply");
    assert_false(pdl__health_recheck_due(&h, "slow", t0 + SEC, 100 * MS));
    assert_false(pdl__health_recheck_due(&h, "healthy", t0 + SEC, 100 * MS));
    assert_true(pdl__health_recheck_due(&h, "gone", t0 + 1 * MS, 100 * MS)); /* the first one at once */
    assert_false(pdl__health_recheck_due(&h, "gone", t0 + 50 * MS, 100 * MS)); /* rechecked 49 ms ago */
    assert_true(pdl__health_recheck_due(&h, "gone", t0 + 101 * MS, 100 * MS));
    assert_false(pdl__health_recheck_due(&h, "gone", t0 + 150 * MS, 100 * MS));
    assert_false(pdl__health_admit(&h, "gone", t0 + 150 * MS, NULL, NULL, 0));
    assert_true(pdl__health_recheck_due(&h, "gone", t0 + 201 * MS, 100 * MS));
    pdl__health_readmit(&h, "gone");
    assert_int_equal(pdl__health_state(&h, "gone", NULL, NULL), PDL_HEALTH_PROBING);
    assert_false(pdl__health_recheck_due(&h, "gone", t0 + SEC, 100 * MS)); /* one try at a time */
    pdl__health_failed(&h, "gone", t0 + 300 * MS, PDL_ERR_PEER_GONE, "connect: Connection refused");
    int fails;
    uint64_t at;
    assert_int_equal(pdl__health_state(&h, "gone", &fails, &at), PDL_HEALTH_BACKOFF);
    assert_int_equal(fails, 2);
    assert_int_equal(at, t0 + 300 * MS + 4 * SEC);
    assert_true(pdl__health_recheck_due(&h, "gone", t0 + 301 * MS, 100 * MS)); /* a new failure: at once */
    pdl__health_readmit(&h, "slow"); /* only after the caller saw it listen; BACKOFF -> PROBING */
    assert_int_equal(pdl__health_state(&h, "slow", NULL, NULL), PDL_HEALTH_PROBING);
    pdl__health_ok(&h, "slow");
    pdl__health_readmit(&h, "slow"); /* healthy: no-op */
    assert_int_equal(pdl__health_state(&h, "slow", NULL, NULL), PDL_HEALTH_HEALTHY);
    pdl__health_fini(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(healthy_admits_and_ok_is_idempotent),
        cmocka_unit_test(failure_backs_off_then_one_probe),
        cmocka_unit_test(backoff_doubles_to_cap_and_resets),
        cmocka_unit_test(keys_are_independent),
        cmocka_unit_test(entries_are_bounded),
        cmocka_unit_test(reason_truncated_and_latest),
        cmocka_unit_test(refused_peer_rechecked_and_readmitted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
