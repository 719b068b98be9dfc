/*
 * test_connector_layer_regions.c -- caller-owned KV memory with one region per layer
 * (pdl_instance_config_t.kv_layer_regions), as vLLM's GPU model runner allocates it: every layer of
 * every rank is its own malloc, with spacers between so no two layers are adjacent. READ and WRITE
 * between such instances (TP2->TP2 over shm, the head split P1/D2 over tcp), and between a per-layer
 * instance and a single-region one in both directions, land every byte in the caller's memory; a
 * released hold's per-layer grants are revoked (a second read is refused); zero_tail reaches every
 * layer's region; the config checks name rank and layer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_connector_util.h"

#define NBLK 3
#define TOTAL_BLOCKS 8
#define LAYERS 4

/* One instance's caller memory: rank r's layer l at lay[r][l], with a spacer malloc after each. */
typedef struct layer_mem {
    int tp;
    void *lay[PDL_TOPO_MAX_TP][LAYERS];
    void *spacer[PDL_TOPO_MAX_TP][LAYERS];
    size_t len;
    void *rows[PDL_TOPO_MAX_TP]; /* kv_layer_regions[r] */
    size_t lens[PDL_TOPO_MAX_TP][LAYERS];
    const size_t *lrows[PDL_TOPO_MAX_TP];
} layer_mem_t;

/* What the tweak hands to the instance being created (tc_instance calls it before create). */
static layer_mem_t *g_mem;
static bool g_write;

static void use_layers(pdl_instance_config_t *c)
{
    c->kv_layer_regions = (void *const *const *)g_mem->rows;
    c->kv_layer_region_lens = g_mem->lrows;
    if (g_write) {
        c->conn.read_mode = false;
        c->allow_write_mode = true;
    }
}

static void write_only(pdl_instance_config_t *c)
{
    if (g_write) {
        c->conn.read_mode = false;
        c->allow_write_mode = true;
    }
}

static tc_geo_t geo(void)
{
    tc_geo_t g = tc_geo_default(8);
    g.layers = LAYERS;
    return g;
}

static void layer_mem_make(layer_mem_t *m, const tc_geo_t *g, int tp, uint8_t fill)
{
    memset(m, 0, sizeof(*m));
    m->tp = tp;
    uint64_t total = tc_region_len(g, tp, TOTAL_BLOCKS);
    assert_true(total > 0);
    m->len = (size_t)(total / LAYERS);
    for (int r = 0; r < tp; r++) {
        /* Layers allocated in reverse order with spacers: no layer follows the one before it. */
        for (int l = LAYERS - 1; l >= 0; l--) {
            m->lay[r][l] = malloc(m->len);
            m->spacer[r][l] = malloc(4096 + 64 * (size_t)l);
            assert_non_null(m->lay[r][l]);
            memset(m->lay[r][l], fill, m->len);
            m->lens[r][l] = m->len;
        }
        m->rows[r] = m->lay[r];
        m->lrows[r] = m->lens[r];
    }
}

static void layer_mem_free(layer_mem_t *m)
{
    for (int r = 0; r < m->tp; r++)
        for (int l = 0; l < LAYERS; l++) {
            free(m->lay[r][l]);
            free(m->spacer[r][l]);
        }
}

/* A single-region instance's memory is the instance's own: tweak NULL (READ) or write_only. */
static pdl_instance_t *make(pdl_role_t role, int tp, const tc_geo_t *g, pdl_backend_kind_t be, layer_mem_t *m)
{
    g_mem = m;
    pdl_instance_t *inst = tc_instance(role, tp, g, TOTAL_BLOCKS, be, 60, m ? use_layers : write_only);
    assert_non_null(inst);
    if (m != NULL)
        for (int r = 0; r < tp; r++)
            for (int l = 0; l < LAYERS; l++)
                assert_ptr_equal(pdl_instance_kv_layer(inst, r, l), m->lay[r][l]);
    return inst;
}

/* Every byte of the consumer's blocks matches, and the block after them kept the caller's fill. */
static void check_landed(pdl_instance_t *c, const tc_geo_t *g, const uint32_t *cblk, uint32_t seed, uint64_t moved,
                         const layer_mem_t *cm)
{
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, g->heads, g->mla, cblk, NBLK, seed, &checked), 0);
    assert_int_equal(checked, tc_instance_bytes(c, g->layers, NBLK));
    if (moved)
        assert_int_equal(checked, moved);
    if (cm != NULL)
        for (int r = 0; r < cm->tp; r++)
            for (int l = 0; l < LAYERS; l++)
                assert_int_equal(((uint8_t *)cm->lay[r][l])[cm->len - 1], 0xAB); /* last block: never written */
}

/* One run's producer (TP P) and consumer (TP D), each on layers of its own (p_layers, c_layers: the
 * caller's memory, zeroed for the producer and filled with 0xAB for the consumer) or on its instance's. */
typedef struct run {
    tc_geo_t g;
    layer_mem_t pm, cm;
    pdl_instance_t *p, *c;
} run_t;

