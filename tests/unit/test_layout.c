/*
 * test_layout.c -- KV layout geometry, descriptor building and merging (docs/topology.md#kv-layout), and an exhaustive
 * byte-level simulation of heterogeneous-TP transfers.
 *
 * The simulation, for every compatible P, D in {1,2,3,4,6,8,12,16}, every valid H in {1..32}, MLA on and
 * off, HND/NHD and K/V separate or interleaved (the same on both sides; for H = 8 also every mix of the
 * two sides' orders and arrangements): fills each producer rank's
 * region (two layers) with bytes that encode (layer, head, token position, byte, K/V) -- blocks outside
 * the request encode a different position -- builds descriptors with the layout functions for random
 * and for consecutive block-id lists (the two sides have different num_blocks), copies with memcpy,
 * and checks that every KV byte of every consumer rank is exactly the expected byte and was written
 * exactly once (coverage bitmap), that nothing outside the request's blocks was written, that the
 * merged list moves the same bytes as the unmerged ranges, and that the WRITE plans of all producer
 * ranks produce the same consumer bytes as the READ plans. Expected positions are computed here from
 * the definition of the layout, not with the functions under test.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "pdlink/layout.h"
#include "pdlink/models.h"
#include "pdlink/topo.h"

/* ---- unit checks ---------------------------------------------------------------------------- */

static pdl_kv_geometry_t geom(uint64_t nb, uint32_t bs, uint32_t nh, uint32_t hd, uint32_t es, bool sep,
                              pdl_kv_order_t order, bool mla)
{
    return (pdl_kv_geometry_t){nb, bs, nh, hd, es, sep, order, mla, false};
}

static void order_names(void **state)
{
    (void)state;
    assert_string_equal(pdl_layout_order_name(PDL_KV_HND), "hnd");
    assert_string_equal(pdl_layout_order_name(PDL_KV_NHD), "nhd");
    assert_int_equal(pdl_layout_order_parse("NHD"), PDL_KV_NHD);
    assert_int_equal(pdl_layout_order_parse("hnd"), PDL_KV_HND);
    assert_int_equal(pdl_layout_order_parse("thd"), -1);
    assert_int_equal(pdl_layout_order_parse(NULL), -1);
}

static void lengths_and_offsets(void **state)
{
    (void)state;
    /* Llama-3.1-8B on TP4: 2 heads of 128 bf16, block 16 -> 8 KiB per half-block. */
    pdl_kv_geometry_t g = geom(100, 16, 2, 128, 2, true, PDL_KV_HND, false);
    assert_int_equal(pdl_layout_validate(&g, NULL), PDL_OK);
    assert_int_equal(pdl_layout_num_halves(&g), 2);
    assert_int_equal(pdl_layout_block_len(&g), 8192);
    assert_int_equal(pdl_layout_region_len(&g), 100 * 2 * 8192);
    assert_int_equal(pdl_layout_half_offset(&g, 3, 0), 3 * 8192);
    assert_int_equal(pdl_layout_half_offset(&g, 3, 1), 100 * 8192 + 3 * 8192);
    g.kv_separate = false;
    assert_int_equal(pdl_layout_half_offset(&g, 3, 0), 6 * 8192);
    assert_int_equal(pdl_layout_half_offset(&g, 3, 1), 7 * 8192);
    pdl_kv_geometry_t m = geom(10, 16, 1, 576, 2, false, PDL_KV_HND, true);
    assert_int_equal(pdl_layout_num_halves(&m), 1);
    assert_int_equal(pdl_layout_block_len(&m), 16 * 576 * 2);
    assert_int_equal(pdl_layout_half_offset(&m, 4, 0), 4 * 16 * 576 * 2);
    assert_int_equal(pdl_layout_region_len(&m), 10 * 16 * 576 * 2);
    /* vLLM's CPU cache, (blocks, heads, block_size, 2 * head_dim): one half, rows of K then V. */
    pdl_kv_geometry_t f = geom(28, 128, 4, 32, 4, true, PDL_KV_HND, false);
    f.kv_fused = true;
    assert_int_equal(pdl_layout_validate(&f, NULL), PDL_OK);
    assert_int_equal(pdl_layout_num_halves(&f), 1);
    assert_int_equal(pdl_layout_row_len(&f), 2 * 32 * 4);
    assert_int_equal(pdl_layout_block_len(&f), 128 * 4 * 2 * 32 * 4);
    assert_int_equal(pdl_layout_half_offset(&f, 5, 0), 5 * 128 * 4 * 2 * 32 * 4);
    assert_int_equal(pdl_layout_region_len(&f), 28 * 128 * 4 * 2 * 32 * 4);
}

