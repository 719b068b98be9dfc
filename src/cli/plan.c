/*
 * plan.c -- `pdlink plan`: explains how the KV cache moves between prefill and decode ranks for a
 * topology before anyone deploys it (docs/plan.md).
 *
 * How it works: the command line gives one or more prefill instances and one or more decode instances
 * (xPyD: `--prefill-tp 4,4 --decode-tp 8`) plus the KV geometry, from a model preset and/or flags. A
 * decode instance pairs with one prefill instance at a time, so the plan is computed once per distinct
 * (P, D) pair: for every decode rank its group, its read plan (topo), the byte ranges of each head slice
 * inside a block and the descriptor counts after merging (layout); for every prefill rank the releases
 * it expects and, in WRITE mode, what it writes and whom it notifies. Everything is computed into a
 * jansson document first; `--json` prints that document and the human output is rendered from it, so
 * the two can never disagree. `--seed` shows the four seed topologies (P4/D8, P8/D4, P4+P4/D8,
 * P8/D4+D4). Exit status: 0, or 2 with a message naming the values for any usage or topology error.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/optab.h"
#include "cli/cli.h"
#include "pdlink/layout.h"
#include "pdlink/models.h"
#include "pdlink/topo.h"

#define PLAN_MAX_INSTANCES 16
#define PLAN_MAX_TOPOS 4

typedef struct plan_topo {
    char name[96];
    int prefill[PLAN_MAX_INSTANCES], n_prefill;
    int decode[PLAN_MAX_INSTANCES], n_decode;
} plan_topo_t;

typedef struct plan_cfg {
    plan_topo_t topos[PLAN_MAX_TOPOS];
    int n_topos;
    const pdl_model_preset_t *model;
    int layers, heads, head_dim, elem_size;
    const char *dtype;
    bool mla;
    uint32_t block_size;
    uint64_t num_blocks;
    uint32_t sample_blocks;
    pdl_kv_order_t order;
    bool kv_separate;
    bool kv_fused;
    bool write_mode;
    bool json;
} plan_cfg_t;

/* ---- options: one table row per flag (app/optab.h) ------------------------------------------------- */

/* What the command line says, before the model preset and the seed topologies are folded in. */
typedef struct plan_opts {
    int prefill[PLAN_MAX_INSTANCES], n_prefill;
    int decode[PLAN_MAX_INSTANCES], n_decode;
    const char *model;
    int heads, head_dim, layers, block_size, sample_blocks;
    long num_blocks;
    const char *dtype;
    int layout, mode; /* indexes into plan_layouts, plan_modes */
    bool mla, kv_interleaved, kv_fused, seed, json;
} plan_opts_t;

static const char *const plan_layouts[] = {"hnd", "nhd", NULL};
static const char *const plan_modes[] = {"read", "write", NULL};

static pdl_status_t list_models(void *opts, const pdl_optdef_t *row, const char *flag, const char *value, bool *done_p,
                                pdl_error_t *err)
{
    (void)opts, (void)row, (void)flag, (void)value, (void)err;
    for (size_t i = 0; i < pdl_model_count(); i++) {
        const pdl_model_preset_t *m = pdl_model_at(i);
        printf("%-14s %-34s %s\n", m->name, m->hf_id[0] ? m->hf_id : "-", m->description);
    }
    *done_p = true;
    return PDL_OK;
}

static void help_models(FILE *f)
{
    fprintf(f, "\nmodel presets:\n");
    for (size_t i = 0; i < pdl_model_count(); i++)
        fprintf(f, "  %-14s %s\n", pdl_model_at(i)->name, pdl_model_at(i)->description);
}

