/*
 * plan_doc.c -- the document of `pdlink plan` (plan.h): for each topology and each distinct (P, D) pair of
 * it, computed with the same topo and layout functions the connector uses -- every decode rank's group,
 * read plan, byte ranges of each head slice inside a block and merged descriptor counts; every prefill
 * rank's groups, readers or write targets and expected releases; and how upstream MoRIIO would treat the
 * pair. The human output is rendered from this document (plan_print.c).
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/plan.h"
#include "pdlink/topo.h"
#include "pdlink/version.h"

static json_t *int_range_array(int first, int count)
{
    json_t *a = json_array();
    for (int i = first; i < first + count; i++)
        json_array_append_new(a, json_integer(i));
    return a;
}

static json_t *heads_obj(int first, int count)
{
    return json_pack("{s:i, s:i}", "first", first, "count", count);
}

static pdl_kv_geometry_t side_geometry(const plan_cfg_t *c, int heads_per_rank, uint64_t num_blocks)
{
    return (pdl_kv_geometry_t){
        .num_blocks = num_blocks,
        .block_size = c->block_size,
        .num_heads = (uint32_t)heads_per_rank,
        .head_dim = (uint32_t)c->head_dim,
        .elem_size = (uint32_t)c->elem_size,
        .kv_separate = c->kv_separate,
        .order = c->order,
        .is_mla = c->mla,
        .kv_fused = c->kv_fused,
    };
}

/*
 * Ranges of one piece inside one block, per K/V half, as offsets from the start of the half-block:
 * {half, src_offset, dst_offset, len, count, src_stride, dst_stride} (count > 1 for NHD per-token runs).
 */
static pdl_status_t piece_ranges_json(const pdl_kv_geometry_t *cg1, const pdl_kv_geometry_t *pg1,
                                      const pdl_plan_piece_t *pc, json_t *out, pdl_error_t *err)
{
    for (int h = 0; h < pdl_layout_num_halves(cg1); h++) {
        pdl_descv_t dv = {0};
        pdl_status_t st = pdl_layout_piece_ranges(cg1, pg1, PDL_DIR_READ, pc, h, 0, 0, 0, 0, &dv, err);
        if (st != PDL_OK) {
            pdl_descv_free(&dv);
            return st;
        }
        uint64_t cbase = pdl_layout_half_offset(cg1, 0, h), pbase = pdl_layout_half_offset(pg1, 0, h);
        uint64_t sst = dv.n > 1 ? dv.v[1].remote_off - dv.v[0].remote_off : 0;
        uint64_t dst = dv.n > 1 ? dv.v[1].local_off - dv.v[0].local_off : 0;
        json_array_append_new(out, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "half",
                                             cg1->is_mla ? "latent" : cg1->kv_fused ? "KV" : (h == 0 ? "K" : "V"),
                                             "src_offset",
                                             (json_int_t)(dv.v[0].remote_off - pbase), "dst_offset",
                                             (json_int_t)(dv.v[0].local_off - cbase), "len", (json_int_t)dv.v[0].len,
                                             "count", (json_int_t)dv.n, "src_stride", (json_int_t)sst,
                                             "dst_stride", (json_int_t)dst));
        pdl_descv_free(&dv);
    }
    return PDL_OK;
}

/* Merged descriptor count for `n` consecutive block pairs starting at 0 (one layer). */
static pdl_status_t count_descs(const pdl_kv_geometry_t *cg, const pdl_kv_geometry_t *pg, const pdl_plan_piece_t *pc,
                                uint32_t n, size_t *count, uint64_t *bytes, pdl_error_t *err)
{
    uint32_t *blocks = malloc((size_t)n * sizeof(*blocks));
    if (blocks == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "out of memory for %u block ids", n);
    for (uint32_t i = 0; i < n; i++)
        blocks[i] = i;
    pdl_descv_t dv = {0};
    pdl_status_t st = pdl_layout_build_descs(cg, pg, PDL_DIR_READ, pc, 1, blocks, blocks, n, 0, 0, &dv, err);
    if (st == PDL_OK) {
        *count = dv.n;
        *bytes = pdl_layout_total_bytes(&dv);
    }
    pdl_descv_free(&dv);
    free(blocks);
    return st;
}