static void run_open(run_t *x, int P, int D, pdl_backend_kind_t be, bool p_layers, bool c_layers, bool write)
{
    g_write = write;
    x->g = geo();
    layer_mem_make(&x->pm, &x->g, P, 0x00);
    layer_mem_make(&x->cm, &x->g, D, 0xAB);
    x->p = make(PDL_ROLE_PRODUCER, P, &x->g, be, p_layers ? &x->pm : NULL);
    x->c = make(PDL_ROLE_CONSUMER, D, &x->g, be, c_layers ? &x->cm : NULL);
    g_write = false;
}

static void run_close(run_t *x)
{
    pdl_instance_destroy(x->c);
    pdl_instance_destroy(x->p);
    layer_mem_free(&x->cm);
    layer_mem_free(&x->pm);
}

static void run_read(int P, int D, pdl_backend_kind_t be, bool p_layers, bool c_layers)
{
    run_t x;
    run_open(&x, P, D, be, p_layers, c_layers, false);
    pdl_instance_t *p = x.p, *c = x.c;
    const tc_geo_t g = x.g;

    uint32_t pblk[NBLK], cblk[NBLK], skip[2];
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, skip, NULL), PDL_OK); /* other ids than the producer's */
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cblk, NULL), PDL_OK);
    assert_int_equal(tc_hold_filled(p, "tx-layers", g.heads, g.mla, pblk, NBLK, 11), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "tx-layers", pblk, NBLK, &kp);
    pdl_pull_t *pull = NULL;
    pdl_error_t e;
    if (pdl_instance_pull(c, &kp, NULL, cblk, NBLK, &pull, &e) != PDL_OK)
        fail_msg("pull: %s", e.msg);
    if (pdl_pull_wait(pull, 30000, &e) != PDL_OK)
        fail_msg("pull wait (P%d/D%d): %s", P, D, e.msg);
    check_landed(c, &g, cblk, 11, pdl_pull_bytes(pull), c_layers ? &x.cm : NULL);
    pdl_pull_free(pull);
    assert_true(tc_wait_for(tc_no_held, p, 20000));

    /* The released hold's grants are gone on every layer: the same transfer cannot be read again. */
    pdl_status_t st = tc_pull_wait(c, &kp, cblk, NBLK, &e);
    assert_int_not_equal(st, PDL_OK);
    if (p_layers && st != PDL_ERR_DENIED)
        fail_msg("second pull of a released hold: %s (%s), expected a denial", pdl_status_string(st), e.msg);
    pdl_kv_params_clear(&kp);
    run_close(&x);
}

static void run_write(int P, int D, pdl_backend_kind_t be, bool p_layers, bool c_layers)
{
    run_t x;
    run_open(&x, P, D, be, p_layers, c_layers, true);
    pdl_instance_t *p = x.p, *c = x.c;
    const tc_geo_t g = x.g;

    uint32_t skip[2];
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, skip, NULL), PDL_OK);
    tc_push_leg_t leg;
    assert_int_equal(tc_push_leg(&leg, p, c, "tx-layers-w", 5, g.heads, NBLK, 23), PDL_OK);
    pdl_recv_t *rv = NULL;
    pdl_error_t e;
    assert_int_equal(pdl_instance_expect_push(c, &leg.ck, leg.rid, leg.cb, NBLK, &rv, &e), PDL_OK);
    if (pdl_instance_push(p, &leg.pk, leg.rid, leg.pb, NBLK, &e) != PDL_OK)
        fail_msg("push: %s", e.msg);
    if (pdl_recv_wait(rv, 30000, &e) != PDL_OK)
        fail_msg("receive (P%d/D%d): %s", P, D, e.msg);
    pdl_recv_free(rv);
    check_landed(c, &g, leg.cb, 23, 0, c_layers ? &x.cm : NULL);
    tc_push_leg_clear(&leg);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    run_close(&x);
}

static void read_tp2_tp2_shm(void **state)
{
    (void)state;
    run_read(2, 2, PDL_BACKEND_SHM, true, true);
}
static void read_p1_d2_tcp(void **state)
{
    (void)state;
    run_read(1, 2, PDL_BACKEND_TCP, true, true);
}
static void read_tp2_tp2_tcp(void **state)
{
    (void)state;
    run_read(2, 2, PDL_BACKEND_TCP, true, true);
}
static void read_p1_d2_shm(void **state)
{
    (void)state;
    run_read(1, 2, PDL_BACKEND_SHM, true, true);
}
/* Mixed: a per-layer producer read by a single-region consumer, and the other way round. */
static void read_layers_to_single_tcp(void **state)
{
    (void)state;
    run_read(2, 1, PDL_BACKEND_TCP, true, false);
}
static void read_single_to_layers_shm(void **state)
{
    (void)state;
    run_read(1, 2, PDL_BACKEND_SHM, false, true);
}
static void write_tp2_tp2_shm(void **state)
{
    (void)state;
    run_write(2, 2, PDL_BACKEND_SHM, true, true);
}
static void write_p1_d2_tcp(void **state)
{
    (void)state;
    run_write(1, 2, PDL_BACKEND_TCP, true, true);
}
static void write_tp2_tp2_tcp(void **state)
{
    (void)state;
    run_write(2, 2, PDL_BACKEND_TCP, true, true);
}
static void write_p1_d2_shm(void **state)
{
    (void)state;
    run_write(1, 2, PDL_BACKEND_SHM, true, true);
}
static void write_single_to_layers_tcp(void **state)
{
    (void)state;
    run_write(2, 2, PDL_BACKEND_TCP, false, true);
}
static void write_layers_to_single_shm(void **state)
{
    (void)state;
    run_write(2, 2, PDL_BACKEND_SHM, true, false);
}

