/*
 * test_connector_prewarm.c -- sessions before the first request (issue 16), over loopback:
 *   - a decode told its producer (prewarm_peers) connects every rank pair in the background: the first
 *     pull handshakes nothing (transfer_handshakes 0), over shm (pre-faulted mapping) and tcp;
 *   - a producer that is not up yet is retried until it is, and start-up does not wait for it;
 *   - a producer learnt from a request gets its other rank pairs connected in the background, and no
 *     pair is handshaked twice;
 *   - after a producer restart the evicted peers are connected again, so later pulls handshake nothing.
 * Pass conditions are counters and the bytes read; deadlines only bound failures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "connector/internal.h"
#include "test_connector_util.h"
#include "common/clock.h"

#define TOTAL 64

/* The producer the next consumer prewarms ("" = none): tc_instance's tweak takes no argument. */
static char g_prewarm[64];

static void with_prewarm(pdl_instance_config_t *c)
{
    c->conn.peer_backoff_s = 0.05; /* a producer not up yet is retried quickly */
    c->conn.peer_backoff_max_s = 0.2;
    if (g_prewarm[0])
        assert_int_equal(pdl_connector_config_add_prewarm(&c->conn, g_prewarm, NULL), PDL_OK);
}

static bool prewarmed(void *arg) { return pdl_instance_prewarm_pending((pdl_instance_t *)arg) == 0; }

/* One pull of n fresh blocks from p into c, checked byte for byte. */
static void pull_once(pdl_instance_t *p, pdl_instance_t *c, int heads, const char *tid, uint32_t seed)
{
    uint32_t b[2], lb[2];
    pdl_error_t e;
    assert_int_equal(pdl_instance_alloc_blocks(p, 2, b, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, lb, NULL), PDL_OK);
    tc_fill(p, heads, false, b, 2, seed);
    assert_int_equal(pdl_instance_hold(p, tid, b, 2, NULL), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, tid, b, 2, &kp);
    pdl_pull_t *pull;
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, lb, 2, &pull, &e), PDL_OK);
    if (pdl_pull_wait(pull, 60000, &e) != PDL_OK)
        fail_msg("pull %s: %s", tid, e.msg);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, heads, false, lb, 2, seed, &checked), 0);
    assert_true(checked > 0);
    pdl_pull_free(pull);
    pdl_kv_params_clear(&kp);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    pdl_instance_free_blocks(c, lb, 2);
}

/* P (TP ptp) -> C (TP ctp) with prewarm_peers naming P: every pair connected before the first pull. */
static void prewarm_first_pull(pdl_backend_kind_t be, int ptp, int ctp)
{
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, ptp, &g, TOTAL, be, 60, NULL);
    assert_non_null(p);
    snprintf(g_prewarm, sizeof(g_prewarm), "127.0.0.1:%d:%d", pdl_instance_handshake_port(p, 0), ptp);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, ctp, &g, TOTAL, be, 60, with_prewarm);
    g_prewarm[0] = '\0';
    assert_non_null(c);
    assert_true(tc_wait_for(prewarmed, c, 20000));
    /* Every consumer rank reads max(P, C) / C producer ranks (P >= C) or one (P < C). */
    uint64_t pairs = (uint64_t)(ptp > ctp ? ptp : ctp);
    assert_int_equal(TC_SUM(c, prewarm_handshakes), pairs);
    pull_once(p, c, 8, "first", 11);
    pull_once(p, c, 8, "second", 12);
    assert_int_equal(TC_SUM(c, transfer_handshakes), 0);
    assert_int_equal(TC_SUM(c, handshakes), pairs);
    assert_int_equal(TC_SUM(c, read_failures), 0);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void prewarm_shm_p2c2(void **state)
{
    (void)state;
    prewarm_first_pull(PDL_BACKEND_SHM, 2, 2);
}

static void prewarm_tcp_p4c2(void **state)
{
    (void)state;
    prewarm_first_pull(PDL_BACKEND_TCP, 4, 2);
}

