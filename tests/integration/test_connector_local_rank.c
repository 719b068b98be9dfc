/*
 * test_connector_local_rank.c -- what a vLLM KV connector needs from the C connector:
 *
 * - one rank per process (pdl_instance_config_t.local_rank): every TP rank of a producer and of a
 *   consumer is its own instance (vLLM runs one worker process per rank; here they share one test
 *   process, which changes nothing for the connector: separate instances share nothing). P2/D1, P1/D2,
 *   P4/D8 and P8/D4 move vLLM's fused CPU layout; every byte of every consumer rank is verified, and
 *   every producer rank's hold is freed by exactly expected_acks releases of its own. WRITE mode P2/D4
 *   the same way (each consumer rank counts its own write_done, each producer rank gets remote_blocks
 *   once); only the process running rank 0 sends the discovery ping.
 * - caller-owned block ids (external_blocks): no allocator, overlapping holds (a prefix shared by two
 *   transfers) served while either is held, a read outside every held block refused by the data plane,
 *   PDL_EVENT_FREED once per transfer and no block ever "freed" by the instance.
 * - the fused layout on the wire: a fused and a non-fused peer refuse each other (PDL_ERR_MISMATCH).
 * - rank-indexed calls on a rank another process runs fail, naming it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <zmq.h>

#include "pdlink/wire.h"
#include "test_connector_util.h"

#define MAX_TP 8

/* One serving instance as vLLM runs it: one pdlink instance per TP rank, all on the same port bases. */
typedef struct rank_group {
    int tp;
    pdl_instance_t *r[MAX_TP];
    tc_events_t ev[MAX_TP];
} rank_group_t;

static void group_create_mode(rank_group_t *g, pdl_role_t role, int tp, const tc_geo_t *geo, uint32_t num_blocks,
                              bool external, pdl_backend_kind_t backend, bool write)
{
    memset(g, 0, sizeof(*g));
    g->tp = tp;
    for (int attempt = 0; attempt < 10; attempt++) {
        int hs = tp_free_range(2 * tp);
        assert_true(hs > 0);
        int r = 0;
        pdl_error_t e = {0};
        for (; r < tp; r++) {
            pdl_instance_config_t c;
            tc_config(&c, role, tp, geo, num_blocks, backend, 60, hs, hs + tp);
            c.local_rank = r;
            c.external_blocks = external;
            c.conn.read_mode = !write;
            c.allow_write_mode = write;
            if (pdl_instance_create(&c, &g->r[r], &e) != PDL_OK)
                break;
            pdl_instance_set_event_fn(g->r[r], tc_on_event, &g->ev[r]);
        }
        if (r == tp)
            return;
        for (int q = 0; q < r; q++)
            pdl_instance_destroy(g->r[q]);
        if (strstr(e.msg, "in use") == NULL)
            fail_msg("rank %d of TP %d: %s", r, tp, e.msg);
    }
    fail_msg("no free port range for TP %d", tp);
}

static void group_create(rank_group_t *g, pdl_role_t role, int tp, const tc_geo_t *geo, uint32_t num_blocks,
                         bool external, pdl_backend_kind_t backend)
{
    group_create_mode(g, role, tp, geo, num_blocks, external, backend, false);
}

static void group_destroy(rank_group_t *g)
{
    for (int r = 0; r < g->tp; r++)
        pdl_instance_destroy(g->r[r]);
}

static bool group_none_held(void *arg)
{
    rank_group_t *g = arg;
    for (int r = 0; r < g->tp; r++)
        if (pdl_instance_held_transfers(g->r[r]) != 0)
            return false;
    return true;
}

/* The same block ids on every rank: given (external), or from each rank's own allocator, which must
 * agree as vLLM's block table is one per request for every rank. */
static void group_blocks(rank_group_t *g, bool external, const uint32_t *given, uint32_t *ids, size_t n)
{
    if (external) {
        memcpy(ids, given, n * sizeof(*ids));
        return;
    }
    uint32_t mine[16];
    for (int r = 0; r < g->tp; r++) {
        assert_int_equal(pdl_instance_alloc_blocks(g->r[r], n, r == 0 ? ids : mine, NULL), PDL_OK);
        if (r > 0)
            assert_memory_equal(mine, ids, n * sizeof(*ids));
    }
}