static json_t *piece_json(const pdl_plan_piece_t *pc)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:i}", "producer_rank", pc->producer_rank, "first_head", pc->first_head,
                     "num_heads", pc->num_heads, "src_head", pc->src_head, "dst_head", pc->dst_head);
}

/* One (P, D) pair while its document is built: the sizes, the fan-in counts, both sides' geometry (whole
 * caches for descriptor counts, one block for offsets) and which producer ranks MoRIIO would release. */
typedef struct pair_ctx {
    const plan_cfg_t *c;
    int P, D, acks, wdone;
    pdl_kv_geometry_t pg, cg, pg1, cg1;
    bool moriio_released[PDL_TOPO_MAX_TP];
} pair_ctx_t;

/* What decode rank rp's pieces read (or receive): their ranges and descriptor counts, into cj. */
static pdl_status_t consumer_reads_json(const pair_ctx_t *x, const pdl_read_plan_t *rp, json_t *cj, pdl_error_t *err)
{
    json_t *reads = json_array();
    json_object_set_new(cj, "reads", reads);
    size_t per_block = 0, per_sample = 0;
    uint64_t bytes_block = 0;
    for (int i = 0; i < rp->num_pieces; i++) {
        const pdl_plan_piece_t *pc = &rp->pieces[i];
        json_t *r = piece_json(pc), *ranges = json_array();
        json_array_append_new(reads, r);
        json_object_set_new(r, "ranges", ranges);
        size_t nb = 0, ns = 0;
        uint64_t bb = 0, bs = 0;
        if (piece_ranges_json(&x->cg1, &x->pg1, pc, ranges, err) != PDL_OK ||
            count_descs(&x->cg, &x->pg, pc, 1, &nb, &bb, err) != PDL_OK ||
            count_descs(&x->cg, &x->pg, pc, x->c->sample_blocks, &ns, &bs, err) != PDL_OK)
            return PDL_ERR_INVALID;
        json_object_set_new(r, "descs_per_block", json_integer((json_int_t)nb));
        json_object_set_new(r, "bytes_per_block", json_integer((json_int_t)bb));
        json_object_set_new(r, "descs_sample", json_integer((json_int_t)ns));
        per_block += nb;
        per_sample += ns;
        bytes_block += bb;
    }
    json_object_set_new(cj, "descs_per_block", json_integer((json_int_t)per_block));
    json_object_set_new(cj, "bytes_per_block", json_integer((json_int_t)bytes_block));
    json_object_set_new(cj, "descs_sample", json_integer((json_int_t)per_sample));
    json_object_set_new(cj, "descs_sample_all_layers", json_integer((json_int_t)per_sample * x->c->layers));
    return PDL_OK;
}

/* Every decode rank: its heads, group, reads, and whom it releases to (or expects write_done from); the
 * descriptor counts summed over the ranks in totals[0] (per block) and totals[1] (the sample). */
