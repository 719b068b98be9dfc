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
 * jansson document first (plan_doc.c); `--json` prints that document and the human output is rendered
 * from it (plan_print.c), so the two can never disagree. `--seed` shows the four seed topologies (P4/D8, P8/D4, P4+P4/D8,
 * P8/D4+D4). Exit status: 0, or 2 with a message naming the values for any usage or topology error.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/optab.h"
#include "cli/cli.h"
#include "cli/plan.h"
#include "pdlink/topo.h"

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

int pdl_cli_plan(int argc, char **argv)
{
    plan_cfg_t cfg;
    int rc = parse_args(argc, argv, &cfg);
    if (rc != 0)
        return rc == 1 ? 0 : 2;
    pdl_error_t err;
    pdl_error_clear(&err);
    json_t *doc = pdl_plan_doc(&cfg, &err);
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
        pdl_plan_print(&cfg, doc);
    }
    json_decref(doc);
    return 0;
}
