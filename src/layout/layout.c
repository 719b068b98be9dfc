/*
 * layout.c -- byte geometry of one layer's KV cache and the descriptor lists of a plan (docs/topology.md#kv-layout).
 *
 * How it works: a layer region is either [2][blocks][half-block] (kv_separate) or [blocks][2][half-block];
 * MLA and the fused layout (kv_fused: vLLM's CPU cache, K and V concatenated per token) have a single
 * half. A half-block is [heads][tokens][row] (HND) or [tokens][heads][row] (NHD), where a row is one
 * head's vector of one token: head_dim elements, 2 * head_dim when fused (K then V). Everything below
 * works on rows, so the fused layout is the one-half layout with a row twice as long.
 * A plan piece is a run of heads that sits at head index `src_head` on the producer and `dst_head` on the
 * consumer. For every (piece, half, block pair) we emit the ranges that are contiguous on *both* sides:
 * one range when both sides are HND, one per token when both are NHD, one per (head, token) when the
 * orders differ. Those ranges are then sorted by local offset and neighbours adjacent on both sides are
 * joined, so e.g. whole-block NHD copies collapse back into one range per block (or per run of blocks).
 *
 * Arithmetic: pdl_layout_validate proves that the region length of each side fits in 64 bits, so any
 * offset inside a region is computed without overflow; adding the caller's base offsets is checked.
 * Pure functions: no I/O, no logging; the only allocation is the descriptor vector and a sort buffer.
 */
#include "pdlink/layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *pdl_layout_order_name(pdl_kv_order_t order)
{
    switch (order) {
    case PDL_KV_HND:
        return "hnd";
    case PDL_KV_NHD:
        return "nhd";
    }
    return "unknown";
}

int pdl_layout_order_parse(const char *s)
{
    if (s == NULL)
        return -1;
    if (strcasecmp(s, "hnd") == 0)
        return PDL_KV_HND;
    if (strcasecmp(s, "nhd") == 0)
        return PDL_KV_NHD;
    return -1;
}

pdl_status_t pdl_layout_validate(const pdl_kv_geometry_t *g, pdl_error_t *err)
{
    if (g == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "KV geometry is NULL");
    if (g->num_blocks == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "num_blocks must be positive, not 0");
    if (g->block_size == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "block_size must be positive, not 0");
    if (g->num_heads == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "num_heads must be positive, not 0");
    if (g->head_dim == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "head_dim must be positive, not 0");
    if (g->elem_size == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "elem_size must be positive, not 0");
    if (g->order != PDL_KV_HND && g->order != PDL_KV_NHD)
        return pdl_error_set(err, PDL_ERR_INVALID, "layout order %d is neither hnd (0) nor nhd (1)", (int)g->order);
    if (g->is_mla && g->num_heads != 1)
        return pdl_error_set(err, PDL_ERR_INVALID, "an MLA layer holds 1 latent head per rank, not %u", g->num_heads);
    if (g->is_mla && g->kv_fused)
        return pdl_error_set(err, PDL_ERR_INVALID, "kv_fused (K and V per token) and is_mla (no V) exclude each other");
    uint64_t v = g->block_size;
    if (__builtin_mul_overflow(v, (uint64_t)g->num_heads, &v) || __builtin_mul_overflow(v, (uint64_t)g->head_dim, &v) ||
        __builtin_mul_overflow(v, (uint64_t)g->elem_size, &v) || __builtin_mul_overflow(v, g->kv_fused ? 2u : 1u, &v))
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "block length %u tokens x %u heads x %u dim x %u bytes%s overflows 64 bits", g->block_size,
                             g->num_heads, g->head_dim, g->elem_size, g->kv_fused ? " x 2 (fused K/V)" : "");
    if (__builtin_mul_overflow(v, (uint64_t)pdl_layout_num_halves(g), &v) ||
        __builtin_mul_overflow(v, g->num_blocks, &v))
        return pdl_error_set(err, PDL_ERR_INVALID, "region length of %llu blocks overflows 64 bits",
                             (unsigned long long)g->num_blocks);
    return PDL_OK;
}

int pdl_layout_num_halves(const pdl_kv_geometry_t *g) { return g->is_mla || g->kv_fused ? 1 : 2; }

uint64_t pdl_layout_row_len(const pdl_kv_geometry_t *g)
{
    return (uint64_t)g->head_dim * g->elem_size * (g->kv_fused ? 2u : 1u);
}

uint64_t pdl_layout_block_len(const pdl_kv_geometry_t *g)
{
    return (uint64_t)g->block_size * g->num_heads * pdl_layout_row_len(g);
}

