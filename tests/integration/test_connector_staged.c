/*
 * test_connector_staged.c -- instances whose KV cache is device memory, moved by the tcp backend through
 * its pinned staging windows, on a host without a GPU.
 *
 * PDLINK_TEST_CUDA_FAKE=1 gives every engine the test CUDA driver (src/engine/cudadrv_fake.c): device
 * memory is a PROT_NONE mapping, so a CPU access by pdlink dies of SIGSEGV, while the driver's copies,
 * memset and gather kernel reach it through /proc/self/mem. Each case runs a producer and a consumer
 * instance (backend tcp, kv_mem_type CUDA) in a child, and the parent fails the case if the child dies
 * of a signal. The caller's device regions are one per rank (kv_regions) or one per layer
 * (kv_layer_regions); a few cases keep one side in the instance's own host memory. READ (hold, pull,
 * release) and WRITE (expect_push, push) with equal TP and head splits both ways (P1/D2, P2/D1). The
 * test reads every byte back through the test driver: the consumer's blocks carry the producer's
 * pattern, every other block of the consumer kept its fill, and the producer's region is all zeros
 * after the released hold's blocks were scrubbed on the device (scrub_freed_blocks). Then zero_tail on
 * the consumer's device blocks zeroes exactly the rows past the prompt. The `_slow` cases hold the test
 * driver's copies back for 2 ms after they were queued (PDLINK_TEST_CUDA_FAKE_LATENCY_US), so a window
 * used before its copy completed shows as wrong bytes.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "engine/cudadrv.h" /* the test driver, to make and read back device memory */
#include "test_fake_cuda.h"
#include "test_child.h"
#include "test_connector_util.h"

#define NBLK 3
#define TOTAL_BLOCKS 8
#define LAYERS 3
#define HEADS 4
#define FILL 0xAB

typedef enum mem_kind {
    MEM_OWN,        /* the instance's own host memory */
    MEM_DEV,        /* one device region per rank (kv_regions) */
    MEM_DEV_LAYERS, /* one device region per layer (kv_layer_regions) */
} mem_kind_t;

/* One instance's KV memory as the test sees it. */
typedef struct side {
    mem_kind_t kind;
    int tp;
    size_t layer_len;
    void *lay[PDL_TOPO_MAX_TP][LAYERS]; /* device address of each layer (MEM_DEV: inside one region) */
    size_t lens[PDL_TOPO_MAX_TP][LAYERS];
    void *rows[PDL_TOPO_MAX_TP];        /* kv_layer_regions[r] */
    const size_t *lrows[PDL_TOPO_MAX_TP];
    void *regions[PDL_TOPO_MAX_TP];     /* kv_regions[r] */
    size_t rlens[PDL_TOPO_MAX_TP];
    pdl_instance_t *inst;
} side_t;

static pdl_cudadrv_t *drv;
/* What the tweak hands to the instance being created (tc_instance calls it before create). */
static side_t *g_side;
static bool g_write;

static void use_side(pdl_instance_config_t *c)
{
    if (g_write) {
        c->conn.read_mode = false;
        c->allow_write_mode = true;
    }
    c->conn.scrub_freed_blocks = true;
    if (g_side->kind == MEM_OWN)
        return;
    c->kv_mem_type = PDL_MEM_TYPE_CUDA;
    if (g_side->kind == MEM_DEV) {
        c->kv_regions = g_side->regions;
        c->kv_region_lens = g_side->rlens;
    } else {
        c->kv_layer_regions = (void *const *const *)g_side->rows;
        c->kv_layer_region_lens = g_side->lrows;
    }
}