static void layout_names(void **state)
{
    (void)state;
    char buf[24];
    pdl_kv_geometry_t g = geom(4, 16, 2, 8, 2, true, PDL_KV_HND, false);
    assert_int_equal(pdl_layout_name(&g, buf, sizeof(buf)), 3);
    assert_string_equal(buf, "hnd"); /* what pdlink always sent: unchanged on the wire */
    g.kv_separate = false;
    g.order = PDL_KV_NHD;
    pdl_layout_name(&g, buf, sizeof(buf));
    assert_string_equal(buf, "nhd-blockfirst");
    g.kv_fused = true; /* kv_separate is meaningless with one half */
    pdl_layout_name(&g, buf, sizeof(buf));
    assert_string_equal(buf, "nhd-fused");
    g.order = PDL_KV_HND;
    g.kv_separate = true;
    pdl_layout_name(&g, buf, sizeof(buf));
    assert_string_equal(buf, "hnd-fused");
    assert_int_equal(pdl_layout_name(&g, buf, 4), -1);
}

/* A fused side and a non-fused side never exchange bytes; MLA cannot be fused. */
static void fused_errors(void **state)
{
    (void)state;
    pdl_kv_geometry_t a = geom(4, 16, 2, 8, 2, true, PDL_KV_HND, false), b = a;
    b.kv_fused = true;
    pdl_plan_piece_t pc = {.producer_rank = 0, .src_head = 0, .dst_head = 0, .num_heads = 2};
    uint32_t ids[1] = {1};
    pdl_descv_t dv = {0};
    pdl_error_t e;
    assert_int_equal(pdl_layout_build_descs(&a, &b, PDL_DIR_READ, &pc, 1, ids, ids, 1, 0, 0, &dv, &e),
                     PDL_ERR_MISMATCH);
    assert_non_null(strstr(e.msg, "kv_fused differs: local false, remote true"));
    assert_int_equal(dv.n, 0);
    pdl_kv_geometry_t m = geom(4, 16, 1, 576, 2, false, PDL_KV_HND, true);
    m.kv_fused = true;
    assert_int_equal(pdl_layout_validate(&m, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "kv_fused"));
    /* HND, fused, equal TP: one block pair is one range covering K and V of both heads. */
    assert_int_equal(pdl_layout_build_descs(&b, &b, PDL_DIR_READ, &pc, 1, ids, ids, 1, 0, 0, &dv, &e), PDL_OK);
    assert_int_equal(dv.n, 1);
    assert_int_equal(dv.v[0].local_off, pdl_layout_block_len(&b));
    assert_int_equal(dv.v[0].len, 16 * 2 * 2 * 8 * 2);
    pdl_descv_free(&dv);
}

/* Failures behind a prefixed message still fail without an err (they used to return PDL_OK). */
static void errors_without_err(void **state)
{
    (void)state;
    pdl_kv_geometry_t g;
    const pdl_model_preset_t *m = pdl_model_find("tiny");
    assert_non_null(m);
    assert_int_equal(pdl_model_geometry(m, 3, 16, 8, 2, PDL_KV_HND, false, &g, NULL), PDL_ERR_INVALID);
    assert_int_equal(pdl_model_geometry(m, 1, 0, 8, 2, PDL_KV_HND, false, &g, NULL), PDL_ERR_INVALID);
    pdl_kv_geometry_t bad = {0};
    pdl_descv_t dv = {0};
    pdl_plan_piece_t pc = {0};
    uint32_t ids[1] = {0};
    assert_int_equal(pdl_layout_build_descs(&bad, &bad, PDL_DIR_READ, &pc, 1, ids, ids, 1, 0, 0, &dv, NULL),
                     PDL_ERR_INVALID);
}