#define PO(field) offsetof(plan_opts_t, field)
static const pdl_optdef_t plan_rows[] = {
    {.name = "prefill-tp", .kind = PDL_OPT_INT_LIST, .metavar = "LIST", .off = PO(prefill), .off2 = PO(n_prefill),
     .lo = 1, .hi = PDL_TOPO_MAX_TP, .max_n = PLAN_MAX_INSTANCES,
     .help = "TP size of each prefill instance, e.g. 4 or 4,4 (xPyD)"},
    {.name = "decode-tp", .kind = PDL_OPT_INT_LIST, .metavar = "LIST", .off = PO(decode), .off2 = PO(n_decode),
     .lo = 1, .hi = PDL_TOPO_MAX_TP, .max_n = PLAN_MAX_INSTANCES,
     .help = "TP size of each decode instance, e.g. 8 or 4,4"},
    {.name = "model", .kind = PDL_OPT_STRING, .metavar = "PRESET", .off = PO(model),
     .help = "take layers, KV heads, head dim and MLA from a preset (flags override)"},
    {.name = "kv-heads", .kind = PDL_OPT_INT, .metavar = "N", .off = PO(heads), .lo = 1, .hi = 1 << 16,
     .help = "total KV heads of the model (required without --model)"},
    {.name = "head-dim", .kind = PDL_OPT_INT, .metavar = "N", .off = PO(head_dim), .lo = 1, .hi = 1 << 20,
     .help = "elements per head per token (the latent width for MLA)"},
    {.name = "layers", .kind = PDL_OPT_INT, .metavar = "N", .off = PO(layers), .lo = 1, .hi = 1 << 16,
     .help = "attention layers (default: the preset's, else 1)"},
    {.name = "mla", .kind = PDL_OPT_FLAG, .off = PO(mla),
     .help = "multi-head latent attention: one replicated latent, no V half"},
    {.name = "block-size", .kind = PDL_OPT_INT, .metavar = "N", .def = "16", .off = PO(block_size), .lo = 1,
     .hi = 1 << 20, .help = "tokens per block"},
    {.name = "dtype", .kind = PDL_OPT_STRING, .metavar = "NAME", .off = PO(dtype),
     .help = "KV cache dtype: bf16, fp16, fp8 or fp32 (default: the preset's, else bf16)"},
    {.name = "layout", .kind = PDL_OPT_CHOICE, .metavar = "hnd|nhd", .def = "hnd", .off = PO(layout),
     .choices = plan_layouts, .help = "head-major or token-major half-blocks"},
    {.name = "kv-interleaved", .kind = PDL_OPT_FLAG, .off = PO(kv_interleaved),
     .help = "K and V interleaved per block ([blocks][2]...) instead of [2][blocks]..."},
    {.name = "kv-fused", .kind = PDL_OPT_FLAG, .off = PO(kv_fused),
     .help = "K and V concatenated per token, one half per block (vLLM's CPU cache)"},
    {.name = "mode", .kind = PDL_OPT_CHOICE, .metavar = "read|write", .def = "read", .off = PO(mode),
     .choices = plan_modes, .help = "decode pulls or prefill pushes"},
    {.name = "num-blocks", .kind = PDL_OPT_LONG, .metavar = "N", .def = "1024", .off = PO(num_blocks), .lo = 1,
     .hi = 1L << 30, .help = "KV blocks per rank used for offsets"},
    {.name = "sample-blocks", .kind = PDL_OPT_INT, .metavar = "N", .def = "8", .off = PO(sample_blocks), .lo = 1,
     .hi = 1 << 16, .help = "consecutive blocks in the descriptor sample"},
    {.name = "seed", .kind = PDL_OPT_FLAG, .off = PO(seed),
     .help = "show P4/D8, P8/D4, P4+P4/D8 and P8/D4+D4 (default model llama-3.1-8b)"},
    {.name = "json", .kind = PDL_OPT_FLAG, .off = PO(json), .help = "one JSON document (schema in docs/plan.md)"},
    {.name = "list-models", .kind = PDL_OPT_CALL, .set = list_models, .help = "the model presets, with their HF ids"},
    {.name = "help", .alias = 'h', .kind = PDL_OPT_HELP, .help = "this text"},
    {0},
};
#undef PO

