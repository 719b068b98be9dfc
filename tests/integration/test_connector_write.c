/*
 * test_connector_write.c -- WRITE mode with heterogeneous TP end to end over real sockets, in one
 * process (docs/protocol.md#write-flow): consumers send remote_blocks, producer ranks handshake with the
 * consumer ranks of their write plans, push their pieces with batched WRITEs, send write_done, and
 * free their blocks; consumers count write_done per rank.
 *
 * For each topology: every byte on every consumer rank is verified; every consumer rank counts exactly
 * expected_write_done(P, D) per transfer; every producer rank receives the block list exactly once per
 * transfer and resolves it once; no producer block stays held. Half of the transfers have the
 * remote_blocks arrive before the push (parked), half after. Then: a push whose remote_blocks never
 * come is reaped (expired), a failed write reaches the consumer as a load error, and an instance
 * refuses WRITE mode unless the program opts in. Layer by layer (pdl_instance_push_start/_layers): each
 * layer lands on every consumer rank once it is said final and write_done follows the last; a push whose
 * layers never all come fails at transfer_timeout; an abandon or the producer's destroy ends the wait.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <zmq.h>

#include "test_connector_util.h"
#include "test_connector_check.h"
#include "common/clock.h"

#define NBLK 3
#define TOTAL_BLOCKS 24

static void write_mode(pdl_instance_config_t *c)
{
    c->conn.read_mode = false;
    c->allow_write_mode = true;
}

typedef struct parked_wait {
    pdl_instance_t *p;
    uint64_t want;
} parked_wait_t;

static bool parked_reached(void *arg)
{
    parked_wait_t *w = arg;
    return TC_SUM(w->p, remote_blocks_parked) >= w->want;
}

static void run_case(const tc_topo_t *tc)
{
    pdl_instance_t *prod[2] = {0}, *cons[2] = {0};
    tc_events_t *ev = calloc((size_t)tc->nprod, sizeof(tc_events_t));
    assert_non_null(ev);
    tc_topo_open(tc, TOTAL_BLOCKS, write_mode, prod, cons, ev);
    int expected = 0;
    assert_int_equal(pdl_topo_expected_write_done(tc->P, tc->D, &expected, NULL), PDL_OK);
    int T = tc->transfers;
    uint32_t pblk[16][NBLK], cblk[16][NBLK];
    pdl_recv_t *rvs[16];
    int per_prod[2] = {0, 0}, per_cons[2] = {0, 0}, parked_prod[2] = {0, 0};
    for (int t = 0; t < T; t++) {
        pdl_instance_t *p = prod[t % tc->nprod], *c = cons[t % tc->ncons];
        per_prod[t % tc->nprod]++;
        per_cons[t % tc->ncons]++;
        char tid[64], rid[1024];
        snprintf(tid, sizeof(tid), "tx-w-%s-%d", tc->name, t);
        assert_true(tc_request_id(p, c, t, rid, sizeof(rid)));
        tc_topo_blocks(p, c, t, NBLK, pblk[t], cblk[t]);
        tc_fill(p, tc->g.heads, tc->g.mla, pblk[t], NBLK, (uint32_t)t + 1);
        pdl_kv_params_t pk, ck;
        tc_leg_params(tid, tc->D, &pk);
        tc_leg_params(tid, tc->P, &ck);
        pdl_error_t e;
        bool park = t % 2 == 1;
        if (park) {
            /* remote_blocks first: every producer rank parks them until the push */
            parked_prod[t % tc->nprod]++;
            assert_int_equal(pdl_instance_expect_push(c, &ck, rid, cblk[t], NBLK, &rvs[t], &e), PDL_OK);
            parked_wait_t w = {p, (uint64_t)parked_prod[t % tc->nprod] * (uint64_t)tc->P};
            assert_true(tc_wait_for(parked_reached, &w, 20000));
            if (pdl_instance_push(p, &pk, rid, pblk[t], NBLK, &e) != PDL_OK)
                fail_msg("push: %s", e.msg);
        } else {
            if (pdl_instance_push(p, &pk, rid, pblk[t], NBLK, &e) != PDL_OK)
                fail_msg("push: %s", e.msg);
            assert_int_equal(pdl_instance_expect_push(c, &ck, rid, cblk[t], NBLK, &rvs[t], &e), PDL_OK);
        }
        pdl_kv_params_clear(&pk);
        pdl_kv_params_clear(&ck);
    }
    for (int t = 0; t < T; t++) {
        pdl_error_t e;
        pdl_status_t st = pdl_recv_wait(rvs[t], 30000, &e);
        if (st != PDL_OK)
            fail_msg("%s transfer %d: %s", tc->name, t, e.msg);
        for (int d = 0; d < tc->D; d++)
            assert_int_equal(pdl_recv_write_done(rvs[t], d), expected);
        pdl_recv_free(rvs[t]);
    }
    uint64_t checked = tc_topo_verify(tc, cons, &cblk[0][0], NBLK);

    pdl_instance_t *plist[3] = {prod[0], prod[1], NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    uint64_t written = 0, rb_sent = 0, rb_recv = 0, wd_sent = 0, wd_recv = 0;
    for (int i = 0; i < tc->nprod; i++) {
        for (int r = 0; r < tc->P; r++) {
            assert_int_equal(atomic_load(&ev[i].reported[r]), per_prod[i]);
            assert_int_equal(atomic_load(&ev[i].expired[r]), 0);
            assert_int_equal(TC_GET(prod[i], r, transfers), (uint64_t)per_prod[i]);
            /* the block list reaches every producer rank exactly once per transfer */
            assert_int_equal(TC_GET(prod[i], r, remote_blocks_received), (uint64_t)per_prod[i]);
            assert_int_equal(TC_GET(prod[i], r, remote_blocks_parked), (uint64_t)parked_prod[i]);
            assert_int_equal(TC_GET(prod[i], r, remote_blocks_dropped), 0);
            assert_int_equal(TC_GET(prod[i], r, write_failures), 0);
            assert_int_equal(TC_GET(prod[i], r, expired), 0);
            assert_int_equal(TC_GET(prod[i], r, dropped_malformed), 0);
        }
        assert_int_equal(atomic_load(&ev[i].freed), per_prod[i]);
        assert_int_equal(pdl_instance_held_blocks(prod[i]), 0);
        assert_int_equal(pdl_instance_free_block_count(prod[i]), TOTAL_BLOCKS);
        written += TC_SUM(prod[i], bytes);
        rb_recv += TC_SUM(prod[i], remote_blocks_received);
        wd_sent += TC_SUM(prod[i], write_done_sent);
    }
    for (int j = 0; j < tc->ncons; j++) {
        for (int d = 0; d < tc->D; d++) {
            assert_int_equal(TC_GET(cons[j], d, write_done_received), (uint64_t)(per_cons[j] * expected));
            assert_int_equal(TC_GET(cons[j], d, write_done_late), 0);
            assert_int_equal(TC_GET(cons[j], d, dropped_malformed), 0);
        }
        rb_sent += TC_SUM(cons[j], remote_blocks_sent);
        wd_recv += TC_SUM(cons[j], write_done_received);
        assert_int_equal(pdl_instance_free_block_count(cons[j]), TOTAL_BLOCKS);
    }
    /* each consumer rank's blocks were written exactly once, byte for byte */
    assert_int_equal(written, checked);
    assert_int_equal(rb_sent, rb_recv);
    assert_int_equal(wd_sent, wd_recv);
    printf("write %-24s P%-2d D%-2d H%-2d %s %s: %d transfers (%d parked), %llu KV bytes pushed and verified, "
           "%llu remote_blocks, %llu write_done\n",
           tc->name, tc->P, tc->D, tc->g.heads, tc->g.mla ? "mla" : pdl_layout_order_name(tc->g.order),
           pdl_backend_name(tc->backend), T, T / 2, (unsigned long long)checked, (unsigned long long)rb_sent,
           (unsigned long long)wd_recv);
    for (int j = 0; j < tc->ncons; j++)
        pdl_instance_destroy(cons[j]);
    for (int i = 0; i < tc->nprod; i++)
        pdl_instance_destroy(prod[i]);
    free(ev);
}