static void validate_errors(void **state)
{
    (void)state;
    pdl_error_t e;
    pdl_kv_geometry_t g = geom(0, 16, 2, 128, 2, true, PDL_KV_HND, false);
    assert_int_equal(pdl_layout_validate(&g, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "num_blocks"));
    g = geom(4, 16, 2, 0, 2, true, PDL_KV_HND, false);
    assert_int_equal(pdl_layout_validate(&g, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "head_dim"));
    g = geom(UINT64_MAX / 2, 16, 2, 128, 2, true, PDL_KV_HND, false);
    assert_int_equal(pdl_layout_validate(&g, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "overflow"));
    g = geom(4, UINT32_MAX, UINT32_MAX, UINT32_MAX, 2, true, PDL_KV_HND, false);
    assert_int_equal(pdl_layout_validate(&g, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "overflow"));
    g = geom(4, 16, 2, 576, 2, false, PDL_KV_HND, true);
    assert_int_equal(pdl_layout_validate(&g, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "MLA"));
    g = geom(4, 16, 2, 128, 2, false, (pdl_kv_order_t)7, false);
    assert_int_equal(pdl_layout_validate(&g, &e), PDL_ERR_INVALID);
}

static void build_errors(void **state)
{
    (void)state;
    pdl_error_t e;
    pdl_descv_t dv = {0};
    pdl_kv_geometry_t c = geom(8, 16, 1, 128, 2, true, PDL_KV_HND, false);
    pdl_kv_geometry_t p = geom(5, 16, 2, 128, 2, true, PDL_KV_HND, false);
    pdl_plan_piece_t pc = {.producer_rank = 2, .first_head = 5, .num_heads = 1, .src_head = 1, .dst_head = 0};
    uint32_t lb[2] = {7, 8}, rb[2] = {4, 1};
    /* Local block 8 is outside the consumer's 8 blocks. */
    assert_int_equal(pdl_layout_build_descs(&c, &p, PDL_DIR_READ, &pc, 1, lb, rb, 2, 0, 0, &dv, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "local block id 8"));
    assert_non_null(strstr(e.msg, "num_blocks 8"));
    assert_int_equal(dv.n, 0);
    lb[1] = 3;
    rb[0] = 5;
    assert_int_equal(pdl_layout_build_descs(&c, &p, PDL_DIR_READ, &pc, 1, lb, rb, 2, 0, 0, &dv, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "remote block id 5"));
    rb[0] = 4;
    /* src_head 2 is outside the producer's 2 heads. */
    pdl_plan_piece_t bad = pc;
    bad.src_head = 2;
    assert_int_equal(pdl_layout_build_descs(&c, &p, PDL_DIR_READ, &bad, 1, lb, rb, 2, 0, 0, &dv, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "remote 2 heads"));
    /* Two producers in one list. */
    pdl_plan_piece_t two[2] = {pc, pc};
    two[1].producer_rank = 3;
    assert_int_equal(pdl_layout_build_descs(&c, &p, PDL_DIR_READ, two, 2, lb, rb, 2, 0, 0, &dv, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "two prefill ranks"));
    /* Head dim mismatch names both values. */
    pdl_kv_geometry_t p64 = p;
    p64.head_dim = 64;
    assert_int_equal(pdl_layout_build_descs(&c, &p64, PDL_DIR_READ, &pc, 1, lb, rb, 2, 0, 0, &dv, &e),
                     PDL_ERR_MISMATCH);
    assert_non_null(strstr(e.msg, "head_dim differs: local 128, remote 64"));
    /* A base that would push the region past 2^64. */
    assert_int_equal(pdl_layout_build_descs(&c, &p, PDL_DIR_READ, &pc, 1, lb, rb, 2, UINT64_MAX - 10, 0, &dv, &e),
                     PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "overflow"));
    assert_int_equal(dv.n, 0);
    /* And the happy path: 2 blocks x K,V = 4 descriptors of 4 KiB at the second head slot. */
    assert_int_equal(pdl_layout_build_descs(&c, &p, PDL_DIR_READ, &pc, 1, lb, rb, 2, 0, 0, &dv, &e), PDL_OK);
    assert_int_equal(dv.n, 4);
    assert_int_equal(pdl_layout_total_bytes(&dv), 4 * 4096);
    for (size_t i = 0; i < dv.n; i++) {
        assert_int_equal(dv.v[i].len, 4096);
        assert_int_equal(dv.v[i].remote_off % 8192, 4096); /* the second head of an 8 KiB half-block */
    }
    pdl_descv_free(&dv);
}

