/*
 * test_connector_integrity.c -- KV integrity digests, READ mode (docs/integrity.md): for same-TP and
 * head-splitting topologies (P2/D4, P4/D2, P4/D4, MLA) over shm and tcp, one byte of the producer's KV
 * flipped after the digests were taken (the params were made) makes the pull fail with a mismatch naming
 * the transfer, layer, block and ranks, counted in kv_digest_mismatches; the same transfer untouched
 * passes with every byte verified and its digests counted. A producer with kv_integrity off advertises
 * nothing, so the consumer does not ask and the pull works as before (a flipped byte goes through, as
 * without the feature).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_connector_util.h"

#define NBLK 3
#define TOTAL_BLOCKS 12

static void full(pdl_instance_config_t *c) { c->conn.kv_integrity = PDL_KV_INTEGRITY_FULL; }
static void off(pdl_instance_config_t *c) { c->conn.kv_integrity = PDL_KV_INTEGRITY_OFF; }

typedef struct icase {
    int P, D;
    tc_geo_t g;
    pdl_backend_kind_t backend;
    void (*ptweak)(pdl_instance_config_t *), (*ctweak)(pdl_instance_config_t *);
    bool corrupt;
    bool expect_caught;
} icase_t;

/* Flip one byte of layer 1, block ids[1], on the producer's last rank (a V byte of its last head when
 * there is a V half): after the params, i.e. after the digests were taken. */
static void corrupt_one(pdl_instance_t *p, const uint32_t *ids)
{
    int rank = pdl_instance_tp_size(p) - 1;
    const pdl_kv_geometry_t *g = pdl_instance_geometry(p, rank);
    uint8_t *layer = pdl_instance_kv_layer(p, rank, 1);
    assert_non_null(layer);
    int half = pdl_layout_num_halves(g) - 1;
    uint64_t off = pdl_layout_half_offset(g, ids[1], half) + pdl_layout_block_len(g) - 3;
    layer[off] ^= 0x40;
}

static void run(const icase_t *ic)
{
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, ic->P, ic->D, &ic->g, TOTAL_BLOCKS, ic->backend, 60, 60, ic->ptweak, ic->ctweak));
    uint32_t pids[NBLK], cids[NBLK];
    pdl_error_t e;
    assert_int_equal(tc_hold_filled(p, "tx-integrity", ic->g.heads, ic->g.mla, pids, NBLK, 7), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "tx-integrity", pids, NBLK, &kp);
    if (ic->corrupt)
        corrupt_one(p, pids);
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cids, NULL), PDL_OK);
    pdl_status_t st = tc_pull_wait(c, &kp, cids, NBLK, &e);
    pdl_kv_params_clear(&kp);
    uint64_t mism = TC_SUM(c, kv_digest_mismatches);
    if (ic->expect_caught) {
        if (st != PDL_ERR_MISMATCH)
            fail_msg("P%d/D%d: corrupted pull returned %s: %s", ic->P, ic->D, pdl_status_name(st), e.msg);
        assert_non_null(strstr(e.msg, "kv digest mismatch: transfer tx-integrity layer 1 block 1"));
        assert_non_null(strstr(e.msg, "-> consumer rank"));
        /* Each consumer rank that read the flipped piece caught it: one, or with MLA's replicated latent
         * every consumer rank reading from the producer's last rank (D/P of them). */
        assert_int_equal(mism, ic->g.mla ? (uint64_t)(ic->D / ic->P) : 1);
        assert_int_equal(TC_SUM(c, read_failures) > 0, 1);
        printf("P%d/D%d %s: caught: %s\n", ic->P, ic->D, pdl_backend_name(ic->backend), e.msg);
    } else {
        if (st != PDL_OK)
            fail_msg("P%d/D%d: pull failed: %s", ic->P, ic->D, e.msg);
        assert_int_equal(mism, 0);
        uint64_t checked = 0;
        uint64_t bad = tc_verify(c, ic->g.heads, ic->g.mla, cids, NBLK, 7, &checked);
        assert_int_equal(bad, ic->corrupt ? 1 : 0); /* the flipped byte went through unchecked */
        bool digesting = ic->ptweak == full && ic->ctweak == full;
        assert_int_equal(TC_SUM(c, kv_digest_bytes) > 0, digesting);
        assert_int_equal(TC_SUM(p, kv_digest_bytes) > 0, ic->ptweak == full);
        assert_int_equal(TC_SUM(c, kv_digest_unverified), 0);
        if (digesting) /* the consumer digested every byte it pulled */
            assert_int_equal(TC_SUM(c, kv_digest_bytes), checked);
    }
    pdl_instance_t *pl[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, pl, 20000));
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

#define CASE(name, P, D, geo, be, pt, ct, corrupt, caught)                                                       \
    static void name(void **state)                                                                             \
    {                                                                                                          \
        (void)state;                                                                                           \
        icase_t ic = {P, D, geo, be, pt, ct, corrupt, caught};                                                 \
        run(&ic);                                                                                              \
    }
CASE(same_tp_clean, 4, 4, tc_geo_default(8), PDL_BACKEND_SHM, full, full, false, false)
CASE(same_tp_corrupt, 4, 4, tc_geo_default(8), PDL_BACKEND_SHM, full, full, true, true)
CASE(p2_d4_split_corrupt, 2, 4, tc_geo_default(8), PDL_BACKEND_SHM, full, full, true, true)
CASE(p2_d4_split_clean_tcp, 2, 4, tc_geo_default(8), PDL_BACKEND_TCP, full, full, false, false)
CASE(p2_d4_split_corrupt_tcp, 2, 4, tc_geo_default(8), PDL_BACKEND_TCP, full, full, true, true)
CASE(p4_d2_merge_clean, 4, 2, tc_geo_default(8), PDL_BACKEND_SHM, full, full, false, false)
CASE(p4_d2_merge_corrupt, 4, 2, tc_geo_default(8), PDL_BACKEND_SHM, full, full, true, true)
CASE(p4_d2_merge_corrupt_tcp, 4, 2, tc_geo_default(8), PDL_BACKEND_TCP, full, full, true, true)
CASE(p2_d4_nhd_corrupt, 2, 4, tc_geo_nhd(8, 1), PDL_BACKEND_SHM, full, full, true, true)
CASE(p2_d4_mla_corrupt, 2, 4, tc_geo_mla(), PDL_BACKEND_SHM, full, full, true, true)
CASE(producer_off_not_asked, 2, 4, tc_geo_default(8), PDL_BACKEND_SHM, off, full, true, false)
CASE(consumer_off_unchecked, 2, 4, tc_geo_default(8), PDL_BACKEND_SHM, full, off, true, false)

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_tp_clean),           cmocka_unit_test(same_tp_corrupt),
        cmocka_unit_test(p2_d4_split_corrupt),     cmocka_unit_test(p2_d4_split_clean_tcp),
        cmocka_unit_test(p2_d4_split_corrupt_tcp), cmocka_unit_test(p4_d2_merge_clean),
        cmocka_unit_test(p4_d2_merge_corrupt),     cmocka_unit_test(p4_d2_merge_corrupt_tcp),
        cmocka_unit_test(p2_d4_nhd_corrupt),       cmocka_unit_test(p2_d4_mla_corrupt),
        cmocka_unit_test(producer_off_not_asked),  cmocka_unit_test(consumer_off_unchecked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
