/*
 * test_connector_broken_session.c -- a transfer that outlives transfer_timeout does not take the pair
 * down for good (issue 37 item 3). Freeing the timed-out batch breaks the tcp session with
 * PDL_ERR_BAD_STATE ("aborted: a running batch was freed"); the executor must evict the peer whatever
 * code broke its session, so the next pull handshakes afresh and succeeds. Before, only PEER_GONE and
 * TRANSPORT evicted: the broken session stayed cached and every later pull failed in milliseconds.
 *
 * The stall is deterministic: the test holds the producer engine's grant table lock, so its tcp server
 * blocks admitting the READ (every request on the guarded KV is checked against the grants) until the
 * consumer's pull has timed out.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "connector/internal.h"
#include "engine/backend.h"
#include "test_connector_util.h"

#define TOTAL 16

static void short_transfer(pdl_instance_config_t *c) { c->conn.transfer_timeout_s = 0.5; }

static pthread_mutex_t *grants_lock(pdl_instance_t *p) { return &pdl__rank_first(p)->mem.engine->grants.mu; }

static void pull_after_timeout(pdl_backend_kind_t backend)
{
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, backend, 60, 60, NULL, short_transfer));
    uint32_t ids[2], lb[2];
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, lb, NULL), PDL_OK);
    pdl_error_t e;
    pdl_kv_params_t kp;

    /* A first pull that works caches the session. */
    assert_int_equal(tc_hold_filled(p, "warm", 8, false, ids, 2, 3), PDL_OK);
    tc_params(p, "warm", ids, 2, &kp);
    if (tc_pull_wait(c, &kp, lb, 2, &e) != PDL_OK)
        fail_msg("warm pull: %s", e.msg);
    pdl_kv_params_clear(&kp);
    assert_true(tc_wait_for(tc_no_held, p, 20000));

    /* A pull the producer's server cannot serve before transfer_timeout: it fails, its batch is freed
     * while running and the session breaks. */
    assert_int_equal(tc_hold_filled(p, "stalled", 8, false, ids, 2, 4), PDL_OK);
    tc_params(p, "stalled", ids, 2, &kp);
    pthread_mutex_lock(grants_lock(p));
    pdl_status_t st = tc_pull_wait(c, &kp, lb, 2, &e);
    pthread_mutex_unlock(grants_lock(p));
    pdl_kv_params_clear(&kp);
    assert_int_not_equal(st, PDL_OK);
    assert_non_null(strstr(e.msg, "transfer_timeout"));
    assert_true(tc_wait_for(tc_no_held, p, 20000));

    /* The pair works again: the next pull handshakes afresh instead of failing on the broken session. */
    assert_int_equal(tc_hold_filled(p, "after", 8, false, ids, 2, 5), PDL_OK);
    tc_params(p, "after", ids, 2, &kp);
    st = tc_pull_wait(c, &kp, lb, 2, &e);
    if (st != PDL_OK)
        fail_msg("pull after a timed-out one: %s", e.msg);
    pdl_kv_params_clear(&kp);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, lb, 2, 5, &checked), 0);
    assert_true(checked > 0);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void broken_session_tcp(void **state)
{
    (void)state;
    pull_after_timeout(PDL_BACKEND_TCP);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(broken_session_tcp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