/* P4/D8 Llama-like: consecutive blocks are 8 KiB apart on the producer, so nothing merges (anchors §6). */
static void worked_example_p4_d8(void **state)
{
    (void)state;
    pdl_descv_t dv = {0};
    pdl_kv_geometry_t c = geom(300, 16, 1, 128, 2, true, PDL_KV_HND, false);
    pdl_kv_geometry_t p = geom(256, 16, 2, 128, 2, true, PDL_KV_HND, false);
    pdl_plan_piece_t pc = {.producer_rank = 0, .first_head = 1, .num_heads = 1, .src_head = 1, .dst_head = 0};
    uint32_t lb[256], rb[256];
    for (int i = 0; i < 256; i++)
        lb[i] = rb[i] = (uint32_t)i;
    assert_int_equal(pdl_layout_build_descs(&c, &p, PDL_DIR_READ, &pc, 1, lb, rb, 256, 0, 0, &dv, NULL), PDL_OK);
    assert_int_equal(dv.n, 512);
    /* Whole-block reads (P8/D4 replicated or identical heads) merge across consecutive blocks. */
    pdl_descv_reset(&dv);
    pdl_kv_geometry_t same = geom(256, 16, 2, 128, 2, false, PDL_KV_HND, false);
    pdl_plan_piece_t whole = {.producer_rank = 0, .first_head = 0, .num_heads = 2, .src_head = 0, .dst_head = 0};
    assert_int_equal(pdl_layout_build_descs(&same, &same, PDL_DIR_READ, &whole, 1, lb, rb, 256, 0, 0, &dv, NULL),
                     PDL_OK);
    assert_int_equal(dv.n, 1);
    assert_int_equal(dv.v[0].len, 256 * 2 * 8192);
    /* NHD whole blocks: per-token ranges re-merge into one. */
    pdl_descv_reset(&dv);
    same.order = PDL_KV_NHD;
    assert_int_equal(pdl_layout_build_descs(&same, &same, PDL_DIR_READ, &whole, 1, lb, rb, 256, 0, 0, &dv, NULL),
                     PDL_OK);
    assert_int_equal(dv.n, 1);
    /* NHD head slice: one range per token, 16 per half-block. */
    pdl_descv_reset(&dv);
    c.order = p.order = PDL_KV_NHD;
    assert_int_equal(pdl_layout_build_descs(&c, &p, PDL_DIR_READ, &pc, 1, lb, rb, 1, 0, 0, &dv, NULL), PDL_OK);
    assert_int_equal(dv.n, 32);
    assert_int_equal(dv.v[0].len, 256);
    assert_int_equal(dv.v[0].remote_off, 256);  /* token 0, head 1 */
    assert_int_equal(dv.v[1].remote_off, 768);  /* token 1, head 1: stride 2 heads x 256 B */
    assert_int_equal(dv.v[1].local_off, 256);   /* the consumer holds one head: contiguous locally */
    pdl_descv_free(&dv);
}

static void merge_rules(void **state)
{
    (void)state;
    pdl_descv_t dv = {0};
    /* Unsorted input; 0-100 and 100-150 are adjacent on both sides; 150-200 only locally. */
    assert_int_equal(pdl_descv_push(&dv, 100, 1100, 50), 0);
    assert_int_equal(pdl_descv_push(&dv, 0, 1000, 100), 0);
    assert_int_equal(pdl_descv_push(&dv, 150, 5000, 50), 0);
    assert_int_equal(pdl_descv_push(&dv, 300, 5050, 10), 0); /* adjacent remotely only */
    assert_int_equal(pdl_descv_push(&dv, 310, 5060, 10), 0); /* adjacent to the previous on both sides */
    pdl_layout_merge(&dv);
    assert_int_equal(dv.n, 3);
    assert_int_equal(dv.v[0].local_off, 0);
    assert_int_equal(dv.v[0].remote_off, 1000);
    assert_int_equal(dv.v[0].len, 150);
    assert_int_equal(dv.v[1].local_off, 150);
    assert_int_equal(dv.v[1].len, 50);
    assert_int_equal(dv.v[2].local_off, 300);
    assert_int_equal(dv.v[2].len, 20);
    assert_int_equal(pdl_layout_total_bytes(&dv), 220);
    pdl_descv_reset(&dv);
    pdl_layout_merge(&dv); /* empty: no-op */
    assert_int_equal(dv.n, 0);
    pdl_descv_free(&dv);
    pdl_layout_merge(&dv); /* freed: no-op */
    pdl_layout_merge(NULL);
}