int pdl_layout_name(const pdl_kv_geometry_t *g, char *buf, size_t cap)
{
    /* Non-fused strings are what pdlink always sent (MoRIIO peers ignore the key; pdlink peers compare
     * it verbatim), so only a fused cache changes the wire. */
    const char *arr = g->kv_fused ? "-fused" : g->kv_separate ? "" : "-blockfirst";
    int n = snprintf(buf, cap, "%s%s", pdl_layout_order_name(g->order), arr);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

uint64_t pdl_layout_region_len(const pdl_kv_geometry_t *g)
{
    return g->num_blocks * (uint64_t)pdl_layout_num_halves(g) * pdl_layout_block_len(g);
}

uint64_t pdl_layout_half_offset(const pdl_kv_geometry_t *g, uint64_t block, int half)
{
    uint64_t bl = pdl_layout_block_len(g);
    if (pdl_layout_num_halves(g) == 1)
        return block * bl;
    if (g->kv_separate)
        return (uint64_t)half * g->num_blocks * bl + block * bl;
    return (block * 2 + (uint64_t)half) * bl;
}

/* Checks that the two sides can exchange head slices at all; names the field and both values. */
static pdl_status_t check_sides(const pdl_kv_geometry_t *local, const pdl_kv_geometry_t *remote, pdl_error_t *err)
{
    pdl_status_t st = pdl_layout_validate(local, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "local KV geometry");
    if ((st = pdl_layout_validate(remote, err)) != PDL_OK)
        return pdl_error_prefix(err, st, "remote KV geometry");
    if (local->head_dim != remote->head_dim)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "head_dim differs: local %u, remote %u", local->head_dim,
                             remote->head_dim);
    if (local->elem_size != remote->elem_size)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "elem_size differs: local %u, remote %u", local->elem_size,
                             remote->elem_size);
    if (local->block_size != remote->block_size)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "block_size differs: local %u, remote %u", local->block_size,
                             remote->block_size);
    if (local->is_mla != remote->is_mla)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "is_mla differs: local %s, remote %s",
                             local->is_mla ? "true" : "false", remote->is_mla ? "true" : "false");
    if (local->kv_fused != remote->kv_fused)
        return pdl_error_set(err, PDL_ERR_MISMATCH,
                             "kv_fused differs: local %s, remote %s (K and V concatenated per token on one side only)",
                             local->kv_fused ? "true" : "false", remote->kv_fused ? "true" : "false");
    return PDL_OK;
}

/* The head index of the piece on the local and remote side, per direction. */
static void piece_sides(const pdl_plan_piece_t *pc, pdl_dir_t dir, int *lhead, int *rhead)
{
    if (dir == PDL_DIR_READ) {
        *lhead = pc->dst_head;
        *rhead = pc->src_head;
    } else {
        *lhead = pc->src_head;
        *rhead = pc->dst_head;
    }
}

static pdl_status_t check_piece(const pdl_kv_geometry_t *local, const pdl_kv_geometry_t *remote, pdl_dir_t dir,
                                const pdl_plan_piece_t *pc, pdl_error_t *err)
{
    if (dir != PDL_DIR_READ && dir != PDL_DIR_WRITE)
        return pdl_error_set(err, PDL_ERR_INVALID, "direction %d is neither READ (0) nor WRITE (1)", (int)dir);
    int lh, rh;
    piece_sides(pc, dir, &lh, &rh);
    if (pc->num_heads < 1 || lh < 0 || rh < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "plan piece of prefill rank %d has %d heads at src %d, dst %d",
                             pc->producer_rank, pc->num_heads, pc->src_head, pc->dst_head);
    if ((uint64_t)lh + (uint64_t)pc->num_heads > local->num_heads)
        return pdl_error_set(err, PDL_ERR_INVALID, "plan piece heads [%d, %d) are outside the local %u heads", lh,
                             lh + pc->num_heads, local->num_heads);
    if ((uint64_t)rh + (uint64_t)pc->num_heads > remote->num_heads)
        return pdl_error_set(err, PDL_ERR_INVALID, "plan piece heads [%d, %d) are outside the remote %u heads", rh,
                             rh + pc->num_heads, remote->num_heads);
    return PDL_OK;
}

static pdl_status_t check_bases(const pdl_kv_geometry_t *local, const pdl_kv_geometry_t *remote, uint64_t local_base,
                                uint64_t remote_base, pdl_error_t *err)
{
    uint64_t end;
    if (__builtin_add_overflow(local_base, pdl_layout_region_len(local), &end))
        return pdl_error_set(err, PDL_ERR_INVALID, "local base %llu + region length %llu overflows 64 bits",
                             (unsigned long long)local_base, (unsigned long long)pdl_layout_region_len(local));
    if (__builtin_add_overflow(remote_base, pdl_layout_region_len(remote), &end))
        return pdl_error_set(err, PDL_ERR_INVALID, "remote base %llu + region length %llu overflows 64 bits",
                             (unsigned long long)remote_base, (unsigned long long)pdl_layout_region_len(remote));
    return PDL_OK;
}