static pdl_status_t consumers_json(pair_ctx_t *x, json_t *pair, json_int_t totals[2], pdl_error_t *err)
{
    json_t *consumers = json_array();
    json_object_set_new(pair, "consumers", consumers);
    for (int d = 0; d < x->D; d++) {
        pdl_read_plan_t rp;
        if (pdl_topo_read_plan(x->P, x->D, x->c->heads, x->c->mla, d, &rp, err) != PDL_OK)
            return PDL_ERR_INVALID;
        x->moriio_released[rp.group_first] = true; /* MoRIIO releases only the mapped (first) rank */
        json_t *cj = json_pack("{s:i, s:o, s:o}", "rank", d, "heads",
                               heads_obj(rp.local_first_head, rp.local_num_heads), "group",
                               int_range_array(rp.group_first, rp.group_count));
        json_array_append_new(consumers, cj);
        if (consumer_reads_json(x, &rp, cj, err) != PDL_OK)
            return PDL_ERR_INVALID;
        totals[0] += json_integer_value(json_object_get(cj, "descs_per_block"));
        totals[1] += json_integer_value(json_object_get(cj, "descs_sample"));
        if (x->c->write_mode) {
            json_object_set_new(cj, "remote_blocks_to", int_range_array(rp.group_first, rp.group_count));
            json_object_set_new(cj, "expected_write_done", json_integer(x->wdone));
            json_object_set_new(cj, "releases_to", json_array());
        } else {
            json_object_set_new(cj, "releases_to", int_range_array(rp.group_first, rp.group_count));
        }
    }
    return PDL_OK;
}

/* Every prefill rank: its heads, the groups it is in, who reads it (or what it writes), the releases it
 * expects. The ranks MoRIIO would never release go into `unreleased`. */
static pdl_status_t producers_json(const pair_ctx_t *x, json_t *pair, json_t *unreleased, pdl_error_t *err)
{
    json_t *producers = json_array();
    json_object_set_new(pair, "producers", producers);
    for (int p = 0; p < x->P; p++) {
        int hf, hc;
        pdl_write_plan_t wp;
        if (pdl_topo_heads(x->P, x->c->heads, x->c->mla, p, &hf, &hc, err) != PDL_OK ||
            pdl_topo_write_plan(x->P, x->D, x->c->heads, x->c->mla, p, &wp, err) != PDL_OK)
            return PDL_ERR_INVALID;
        json_t *read_by = json_array(), *writes = json_array();
        for (int t = 0; t < wp.num_targets; t++) {
            json_array_append_new(read_by, json_integer(wp.targets[t].consumer_rank));
            json_t *w = piece_json(&wp.targets[t].piece);
            json_object_set_new(w, "consumer_rank", json_integer(wp.targets[t].consumer_rank));
            json_array_append_new(writes, w);
        }
        json_t *pj = json_pack("{s:i, s:o, s:o, s:o, s:b}", "rank", p, "heads", heads_obj(hf, hc), "in_groups_of",
                               int_range_array(wp.notify_first, wp.notify_count), "read_by", read_by,
                               "moriio_released", x->moriio_released[p]);
        if (x->c->write_mode) {
            json_object_set_new(pj, "expected_acks", json_integer(0));
            json_object_set_new(pj, "writes", writes);
            json_object_set_new(pj, "write_done_to", int_range_array(wp.notify_first, wp.notify_count));
        } else {
            json_decref(writes);
            json_object_set_new(pj, "expected_acks", json_integer(x->acks));
            json_object_set_new(pj, "release_from", int_range_array(wp.notify_first, wp.notify_count));
        }
        json_array_append_new(producers, pj);
        if (!x->moriio_released[p])
            json_array_append_new(unreleased, json_integer(p));
    }
    return PDL_OK;
}

/* How upstream MoRIIO would treat this pair (docs/protocol.md#where-upstream-moriio-differs), and what
 * pdlink guarantees instead. Takes `unreleased` (cleared where MoRIIO does not get that far). */