/* ---- exhaustive simulation -------------------------------------------------------------------- */

#define BS 3      /* tokens per block: odd on purpose */
#define HD 2      /* head dim */
#define ES 2      /* bf16 */
#define LAYERS 2
#define P_BLOCKS 5 /* producer num_blocks */
#define C_BLOCKS 7 /* consumer num_blocks: different on purpose */
#define NREQ 3     /* blocks per request */

static uint8_t kv_byte(int layer, int head, int pos, int b, int half)
{
    uint32_t x = (uint32_t)layer * 0x9E3779B1u ^ (uint32_t)head * 0x85EBCA77u ^ (uint32_t)pos * 0xC2B2AE3Du ^
                 (uint32_t)b * 0x27D4EB2Fu ^ (uint32_t)half * 0x165667B1u;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    return (uint8_t)(x ^ (x >> 8));
}

/* Position of one byte in a layer region, from the layout's definition (docs/topology.md#kv-layout, layout.h). */
static uint64_t pos_of(const pdl_kv_geometry_t *g, uint64_t block, int half, int head, int tok, int b)
{
    uint64_t hb = (uint64_t)g->head_dim * g->elem_size;
    if (g->kv_fused) { /* one half: a row is K then V of one (head, token) */
        uint64_t row = 2 * hb, bl = (uint64_t)g->block_size * g->num_heads * row;
        uint64_t in = g->order == PDL_KV_HND ? ((uint64_t)head * g->block_size + tok) * row
                                             : ((uint64_t)tok * g->num_heads + head) * row;
        return block * bl + in + (uint64_t)half * hb + (uint64_t)b;
    }
    uint64_t bl = (uint64_t)g->block_size * g->num_heads * hb;
    uint64_t base;
    if (g->is_mla)
        base = block * bl;
    else if (g->kv_separate)
        base = (uint64_t)half * g->num_blocks * bl + block * bl;
    else
        base = (block * 2 + (uint64_t)half) * bl;
    uint64_t in = g->order == PDL_KV_HND ? ((uint64_t)head * g->block_size + tok) * hb
                                         : ((uint64_t)tok * g->num_heads + head) * hb;
    return base + in + (uint64_t)b;
}

typedef struct sim {
    int P, D, H;
    bool mla;
    pdl_kv_geometry_t pg, cg;
    uint64_t pregion, cregion; /* one layer */
    uint8_t *prod[16];
    uint8_t *cons_read[16], *cons_write[16], *cons_unmerged[16];
    uint8_t *cover[16];
    uint32_t pblocks[NREQ], cblocks[NREQ];
    uint64_t stats_descs, stats_unmerged;
} sim_t;

static uint32_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)(*s >> 11);
}