#define WRITE_CASE(id, ...) TC_TOPO_CASE(write, run_case, id, __VA_ARGS__)
TC_TOPOLOGIES(WRITE_CASE)
WRITE_CASE(p4_d2_nhd_tcp, "P4-D2-H8-NHD-tcp", 4, 2, 1, 1, 2, tc_geo_nhd(8, 2), PDL_BACKEND_TCP)

/* A push whose consumer never sends remote_blocks is reaped after defer_timeout on every rank. */
static void write_expired_without_remote_blocks(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 4, 8, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 0.3, 60, write_mode, write_mode));
    tc_events_t ev;
    tc_count_events(p, &ev);
    uint32_t blk[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, blk, NULL), PDL_OK);
    char rid[1024];
    assert_true(tc_request_id(p, c, 1, rid, sizeof(rid)));
    pdl_kv_params_t pk;
    tc_leg_params("tx-never", 8, &pk);
    pdl_error_t e;
    assert_int_equal(pdl_instance_push(p, &pk, rid, blk, NBLK, &e), PDL_OK);
    /* a second push of the same transfer is refused */
    assert_int_equal(pdl_instance_push(p, &pk, rid, blk, NBLK, &e), PDL_ERR_BAD_STATE);
    pdl_kv_params_clear(&pk);
    assert_int_equal(pdl_instance_held_blocks(p), NBLK);
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    for (int r = 0; r < 4; r++) {
        assert_int_equal(TC_GET(p, r, expired), 1);
        assert_int_equal(atomic_load(&ev.expired[r]), 1);
        assert_int_equal(atomic_load(&ev.reported[r]), 0);
        assert_int_equal(TC_GET(p, r, write_done_sent), 0);
    }
    assert_int_equal(atomic_load(&ev.freed), 1);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL_BLOCKS);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* A producer that cannot write (the consumer asks for more blocks than the push holds) says
 * write_done "failed" to every consumer rank; the consumer's receive fails (a load error) only after
 * every rank counted all its write_done; the producer still frees its blocks. */
static void write_failed_is_load_error(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 8, 4, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 60, 60, write_mode, write_mode));
    uint32_t pblk[2], cblk[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(p, 2, pblk, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cblk, NULL), PDL_OK);
    char rid[1024];
    assert_true(tc_request_id(p, c, 2, rid, sizeof(rid)));
    pdl_kv_params_t pk, ck;
    tc_leg_params("tx-fail", 4, &pk);
    tc_leg_params("tx-fail", 8, &ck);
    pdl_error_t e;
    pdl_recv_t *rv = NULL;
    assert_int_equal(pdl_instance_expect_push(c, &ck, rid, cblk, NBLK, &rv, &e), PDL_OK);
    assert_int_equal(pdl_instance_push(p, &pk, rid, pblk, 2, &e), PDL_OK);
    pdl_status_t st = pdl_recv_wait(rv, 30000, &e);
    assert_int_not_equal(st, PDL_OK);
    assert_int_not_equal(st, PDL_ERR_TIMEOUT);
    assert_int_not_equal(st, PDL_INPROGRESS);
    assert_non_null(strstr(e.msg, "failed"));
    for (int d = 0; d < 4; d++) {
        assert_int_equal(pdl_recv_write_done(rv, d), 2); /* P8/D4: two producer ranks per consumer rank */
        assert_int_equal(TC_GET(c, d, write_done_failed_status), 2);
    }
    pdl_recv_free(rv);
    pdl_instance_free_blocks(c, cblk, NBLK);
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    for (int r = 0; r < 8; r++) {
        assert_int_equal(TC_GET(p, r, write_failures), 1);
        assert_int_equal(TC_GET(p, r, expired), 0);
    }
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL_BLOCKS);
    pdl_kv_params_clear(&pk);
    pdl_kv_params_clear(&ck);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* Send one notify frame to `port` on 127.0.0.1 from a fresh DEALER (closed with linger, so it leaves). */
static void send_frame(void *zctx, int port, const pdl_msg_t *m)
{
    pdl_bytes_t b = {0};
    assert_int_equal(pdl_wire_encode_msg(m, &b, NULL), PDL_OK);
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    assert_non_null(s);
    int linger = 5000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_connect(s, ep), 0);
    assert_int_equal(zmq_send(s, b.data, b.len, 0), (int)b.len);
    zmq_close(s);
    pdl_bytes_free(&b);
}

static void write_done_msg(pdl_msg_t *m, const char *tid, int P, int prank, bool ok)
{
    pdl_msg_init(m, PDL_MSG_WRITE_DONE);
    snprintf(m->transfer_id, sizeof(m->transfer_id), "%s", tid);
    m->status = ok ? PDL_RELEASE_OK : PDL_RELEASE_FAILED;
    m->producer_tp_size = P;
    m->producer_tp_rank = prank;
}

typedef struct ctr_wait {
    pdl_instance_t *inst;
    size_t off;
    uint64_t want;
} ctr_wait_t;

static bool ctr_reached(void *arg)
{
    ctr_wait_t *w = arg;
    return tc_sum(w->inst, w->off) >= w->want;
}

/* A receive of transfer `tid` into NBLK new blocks of c (cblk) from a producer of TP producer_tp whose
 * address (privileged ports on 127.0.0.1) points at nothing: its remote_blocks stay queued in libzmq and
 * no push ever comes. *ck holds the params (the caller clears them). */
