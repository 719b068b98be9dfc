/*
 * scrub.c -- scrub_freed_blocks: zero a block's KV on every rank before the block is reused
 * (docs/security.md). Without it a decode's freed blocks keep earlier prompts' KV until an allocation
 * overwrites them, readable by whatever later reads them by mistake (a bug, a core dump, a caller that
 * shares the memory).
 *
 * Called from the two places blocks go back to the allocator: pdl_instance_free_blocks and the last rank
 * resolving a held transfer (held.c), before the free, so a block is never handed out and then zeroed.
 */
#include <string.h>

#include "connector/internal.h"

void pdl__scrub_blocks(pdl_instance_t *inst, const uint32_t *ids, size_t n)
{
    if (!inst->cfg.conn.scrub_freed_blocks)
        return;
    PDL_FOR_LOCAL(inst, r) {
        const pdl_rank_mem_t *m = &inst->ranks[r].mem;
        if (m->kv_ptr == NULL)
            continue;
        uint64_t half_len = pdl_layout_block_len(&m->geo);
        int halves = pdl_layout_num_halves(&m->geo);
        for (int l = 0; l < inst->cfg.model.num_layers; l++) {
            uint8_t *layer = m->kv_ptr + (uint64_t)l * m->layer_len;
            for (size_t i = 0; i < n; i++) {
                if (ids[i] >= m->geo.num_blocks)
                    continue; /* the allocator refuses it too */
                for (int h = 0; h < halves; h++)
                    memset(layer + pdl_layout_half_offset(&m->geo, ids[i], h), 0, half_len);
            }
        }
    }
}
