/*
 * test_connector_topologies.c -- READ mode end to end over real sockets, in one process: producer and
 * consumer instances with their TP ranks, handshakes, batched reads through the engine, releases and
 * producer fan-in, for every topology of the seed and more (docs/topology.md, docs/protocol.md).
 *
 * For each case: producers fill held blocks with a function of (layer, head, token, dim, K/V,
 * transfer); consumers pull them; every byte on every consumer rank is verified; every producer rank
 * must report each of its transfers exactly once (event callback + counters); no block may stay held;
 * releases sent by consumers must equal releases received by producers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_connector_util.h"
#include "test_connector_check.h"

#define NBLK 3      /* blocks per transfer */
#define TOTAL_BLOCKS 24

static void run_case(const tc_topo_t *tc)
{
    pdl_instance_t *prod[2] = {0}, *cons[2] = {0};
    tc_events_t *ev = calloc((size_t)tc->nprod, sizeof(tc_events_t));
    assert_non_null(ev);
    tc_topo_open(tc, TOTAL_BLOCKS, NULL, prod, cons, ev);
    int T = tc->transfers;
    uint32_t pblk[16][NBLK], cblk[16][NBLK];
    pdl_pull_t *pulls[16];
    int per_prod[2] = {0, 0};
    for (int t = 0; t < T; t++) {
        pdl_instance_t *p = prod[t % tc->nprod], *c = cons[t % tc->ncons];
        per_prod[t % tc->nprod]++;
        char tid[64];
        snprintf(tid, sizeof(tid), "tx-%s-%d", tc->name, t);
        tc_topo_blocks(p, c, t, NBLK, pblk[t], cblk[t]);
        tc_fill(p, tc->g.heads, tc->g.mla, pblk[t], NBLK, (uint32_t)t + 1);
        pdl_error_t e;
        assert_int_equal(pdl_instance_hold(p, tid, pblk[t], NBLK, &e), PDL_OK);
        pdl_kv_params_t kp;
        tc_params(p, tid, pblk[t], NBLK, &kp);
        assert_int_equal(kp.tp_size, tc->P);
        pdl_status_t st = pdl_instance_pull(c, &kp, NULL, cblk[t], NBLK, &pulls[t], &e);
        if (st != PDL_OK)
            fail_msg("pull: %s", e.msg);
        pdl_kv_params_clear(&kp);
    }
    uint64_t pull_bytes = 0;
    for (int t = 0; t < T; t++) {
        pdl_error_t e;
        pdl_status_t st = pdl_pull_wait(pulls[t], 30000, &e);
        if (st != PDL_OK)
            fail_msg("%s transfer %d: %s", tc->name, t, e.msg);
        pull_bytes += pdl_pull_bytes(pulls[t]);
        assert_true(pdl_pull_descriptors(pulls[t]) > 0);
        pdl_pull_free(pulls[t]);
    }
    /* every byte of every consumer rank's blocks was compared, and that is what the pulls moved */
    uint64_t checked = tc_topo_verify(tc, cons, &cblk[0][0], NBLK);
    assert_int_equal(pull_bytes, checked);

    pdl_instance_t *plist[3] = {prod[0], prod[1], NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    int expected;
    assert_int_equal(pdl_topo_expected_acks(tc->P, tc->D, &expected, NULL), PDL_OK);
    uint64_t sent = 0, received = 0;
    for (int j = 0; j < tc->ncons; j++) {
        sent += TC_SUM(cons[j], releases_sent);
        assert_int_equal(TC_SUM(cons[j], read_failures), 0);
    }
    for (int i = 0; i < tc->nprod; i++) {
        for (int r = 0; r < tc->P; r++) {
            /* every producer rank reports each of its transfers exactly once (P8/D4: ranks 1,3,5,7 too) */
            assert_int_equal(atomic_load(&ev[i].reported[r]), per_prod[i]);
            assert_int_equal(atomic_load(&ev[i].expired[r]), 0);
            assert_int_equal(TC_GET(prod[i], r, transfers), (uint64_t)per_prod[i]);
            assert_int_equal(TC_GET(prod[i], r, releases_received), (uint64_t)(per_prod[i] * expected));
            assert_int_equal(TC_GET(prod[i], r, releases_duplicate), 0);
            assert_int_equal(TC_GET(prod[i], r, releases_late), 0);
            assert_int_equal(TC_GET(prod[i], r, expired), 0);
            assert_int_equal(TC_GET(prod[i], r, dropped_malformed), 0);
        }
        assert_int_equal(atomic_load(&ev[i].freed), per_prod[i]);
        received += TC_SUM(prod[i], releases_received);
        assert_int_equal(pdl_instance_held_blocks(prod[i]), 0);
        assert_int_equal(pdl_instance_free_block_count(prod[i]), TOTAL_BLOCKS);
    }
    assert_int_equal(sent, received);
    for (int j = 0; j < tc->ncons; j++)
        assert_int_equal(pdl_instance_free_block_count(cons[j]), TOTAL_BLOCKS);
    printf("topology %-28s P%-2d D%-2d H%-2d %s %s: %d transfers, %llu KV bytes verified on %d consumer ranks, "
           "%llu releases sent = %llu counted\n",
           tc->name, tc->P, tc->D, tc->g.heads, tc->g.mla ? "mla" : pdl_layout_order_name(tc->g.order),
           pdl_backend_name(tc->backend), T, (unsigned long long)checked, tc->D * tc->ncons, (unsigned long long)sent,
           (unsigned long long)received);
    for (int j = 0; j < tc->ncons; j++)
        pdl_instance_destroy(cons[j]);
    for (int i = 0; i < tc->nprod; i++)
        pdl_instance_destroy(prod[i]);
    free(ev);
}

/* The topologies WRITE mode runs too, then the READ-only rows (replicated heads, more layouts). */
#define READ_CASE(id, ...) TC_TOPO_CASE(topo, run_case, id, __VA_ARGS__)
TC_TOPOLOGIES(READ_CASE)
READ_CASE(p4_d8_h4_replicated, "P4-D8-H4-replicated", 4, 8, 1, 1, 3, tc_geo_default(4), PDL_BACKEND_SHM)
READ_CASE(p8_d4_h4_replicated, "P8-D4-H4-replicated", 8, 4, 1, 1, 3, tc_geo_default(4), PDL_BACKEND_SHM)
READ_CASE(p2_d16_h8_mixed, "P2-D16-H8-mixed", 2, 16, 1, 1, 2, tc_geo_default(8), PDL_BACKEND_SHM)
READ_CASE(p4_d8_nhd_fp8, "P4-D8-H8-NHD-fp8", 4, 8, 1, 1, 2, tc_geo_nhd(8, 1), PDL_BACKEND_SHM)
READ_CASE(p8_d4_blockfirst, "P8-D4-H8-blockfirst", 8, 4, 1, 1, 2, tc_geo_blockfirst(8), PDL_BACKEND_SHM)
READ_CASE(p2_d4_tcp, "P2-D4-H8-tcp", 2, 4, 1, 1, 3, tc_geo_default(8), PDL_BACKEND_TCP)
READ_CASE(p4_d2_tcp, "P4-D2-H8-tcp", 4, 2, 1, 1, 3, tc_geo_default(8), PDL_BACKEND_TCP)

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
#define READ_ENTRY(id, ...) cmocka_unit_test(topo_##id),
        TC_TOPOLOGIES(READ_ENTRY)
#undef READ_ENTRY
        cmocka_unit_test(topo_p4_d8_h4_replicated), cmocka_unit_test(topo_p8_d4_h4_replicated),
        cmocka_unit_test(topo_p2_d16_h8_mixed),     cmocka_unit_test(topo_p4_d8_nhd_fp8),
        cmocka_unit_test(topo_p8_d4_blockfirst),    cmocka_unit_test(topo_p2_d4_tcp),
        cmocka_unit_test(topo_p4_d2_tcp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
