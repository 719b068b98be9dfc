/*
 * test_scrub.c -- scrub_freed_blocks (issue 12: "freed decode blocks keep earlier prompts' KV"). A TP2
 * producer holds filled blocks and a TP2 consumer pulls them; once the producer's hold is released and
 * the consumer frees its blocks, with the key on every byte of those blocks is zero on every rank (all
 * layers, K and V) and other blocks are untouched; with it off (the default, as before) the KV stays.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_connector_util.h"

#define TOTAL 16
#define NBLK 3

static void scrub_on(pdl_instance_config_t *c) { c->conn.scrub_freed_blocks = true; }

/* Non-zero bytes of blocks ids on every rank of inst (every layer, every half). */
static uint64_t nonzero(pdl_instance_t *inst, const uint32_t *ids, size_t n)
{
    uint64_t nz = 0;
    for (int r = 0; r < pdl_instance_tp_size(inst); r++) {
        const pdl_kv_geometry_t *g = pdl_instance_geometry(inst, r);
        for (int l = 0; pdl_instance_kv_layer(inst, r, l) != NULL; l++) {
            const uint8_t *base = pdl_instance_kv_layer(inst, r, l);
            for (size_t i = 0; i < n; i++)
                for (int h = 0; h < pdl_layout_num_halves(g); h++) {
                    const uint8_t *p = base + pdl_layout_half_offset(g, ids[i], h);
                    for (uint64_t k = 0; k < pdl_layout_block_len(g); k++)
                        nz += p[k] != 0;
                }
        }
    }
    return nz;
}

/* Only tx-keep is still held: tx-scrub's blocks went back to the allocator (held_transfers counts a
 * transfer until its free finished). */
static bool one_held(void *arg) { return pdl_instance_held_transfers((pdl_instance_t *)arg) == 1; }

static void run(bool scrub)
{
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, scrub ? scrub_on : NULL);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, scrub ? scrub_on : NULL);
    assert_non_null(p);
    assert_non_null(c);
    uint32_t pb[NBLK], cb[NBLK], keep[1];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    /* A block the consumer keeps: scrubbing others must not touch it. */
    assert_int_equal(tc_hold_filled(p, "tx-keep", 8, false, keep, 1, 9), PDL_OK);
    assert_int_equal(tc_hold_filled(p, "tx-scrub", 8, false, pb, NBLK, 4), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "tx-scrub", pb, NBLK, &kp);
    pdl_error_t e;
    if (tc_pull_wait(c, &kp, cb, NBLK, &e) != PDL_OK)
        fail_msg("pull: %s", e.msg);
    pdl_kv_params_clear(&kp);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, cb, NBLK, 4, &checked), 0);
    /* Released by the consumer: the producer frees its blocks (tx-keep stays held). */
    assert_true(tc_wait_for(one_held, p, 30000));
    pdl_instance_free_blocks(c, cb, NBLK);
    uint64_t pnz = nonzero(p, pb, NBLK), cnz = nonzero(c, cb, NBLK);
    printf("scrub_freed_blocks %s: %llu non-zero bytes left in the producer's freed blocks, %llu in the "
           "consumer's\n", scrub ? "on" : "off", (unsigned long long)pnz, (unsigned long long)cnz);
    if (scrub) {
        assert_int_equal(pnz, 0);
        assert_int_equal(cnz, 0);
    } else {
        assert_true(pnz > 0);
        assert_true(cnz > 0);
    }
    assert_true(nonzero(p, keep, 1) > 0);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void scrubbed(void **state)
{
    (void)state;
    run(true);
}

static void kept_without_scrub(void **state)
{
    (void)state;
    run(false);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scrubbed),
        cmocka_unit_test(kept_without_scrub),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
