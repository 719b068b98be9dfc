/*
 * test_connector_isolation.c -- one failure stays one failure, over loopback:
 *   - a blackholed producer does not hold up pulls from a healthy one (lanes), its handshake is paid
 *     once, and the pulls queued behind it fail at once with its reason (peer health);
 *   - a consumer that will not pull releases the producer at once (pdl_instance_abandon);
 *   - a producer frees the holds of a consumer that is gone, long before defer_timeout (watch.c);
 *   - the first pull after a producer restart succeeds (stale session retried once);
 *   - a lane stops reconnecting to a producer that failed (its DEALERs are closed);
 *   - the engine's data port never lands in the configured handshake/notify ranges.
 * Pass conditions are events and counters; deadlines only bound failures. Elapsed times are printed
 * (not asserted) for the record.
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

static void slow_blackhole(pdl_instance_config_t *c)
{
    c->conn.handshake_timeout_s = 15; /* the blackhole's pulls end only by this timeout */
    c->conn.peer_backoff_s = 120;     /* long enough that no retry happens during the test */
    c->conn.peer_backoff_max_s = 120;
}

/* Four pulls naming a blackholed producer, then one from a healthy producer: the healthy one finishes
 * while the four still wait (before: it waited behind 4 x handshake_timeout), only ONE handshake with
 * the blackhole is attempted per rank, and the three queued behind it fail at once with its reason. */
static void isolation_blackholed_producer(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, 60, NULL, slow_blackhole));
    int fds[2];
    int bh = tc_blackhole(2, fds);
    assert_true(bh > 0);
    pdl_kv_params_t kd[4];
    pdl_pull_t *pd[4];
    uint32_t ld[4][1], rb[1] = {0};
    pdl_error_t e;
    uint64_t t0 = pdl__clock_now_ns();
    for (int i = 0; i < 4; i++) {
        pdl_kv_params_init(&kd[i]);
        snprintf(kd[i].transfer_id, sizeof(kd[i].transfer_id), "dead-%d", i);
        snprintf(kd[i].remote_host, sizeof(kd[i].remote_host), "127.0.0.1");
        snprintf(kd[i].remote_engine_id, sizeof(kd[i].remote_engine_id), "blackhole:%d", bh);
        kd[i].remote_handshake_port = bh;
        kd[i].remote_notify_port = bh; /* never reached: the handshake fails first */
        kd[i].tp_size = 2;
        kd[i].remote_block_ids = rb;
        kd[i].num_remote_blocks = 1;
        kd[i].has_remote_block_ids = true;
        assert_int_equal(pdl_instance_alloc_blocks(c, 1, ld[i], NULL), PDL_OK);
        assert_int_equal(pdl_instance_pull(c, &kd[i], NULL, ld[i], 1, &pd[i], &e), PDL_OK);
    }
    uint32_t w[4], lw[4];
    assert_int_equal(pdl_instance_alloc_blocks(c, 4, lw, NULL), PDL_OK);
    assert_int_equal(tc_hold_filled(p, "healthy", 8, false, w, 4, 7), PDL_OK);
    pdl_kv_params_t kw;
    tc_params(p, "healthy", w, 4, &kw);
    pdl_pull_t *pw;
    uint64_t th = pdl__clock_now_ns();
    assert_int_equal(pdl_instance_pull(c, &kw, NULL, lw, 4, &pw, &e), PDL_OK);
    if (pdl_pull_wait(pw, 60000, &e) != PDL_OK)
        fail_msg("healthy pull: %s", e.msg);
    uint64_t healthy_ns = pdl__clock_now_ns() - th;
    /* The blackhole's handshake cannot have ended yet: it ends only at its 15 s timeout. */
    for (int i = 0; i < 4; i++)
        assert_int_equal(pdl_pull_wait(pd[i], 0, &e), PDL_INPROGRESS);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, lw, 4, 7, &checked), 0);
    assert_true(checked > 0);
    uint64_t done_ns[4];
    for (int i = 0; i < 4; i++) {
        /* The handshake's failure, not the wait running out (PDL_INPROGRESS). */
        assert_int_equal(pdl_pull_wait(pd[i], 120000, &e), PDL_ERR_TIMEOUT);
        done_ns[i] = pdl__clock_now_ns() - t0;
        assert_non_null(strstr(e.msg, "no reply"));
        if (i > 0)
            assert_non_null(strstr(e.msg, "peer_backoff"));
    }
    assert_int_equal(TC_SUM(c, handshake_failures), 2);    /* one per consumer rank, not four */
    assert_int_equal(TC_SUM(c, peer_backoff_refusals), 6); /* three per rank, at once */
    /* A later pull to the dead producer fails at once too, with the reason. */
    pdl_pull_t *p5;
    assert_int_equal(pdl_instance_pull(c, &kd[0], NULL, ld[0], 1, &p5, &e), PDL_OK);
    assert_int_equal(pdl_pull_wait(p5, 60000, &e), PDL_ERR_TIMEOUT);
    assert_non_null(strstr(e.msg, "retry in"));
    assert_int_equal(TC_SUM(c, handshake_failures), 2);
    fprintf(stderr,
            "isolation: healthy pull with 4 blackholed pulls queued: %.1f ms; blackholed pulls done at %.2f %.2f %.2f "
            "%.2f s (handshake_timeout 15 s)\n",
            healthy_ns / 1e6, done_ns[0] / 1e9, done_ns[1] / 1e9, done_ns[2] / 1e9, done_ns[3] / 1e9);
    pdl_pull_free(p5);
    for (int i = 0; i < 4; i++) {
        pdl_pull_free(pd[i]);
        kd[i].remote_block_ids = NULL;
        pdl_kv_params_clear(&kd[i]);
    }
    pdl_pull_free(pw);
    pdl_kv_params_clear(&kw);
    for (int i = 0; i < 2; i++)
        close(fds[i]);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