/* zero_tail on a per-layer instance zeroes the last block's tail rows in every layer's own region. */
static void zero_tail_every_layer(void **state)
{
    (void)state;
    g_write = false;
    tc_geo_t g = geo();
    layer_mem_t pm;
    layer_mem_make(&pm, &g, 2, 0x5A);
    pdl_instance_t *p = make(PDL_ROLE_PRODUCER, 2, &g, PDL_BACKEND_TCP, &pm);
    uint32_t ids[2];
    assert_int_equal(pdl_instance_alloc_blocks(p, 2, ids, NULL), PDL_OK);
    pdl_error_t e;
    uint64_t tokens = (uint64_t)g.block_size + 1; /* one token of the last block used */
    if (pdl_instance_zero_tail(p, ids, 2, tokens, &e) != PDL_OK)
        fail_msg("zero_tail: %s", e.msg);
    for (int r = 0; r < 2; r++) {
        const pdl_kv_geometry_t *kg = pdl_instance_geometry(p, r);
        for (int l = 0; l < LAYERS; l++) {
            const uint8_t *base = pm.lay[r][l];
            for (int half = 0; half < 2; half++) {
                uint64_t ho = pdl_layout_half_offset(kg, ids[1], half);
                for (int lh = 0; lh < (int)kg->num_heads; lh++) {
                    assert_int_equal(base[ho + tc_elem_off(kg, lh, 0, 0, half)], 0x5A); /* token 0: kept */
                    for (int t = 1; t < (int)kg->block_size; t++)
                        assert_int_equal(base[ho + tc_elem_off(kg, lh, t, 0, half)], 0);
                }
                /* the first block is full: untouched */
                assert_int_equal(base[pdl_layout_half_offset(kg, ids[0], half) + pdl_layout_block_len(kg) - 1], 0x5A);
            }
        }
    }
    pdl_instance_destroy(p);
    layer_mem_free(&pm);
}

static void layer_regions_refused(void **state)
{
    (void)state;
    tc_geo_t g = geo();
    layer_mem_t m;
    layer_mem_make(&m, &g, 2, 0);
    pdl_instance_config_t c;
    int hs = tp_free_range(4);
    assert_true(hs > 0);
    tc_config(&c, PDL_ROLE_PRODUCER, 2, &g, TOTAL_BLOCKS, PDL_BACKEND_TCP, 60, hs, hs + 2);
    c.kv_layer_regions = (void *const *const *)m.rows;
    c.kv_layer_region_lens = m.lrows;
    pdl_instance_t *inst = NULL;
    pdl_error_t e;

    /* both forms at once */
    void *one[2] = {m.lay[0][0], m.lay[1][0]};
    c.kv_regions = one;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_INVALID);
    assert_null(inst);
    assert_non_null(strstr(e.msg, "kv_regions and kv_layer_regions are both set"));
    c.kv_regions = NULL;

    /* a short layer: named by rank and layer */
    m.lens[1][2] = m.len - 1;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_INVALID);
    assert_null(inst);
    char want[128];
    snprintf(want, sizeof(want), "instance rank 1 layer 2: caller KV region %p of %zu bytes, but a layer needs %zu",
             m.lay[1][2], m.len - 1, m.len);
    if (strstr(e.msg, want) == NULL)
        fail_msg("got: %s", e.msg);
    m.lens[1][2] = m.len;

    /* a rank without its layers */
    m.rows[1] = NULL;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "instance rank 1: kv_layer_regions[1] is NULL"));
    layer_mem_free(&m);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layer_regions_refused),
        cmocka_unit_test(zero_tail_every_layer),
        cmocka_unit_test(read_tp2_tp2_shm),
        cmocka_unit_test(read_tp2_tp2_tcp),
        cmocka_unit_test(read_p1_d2_tcp),
        cmocka_unit_test(read_p1_d2_shm),
        cmocka_unit_test(read_layers_to_single_tcp),
        cmocka_unit_test(read_single_to_layers_shm),
        cmocka_unit_test(write_tp2_tp2_shm),
        cmocka_unit_test(write_tp2_tp2_tcp),
        cmocka_unit_test(write_p1_d2_tcp),
        cmocka_unit_test(write_p1_d2_shm),
        cmocka_unit_test(write_single_to_layers_tcp),
        cmocka_unit_test(write_layers_to_single_shm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
