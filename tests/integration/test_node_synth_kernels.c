/*
 * test_node_synth_kernels.c -- the row kernels of pdlink-node's synthetic model: the portable kernel and
 * the AVX-512 one (when this CPU has it) write the same bytes, which are the documented splitmix64
 * stream, and give the same row hashes; the fused check finds a single changed byte at every position of
 * rows of many lengths (whole vectors, partial vectors, partial words) and hashes the bytes it read; the
 * digest the prefill computes while writing equals the one verify computes from memory, for every
 * kernel and several geometries (HND/NHD, separate/interleaved K and V, MLA, split and replicated heads).
 * It links pdl_node, the node program's library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "node/kvstore.h"
#include "node/synth.h"

static const pdl_synth_kernel_t kernels[] = {PDL_SYNTH_KERNEL_SCALAR, PDL_SYNTH_KERNEL_AVX512,
                                              PDL_SYNTH_KERNEL_AUTO};
#define NK (sizeof(kernels) / sizeof(kernels[0]))

/* The documented byte stream, written out independently of the kernels. */
static void reference_row(uint8_t *dst, size_t len, uint64_t seed)
{
    for (size_t i = 0; i < len; i += 8) {
        uint64_t z = seed + (i / 8 + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        memcpy(dst + i, &z, len - i < 8 ? len - i : 8);
    }
}

static void kernels_write_the_documented_stream(void **state)
{
    (void)state;
    uint8_t want[1200];
    /* 64-byte aligned rows take the streaming-store path of the AVX-512 kernel, others the plain one. */
    uint8_t *buf = aligned_alloc(64, 1344); /* a multiple of the alignment, as C11 requires */
    assert_non_null(buf);
    for (size_t len = 1; len <= 1200; len += (len < 140 ? 1 : 37)) {
        uint64_t seed = 0x1234567ull * len;
        reference_row(want, len, seed);
        uint64_t h0 = 0;
        for (size_t k = 0; k < NK; k++) {
            if (!pdl_synth_kernel_available(kernels[k]))
                continue;
            for (size_t shift = 0; shift <= 8; shift += 8) {
                uint8_t *got = buf + shift;
                memset(buf, 0xAB, 1344);
                uint64_t h = pdl_synth_row_fill(got, len, seed, kernels[k]);
                assert_memory_equal(got, want, len);
                assert_int_equal(got[len], 0xAB); /* nothing written past the row */
                if (shift)
                    assert_int_equal(buf[0], 0xAB); /* nor before it */
                if (k == 0 && shift == 0)
                    h0 = h;
                assert_int_equal(h, h0); /* every kernel hashes alike */
            }
            bool bad = true;
            assert_int_equal(pdl_synth_row_check(want, len, seed, kernels[k], &bad), h0);
            assert_false(bad);
        }
    }
    free(buf);
}

static void check_finds_every_changed_byte(void **state)
{
    (void)state;
    static const size_t lens[] = {1, 7, 8, 9, 63, 64, 65, 72, 128, 200, 256, 1152};
    uint8_t row[1152];
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        size_t len = lens[li];
        uint64_t seed = 77 + len;
        for (size_t k = 0; k < NK; k++) {
            if (!pdl_synth_kernel_available(kernels[k]))
                continue;
            uint64_t good = pdl_synth_row_fill(row, len, seed, kernels[k]);
            for (size_t pos = 0; pos < len; pos++) {
                row[pos] ^= 0x10;
                bool bad = false;
                uint64_t h = pdl_synth_row_check(row, len, seed, kernels[k], &bad);
                assert_true(bad);
                assert_int_not_equal(h, good); /* the hash is of the bytes read */
                row[pos] ^= 0x10;
            }
            bool bad = true;
            assert_int_equal(pdl_synth_row_check(row, len, seed, kernels[k], &bad), good);
            assert_false(bad);
            /* Another seed is a different row. */
            pdl_synth_row_check(row, len, seed + 1, kernels[k], &bad);
            assert_true(bad);
        }
    }
}

static pdl_node_kv_t *make_kv(int tp, int heads, bool mla, int head_dim, pdl_kv_order_t order, bool separate)
{
    pdl_node_kv_config_t c;
    memset(&c, 0, sizeof(c));
    c.model.num_layers = 2;
    c.model.total_kv_heads = heads;
    c.model.head_dim = head_dim;
    c.model.elem_size = 2;
    c.model.block_size = 4;
    c.model.is_mla = mla;
    c.model.order = order;
    c.model.kv_separate = separate;
    c.tp_size = tp;
    c.dp_size = 1;
    c.num_blocks = 16;
    pdl_node_kv_t *kv = NULL;
    pdl_error_t err;
    assert_int_equal(pdl_node_kv_create(&c, &kv, &err), PDL_OK);
    return kv;
}