static const pdl_optab_t plan_table = {
    .prog = "pdlink plan",
    .usage = "usage: pdlink plan --prefill-tp P[,P...] --decode-tp D[,D...] [--model PRESET]\n"
             "                   [--kv-heads N] [--head-dim N] [--layers N] [--mla] [--block-size N]\n"
             "                   [--dtype bf16|fp16|fp8|fp32] [--layout hnd|nhd] [--kv-interleaved] [--kv-fused]\n"
             "                   [--mode read|write] [--num-blocks N] [--sample-blocks N] [--json]\n"
             "       pdlink plan --seed [--model PRESET] [options]   the four seed topologies\n"
             "       pdlink plan --list-models\n"
             "\n"
             "Explains a heterogeneous-TP topology: the prefill ranks each decode rank reads (or that write\n"
             "to it), the byte ranges of every head slice inside a block, descriptors per block after\n"
             "merging, the releases each decode rank sends and the ACKs each prefill rank expects.\n"
             "\n",
    .rows = plan_rows,
    .help_tail = help_models,
};

static void topo_name(plan_topo_t *t)
{
    size_t o = 0;
    for (int i = 0; i < t->n_prefill; i++)
        o += (size_t)snprintf(t->name + o, sizeof(t->name) - o, "%sP%d", i ? "+" : "", t->prefill[i]);
    for (int i = 0; i < t->n_decode && o < sizeof(t->name); i++)
        o += (size_t)snprintf(t->name + o, sizeof(t->name) - o, "%sD%d", i ? "+" : "/", t->decode[i]);
}

static void add_topo(plan_cfg_t *c, const int *p, int np, const int *d, int nd)
{
    plan_topo_t *t = &c->topos[c->n_topos++];
    memset(t, 0, sizeof(*t));
    memcpy(t->prefill, p, (size_t)np * sizeof(int));
    memcpy(t->decode, d, (size_t)nd * sizeof(int));
    t->n_prefill = np;
    t->n_decode = nd;
    topo_name(t);
}

/* The KV geometry: the preset's (--model, or the seed's default model), then each explicit flag over it. */
static pdl_status_t resolve_geometry(plan_cfg_t *c, const plan_opts_t *o, pdl_error_t *err)
{
    const char *model = o->model == NULL && o->seed ? "llama-3.1-8b" : o->model;
    if (model != NULL) {
        c->model = pdl_model_find(model);
        if (c->model == NULL)
            return pdl_error_set(err, PDL_ERR_INVALID, "unknown model preset '%s' (pdlink plan --list-models)", model);
        c->layers = c->model->num_layers;
        c->heads = c->model->total_kv_heads;
        c->head_dim = c->model->head_dim;
        c->mla = c->model->is_mla;
        c->elem_size = c->model->elem_size;
    }
    c->layers = o->layers > 0 ? o->layers : c->layers > 0 ? c->layers : 1;
    c->heads = o->heads > 0 ? o->heads : c->heads;
    c->head_dim = o->head_dim > 0 ? o->head_dim : c->head_dim;
    c->mla |= o->mla;
    if (c->mla && o->heads == 0)
        c->heads = 1; /* the latent is one replicated "head" */
    if (c->mla && c->kv_fused)
        return pdl_error_set(err, PDL_ERR_INVALID, "--kv-fused needs K and V; an MLA model has no V half");
    c->dtype = o->dtype;
    if (c->dtype != NULL) {
        c->elem_size = pdl_model_dtype_size(c->dtype);
        if (c->elem_size < 0)
            return pdl_error_set(err, PDL_ERR_INVALID, "--dtype '%s' is not one of bf16, fp16, fp8, fp32", c->dtype);
    } else {
        c->dtype = c->elem_size == 1 ? "fp8" : c->elem_size == 4 ? "fp32" : "bf16";
        if (c->elem_size == 0)
            c->elem_size = 2;
    }
    if (c->heads == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "--kv-heads is required without --model (or pass --mla)");
    if (c->head_dim == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "--head-dim is required without --model");
    return PDL_OK;
}

