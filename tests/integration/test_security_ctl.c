/*
 * test_security_ctl.c -- control-message attacks against live instances: every control message bound to
 * the party the transfer names, and nothing an unverified peer can grow without bound (docs/security.md).
 * 127.0.0.2 plays another host (loopback routes all of 127/8); every wait is on a counter or a state,
 * with a bound that only a failure reaches.
 *
 * - first_reader_is_not_the_consumer: a hold for the decode its request id names (127.0.0.2) is read
 *   first from 127.0.0.1. The reader's release is refused and the named decode's frees the blocks (were
 *   the first reader "the consumer", its release would free them and the real decode's be refused).
 * - forged_keepalive_refused: a keepalive from another host than the consumer's is refused and counted
 *   (accepted, it would extend the lease: an attacker could pin blocks past defer_timeout).
 * - forged_write_done_refused: WRITE decode; a write_done from another host than the receive's producer,
 *   ok after the receive started, failed before it (parked). Both are refused and the real push verifies
 *   (counted, the ok one would end the receive before the prefill wrote, the failed one fail it at once).
 * - forged_remote_blocks_refused: WRITE prefill; remote_blocks from another host than the push's
 *   consumer, after the push and parked before it, are refused; the real push verifies (accepted, they
 *   would aim the push at the blocks they name, and the real receive would fail).
 * - park_bounded: remote_blocks with more ids than num_blocks are refused; a host that fills the park
 *   table gets its own entries evicted, not the real decode's, whose push then verifies (a full table
 *   must not drop the real remote_blocks and leave the push unstarted).
 * - failed_release_needs_verified_producer: pulls and abandons naming producers that never answered a
 *   handshake send no failed release (else one each, a new DEALER each).
 * - dealer_cap: pulls from a verified producer naming 300 new notify ports (failed releases) stay within
 *   the unverified share of the socket cap (not 300 DEALERs), and a real pull still works.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <zmq.h>

#include "pdlink/wire.h"
#include "test_connector_util.h"

#define TOTAL 16
#define NBLK 2

/* A DEALER bound to source address `src` connected to 127.0.0.1:port, in its own context. */
typedef struct raw {
    void *ctx, *s;
} raw_t;