static tc_geo_t fused_geo(int heads, pdl_kv_order_t order)
{
    tc_geo_t g = tc_geo_default(heads);
    g.kv_fused = true;
    g.order = order;
    g.elem = 4; /* float32: what vLLM's CPU backend runs here */
    return g;
}

#define NBLK 3
#define NUM_BLOCKS 16
#define TRANSFERS 2

/* P producer ranks and D consumer ranks, one instance each; TRANSFERS pulls, every byte checked. */
static void one_rank_per_process(int P, int D, const tc_geo_t *geo, bool external)
{
    rank_group_t prod, cons;
    group_create(&prod, PDL_ROLE_PRODUCER, P, geo, NUM_BLOCKS, external, PDL_BACKEND_TCP);
    group_create(&cons, PDL_ROLE_CONSUMER, D, geo, NUM_BLOCKS, external, PDL_BACKEND_TCP);
    int acks = 0;
    assert_int_equal(pdl_topo_expected_acks(P, D, &acks, NULL), PDL_OK);
    uint64_t verified = 0, pulled = 0;
    for (int t = 0; t < TRANSFERS; t++) {
        char tid[32];
        snprintf(tid, sizeof(tid), "lr-%d-%d-%d", P, D, t);
        static const uint32_t pgiven[TRANSFERS][NBLK] = {{2, 9, 5}, {11, 0, 7}};
        static const uint32_t cgiven[TRANSFERS][NBLK] = {{14, 1, 3}, {4, 8, 15}};
        uint32_t pblk[NBLK], cblk[NBLK];
        if (!external) /* each rank's allocator got the last transfer's blocks back: all agree again */
            assert_true(tc_wait_for(group_none_held, &prod, 20000));
        group_blocks(&prod, external, pgiven[t], pblk, NBLK);
        group_blocks(&cons, external, cgiven[t], cblk, NBLK);
        uint32_t seed = 100u + (uint32_t)t;
        for (int r = 0; r < P; r++) {
            tc_fill(prod.r[r], geo->heads, geo->mla, pblk, NBLK, seed); /* writes rank r's heads only */
            pdl_error_t e;
            if (pdl_instance_hold(prod.r[r], tid, pblk, NBLK, &e) != PDL_OK)
                fail_msg("hold on rank %d: %s", r, e.msg);
        }
        pdl_kv_params_t kp;
        tc_params(prod.r[0], tid, pblk, NBLK, &kp);
        assert_int_equal(kp.tp_size, P);
        pdl_pull_t *pulls[MAX_TP];
        for (int d = 0; d < D; d++) {
            pdl_error_t e;
            if (pdl_instance_pull(cons.r[d], &kp, NULL, cblk, NBLK, &pulls[d], &e) != PDL_OK)
                fail_msg("pull on consumer rank %d: %s", d, e.msg);
        }
        pdl_kv_params_clear(&kp);
        for (int d = 0; d < D; d++) {
            pdl_error_t e;
            if (pdl_pull_wait(pulls[d], 60000, &e) != PDL_OK)
                fail_msg("P%d/D%d consumer rank %d: %s", P, D, d, e.msg);
            pulled += pdl_pull_bytes(pulls[d]);
            pdl_pull_free(pulls[d]);
            uint64_t bad = tc_verify(cons.r[d], geo->heads, geo->mla, cblk, NBLK, seed, &verified);
            if (bad != 0)
                fail_msg("P%d/D%d consumer rank %d: %llu wrong bytes", P, D, d, (unsigned long long)bad);
        }
        if (!external)
            for (int d = 0; d < D; d++)
                pdl_instance_free_blocks(cons.r[d], cblk, NBLK);
    }
    /* Every consumer rank holds 1/D of the heads (or all of them, replicated, when D > H): every byte of
     * every rank was compared, and that is what the ranks pulled. */
    uint64_t rank_bytes = 0;
    for (int d = 0; d < D; d++)
        rank_bytes += pdl_layout_region_len(pdl_instance_geometry(cons.r[d], d)) / NUM_BLOCKS;
    assert_int_equal(verified, (uint64_t)TRANSFERS * NBLK * rank_bytes * (uint64_t)geo->layers);
    assert_int_equal(pulled, verified);
    /* Each producer rank's process freed its hold on its own releases: exactly `acks` per transfer. */
    assert_true(tc_wait_for(group_none_held, &prod, 20000));
    for (int r = 0; r < P; r++) {
        assert_int_equal(TC_GET(prod.r[r], r, releases_received), (uint64_t)(acks * TRANSFERS));
        assert_int_equal(TC_GET(prod.r[r], r, expired), 0);
        assert_int_equal(atomic_load(&prod.ev[r].reported[r]), TRANSFERS);
        assert_int_equal(atomic_load(&prod.ev[r].freed), TRANSFERS);
        if (!external)
            assert_int_equal(pdl_instance_free_block_count(prod.r[r]), NUM_BLOCKS); /* every hold back */
    }
    group_destroy(&cons);
    group_destroy(&prod);
}