/* Device memory for every rank of a side, each byte `fill` (set on the device). */
static int side_alloc(side_t *s, mem_kind_t kind, const tc_geo_t *g, int tp, uint8_t fill)
{
    memset(s, 0, sizeof(*s));
    s->kind = kind;
    s->tp = tp;
    uint64_t total = tc_region_len(g, tp, TOTAL_BLOCKS);
    TCH_CHECK(total > 0, "kv_region_len");
    s->layer_len = (size_t)(total / LAYERS);
    if (kind == MEM_OWN)
        return 0;
    for (int r = 0; r < tp; r++) {
        CUdeviceptr d = 0;
        if (kind == MEM_DEV) {
            TCH_CHECK(drv->api.MemAlloc(&d, total) == CUDA_SUCCESS, "fake cuMemAlloc");
            TCH_CHECK(drv->api.MemsetD8Async(d, fill, total, NULL) == CUDA_SUCCESS, "fake cuMemsetD8");
            s->regions[r] = (void *)(uintptr_t)d;
            s->rlens[r] = (size_t)total;
        }
        /* Per layer: allocated in reverse order, each its own mapping between guard pages. */
        for (int l = LAYERS - 1; l >= 0; l--) {
            if (kind == MEM_DEV_LAYERS) {
                TCH_CHECK(drv->api.MemAlloc(&d, s->layer_len) == CUDA_SUCCESS, "fake cuMemAlloc");
                TCH_CHECK(drv->api.MemsetD8Async(d, fill, s->layer_len, NULL) == CUDA_SUCCESS, "fake cuMemsetD8");
                s->lay[r][l] = (void *)(uintptr_t)d;
            } else {
                s->lay[r][l] = (uint8_t *)s->regions[r] + (size_t)l * s->layer_len;
            }
            s->lens[r][l] = s->layer_len;
        }
        s->rows[r] = s->lay[r];
        s->lrows[r] = s->lens[r];
    }
    return 0;
}

static void side_free(side_t *s)
{
    pdl_instance_destroy(s->inst);
    for (int r = 0; r < s->tp; r++) {
        if (s->kind == MEM_DEV)
            drv->api.MemFree((CUdeviceptr)(uintptr_t)s->regions[r]);
        if (s->kind == MEM_DEV_LAYERS)
            for (int l = 0; l < LAYERS; l++)
                drv->api.MemFree((CUdeviceptr)(uintptr_t)s->lay[r][l]);
    }
}

static int side_make(side_t *s, pdl_role_t role, mem_kind_t kind, const tc_geo_t *g, int tp, uint8_t fill)
{
    if (side_alloc(s, kind, g, tp, fill) != 0)
        return 2;
    g_side = s;
    s->inst = tc_instance(role, tp, g, TOTAL_BLOCKS, PDL_BACKEND_TCP, 60, use_side);
    TCH_CHECK(s->inst != NULL, "instance (%s, %s)", role == PDL_ROLE_PRODUCER ? "producer" : "consumer",
          kind == MEM_OWN ? "own memory" : "device memory");
    if (kind != MEM_OWN)
        for (int r = 0; r < tp; r++)
            for (int l = 0; l < LAYERS; l++)
                TCH_CHECK(pdl_instance_kv_layer(s->inst, r, l) == s->lay[r][l], "kv_layer(%d, %d): not the device address",
                      r, l);
    return 0;
}

/* Layer l of rank r into buf (device memory: through the test driver), or buf back into it. */
static int layer_io(const side_t *s, int r, int l, uint8_t *buf, bool to_layer)
{
    if (s->kind == MEM_OWN) {
        uint8_t *p = pdl_instance_kv_layer(s->inst, r, l);
        memcpy(to_layer ? p : buf, to_layer ? buf : p, s->layer_len);
        return 0;
    }
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)s->lay[r][l];
    CUresult cr = to_layer ? drv->api.MemcpyHtoDAsync(d, buf, s->layer_len, NULL)
                           : drv->api.MemcpyDtoHAsync(buf, d, s->layer_len, NULL);
    TCH_CHECK(cr == CUDA_SUCCESS, "fake copy of rank %d layer %d", r, l);
    return 0;
}

