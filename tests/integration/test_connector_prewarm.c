/*
 * test_connector_prewarm.c -- sessions before the first request, over loopback:
 *   - a decode told its producer (prewarm_peers) connects every rank pair in the background: the first
 *     pull handshakes nothing (transfer_handshakes 0), over shm (pre-faulted mapping) and tcp;
 *   - a producer that is not up yet is retried until it is, and start-up does not wait for it;
 *   - a producer learnt from a request gets its other rank pairs connected in the background, and no
 *     pair is handshaked twice;
 *   - after a producer restart the evicted peers are connected again, so later pulls handshake nothing;
 *   - WRITE mode: a prefill told its decode connects every pair it writes to, so its first push
 *     handshakes nothing; one learnt from the first push gets its other pairs connected in the background;
 *   - a table filled with fake producers (failed, learnt) still makes room for a real new producer,
 *     whose pairs are then prewarmed, and the fakes dropped are counted.
 * Pass conditions are counters and the bytes moved; deadlines only bound failures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "connector/internal.h"
#include "test_connector_util.h"
#include "test_connector_check.h"
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

static void with_prewarm_write(pdl_instance_config_t *c)
{
    with_prewarm(c);
    c->conn.read_mode = false;
    c->allow_write_mode = true;
}

static void write_mode(pdl_instance_config_t *c)
{
    c->conn.read_mode = false;
    c->allow_write_mode = true;
}

static bool prewarmed(void *arg) { return pdl_instance_prewarm_pending((pdl_instance_t *)arg) == 0; }

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
    tc_pull_once(p, c, 8, "first", 11);
    tc_pull_once(p, c, 8, "second", 12);
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
    tc_pull_once(p, c, 8, "late", 21);
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
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, 60, NULL, with_prewarm));
    assert_int_equal(pdl_instance_prewarm_pending(c), 0);
    tc_pull_once(p, c, 8, "learn", 31);
    /* Rank 0 or 1 met the producer first and queued the other's pair: that one was connected by the
     * pull's own lane or by the prewarm (the lane then waited for it), never by both. */
    uint64_t own = TC_SUM(c, transfer_handshakes);
    assert_true(own >= 1 && own <= 2);
    assert_int_equal(own + TC_SUM(c, prewarm_handshakes), 2);
    assert_int_equal(TC_SUM(c, handshakes), 2);
    assert_true(tc_wait_for(prewarmed, c, 20000));
    p = tc_restart(p);
    /* This pull finds its cached sessions stale, retries once (with its own handshake or the prewarm's),
     * and its failure evicted the peers, which the prewarm connects again. */
    tc_pull_once(p, c, 8, "stale", 32);
    assert_int_equal(TC_SUM(c, stale_retries), 2);
    assert_true(tc_wait_for(prewarmed, c, 20000));
    uint64_t before = TC_SUM(c, transfer_handshakes);
    tc_pull_once(p, c, 8, "after", 33);
    assert_int_equal(TC_SUM(c, transfer_handshakes), before);
    assert_int_equal(TC_SUM(c, read_failures), 0);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* One WRITE-mode transfer of 2 fresh blocks from p into c, checked byte for byte. */
static void push_once(pdl_instance_t *p, pdl_instance_t *c, int heads, const char *tid, uint8_t tag, uint32_t seed)
{
    tc_push_leg_t l;
    pdl_error_t e;
    assert_int_equal(tc_push_leg(&l, p, c, tid, tag, heads, 2, seed), PDL_OK);
    if (pdl_instance_push(p, &l.pk, l.rid, l.pb, 2, &e) != PDL_OK)
        fail_msg("push %s: %s", tid, e.msg);
    pdl_recv_t *rv;
    assert_int_equal(pdl_instance_expect_push(c, &l.ck, l.rid, l.cb, 2, &rv, &e), PDL_OK);
    if (pdl_recv_wait(rv, 60000, &e) != PDL_OK)
        fail_msg("push %s: %s", tid, e.msg);
    pdl_recv_free(rv);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, heads, false, l.cb, 2, seed, &checked), 0);
    assert_true(checked > 0);
    tc_push_leg_clear(&l);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    pdl_instance_free_blocks(c, l.cb, 2);
}

/* WRITE: prefill P (TP ptp) told its decode C (TP ctp) connects every pair it writes to before the
 * first push, which then handshakes nothing (it handshaked max(P, C) pairs itself before). */
static void prewarm_write_first_push(pdl_backend_kind_t be, int ptp, int ctp)
{
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, ctp, &g, TOTAL, be, 60, write_mode);
    assert_non_null(c);
    snprintf(g_prewarm, sizeof(g_prewarm), "127.0.0.1:%d:%d", pdl_instance_handshake_port(c, 0), ctp);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, ptp, &g, TOTAL, be, 60, with_prewarm_write);
    g_prewarm[0] = '\0';
    assert_non_null(p);
    assert_true(tc_wait_for(prewarmed, p, 20000));
    uint64_t pairs = (uint64_t)(ptp > ctp ? ptp : ctp);
    assert_int_equal(TC_SUM(p, prewarm_handshakes), pairs);
    push_once(p, c, 8, "w-first", 1, 41);
    push_once(p, c, 8, "w-second", 2, 42);
    assert_int_equal(TC_SUM(p, transfer_handshakes), 0);
    assert_int_equal(TC_SUM(p, handshakes), pairs);
    assert_int_equal(TC_SUM(p, write_failures), 0);
    assert_int_equal(TC_SUM(c, prewarm_handshakes) + TC_SUM(c, transfer_handshakes), 0);
    pdl_instance_destroy(p);
    pdl_instance_destroy(c);
}