static void local_rank_p2_d1(void **state)
{
    (void)state;
    tc_geo_t g = fused_geo(4, PDL_KV_HND);
    one_rank_per_process(2, 1, &g, true);
}

static void local_rank_p1_d2(void **state)
{
    (void)state;
    tc_geo_t g = fused_geo(4, PDL_KV_NHD);
    one_rank_per_process(1, 2, &g, false);
}

static void local_rank_p4_d8(void **state)
{
    (void)state;
    tc_geo_t g = fused_geo(8, PDL_KV_HND);
    one_rank_per_process(4, 8, &g, false);
}

static void local_rank_p8_d4(void **state)
{
    (void)state;
    tc_geo_t g = fused_geo(8, PDL_KV_HND);
    one_rank_per_process(8, 4, &g, true);
}

/* The non-fused default, one rank per process, heads split on the decode side. */
static void local_rank_p2_d4_separate(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(4);
    one_rank_per_process(2, 4, &g, true);
}

/* WRITE mode, one rank per process: each producer rank pushes its share once its remote_blocks came
 * (from the consumer rank that speaks for it), each consumer rank counts its own write_done. `late`: a
 * consumer rank (-1: none) whose process calls expect_push only after the pushes started, as a vLLM
 * worker can: the rank that spoke for it announced blocks it has not granted yet, and the producer's
 * writes to it must wait for the grant, not fail the push. */