/* The pattern of `seed` into blocks ids[0..n) of every rank and layer (tc_fill, through host copies). */
static int side_fill(const side_t *s, const uint32_t *ids, size_t n, uint32_t seed)
{
    uint8_t *buf = malloc(s->layer_len);
    TCH_CHECK(buf != NULL, "malloc");
    for (int r = 0; r < s->tp; r++)
        for (int l = 0; l < LAYERS; l++) {
            int rc = layer_io(s, r, l, buf, false);
            tc_walk_layer(pdl_instance_geometry(s->inst, r), buf, l, tc_first_head(s->tp, HEADS, false, r), ids, n,
                          seed, false, NULL);
            if (rc == 0)
                rc = layer_io(s, r, l, buf, true);
            if (rc != 0) {
                free(buf);
                return rc;
            }
        }
    free(buf);
    return 0;
}

static bool listed(uint32_t b, const uint32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == b)
            return true;
    return false;
}

/* Every byte of every rank and layer: blocks ids[0..n) carry the pattern of `seed` (n may be 0), every
 * other block is `other`. */
static int side_verify(const side_t *s, const uint32_t *ids, size_t n, uint32_t seed, uint8_t other)
{
    uint8_t *buf = malloc(s->layer_len);
    TCH_CHECK(buf != NULL, "malloc");
    int rc = 0;
    for (int r = 0; r < s->tp && rc == 0; r++) {
        const pdl_kv_geometry_t *g = pdl_instance_geometry(s->inst, r);
        uint64_t blen = pdl_layout_block_len(g);
        for (int l = 0; l < LAYERS && rc == 0; l++) {
            rc = layer_io(s, r, l, buf, false);
            uint64_t checked = 0, bad = 0;
            if (rc == 0 && n > 0)
                bad = tc_walk_layer(g, buf, l, tc_first_head(s->tp, HEADS, false, r), ids, n, seed, true, &checked);
            for (uint32_t b = 0; rc == 0 && b < g->num_blocks; b++)
                for (int h = 0; !listed(b, ids, n) && h < pdl_layout_num_halves(g); h++)
                    for (uint64_t i = 0; i < blen; i++, checked++)
                        bad += buf[pdl_layout_half_offset(g, b, h) + i] != other;
            if (rc == 0 && (bad != 0 || checked != s->layer_len)) {
                fprintf(stderr, "rank %d layer %d: %llu of %llu bytes wrong (layer %zu bytes)\n", r, l,
                        (unsigned long long)bad, (unsigned long long)checked, s->layer_len);
                rc = 2;
            }
        }
    }
    free(buf);
    return rc;
}

/* zero_tail on the consumer's blocks for a prompt that uses one token of the last block: that block's
 * rows of tokens 1.. are zero on every rank and layer, its token 0 and the other blocks keep the pattern
 * of `seed`. */
static int zero_tail_check(const side_t *s, const uint32_t *ids, uint32_t seed)
{
    pdl_error_t e;
    const pdl_kv_geometry_t *g0 = pdl_instance_geometry(s->inst, 0);
    uint64_t tokens = (uint64_t)(NBLK - 1) * g0->block_size + 1;
    TCH_CHECK(pdl_instance_zero_tail(s->inst, ids, NBLK, tokens, &e) == PDL_OK, "zero_tail: %s", e.msg);
    uint8_t *buf = malloc(s->layer_len);
    TCH_CHECK(buf != NULL, "malloc");
    uint64_t bad = 0;
    for (int r = 0; r < s->tp; r++) {
        const pdl_kv_geometry_t *g = pdl_instance_geometry(s->inst, r);
        int gh = tc_first_head(s->tp, HEADS, false, r);
        for (int l = 0; l < LAYERS; l++) {
            if (layer_io(s, r, l, buf, false) != 0) {
                free(buf);
                return 2;
            }
            uint64_t checked = 0;
            bad += tc_walk_layer(g, buf, l, gh, ids, NBLK - 1, seed, true, &checked);
            for (int half = 0; half < 2; half++) {
                uint64_t hoff = pdl_layout_half_offset(g, ids[NBLK - 1], half);
                for (int lh = 0; lh < (int)g->num_heads; lh++)
                    for (int t = 0; t < (int)g->block_size; t++)
                        for (int d = 0; d < (int)g->head_dim; d++)
                            for (int b = 0; b < (int)g->elem_size; b++) {
                                uint8_t want = t == 0 ? tc_byte(seed, l, gh + lh, NBLK - 1, t, d, b, half) : 0;
                                bad += buf[hoff + tc_elem_off(g, lh, t, d, half) + (uint64_t)b] != want;
                            }
            }
        }
    }
    free(buf);
    TCH_CHECK(bad == 0, "zero_tail: %llu bytes wrong", (unsigned long long)bad);
    return 0;
}

