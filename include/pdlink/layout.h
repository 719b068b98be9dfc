/*
 * layout.h -- KV-cache geometry of one layer → byte ranges, and descriptor lists for a plan
 * (docs/topology.md#kv-layout).
 *
 * A layer's KV cache on one rank is one contiguous region. With `kv_separate` it is [2][blocks][block]
 * (all K blocks, then all V blocks -- vLLM's [2, num_blocks, ...]); otherwise [blocks][2][block]
 * (K and V interleaved per block). Inside one half-block the bytes are head-major, [heads][tokens][dim]
 * ("HND"), or token-major, [tokens][heads][dim] ("NHD"). MLA layers have one half (no V) and one
 * latent "head". With `kv_fused` (vLLM's CPU cache) a block is one half whose per-token row of a head is
 * K then V, [heads][tokens][2 * dim] (HND) or [tokens][heads][2 * dim] (NHD): a head range is still
 * contiguous in HND, so head splitting works as for the other layouts. The two sides of a transfer may have different block counts, so every offset is
 * computed from that side's own geometry.
 *
 * Layer: layout, above topo (it consumes topo's plan pieces). Pure functions: no I/O, no logging, no
 * global state; the only allocations are the caller's descriptor vector and a temporary sort buffer.
 * Thread-safe as long as two threads do not share one output vector. Error convention: pdl_status_t
 * with an optional `err` naming the field and both values; the geometry helpers that return a number
 * do no checking and expect a geometry that passed pdl_layout_validate.
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

/*
 * The KV-cache geometry of one layer on one rank; `num_blocks` is that rank's own block count. For MLA
 * num_heads must be 1 and kv_separate is ignored (there is only one half). A value type.
 */
typedef struct pdl_kv_geometry {
    uint64_t num_blocks;
    uint32_t block_size; /* tokens per block */
    uint32_t num_heads;  /* KV heads held by this rank (1 for MLA) */
    uint32_t head_dim;   /* elements per head per token (the latent width for MLA) */
    uint32_t elem_size;  /* bytes per element: fp8 = 1, bf16 = 2 */
    bool kv_separate;    /* true: [2][blocks]...; false: [blocks][2]... */
    pdl_kv_order_t order;
    bool is_mla;   /* one half only */
    bool kv_fused; /* one half whose rows are K then V (2 * head_dim elements); kv_separate is ignored */
} pdl_kv_geometry_t;

/*
 * The layout string of `g` the handshake carries (`layout`): the order ("hnd"/"nhd"), plus "-fused"
 * for kv_fused, else "-blockfirst" when K and V are interleaved per block (kv_separate false). Two
 * peers whose strings differ would not find a head at the same place, so they are refused. Writes at
 * most cap bytes (NUL included); returns the length, or -1 if it does not fit (24 bytes always do).
 */
int pdl_layout_name(const pdl_kv_geometry_t *g, char *buf, size_t cap);

/* "hnd" / "nhd", or "unknown" for any other value; static, never NULL. */
const char *pdl_layout_order_name(pdl_kv_order_t order);
/* Parse "hnd"/"nhd" (case-insensitive) into a pdl_kv_order_t value; -1 if unknown or NULL. */
int pdl_layout_order_parse(const char *s);

/*
 * Check that `g` is usable: every size positive, `order` HND or NHD, num_heads 1 for MLA, not MLA and
 * fused at once, and the region
 * length (num_blocks x halves x block length) fits in 64 bits, so no offset computed from it can
 * overflow. PDL_ERR_INVALID (also for a NULL g), with the message naming the field and its value.
 */
pdl_status_t pdl_layout_validate(const pdl_kv_geometry_t *g, pdl_error_t *err);

/*
 * Sizes and offsets of a validated geometry (`g` must not be NULL; no checks, no overflow detection).
 * Number of halves: 1 for MLA and fused, else 2 (K and V).
 */
int pdl_layout_num_halves(const pdl_kv_geometry_t *g);
/* Bytes of one head's row of one token in a half-block: head_dim * elem_size (x 2 when fused). */
uint64_t pdl_layout_row_len(const pdl_kv_geometry_t *g);
/* Bytes of one half of one block: block_size * num_heads * row length. */
uint64_t pdl_layout_block_len(const pdl_kv_geometry_t *g);
/* Bytes of the whole layer region: num_blocks * halves * block_len. */
uint64_t pdl_layout_region_len(const pdl_kv_geometry_t *g);
/* Offset in the layer region of `half` (0 = K, 1 = V) of `block`; neither is range-checked. */
uint64_t pdl_layout_half_offset(const pdl_kv_geometry_t *g, uint64_t block, int half);

