/*
 * test_connector_watch_identity.c -- a decode restarted on the same ports faster than the consumer-gone
 * watch's two refused probes: the prefill tells the new process from the dead one by its
 * handshake metadata (watch.c), frees the holds granted to the dead one within seconds, and keeps the
 * holds of the new one.
 *
 * The restart is in-process (destroy, then create on the same ports), so the decode's handshake port is
 * closed for milliseconds: the old watch, which only counted refused connects one second apart, kept
 * the dead decode's hold until defer_timeout (600 s here). Nothing below depends on timing to pass: each
 * step waits for the watch's own count of answered identity probes (watch_identities) or for the
 * outcome, within generous bounds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_connector_util.h"
#include "pdlink/wire.h"

#define NBLK 2
#define TOTAL 16

/* defer_timeout is 600 s (tc_instance's argument); the watch probes once a second. */
static pdl_instance_t *consumer_at(const tc_geo_t *g, int hs, int nt)
{
    pdl_instance_config_t c;
    tc_config(&c, PDL_ROLE_CONSUMER, 1, g, TOTAL, PDL_BACKEND_TCP, 60, hs, nt);
    pdl_instance_t *inst = NULL;
    pdl_error_t e;
    if (pdl_instance_create(&c, &inst, &e) != PDL_OK)
        fail_msg("consumer on ports %d/%d: %s", hs, nt, e.msg);
    return inst;
}

static void hold_for(pdl_instance_t *p, pdl_instance_t *c, const char *tid, int t, uint32_t *ids)
{
    pdl_error_t e;
    if (tc_hold_for(p, pdl_instance_zmq_address(c), tid, t, ids, NBLK, &e) != PDL_OK)
        fail_msg("hold %s: %s", tid, e.msg);
}

typedef struct at_least {
    pdl_instance_t *p;
    size_t off;
    uint64_t want;
} at_least_t;

static bool reached(void *arg)
{
    at_least_t *a = arg;
    return tc_get(a->p, 0, a->off) >= a->want;
}

/* Two more answered identity probes: the second started after every hold made before this call was
 * seen, so each of them is tied to the process that answered (watch.c). */
static void two_more_identities(pdl_instance_t *p)
{
    at_least_t a = {p, offsetof(pdl_rank_counters_t, watch_identities), TC_GET(p, 0, watch_identities) + 2};
    assert_true(tc_wait_for(reached, &a, 20000));
}

static void restarted_decode_frees_old_holds_keeps_new(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 60, tc_watch_slow, NULL));
    int hs = pdl_instance_handshake_port(c, 0), nt = pdl_instance_notify_port(c, 0);
    uint32_t old_ids[NBLK], new_ids[NBLK];
    hold_for(p, c, "tx-old", 1, old_ids);
    two_more_identities(p);
    assert_int_equal(pdl_instance_held_transfers(p), 1);
    assert_int_equal(TC_GET(p, 0, consumer_gone_freed), 0); /* a live decode's hold stays */

    /* The decode dies and a new process takes its ports at once; the prefill then holds for it. */
    uint64_t t0 = pdl__clock_now_ns();
    pdl_instance_destroy(c);
    c = consumer_at(&g, hs, nt);
    hold_for(p, c, "tx-new", 2, new_ids);
    at_least_t freed = {p, offsetof(pdl_rank_counters_t, consumer_gone_freed), 1};
    /* 10 s where the old watch needed defer_timeout (600 s): it saw the port answer again. */
    assert_true(tc_wait_for(reached, &freed, 10000));
    fprintf(stderr, "identity: the dead decode's hold freed %.2f s after its restart\n",
            (pdl__clock_now_ns() - t0) / 1e9);
    assert_int_equal(TC_SUM(p, expired), 0); /* not by the reaper */

    /* The new process's hold is kept, however often the watch looks. */
    two_more_identities(p);
    two_more_identities(p);
    assert_int_equal(TC_GET(p, 0, consumer_gone_freed), 1);
    assert_int_equal(pdl_instance_held_transfers(p), 1);
    assert_int_equal(pdl_instance_held_blocks(p), NBLK);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL - NBLK);

    /* And freed once that process dies too (two refused probes, as before). */
    pdl_instance_destroy(c);
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    assert_int_equal(TC_GET(p, 0, consumer_gone_freed), 2);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL);
    pdl_instance_destroy(p);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(restarted_decode_frees_old_holds_keeps_new),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