typedef struct tcase {
    bool write;
    int P, D;
    mem_kind_t pk, ck;
    pdl_kv_order_t order;
    bool slow; /* device copies complete 2 ms after they were queued */
} tcase_t;

static int read_case(side_t *p, side_t *c, const uint32_t *cblk)
{
    uint32_t pblk[NBLK];
    TCH_CHECK(pdl_instance_alloc_blocks(p->inst, NBLK, pblk, NULL) == PDL_OK, "producer blocks");
    TCH_CHECK(side_fill(p, pblk, NBLK, 31) == 0, "fill");
    TCH_CHECK(pdl_instance_hold(p->inst, "tx-staged", pblk, NBLK, NULL) == PDL_OK, "hold");
    pdl_kv_params_t kp;
    tc_params(p->inst, "tx-staged", pblk, NBLK, &kp);
    pdl_error_t e;
    pdl_status_t st = tc_pull_wait(c->inst, &kp, cblk, NBLK, &e);
    pdl_kv_params_clear(&kp);
    TCH_CHECK(st == PDL_OK, "pull: %s: %s", pdl_status_name(st), e.msg);
    return 0;
}

static int write_case(side_t *p, side_t *c, const uint32_t *cblk)
{
    char rid[1024];
    uint8_t uuid[16] = {7};
    TCH_CHECK(pdl_wire_format_request_id(pdl_instance_zmq_address(p->inst), pdl_instance_zmq_address(c->inst), uuid, rid,
                                     sizeof(rid)) > 0,
          "request id");
    uint32_t pblk[NBLK];
    TCH_CHECK(pdl_instance_alloc_blocks(p->inst, NBLK, pblk, NULL) == PDL_OK, "producer blocks");
    TCH_CHECK(side_fill(p, pblk, NBLK, 31) == 0, "fill");
    pdl_kv_params_t pk, ck;
    tc_leg_params("tx-staged-w", c->tp, &pk);
    tc_leg_params("tx-staged-w", p->tp, &ck);
    pdl_recv_t *rv = NULL;
    pdl_error_t e;
    pdl_status_t st = pdl_instance_expect_push(c->inst, &ck, rid, cblk, NBLK, &rv, &e);
    if (st == PDL_OK)
        st = pdl_instance_push(p->inst, &pk, rid, pblk, NBLK, &e);
    if (st == PDL_OK)
        st = pdl_recv_wait(rv, 30000, &e);
    pdl_recv_free(rv);
    pdl_kv_params_clear(&pk);
    pdl_kv_params_clear(&ck);
    TCH_CHECK(st == PDL_OK, "push: %s: %s", pdl_status_name(st), e.msg);
    /* The pushed blocks are the instance's: freed (and scrubbed) once every producer rank finished. */
    TCH_CHECK(tc_wait_for(tc_no_held, p->inst, 20000), "the producer still holds the push");
    return 0;
}

