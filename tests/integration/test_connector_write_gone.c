/*
 * test_connector_write_gone.c -- WRITE mode: a decode waiting for write_done is told at once when it
 * will not come, instead of waiting out transfer_timeout (600 s in these tests):
 *
 * - its producer is gone (killed, or was never there: a "transfer from nowhere"): the consumer's watch
 *   (watch.c) fails the receive with PDL_ERR_PEER_GONE naming the producer's host:port and rank;
 * - the producer gave up the push before the decode's remote_blocks came (reaped after defer_timeout,
 *   here 0.3 s): the late remote_blocks is answered with a failed write_done (push.c's tombstones).
 *
 * Each wait is bounded at 10 s; before, every one of these receives ended with PDL_ERR_TIMEOUT.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_connector_util.h"
#include "test_connector_check.h"
#include "pdlink/wire.h"

#define NBLK 3
#define TOTAL 24
#define WAIT_MS 10000

/* A producer that reaps a push left without remote_blocks after 0.3 s. */
static void write_reaps_fast(pdl_instance_config_t *c)
{
    tc_write_slow(c);
    c->conn.defer_timeout_s = 0.3;
}

/* The receive ends within WAIT_MS with `want`; its message is copied to msg. */
static void wait_fails(pdl_recv_t *rv, pdl_status_t want, char *msg, size_t cap)
{
    pdl_error_t e;
    uint64_t t0 = pdl__clock_now_ns();
    pdl_status_t st = pdl_recv_wait(rv, WAIT_MS, &e);
    fprintf(stderr, "receive ended after %.2f s: %s: %s\n", (pdl__clock_now_ns() - t0) / 1e9, pdl_status_name(st),
            st == PDL_OK ? "ok" : e.msg);
    assert_int_equal(st, want);
    snprintf(msg, cap, "%s", e.msg);
}

/* A TP2 decode waits for a TP2 prefill that is killed (destroyed: its ports close) before it pushed. */
static void killed_producer_fails_receive(void **state)
{
    (void)state;
    pdl_instance_t *p, *c;
    tc_push_leg_t l;
    pdl_recv_t *rv = tc_receive_waiting(2, TOTAL, "tx-killed", NBLK, &p, &c, &l); /* the prefill dies next */
    int p_hs = pdl_instance_handshake_port(p, 0);
    pdl_instance_destroy(p);
    char msg[PDL_ERR_MSG_LEN], want[64];
    wait_fails(rv, PDL_ERR_PEER_GONE, msg, sizeof(msg));
    /* The message names the producer rank's address and rank (rank 0 feeds consumer rank 0). */
    snprintf(want, sizeof(want), "127.0.0.1:%d (producer tp rank 0)", p_hs);
    if (strstr(msg, want) == NULL && (snprintf(want, sizeof(want), "127.0.0.1:%d (producer tp rank 1)", p_hs + 1),
                                      strstr(msg, want) == NULL))
        fail_msg("the failure names no producer rank's address: %s", msg);
    assert_non_null(strstr(msg, "is gone"));
    tc_receive_gone(c, rv, &l, NBLK, TOTAL);
    pdl_instance_destroy(c);
}

/* kv_transfer_params naming a producer where nothing listens (a bad request): failed at once too. */
static void transfer_from_nowhere_fails_receive(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, tc_write_slow);
    assert_non_null(c);
    int nowhere = tp_free_range(2); /* free when probed, and nothing of ours binds it */
    assert_true(nowhere > 0);
    uint32_t cb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    pdl_kv_params_t ck;
    tc_leg_params("tx-nowhere", 1, &ck);
    snprintf(ck.remote_host, sizeof(ck.remote_host), "127.0.0.1");
    ck.remote_handshake_port = nowhere;
    ck.remote_notify_port = nowhere + 1;
    pdl_recv_t *rv = NULL;
    pdl_error_t e;
    assert_int_equal(pdl_instance_expect_push(c, &ck, NULL, cb, NBLK, &rv, &e), PDL_OK);
    char msg[PDL_ERR_MSG_LEN], want[64];
    wait_fails(rv, PDL_ERR_PEER_GONE, msg, sizeof(msg));
    snprintf(want, sizeof(want), "127.0.0.1:%d (producer tp rank 0)", nowhere);
    assert_non_null(strstr(msg, want));
    assert_int_equal(TC_GET(c, 0, producer_gone_failed), 1);
    pdl_recv_free(rv);
    pdl_instance_free_blocks(c, cb, NBLK);
    pdl_kv_params_clear(&ck);
    pdl_instance_destroy(c);
}

/* A P2 push reaped (no remote_blocks within defer_timeout 0.3 s); the D1 decode's remote_blocks comes
 * after that: each producer rank answers it with a failed write_done. */
static void late_remote_blocks_for_reaped_push_answered(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 1, &g, TOTAL, PDL_BACKEND_TCP, 0.3, 600, write_reaps_fast, tc_write_slow));
    char rid[1024];
    assert_true(tc_request_id(p, c, 2, rid, sizeof(rid)));
    uint32_t pb[NBLK], cb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, pb, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    pdl_kv_params_t pk, ck;
    tc_leg_params("tx-reaped", 1, &pk);
    tc_leg_params("tx-reaped", 2, &ck);
    pdl_error_t e;
    assert_int_equal(pdl_instance_push(p, &pk, rid, pb, NBLK, &e), PDL_OK);
    tc_at_least_t reaped = {p, offsetof(pdl_rank_counters_t, expired), 2};
    assert_true(tc_wait_for(tc_sum_reached, &reaped, 20000));
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000)); /* the push is gone; its tombstone stays */
    pdl_recv_t *rv = NULL;
    assert_int_equal(pdl_instance_expect_push(c, &ck, rid, cb, NBLK, &rv, &e), PDL_OK);
    char msg[PDL_ERR_MSG_LEN];
    wait_fails(rv, PDL_ERR_TRANSPORT, msg, sizeof(msg));
    assert_non_null(strstr(msg, "write_done status failed"));
    assert_int_equal(TC_SUM(p, remote_blocks_given_up), 2);
    assert_int_equal(TC_SUM(p, remote_blocks_parked), 0);
    assert_int_equal(TC_SUM(c, write_done_failed_status), 2);
    assert_int_equal(TC_SUM(p, transfers), 0); /* nothing was written */
    pdl_recv_free(rv);
    pdl_instance_free_blocks(c, cb, NBLK);
    pdl_kv_params_clear(&pk);
    pdl_kv_params_clear(&ck);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(killed_producer_fails_receive),
        cmocka_unit_test(transfer_from_nowhere_fails_receive),
        cmocka_unit_test(late_remote_blocks_for_reaped_push_answered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
