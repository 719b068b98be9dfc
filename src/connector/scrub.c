/*
 * scrub.c -- scrub_freed_blocks: zero a block's KV on every rank before the block is reused
 * (docs/security.md). Without it a decode's freed blocks keep earlier prompts' KV until an allocation
 * overwrites them, readable by whatever later reads them by mistake (a bug, a core dump, a caller that
 * shares the memory).
 *
 * Called from the two places blocks go back to the allocator: pdl_instance_free_blocks and the last rank
 * resolving a held transfer (held.c), before the free, so a block is never handed out and then zeroed.
 */
#include <stdlib.h>

#include "connector/internal.h"

void pdl__scrub_blocks(pdl_instance_t *inst, const uint32_t *ids, size_t n)
{
    if (!inst->cfg.conn.scrub_freed_blocks || n == 0)
        return;
    PDL_FOR_LOCAL(inst, r) {
        const pdl_rank_mem_t *m = &inst->ranks[r].mem;
        if (m->kv == NULL && m->layer_kv == NULL)
            continue;
        uint64_t half_len = pdl_layout_block_len(&m->geo);
        int halves = pdl_layout_num_halves(&m->geo);
        size_t cap = (size_t)inst->cfg.model.num_layers * n * (size_t)halves, k = 0;
        pdl_range_t *rg = malloc(cap * sizeof(*rg));
        if (rg == NULL) {
            pdl_warn("rank %d: scrub_freed_blocks: out of memory for %zu ranges; %zu blocks not zeroed", r, cap, n);
            continue;
        }
        for (int l = 0; l < inst->cfg.model.num_layers; l++)
            for (size_t i = 0; i < n; i++) {
                if (ids[i] >= m->geo.num_blocks)
                    continue; /* the allocator refuses it too */
                for (int h = 0; h < halves; h++)
                    rg[k++] = (pdl_range_t){pdl__layer_off(m, l) + pdl_layout_half_offset(&m->geo, ids[i], h),
                                            half_len};
            }
        /* Through the engine: device memory is zeroed on the device, never by the CPU. Per-layer
         * registrations each zero their own layer's ranges (k / num_layers of them, in layer order). */
        int L = inst->cfg.model.num_layers;
        size_t per = m->layer_kv ? k / (size_t)L : k;
        for (int l = 0; l < (m->layer_kv ? L : 1); l++) {
            pdl_error_t err;
            if (pdl_mem_zero(pdl__layer_mem(m, l), rg + (size_t)l * per, per, &err) != PDL_OK)
                pdl_warn("rank %d layer %d: scrub_freed_blocks: %s", r, l, err.msg);
        }
        free(rg);
    }
}
