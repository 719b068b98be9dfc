/*
 * layout.h -- KV-cache geometry of one layer → byte ranges, and descriptor lists for a plan (SPEC §3).
 *
 * A layer's KV cache on one rank is one contiguous region. With `kv_separate` it is [2][blocks][block]
 * (all K blocks, then all V blocks -- vLLM's [2, num_blocks, ...]); otherwise [blocks][2][block]
 * (K and V interleaved per block). Inside one half-block the bytes are head-major, [heads][tokens][dim]
 * ("HND"), or token-major, [tokens][heads][dim] ("NHD"). MLA layers have one half (no V) and one
 * latent "head". The two sides of a transfer may have different block counts, so every offset is
 * computed from that side's own geometry. Pure functions, no I/O.
 */
#ifndef PDLINK_LAYOUT_H
#define PDLINK_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"
#include "pdlink/topo.h"
#include "pdlink/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pdl_kv_order {
    PDL_KV_HND = 0, /* [heads][tokens][dim] inside a half-block: a head range is contiguous */
    PDL_KV_NHD = 1, /* [tokens][heads][dim]: a head range is one run per token */
} pdl_kv_order_t;

typedef struct pdl_kv_geometry {
    uint64_t num_blocks;
    uint32_t block_size; /* tokens per block */
    uint32_t num_heads;  /* KV heads held by this rank (1 for MLA) */
    uint32_t head_dim;   /* elements per head per token (the latent width for MLA) */
    uint32_t elem_size;  /* bytes per element: fp8 = 1, bf16 = 2 */
    bool kv_separate;    /* true: [2][blocks]...; false: [blocks][2]... */
    pdl_kv_order_t order;
    bool is_mla; /* one half only */
} pdl_kv_geometry_t;

/* "hnd" / "nhd" */
const char *pdl_layout_order_name(pdl_kv_order_t order);
/* Parse "hnd"/"nhd" (case-insensitive); -1 if unknown. */
int pdl_layout_order_parse(const char *s);

/* Checks every field is positive and the sizes do not overflow 64 bits; the error names the field. */
pdl_status_t pdl_layout_validate(const pdl_kv_geometry_t *g, pdl_error_t *err);

/* 1 for MLA, else 2 (K and V). */
int pdl_layout_num_halves(const pdl_kv_geometry_t *g);
/* Bytes of one half of one block: block_size * num_heads * head_dim * elem_size. */
uint64_t pdl_layout_block_len(const pdl_kv_geometry_t *g);
/* Bytes of the whole layer region: num_blocks * halves * block_len. */
uint64_t pdl_layout_region_len(const pdl_kv_geometry_t *g);
/* Offset in the layer region of `half` (0 = K, 1 = V) of `block`. */
uint64_t pdl_layout_half_offset(const pdl_kv_geometry_t *g, uint64_t block, int half);

/* Direction of a descriptor list: which side of the plan piece is "local". */
typedef enum pdl_dir {
    PDL_DIR_READ = 0,  /* local = consumer (dst_head), remote = producer (src_head) */
    PDL_DIR_WRITE = 1, /* local = producer (src_head), remote = consumer (dst_head) */
} pdl_dir_t;

/*
 * Append to `out` the descriptors that move `pieces` (all with the same producer rank) for the block
 * pairs local_blocks[i] <-> remote_blocks[i], i < nblocks, and merge ranges adjacent on both sides.
 * `local_base`/`remote_base` are the layer's offsets inside the registered regions.
 * Refuses (PDL_ERR_UNSUPPORTED, naming the layout) nothing: NHD head slices become per-token ranges.
 * Errors: a block id outside either side's num_blocks, mismatched head_dim/elem_size/block_size,
 * a piece outside either side's heads -- each message names the value and the limit.
 */
pdl_status_t pdl_layout_build_descs(const pdl_kv_geometry_t *local, const pdl_kv_geometry_t *remote,
                                    pdl_dir_t dir, const pdl_plan_piece_t *pieces, int num_pieces,
                                    const uint32_t *local_blocks, const uint32_t *remote_blocks, size_t nblocks,
                                    uint64_t local_base, uint64_t remote_base, pdl_descv_t *out, pdl_error_t *err);

/*
 * Append to `out` the ranges, before any merging, that move one piece for one K/V half (0 = K, 1 = V)
 * of one block pair. HND on both sides gives one range; NHD on both sides one range per token; mixed
 * orders one range per (head, token). Same checks and errors as pdl_layout_build_descs. `pdlink plan`
 * uses it to show where a head slice lies inside a block.
 */
pdl_status_t pdl_layout_piece_ranges(const pdl_kv_geometry_t *local, const pdl_kv_geometry_t *remote,
                                     pdl_dir_t dir, const pdl_plan_piece_t *piece, int half, uint32_t local_block,
                                     uint32_t remote_block, uint64_t local_base, uint64_t remote_base,
                                     pdl_descv_t *out, pdl_error_t *err);

/*
 * Merge in place: sort by local offset (stable) if not already sorted, then join neighbours that are
 * adjacent on both sides. Covers exactly the same bytes as the input.
 */
void pdl_layout_merge(pdl_descv_t *dv);

/* Total bytes of a descriptor list. */
uint64_t pdl_layout_total_bytes(const pdl_descv_t *dv);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_LAYOUT_H */