static pdl_recv_t *expect_from_nowhere(pdl_instance_t *c, const char *tid, int producer_tp, uint32_t *cblk,
                                       pdl_kv_params_t *ck)
{
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cblk, NULL), PDL_OK);
    tc_leg_params(tid, producer_tp, ck);
    snprintf(ck->remote_host, sizeof(ck->remote_host), "127.0.0.1");
    ck->remote_handshake_port = 1000;
    ck->remote_notify_port = 1100;
    pdl_error_t e;
    pdl_recv_t *rv = NULL;
    if (pdl_instance_expect_push(c, ck, NULL, cblk, NBLK, &rv, &e) != PDL_OK)
        fail_msg("expect_push %s: %s", tid, e.msg);
    return rv;
}

/* Hostile and stray write_done on a consumer (P8/D4, forged from a socket): one from a producer rank
 * outside the consumer rank's group and a duplicate are not counted (write_done_late); the receive
 * completes on exactly the two genuine ones per rank. A remote_blocks sent to a consumer is dropped. */
static void write_done_outside_group_and_duplicates(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 4, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 60, write_mode);
    assert_non_null(c);
    uint32_t cblk[NBLK];
    pdl_kv_params_t ck;
    pdl_recv_t *rv = expect_from_nowhere(c, "tx-forged", 8, cblk, &ck);
    pdl_error_t e;
    assert_int_equal(TC_SUM(c, remote_blocks_sent), 8); /* each consumer rank to its 2 producer ranks */
    void *zctx = zmq_ctx_new();
    assert_non_null(zctx);
    for (int d = 0; d < 4; d++) {
        int port = pdl_instance_notify_port(c, d);
        pdl_msg_t m;
        write_done_msg(&m, "tx-forged", 8, (2 * d + 2) % 8, true); /* outside the group {2d, 2d+1} */
        send_frame(zctx, port, &m);
        write_done_msg(&m, "tx-forged", 8, 2 * d, true);
        send_frame(zctx, port, &m);
        send_frame(zctx, port, &m); /* duplicate */
        write_done_msg(&m, "tx-forged", 8, 2 * d + 1, true);
        send_frame(zctx, port, &m);
    }
    pdl_msg_t rb;
    pdl_msg_init(&rb, PDL_MSG_REMOTE_BLOCKS);
    snprintf(rb.transfer_id, sizeof(rb.transfer_id), "tx-forged");
    snprintf(rb.req_id, sizeof(rb.req_id), "r");
    rb.block_ids = cblk;
    rb.num_blocks = NBLK;
    send_frame(zctx, pdl_instance_notify_port(c, 0), &rb);
    zmq_ctx_term(zctx);
    assert_int_equal(pdl_recv_wait(rv, 30000, &e), PDL_OK);
    for (int d = 0; d < 4; d++)
        assert_int_equal(pdl_recv_write_done(rv, d), 2);
    ctr_wait_t w = {c, offsetof(pdl_rank_counters_t, write_done_late), 8};
    assert_true(tc_wait_for(ctr_reached, &w, 20000));
    ctr_wait_t w2 = {c, offsetof(pdl_rank_counters_t, dropped_malformed), 1};
    assert_true(tc_wait_for(ctr_reached, &w2, 20000));
    for (int d = 0; d < 4; d++) {
        assert_int_equal(TC_GET(c, d, write_done_received), 2);
        assert_int_equal(TC_GET(c, d, write_done_late), 2);
    }
    assert_int_equal(TC_SUM(c, dropped_malformed), 1);
    assert_int_equal(TC_SUM(c, remote_blocks_received), 0);
    pdl_recv_free(rv);
    pdl_kv_params_clear(&ck);
    pdl_instance_free_blocks(c, cblk, NBLK);
    pdl_instance_destroy(c);
}

/* A router before vllm-router PR #192 sent the prefill remote_tp_size 1: the producer takes the
 * consumer's TP from remote_blocks (consumer_tp_size, a pdlink key) and still writes every head right. */
static void write_consumer_tp_from_remote_blocks(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 4, 8, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 60, 60, write_mode, write_mode));
    uint32_t pblk[NBLK], cblk[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, pblk, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cblk, NULL), PDL_OK);
    tc_fill(p, 8, false, pblk, NBLK, 77);
    char rid[1024];
    assert_true(tc_request_id(p, c, 3, rid, sizeof(rid)));
    pdl_kv_params_t pk, ck;
    tc_leg_params("tx-oldrouter", 1, &pk);
    tc_leg_params("tx-oldrouter", 4, &ck);
    pdl_error_t e;
    pdl_recv_t *rv = NULL;
    assert_int_equal(pdl_instance_push(p, &pk, rid, pblk, NBLK, &e), PDL_OK);
    assert_int_equal(pdl_instance_expect_push(c, &ck, rid, cblk, NBLK, &rv, &e), PDL_OK);
    if (pdl_recv_wait(rv, 30000, &e) != PDL_OK)
        fail_msg("receive: %s", e.msg);
    for (int d = 0; d < 8; d++)
        assert_int_equal(pdl_recv_write_done(rv, d), 1);
    pdl_recv_free(rv);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, cblk, NBLK, 77, &checked), 0);
    assert_true(checked > 0);
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    assert_int_equal(TC_SUM(p, write_failures), 0);
    pdl_kv_params_clear(&pk);
    pdl_kv_params_clear(&ck);
    pdl_instance_free_blocks(c, cblk, NBLK);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void fast_timeout(pdl_instance_config_t *c)
{
    write_mode(c);
    c->conn.transfer_timeout_s = 0.3;
}

/* A push that never comes: the consumer's receive fails with a timeout (a load error) on every rank. */
static void write_receive_times_out(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 2, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 60, fast_timeout);
    assert_non_null(c);
    uint32_t cblk[NBLK];
    pdl_kv_params_t ck;
    pdl_recv_t *rv = expect_from_nowhere(c, "tx-silent", 4, cblk, &ck);
    pdl_error_t e;
    assert_int_equal(pdl_recv_wait(rv, 30000, &e), PDL_ERR_TIMEOUT);
    assert_non_null(strstr(e.msg, "transfer_timeout"));
    assert_int_equal(pdl_recv_write_done(rv, 0), 0);
    pdl_recv_free(rv);
    pdl_kv_params_clear(&ck);
    pdl_instance_free_blocks(c, cblk, NBLK);
    assert_int_equal(pdl_instance_free_block_count(c), TOTAL_BLOCKS);
    pdl_instance_destroy(c);
}

/* ---- abandon: nothing pinned until a timeout by a request that will not complete ---- */

/* defer_timeout and transfer_timeout 600 s: anything freed within the test was freed by the abandon. */
static void write_mode_slow(pdl_instance_config_t *c)
{
    write_mode(c);
    c->conn.transfer_timeout_s = 600;
}

