/*
 * models.c -- the table of model presets of models.h and lookups over it.
 *
 * The geometry of each real model is taken from its published config.json: num_hidden_layers,
 * num_key_value_heads and head_dim (hidden_size / num_attention_heads where head_dim is absent); for
 * DeepSeek-V3 the MLA latent cached per token is kv_lora_rank (512) + qk_rope_head_dim (64) = 576.
 * "tiny" and "tiny-mla" are small presets for tests: 8 KV heads of dim 32 so that P4/D8 and P8/D4 both
 * have to split heads, while a whole layer stays a few kilobytes.
 */
#include "pdlink/models.h"

#include <string.h>
#include <strings.h>

#include "pdlink/topo.h"

static const pdl_model_preset_t presets[] = {
    {
        .name = "llama-3.1-8b",
        .hf_id = "meta-llama/Llama-3.1-8B-Instruct",
        .num_layers = 32,
        .total_kv_heads = 8,
        .head_dim = 128,
        .elem_size = 2,
        .description = "Llama 3.1 8B: 32 layers, GQA with 8 KV heads of dim 128",
    },
    {
        .name = "llama-3.1-70b",
        .hf_id = "meta-llama/Llama-3.1-70B-Instruct",
        .num_layers = 80,
        .total_kv_heads = 8,
        .head_dim = 128,
        .elem_size = 2,
        .description = "Llama 3.1 70B: 80 layers, GQA with 8 KV heads of dim 128",
    },
    {
        .name = "qwen3-32b",
        .hf_id = "Qwen/Qwen3-32B",
        .num_layers = 64,
        .total_kv_heads = 8,
        .head_dim = 128,
        .elem_size = 2,
        .description = "Qwen3 32B: 64 layers, GQA with 8 KV heads of dim 128",
    },
    {
        .name = "deepseek-v3",
        .hf_id = "deepseek-ai/DeepSeek-V3",
        .num_layers = 61,
        .total_kv_heads = 1,
        .head_dim = 576,
        .is_mla = true,
        .kv_lora_rank = 512,
        .rope_dim = 64,
        .elem_size = 2,
        .description = "DeepSeek-V3: 61 layers, MLA latent 576 (kv_lora_rank 512 + rope 64), replicated",
    },
    {
        .name = "tiny",
        .hf_id = "",
        .num_layers = 4,
        .total_kv_heads = 8,
        .head_dim = 32,
        .elem_size = 2,
        .description = "test preset: 4 layers, 8 KV heads of dim 32 (P4/D8 and P8/D4 split heads)",
    },
    {
        .name = "tiny-mla",
        .hf_id = "",
        .num_layers = 4,
        .total_kv_heads = 1,
        .head_dim = 64,
        .is_mla = true,
        .kv_lora_rank = 48,
        .rope_dim = 16,
        .elem_size = 2,
        .description = "test preset: 4 layers, MLA latent 64 (48 + rope 16), replicated",
    },
};

#define NUM_PRESETS (sizeof(presets) / sizeof(presets[0]))

size_t pdl_model_count(void) { return NUM_PRESETS; }

const pdl_model_preset_t *pdl_model_at(size_t i) { return i < NUM_PRESETS ? &presets[i] : NULL; }

const pdl_model_preset_t *pdl_model_find(const char *name)
{
    if (name == NULL || name[0] == '\0')
        return NULL;
    for (size_t i = 0; i < NUM_PRESETS; i++)
        if (strcasecmp(name, presets[i].name) == 0 || (presets[i].hf_id[0] != '\0' && strcasecmp(name, presets[i].hf_id) == 0))
            return &presets[i];
    return NULL;
}

int pdl_model_dtype_size(const char *dtype)
{
    static const struct {
        const char *name;
        int size;
    } dtypes[] = {
        {"bf16", 2},   {"bfloat16", 2}, {"fp16", 2},     {"float16", 2},  {"half", 2},    {"auto", 2},
        {"fp8", 1},    {"fp8_e4m3", 1}, {"fp8_e5m2", 1}, {"fp8_ds_mla", 1}, {"fp32", 4}, {"float32", 4},
        {"float", 4},
    };
    if (dtype == NULL)
        return -1;
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (strcasecmp(dtype, dtypes[i].name) == 0)
            return dtypes[i].size;
    return -1;
}

pdl_status_t pdl_model_geometry(const pdl_model_preset_t *m, int tp, uint32_t block_size, uint64_t num_blocks,
                                uint32_t elem_size, pdl_kv_order_t order, bool kv_separate, pdl_kv_geometry_t *out,
                                pdl_error_t *err)
{
    if (m == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "model preset or geometry output is NULL");
    int first, count;
    /* Rank 0 is representative: every rank of one instance holds the same number of heads. */
    pdl_status_t st = pdl_topo_heads(tp, m->total_kv_heads, m->is_mla, 0, &first, &count, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "model %s", m->name);
    pdl_kv_geometry_t g = {
        .num_blocks = num_blocks,
        .block_size = block_size,
        .num_heads = (uint32_t)count,
        .head_dim = (uint32_t)m->head_dim,
        .elem_size = elem_size != 0 ? elem_size : (uint32_t)m->elem_size,
        .kv_separate = kv_separate,
        .order = order,
        .is_mla = m->is_mla,
    };
    if ((st = pdl_layout_validate(&g, err)) != PDL_OK)
        return pdl_error_prefix(err, st, "model %s", m->name);
    *out = g;
    return PDL_OK;
}
