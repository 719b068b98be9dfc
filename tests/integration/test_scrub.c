/*
 * test_scrub.c -- scrub_freed_blocks (without it, freed decode blocks keep earlier prompts' KV). A TP2
 * producer holds filled blocks and a TP2 consumer pulls them; once the producer's hold is released and
 * the consumer frees its blocks, with the key on every byte of those blocks is zero on every rank (all
 * layers, K and V) and other blocks are untouched; with it off (the default, as before) the KV stays.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 2, &g, TOTAL, PDL_BACKEND_TCP,
                           60, 60, scrub ? scrub_on : NULL, scrub ? scrub_on : NULL));
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

/* Byte of (block, half, head, token, byte) on every rank of inst, for a geometry of either order. */
static uint8_t *row_at(pdl_instance_t *inst, int r, int l, uint32_t blk, int half, uint32_t head, uint32_t tok)
{
    const pdl_kv_geometry_t *g = pdl_instance_geometry(inst, r);
    uint64_t row = pdl_layout_row_len(g);
    uint64_t off = pdl_layout_half_offset(g, blk, half) +
                   (g->order == PDL_KV_HND ? ((uint64_t)head * g->block_size + tok) * row
                                           : ((uint64_t)tok * g->num_heads + head) * row);
    return pdl_instance_kv_layer(inst, r, l) + off;
}

/* Rows of block blk on every rank holding `v` at token < used ("mine") and elsewhere ("other"). */
static void count_rows(pdl_instance_t *inst, uint32_t blk, uint32_t used, uint8_t v, uint64_t *mine, uint64_t *other)
{
    *mine = *other = 0;
    for (int r = 0; r < pdl_instance_tp_size(inst); r++) {
        const pdl_kv_geometry_t *g = pdl_instance_geometry(inst, r);
        for (int l = 0; pdl_instance_kv_layer(inst, r, l) != NULL; l++)
            for (int h = 0; h < pdl_layout_num_halves(g); h++)
                for (uint32_t hd = 0; hd < g->num_heads; hd++)
                    for (uint32_t t = 0; t < g->block_size; t++) {
                        const uint8_t *p = row_at(inst, r, l, blk, h, hd, t);
                        for (uint64_t k = 0; k < pdl_layout_row_len(g); k++)
                            if (p[k] == v)
                                (t < used ? mine : other)[0]++;
                    }
    }
}

/*
 * A grant never shows an earlier request's KV: a victim fills a whole block and frees it, the
 * allocator hands the same block to a 1-token request (the attack: a 1-token prefill leg sent straight
 * to the prefill), which writes its one row and zero_tails before the hold. Its consumer pulls the
 * whole block and finds its row and zeros -- before, the 3 other rows of every head were the victim's.
 */
static void tail(const tc_geo_t *g)
{
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 2, g, TOTAL, PDL_BACKEND_TCP, 60, 60, NULL, NULL));
    uint32_t victim, mine, cb;
    assert_int_equal(pdl_instance_alloc_blocks(p, 1, &victim, NULL), PDL_OK);
    for (int r = 0; r < 2; r++)
        for (int l = 0; l < g->layers; l++)
            for (int h = 0; h < (g->mla ? 1 : 2); h++)
                for (uint32_t hd = 0; hd < pdl_instance_geometry(p, r)->num_heads; hd++)
                    for (int t = 0; t < g->block_size; t++)
                        memset(row_at(p, r, l, victim, h, hd, (uint32_t)t), 0xAB, pdl_layout_row_len(pdl_instance_geometry(p, r)));
    pdl_instance_free_blocks(p, &victim, 1);
    assert_int_equal(pdl_instance_alloc_blocks(p, 1, &mine, NULL), PDL_OK);
    assert_int_equal(mine, victim); /* the most recently freed block first: the attack's premise */
    for (int r = 0; r < 2; r++)
        for (int l = 0; l < g->layers; l++)
            for (int h = 0; h < (g->mla ? 1 : 2); h++)
                for (uint32_t hd = 0; hd < pdl_instance_geometry(p, r)->num_heads; hd++)
                    memset(row_at(p, r, l, mine, h, hd, 0), 0x11, pdl_layout_row_len(pdl_instance_geometry(p, r)));
    pdl_error_t e;
    assert_int_equal(pdl_instance_zero_tail(p, &mine, 1, 0, &e), PDL_ERR_INVALID);
    assert_int_equal(pdl_instance_zero_tail(p, &mine, 1, (uint64_t)g->block_size + 1, &e), PDL_ERR_INVALID);
    assert_int_equal(pdl_instance_zero_tail(p, &mine, 1, 1, &e), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "tx-tail", &mine, 1, &e), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 1, &cb, NULL), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "tx-tail", &mine, 1, &kp);
    if (tc_pull_wait(c, &kp, &cb, 1, &e) != PDL_OK)
        fail_msg("pull: %s", e.msg);
    pdl_kv_params_clear(&kp);
    uint64_t own, leaked, own0, zeros;
    count_rows(c, cb, 1, 0xAB, &own, &leaked);
    assert_int_equal(own + leaked, 0); /* no victim byte reached the consumer */
    count_rows(c, cb, 1, 0x11, &own, &leaked);
    assert_true(own > 0);
    assert_int_equal(leaked, 0);
    count_rows(c, cb, 1, 0, &own0, &zeros);
    assert_int_equal(own0, 0);
    assert_true(zeros > 0);
    printf("zero_tail (%s): the consumer read %llu bytes of its own row, %llu zero bytes, 0 of the victim's\n",
           g->order == PDL_KV_HND ? "HND" : "NHD", (unsigned long long)own, (unsigned long long)zeros);
    pdl_instance_free_blocks(c, &cb, 1);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void tail_hnd(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    tail(&g);
}

static void tail_nhd(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_nhd(8, 2);
    tail(&g);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scrubbed),
        cmocka_unit_test(kept_without_scrub),
        cmocka_unit_test(tail_hnd),
        cmocka_unit_test(tail_nhd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