static void write_one_rank_per_process(const int P, const int D, int late)
{
    tc_geo_t geo = fused_geo(4, PDL_KV_HND);
    rank_group_t prod, cons;
    group_create_mode(&prod, PDL_ROLE_PRODUCER, P, &geo, NUM_BLOCKS, true, PDL_BACKEND_TCP, true);
    group_create_mode(&cons, PDL_ROLE_CONSUMER, D, &geo, NUM_BLOCKS, true, PDL_BACKEND_TCP, true);
    int expected = 0;
    assert_int_equal(pdl_topo_expected_write_done(P, D, &expected, NULL), PDL_OK);
    char rid[1024];
    uint8_t uuid[16] = {7};
    assert_true(pdl_wire_format_request_id(pdl_instance_zmq_address(prod.r[0]), pdl_instance_zmq_address(cons.r[0]),
                                           uuid, rid, sizeof(rid)) > 0);
    const uint32_t pblk[NBLK] = {3, 8, 1}, cblk[NBLK] = {0, 6, 13};
    pdl_kv_params_t pk, ck;
    pdl_kv_params_init(&pk);
    pdl_kv_params_init(&ck);
    snprintf(pk.transfer_id, sizeof(pk.transfer_id), "tx-w-lr");
    snprintf(ck.transfer_id, sizeof(ck.transfer_id), "tx-w-lr");
    pk.remote_tp_size = D;
    ck.remote_tp_size = P;
    pdl_error_t e;
    pdl_recv_t *rv[MAX_TP];
    for (int d = 0; d < D; d++)
        if (d != late && pdl_instance_expect_push(cons.r[d], &ck, rid, cblk, NBLK, &rv[d], &e) != PDL_OK)
            fail_msg("expect_push on consumer rank %d: %s", d, e.msg);
    for (int r = 0; r < P; r++) {
        tc_fill(prod.r[r], geo.heads, false, pblk, NBLK, 41);
        if (pdl_instance_push(prod.r[r], &pk, rid, pblk, NBLK, &e) != PDL_OK)
            fail_msg("push on producer rank %d: %s", r, e.msg);
    }
    if (late >= 0) {
        /* The writes to it have been refused by now (the producer writes as soon as remote_blocks came). */
        tc_at_least_t refused = {cons.r[late], offsetof(pdl_rank_counters_t, data_requests_denied), 1};
        assert_true(tc_wait_for(tc_sum_reached, &refused, 20000));
        if (pdl_instance_expect_push(cons.r[late], &ck, rid, cblk, NBLK, &rv[late], &e) != PDL_OK)
            fail_msg("expect_push on consumer rank %d: %s", late, e.msg);
    }
    uint64_t checked = 0;
    for (int d = 0; d < D; d++) {
        if (pdl_recv_wait(rv[d], 30000, &e) != PDL_OK)
            fail_msg("consumer rank %d: %s", d, e.msg);
        assert_int_equal(pdl_recv_write_done(rv[d], d), expected);
        assert_int_equal(pdl_recv_write_done(rv[d], (d + 1) % D), -1); /* another process's rank */
        pdl_recv_free(rv[d]);
        assert_int_equal(tc_verify(cons.r[d], geo.heads, false, cblk, NBLK, 41, &checked), 0);
        assert_int_equal(TC_GET(cons.r[d], d, write_done_received), (uint64_t)expected);
    }
    assert_true(checked > 0);
    assert_true(tc_wait_for(group_none_held, &prod, 20000));
    for (int r = 0; r < P; r++) {
        assert_int_equal(TC_GET(prod.r[r], r, remote_blocks_received), 1); /* exactly once per producer rank */
        assert_int_equal(atomic_load(&prod.ev[r].freed), 1);
    }
    pdl_kv_params_clear(&pk);
    pdl_kv_params_clear(&ck);
    group_destroy(&cons);
    group_destroy(&prod);
}

static void local_rank_write_p2_d4(void **state)
{
    (void)state;
    write_one_rank_per_process(2, 4, -1);
}

static void local_rank_write_p1_d2_late_grant(void **state)
{
    (void)state;
    write_one_rank_per_process(1, 2, 1);
}

/* The discovery ping is the instance's, sent by rank 0: a process running rank 1 only never pings, the
 * one running rank 0 registers the whole instance (tp_size 2). */