/* A decode that will not take a push (rejected or failed) abandons it: the prefill frees the push's
 * blocks at once -- pushed before the abandon (P4/D8) and pushed after it (the abandon parked, P8/D4).
 * Before, the prefill kept them until its defer_timeout. */
static void abandon_push(int P, int D, bool abandon_first)
{
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, P, D, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 600, 600, write_mode_slow, write_mode_slow));
    tc_events_t ev;
    tc_count_events(p, &ev);
    uint32_t blk[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, blk, NULL), PDL_OK);
    char rid[1024];
    assert_true(tc_request_id(p, c, 7, rid, sizeof(rid)));
    pdl_kv_params_t pk, ck;
    tc_leg_params("tx-abandoned", D, &pk);
    tc_leg_params("tx-abandoned", P, &ck);
    pdl_error_t e;
    if (!abandon_first)
        assert_int_equal(pdl_instance_push(p, &pk, rid, blk, NBLK, &e), PDL_OK);
    assert_int_equal(pdl_instance_abandon(c, &ck, rid, &e), PDL_OK);
    if (abandon_first) {
        /* Each producer rank parks the abandon (no push yet, counted); the push then finds it. */
        ctr_wait_t w = {p, offsetof(pdl_rank_counters_t, pushes_abandoned), (uint64_t)P};
        assert_true(tc_wait_for(ctr_reached, &w, 20000));
        assert_int_equal(pdl_instance_push(p, &pk, rid, blk, NBLK, &e), PDL_OK);
    }
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    assert_int_equal(TC_SUM(p, pushes_abandoned), (uint64_t)P);
    assert_int_equal(TC_SUM(p, write_done_sent), 0);
    assert_int_equal(atomic_load(&ev.freed), 1);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL_BLOCKS);
    assert_int_equal(TC_GET(c, 0, transfers_abandoned), 1);
    pdl_kv_params_clear(&pk);
    pdl_kv_params_clear(&ck);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void write_abandon_frees_push_p4d8(void **state)
{
    (void)state;
    abandon_push(4, 8, false);
}

static void write_abandon_before_push_p8d4(void **state)
{
    (void)state;
    abandon_push(8, 4, true);
}

/* A prefill that will not push (its request was rejected or failed) abandons the transfer: every
 * consumer rank gets its failed write_done, so the decode's receive fails now instead of at
 * transfer_timeout (600 s here) and the decode frees its blocks. */
static void write_producer_abandon_fails_receive(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 8, 4, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 600, 600, write_mode_slow, write_mode_slow));
    uint32_t cblk[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cblk, NULL), PDL_OK);
    char rid[1024];
    assert_true(tc_request_id(p, c, 8, rid, sizeof(rid)));
    pdl_kv_params_t pk, ck;
    tc_leg_params("tx-no-prefill", 4, &pk);
    tc_leg_params("tx-no-prefill", 8, &ck);
    pdl_error_t e;
    pdl_recv_t *rv = NULL;
    assert_int_equal(pdl_instance_expect_push(c, &ck, rid, cblk, NBLK, &rv, &e), PDL_OK);
    assert_int_equal(pdl_instance_abandon(p, &pk, rid, &e), PDL_OK);
    /* Waits at most 60 s, a tenth of transfer_timeout: only the abandon can end it in time. */
    pdl_status_t st = pdl_recv_wait(rv, 60000, &e);
    assert_int_not_equal(st, PDL_OK);
    assert_int_not_equal(st, PDL_ERR_TIMEOUT);
    assert_int_not_equal(st, PDL_INPROGRESS);
    assert_non_null(strstr(e.msg, "failed"));
    for (int d = 0; d < 4; d++)
        assert_int_equal(pdl_recv_write_done(rv, d), 2);
    pdl_recv_free(rv);
    pdl_instance_free_blocks(c, cblk, NBLK);
    assert_int_equal(pdl_instance_free_block_count(c), TOTAL_BLOCKS);
    assert_int_equal(TC_GET(p, 0, transfers_abandoned), 1);
    /* remote_blocks the decode sent before the abandon were parked on the producer, then dropped. */
    pdl_kv_params_clear(&pk);
    pdl_kv_params_clear(&ck);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* The same when the prefill gives up before the decode's receive starts (the router sends both legs at
 * once, so the abandon can win the race): the failed write_done are parked on the consumer and the
 * receive, when it comes, fails at once without sending remote_blocks. */
static void write_producer_abandon_before_receive(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 8, 4, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 600, 600, write_mode_slow, write_mode_slow));
    char rid[1024];
    assert_true(tc_request_id(p, c, 9, rid, sizeof(rid)));
    pdl_kv_params_t pk, ck;
    tc_leg_params("tx-refused-first", 4, &pk);
    tc_leg_params("tx-refused-first", 8, &ck);
    pdl_error_t e;
    assert_int_equal(pdl_instance_abandon(p, &pk, rid, &e), PDL_OK);
    /* P8/D4: each producer rank sends its failed write_done to its one consumer rank. */
    ctr_wait_t w = {c, offsetof(pdl_rank_counters_t, write_done_failed_status), 8};
    assert_true(tc_wait_for(ctr_reached, &w, 20000));
    uint32_t cblk[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cblk, NULL), PDL_OK);
    pdl_recv_t *rv = NULL;
    assert_int_equal(pdl_instance_expect_push(c, &ck, rid, cblk, NBLK, &rv, &e), PDL_OK);
    pdl_status_t st = pdl_recv_wait(rv, 60000, &e);
    assert_int_not_equal(st, PDL_OK);
    assert_int_not_equal(st, PDL_ERR_TIMEOUT);
    assert_int_not_equal(st, PDL_INPROGRESS);
    assert_non_null(strstr(e.msg, "abandoned"));
    assert_int_equal(TC_SUM(c, remote_blocks_sent), 0);
    pdl_recv_free(rv);
    pdl_instance_free_blocks(c, cblk, NBLK);
    assert_int_equal(pdl_instance_free_block_count(c), TOTAL_BLOCKS);
    pdl_kv_params_clear(&pk);
    pdl_kv_params_clear(&ck);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

typedef struct freed_at_least {
    tc_events_t *ev;
    int want;
} freed_at_least_t;

static bool freed_reached(void *arg)
{
    freed_at_least_t *f = arg;
    return atomic_load(&f->ev->freed) >= f->want;
}

/*
 * Pushes to a decode that is then destroyed (its remote_blocks never come) are given up by the
 * consumer-gone watch (watch.c) well before defer_timeout (600 s): every rank resolves as expired, the
 * blocks are freed, each push counted once in consumer_gone_freed. A push to a live decode stays, and
 * lands and verifies when that decode asks for it. Before, the pushes stayed held until defer_timeout.
 */