static void raw_open(raw_t *w, const char *src, int port)
{
    w->ctx = zmq_ctx_new();
    w->s = zmq_socket(w->ctx, ZMQ_DEALER);
    int linger = 2000, hwm = 0;
    zmq_setsockopt(w->s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(w->s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    char ep[96];
    snprintf(ep, sizeof(ep), "tcp://%s:0;127.0.0.1:%d", src, port); /* libzmq: source;destination */
    assert_int_equal(zmq_connect(w->s, ep), 0);
}

static void raw_send(raw_t *w, const pdl_msg_t *m)
{
    pdl_bytes_t b;
    assert_int_equal(pdl_wire_encode_msg(m, &b, NULL), PDL_OK);
    assert_true(zmq_send(w->s, b.data, b.len, 0) >= 0);
    pdl_bytes_free(&b);
}

static void raw_close(raw_t *w)
{
    zmq_close(w->s);
    zmq_ctx_term(w->ctx);
}

/* One message from `src` to notify `port`. */
static void send_from(const char *src, int port, const pdl_msg_t *m)
{
    raw_t w;
    raw_open(&w, src, port);
    raw_send(&w, m);
    raw_close(&w);
}

static void send_type(const char *src, int port, pdl_msg_type_t type, const char *tid, bool failed)
{
    pdl_msg_t m;
    pdl_msg_init(&m, type);
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
    m.status = failed ? PDL_RELEASE_FAILED : PDL_RELEASE_OK;
    if (type == PDL_MSG_WRITE_DONE) {
        m.producer_tp_size = 1;
        m.producer_tp_rank = 0;
    }
    send_from(src, port, &m);
    pdl_msg_clear(&m);
}

static bool reached(pdl_instance_t *inst, size_t off, uint64_t want)
{
    tc_at_least_t w = {inst, off, want};
    return tc_wait_for(tc_sum_reached, &w, 60000);
}
#define REACHED(inst, field, want) reached((inst), offsetof(pdl_rank_counters_t, field), (want))

static void write_mode(pdl_instance_config_t *c) { tc_write_slow(c); }

/* ---- every control message bound to the party the transfer names ----------------------------------- */

static void first_reader_is_not_the_consumer(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 600, tc_watch_slow, NULL));
    /* The router named a decode at 127.0.0.2 (nothing needs to listen there: the watch is slow). */
    uint32_t pb[NBLK], cb[NBLK];
    pdl_error_t e;
    assert_int_equal(tc_hold_for(p, "host:127.0.0.2,handshake:9,notify:9", "tx-r1", 1, pb, NBLK, &e), PDL_OK);
    tc_fill(p, 8, false, pb, NBLK, 4);
    /* Someone who learnt the id reads first, from 127.0.0.1 (it may: the id is the capability). */
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "tx-r1", pb, NBLK, &kp);
    pdl_pull_t *pull;
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, cb, NBLK, &pull, &e), PDL_OK);
    /* Its own release (127.0.0.1) is the forged one here: the transfer is 127.0.0.2's. */
    assert_int_equal(pdl_pull_wait(pull, 60000, &e), PDL_OK);
    pdl_pull_free(pull);
    assert_true(REACHED(p, releases_refused, 1));
    assert_int_equal(pdl_instance_held_blocks(p), NBLK);
    send_type("127.0.0.2", pdl_instance_notify_port(p, 0), PDL_MSG_RELEASE, "tx-r1", false);
    assert_true(tc_wait_for(tc_no_held, p, 60000));
    assert_int_equal(TC_GET(p, 0, releases_refused), 1);
    printf("first reader (127.0.0.1) refused as consumer; the named decode's release (127.0.0.2) freed %d blocks\n",
           NBLK);
    pdl_kv_params_clear(&kp);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void forged_keepalive_refused(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, tc_watch_slow);
    assert_non_null(p);
    uint32_t pb[NBLK];
    pdl_error_t e;
    assert_int_equal(tc_hold_for(p, "host:127.0.0.1,handshake:9,notify:9", "tx-k1", 2, pb, NBLK, &e), PDL_OK);
    int notify = pdl_instance_notify_port(p, 0);
    send_type("127.0.0.2", notify, PDL_MSG_KEEPALIVE, "tx-k1", false);
    assert_true(REACHED(p, keepalives_refused, 1));
    assert_int_equal(TC_GET(p, 0, keepalives_received), 0);
    send_type("127.0.0.1", notify, PDL_MSG_KEEPALIVE, "tx-k1", false);
    assert_true(REACHED(p, keepalives_received, 1));
    assert_int_equal(TC_GET(p, 0, keepalives_refused), 1);
    printf("keepalive from 127.0.0.2 refused, the consumer's (127.0.0.1) extended the lease\n");
    pdl_instance_destroy(p);
}