static void local_rank_ping_from_rank0_only(void **state)
{
    (void)state;
    int ping = tp_free_range(1), hs = tp_free_range(4);
    assert_true(ping > 0 && hs > 0);
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", ping);
    assert_int_equal(zmq_bind(router, ep), 0);
    tc_geo_t g = fused_geo(4, PDL_KV_HND);
    pdl_instance_config_t c;
    tc_config(&c, PDL_ROLE_PRODUCER, 2, &g, NUM_BLOCKS, PDL_BACKEND_TCP, 60, hs, hs + 2);
    snprintf(c.conn.proxy_ip, sizeof(c.conn.proxy_ip), "127.0.0.1");
    c.conn.proxy_ping_port = ping;
    c.conn.http_port = 8124;
    pdl_error_t e;
    pdl_instance_t *r1 = NULL, *r0 = NULL;
    c.local_rank = 1;
    if (pdl_instance_create(&c, &r1, &e) != PDL_OK)
        fail_msg("rank 1: %s", e.msg);
    /* Rank 0 pings at start and every 3 s: 3.5 s of silence covers a start and a period. */
    zmq_pollitem_t it = {.socket = router, .events = ZMQ_POLLIN};
    assert_int_equal(zmq_poll(&it, 1, 3500), 0);
    c.local_rank = 0;
    if (pdl_instance_create(&c, &r0, &e) != PDL_OK)
        fail_msg("rank 0: %s", e.msg);
    pdl_registration_t reg;
    if (tc_recv_registration(router, 30000, &reg, &e) != PDL_OK)
        fail_msg("%s", e.msg);
    assert_int_equal(reg.type, 'P');
    assert_int_equal(reg.tp_size, 2);
    assert_string_equal(reg.zmq_address, pdl_instance_zmq_address(r1)); /* the same instance either way */
    pdl_instance_destroy(r0);
    pdl_instance_destroy(r1);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

/* Per-transfer FREED events (tc_events_t counts them without the id). */
typedef struct freed_log {
    pthread_mutex_t mu;
    char ids[16][32];
    int n;
} freed_log_t;

static void on_freed(void *arg, pdl_instance_event_t ev, const char *tid, int rank)
{
    (void)rank;
    freed_log_t *f = arg;
    if (ev != PDL_EVENT_FREED)
        return;
    pthread_mutex_lock(&f->mu);
    if (f->n < 16)
        snprintf(f->ids[f->n++], sizeof(f->ids[0]), "%s", tid);
    pthread_mutex_unlock(&f->mu);
}

static int freed_count(freed_log_t *f, const char *tid)
{
    int c = 0;
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->n; i++)
        c += strcmp(f->ids[i], tid) == 0;
    pthread_mutex_unlock(&f->mu);
    return c;
}

typedef struct freed_wait {
    freed_log_t *log;
    const char *tid;
} freed_wait_t;

static bool freed_once(void *arg)
{
    freed_wait_t *w = arg;
    return freed_count(w->log, w->tid) >= 1;
}