/* NREQ distinct random ids in [0, n), or a consecutive run. */
static void pick_blocks(uint32_t *out, uint32_t n, bool consecutive, uint64_t *rng)
{
    if (consecutive) {
        uint32_t start = rng_next(rng) % (n - NREQ + 1);
        for (int i = 0; i < NREQ; i++)
            out[i] = start + (uint32_t)i;
        return;
    }
    uint32_t perm[16];
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = rng_next(rng) % (i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(out, perm, NREQ * sizeof(*out));
}

/* Copies the descriptors of one layer and marks coverage; READ: local = consumer, WRITE: local = producer. */
static void apply(const pdl_descv_t *dv, pdl_dir_t dir, uint8_t *cons, uint64_t cons_len, const uint8_t *prod,
                  uint64_t prod_len, uint8_t *cover)
{
    for (size_t i = 0; i < dv->n; i++) {
        const pdl_desc_t *d = &dv->v[i];
        uint64_t coff = dir == PDL_DIR_READ ? d->local_off : d->remote_off;
        uint64_t poff = dir == PDL_DIR_READ ? d->remote_off : d->local_off;
        assert_true(d->len > 0);
        assert_true(coff + d->len <= cons_len);
        assert_true(poff + d->len <= prod_len);
        memcpy(cons + coff, prod + poff, d->len);
        if (cover != NULL)
            for (uint64_t k = 0; k < d->len; k++) {
                if (cover[coff + k] != 0) /* written exactly once; plain check: this loop is hot */
                    fail_msg("consumer byte %llu written twice", (unsigned long long)(coff + k));
                cover[coff + k] = 1;
            }
    }
}

static void sim_run(sim_t *s, uint64_t *rng, bool consecutive)
{
    const int halves = s->mla ? 1 : 2;
    pick_blocks(s->pblocks, P_BLOCKS, consecutive, rng);
    pick_blocks(s->cblocks, C_BLOCKS, consecutive, rng);
    const uint64_t plen = s->pregion * LAYERS, clen = s->cregion * LAYERS;

    /* Producers: request block i holds positions of logical block i; other blocks hold positions 1000+. */
    for (int p = 0; p < s->P; p++) {
        int hf, hc;
        assert_int_equal(pdl_topo_heads(s->P, s->H, s->mla, p, &hf, &hc, NULL), PDL_OK);
        for (uint32_t blk = 0; blk < P_BLOCKS; blk++) {
            int logical = 1000 + (int)blk;
            for (int i = 0; i < NREQ; i++)
                if (s->pblocks[i] == blk)
                    logical = i;
            for (int l = 0; l < LAYERS; l++)
                for (int h = 0; h < halves; h++)
                    for (int j = 0; j < hc; j++)
                        for (int t = 0; t < BS; t++) {
                            uint8_t *run = s->prod[p] + l * s->pregion + pos_of(&s->pg, blk, h, j, t, 0);
                            for (int b = 0; b < HD * ES; b++) /* one (head, token) vector is contiguous */
                                run[b] = kv_byte(l, hf + j, logical * BS + t, b, h);
                        }
        }
    }
    for (int d = 0; d < s->D; d++) {
        memset(s->cons_read[d], 0xA5, clen);
        memset(s->cons_write[d], 0xA5, clen);
        memset(s->cons_unmerged[d], 0xA5, clen);
        memset(s->cover[d], 0, clen);
    }

    pdl_descv_t dv = {0}, raw = {0};
    /* READ: every consumer rank, per producer of its plan, per layer. */
    for (int d = 0; d < s->D; d++) {
        pdl_read_plan_t rp;
        assert_int_equal(pdl_topo_read_plan(s->P, s->D, s->H, s->mla, d, &rp, NULL), PDL_OK);
        for (int i = 0; i < rp.num_pieces;) {
            int k = i; /* pieces of one producer are consecutive in a read plan */
            while (k < rp.num_pieces && rp.pieces[k].producer_rank == rp.pieces[i].producer_rank)
                k++;
            int p = rp.pieces[i].producer_rank;
            for (int l = 0; l < LAYERS; l++) {
                pdl_descv_reset(&dv);
                pdl_error_t e;
                pdl_status_t st = pdl_layout_build_descs(&s->cg, &s->pg, PDL_DIR_READ, &rp.pieces[i], k - i,
                                                         s->cblocks, s->pblocks, NREQ, l * s->cregion,
                                                         l * s->pregion, &dv, &e);
                if (st != PDL_OK)
                    fail_msg("build_descs P%d D%d H%d: %s", s->P, s->D, s->H, e.msg);
                /* Merged output is sorted by local offset and maximal. */
                for (size_t q = 1; q < dv.n; q++) {
                    assert_true(dv.v[q - 1].local_off + dv.v[q - 1].len <= dv.v[q].local_off);
                    assert_false(dv.v[q - 1].remote_off + dv.v[q - 1].len == dv.v[q].remote_off &&
                                 dv.v[q - 1].local_off + dv.v[q - 1].len == dv.v[q].local_off);
                }
                apply(&dv, PDL_DIR_READ, s->cons_read[d], clen, s->prod[p], plen, s->cover[d]);
                s->stats_descs += dv.n;
                /* The same bytes through the unmerged per-(piece, half, block) ranges. */
                pdl_descv_reset(&raw);
                for (int q = i; q < k; q++)
                    for (int h = 0; h < pdl_layout_num_halves(&s->cg); h++) /* fused: one layout half */
                        for (int b = 0; b < NREQ; b++)
                            assert_int_equal(pdl_layout_piece_ranges(&s->cg, &s->pg, PDL_DIR_READ, &rp.pieces[q], h,
                                                                     s->cblocks[b], s->pblocks[b], l * s->cregion,
                                                                     l * s->pregion, &raw, NULL),
                                             PDL_OK);
                assert_true(raw.n >= dv.n);
                assert_int_equal(pdl_layout_total_bytes(&raw), pdl_layout_total_bytes(&dv));
                apply(&raw, PDL_DIR_READ, s->cons_unmerged[d], clen, s->prod[p], plen, NULL);
                s->stats_unmerged += raw.n;
            }
            i = k;
        }
    }
    /* WRITE: every producer rank pushes its targets. */
    for (int p = 0; p < s->P; p++) {
        pdl_write_plan_t wp;
        assert_int_equal(pdl_topo_write_plan(s->P, s->D, s->H, s->mla, p, &wp, NULL), PDL_OK);
        for (int t = 0; t < wp.num_targets; t++) {
            int d = wp.targets[t].consumer_rank;
            for (int l = 0; l < LAYERS; l++) {
                pdl_descv_reset(&dv);
                assert_int_equal(pdl_layout_build_descs(&s->pg, &s->cg, PDL_DIR_WRITE, &wp.targets[t].piece, 1,
                                                        s->pblocks, s->cblocks, NREQ, l * s->pregion,
                                                        l * s->cregion, &dv, NULL),
                                 PDL_OK);
                apply(&dv, PDL_DIR_WRITE, s->cons_write[d], clen, s->prod[p], plen, NULL);
            }
        }
    }
    pdl_descv_free(&dv);
    pdl_descv_free(&raw);

    /* Verify every consumer byte: request blocks hold exactly the expected bytes, written once. */
    for (int d = 0; d < s->D; d++) {
        int hf, hc;
        assert_int_equal(pdl_topo_heads(s->D, s->H, s->mla, d, &hf, &hc, NULL), PDL_OK);
        uint64_t expected_cover = 0;
        for (int i = 0; i < NREQ; i++)
            for (int l = 0; l < LAYERS; l++)
                for (int h = 0; h < halves; h++)
                    for (int j = 0; j < hc; j++)
                        for (int t = 0; t < BS; t++)
                            for (int b = 0; b < HD * ES; b++) {
                                uint64_t off = l * s->cregion + pos_of(&s->cg, s->cblocks[i], h, j, t, b);
                                uint8_t want = kv_byte(l, hf + j, i * BS + t, b, h);
                                if (s->cons_read[d][off] != want || s->cover[d][off] != 1)
                                    fail_msg("P%d D%d H%d mla=%d fused=%d c.order=%d p.order=%d sep=%d/%d: decode %d layer "
                                             "%d block %d half %d head %d tok %d byte %d: got %02x want %02x cover %d",
                                             s->P, s->D, s->H, s->mla, s->cg.kv_fused, s->cg.order, s->pg.order,
                                             s->cg.kv_separate, s->pg.kv_separate, d, l, i, h, hf + j, t, b,
                                             s->cons_read[d][off], want,
                                             s->cover[d][off]);
                                expected_cover++;
                            }
        uint64_t covered = 0;
        for (uint64_t k = 0; k < clen; k++)
            covered += s->cover[d][k];
        assert_int_equal(covered, expected_cover); /* nothing outside the request's blocks was written */
        assert_memory_equal(s->cons_read[d], s->cons_unmerged[d], clen);
        assert_memory_equal(s->cons_read[d], s->cons_write[d], clen);
    }
}

static const int sim_tps[] = {1, 2, 3, 4, 6, 8, 12, 16};
static const int sim_heads[] = {1, 2, 4, 8, 16, 32};

static void exhaustive_transfer_simulation(void **state)
{
    (void)state;
    static sim_t s;
    uint64_t rng = 0x243F6A8885A308D3ull;
    int configs = 0, fused_configs = 0;
    uint64_t descs = 0, unmerged = 0;
    for (size_t a = 0; a < sizeof(sim_tps) / sizeof(sim_tps[0]); a++)
        for (size_t b = 0; b < sizeof(sim_tps) / sizeof(sim_tps[0]); b++)
            for (int hi = -1; hi < (int)(sizeof(sim_heads) / sizeof(sim_heads[0])); hi++) {
                int P = sim_tps[a], D = sim_tps[b];
                bool mla = hi < 0;
                int H = mla ? 1 : sim_heads[hi];
                if (P % D != 0 && D % P != 0)
                    continue;
                if (!mla && ((H % P != 0 && P % H != 0) || (H % D != 0 && D % H != 0)))
                    continue;
                for (int combo = 0; combo < 32; combo++) {
                    bool fused = (combo & 16) != 0;
                    if (fused && (mla || (combo & 3) != 0))
                        continue; /* fused: one half (kv_separate does not apply), never MLA */
                    memset(&s, 0, sizeof(s));
                    s.P = P;
                    s.D = D;
                    s.H = H;
                    s.mla = mla;
                    int pf, pc, cf, cc;
                    assert_int_equal(pdl_topo_heads(P, H, mla, 0, &pf, &pc, NULL), PDL_OK);
                    assert_int_equal(pdl_topo_heads(D, H, mla, 0, &cf, &cc, NULL), PDL_OK);
                    s.pg = (pdl_kv_geometry_t){P_BLOCKS, BS, (uint32_t)pc, HD, ES, (combo & 1) != 0,
                                               (combo & 4) ? PDL_KV_NHD : PDL_KV_HND, mla, fused};
                    s.cg = (pdl_kv_geometry_t){C_BLOCKS, BS, (uint32_t)cc, HD, ES, (combo & 2) != 0,
                                               (combo & 8) ? PDL_KV_NHD : PDL_KV_HND, mla, fused};
                    if (mla && (combo & 3) != 0)
                        continue; /* MLA has one half: K/V separation does not apply */
                    /* Sides with different orders or K/V arrangements: every topology for H = 8, the
                     * same-layout combinations for everything else (keeps the sanitizer runs short). */
                    bool same = ((combo & 1) != 0) == ((combo & 2) != 0) && ((combo & 4) != 0) == ((combo & 8) != 0);
                    if (!same && (mla || H != 8))
                        continue;
                    s.pregion = pdl_layout_region_len(&s.pg);
                    s.cregion = pdl_layout_region_len(&s.cg);
                    for (int p = 0; p < P; p++)
                        s.prod[p] = malloc(s.pregion * LAYERS);
                    for (int d = 0; d < D; d++) {
                        s.cons_read[d] = malloc(s.cregion * LAYERS);
                        s.cons_write[d] = malloc(s.cregion * LAYERS);
                        s.cons_unmerged[d] = malloc(s.cregion * LAYERS);
                        s.cover[d] = malloc(s.cregion * LAYERS);
                    }
                    sim_run(&s, &rng, false);
                    sim_run(&s, &rng, true);
                    descs += s.stats_descs;
                    unmerged += s.stats_unmerged;
                    for (int p = 0; p < P; p++)
                        free(s.prod[p]);
                    for (int d = 0; d < D; d++) {
                        free(s.cons_read[d]);
                        free(s.cons_write[d]);
                        free(s.cons_unmerged[d]);
                        free(s.cover[d]);
                    }
                    configs++;
                    fused_configs += fused;
                }
            }
    print_message("simulated %d configurations (%d fused) x 2 requests: %llu merged descriptors, %llu unmerged "
                  "ranges\n",
                  configs, fused_configs, (unsigned long long)descs, (unsigned long long)unmerged);
    assert_true(configs > 400);
    assert_true(fused_configs > 100);
    assert_true(descs < unmerged); /* merging did something somewhere */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(order_names),
        cmocka_unit_test(lengths_and_offsets),
        cmocka_unit_test(layout_names),
        cmocka_unit_test(fused_errors),
        cmocka_unit_test(errors_without_err),
        cmocka_unit_test(validate_errors),
        cmocka_unit_test(build_errors),
        cmocka_unit_test(worked_example_p4_d8),
        cmocka_unit_test(merge_rules),
        cmocka_unit_test(exhaustive_transfer_simulation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