static void write_gone_consumer_pushes_freed(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 600, write_mode_slow);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 2, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 600, write_mode_slow);
    pdl_instance_t *live = tc_instance(PDL_ROLE_CONSUMER, 1, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 600, write_mode_slow);
    assert_non_null(p);
    assert_non_null(c);
    assert_non_null(live);
    tc_events_t ev;
    tc_count_events(p, &ev);
    uint32_t blk[4][NBLK];
    char rid_live[1024];
    assert_true(tc_request_id(p, live, 40, rid_live, sizeof(rid_live)));
    for (int i = 0; i < 4; i++) {
        char tid[32], rid[1024];
        snprintf(tid, sizeof(tid), "tx-gone-%d", i);
        assert_true(tc_request_id(p, c, 41 + i, rid, sizeof(rid)));
        pdl_kv_params_t pk;
        tc_leg_params(tid, i < 3 ? 2 : 1, &pk);
        assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, blk[i], NULL), PDL_OK);
        tc_fill(p, g.heads, g.mla, blk[i], NBLK, (uint32_t)(50 + i));
        pdl_error_t e;
        if (pdl_instance_push(p, &pk, i < 3 ? rid : rid_live, blk[i], NBLK, &e) != PDL_OK)
            fail_msg("push %s: %s", tid, e.msg);
        pdl_kv_params_clear(&pk);
    }
    assert_int_equal(pdl_instance_held_transfers(p), 4);
    uint64_t t0 = pdl__clock_now_ns();
    pdl_instance_destroy(c);
    freed_at_least_t f = {&ev, 3};
    assert_true(tc_wait_for(freed_reached, &f, 30000));
    fprintf(stderr, "write: pushes to a destroyed decode freed %.2f s after it went (defer_timeout 600 s)\n",
            (pdl__clock_now_ns() - t0) / 1e9);
    assert_int_equal(TC_GET(p, 0, consumer_gone_freed), 3);
    assert_int_equal(atomic_load(&ev.freed), 3);
    assert_int_equal(atomic_load(&ev.expired_all), 3 * 2); /* every rank of each, and not by the reaper: */
    assert_int_equal(TC_SUM(p, expired), 0);
    assert_int_equal(pdl_instance_held_transfers(p), 1); /* the live decode's */
    assert_int_equal(pdl_instance_held_blocks(p), NBLK);
    assert_int_equal(TC_SUM(p, write_done_sent), 0); /* nothing was written to the gone decode */

    /* The live decode's push still lands. */
    uint32_t cb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(live, NBLK, cb, NULL), PDL_OK);
    pdl_kv_params_t ck;
    tc_leg_params("tx-gone-3", 2, &ck);
    pdl_recv_t *rv = NULL;
    pdl_error_t e;
    assert_int_equal(pdl_instance_expect_push(live, &ck, rid_live, cb, NBLK, &rv, &e), PDL_OK);
    if (pdl_recv_wait(rv, 60000, &e) != PDL_OK)
        fail_msg("live receive: %s", e.msg);
    pdl_recv_free(rv);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(live, g.heads, g.mla, cb, NBLK, 53, &checked), 0);
    assert_true(checked > 0);
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    assert_int_equal(TC_GET(p, 0, consumer_gone_freed), 3);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL_BLOCKS);
    pdl_kv_params_clear(&ck);
    pdl_instance_destroy(live);
    pdl_instance_destroy(p);
}

/* A WRITE-mode instance on the given port bases (to restart a consumer where it was). */
static pdl_instance_t *write_instance_at(pdl_role_t role, int tp, const tc_geo_t *g, pdl_backend_kind_t backend, int hs,
                                         int nt)
{
    pdl_instance_config_t c;
    pdl_instance_config_defaults(&c);
    pdl_connector_config_defaults(&c.conn);
    c.conn.role = role;
    c.conn.backend = backend;
    c.conn.handshake_port = hs;
    c.conn.notify_port = nt;
    c.conn.transfer_timeout_s = 20;
    c.conn.handshake_timeout_s = 5;
    write_mode(&c);
    c.model = (pdl_model_geometry_t){.num_layers = g->layers, .total_kv_heads = g->heads, .head_dim = g->head_dim,
                                     .elem_size = g->elem, .block_size = g->block_size, .is_mla = g->mla,
                                     .order = g->order, .kv_separate = g->kv_separate};
    c.tp_size = tp;
    c.dp_size = 1;
    c.num_blocks = TOTAL_BLOCKS;
    pdl_instance_t *inst = NULL;
    pdl_error_t e;
    if (pdl_instance_create(&c, &inst, &e) != PDL_OK)
        fail_msg("instance on ports %d/%d: %s", hs, nt, e.msg);
    return inst;
}

/* One push of NBLK blocks from p to c under tid; returns the consumer's result. */
static pdl_status_t push_once(pdl_instance_t *p, pdl_instance_t *c, const char *tid, int t, pdl_error_t *e)
{
    char rid[1024];
    assert_true(tc_request_id(p, c, t, rid, sizeof(rid)));
    uint32_t pblk[NBLK], cblk[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, pblk, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cblk, NULL), PDL_OK);
    pdl_kv_params_t pk, ck;
    tc_leg_params(tid, pdl_instance_tp_size(c), &pk);
    tc_leg_params(tid, pdl_instance_tp_size(p), &ck);
    pdl_recv_t *rv = NULL;
    assert_int_equal(pdl_instance_expect_push(c, &ck, rid, cblk, NBLK, &rv, e), PDL_OK);
    assert_int_equal(pdl_instance_push(p, &pk, rid, pblk, NBLK, e), PDL_OK);
    pdl_status_t st = pdl_recv_wait(rv, 60000, e);
    pdl_recv_free(rv);
    pdl_instance_free_blocks(c, cblk, NBLK);
    pdl_kv_params_clear(&pk);
    pdl_kv_params_clear(&ck);
    return st;
}

/* A consumer that restarts on the same ports: the producer's cached peers of BOTH consumer ranks are
 * stale. The first push after the restart finds that out, evicts every stale peer, handshakes afresh
 * and writes again ONCE (xfer.c), so it succeeds. (Before the stale-session retry that first push
 * failed with "peer gone"; before the shared executor a push evicted only the first failed peer, and
 * every later push to the restarted consumer failed.) */