static void external_blocks_overlap_grants_freed(void **state)
{
    (void)state;
    tc_geo_t geo = fused_geo(4, PDL_KV_HND);
    rank_group_t prod, cons;
    group_create(&prod, PDL_ROLE_PRODUCER, 2, &geo, NUM_BLOCKS, true, PDL_BACKEND_TCP);
    group_create(&cons, PDL_ROLE_CONSUMER, 2, &geo, NUM_BLOCKS, true, PDL_BACKEND_TCP);
    freed_log_t flog[2];
    for (int r = 0; r < 2; r++) {
        memset(&flog[r], 0, sizeof(flog[r]));
        pthread_mutex_init(&flog[r].mu, NULL);
        pdl_instance_set_event_fn(prod.r[r], on_freed, &flog[r]);
    }
    pdl_error_t e;
    /* No allocator: the ids are the caller's. */
    uint32_t got[1];
    assert_int_equal(pdl_instance_alloc_blocks(prod.r[0], 1, got, &e), PDL_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "external_blocks"));
    assert_int_equal(pdl_instance_free_block_count(prod.r[0]), 0);
    pdl_instance_free_blocks(prod.r[0], (uint32_t[]){1}, 1); /* a no-op, not an error */
    const uint32_t too_big[2] = {3, NUM_BLOCKS};
    assert_int_equal(pdl_instance_hold(prod.r[0], "too-big", too_big, 2, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "block id 16 at index 1 is not below num_blocks 16"));

    /* Prefix caching: B's blocks are the first two of A's, held at the same time. */
    const uint32_t a_blk[3] = {6, 2, 9}, b_blk[2] = {6, 2};
    for (int r = 0; r < 2; r++) {
        tc_fill(prod.r[r], geo.heads, false, a_blk, 3, 7);
        assert_int_equal(pdl_instance_hold(prod.r[r], "tx-a", a_blk, 3, &e), PDL_OK);
        assert_int_equal(pdl_instance_hold(prod.r[r], "tx-b", b_blk, 2, &e), PDL_OK);
        assert_int_equal(pdl_instance_held_blocks(prod.r[r]), 5);
    }
    pdl_kv_params_t kp;
    const uint32_t ca[3] = {1, 3, 5}, cb[2] = {10, 11};
    tc_params(prod.r[0], "tx-a", a_blk, 3, &kp);
    for (int d = 0; d < 2; d++)
        if (tc_pull_wait(cons.r[d], &kp, ca, 3, &e) != PDL_OK)
            fail_msg("pull tx-a on rank %d: %s", d, e.msg);
    pdl_kv_params_clear(&kp);
    uint64_t checked = 0;
    for (int d = 0; d < 2; d++)
        assert_int_equal(tc_verify(cons.r[d], geo.heads, false, ca, 3, 7, &checked), 0);
    for (int r = 0; r < 2; r++) {
        freed_wait_t w = {&flog[r], "tx-a"};
        assert_true(tc_wait_for(freed_once, &w, 20000));
        /* A is over; B still holds blocks 6 and 2 (and nothing was freed: there is no allocator). */
        assert_int_equal(pdl_instance_held_transfers(prod.r[r]), 1);
        assert_int_equal(pdl_instance_held_blocks(prod.r[r]), 2);
    }
    /* The shared blocks are still served under B's grant. */
    tc_params(prod.r[0], "tx-b", b_blk, 2, &kp);
    for (int d = 0; d < 2; d++)
        if (tc_pull_wait(cons.r[d], &kp, cb, 2, &e) != PDL_OK)
            fail_msg("pull tx-b on rank %d: %s", d, e.msg);
    pdl_kv_params_clear(&kp);
    for (int d = 0; d < 2; d++)
        assert_int_equal(tc_verify(cons.r[d], geo.heads, false, cb, 2, 7, &checked), 0);
    for (int r = 0; r < 2; r++) {
        freed_wait_t w = {&flog[r], "tx-b"};
        assert_true(tc_wait_for(freed_once, &w, 20000));
    }

    /* A read naming a held transfer but a block outside every held block: refused by the data plane. */
    const uint32_t c_blk[1] = {4};
    for (int r = 0; r < 2; r++)
        assert_int_equal(pdl_instance_hold(prod.r[r], "tx-c", c_blk, 1, &e), PDL_OK);
    uint64_t denied0 = TC_GET(prod.r[0], 0, data_requests_denied) + TC_GET(prod.r[1], 1, data_requests_denied);
    tc_params(prod.r[0], "tx-c", (const uint32_t[]){9}, 1, &kp); /* block 9: A's, which is over */
    const uint32_t cc[1] = {12};
    for (int d = 0; d < 2; d++) {
        uint8_t *layer0 = pdl_instance_kv_layer(cons.r[d], d, 0);
        const pdl_kv_geometry_t *cg = pdl_instance_geometry(cons.r[d], d);
        uint64_t boff = pdl_layout_half_offset(cg, cc[0], 0), blen = pdl_layout_block_len(cg);
        memset(layer0 + boff, 0x5A, blen);
        assert_int_not_equal(tc_pull_wait(cons.r[d], &kp, cc, 1, &e), PDL_OK);
        for (uint64_t i = 0; i < blen; i++)
            assert_int_equal(layer0[boff + i], 0x5A); /* not one byte of block 9 arrived */
    }
    pdl_kv_params_clear(&kp);
    uint64_t denied1 = TC_GET(prod.r[0], 0, data_requests_denied) + TC_GET(prod.r[1], 1, data_requests_denied);
    assert_true(denied1 > denied0);

    /* FREED exactly once per transfer, on every rank's instance. */
    assert_true(tc_wait_for(group_none_held, &prod, 20000)); /* tx-c: the failed pull released it */
    for (int r = 0; r < 2; r++) {
        assert_int_equal(freed_count(&flog[r], "tx-a"), 1);
        assert_int_equal(freed_count(&flog[r], "tx-b"), 1);
        assert_int_equal(freed_count(&flog[r], "tx-c"), 1);
    }
    group_destroy(&cons);
    group_destroy(&prod);
    for (int r = 0; r < 2; r++)
        pthread_mutex_destroy(&flog[r].mu);
}