/*
 * Emits the ranges of one piece, one half, one block pair. Inputs are already checked, so nothing here
 * can overflow: every offset is below its side's region length, which fits in 64 bits.
 */
static int emit_piece(const pdl_kv_geometry_t *l, const pdl_kv_geometry_t *r, int lhead, int rhead, int nheads,
                      int half, uint64_t lblock, uint64_t rblock, uint64_t lbase, uint64_t rbase, pdl_descv_t *out)
{
    const uint64_t hb = pdl_layout_row_len(l); /* one head, one token (the sides' rows are equal: checked) */
    const uint64_t bs = l->block_size;
    const uint64_t lhalf = lbase + pdl_layout_half_offset(l, lblock, half);
    const uint64_t rhalf = rbase + pdl_layout_half_offset(r, rblock, half);
    /* Strides of (head, token) inside a half-block on each side. */
    const uint64_t lhs = l->order == PDL_KV_HND ? bs * hb : hb, lts = l->order == PDL_KV_HND ? hb : l->num_heads * hb;
    const uint64_t rhs = r->order == PDL_KV_HND ? bs * hb : hb, rts = r->order == PDL_KV_HND ? hb : r->num_heads * hb;

    if (l->order == PDL_KV_HND && r->order == PDL_KV_HND)
        return pdl_descv_push(out, lhalf + lhead * lhs, rhalf + rhead * rhs, (uint64_t)nheads * bs * hb);
    if (l->order == PDL_KV_NHD && r->order == PDL_KV_NHD) {
        for (uint64_t t = 0; t < bs; t++)
            if (pdl_descv_push(out, lhalf + t * lts + lhead * lhs, rhalf + t * rts + rhead * rhs,
                               (uint64_t)nheads * hb) != 0)
                return -1;
        return 0;
    }
    /* Orders differ: only one (head, token) vector is contiguous on both sides. */
    for (int j = 0; j < nheads; j++)
        for (uint64_t t = 0; t < bs; t++)
            if (pdl_descv_push(out, lhalf + (uint64_t)(lhead + j) * lhs + t * lts,
                               rhalf + (uint64_t)(rhead + j) * rhs + t * rts, hb) != 0)
                return -1;
    return 0;
}

pdl_status_t pdl_layout_piece_ranges(const pdl_kv_geometry_t *local, const pdl_kv_geometry_t *remote,
                                     pdl_dir_t dir, const pdl_plan_piece_t *piece, int half, uint32_t local_block,
                                     uint32_t remote_block, uint64_t local_base, uint64_t remote_base,
                                     pdl_descv_t *out, pdl_error_t *err)
{
    if (piece == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "piece or output vector is NULL");
    pdl_status_t st = check_sides(local, remote, err);
    if (st != PDL_OK)
        return st;
    if ((st = check_piece(local, remote, dir, piece, err)) != PDL_OK)
        return st;
    if ((st = check_bases(local, remote, local_base, remote_base, err)) != PDL_OK)
        return st;
    if (half < 0 || half >= pdl_layout_num_halves(local))
        return pdl_error_set(err, PDL_ERR_INVALID, "half %d is outside [0, %d)", half, pdl_layout_num_halves(local));
    if (local_block >= local->num_blocks)
        return pdl_error_set(err, PDL_ERR_INVALID, "local block id %u is outside num_blocks %llu", local_block,
                             (unsigned long long)local->num_blocks);
    if (remote_block >= remote->num_blocks)
        return pdl_error_set(err, PDL_ERR_INVALID, "remote block id %u is outside num_blocks %llu", remote_block,
                             (unsigned long long)remote->num_blocks);
    int lh, rh;
    piece_sides(piece, dir, &lh, &rh);
    size_t n0 = out->n;
    if (emit_piece(local, remote, lh, rh, piece->num_heads, half, local_block, remote_block, local_base, remote_base,
                   out) != 0) {
        out->n = n0;
        return pdl_error_set(err, PDL_ERR_NOMEM, "out of memory building descriptors for one block pair");
    }
    return PDL_OK;
}

/* Stable merge sort of v[0..n) by local offset; tmp has room for n entries. */
static void sort_by_local(pdl_desc_t *v, pdl_desc_t *tmp, size_t n)
{
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n;
            size_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = v[j].local_off < v[i].local_off ? v[j++] : v[i++];
            while (i < mid)
                tmp[k++] = v[i++];
            while (j < hi)
                tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof(*v));
    }
}