/* The topologies: the four seed ones (--seed), or the one the TP lists describe. */
static pdl_status_t resolve_topologies(plan_cfg_t *c, const plan_opts_t *o, pdl_error_t *err)
{
    if (o->seed) {
        if (o->n_prefill > 0 || o->n_decode > 0)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "--seed shows the seed topologies; drop --prefill-tp/--decode-tp");
        add_topo(c, (int[]){4}, 1, (int[]){8}, 1);
        add_topo(c, (int[]){8}, 1, (int[]){4}, 1);
        add_topo(c, (int[]){4, 4}, 2, (int[]){8}, 1);
        add_topo(c, (int[]){8}, 1, (int[]){4, 4}, 2);
        return PDL_OK;
    }
    if (o->n_prefill == 0 || o->n_decode == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "--prefill-tp and --decode-tp are both required (or --seed)");
    add_topo(c, o->prefill, o->n_prefill, o->decode, o->n_decode);
    return PDL_OK;
}

/* Returns 0 to go on, 1 when the command is done with success (help), 2 on a usage error. */
static int parse_args(int argc, char **argv, plan_cfg_t *c)
{
    if (argc < 2) {
        pdl_optab_help(&plan_table, stderr);
        return 2;
    }
    plan_opts_t o = {0};
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_optab_result_t r = pdl_optab_parse(&plan_table, &o, argc, argv, NULL, &err);
    if (r != PDL_OPTAB_GO)
        return r == PDL_OPTAB_DONE ? 1 : (fprintf(stderr, "pdlink plan: %s\n", err.msg), 2);
    memset(c, 0, sizeof(*c));
    c->block_size = (uint32_t)o.block_size;
    c->num_blocks = (uint64_t)o.num_blocks;
    c->sample_blocks = (uint32_t)(o.sample_blocks < o.num_blocks ? o.sample_blocks : o.num_blocks);
    c->order = (pdl_kv_order_t)pdl_layout_order_parse(plan_layouts[o.layout]);
    c->kv_separate = !o.kv_interleaved;
    c->kv_fused = o.kv_fused;
    c->write_mode = o.mode == 1;
    c->json = o.json;
    if (resolve_geometry(c, &o, &err) != PDL_OK || resolve_topologies(c, &o, &err) != PDL_OK) {
        fprintf(stderr, "pdlink plan: %s\n", err.msg);
        return 2;
    }
    return 0;
}
/* ---- the plan as a JSON document ------------------------------------------------------------------- */

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

static json_t *plan_json(const plan_cfg_t *c, pdl_error_t *err)
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

/* ---- human output, rendered from the document ------------------------------------------------------ */

static json_int_t geti(const json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }

static void print_int_list(const json_t *a)
{
    size_t i;
    json_t *v;
    if (json_array_size(a) == 0) {
        printf("none");
        return;
    }
    printf("{");
    json_array_foreach(a, i, v) printf("%s%" JSON_INTEGER_FORMAT, i ? "," : "", json_integer_value(v));
    printf("}");
}

static void print_heads(const json_t *h)
{
    json_int_t f = geti(h, "first"), n = geti(h, "count");
    if (n == 1)
        printf("head %" JSON_INTEGER_FORMAT, f);
    else
        printf("heads %" JSON_INTEGER_FORMAT "-%" JSON_INTEGER_FORMAT, f, f + n - 1);
}