static void write_first_push_after_consumer_restart(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 2, &g, TOTAL_BLOCKS, PDL_BACKEND_TCP, 60, 60, write_mode, write_mode));
    pdl_error_t e;
    if (push_once(p, c, "tx-before", 1, &e) != PDL_OK)
        fail_msg("push before the restart: %s", e.msg);
    assert_int_equal(TC_GET(p, 0, handshakes), 2); /* one per consumer rank, now cached */
    int hs = pdl_instance_handshake_port(c, 0), nt = pdl_instance_notify_port(c, 0);
    pdl_instance_destroy(c);
    c = write_instance_at(PDL_ROLE_CONSUMER, 2, &g, PDL_BACKEND_TCP, hs, nt);
    pdl_status_t st = push_once(p, c, "tx-stale", 2, &e);
    if (st != PDL_OK)
        fail_msg("first push after the restart failed: %s", e.msg);
    assert_int_equal(TC_GET(p, 0, write_failures), 0);
    assert_int_equal(TC_GET(p, 0, stale_retries), 1);
    assert_int_equal(TC_GET(p, 0, handshakes), 4); /* both consumer ranks handshaked again */
    if (push_once(p, c, "tx-after", 3, &e) != PDL_OK)
        fail_msg("push after the restart: %s", e.msg);
    assert_int_equal(TC_GET(p, 0, handshakes), 4);
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* Time is counted per direction: pushes add to write_ns (pdlink_write_seconds_total) and never to
 * read_ns (pdlink_read_seconds_total), on the producer and on the consumer. (Before the shared
 * executor a push's time went to read_ns.) */
static void write_time_counted_as_write(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 2, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 60, 60, write_mode, write_mode));
    pdl_error_t e;
    if (push_once(p, c, "tx-timed", 1, &e) != PDL_OK)
        fail_msg("push: %s", e.msg);
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    for (int r = 0; r < 2; r++) {
        assert_int_equal(TC_GET(p, r, read_ns), 0);
        assert_true(TC_GET(p, r, write_ns) > 0);
        assert_int_equal(TC_GET(c, r, read_ns), 0);
        assert_int_equal(TC_GET(c, r, write_ns), 0);
    }
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* ---- layer by layer (pdl_instance_push_start / pdl_instance_push_layers) ---- */

#define LAYERS 4

/* Fill layer l of `blocks` on every rank of producer p (tc_fill does every layer at once). */
static void fill_layer(pdl_instance_t *p, const tc_geo_t *g, const uint32_t *blocks, int l, uint32_t seed)
{
    int tp = pdl_instance_tp_size(p);
    for (int r = 0; r < tp; r++)
        tc_walk_layer(pdl_instance_geometry(p, r), pdl_instance_kv_layer(p, r, l), l,
                      tc_first_head(tp, g->heads, g->mla, r), blocks, NBLK, seed, false, NULL);
}

typedef struct layer_check {
    pdl_instance_t *c;
    const tc_geo_t *g;
    const uint32_t *blocks;
    int layer;
    uint32_t seed;
} layer_check_t;

/* Every rank of consumer lc->c holds layer lc->layer of the pushed blocks, byte for byte. The consumer's
 * memory is read through its own mapping while the producer may still write other layers into it. */
static bool layer_landed(void *arg)
{
    const layer_check_t *lc = arg;
    int tp = pdl_instance_tp_size(lc->c);
    uint64_t bad = 0, checked = 0;
    for (int r = 0; r < tp; r++)
        bad += tc_walk_layer(pdl_instance_geometry(lc->c, r), pdl_instance_kv_layer(lc->c, r, lc->layer), lc->layer,
                             tc_first_head(tp, lc->g->heads, lc->g->mla, r), lc->blocks, NBLK, lc->seed, true,
                             &checked);
    return bad == 0 && checked > 0;
}

/* What each layer-by-layer test starts from: a producer (TP P) and a consumer (TP D) of LAYERS layers
 * with their own tweaks and defer timeouts, NBLK blocks allocated on each, a request id naming both and
 * the two legs' params of transfer `tid`. */
typedef struct layered {
    tc_geo_t g;
    pdl_instance_t *p, *c;
    uint32_t pblk[NBLK], cblk[NBLK];
    char rid[1024];
    pdl_kv_params_t pk, ck;
    const char *tid;
} layered_t;

static void layered_open(layered_t *f, const char *tid, int P, int D, double pdefer, double cdefer,
                         void (*ptweak)(pdl_instance_config_t *), void (*ctweak)(pdl_instance_config_t *), int rid_n)
{
    f->g = tc_geo_default(8);
    f->g.layers = LAYERS;
    f->tid = tid;
    assert_true(tc_pair(&f->p, &f->c, P, D, &f->g, TOTAL_BLOCKS, PDL_BACKEND_SHM, pdefer, cdefer, ptweak, ctweak));
    assert_int_equal(pdl_instance_alloc_blocks(f->p, NBLK, f->pblk, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(f->c, NBLK, f->cblk, NULL), PDL_OK);
    assert_true(tc_request_id(f->p, f->c, rid_n, f->rid, sizeof(f->rid)));
    tc_leg_params(tid, D, &f->pk);
    tc_leg_params(tid, P, &f->ck);
}

/* pdl_instance_push_start of the fixture's push, then the consumer's expect_push (*rv). */
static void layered_start(layered_t *f, pdl_recv_t **rv)
{
    pdl_error_t e;
    if (pdl_instance_push_start(f->p, &f->pk, f->rid, f->pblk, NBLK, &e) != PDL_OK)
        fail_msg("push_start: %s", e.msg);
    assert_int_equal(pdl_instance_expect_push(f->c, &f->ck, f->rid, f->cblk, NBLK, rv, &e), PDL_OK);
}

/* Destroys what is left: the consumer (NULL when the test destroyed it) and the producer. */
static void layered_close(layered_t *f)
{
    pdl_kv_params_clear(&f->pk);
    pdl_kv_params_clear(&f->ck);
    if (f->c != NULL)
        pdl_instance_free_blocks(f->c, f->cblk, NBLK);
    pdl_instance_destroy(f->c);
    pdl_instance_destroy(f->p);
}

/* A push started before its KV is final (P to D): the decode's remote_blocks come first, every writer
 * handshakes and waits at its gate (push_layer_waits), and each layer is filled on the producer and
 * then said final. Every consumer rank holds layer 0 before layer 1 is final; no consumer rank counts a
 * write_done before the last layer; then every byte of every layer is right, as with a whole push. */
static void layered_push(int P, int D)
{
    layered_t f;
    layered_open(&f, "tx-layered", P, D, 60, 60, write_mode, write_mode, 20);
    pdl_instance_t *p = f.p, *c = f.c;
    pdl_error_t e;
    pdl_recv_t *rv = NULL;
    layered_start(&f, &rv);
    /* Every producer rank got its block list and waits for layer 0. */
    ctr_wait_t w = {p, offsetof(pdl_rank_counters_t, push_layer_waits), (uint64_t)P};
    assert_true(tc_wait_for(ctr_reached, &w, 20000));
    const uint32_t seed = 91;
    fill_layer(p, &f.g, f.pblk, 0, seed);
    assert_int_equal(pdl_instance_push_layers(p, "tx-layered", 1, &e), PDL_OK);
    layer_check_t lc = {c, &f.g, f.cblk, 0, seed};
    assert_true(tc_wait_for(layer_landed, &lc, 20000));
    /* Layer 1 is not final yet: nobody could have written it, and no write_done can have left. */
    lc.layer = 1;
    assert_false(layer_landed(&lc));
    assert_int_equal(pdl_recv_wait(rv, 0, &e), PDL_INPROGRESS);
    for (int d = 0; d < D; d++)
        assert_int_equal(pdl_recv_write_done(rv, d), 0);
    for (int l = 1; l < LAYERS; l++) {
        fill_layer(p, &f.g, f.pblk, l, seed);
        assert_int_equal(pdl_instance_push_layers(p, "tx-layered", l + 1, &e), PDL_OK);
        if (l + 1 < LAYERS) /* after the last one the push may be over at once */
            assert_int_equal(pdl_instance_push_layers(p, "tx-layered", l, &e), PDL_OK); /* smaller: ignored */
    }
    if (pdl_recv_wait(rv, 30000, &e) != PDL_OK)
        fail_msg("receive: %s", e.msg);
    int expected = 0;
    assert_int_equal(pdl_topo_expected_write_done(P, D, &expected, NULL), PDL_OK);
    for (int d = 0; d < D; d++)
        assert_int_equal(pdl_recv_write_done(rv, d), expected);
    pdl_recv_free(rv);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, f.g.heads, f.g.mla, f.cblk, NBLK, seed, &checked), 0);
    assert_int_equal(checked, tc_instance_bytes(c, LAYERS, NBLK));
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    assert_int_equal(TC_SUM(p, bytes), checked);
    assert_int_equal(TC_SUM(p, write_failures), 0);
    assert_true(TC_SUM(p, push_layer_waits) >= (uint64_t)P);
    /* The push is over: its layers can no longer be said. */
    assert_int_equal(pdl_instance_push_layers(p, "tx-layered", LAYERS, &e), PDL_ERR_NOT_FOUND);
    assert_non_null(strstr(e.msg, "tx-layered"));
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL_BLOCKS);
    layered_close(&f);
}