typedef struct freed_cond {
    tc_events_t *c;
    int want;
} freed_cond_t;

static bool freed_reached(void *arg)
{
    freed_cond_t *f = arg;
    return atomic_load(&f->c->freed) >= f->want;
}

/* A consumer that will not pull releases every producer rank at once (P4 -> D2: each consumer rank
 * its group of two): the producer frees the blocks on the releases, not at defer_timeout (600 s). */
static void isolation_abandon_releases_at_once(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 4, 2, &g, TOTAL, PDL_BACKEND_SHM, 600, 600, NULL, NULL));
    tc_events_t ev = {0};
    pdl_instance_set_event_fn(p, tc_on_event, &ev);
    uint32_t b[3];
    assert_int_equal(pdl_instance_alloc_blocks(p, 3, b, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "rejected", b, 3, NULL), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "rejected", b, 3, &kp);
    pdl_error_t e;
    uint64_t t0 = pdl__clock_now_ns();
    assert_int_equal(pdl_instance_abandon(c, &kp, NULL, &e), PDL_OK);
    freed_cond_t fc = {&ev, 1};
    assert_true(tc_wait_for(freed_reached, &fc, 20000));
    fprintf(stderr, "isolation: abandoned transfer freed on the producer after %.1f ms (defer_timeout 600 s)\n",
            (pdl__clock_now_ns() - t0) / 1e6);
    assert_int_equal(atomic_load(&ev.expired_all), 0);
    assert_int_equal(pdl_instance_held_blocks(p), 0);
    assert_int_equal(TC_SUM(p, releases_failed_status), 4); /* two consumer ranks x two producer ranks */
    assert_int_equal(TC_SUM(c, transfers_abandoned), 1);
    /* Not for a producer, and not without a peer address. */
    assert_int_equal(pdl_instance_abandon(p, &kp, NULL, &e), PDL_ERR_UNSUPPORTED);
    kp.remote_host[0] = '\0';
    assert_int_equal(pdl_instance_abandon(c, &kp, NULL, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "no producer address"));
    pdl_kv_params_clear(&kp);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* The producer holds KV for a consumer (named by the request id) that is then destroyed: every hold
 * for it is freed well before defer_timeout (600 s), a hold for a live consumer stays. */
static void isolation_gone_consumer_holds_freed(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_SHM, 600, NULL);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 2, &g, TOTAL, PDL_BACKEND_SHM, 600, NULL);
    pdl_instance_t *live = tc_instance(PDL_ROLE_CONSUMER, 1, &g, TOTAL, PDL_BACKEND_SHM, 600, NULL);
    assert_non_null(p);
    assert_non_null(c);
    assert_non_null(live);
    tc_events_t ev = {0};
    pdl_instance_set_event_fn(p, tc_on_event, &ev);
    uint8_t uuid[16] = {1};
    char rid[1024], rid_live[1024];
    assert_true(pdl_wire_format_request_id(pdl_instance_zmq_address(p), pdl_instance_zmq_address(c), uuid, rid,
                                           sizeof(rid)) > 0);
    assert_true(pdl_wire_format_request_id(pdl_instance_zmq_address(p), pdl_instance_zmq_address(live), uuid,
                                           rid_live, sizeof(rid_live)) > 0);
    uint32_t b[4][2];
    for (int i = 0; i < 4; i++) {
        char tid[32];
        snprintf(tid, sizeof(tid), "tx-%d", i);
        assert_int_equal(pdl_instance_alloc_blocks(p, 2, b[i], NULL), PDL_OK);
        assert_int_equal(pdl_instance_hold_for(p, tid, i < 3 ? rid : rid_live, b[i], 2, NULL), PDL_OK);
    }
    assert_int_equal(pdl_instance_held_transfers(p), 4);
    uint64_t t0 = pdl__clock_now_ns();
    pdl_instance_destroy(c);
    freed_cond_t fc = {&ev, 3};
    assert_true(tc_wait_for(freed_reached, &fc, 30000));
    fprintf(stderr, "isolation: holds of a destroyed consumer freed %.2f s after it went (defer_timeout 600 s)\n",
            (pdl__clock_now_ns() - t0) / 1e9);
    assert_int_equal(TC_GET(p, 0, consumer_gone_freed), 3);
    assert_int_equal(pdl_instance_held_transfers(p), 1); /* the live consumer's */
    assert_int_equal(TC_SUM(p, expired), 0);             /* not the reaper */
    pdl_instance_destroy(live);
    pdl_instance_destroy(p);
}