static void forged_write_done_refused(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 600, write_mode, write_mode));
    int cnotify = pdl_instance_notify_port(c, 0);
    for (int round = 0; round < 2; round++) {
        char tid[32];
        snprintf(tid, sizeof(tid), "tx-wd%d", round);
        tc_push_leg_t l;
        assert_int_equal(tc_push_leg(&l, p, c, tid, (uint8_t)(40 + round), 8, NBLK, (uint32_t)(7 + round)), PDL_OK);
        pdl_recv_t *rv;
        pdl_error_t e;
        if (round == 0) { /* ok write_done after the receive started, before the prefill wrote */
            assert_int_equal(pdl_instance_expect_push(c, &l.ck, l.rid, l.cb, NBLK, &rv, &e), PDL_OK);
            send_type("127.0.0.2", cnotify, PDL_MSG_WRITE_DONE, tid, false);
            assert_true(REACHED(c, write_done_refused, 1));
            assert_int_equal(pdl_recv_write_done(rv, 0), 0);
        } else { /* failed write_done before the receive: it would fail the receive at once */
            send_type("127.0.0.2", cnotify, PDL_MSG_WRITE_DONE, tid, true);
            assert_true(REACHED(c, write_done_failed_status, 1));
            assert_int_equal(pdl_instance_expect_push(c, &l.ck, l.rid, l.cb, NBLK, &rv, &e), PDL_OK);
            assert_int_equal(TC_GET(c, 0, write_done_refused), 2); /* refused as the receive started */
        }
        assert_int_equal(pdl_instance_push(p, &l.pk, l.rid, l.pb, NBLK, &e), PDL_OK);
        if (pdl_recv_wait(rv, 60000, &e) != PDL_OK)
            fail_msg("receive %s: %s", tid, e.msg);
        uint64_t checked = 0;
        assert_int_equal(tc_verify(c, 8, false, l.cb, NBLK, (uint32_t)(7 + round), &checked), 0);
        assert_true(checked > 0);
        pdl_recv_free(rv);
        assert_true(tc_wait_for(tc_no_held, p, 60000));
        pdl_instance_free_blocks(c, l.cb, NBLK);
        tc_push_leg_clear(&l);
    }
    printf("forged write_done (ok during a receive, failed before one) refused: %llu; both pushes verified\n",
           (unsigned long long)TC_GET(c, 0, write_done_refused));
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* remote_blocks for `tid` naming blocks `ids` (n of them), as a consumer rank 0 of TP 1 sends it. */
static void rb_msg(pdl_msg_t *m, const char *tid, uint32_t *ids, size_t n)
{
    pdl_msg_init(m, PDL_MSG_REMOTE_BLOCKS);
    snprintf(m->transfer_id, sizeof(m->transfer_id), "%s", tid);
    snprintf(m->req_id, sizeof(m->req_id), "%s", tid);
    m->decode_rank = 0;
    m->consumer_tp_size = 1;
    m->consumer_tp_rank = 0;
    m->block_ids = ids;
    m->num_blocks = n;
}

static void forged_remote_blocks_refused(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 600, write_mode, write_mode));
    int pnotify = pdl_instance_notify_port(p, 0);
    for (int round = 0; round < 2; round++) {
        char tid[32];
        snprintf(tid, sizeof(tid), "tx-rb%d", round);
        tc_push_leg_t l;
        assert_int_equal(tc_push_leg(&l, p, c, tid, (uint8_t)(50 + round), 8, NBLK, (uint32_t)(11 + round)), PDL_OK);
        pdl_error_t e;
        uint32_t other[NBLK] = {TOTAL - 1, TOTAL - 2}; /* not the decode's: its grant would refuse the writes */
        pdl_msg_t m;
        rb_msg(&m, tid, other, NBLK);
        if (round == 0) {
            assert_int_equal(pdl_instance_push(p, &l.pk, l.rid, l.pb, NBLK, &e), PDL_OK);
            send_from("127.0.0.2", pnotify, &m);
            assert_true(REACHED(p, remote_blocks_refused, 1));
        } else {
            send_from("127.0.0.2", pnotify, &m);
            assert_true(REACHED(p, remote_blocks_parked, 1));
            assert_int_equal(pdl_instance_push(p, &l.pk, l.rid, l.pb, NBLK, &e), PDL_OK);
            assert_int_equal(TC_GET(p, 0, remote_blocks_refused), 2); /* refused as the push was made */
        }
        m.block_ids = NULL; /* borrowed */
        m.num_blocks = 0;
        pdl_msg_clear(&m);
        pdl_recv_t *rv;
        assert_int_equal(pdl_instance_expect_push(c, &l.ck, l.rid, l.cb, NBLK, &rv, &e), PDL_OK);
        if (pdl_recv_wait(rv, 60000, &e) != PDL_OK)
            fail_msg("receive %s: %s", tid, e.msg);
        uint64_t checked = 0;
        assert_int_equal(tc_verify(c, 8, false, l.cb, NBLK, (uint32_t)(11 + round), &checked), 0);
        pdl_recv_free(rv);
        assert_true(tc_wait_for(tc_no_held, p, 60000));
        pdl_instance_free_blocks(c, l.cb, NBLK);
        tc_push_leg_clear(&l);
    }
    assert_int_equal(TC_GET(p, 0, write_failures), 0);
    printf("forged remote_blocks (after the push, parked before it) refused: 2; both pushes verified\n");
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* ---- nothing an unverified peer sends grows without bound --------------------------------------------- */