static void write_layered_push_p2_d4(void **state)
{
    (void)state;
    layered_push(2, 4);
}

static void write_layered_push_p4_d2(void **state)
{
    (void)state;
    layered_push(4, 2);
}

/* Every layer said final before the decode's remote_blocks come: the writers never wait, and the
 * push is written whole, as pdl_instance_push writes it. */
static void write_layered_push_final_before_remote_blocks(void **state)
{
    (void)state;
    layered_t f;
    layered_open(&f, "tx-final-first", 2, 2, 60, 60, write_mode, write_mode, 21);
    tc_fill(f.p, f.g.heads, f.g.mla, f.pblk, NBLK, 92);
    pdl_error_t e;
    assert_int_equal(pdl_instance_push_start(f.p, &f.pk, f.rid, f.pblk, NBLK, &e), PDL_OK);
    assert_int_equal(pdl_instance_push_layers(f.p, "tx-final-first", 0, &e), PDL_OK);
    assert_int_equal(pdl_instance_push_layers(f.p, "tx-final-first", LAYERS, &e), PDL_OK);
    pdl_recv_t *rv = NULL;
    assert_int_equal(pdl_instance_expect_push(f.c, &f.ck, f.rid, f.cblk, NBLK, &rv, &e), PDL_OK);
    if (pdl_recv_wait(rv, 30000, &e) != PDL_OK)
        fail_msg("receive: %s", e.msg);
    pdl_recv_free(rv);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(f.c, f.g.heads, f.g.mla, f.cblk, NBLK, 92, &checked), 0);
    assert_true(checked > 0);
    pdl_instance_t *plist[2] = {f.p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    assert_int_equal(TC_SUM(f.p, push_layer_waits), 0);
    layered_close(&f);
}

static void layers_timeout(pdl_instance_config_t *c)
{
    write_mode(c);
    c->conn.transfer_timeout_s = 0.5;
}

/* A push whose layers never all become final: each producer rank writes what was said final, waits out
 * transfer_timeout (0.5 s here; the consumer's is 600 s, so only the producer can end its receive) and
 * fails like any failed write: a failed write_done to every consumer rank, write_failures, blocks
 * freed. */
static void write_layered_push_never_final_fails(void **state)
{
    (void)state;
    layered_t f;
    layered_open(&f, "tx-unfinished", 2, 4, 60, 600, layers_timeout, write_mode_slow, 22);
    pdl_instance_t *p = f.p;
    tc_events_t ev;
    tc_count_events(p, &ev);
    pdl_error_t e;
    assert_int_equal(pdl_instance_push_start(p, &f.pk, f.rid, f.pblk, NBLK, &e), PDL_OK);
    assert_int_equal(pdl_instance_push_layers(p, "tx-unfinished", 1, &e), PDL_OK);
    pdl_recv_t *rv = NULL;
    assert_int_equal(pdl_instance_expect_push(f.c, &f.ck, f.rid, f.cblk, NBLK, &rv, &e), PDL_OK);
    pdl_status_t st = pdl_recv_wait(rv, 60000, &e);
    assert_int_not_equal(st, PDL_OK);
    assert_int_not_equal(st, PDL_ERR_TIMEOUT);
    assert_int_not_equal(st, PDL_INPROGRESS);
    assert_non_null(strstr(e.msg, "failed"));
    for (int d = 0; d < 4; d++)
        assert_int_equal(pdl_recv_write_done(rv, d), 1); /* P2/D4: one producer rank per consumer rank */
    pdl_recv_free(rv);
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    for (int r = 0; r < 2; r++) {
        assert_int_equal(TC_GET(p, r, write_failures), 1);
        assert_int_equal(TC_GET(p, r, transfers), 0);
        assert_true(TC_GET(p, r, push_layer_waits) >= 1);
        assert_int_equal(TC_GET(p, r, expired), 0);
    }
    assert_int_equal(atomic_load(&ev.freed), 1);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL_BLOCKS);
    assert_int_equal(pdl_instance_push_layers(p, "tx-unfinished", LAYERS, &e), PDL_ERR_NOT_FOUND);
    layered_close(&f);
}

/* A decode that abandons a push whose writers wait for layers (transfer_timeout 600 s): they stop at
 * once, and the push fails and is freed. */
