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
        int L = inst->cfg.model.num_layers;
        size_t cap = (size_t)L * n * (size_t)pdl_layout_num_halves(&m->geo);
        pdl_range_t *rg = malloc(cap * sizeof(*rg));
        if (rg == NULL) {
            pdl_warn("rank %d: scrub_freed_blocks: out of memory for %zu ranges; %zu blocks not zeroed", r, cap, n);
            continue;
        }
        /* Through the engine: device memory is zeroed on the device, never by the CPU. Ids the
         * allocator would refuse are skipped. */
        pdl_error_t err;
        if (pdl__rank_zero(m, L, rg, pdl__rank_block_ranges(m, 0, L, ids, n, rg), &err) != PDL_OK)
            pdl_warn("rank %d: scrub_freed_blocks: %s", r, err.msg);
        free(rg);
    }
}