static void prewarm_write_shm_p2c4(void **state)
{
    (void)state;
    prewarm_write_first_push(PDL_BACKEND_SHM, 2, 4);
}

static void prewarm_write_tcp_p4c2(void **state)
{
    (void)state;
    prewarm_write_first_push(PDL_BACKEND_TCP, 4, 2);
}

/* WRITE without prewarm_peers: the first push teaches the prefill its decode; every pair is connected
 * once, by a writer lane or by the prewarm, and a push after that handshakes nothing. */
static void prewarm_write_learnt(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 4, &g, TOTAL, PDL_BACKEND_SHM, 60, write_mode);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 4, &g, TOTAL, PDL_BACKEND_SHM, 60, with_prewarm_write);
    assert_non_null(c);
    assert_non_null(p);
    assert_int_equal(pdl_instance_prewarm_pending(p), 0);
    push_once(p, c, 8, "w-learn", 3, 43);
    assert_true(tc_wait_for(prewarmed, p, 20000));
    uint64_t own = TC_SUM(p, transfer_handshakes);
    assert_true(own >= 1 && own <= 4);
    assert_int_equal(own + TC_SUM(p, prewarm_handshakes), 4);
    assert_int_equal(TC_SUM(p, handshakes), 4);
    push_once(p, c, 8, "w-after", 4, 44);
    assert_int_equal(TC_SUM(p, transfer_handshakes), own);
    pdl_instance_destroy(p);
    pdl_instance_destroy(c);
}

static void with_long_backoff(pdl_instance_config_t *c)
{
    c->conn.peer_backoff_s = 0.05;
    c->conn.peer_backoff_max_s = 30; /* failed fakes are not forgotten by age here (2 x 30 s): only for room */
}

/* As a lane's cache miss on rank 0 of c for the TP2 producer `engine_id` at 127.0.0.1:hs_base: nothing is
 * prewarmed for rank 0's pair, which is the lane's to connect, and the lane fails to (this test's "lane"
 * connects nothing). The prewarm is left to connect the producer's other pair. */
static void lane_miss(pdl_rank_t *r0, const char *engine_id, int hs_base)
{
    pdl_peer_addr_t a;
    memset(&a, 0, sizeof(a));
    snprintf(a.engine_id, sizeof(a.engine_id), "%s", engine_id);
    snprintf(a.host, sizeof(a.host), "127.0.0.1");
    a.hs_base = hs_base;
    a.tp = 2;
    a.role = PDL_ROLE_PRODUCER;
    char key[PDL_WIRE_ID_MAX + 64];
    pdl__peer_key(&a, 0, key, sizeof(key));
    pdl_status_t st;
    pdl_error_t e;
    assert_null(pdl__prewarm_take(r0, &a, key, &st, &e));
    assert_int_equal(st, PDL_OK);
    pdl__prewarm_lane_done(r0, key, PDL_ERR_PEER_GONE);
}

/* The prewarm's table holds 4096 rank pairs. Requests name 2048 fake TP-2 producers (nothing listens:
 * each pair fails, the lane's as the prewarm's); then a real producer is learnt: a failed fake makes
 * room (counted), and the real producer's other pair is connected in the background. Before eviction
 * the full table left every new producer to its first request. */
static void prewarm_table_full_of_fakes(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *gone = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, NULL);
    assert_non_null(gone);
    int dead_port = pdl_instance_handshake_port(gone, 0); /* refused from now on: its ranks' ports close */
    pdl_instance_destroy(gone);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, with_long_backoff);
    assert_non_null(c);
    pdl_rank_t *r0 = &c->ranks[0];
    for (int i = 0; i < 2048; i++) {
        char id[32];
        snprintf(id, sizeof(id), "fake-%d", i);
        lane_miss(r0, id, dead_port);
    }
    assert_true(tc_wait_for(prewarmed, c, 60000)); /* every fake's other pair tried, and failed */
    assert_int_equal(TC_SUM(c, prewarm_handshakes), 0);
    assert_int_equal(TC_SUM(c, prewarm_evictions), 0);

    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, NULL);
    assert_non_null(p);
    char id[32];
    snprintf(id, sizeof(id), "127.0.0.1:%d", pdl_instance_handshake_port(p, 0)); /* as pull.c keys it */
    lane_miss(r0, id, pdl_instance_handshake_port(p, 0));
    assert_true(tc_wait_for(prewarmed, c, 20000));
    assert_int_equal(TC_SUM(c, prewarm_handshakes), 1); /* rank 1's pair, ahead of need */
    assert_int_equal(TC_SUM(c, prewarm_evictions), 2); /* one fake's two pairs made room */
    /* The pull: rank 1 takes the prewarmed peer; rank 0 connects the pair the test's lane left. */
    tc_pull_once(p, c, 8, "real", 51);
    assert_int_equal(TC_SUM(c, transfer_handshakes), 1);
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
        cmocka_unit_test(prewarm_write_shm_p2c4),  cmocka_unit_test(prewarm_write_tcp_p4c2),
        cmocka_unit_test(prewarm_write_learnt),    cmocka_unit_test(prewarm_table_full_of_fakes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