static void park_bounded(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 600, write_mode, write_mode));
    int pnotify = pdl_instance_notify_port(p, 0);
    /* More ids than the prefill has blocks: no push can take them, so they are never parked. */
    uint32_t big[TOTAL + 1];
    for (uint32_t i = 0; i <= TOTAL; i++)
        big[i] = i;
    pdl_msg_t m;
    rb_msg(&m, "tx-big", big, TOTAL + 1);
    send_from("127.0.0.2", pnotify, &m);
    assert_true(REACHED(p, remote_blocks_refused, 1));
    assert_int_equal(TC_GET(p, 0, remote_blocks_parked), 0);
    /* 1,100 made-up transfers from 127.0.0.2 fill the table (1,024 entries). */
    raw_t w;
    raw_open(&w, "127.0.0.2", pnotify);
    uint32_t ids[NBLK] = {0, 1};
    for (int i = 0; i < 1100; i++) {
        snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-junk-%d", i);
        m.block_ids = ids;
        m.num_blocks = NBLK;
        raw_send(&w, &m);
    }
    assert_true(REACHED(p, remote_blocks_received, 1100));
    raw_close(&w);
    /* received counts a message as it arrives, parked/dropped once it is handled: wait for both. */
    assert_true(REACHED(p, remote_blocks_dropped, 1100 - 1024));
    assert_int_equal(TC_GET(p, 0, remote_blocks_parked), 1024);
    assert_int_equal(TC_GET(p, 0, remote_blocks_dropped), 1100 - 1024);
    /* The real decode (127.0.0.1) parks its remote_blocks before the push: one of 127.0.0.2's goes. */
    tc_push_leg_t l;
    assert_int_equal(tc_push_leg(&l, p, c, "tx-real", 60, 8, NBLK, 13), PDL_OK);
    pdl_recv_t *rv;
    pdl_error_t e;
    assert_int_equal(pdl_instance_expect_push(c, &l.ck, l.rid, l.cb, NBLK, &rv, &e), PDL_OK);
    assert_true(REACHED(p, remote_blocks_parked, 1025));
    assert_int_equal(TC_GET(p, 0, remote_blocks_evicted), 1);
    assert_int_equal(pdl_instance_push(p, &l.pk, l.rid, l.pb, NBLK, &e), PDL_OK);
    if (pdl_recv_wait(rv, 60000, &e) != PDL_OK)
        fail_msg("receive: %s", e.msg);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, l.cb, NBLK, 13, &checked), 0);
    pdl_recv_free(rv);
    printf("park: %u ids refused; 1,100 junk lists from one host: 1,024 parked, %llu dropped; the real one parked "
           "(1 junk evicted) and verified\n",
           TOTAL + 1, (unsigned long long)TC_GET(p, 0, remote_blocks_dropped));
    m.block_ids = NULL;
    m.num_blocks = 0;
    pdl_msg_clear(&m);
    tc_push_leg_clear(&l);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* Params of a transfer at a producer that is not there: handshake port `hs` (nothing listens), notify `nt`. */
static void bogus_params(const char *tid, int hs, int nt, pdl_kv_params_t *kp)
{
    pdl_kv_params_init(kp);
    kp->do_remote_prefill = true;
    snprintf(kp->transfer_id, sizeof(kp->transfer_id), "%s", tid);
    snprintf(kp->remote_host, sizeof(kp->remote_host), "127.0.0.1");
    kp->remote_handshake_port = hs;
    kp->remote_notify_port = nt;
    kp->tp_size = 1;
    kp->remote_block_ids = malloc(sizeof(uint32_t) * NBLK);
    kp->remote_block_ids[0] = 0;
    kp->remote_block_ids[1] = 1;
    kp->num_remote_blocks = NBLK;
    kp->has_remote_block_ids = true;
}

