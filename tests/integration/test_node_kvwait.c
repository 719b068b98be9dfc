/*
 * test_node_kvwait.c -- pdlink-node's KV store over a connector instance: an allocation that has to wait
 * for blocks is woken by the blocks coming back, both by the node's own free and by the connector
 * freeing a held transfer on one of its threads (here the lease reaper after defer_timeout, the FREED
 * event), with nothing polling. Without that wake-up the waiter would sleep to its deadline and fail,
 * so the test needs no clock: it only asserts that the allocation succeeds and what it got. Also: a
 * request larger than the free blocks with no wait fails at once, naming the counts.
 * It links pdl_node, the node program's library.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "node/kvstore.h"
#include "node_testutil.h"
#include "test_connector_util.h"

static pdl_node_kv_t *make_kv(double defer_s)
{
    for (int attempt = 0; attempt < 10; attempt++) {
        int hs = tp_free_range(4);
        if (hs < 0)
            return NULL;
        int nt = hs + 2;
        pdl_connector_config_t conn;
        pdl_connector_config_defaults(&conn);
        conn.role = PDL_ROLE_PRODUCER;
        conn.read_mode = true;
        conn.backend = PDL_BACKEND_SHM;
        conn.handshake_port = hs;
        conn.notify_port = nt;
        conn.defer_timeout_s = defer_s;
        pdl_node_kv_config_t c;
        tn_small_kv_config(&c, 2, 8);
        c.conn = &conn;
        pdl_node_kv_t *kv = NULL;
        pdl_error_t err;
        if (pdl_node_kv_create(&c, &kv, &err) == PDL_OK)
            return kv;
        if (strstr(err.msg, "in use") == NULL) {
            fprintf(stderr, "kv create failed: %s\n", err.msg);
            return NULL;
        }
    }
    return NULL;
}

typedef struct waiter {
    pdl_node_kv_t *kv;
    size_t n;
    uint32_t ids[8];
    pdl_status_t st;
    pdl_error_t err;
} waiter_t;

static void *wait_alloc(void *arg)
{
    waiter_t *w = arg;
    w->st = pdl_node_kv_alloc(w->kv, w->n, w->ids, 60000, &w->err);
    return NULL;
}

static void waiter_woken_by_node_free_and_connector_expiry(void **state)
{
    (void)state;
    pdl_node_kv_t *kv = make_kv(0.3);
    assert_non_null(kv);
    pdl_instance_t *inst = pdl_node_kv_instance(kv);
    uint32_t all[8];
    assert_int_equal(pdl_node_kv_alloc(kv, 8, all, 0, NULL), PDL_OK);
    /* Half of the cache held for a consumer that never comes: the reaper frees it after 0.3 s. */
    assert_int_equal(pdl_instance_hold(inst, "tx-never-pulled", all, 4, NULL), PDL_OK);
    pdl_error_t err;
    uint32_t none[8];
    assert_int_equal(pdl_node_kv_alloc(kv, 6, none, 0, &err), PDL_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "6 blocks needed, 0 free"));

    waiter_t w = {.kv = kv, .n = 6};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_alloc, &w), 0);
    pdl_node_kv_free(kv, all + 4, 4); /* 4 free: not enough yet, the waiter must keep waiting */
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(w.st, PDL_OK);
    /* It got 6 distinct blocks out of the 8, so some came back through the connector's expiry. */
    bool seen[8] = {false};
    for (size_t i = 0; i < 6; i++) {
        assert_true(w.ids[i] < 8);
        assert_false(seen[w.ids[i]]);
        seen[w.ids[i]] = true;
    }
    /* The waiter can be woken inside the FREED delivery, before the transfer stops counting as held
     * (held == 0 means the event was delivered): wait for that, the deadline only bounds a failure. */
    assert_true(tc_wait_for(tc_no_held, inst, 30000));
    assert_int_equal(TC_SUM(inst, expired), 2); /* one per rank */
    assert_int_equal(pdl_instance_held_blocks(inst), 0);
    assert_int_equal(pdl_node_kv_free_count(kv), 2);
    pdl_node_kv_free(kv, w.ids, 6);
    assert_int_equal(pdl_node_kv_free_count(kv), 8);
    pdl_node_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(waiter_woken_by_node_free_and_connector_expiry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
