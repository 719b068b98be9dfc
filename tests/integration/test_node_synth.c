/*
 * test_node_synth.c -- the synthetic model of pdlink-node on the local KV store: a wrong, misplaced or
 * stale byte is detected and named; the digest (hence the output) does not depend on TP size, KV order,
 * K/V arrangement or block size; the seed and the prompt change it. It links pdl_node, the node
 * program's library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "node/kvstore.h"
#include "node/synth.h"

static const char *PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many";

static pdl_node_kv_t *make_kv(int tp, int heads, bool mla, int block_size, pdl_kv_order_t order, bool separate)
{
    pdl_node_kv_config_t c;
    memset(&c, 0, sizeof(c));
    c.model.num_layers = 3;
    c.model.total_kv_heads = heads;
    c.model.head_dim = 24;
    c.model.elem_size = 2;
    c.model.block_size = block_size;
    c.model.is_mla = mla;
    c.model.order = order;
    c.model.kv_separate = separate;
    c.tp_size = tp;
    c.dp_size = 1;
    c.num_blocks = 64;
    pdl_node_kv_t *kv = NULL;
    pdl_error_t err;
    assert_int_equal(pdl_node_kv_create(&c, &kv, &err), PDL_OK);
    return kv;
}

/* Prefill into blocks allocated in a scrambled order, verify, return the digest. */
static uint64_t run_once(pdl_node_kv_t *kv, uint64_t seed, const char *text, int block_size)
{
    pdl_synth_prompt_t p;
    assert_int_equal(pdl_synth_tokenize(seed, text, strlen(text), &p, NULL), PDL_OK);
    size_t nb = pdl_synth_blocks_needed(p.n, block_size);
    uint32_t blocks[64];
    assert_true(nb <= 32);
    for (size_t i = 0; i < nb; i++)
        blocks[i] = (uint32_t)(63 - 2 * i); /* not 0, 1, 2: offsets must come from the ids */
    pdl_synth_prefill(kv, seed, &p, blocks);
    pdl_synth_check_t c;
    pdl_synth_verify(kv, seed, &p, blocks, &c);
    assert_int_equal(c.mismatched_bytes, 0);
    assert_true(c.verified_bytes > 0);
    pdl_synth_prompt_free(&p);
    return c.digest;
}

static void digest_independent_of_tp_and_layout(void **state)
{
    (void)state;
    pdl_node_kv_t *ref = make_kv(1, 8, false, 16, PDL_KV_HND, true);
    uint64_t want = run_once(ref, 5, PROMPT, 16);
    pdl_node_kv_destroy(ref);
    const int tps[] = {1, 2, 4, 8, 16, 32};
    for (size_t i = 0; i < sizeof(tps) / sizeof(tps[0]); i++)
        for (int order = 0; order < 2; order++)
            for (int sep = 0; sep < 2; sep++) {
                int bs = order ? 4 : 32;
                pdl_node_kv_t *kv = make_kv(tps[i], 8, false, bs, (pdl_kv_order_t)order, sep);
                assert_int_equal(run_once(kv, 5, PROMPT, bs), want);
                pdl_node_kv_destroy(kv);
            }
}

static void digest_depends_on_seed_and_prompt(void **state)
{
    (void)state;
    pdl_node_kv_t *kv = make_kv(4, 8, false, 16, PDL_KV_HND, true);
    uint64_t a = run_once(kv, 5, PROMPT, 16);
    assert_int_not_equal(run_once(kv, 6, PROMPT, 16), a);
    assert_int_not_equal(run_once(kv, 5, "Natalia sold clips to 48 of her friends in May, and then she sold half as many", 16), a);
    assert_int_equal(run_once(kv, 5, PROMPT, 16), a);
    pdl_node_kv_destroy(kv);
    /* MLA: one replicated latent head; TP does not matter either. */
    pdl_node_kv_t *m1 = make_kv(1, 1, true, 16, PDL_KV_HND, true);
    pdl_node_kv_t *m8 = make_kv(8, 1, true, 16, PDL_KV_HND, true);
    assert_int_equal(run_once(m1, 5, PROMPT, 16), run_once(m8, 5, PROMPT, 16));
    pdl_node_kv_destroy(m1);
    pdl_node_kv_destroy(m8);
}