/* vLLM's fused CPU cache against a non-fused peer: refused at the handshake, never mixed. */
static void fused_vs_separate_refused(void **state)
{
    (void)state;
    tc_geo_t fused = fused_geo(4, PDL_KV_HND), plain = tc_geo_default(4);
    plain.elem = fused.elem;
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 1, &fused, NUM_BLOCKS, PDL_BACKEND_TCP, 60, NULL);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 1, &plain, NUM_BLOCKS, PDL_BACKEND_TCP, 60, NULL);
    assert_non_null(p);
    assert_non_null(c);
    uint32_t pb[1], cb[1];
    assert_int_equal(tc_hold_filled(p, "tx-mix", fused.heads, false, pb, 1, 3), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 1, cb, NULL), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "tx-mix", pb, 1, &kp);
    pdl_error_t e;
    assert_int_equal(tc_pull_wait(c, &kp, cb, 1, &e), PDL_ERR_MISMATCH);
    pdl_kv_params_clear(&kp);
    assert_non_null(strstr(e.msg, "layout differs (local hnd, remote hnd-fused)"));
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void local_rank_checks(void **state)
{
    (void)state;
    tc_geo_t g = fused_geo(4, PDL_KV_HND);
    int hs = tp_free_range(4);
    assert_true(hs > 0);
    pdl_instance_config_t c;
    tc_config(&c, PDL_ROLE_PRODUCER, 2, &g, NUM_BLOCKS, PDL_BACKEND_TCP, 60, hs, hs + 2);
    pdl_instance_t *inst = NULL;
    pdl_error_t e;
    c.local_rank = 2;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "local_rank 2 is neither -1 (every rank) nor a rank in [0, tp_size 2)"));
    assert_null(inst);
    /* Rank 1 alone, with its region only: the other entry is never read. */
    c.local_rank = 1;
    uint64_t len = 0;
    assert_int_equal(pdl_instance_kv_region_len(&c, 1, &len, NULL), PDL_OK);
    void *mem = calloc(1, (size_t)len);
    void *regions[2] = {NULL, mem};
    size_t lens[2] = {0, (size_t)len};
    c.kv_regions = regions;
    c.kv_region_lens = lens;
    if (pdl_instance_create(&c, &inst, &e) != PDL_OK)
        fail_msg("create rank 1: %s", e.msg);
    assert_int_equal(pdl_instance_local_rank(inst), 1);
    assert_int_equal(pdl_instance_tp_size(inst), 2);
    assert_ptr_equal(pdl_instance_kv_layer(inst, 1, 0), mem);
    assert_null(pdl_instance_kv_layer(inst, 0, 0));
    assert_null(pdl_instance_geometry(inst, 0));
    assert_int_equal(pdl_instance_handshake_port(inst, 1), hs + 1);
    assert_int_equal(pdl_instance_notify_port(inst, 1), hs + 3);
    assert_int_equal(pdl_instance_handshake_port(inst, 0), -1);
    pdl_rank_counters_t rc;
    assert_int_equal(pdl_instance_counters(inst, 0, &rc, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "counters: rank 0 is not run by this instance (local_rank 1"));
    assert_int_equal(pdl_instance_counters(inst, 1, &rc, &e), PDL_OK);
    /* Rank 0's ports were never bound by this instance: another process may have them. */
    assert_true(tc_port_free(hs));
    assert_true(tc_port_free(hs + 2));
    assert_false(tc_port_free(hs + 1));
    pdl_instance_destroy(inst);
    free(mem);
    /* A zeroed config's local_rank 0 is a real rank; the defaults run every rank. */
    pdl_instance_config_defaults(&c);
    assert_int_equal(c.local_rank, -1);
    assert_int_equal(c.dp_size, 1);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(local_rank_checks),
        cmocka_unit_test(fused_vs_separate_refused),
        cmocka_unit_test(local_rank_p2_d1),
        cmocka_unit_test(local_rank_p1_d2),
        cmocka_unit_test(local_rank_p4_d8),
        cmocka_unit_test(local_rank_p8_d4),
        cmocka_unit_test(local_rank_p2_d4_separate),
        cmocka_unit_test(local_rank_write_p2_d4),
        cmocka_unit_test(local_rank_write_p1_d2_late_grant),
        cmocka_unit_test(local_rank_ping_from_rank0_only),
        cmocka_unit_test(external_blocks_overlap_grants_freed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