static void print_pair(const plan_cfg_t *c, const json_t *pair)
{
    const bool w = c->write_mode;
    json_int_t P = geti(pair, "prefill_tp"), D = geti(pair, "decode_tp");
    const json_t *pgeo = json_object_get(pair, "prefill_rank_geometry"), *cgeo = json_object_get(pair, "decode_rank_geometry");
    printf("\n== P%" JSON_INTEGER_FORMAT "/D%" JSON_INTEGER_FORMAT " (%s mode)\n", P, D, w ? "WRITE" : "READ");
    printf("prefill rank: %" JSON_INTEGER_FORMAT " %s/rank, block_len %" JSON_INTEGER_FORMAT " B per %s\n",
           geti(pgeo, "heads_per_rank"), c->mla ? "MLA latent" : "KV head(s)", geti(pgeo, "block_len"),
           c->mla || c->kv_fused ? "block" : "K/V half-block");
    printf("decode rank:  %" JSON_INTEGER_FORMAT " %s/rank, block_len %" JSON_INTEGER_FORMAT " B per %s\n",
           geti(cgeo, "heads_per_rank"), c->mla ? "MLA latent" : "KV head(s)", geti(cgeo, "block_len"),
           c->mla || c->kv_fused ? "block" : "K/V half-block");
    if (w)
        printf("fan-in: each decode rank waits for %" JSON_INTEGER_FORMAT " write_done(s)\n",
               geti(pair, "expected_write_done"));
    else
        printf("fan-in: each prefill rank waits for %" JSON_INTEGER_FORMAT " release(s)\n",
               geti(pair, "expected_acks"));

    size_t i;
    json_t *cj;
    json_array_foreach(json_object_get(pair, "consumers"), i, cj)
    {
        printf("decode rank %" JSON_INTEGER_FORMAT ": ", geti(cj, "rank"));
        print_heads(json_object_get(cj, "heads"));
        printf(", group ");
        print_int_list(json_object_get(cj, "group"));
        printf("\n");
        size_t k;
        json_t *r;
        json_array_foreach(json_object_get(cj, "reads"), k, r)
        {
            json_int_t nh = geti(r, "num_heads"), fh = geti(r, "first_head");
            printf("  %s prefill rank %" JSON_INTEGER_FORMAT ": ", w ? "written by" : "reads", geti(r, "producer_rank"));
            if (nh == 1)
                printf("head %" JSON_INTEGER_FORMAT, fh);
            else
                printf("heads %" JSON_INTEGER_FORMAT "-%" JSON_INTEGER_FORMAT, fh, fh + nh - 1);
            printf(" (prefill slot %" JSON_INTEGER_FORMAT " -> decode slot %" JSON_INTEGER_FORMAT ")\n",
                   geti(r, "src_head"), geti(r, "dst_head"));
            size_t q;
            json_t *rg;
            json_array_foreach(json_object_get(r, "ranges"), q, rg)
            {
                json_int_t so = geti(rg, "src_offset"), dof = geti(rg, "dst_offset"), len = geti(rg, "len");
                json_int_t n = geti(rg, "count");
                printf("    %s: prefill bytes [%" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT
                       ") -> decode bytes [%" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT ") of the %s",
                       json_string_value(json_object_get(rg, "half")), so, so + len, dof, dof + len,
                       c->mla || c->kv_fused ? "block" : "half-block");
                if (n > 1)
                    printf(", repeated for %" JSON_INTEGER_FORMAT " tokens with strides %" JSON_INTEGER_FORMAT
                           " / %" JSON_INTEGER_FORMAT " B",
                           n, geti(rg, "src_stride"), geti(rg, "dst_stride"));
                printf("\n");
            }
        }
        printf("  descriptors per layer: %" JSON_INTEGER_FORMAT " per block (%" JSON_INTEGER_FORMAT
               " B), %" JSON_INTEGER_FORMAT " for %u consecutive blocks, %" JSON_INTEGER_FORMAT " for them x %d layers\n",
               geti(cj, "descs_per_block"), geti(cj, "bytes_per_block"), geti(cj, "descs_sample"), c->sample_blocks,
               geti(cj, "descs_sample_all_layers"), c->layers);
        if (w) {
            printf("  sends remote_blocks to prefill ");
            print_int_list(json_object_get(cj, "remote_blocks_to"));
            printf(", waits for %" JSON_INTEGER_FORMAT " write_done(s)\n", geti(cj, "expected_write_done"));
        } else {
            printf("  releases to prefill ");
            print_int_list(json_object_get(cj, "releases_to"));
            printf(" (consumer_tp_size %" JSON_INTEGER_FORMAT ")\n", D);
        }
    }
    json_t *pj;
    json_array_foreach(json_object_get(pair, "producers"), i, pj)
    {
        printf("prefill rank %" JSON_INTEGER_FORMAT ": ", geti(pj, "rank"));
        print_heads(json_object_get(pj, "heads"));
        printf(", in the groups of decode ");
        print_int_list(json_object_get(pj, "in_groups_of"));
        printf(", %s decode ", w ? "writes" : "read by");
        print_int_list(json_object_get(pj, "read_by"));
        if (w) {
            printf(", sends write_done to decode ");
            print_int_list(json_object_get(pj, "write_done_to"));
            printf("\n");
        } else {
            printf(", expects %" JSON_INTEGER_FORMAT " release(s) from decode ", geti(pj, "expected_acks"));
            print_int_list(json_object_get(pj, "release_from"));
            printf("%s\n", json_is_true(json_object_get(pj, "moriio_released")) ? "" : "  [never released by MoRIIO]");
        }
    }
    printf("%s\n", json_string_value(json_object_get(json_object_get(pair, "moriio"), "summary")));
    printf("%s\n", json_string_value(json_object_get(pair, "pdlink_summary")));
}