static void write_layered_push_abandoned_while_waiting(void **state)
{
    (void)state;
    layered_t f;
    layered_open(&f, "tx-layered-abandoned", 2, 2, 600, 600, write_mode_slow, write_mode_slow, 23);
    pdl_recv_t *rv = NULL;
    layered_start(&f, &rv);
    ctr_wait_t w = {f.p, offsetof(pdl_rank_counters_t, push_layer_waits), 2};
    assert_true(tc_wait_for(ctr_reached, &w, 20000));
    pdl_error_t e;
    assert_int_equal(pdl_instance_abandon(f.c, &f.ck, f.rid, &e), PDL_OK);
    pdl_instance_t *plist[2] = {f.p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 60000));
    for (int r = 0; r < 2; r++) {
        assert_int_equal(TC_GET(f.p, r, write_failures), 1);
        assert_int_equal(TC_GET(f.p, r, pushes_abandoned), 1);
    }
    assert_int_not_equal(pdl_recv_wait(rv, 60000, &e), PDL_OK);
    pdl_recv_free(rv);
    layered_close(&f);
}

/* A decode destroyed while the writers of its push wait for layers (transfer and consumer-gone timeouts
 * 600 s): the consumer-gone watch finds it gone, the writers stop waiting, and the push is freed. */
static void write_layered_push_consumer_gone(void **state)
{
    (void)state;
    layered_t f;
    layered_open(&f, "tx-layered-gone", 2, 2, 600, 600, tc_write_slow, tc_write_slow, 25);
    pdl_recv_t *rv = NULL;
    layered_start(&f, &rv);
    ctr_wait_t w = {f.p, offsetof(pdl_rank_counters_t, push_layer_waits), 2};
    assert_true(tc_wait_for(ctr_reached, &w, 20000));
    pdl_recv_free(rv);
    pdl_instance_destroy(f.c);
    f.c = NULL;
    pdl_instance_t *plist[2] = {f.p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 60000));
    assert_int_equal(TC_GET(f.p, 0, consumer_gone_freed), 1);
    for (int r = 0; r < 2; r++)
        assert_int_equal(TC_GET(f.p, r, write_failures), 1);
    assert_int_equal(pdl_instance_free_block_count(f.p), TOTAL_BLOCKS);
    layered_close(&f);
}

/* pdl_instance_push_layers refuses what it cannot act on, naming the transfer or the value; a producer
 * destroyed while its writers wait for layers (transfer_timeout 600 s) stops at once. */
static void write_push_layers_refused(void **state)
{
    (void)state;
    layered_t f;
    layered_open(&f, "tx-refusals", 2, 2, 600, 600, write_mode_slow, write_mode_slow, 24);
    pdl_instance_t *p = f.p, *c = f.c;
    pdl_error_t e;
    assert_int_equal(pdl_instance_push_layers(p, "tx-nobody", 1, &e), PDL_ERR_NOT_FOUND);
    assert_non_null(strstr(e.msg, "tx-nobody"));
    assert_int_equal(pdl_instance_push_start(p, &f.pk, f.rid, f.pblk, NBLK, &e), PDL_OK);
    assert_int_equal(pdl_instance_push_start(p, &f.pk, f.rid, f.pblk, NBLK, &e), PDL_ERR_BAD_STATE); /* twice */
    assert_int_equal(pdl_instance_push_layers(p, "tx-refusals", LAYERS + 1, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "5 layers"));
    assert_int_equal(pdl_instance_push_layers(p, "tx-refusals", -1, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "-1 layers"));
    assert_int_equal(pdl_instance_push_layers(p, NULL, 1, &e), PDL_ERR_INVALID);
    assert_int_equal(pdl_instance_push_layers(c, "tx-refusals", 1, &e), PDL_ERR_BAD_STATE); /* a consumer */
    pdl_recv_t *rv = NULL;
    assert_int_equal(pdl_instance_expect_push(c, &f.ck, f.rid, f.cblk, NBLK, &rv, &e), PDL_OK);
    ctr_wait_t w = {p, offsetof(pdl_rank_counters_t, push_layer_waits), 2};
    assert_true(tc_wait_for(ctr_reached, &w, 20000));
    uint64_t t0 = pdl__clock_now_ns();
    pdl_instance_destroy(p);
    f.p = NULL;
    /* Bounded far below transfer_timeout: only the wake-up at destroy can end the writers' wait. */
    assert_true(pdl__clock_now_ns() - t0 < 60ull * 1000000000ull);
    pdl_recv_free(rv);
    layered_close(&f);
}

static void no_opt_in(pdl_instance_config_t *c) { c->conn.read_mode = false; }

/* Without the opt-in an instance still refuses WRITE mode with the clear error; READ-mode instances
 * refuse the WRITE-mode calls. */
static void write_refused_without_opt_in(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *w = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 60, no_opt_in);
    assert_null(w);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL_BLOCKS, PDL_BACKEND_SHM, 60, NULL);
    assert_non_null(p);
    uint32_t blk[1];
    assert_int_equal(pdl_instance_alloc_blocks(p, 1, blk, NULL), PDL_OK);
    pdl_kv_params_t pk;
    tc_leg_params("tx-read", 2, &pk);
    pdl_error_t e;
    assert_int_equal(pdl_instance_push(p, &pk, NULL, blk, 1, &e), PDL_ERR_BAD_STATE);
    pdl_recv_t *rv = NULL;
    assert_int_equal(pdl_instance_expect_push(p, &pk, NULL, blk, 1, &rv, &e), PDL_ERR_BAD_STATE);
    assert_null(rv);
    pdl_kv_params_clear(&pk);
    pdl_instance_free_blocks(p, blk, 1);
    pdl_instance_destroy(p);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
#define WRITE_ENTRY(id, ...) cmocka_unit_test(write_##id),
        TC_TOPOLOGIES(WRITE_ENTRY)
#undef WRITE_ENTRY
        cmocka_unit_test(write_p4_d2_nhd_tcp),
        cmocka_unit_test(write_expired_without_remote_blocks),
        cmocka_unit_test(write_failed_is_load_error),
        cmocka_unit_test(write_done_outside_group_and_duplicates),
        cmocka_unit_test(write_receive_times_out),
        cmocka_unit_test(write_consumer_tp_from_remote_blocks),
        cmocka_unit_test(write_refused_without_opt_in),
        cmocka_unit_test(write_first_push_after_consumer_restart),
        cmocka_unit_test(write_time_counted_as_write),
        cmocka_unit_test(write_abandon_frees_push_p4d8),
        cmocka_unit_test(write_abandon_before_push_p8d4),
        cmocka_unit_test(write_producer_abandon_fails_receive),
        cmocka_unit_test(write_producer_abandon_before_receive),
        cmocka_unit_test(write_gone_consumer_pushes_freed),
        cmocka_unit_test(write_layered_push_p2_d4),
        cmocka_unit_test(write_layered_push_p4_d2),
        cmocka_unit_test(write_layered_push_final_before_remote_blocks),
        cmocka_unit_test(write_layered_push_never_final_fails),
        cmocka_unit_test(write_layered_push_abandoned_while_waiting),
        cmocka_unit_test(write_layered_push_consumer_gone),
        cmocka_unit_test(write_push_layers_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
