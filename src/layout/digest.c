/*
 * digest.c -- KV integrity digests over logical positions (docs/integrity.md).
 *
 * A digest covers one piece: one KV head of one block of one layer, the unit every topology moves whole
 * (a head range of a rank is a run of heads; no plan splits a head). Its bytes are taken in logical
 * order -- the head's rows of half 0 (K, or the fused K|V row, or MLA's latent) for tokens 0..block_size-1,
 * then those of half 1 (V) when there is one -- so a producer rank and a consumer rank holding that head
 * under different head ranges, block ids or block counts compute the same value from the same KV. In
 * HND each half's rows are contiguous (one update); in NHD they are one run per token.
 *
 * The hash is xxHash's XXH3 (64 bits, seed 0), from Debian's libxxhash: fast on the few-KiB pieces a
 * split head is, and not ours to get wrong. It guards against accidents (a flipped bit, a block landing
 * in another's place, a read completed before its bytes were visible), not against a forger.
 *
 * Sampling: `sample` digests only the pieces pdl_layout_digest_sampled picks -- one (layer, block) in
 * PDL_DIGEST_SAMPLE_STRIDE, chosen by a hash of the transfer, the layer and the block's position in the
 * transfer -- so both sides pick the same pieces without a list on the wire, and a different transfer
 * checks different pieces.
 *
 * Layer: layout. Pure: no I/O, no logging, no allocation.
 */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation per piece */
#include <xxhash.h>

#include <string.h>

#include "pdlink/layout.h"

/* One half's rows of head `head` in `block`, in token order, into the running state. */
static void digest_half(XXH3_state_t *st, const pdl_kv_geometry_t *g, const uint8_t *layer, uint64_t block,
                        uint32_t head, int half)
{
    const uint64_t row = pdl_layout_row_len(g);
    const uint8_t *h0 = layer + pdl_layout_half_offset(g, block, half);
    if (g->order == PDL_KV_HND) {
        XXH3_64bits_update(st, h0 + (uint64_t)head * g->block_size * row, (size_t)(g->block_size * row));
        return;
    }
    for (uint32_t t = 0; t < g->block_size; t++)
        XXH3_64bits_update(st, h0 + ((uint64_t)t * g->num_heads + head) * row, (size_t)row);
}

uint64_t pdl_layout_digest_head(const pdl_kv_geometry_t *g, const void *layer, uint64_t block, uint32_t head)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    for (int half = 0; half < pdl_layout_num_halves(g); half++)
        digest_half(&st, g, layer, block, head, half);
    return XXH3_64bits_digest(&st);
}

uint64_t pdl_layout_digest_salt(const char *transfer_id)
{
    return XXH3_64bits(transfer_id, strlen(transfer_id));
}

bool pdl_layout_digest_sampled(uint64_t salt, uint32_t layer, uint64_t pos, uint32_t stride)
{
    if (stride <= 1)
        return true;
    uint64_t key[2] = {layer, pos};
    return XXH3_64bits_withSeed(key, sizeof(key), salt) % stride == 0;
}
