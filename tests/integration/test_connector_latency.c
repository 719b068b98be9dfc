/*
 * test_connector_latency.c -- how long a release takes from the consumer rank deciding to send it to
 * the producer rank reporting the transfer (the fan-in path: queue → service thread → DEALER → TCP →
 * ROUTER → decode → fan-in → report), next to a plain ZeroMQ DEALER/ROUTER round trip measured in the
 * same run. Prints median and p99; asserts only counts and orderings (no timing thresholds).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <zmq.h>

#include "common/clock.h"
#include "test_connector_util.h"

#define ROUNDS 300
#define ZMQ_ROUNDS 2000

typedef struct rep {
    _Atomic uint64_t ns[ROUNDS][PDL_TOPO_MAX_TP];
} rep_t;

static void on_event(void *arg, pdl_instance_event_t ev, const char *tid, int rank)
{
    rep_t *r = arg;
    int i;
    if (ev == PDL_EVENT_RANK_REPORTED && sscanf(tid, "lat-%d", &i) == 1 && i >= 0 && i < ROUNDS && rank >= 0)
        atomic_store(&r->ns[i][rank], pdl__clock_now_ns());
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void summarize(const char *what, uint64_t *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_u64);
    printf("%-52s n=%zu median %.1f us  p99 %.1f us\n", what, n, (double)v[n / 2] / 1e3,
           (double)v[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1] / 1e3);
}

static void *echo_main(void *arg)
{
    void *s = arg;
    for (int i = 0; i < ZMQ_ROUNDS + 100; i++) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        zmq_msg_recv(&id, s, 0);
        zmq_msg_recv(&body, s, 0);
        zmq_msg_send(&id, s, ZMQ_SNDMORE);
        zmq_msg_send(&body, s, 0);
    }
    return NULL;
}

/* DEALER → ROUTER → back, ~70-byte frames like a release. */
static void zmq_round_trip(uint64_t *out)
{
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER), *dealer = zmq_socket(ctx, ZMQ_DEALER);
    assert_int_equal(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t len = sizeof(ep);
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len);
    assert_int_equal(zmq_connect(dealer, ep), 0);
    pthread_t th;
    pthread_create(&th, NULL, echo_main, router);
    char msg[72], back[128];
    memset(msg, 'r', sizeof(msg));
    for (int i = 0; i < ZMQ_ROUNDS + 100; i++) {
        uint64_t t0 = pdl__clock_now_ns();
        zmq_send(dealer, msg, sizeof(msg), 0);
        assert_int_equal(zmq_recv(dealer, back, sizeof(back), 0), (int)sizeof(msg));
        if (i >= 100)
            out[i - 100] = pdl__clock_now_ns() - t0;
    }
    pthread_join(th, NULL);
    zmq_close(dealer);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

static void run(int P, int D, uint64_t *lat, size_t *nlat)
{
    tc_geo_t g = tc_geo_default(8);
    g.layers = 1;
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, P, D, &g, 16, PDL_BACKEND_SHM, 60, 60, NULL, NULL));
    rep_t *rep = calloc(1, sizeof(*rep));
    pdl_instance_set_event_fn(p, on_event, rep);
    *nlat = 0;
    for (int i = 0; i < ROUNDS; i++) {
        uint32_t pb[1], cb[1];
        assert_int_equal(pdl_instance_alloc_blocks(p, 1, pb, NULL), PDL_OK);
        assert_int_equal(pdl_instance_alloc_blocks(c, 1, cb, NULL), PDL_OK);
        char tid[32];
        snprintf(tid, sizeof(tid), "lat-%d", i);
        assert_int_equal(pdl_instance_hold(p, tid, pb, 1, NULL), PDL_OK);
        pdl_kv_params_t kp;
        tc_params(p, tid, pb, 1, &kp);
        pdl_pull_t *pull;
        pdl_error_t e;
        assert_int_equal(pdl_instance_pull(c, &kp, NULL, cb, 1, &pull, &e), PDL_OK);
        assert_int_equal(pdl_pull_wait(pull, 30000, &e), PDL_OK);
        assert_true(tc_wait_for(tc_no_held, p, 30000));
        for (int pr = 0; pr < P; pr++) {
            /* the producer rank reports when the LAST release of its group arrives */
            int first, count;
            assert_int_equal(pdl_topo_consumers_of(P, D, pr, &first, &count, NULL), PDL_OK);
            uint64_t sent = 0;
            for (int d = first; d < first + count; d++) {
                uint64_t s = pdl_pull_release_sent_ns(pull, d);
                assert_true(s > 0);
                if (s > sent)
                    sent = s;
            }
            uint64_t got = atomic_load(&rep->ns[i][pr]);
            assert_true(got >= sent);
            if (i >= 20) /* warm-up excluded */
                lat[(*nlat)++] = got - sent;
        }
        pdl_pull_free(pull);
        pdl_kv_params_clear(&kp);
        pdl_instance_free_blocks(c, cb, 1);
    }
    assert_int_equal(TC_SUM(p, releases_received), TC_SUM(c, releases_sent));
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
    free(rep);
}

static void latency_release_vs_zmq(void **state)
{
    (void)state;
    uint64_t *z = calloc(ZMQ_ROUNDS, sizeof(uint64_t));
    uint64_t *l1 = calloc(ROUNDS * 8, sizeof(uint64_t)), *l2 = calloc(ROUNDS * 8, sizeof(uint64_t));
    size_t n1, n2;
    zmq_round_trip(z);
    run(1, 1, l1, &n1);
    run(4, 8, l2, &n2);
    assert_int_equal(n1, ROUNDS - 20);
    assert_int_equal(n2, (ROUNDS - 20) * 4);
    summarize("zeromq DEALER->ROUTER->DEALER round trip (72 B)", z, ZMQ_ROUNDS);
    summarize("release send -> producer report, P1/D1", l1, n1);
    summarize("release send -> producer report, P4/D8 (last of 2)", l2, n2);
    free(z);
    free(l1);
    free(l2);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(latency_release_vs_zmq),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