static void corruption_is_detected_and_named(void **state)
{
    (void)state;
    pdl_node_kv_t *kv = make_kv(4, 8, false, 4, PDL_KV_HND, true);
    pdl_synth_prompt_t p;
    assert_int_equal(pdl_synth_tokenize(1, PROMPT, strlen(PROMPT), &p, NULL), PDL_OK);
    size_t nb = pdl_synth_blocks_needed(p.n, 4);
    uint32_t blocks[16];
    for (size_t i = 0; i < nb; i++)
        blocks[i] = (uint32_t)(10 + i);
    pdl_synth_prefill(kv, 1, &p, blocks);

    /* One byte of rank 2 (heads 4, 5), layer 1, V half, local head 1 = global head 5, token 6. */
    const pdl_kv_geometry_t *g = pdl_node_kv_geometry(kv, 2);
    uint64_t row = (uint64_t)g->head_dim * g->elem_size;
    uint64_t off = pdl_synth_row_offset(g, blocks[6 / 4], 1, 1, 6 % 4, row) + 3;
    uint8_t *layer = pdl_node_kv_layer(kv, 2, 1);
    layer[off] ^= 0x40;
    pdl_synth_check_t c;
    pdl_synth_verify(kv, 1, &p, blocks, &c);
    assert_int_equal(c.mismatched_bytes, 1);
    assert_non_null(strstr(c.first_mismatch, "rank 2 layer 1 V head 5 token 6"));
    layer[off] ^= 0x40;

    /* Two blocks swapped (a misplaced block): every byte of both is wrong. */
    uint32_t swapped[16];
    memcpy(swapped, blocks, sizeof(swapped));
    swapped[0] = blocks[1];
    swapped[1] = blocks[0];
    pdl_synth_verify(kv, 1, &p, swapped, &c);
    assert_true(c.mismatched_bytes > 0);
    assert_non_null(strstr(c.first_mismatch, "token 0"));

    /* Stale KV: the same blocks hold another prompt's KV that shares the first two words. */
    pdl_synth_prompt_t q;
    const char *other = "Natalia sold pens to 48 of her friends in April, and then she sold half as many";
    assert_int_equal(pdl_synth_tokenize(1, other, strlen(other), &q, NULL), PDL_OK);
    pdl_synth_prefill(kv, 1, &q, blocks);
    pdl_synth_verify(kv, 1, &p, blocks, &c);
    assert_true(c.mismatched_bytes > 0);
    /* The first three tokens (BOS Natalia sold) share the prefix and still match. */
    assert_non_null(strstr(c.first_mismatch, "token 3"));
    pdl_synth_prompt_free(&q);
    pdl_synth_prompt_free(&p);
    pdl_node_kv_destroy(kv);
}

static void generation_is_a_prefix_function(void **state)
{
    (void)state;
    uint32_t a[20], b[5];
    pdl_synth_generate(1234, 20, a);
    pdl_synth_generate(1234, 5, b);
    assert_memory_equal(a, b, sizeof(b));
    pdl_synth_generate(1235, 5, b);
    assert_memory_not_equal(a, b, sizeof(b));
    for (int i = 0; i < 20; i++)
        assert_string_not_equal(pdl_synth_word(a[i]), "<unk>");
}

static void allocator_waits_and_refuses(void **state)
{
    (void)state;
    pdl_node_kv_t *kv = make_kv(2, 8, false, 16, PDL_KV_HND, true);
    uint32_t ids[64];
    pdl_error_t err;
    assert_int_equal(pdl_node_kv_alloc(kv, 65, ids, 0, &err), PDL_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "holds only 64"));
    assert_int_equal(pdl_node_kv_alloc(kv, 60, ids, 0, NULL), PDL_OK);
    assert_int_equal(pdl_node_kv_free_count(kv), 4);
    assert_int_equal(pdl_node_kv_alloc(kv, 5, ids + 60, 10, &err), PDL_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "5 needed, 4 free"));
    pdl_node_kv_free(kv, ids, 60);
    assert_int_equal(pdl_node_kv_free_count(kv), 64);
    pdl_node_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(digest_independent_of_tp_and_layout),
        cmocka_unit_test(digest_depends_on_seed_and_prompt),
        cmocka_unit_test(corruption_is_detected_and_named),
        cmocka_unit_test(generation_is_a_prefix_function),
        cmocka_unit_test(allocator_waits_and_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