static void summaries_json(const pair_ctx_t *x, json_t *pair, json_t *unreleased)
{
    const plan_cfg_t *c = x->c;
    char summary[512];
    bool supported = true;
    if (x->P == x->D) {
        snprintf(summary, sizeof(summary), "MoRIIO: supported (same TP on both sides)");
        json_array_clear(unreleased);
    } else if (c->write_mode) {
        supported = false;
        snprintf(summary, sizeof(summary),
                 "MoRIIO: not supported (heterogeneous TP works in READ mode only; WRITE fans out by the local TP "
                 "size)");
        json_array_clear(unreleased);
    } else if (!c->mla && (x->P < c->heads || x->D < c->heads)) {
        supported = false;
        snprintf(summary, sizeof(summary), "MoRIIO: rejected (heads must be split: min(P, D) = %d < %d KV heads)",
                 x->P < x->D ? x->P : x->D, c->heads);
        json_array_clear(unreleased);
    } else if (json_array_size(unreleased) > 0) {
        size_t o = (size_t)snprintf(summary, sizeof(summary), "MoRIIO: supported; P%d/D%d leaves producer ranks ",
                                    x->P, x->D);
        size_t i;
        json_t *v;
        json_array_foreach(unreleased, i, v)
        {
            if (o < sizeof(summary))
                o += (size_t)snprintf(summary + o, sizeof(summary) - o, "%s%" JSON_INTEGER_FORMAT, i ? "," : "",
                                      json_integer_value(v));
        }
        if (o < sizeof(summary))
            snprintf(summary + o, sizeof(summary) - o, " unreleased (freed only by the defer_timeout reaper)");
    } else {
        snprintf(summary, sizeof(summary), "MoRIIO: supported (replicated heads)");
    }
    json_object_set_new(pair, "moriio", json_pack("{s:b, s:O, s:s}", "supported", supported,
                                                  "unreleased_producer_ranks", unreleased, "summary", summary));
    char pd[200];
    if (c->write_mode)
        snprintf(pd, sizeof(pd), "pdlink: every decode rank receives exactly %d write_done(s), from every prefill "
                                 "rank of its group",
                 x->wdone);
    else
        snprintf(pd, sizeof(pd), "pdlink: every prefill rank receives exactly %d release(s)", x->acks);
    json_object_set_new(pair, "pdlink_summary", json_string(pd));
}

/* One (P, D) pair: everything a user needs to see about it. NULL with `err` set on a topology error. */
static json_t *pair_json(const plan_cfg_t *c, int P, int D, pdl_error_t *err)
{
    pair_ctx_t x = {.c = c, .P = P, .D = D};
    int phf, phc, chf, chc;
    if (pdl_topo_expected_acks(P, D, &x.acks, err) != PDL_OK ||
        pdl_topo_expected_write_done(P, D, &x.wdone, err) != PDL_OK)
        return NULL;
    if (pdl_topo_heads(P, c->heads, c->mla, 0, &phf, &phc, err) != PDL_OK) {
        pdl_error_prefix(err, PDL_ERR_INVALID, "prefill");
        return NULL;
    }
    if (pdl_topo_heads(D, c->heads, c->mla, 0, &chf, &chc, err) != PDL_OK) {
        pdl_error_prefix(err, PDL_ERR_INVALID, "decode");
        return NULL;
    }
    x.pg = side_geometry(c, phc, c->num_blocks);
    x.cg = side_geometry(c, chc, c->num_blocks);
    x.pg1 = side_geometry(c, phc, 1);
    x.cg1 = side_geometry(c, chc, 1);
    if (pdl_layout_validate(&x.pg, err) != PDL_OK || pdl_layout_validate(&x.cg, err) != PDL_OK)
        return NULL;
    json_t *pair = json_pack("{s:i, s:i, s:i, s:i, s:b}", "prefill_tp", P, "decode_tp", D, "expected_acks", x.acks,
                             "expected_write_done", x.wdone, "heads_split",
                             !c->mla && P != D && (P < c->heads || D < c->heads));
    json_object_set_new(pair, "prefill_rank_geometry",
                        json_pack("{s:i, s:I, s:i}", "heads_per_rank", phc, "block_len",
                                  (json_int_t)pdl_layout_block_len(&x.pg), "halves", pdl_layout_num_halves(&x.pg)));
    json_object_set_new(pair, "decode_rank_geometry",
                        json_pack("{s:i, s:I, s:i}", "heads_per_rank", chc, "block_len",
                                  (json_int_t)pdl_layout_block_len(&x.cg), "halves", pdl_layout_num_halves(&x.cg)));
    json_t *unreleased = json_array();
    json_int_t totals[2] = {0, 0};
    if (consumers_json(&x, pair, totals, err) != PDL_OK || producers_json(&x, pair, unreleased, err) != PDL_OK) {
        json_decref(unreleased);
        json_decref(pair);
        return NULL;
    }
    json_object_set_new(pair, "descs_per_block_all_ranks", json_integer(totals[0]));
    json_object_set_new(pair, "descs_sample_all_ranks", json_integer(totals[1]));
    summaries_json(&x, pair, unreleased);
    json_decref(unreleased);
    return pair;
}