/* Insertion sort: stable and allocation-free, the fallback when no sort buffer can be had. */
static void sort_by_local_slow(pdl_desc_t *v, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        pdl_desc_t x = v[i];
        size_t j = i;
        while (j > 0 && v[j - 1].local_off > x.local_off) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

/* Sorts (if needed) and merges v[0..n); returns the new count. */
static size_t merge_run(pdl_desc_t *v, size_t n)
{
    if (n < 2)
        return n;
    bool sorted = true;
    for (size_t i = 1; i < n && sorted; i++)
        sorted = v[i - 1].local_off <= v[i].local_off;
    if (!sorted) {
        pdl_desc_t *tmp = malloc(n * sizeof(*tmp));
        if (tmp != NULL) {
            sort_by_local(v, tmp, n);
            free(tmp);
        } else {
            sort_by_local_slow(v, n);
        }
    }
    size_t w = 0;
    for (size_t i = 1; i < n; i++) {
        pdl_desc_t *cur = &v[w];
        /* Join only when adjacent on both sides; the sums cannot wrap for ranges inside a region. */
        if (v[i].local_off == cur->local_off + cur->len && v[i].remote_off == cur->remote_off + cur->len &&
            cur->len + v[i].len >= cur->len) {
            cur->len += v[i].len;
        } else {
            v[++w] = v[i];
        }
    }
    return w + 1;
}

void pdl_layout_merge(pdl_descv_t *dv)
{
    if (dv == NULL || dv->v == NULL)
        return;
    dv->n = merge_run(dv->v, dv->n);
}

pdl_status_t pdl_layout_build_descs(const pdl_kv_geometry_t *local, const pdl_kv_geometry_t *remote,
                                    pdl_dir_t dir, const pdl_plan_piece_t *pieces, int num_pieces,
                                    const uint32_t *local_blocks, const uint32_t *remote_blocks, size_t nblocks,
                                    uint64_t local_base, uint64_t remote_base, pdl_descv_t *out, pdl_error_t *err)
{
    if (out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "descriptor output vector is NULL");
    if (num_pieces < 0 || (num_pieces > 0 && pieces == NULL))
        return pdl_error_set(err, PDL_ERR_INVALID, "%d plan pieces with a NULL array", num_pieces);
    if (nblocks > 0 && (local_blocks == NULL || remote_blocks == NULL))
        return pdl_error_set(err, PDL_ERR_INVALID, "%zu block ids with a NULL block list", nblocks);
    pdl_status_t st = check_sides(local, remote, err);
    if (st != PDL_OK)
        return st;
    if ((st = check_bases(local, remote, local_base, remote_base, err)) != PDL_OK)
        return st;
    for (int i = 0; i < num_pieces; i++) {
        if (pieces[i].producer_rank != pieces[0].producer_rank)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "plan pieces name two prefill ranks, %d and %d; build one list per producer",
                                 pieces[0].producer_rank, pieces[i].producer_rank);
        if ((st = check_piece(local, remote, dir, &pieces[i], err)) != PDL_OK)
            return st;
    }
    for (size_t b = 0; b < nblocks; b++) {
        if (local_blocks[b] >= local->num_blocks)
            return pdl_error_set(err, PDL_ERR_INVALID, "local block id %u at index %zu is outside num_blocks %llu",
                                 local_blocks[b], b, (unsigned long long)local->num_blocks);
        if (remote_blocks[b] >= remote->num_blocks)
            return pdl_error_set(err, PDL_ERR_INVALID, "remote block id %u at index %zu is outside num_blocks %llu",
                                 remote_blocks[b], b, (unsigned long long)remote->num_blocks);
    }

    size_t n0 = out->n;
    const int halves = pdl_layout_num_halves(local);
    for (int i = 0; i < num_pieces; i++) {
        int lh, rh;
        piece_sides(&pieces[i], dir, &lh, &rh);
        for (int h = 0; h < halves; h++)
            for (size_t b = 0; b < nblocks; b++)
                if (emit_piece(local, remote, lh, rh, pieces[i].num_heads, h, local_blocks[b], remote_blocks[b],
                               local_base, remote_base, out) != 0) {
                    out->n = n0;
                    return pdl_error_set(err, PDL_ERR_NOMEM, "out of memory building descriptors for %zu blocks",
                                         nblocks);
                }
    }
    /* Merge only what this call appended, so earlier producers' lists stay as the caller left them. */
    if (out->n > n0)
        out->n = n0 + merge_run(out->v + n0, out->n - n0);
    return PDL_OK;
}

uint64_t pdl_layout_total_bytes(const pdl_descv_t *dv)
{
    uint64_t t = 0;
    if (dv == NULL)
        return 0;
    for (size_t i = 0; i < dv->n; i++)
        t += dv->v[i].len;
    return t;
}
