/*
 * test_models.c -- model presets: lookup, the published geometry of each real model, the test presets'
 * head splitting, dtype sizes and per-rank layer geometry.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "pdlink/models.h"

static void find_by_name_and_hf_id(void **state)
{
    (void)state;
    const pdl_model_preset_t *m = pdl_model_find("llama-3.1-8b");
    assert_non_null(m);
    assert_string_equal(m->name, "llama-3.1-8b");
    assert_ptr_equal(pdl_model_find("LLAMA-3.1-8B"), m);
    assert_ptr_equal(pdl_model_find("meta-llama/Llama-3.1-8B-Instruct"), m);
    assert_ptr_equal(pdl_model_find("Qwen/Qwen3-32B"), pdl_model_find("qwen3-32b"));
    assert_null(pdl_model_find("llama-3.1-9b"));
    assert_null(pdl_model_find(""));
    assert_null(pdl_model_find(NULL));
}

static void iteration_is_complete_and_unique(void **state)
{
    (void)state;
    size_t n = pdl_model_count();
    assert_true(n >= 6);
    assert_null(pdl_model_at(n));
    for (size_t i = 0; i < n; i++) {
        const pdl_model_preset_t *m = pdl_model_at(i);
        assert_non_null(m);
        assert_ptr_equal(pdl_model_find(m->name), m);
        assert_true(m->num_layers > 0 && m->total_kv_heads > 0 && m->head_dim > 0);
        assert_int_equal(m->elem_size, 2);
        assert_non_null(m->description);
        assert_true(strlen(m->description) > 10);
        if (m->is_mla) {
            assert_int_equal(m->total_kv_heads, 1);
            assert_int_equal(m->kv_lora_rank + m->rope_dim, m->head_dim);
        }
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(pdl_model_at(j)->name, m->name);
    }
}

static void real_geometry(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int layers, heads, dim, mla;
    } want[] = {
        {"llama-3.1-8b", 32, 8, 128, 0},  {"llama-3.1-70b", 80, 8, 128, 0}, {"qwen3-32b", 64, 8, 128, 0},
        {"deepseek-v3", 61, 1, 576, 1},   {"tiny", 4, 8, 32, 0},            {"tiny-mla", 4, 1, 64, 1},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const pdl_model_preset_t *m = pdl_model_find(want[i].name);
        assert_non_null(m);
        assert_int_equal(m->num_layers, want[i].layers);
        assert_int_equal(m->total_kv_heads, want[i].heads);
        assert_int_equal(m->head_dim, want[i].dim);
        assert_int_equal(m->is_mla, want[i].mla);
    }
    const pdl_model_preset_t *ds = pdl_model_find("deepseek-v3");
    assert_int_equal(ds->kv_lora_rank, 512);
    assert_int_equal(ds->rope_dim, 64);
}

static void dtype_sizes(void **state)
{
    (void)state;
    assert_int_equal(pdl_model_dtype_size("bf16"), 2);
    assert_int_equal(pdl_model_dtype_size("FP8"), 1);
    assert_int_equal(pdl_model_dtype_size("fp8_e4m3"), 1);
    assert_int_equal(pdl_model_dtype_size("float32"), 4);
    assert_int_equal(pdl_model_dtype_size("auto"), 2);
    assert_int_equal(pdl_model_dtype_size("int3"), -1);
    assert_int_equal(pdl_model_dtype_size(NULL), -1);
}

static void per_rank_geometry(void **state)
{
    (void)state;
    pdl_kv_geometry_t g;
    pdl_error_t e;
    const pdl_model_preset_t *tiny = pdl_model_find("tiny");
    /* tiny splits heads for P4 (2 per rank) and D8 (1 per rank), and replicates on TP16. */
    assert_int_equal(pdl_model_geometry(tiny, 4, 16, 64, 0, PDL_KV_HND, true, &g, NULL), PDL_OK);
    assert_int_equal(g.num_heads, 2);
    assert_int_equal(g.head_dim, 32);
    assert_int_equal(g.elem_size, 2);
    assert_int_equal(pdl_layout_block_len(&g), 16 * 2 * 32 * 2);
    assert_int_equal(pdl_model_geometry(tiny, 8, 16, 64, 1, PDL_KV_NHD, false, &g, NULL), PDL_OK);
    assert_int_equal(g.num_heads, 1);
    assert_int_equal(g.elem_size, 1);
    assert_int_equal(g.order, PDL_KV_NHD);
    assert_int_equal(pdl_model_geometry(tiny, 16, 16, 64, 0, PDL_KV_HND, true, &g, NULL), PDL_OK);
    assert_int_equal(g.num_heads, 1);
    assert_int_equal(pdl_model_geometry(tiny, 3, 16, 64, 0, PDL_KV_HND, true, &g, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "tiny"));
    assert_non_null(strstr(e.msg, "8 KV heads cannot be split over TP 3"));
    /* Llama-3.1-8B on TP4, block 16, bf16: 8 KiB per half-block (anchors §6). */
    assert_int_equal(pdl_model_geometry(pdl_model_find("llama-3.1-8b"), 4, 16, 10, 0, PDL_KV_HND, true, &g, NULL),
                     PDL_OK);
    assert_int_equal(pdl_layout_block_len(&g), 8192);
    /* DeepSeek-V3: one latent head of 576 on every rank, one half. */
    assert_int_equal(pdl_model_geometry(pdl_model_find("deepseek-v3"), 8, 64, 10, 0, PDL_KV_HND, false, &g, NULL),
                     PDL_OK);
    assert_int_equal(g.num_heads, 1);
    assert_true(g.is_mla);
    assert_int_equal(pdl_layout_block_len(&g), 64 * 576 * 2);
    assert_int_equal(pdl_layout_num_halves(&g), 1);
    assert_int_equal(pdl_model_geometry(tiny, 4, 0, 64, 0, PDL_KV_HND, true, &g, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "block_size"));
    assert_int_equal(pdl_model_geometry(NULL, 4, 16, 64, 0, PDL_KV_HND, true, &g, &e), PDL_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(find_by_name_and_hf_id),
        cmocka_unit_test(iteration_is_complete_and_unique),
        cmocka_unit_test(real_geometry),
        cmocka_unit_test(dtype_sizes),
        cmocka_unit_test(per_rank_geometry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