json_t *pdl_plan_doc(const plan_cfg_t *c, pdl_error_t *err)
{
    json_t *doc = json_object();
    json_object_set_new(doc, "pdlink_version", json_string(PDL_VERSION_STRING));
    json_object_set_new(doc, "mode", json_string(c->write_mode ? "write" : "read"));
    if (c->model != NULL)
        json_object_set_new(doc, "model", json_pack("{s:s, s:s, s:s}", "name", c->model->name, "hf_id",
                                                    c->model->hf_id, "description", c->model->description));
    else
        json_object_set_new(doc, "model", json_null());
    json_object_set_new(
        doc, "geometry",
        json_pack("{s:i, s:i, s:i, s:b, s:s, s:i, s:i, s:s, s:b, s:b, s:I, s:i}", "num_layers", c->layers,
                  "total_kv_heads", c->heads, "head_dim", c->head_dim, "is_mla", c->mla, "dtype", c->dtype, "elem_size",
                  c->elem_size, "block_size", (int)c->block_size, "layout", pdl_layout_order_name(c->order),
                  "kv_separate", c->kv_separate, "kv_fused", c->kv_fused, "num_blocks", (json_int_t)c->num_blocks,
                  "sample_blocks", (int)c->sample_blocks));
    json_t *topos = json_array();
    json_object_set_new(doc, "topologies", topos);
    for (int t = 0; t < c->n_topos; t++) {
        const plan_topo_t *tp = &c->topos[t];
        json_t *pairs = json_array();
        json_t *tj = json_pack("{s:s, s:o, s:o, s:o}", "name", tp->name, "prefill_instances", json_array(),
                               "decode_instances", json_array(), "pairs", pairs);
        json_array_append_new(topos, tj);
        for (int i = 0; i < tp->n_prefill; i++)
            json_array_append_new(json_object_get(tj, "prefill_instances"), json_integer(tp->prefill[i]));
        for (int i = 0; i < tp->n_decode; i++)
            json_array_append_new(json_object_get(tj, "decode_instances"), json_integer(tp->decode[i]));
        /* Each decode instance pairs with one prefill instance at a time: one plan per distinct (P, D). */
        int seen[PLAN_MAX_INSTANCES * PLAN_MAX_INSTANCES][2], nseen = 0;
        for (int i = 0; i < tp->n_prefill; i++)
            for (int j = 0; j < tp->n_decode; j++) {
                int P = tp->prefill[i], D = tp->decode[j];
                bool dup = false;
                for (int k = 0; k < nseen; k++)
                    dup |= seen[k][0] == P && seen[k][1] == D;
                if (dup)
                    continue;
                seen[nseen][0] = P;
                seen[nseen][1] = D;
                nseen++;
                json_t *pj = pair_json(c, P, D, err);
                if (pj == NULL) {
                    char single[32];
                    snprintf(single, sizeof(single), "P%d/D%d", P, D);
                    if (strcmp(single, tp->name) == 0)
                        pdl_error_prefix(err, PDL_ERR_INVALID, "%s", tp->name);
                    else
                        pdl_error_prefix(err, PDL_ERR_INVALID, "topology %s, pair %s", tp->name, single);
                    json_decref(doc);
                    return NULL;
                }
                json_array_append_new(pairs, pj);
            }
    }
    return doc;
}
