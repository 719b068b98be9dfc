/*
 * models.h -- model presets with real KV-cache geometry (layers, KV heads, head dim, MLA).
 *
 * `pdlink plan --model`, `pdlink-node --model` and `pdlink run` take a preset name instead of spelling
 * out the geometry. A preset is found by its short name ("llama-3.1-8b") or its Hugging Face id
 * ("meta-llama/Llama-3.1-8B-Instruct"), case-insensitively. Presets are static and read-only: the
 * returned pointers stay valid for the life of the process and must not be freed.
 *
 * Layer: layout (it turns a preset into a pdl_kv_geometry_t through topo's head split). No I/O, no
 * allocation, no global mutable state: thread-safe. Lookups return NULL or -1 when nothing matches;
 * pdl_model_geometry returns a pdl_status_t and fills an optional `err`.
 */
#ifndef PDLINK_MODELS_H
#define PDLINK_MODELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/layout.h"
#include "pdlink/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdl_model_preset {
    const char *name;        /* short name, e.g. "llama-3.1-8b" */
    const char *hf_id;       /* Hugging Face id, e.g. "meta-llama/Llama-3.1-8B-Instruct"; "" for test presets */
    int num_layers;          /* attention layers that hold KV */
    int total_kv_heads;      /* KV heads of the whole model; 1 for MLA (one latent vector per token) */
    int head_dim;            /* elements per head per token; for MLA the latent width kv_lora_rank + rope_dim */
    bool is_mla;             /* multi-head latent attention: one half (no V), replicated on every rank */
    int kv_lora_rank;        /* MLA only (0 otherwise): the compressed KV part of the latent */
    int rope_dim;            /* MLA only (0 otherwise): the decoupled RoPE key part of the latent */
    int elem_size;           /* default bytes per KV element: 2 (bf16) */
    const char *description; /* one line for `pdlink plan --help` and reports */
} pdl_model_preset_t;

/* The preset called `name` (short name or HF id, case-insensitive), or NULL (also for NULL or ""). */
const pdl_model_preset_t *pdl_model_find(const char *name);

/* Number of presets; pdl_model_at(i) for i < pdl_model_count() walks them in a fixed order. */
size_t pdl_model_count(void);
/* The i-th preset, or NULL when i >= pdl_model_count(). */
const pdl_model_preset_t *pdl_model_at(size_t i);

/*
 * Bytes per element of a KV cache dtype name (vLLM's --kv-cache-dtype, case-insensitive):
 * "bf16"/"bfloat16"/"fp16"/"float16"/"half" = 2, "fp8"/"fp8_e4m3"/"fp8_e5m2"/"fp8_ds_mla" = 1,
 * "fp32"/"float32"/"float" = 4, "auto" = 2 (the presets' bf16); -1 if unknown or NULL.
 */
int pdl_model_dtype_size(const char *dtype);

/*
 * The per-layer KV geometry of one rank of a TP-`tp` instance serving `m`: heads per rank follow
 * pdl_topo_heads (split when tp <= H, replicated when tp > H, 1 latent head for MLA). `elem_size` 0
 * means the preset's default. *out (caller-provided) is written only on success, already validated
 * (pdl_layout_validate). Every failure is PDL_ERR_INVALID, the message prefixed "model <name>" and
 * naming the values: m or out NULL; tp outside [1, PDL_TOPO_MAX_TP] or heads not splittable over it
 * ("8 KV heads cannot be split over TP 3 ..."); block_size or num_blocks 0, an order other than
 * HND/NHD, or a region that overflows 64 bits.
 */
pdl_status_t pdl_model_geometry(const pdl_model_preset_t *m, int tp, uint32_t block_size, uint64_t num_blocks,
                                uint32_t elem_size, pdl_kv_order_t order, bool kv_separate, pdl_kv_geometry_t *out,
                                pdl_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_MODELS_H */
