/*
 * test_connector_watch_upstream.c -- a WRITE decode's producer watch in front of a producer that does
 * not know pdlink's identity request (an upstream MoRIIO instance: here a bare ZeroMQ ROUTER that
 * answers nothing). The watch asks it twice, then probes it by connect alone (watch.c): the receive
 * keeps waiting while the port accepts, no further identity request is sent however long the watch
 * looks (no flood on the upstream side), and once the port closes the receive still fails at once as
 * before (two refused connects).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <zmq.h>

#include "test_connector_util.h"
#include "common/clock.h"
#include "pdlink/wire.h"

#define NBLK 2
#define TOTAL 16

/* Read what reached the ROUTER for `ms`: count identity requests and get_meta_msg frames. */
static void drain(void *router, int ms, int *ident, int *meta)
{
    uint64_t end = pdl__clock_now_ns() + (uint64_t)ms * 1000000ull;
    while (pdl__clock_now_ns() < end) {
        zmq_pollitem_t it = {.socket = router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 50) <= 0)
            continue;
        int more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, router, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                break;
            }
            size_t n = zmq_msg_size(&m);
            if (n == strlen(PDL_WIRE_GET_IDENTITY) && memcmp(zmq_msg_data(&m), PDL_WIRE_GET_IDENTITY, n) == 0)
                (*ident)++;
            if (n == strlen(PDL_WIRE_GET_META) && memcmp(zmq_msg_data(&m), PDL_WIRE_GET_META, n) == 0)
                (*meta)++;
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
    }
}

static void upstream_producer_asked_twice_then_connect_only(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, tc_write_slow);
    assert_non_null(c);
    int port = tp_free_range(2);
    assert_true(port > 0);
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_bind(router, ep), 0);

    uint32_t cb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    pdl_kv_params_t ck;
    tc_leg_params("tx-upstream", 1, &ck);
    snprintf(ck.remote_host, sizeof(ck.remote_host), "127.0.0.1");
    ck.remote_handshake_port = port;
    ck.remote_notify_port = port + 1;
    pdl_recv_t *rv = NULL;
    pdl_error_t e;
    assert_int_equal(pdl_instance_expect_push(c, &ck, NULL, cb, NBLK, &rv, &e), PDL_OK);

    /* Asked twice (each left unanswered for a probe interval), within generous bounds ... */
    int ident = 0, meta = 0;
    for (int i = 0; i < 40 && ident < 2; i++)
        drain(router, 500, &ident, &meta);
    assert_int_equal(ident, 2);
    /* ... then never again, over several more probe intervals; get_meta_msg is never sent to a
     * producer (it would count as a handshake there). The port accepts: the receive keeps waiting. */
    drain(router, 4000, &ident, &meta);
    assert_int_equal(ident, 2);
    assert_int_equal(meta, 0);
    assert_int_equal(pdl_recv_wait(rv, 0, &e), PDL_INPROGRESS);
    assert_int_equal(TC_GET(c, 0, producer_gone_failed), 0);
    assert_true(TC_GET(c, 0, watch_identities) == 0);

    /* The upstream producer goes: two refused connects fail the receive at once, as before. */
    zmq_close(router);
    zmq_ctx_term(ctx);
    pdl_status_t st = pdl_recv_wait(rv, 10000, &e);
    if (st != PDL_ERR_PEER_GONE)
        fail_msg("receive after the upstream producer went: %s: %s", pdl_status_name(st), e.msg);
    assert_int_equal(TC_GET(c, 0, producer_gone_failed), 1);
    pdl_recv_free(rv);
    pdl_instance_free_blocks(c, cb, NBLK);
    pdl_kv_params_clear(&ck);
    pdl_instance_destroy(c);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(upstream_producer_asked_twice_then_connect_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