/* A producer restarted on the same ports (new engines): the consumer's cached sessions are stale; the
 * first pull after the restart succeeds (before: it failed with "peer gone"). */
static void isolation_first_pull_after_producer_restart(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, 60, NULL, NULL));
    for (int round = 0; round < 2; round++) {
        char tid[16];
        snprintf(tid, sizeof(tid), "r%d", round);
        tc_pull_once(p, c, 8, tid, 50 + (uint32_t)round);
        if (round == 0)
            p = tc_restart(p); /* on the same ports */
    }
    assert_int_equal(TC_SUM(c, stale_retries), 2); /* each consumer rank once */
    assert_int_equal(TC_SUM(c, read_failures), 0);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* After a pull whose producer refused, the lane holds no DEALER to it: nothing keeps reconnecting to
 * the dead port (which could end connected to itself on loopback and hold the port). */
static void isolation_no_dealer_left_to_dead_producer(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, 60, NULL, NULL));
    uint32_t b[1], lb[1];
    pdl_error_t e;
    assert_int_equal(pdl_instance_alloc_blocks(c, 1, lb, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(p, 1, b, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "a", b, 1, NULL), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "a", b, 1, &kp);
    pdl_pull_t *pull;
    assert_int_equal(tc_pull_wait(c, &kp, lb, 1, &e), PDL_OK);
    assert_int_equal(c->ranks[0].readers.n, 1);
    pdl_xfer_side_t *lane = c->ranks[0].readers.all[0];
    assert_int_equal(lane->dealers.count, 1); /* the release DEALER to the producer's notify port */
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    pdl_instance_destroy(p);
    /* The next pull fails (the cached session is broken, the retry's handshake is refused) ... */
    snprintf(kp.transfer_id, sizeof(kp.transfer_id), "b");
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, lb, 1, &pull, &e), PDL_OK);
    assert_int_equal(pdl_pull_wait(pull, 60000, &e), PDL_ERR_PEER_GONE);
    pdl_pull_free(pull);
    /* ... and leaves no DEALER behind (pdl_pull_wait orders the lane's work before this read). */
    assert_int_equal(lane->dealers.count, 0);
    pdl_kv_params_clear(&kp);
    pdl_instance_destroy(c);
}

static int ephemeral_low(void)
{
    int lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 32768;
        fclose(f);
    }
    return lo;
}

static int g_range_base, g_range_n, g_notify;
static void huge_range(pdl_instance_config_t *c)
{
    c->conn.handshake_port = g_range_base;
    c->conn.notify_port = g_notify;
    c->dp_size = g_range_n; /* the configured handshake range: base .. base + dp_size * tp */
    c->dp_rank = 0;
}

/* The configured handshake range covers the lower half of the ephemeral range: every engine's data
 * port still lies outside it (before: each had about even odds of landing inside). */
static void isolation_engine_port_outside_ranges(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    int lo = ephemeral_low();
    g_range_n = 8000;
    for (int k = 0; k < 4; k++) {
        /* The base ports sit inside the ephemeral range on purpose, so a probe can lose them to another
         * process before the instance binds: try fresh ones rather than skip. */
        pdl_instance_t *inst = NULL;
        for (int i = 0; i < 50 && inst == NULL; i++) {
            g_range_base = lo + (int)(tc_rand() % 1000);
            g_notify = 20001 + (int)(tc_rand() % 5000);
            if (tc_port_free(g_range_base) && tc_port_free(g_notify))
                inst = tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, huge_range);
        }
        assert_non_null(inst);
        int port = pdl_engine_port(inst->ranks[0].mem.engine);
        assert_true(port > 0);
        if (port >= g_range_base && port < g_range_base + g_range_n)
            fail_msg("engine data port %d inside the configured handshake range %d-%d", port, g_range_base,
                     g_range_base + g_range_n - 1);
        pdl_instance_destroy(inst);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(isolation_blackholed_producer),
        cmocka_unit_test(isolation_abandon_releases_at_once),
        cmocka_unit_test(isolation_gone_consumer_holds_freed),
        cmocka_unit_test(isolation_first_pull_after_producer_restart),
        cmocka_unit_test(isolation_no_dealer_left_to_dead_producer),
        cmocka_unit_test(isolation_engine_port_outside_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
