/*
 * test_connector_kv_regions.c -- caller-owned KV memory (pdl_instance_config_t.kv_regions): the
 * instance registers the caller's regions instead of allocating its own, never clears them, and a
 * READ-mode pull between two such instances (P2/D4 over tcp, head splitting) lands every byte in the
 * caller's memory; pdl_instance_kv_region_len and the size check fail with messages naming the value.
 * This is the C side of the Python package's buffer registration (python/pdlink).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_connector_util.h"

#define NBLK 3
#define TOTAL_BLOCKS 8

/* The regions handed to the instance being created (tc_instance calls the tweak before create). */
static void *g_regions[PDL_TOPO_MAX_TP];
static size_t g_lens[PDL_TOPO_MAX_TP];

static void use_regions(pdl_instance_config_t *c)
{
    c->kv_regions = g_regions;
    c->kv_region_lens = g_lens;
}

static void base_config(pdl_instance_config_t *c, const tc_geo_t *g, int tp)
{
    pdl_instance_config_defaults(c);
    c->model = tc_model(g);
    c->tp_size = tp;
    c->num_blocks = TOTAL_BLOCKS;
}

/* Allocate tp regions of the exact length, filled with `fill`, into out[] / lens[]. */
static void make_regions(const tc_geo_t *g, int tp, uint8_t fill, void **out, size_t *lens)
{
    pdl_instance_config_t c;
    base_config(&c, g, tp);
    for (int r = 0; r < tp; r++) {
        uint64_t len = 0;
        pdl_error_t e;
        assert_int_equal(pdl_instance_kv_region_len(&c, r, &len, &e), PDL_OK);
        out[r] = malloc((size_t)len);
        assert_non_null(out[r]);
        memset(out[r], fill, (size_t)len);
        lens[r] = (size_t)len;
    }
}

static void kv_regions_pull_lands_in_caller_memory(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    void *preg[2], *creg[4];
    size_t plen[2], clen[4];
    make_regions(&g, 2, 0x00, preg, plen);
    make_regions(&g, 4, 0xAB, creg, clen);

    memcpy(g_regions, preg, sizeof(preg));
    memcpy(g_lens, plen, sizeof(plen));
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL_BLOCKS, PDL_BACKEND_TCP, 60, use_regions);
    assert_non_null(p);
    memcpy(g_regions, creg, sizeof(creg));
    memcpy(g_lens, clen, sizeof(clen));
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 4, &g, TOTAL_BLOCKS, PDL_BACKEND_TCP, 60, use_regions);
    assert_non_null(c);

    /* The instance's layers are the caller's memory, which it did not clear. */
    for (int r = 0; r < 4; r++) {
        assert_ptr_equal(pdl_instance_kv_layer(c, r, 0), creg[r]);
        assert_int_equal(((uint8_t *)creg[r])[clen[r] - 1], 0xAB);
    }
    assert_ptr_equal(pdl_instance_kv_layer(p, 1, 0), preg[1]);
    const pdl_kv_geometry_t *g1 = pdl_instance_geometry(p, 1);
    assert_ptr_equal(pdl_instance_kv_layer(p, 1, 1), (uint8_t *)preg[1] + pdl_layout_region_len(g1));

    uint32_t pblk[NBLK], cblk[NBLK], skip[2];
    assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, pblk, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, skip, NULL), PDL_OK); /* different ids on both sides */
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cblk, NULL), PDL_OK);
    tc_fill(p, g.heads, g.mla, pblk, NBLK, 7);
    pdl_error_t e;
    assert_int_equal(pdl_instance_hold(p, "tx-regions", pblk, NBLK, &e), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "tx-regions", pblk, NBLK, &kp);
    pdl_pull_t *pull = NULL;
    if (pdl_instance_pull(c, &kp, NULL, cblk, NBLK, &pull, &e) != PDL_OK)
        fail_msg("pull: %s", e.msg);
    pdl_kv_params_clear(&kp);
    if (pdl_pull_wait(pull, 30000, &e) != PDL_OK)
        fail_msg("pull wait: %s", e.msg);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, g.heads, g.mla, cblk, NBLK, 7, &checked), 0);
    assert_int_equal(checked, pdl_pull_bytes(pull));
    assert_true(checked > 0);
    pdl_pull_free(pull);
    /* Blocks nobody wrote keep the caller's bytes: the last block (never allocated) ends each region. */
    for (int r = 0; r < 4; r++)
        assert_int_equal(((uint8_t *)creg[r])[clen[r] - 1], 0xAB);
    assert_true(tc_wait_for(tc_no_held, p, 20000));

    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
    /* destroy neither freed nor unmapped the caller's memory: it is still writable here */
    for (int r = 0; r < 4; r++) {
        memset(creg[r], 0, clen[r]);
        free(creg[r]);
    }
    for (int r = 0; r < 2; r++)
        free(preg[r]);
}

static void kv_regions_too_small_refused(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_config_t c;
    base_config(&c, &g, 2);
    c.conn.read_mode = true;
    uint64_t need = 0;
    assert_int_equal(pdl_instance_kv_region_len(&c, 0, &need, NULL), PDL_OK);
    static uint8_t small[64];
    void *regions[2] = {small, small};
    size_t lens[2] = {sizeof(small), sizeof(small)};
    c.kv_regions = regions;
    c.kv_region_lens = lens;
    int hs = tp_free_range(4);
    assert_true(hs > 0);
    c.conn.handshake_port = hs;
    c.conn.notify_port = hs + 2;
    pdl_instance_t *inst = NULL;
    pdl_error_t e;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_INVALID);
    assert_null(inst);
    char want[96];
    snprintf(want, sizeof(want), "of 64 bytes, but the geometry needs %llu", (unsigned long long)need);
    assert_non_null(strstr(e.msg, want));
    assert_non_null(strstr(e.msg, "instance rank 0"));
}

static void kv_region_len_checks(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_config_t c;
    base_config(&c, &g, 4);
    uint64_t len = 0;
    pdl_error_t e;
    /* 8 heads over TP4: 2 heads per rank; every layer one after the other */
    assert_int_equal(pdl_instance_kv_region_len(&c, 3, &len, &e), PDL_OK);
    uint64_t per_head_layer = (uint64_t)TOTAL_BLOCKS * (uint64_t)g.block_size * (uint64_t)g.head_dim * (uint64_t)g.elem *
                              2u /* K and V */;
    assert_int_equal(len, per_head_layer * 2u * (uint64_t)g.layers);
    uint64_t untouched = 12345;
    assert_int_equal(pdl_instance_kv_region_len(&c, 4, &untouched, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "tp rank 4 not in [0, tp_size 4)"));
    assert_int_equal(untouched, 12345);
    c.num_blocks = 0;
    assert_int_equal(pdl_instance_kv_region_len(&c, 0, &len, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "num_blocks"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kv_region_len_checks),
        cmocka_unit_test(kv_regions_too_small_refused),
        cmocka_unit_test(kv_regions_pull_lands_in_caller_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