/* Direction of a descriptor list: which side of the plan piece is "local". */
typedef enum pdl_dir {
    PDL_DIR_READ = 0,  /* local = consumer (dst_head), remote = producer (src_head) */
    PDL_DIR_WRITE = 1, /* local = producer (src_head), remote = consumer (dst_head) */
} pdl_dir_t;

/*
 * Append to `out` the descriptors that move `pieces` (all with the same producer rank) for the block
 * pairs local_blocks[i] <-> remote_blocks[i], i < nblocks, and merge ranges adjacent on both sides.
 * `local_base`/`remote_base` are the layer's offsets inside the registered regions. Every layout pair
 * is supported: NHD head slices become per-token ranges. Only the descriptors this call appends are
 * sorted and merged; what `out` already held is left as it was, so one vector can collect the lists
 * of several layers. The caller owns `out` (zero-initialised or from earlier calls) and frees it with
 * pdl_descv_free; the input arrays are only read.
 *
 * Returns PDL_OK (also for num_pieces or nblocks 0, appending nothing), or:
 *   PDL_ERR_INVALID  out NULL; a NULL pieces/block array with a non-zero count; num_pieces < 0; an
 *                    invalid geometry on either side (as pdl_layout_validate, message prefixed "local
 *                    KV geometry"/"remote KV geometry"); a base + region length that overflows 64 bits;
 *                    a `dir` other than READ/WRITE; pieces naming two producer ranks; a piece with
 *                    num_heads < 1 or outside either side's heads; a block id outside that side's
 *                    num_blocks. Each message names the value and the limit.
 *   PDL_ERR_MISMATCH head_dim, elem_size, block_size, is_mla or kv_fused differ between the sides.
 *   PDL_ERR_NOMEM    `out` could not grow; `out->n` is restored to its value on entry.
 */
pdl_status_t pdl_layout_build_descs(const pdl_kv_geometry_t *local, const pdl_kv_geometry_t *remote,
                                    pdl_dir_t dir, const pdl_plan_piece_t *pieces, int num_pieces,
                                    const uint32_t *local_blocks, const uint32_t *remote_blocks, size_t nblocks,
                                    uint64_t local_base, uint64_t remote_base, pdl_descv_t *out, pdl_error_t *err);

/*
 * Append to `out` the ranges, before any merging, that move one piece for one K/V half (0 = K, 1 = V)
 * of one block pair. HND on both sides gives one range; NHD on both sides one range per token; mixed
 * orders one range per (head, token). `pdlink plan` uses it to show where a head slice lies inside a
 * block. Same checks, errors and ownership as pdl_layout_build_descs (piece NULL is PDL_ERR_INVALID),
 * plus PDL_ERR_INVALID for `half` outside [0, halves).
 */
pdl_status_t pdl_layout_piece_ranges(const pdl_kv_geometry_t *local, const pdl_kv_geometry_t *remote,
                                     pdl_dir_t dir, const pdl_plan_piece_t *piece, int half, uint32_t local_block,
                                     uint32_t remote_block, uint64_t local_base, uint64_t remote_base,
                                     pdl_descv_t *out, pdl_error_t *err);

/*
 * Merge in place: sort by local offset (stable) if not already sorted, then join neighbours that are
 * adjacent on both sides. Covers exactly the same bytes as the input. Cannot fail: without memory for
 * the sort buffer it sorts in place, more slowly. A NULL or empty vector is left alone.
 */
void pdl_layout_merge(pdl_descv_t *dv);

/* Total bytes of a descriptor list (sum of len); 0 for NULL. The sum is not checked for overflow. */
uint64_t pdl_layout_total_bytes(const pdl_descv_t *dv);

/* ---- integrity digests (layout/digest.c, docs/integrity.md) ---------------------------------- */

/* `sample` mode digests one (layer, block) in this many; `full` digests every one (stride 1). */
#define PDL_DIGEST_SAMPLE_STRIDE 16u

/*
 * The digest (XXH3, 64 bits) of local head `head` (0 <= head < g->num_heads) of `block` in the layer
 * region starting at `layer` (host memory laid out by `g`): the head's rows of each half in token order,
 * so it depends only on the KV of that logical (layer, block, head), not on the rank's head range, block
 * id or block count. No checks: `g` must be valid and head and block inside it. Thread-safe.
 */
uint64_t pdl_layout_digest_head(const pdl_kv_geometry_t *g, const void *layer, uint64_t block, uint32_t head);
/* The sampling salt of a transfer: a hash of its id (NUL-terminated, not NULL). */
uint64_t pdl_layout_digest_salt(const char *transfer_id);
/* Is (layer, pos) -- pos the block's index in the producer's list of the transfer -- digested at this
 * stride? Always for stride <= 1; else for about one pair in `stride`, the same on every rank. */
bool pdl_layout_digest_sampled(uint64_t salt, uint32_t layer, uint64_t pos, uint32_t stride);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_LAYOUT_H */