static void print_plan(const plan_cfg_t *c, const json_t *doc)
{
    if (c->model != NULL)
        printf("model: %s -- %s\n", c->model->name, c->model->description);
    else
        printf("model: custom\n");
    printf("geometry: %d layers, %d %s x dim %d, %s (%d B/elem), block_size %u tokens, layout %s, %s\n", c->layers,
           c->heads, c->mla ? "MLA latent" : "KV heads", c->head_dim, c->dtype, c->elem_size, c->block_size,
           pdl_layout_order_name(c->order),
           c->mla        ? "one half (no V)"
           : c->kv_fused ? "K/V fused per token (one half, rows of 2 x head_dim)"
           : c->kv_separate ? "K/V separate"
                            : "K/V interleaved");
    size_t t;
    json_t *tj;
    json_array_foreach(json_object_get(doc, "topologies"), t, tj)
    {
        printf("\n######## topology %s: prefill instances TP ", json_string_value(json_object_get(tj, "name")));
        print_int_list(json_object_get(tj, "prefill_instances"));
        printf(", decode instances TP ");
        print_int_list(json_object_get(tj, "decode_instances"));
        printf("\n");
        if (json_array_size(json_object_get(tj, "prefill_instances")) > 1 ||
            json_array_size(json_object_get(tj, "decode_instances")) > 1)
            printf("(a decode instance pairs with one prefill instance per request; one plan per distinct pair)\n");
        size_t p;
        json_t *pair;
        json_array_foreach(json_object_get(tj, "pairs"), p, pair) print_pair(c, pair);
    }
}

int pdl_cli_plan(int argc, char **argv)
{
    plan_cfg_t cfg;
    int rc = parse_args(argc, argv, &cfg);
    if (rc != 0)
        return rc == 1 ? 0 : 2;
    pdl_error_t err;
    pdl_error_clear(&err);
    json_t *doc = plan_json(&cfg, &err);
    if (doc == NULL) {
        fprintf(stderr, "pdlink plan: %s\n", err.msg[0] ? err.msg : "could not build the plan");
        return 2;
    }
    if (cfg.json) {
        char *s = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (s == NULL) {
            json_decref(doc);
            fprintf(stderr, "pdlink plan: out of memory serialising the plan\n");
            return 2;
        }
        puts(s);
        free(s);
    } else {
        print_plan(&cfg, doc);
    }
    json_decref(doc);
    return 0;
}