static void failed_release_needs_verified_producer(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, NULL);
    assert_non_null(c);
    uint32_t cb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    for (int i = 0; i < 20; i++) {
        pdl_kv_params_t kp;
        char tid[32];
        snprintf(tid, sizeof(tid), "tx-nowhere-%d", i);
        bogus_params(tid, 1, 400 + i, &kp); /* port 1: nothing listens, its handshake is refused at once */
        pdl_error_t e;
        assert_true(tc_pull_wait(c, &kp, cb, NBLK, &e) != PDL_OK);
        assert_int_equal(pdl_instance_abandon(c, &kp, NULL, &e), PDL_OK);
        pdl_kv_params_clear(&kp);
    }
    assert_true(REACHED(c, releases_unverified, 40));
    assert_int_equal(TC_GET(c, 0, releases_sent), 0);
    assert_int_equal(TC_GET(c, 0, dealers_refused), 0);
    printf("20 failed pulls + 20 abandons naming a producer that never answered: 0 releases sent, 40 withheld\n");
    pdl_instance_destroy(c);
}

static void dealer_cap(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 600, NULL, NULL));
    uint32_t pb[NBLK], cb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    assert_int_equal(tc_hold_filled(p, "tx-first", 8, false, pb, NBLK, 3), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "tx-first", pb, NBLK, &kp);
    pdl_error_t e;
    assert_int_equal(tc_pull_wait(c, &kp, cb, NBLK, &e), PDL_OK); /* the producer is verified now */
    assert_true(tc_wait_for(tc_no_held, p, 60000));
    /* 300 requests for transfers it does not hold, each naming a new notify port: every read is refused
     * (no grant) and a failed release goes to each port. */
    int n = 300;
    for (int i = 0; i < n; i++) {
        pdl_kv_params_t bad;
        char tid[32];
        snprintf(tid, sizeof(tid), "tx-notheld-%d", i);
        bogus_params(tid, kp.remote_handshake_port, 400 + i, &bad); /* privileged: nothing of ours listens */
        assert_true(tc_pull_wait(c, &bad, cb, NBLK, &e) != PDL_OK);
        pdl_kv_params_clear(&bad);
    }
    uint64_t evicted = TC_GET(c, 0, dealers_evicted);
    pdl_socket_stats_t sk[PDL_SOCKETS_SHARES];
    pdl_instance_sockets(c, sk);
    int unverified_cap = sk[PDL_SOCKETS_UNVERIFIED].cap;
    assert_true(sk[PDL_SOCKETS_UNVERIFIED].open <= unverified_cap);
    assert_true(evicted >= (uint64_t)(n - unverified_cap));
    assert_int_equal(TC_GET(c, 0, dealers_refused), 0);
    /* A real transfer still works, and its release frees the hold. */
    assert_int_equal(tc_hold_filled(p, "tx-after", 8, false, pb, NBLK, 5), PDL_OK);
    pdl_kv_params_t kp2;
    tc_params(p, "tx-after", pb, NBLK, &kp2);
    assert_int_equal(tc_pull_wait(c, &kp2, cb, NBLK, &e), PDL_OK);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, cb, NBLK, 5, &checked), 0);
    assert_true(tc_wait_for(tc_no_held, p, 60000));
    printf("%d failed releases to new notify ports: %llu DEALERs evicted to stay within %d unverified; a real pull "
           "then verified and freed its hold\n",
           n, (unsigned long long)evicted, unverified_cap);
    pdl_kv_params_clear(&kp);
    pdl_kv_params_clear(&kp2);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(first_reader_is_not_the_consumer),
        cmocka_unit_test(forged_keepalive_refused),
        cmocka_unit_test(forged_write_done_refused),
        cmocka_unit_test(forged_remote_blocks_refused),
        cmocka_unit_test(park_bounded),
        cmocka_unit_test(failed_release_needs_verified_producer),
        cmocka_unit_test(dealer_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