static void prefill_digest_equals_verify_digest(void **state)
{
    (void)state;
    struct {
        int tp, heads, head_dim;
        bool mla;
        pdl_kv_order_t order;
        bool separate;
    } g[] = {
        {1, 8, 64, false, PDL_KV_HND, true},  {4, 8, 64, false, PDL_KV_NHD, true}, {8, 4, 36, false, PDL_KV_HND, false},
        {2, 1, 576, true, PDL_KV_HND, true},  {3, 3, 5, false, PDL_KV_NHD, false},
    };
    const char *text = "Natalia sold clips to 48 of her friends in April, and then she sold half as many";
    pdl_synth_prompt_t p;
    assert_int_equal(pdl_synth_tokenize(3, text, strlen(text), &p, NULL), PDL_OK);
    uint32_t blocks[16];
    size_t nb = pdl_synth_blocks_needed(p.n, 4);
    assert_true(nb <= 16);
    for (size_t i = 0; i < nb; i++)
        blocks[i] = (uint32_t)(15 - 2 * i) % 16; /* scattered, distinct */
    uint64_t want = 0;
    for (size_t gi = 0; gi < sizeof(g) / sizeof(g[0]); gi++) {
        pdl_node_kv_t *kv = make_kv(g[gi].tp, g[gi].heads, g[gi].mla, g[gi].head_dim, g[gi].order, g[gi].separate);
        uint64_t first = 0;
        for (size_t k = 0; k < NK; k++) {
            if (!pdl_synth_kernel_available(kernels[k]))
                continue;
            uint64_t d = pdl_synth_prefill_kernel(kv, 3, &p, blocks, kernels[k]);
            for (size_t k2 = 0; k2 < NK; k2++) {
                if (!pdl_synth_kernel_available(kernels[k2]))
                    continue;
                pdl_synth_check_t c;
                pdl_synth_verify_kernel(kv, 3, &p, blocks, kernels[k2], &c);
                assert_int_equal(c.mismatched_bytes, 0);
                assert_true(c.verified_bytes > 0);
                assert_int_equal(c.digest, d);
            }
            if (k == 0)
                first = d;
            assert_int_equal(d, first);
        }
        /* Same model geometry over different TP and layouts: same digest (the heads=8 rows). */
        if (gi == 0)
            want = first;
        if (gi == 1)
            assert_int_equal(first, want);
        pdl_node_kv_destroy(kv);
    }
    pdl_synth_prompt_free(&p);
}

static void verify_names_a_corrupted_byte_with_every_kernel(void **state)
{
    (void)state;
    pdl_node_kv_t *kv = make_kv(2, 4, false, 40, PDL_KV_HND, true);
    const char *text = "a b c d e f g h i j";
    pdl_synth_prompt_t p;
    assert_int_equal(pdl_synth_tokenize(9, text, strlen(text), &p, NULL), PDL_OK);
    uint32_t blocks[4] = {3, 1, 2, 0};
    for (size_t k = 0; k < NK; k++) {
        if (!pdl_synth_kernel_available(kernels[k]))
            continue;
        pdl_synth_prefill_kernel(kv, 9, &p, blocks, kernels[k]);
        const pdl_kv_geometry_t *geo = pdl_node_kv_geometry(kv, 1);
        uint64_t row_len = (uint64_t)geo->head_dim * geo->elem_size;
        /* rank 1, layer 1, V half, local head 1 (global 3), token 5 (block blocks[1], slot 1), byte 79 */
        uint8_t *base = pdl_node_kv_layer(kv, 1, 1);
        uint64_t off = pdl_layout_half_offset(geo, blocks[1], 1) + (1ull * geo->block_size + 1) * row_len + 79;
        base[off] ^= 0xFF;
        pdl_synth_check_t c;
        pdl_synth_verify_kernel(kv, 9, &p, blocks, kernels[k], &c);
        assert_int_equal(c.mismatched_bytes, 1);
        assert_non_null(strstr(c.first_mismatch, "rank 1 layer 1 V head 3 token 5"));
        base[off] ^= 0xFF;
        pdl_synth_verify_kernel(kv, 9, &p, blocks, kernels[k], &c);
        assert_int_equal(c.mismatched_bytes, 0);
    }
    pdl_synth_prompt_free(&p);
    pdl_node_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kernels_write_the_documented_stream),
        cmocka_unit_test(check_finds_every_changed_byte),
        cmocka_unit_test(prefill_digest_equals_verify_digest),
        cmocka_unit_test(verify_names_a_corrupted_byte_with_every_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