static int child(const tcase_t *tc)
{
    if (tfc_open(tc->slow ? "2000" : NULL, &drv))
        return 2;
    tc_geo_t g = tc_geo_default(HEADS);
    g.layers = LAYERS;
    g.order = tc->order;
    side_t p, c;
    g_write = tc->write;
    int rc = side_make(&p, PDL_ROLE_PRODUCER, tc->pk, &g, tc->P, 0);
    if (rc == 0)
        rc = side_make(&c, PDL_ROLE_CONSUMER, tc->ck, &g, tc->D, FILL);
    if (rc != 0)
        return rc;
    if (tc->ck == MEM_OWN) /* the instance's own memory starts zeroed: give it the fill the checks expect */
        for (int r = 0; r < c.tp; r++)
            for (int l = 0; l < LAYERS; l++)
                memset(pdl_instance_kv_layer(c.inst, r, l), FILL, c.layer_len);
    uint32_t skip[2], cblk[NBLK];
    TCH_CHECK(pdl_instance_alloc_blocks(c.inst, 2, skip, NULL) == PDL_OK, "consumer blocks"); /* other ids */
    TCH_CHECK(pdl_instance_alloc_blocks(c.inst, NBLK, cblk, NULL) == PDL_OK, "consumer blocks");
    rc = tc->write ? write_case(&p, &c, cblk) : read_case(&p, &c, cblk);
    if (rc == 0)
        rc = side_verify(&c, cblk, NBLK, 31, FILL);
    if (rc == 0 && !tc->write)
        TCH_CHECK(tc_wait_for(tc_no_held, p.inst, 20000), "the producer still holds the transfer");
    /* Released and scrubbed on the device: the producer's region is zeros again. */
    if (rc == 0)
        rc = side_verify(&p, NULL, 0, 0, 0);
    if (rc == 0 && tc->ck != MEM_OWN)
        rc = zero_tail_check(&c, cblk, 31);
    side_free(&c);
    side_free(&p);
    pdl__cudadrv_close(drv);
    return rc;
}

#define CASE(name, ...) TCH_DEVICE_CASE(name, child, tcase_t, __VA_ARGS__)

CASE(read_tp2_tp2_dev, false, 2, 2, MEM_DEV, MEM_DEV, PDL_KV_HND, false)
CASE(read_p1_d2_dev, false, 1, 2, MEM_DEV, MEM_DEV, PDL_KV_NHD, false)
CASE(read_p2_d1_dev_layers, false, 2, 1, MEM_DEV_LAYERS, MEM_DEV_LAYERS, PDL_KV_HND, false)
CASE(read_p1_d2_dev_layers_to_dev, false, 1, 2, MEM_DEV_LAYERS, MEM_DEV, PDL_KV_NHD, false)
CASE(read_p2_d1_dev_to_host, false, 2, 1, MEM_DEV, MEM_OWN, PDL_KV_NHD, false)
CASE(write_tp2_tp2_dev_layers, true, 2, 2, MEM_DEV_LAYERS, MEM_DEV_LAYERS, PDL_KV_NHD, false)
CASE(write_p1_d2_dev, true, 1, 2, MEM_DEV, MEM_DEV, PDL_KV_HND, false)
CASE(write_p2_d1_dev_to_dev_layers, true, 2, 1, MEM_DEV, MEM_DEV_LAYERS, PDL_KV_NHD, false)
CASE(write_p1_d2_host_to_dev_layers, true, 1, 2, MEM_OWN, MEM_DEV_LAYERS, PDL_KV_HND, false)
CASE(read_p2_d1_dev_layers_slow, false, 2, 1, MEM_DEV_LAYERS, MEM_DEV_LAYERS, PDL_KV_NHD, true)
CASE(write_p1_d2_dev_slow, true, 1, 2, MEM_DEV, MEM_DEV, PDL_KV_NHD, true)

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(read_tp2_tp2_dev),
        cmocka_unit_test(read_p1_d2_dev),
        cmocka_unit_test(read_p2_d1_dev_layers),
        cmocka_unit_test(read_p1_d2_dev_layers_to_dev),
        cmocka_unit_test(read_p2_d1_dev_to_host),
        cmocka_unit_test(write_tp2_tp2_dev_layers),
        cmocka_unit_test(write_p1_d2_dev),
        cmocka_unit_test(write_p2_d1_dev_to_dev_layers),
        cmocka_unit_test(write_p1_d2_host_to_dev_layers),
        cmocka_unit_test(read_p2_d1_dev_layers_slow),
        cmocka_unit_test(write_p1_d2_dev_slow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