static void prewarm_shm_p2c4(void **state)
{
    (void)state;
    prewarm_first_pull(PDL_BACKEND_SHM, 2, 4);
}

/* The producer comes up after the consumer: the consumer started at once, kept retrying in the
 * background, and its first pull after the producer is up handshakes nothing. */
static void prewarm_producer_late(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_SHM, 60, NULL);
    assert_non_null(p);
    pdl_instance_config_t cfg = p->cfg;
    cfg.attn_backend_name = NULL; /* points into the instance destroyed next */
    snprintf(g_prewarm, sizeof(g_prewarm), "127.0.0.1:%d", pdl_instance_handshake_port(p, 0));
    pdl_instance_destroy(p);
    p = NULL;
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 2, &g, TOTAL, PDL_BACKEND_SHM, 60, with_prewarm);
    g_prewarm[0] = '\0';
    assert_non_null(c);
    tc_sleep_ms(300); /* a few refused attempts */
    assert_int_equal(pdl_instance_prewarm_pending(c), 2);
    assert_true(TC_SUM(c, handshake_failures) >= 2);
    pdl_error_t e;
    for (int i = 0; i < 200 && p == NULL; i++)
        if (pdl_instance_create(&cfg, &p, &e) != PDL_OK)
            tc_sleep_ms(10);
    assert_non_null(p);
    assert_true(tc_wait_for(prewarmed, c, 20000));
    assert_int_equal(TC_SUM(c, prewarm_handshakes), 2);
    pull_once(p, c, 8, "late", 21);
    assert_int_equal(TC_SUM(c, transfer_handshakes), 0);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* No prewarm_peers: the first pull handshakes its pairs itself (counted), and teaches the prewarm the
 * producer; a producer restart evicts the peers and the prewarm connects them again, so the pull after
 * that handshakes nothing. */
static void prewarm_learnt_and_restart(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, NULL);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, with_prewarm);
    assert_non_null(p);
    assert_non_null(c);
    assert_int_equal(pdl_instance_prewarm_pending(c), 0);
    pull_once(p, c, 8, "learn", 31);
    /* Rank 0 or 1 met the producer first and queued the other's pair: that one was connected by the
     * pull's own lane or by the prewarm (the lane then waited for it), never by both. */
    uint64_t own = TC_SUM(c, transfer_handshakes);
    assert_true(own >= 1 && own <= 2);
    assert_int_equal(own + TC_SUM(c, prewarm_handshakes), 2);
    assert_int_equal(TC_SUM(c, handshakes), 2);
    assert_true(tc_wait_for(prewarmed, c, 20000));
    pdl_instance_config_t cfg = p->cfg;
    cfg.attn_backend_name = NULL;
    pdl_instance_destroy(p);
    p = NULL;
    pdl_error_t e;
    for (int i = 0; i < 200 && p == NULL; i++)
        if (pdl_instance_create(&cfg, &p, &e) != PDL_OK)
            tc_sleep_ms(10);
    assert_non_null(p);
    /* This pull finds its cached sessions stale, retries once (with its own handshake or the prewarm's),
     * and its failure evicted the peers, which the prewarm connects again. */
    pull_once(p, c, 8, "stale", 32);
    assert_int_equal(TC_SUM(c, stale_retries), 2);
    assert_true(tc_wait_for(prewarmed, c, 20000));
    uint64_t before = TC_SUM(c, transfer_handshakes);
    pull_once(p, c, 8, "after", 33);
    assert_int_equal(TC_SUM(c, transfer_handshakes), before);
    assert_int_equal(TC_SUM(c, read_failures), 0);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(prewarm_shm_p2c2),        cmocka_unit_test(prewarm_tcp_p4c2),
        cmocka_unit_test(prewarm_shm_p2c4),        cmocka_unit_test(prewarm_producer_late),
        cmocka_unit_test(prewarm_learnt_and_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
