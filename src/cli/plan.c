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
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/parse.h"
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

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pdlink plan --prefill-tp P[,P...] --decode-tp D[,D...] [--model PRESET]\n"
            "                   [--kv-heads N] [--head-dim N] [--layers N] [--mla] [--block-size N]\n"
            "                   [--dtype bf16|fp16|fp8|fp32] [--layout hnd|nhd] [--kv-interleaved] [--kv-fused]\n"
            "                   [--mode read|write] [--num-blocks N] [--sample-blocks N] [--json]\n"
            "       pdlink plan --seed [--model PRESET] [options]   the four seed topologies\n"
            "       pdlink plan --list-models\n"
            "\n"
            "Explains a heterogeneous-TP topology: the prefill ranks each decode rank reads (or that write\n"
            "to it), the byte ranges of every head slice inside a block, descriptors per block after\n"
            "merging, the releases each decode rank sends and the ACKs each prefill rank expects.\n"
            "\n"
            "  --prefill-tp LIST  TP size of each prefill instance, e.g. 4 or 4,4 (xPyD)\n"
            "  --decode-tp LIST   TP size of each decode instance, e.g. 8 or 4,4\n"
            "  --model PRESET     take layers, KV heads, head dim and MLA from a preset (flags override)\n"
            "  --kv-heads N       total KV heads of the model (required without --model)\n"
            "  --head-dim N       elements per head per token (the latent width for MLA)\n"
            "  --layers N         attention layers (default: the preset's, else 1)\n"
            "  --mla              multi-head latent attention: one replicated latent, no V half\n"
            "  --block-size N     tokens per block (default 16)\n"
            "  --dtype NAME       KV cache dtype (default bf16)\n"
            "  --layout hnd|nhd   head-major (default) or token-major half-blocks\n"
            "  --kv-interleaved   K and V interleaved per block ([blocks][2]...) instead of [2][blocks]...\n"
            "  --kv-fused         K and V concatenated per token, one half per block (vLLM's CPU cache)\n"
            "  --mode read|write  decode pulls (default) or prefill pushes\n"
            "  --num-blocks N     KV blocks per rank used for offsets (default 1024)\n"
            "  --sample-blocks N  consecutive blocks in the descriptor sample (default 8)\n"
            "  --seed             show P4/D8, P8/D4, P4+P4/D8 and P8/D4+D4 (default model llama-3.1-8b)\n"
            "  --json             one JSON document (schema in docs/plan.md)\n"
            "\nmodel presets:\n");
    for (size_t i = 0; i < pdl_model_count(); i++)
        fprintf(f, "  %-14s %s\n", pdl_model_at(i)->name, pdl_model_at(i)->description);
}

/* ---- argument parsing ----------------------------------------------------------------------------- */

static bool parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    pdl_error_t err;
    if (pdl_parse_long(opt, s, lo, hi, out, &err) != PDL_OK) {
        fprintf(stderr, "pdlink plan: %s\n", err.msg);
        return false;
    }
    return true;
}

/* "4" or "4,4,8" -> sizes; each in [1, PDL_TOPO_MAX_TP]. */
static bool parse_tp_list(const char *opt, const char *s, int *out, int *n)
{
    char buf[256];
    if (strlen(s) >= sizeof(buf)) {
        fprintf(stderr, "pdlink plan: %s list is too long\n", opt);
        return false;
    }
    strcpy(buf, s);
    *n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        long v;
        if (*n >= PLAN_MAX_INSTANCES) {
            fprintf(stderr, "pdlink plan: %s lists more than %d instances\n", opt, PLAN_MAX_INSTANCES);
            return false;
        }
        if (!parse_long(opt, tok, 1, PDL_TOPO_MAX_TP, &v))
            return false;
        out[(*n)++] = (int)v;
    }
    if (*n == 0) {
        fprintf(stderr, "pdlink plan: %s '%s' names no TP size\n", opt, s);
        return false;
    }
    return true;
}

static void topo_name(plan_topo_t *t)
{
    size_t o = 0;
    for (int i = 0; i < t->n_prefill; i++)
        o += (size_t)snprintf(t->name + o, sizeof(t->name) - o, "%sP%d", i ? "+" : "", t->prefill[i]);
    for (int i = 0; i < t->n_decode && o < sizeof(t->name); i++)
        o += (size_t)snprintf(t->name + o, sizeof(t->name) - o, "%sD%d", i ? "+" : "/", t->decode[i]);
}

static void add_seed(plan_cfg_t *c, const int *p, int np, const int *d, int nd)
{
    plan_topo_t *t = &c->topos[c->n_topos++];
    memset(t, 0, sizeof(*t));
    memcpy(t->prefill, p, (size_t)np * sizeof(int));
    memcpy(t->decode, d, (size_t)nd * sizeof(int));
    t->n_prefill = np;
    t->n_decode = nd;
    topo_name(t);
}

enum {
    OPT_PREFILL = 1000,
    OPT_DECODE,
    OPT_HEADS,
    OPT_HEAD_DIM,
    OPT_BLOCK,
    OPT_DTYPE,
    OPT_LAYERS,
    OPT_LAYOUT,
    OPT_FUSED,
    OPT_INTERLEAVED,
    OPT_MLA,
    OPT_MODE,
    OPT_MODEL,
    OPT_JSON,
    OPT_SEED,
    OPT_NUM_BLOCKS,
    OPT_SAMPLE,
    OPT_LIST,
    OPT_HELP,
};

/* Returns 0 to go on, 1 when the command is done with success (help), 2 on a usage error. */
static int parse_args(int argc, char **argv, plan_cfg_t *c)
{
    static const struct option opts[] = {
        {"prefill-tp", required_argument, NULL, OPT_PREFILL},
        {"decode-tp", required_argument, NULL, OPT_DECODE},
        {"kv-heads", required_argument, NULL, OPT_HEADS},
        {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
        {"block-size", required_argument, NULL, OPT_BLOCK},
        {"dtype", required_argument, NULL, OPT_DTYPE},
        {"layers", required_argument, NULL, OPT_LAYERS},
        {"layout", required_argument, NULL, OPT_LAYOUT},
        {"kv-interleaved", no_argument, NULL, OPT_INTERLEAVED},
        {"kv-fused", no_argument, NULL, OPT_FUSED},
        {"mla", no_argument, NULL, OPT_MLA},
        {"mode", required_argument, NULL, OPT_MODE},
        {"model", required_argument, NULL, OPT_MODEL},
        {"json", no_argument, NULL, OPT_JSON},
        {"seed", no_argument, NULL, OPT_SEED},
        {"num-blocks", required_argument, NULL, OPT_NUM_BLOCKS},
        {"sample-blocks", required_argument, NULL, OPT_SAMPLE},
        {"list-models", no_argument, NULL, OPT_LIST},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    memset(c, 0, sizeof(*c));
    c->block_size = 16;
    c->num_blocks = 1024;
    c->sample_blocks = 8;
    c->order = PDL_KV_HND;
    c->kv_separate = true;
    int prefill[PLAN_MAX_INSTANCES], decode[PLAN_MAX_INSTANCES], np = 0, nd = 0;
    bool seed = false, mla_flag = false;
    long v;
    int layers = 0, heads = 0, head_dim = 0;
    const char *model = NULL;

    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case OPT_PREFILL:
            if (!parse_tp_list("--prefill-tp", optarg, prefill, &np))
                return 2;
            break;
        case OPT_DECODE:
            if (!parse_tp_list("--decode-tp", optarg, decode, &nd))
                return 2;
            break;
        case OPT_HEADS:
            if (!parse_long("--kv-heads", optarg, 1, 1 << 16, &v))
                return 2;
            heads = (int)v;
            break;
        case OPT_HEAD_DIM:
            if (!parse_long("--head-dim", optarg, 1, 1 << 20, &v))
                return 2;
            head_dim = (int)v;
            break;
        case OPT_BLOCK:
            if (!parse_long("--block-size", optarg, 1, 1 << 20, &v))
                return 2;
            c->block_size = (uint32_t)v;
            break;
        case OPT_LAYERS:
            if (!parse_long("--layers", optarg, 1, 1 << 16, &v))
                return 2;
            layers = (int)v;
            break;
        case OPT_NUM_BLOCKS:
            if (!parse_long("--num-blocks", optarg, 1, 1L << 30, &v))
                return 2;
            c->num_blocks = (uint64_t)v;
            break;
        case OPT_SAMPLE:
            if (!parse_long("--sample-blocks", optarg, 1, 1 << 16, &v))
                return 2;
            c->sample_blocks = (uint32_t)v;
            break;
        case OPT_DTYPE:
            c->dtype = optarg;
            break;
        case OPT_LAYOUT: {
            int o = pdl_layout_order_parse(optarg);
            if (o < 0) {
                fprintf(stderr, "pdlink plan: --layout '%s' is neither hnd nor nhd\n", optarg);
                return 2;
            }
            c->order = (pdl_kv_order_t)o;
            break;
        }
        case OPT_INTERLEAVED:
            c->kv_separate = false;
            break;
        case OPT_FUSED:
            c->kv_fused = true;
            break;
        case OPT_MLA:
            mla_flag = true;
            break;
        case OPT_MODE:
            if (strcmp(optarg, "read") == 0 || strcmp(optarg, "READ") == 0)
                c->write_mode = false;
            else if (strcmp(optarg, "write") == 0 || strcmp(optarg, "WRITE") == 0)
                c->write_mode = true;
            else {
                fprintf(stderr, "pdlink plan: --mode '%s' is neither read nor write\n", optarg);
                return 2;
            }
            break;
        case OPT_MODEL:
            model = optarg;
            break;
        case OPT_JSON:
            c->json = true;
            break;
        case OPT_SEED:
            seed = true;
            break;
        case OPT_LIST:
            for (size_t i = 0; i < pdl_model_count(); i++) {
                const pdl_model_preset_t *m = pdl_model_at(i);
                printf("%-14s %-34s %s\n", m->name, m->hf_id[0] ? m->hf_id : "-", m->description);
            }
            return 1;
        case 'h':
        case OPT_HELP:
            usage(stdout);
            return 1;
        default:
            fprintf(stderr, "pdlink plan: unknown option or missing value in '%s' (see pdlink plan --help)\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "pdlink plan: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }

    if (model == NULL && seed)
        model = "llama-3.1-8b";
    if (model != NULL) {
        c->model = pdl_model_find(model);
        if (c->model == NULL) {
            fprintf(stderr, "pdlink plan: unknown model preset '%s' (pdlink plan --list-models)\n", model);
            return 2;
        }
        c->layers = c->model->num_layers;
        c->heads = c->model->total_kv_heads;
        c->head_dim = c->model->head_dim;
        c->mla = c->model->is_mla;
        c->elem_size = c->model->elem_size;
    }
    /* Explicit flags override the preset. */
    if (layers > 0)
        c->layers = layers;
    if (heads > 0)
        c->heads = heads;
    if (head_dim > 0)
        c->head_dim = head_dim;
    if (mla_flag)
        c->mla = true;
    if (c->layers == 0)
        c->layers = 1;
    if (c->mla && heads == 0)
        c->heads = 1; /* the latent is one replicated "head" */
    if (c->mla && c->kv_fused) {
        fprintf(stderr, "pdlink plan: --kv-fused needs K and V; an MLA model has no V half\n");
        return 2;
    }
    if (c->dtype != NULL) {
        c->elem_size = pdl_model_dtype_size(c->dtype);
        if (c->elem_size < 0) {
            fprintf(stderr, "pdlink plan: --dtype '%s' is not one of bf16, fp16, fp8, fp32\n", c->dtype);
            return 2;
        }
    } else {
        c->dtype = c->elem_size == 1 ? "fp8" : c->elem_size == 4 ? "fp32" : "bf16";
        if (c->elem_size == 0)
            c->elem_size = 2;
    }
    if (c->heads == 0) {
        fprintf(stderr, "pdlink plan: --kv-heads is required without --model (or pass --mla)\n");
        return 2;
    }
    if (c->head_dim == 0) {
        fprintf(stderr, "pdlink plan: --head-dim is required without --model\n");
        return 2;
    }

    if (seed) {
        if (np > 0 || nd > 0) {
            fprintf(stderr, "pdlink plan: --seed shows the seed topologies; drop --prefill-tp/--decode-tp\n");
            return 2;
        }
        add_seed(c, (int[]){4}, 1, (int[]){8}, 1);
        add_seed(c, (int[]){8}, 1, (int[]){4}, 1);
        add_seed(c, (int[]){4, 4}, 2, (int[]){8}, 1);
        add_seed(c, (int[]){8}, 1, (int[]){4, 4}, 2);
    } else {
        if (np == 0 || nd == 0) {
            fprintf(stderr, "pdlink plan: --prefill-tp and --decode-tp are both required (or --seed)\n");
            return 2;
        }
        add_seed(c, prefill, np, decode, nd);
    }
    if (c->sample_blocks > c->num_blocks)
        c->sample_blocks = (uint32_t)c->num_blocks;
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

/* One (P, D) pair: everything a user needs to see about it. NULL with `err` set on a topology error. */
static json_t *pair_json(const plan_cfg_t *c, int P, int D, pdl_error_t *err)
{
    int acks, wdone, phf, phc, chf, chc;
    if (pdl_topo_expected_acks(P, D, &acks, err) != PDL_OK ||
        pdl_topo_expected_write_done(P, D, &wdone, err) != PDL_OK)
        return NULL;
    if (pdl_topo_heads(P, c->heads, c->mla, 0, &phf, &phc, err) != PDL_OK) {
        pdl_error_prefix(err, PDL_ERR_INVALID, "prefill");
        return NULL;
    }
    if (pdl_topo_heads(D, c->heads, c->mla, 0, &chf, &chc, err) != PDL_OK) {
        pdl_error_prefix(err, PDL_ERR_INVALID, "decode");
        return NULL;
    }
    const pdl_kv_geometry_t pg = side_geometry(c, phc, c->num_blocks), cg = side_geometry(c, chc, c->num_blocks);
    const pdl_kv_geometry_t pg1 = side_geometry(c, phc, 1), cg1 = side_geometry(c, chc, 1);
    if (pdl_layout_validate(&pg, err) != PDL_OK || pdl_layout_validate(&cg, err) != PDL_OK)
        return NULL;

    json_t *pair = json_pack("{s:i, s:i, s:i, s:i, s:b}", "prefill_tp", P, "decode_tp", D, "expected_acks", acks,
                             "expected_write_done", wdone, "heads_split", !c->mla && P != D && (P < c->heads || D < c->heads));
    json_object_set_new(pair, "prefill_rank_geometry",
                        json_pack("{s:i, s:I, s:i}", "heads_per_rank", phc, "block_len",
                                  (json_int_t)pdl_layout_block_len(&pg), "halves", pdl_layout_num_halves(&pg)));
    json_object_set_new(pair, "decode_rank_geometry",
                        json_pack("{s:i, s:I, s:i}", "heads_per_rank", chc, "block_len",
                                  (json_int_t)pdl_layout_block_len(&cg), "halves", pdl_layout_num_halves(&cg)));

    json_t *consumers = json_array();
    json_object_set_new(pair, "consumers", consumers);
    json_int_t total_block = 0, total_sample = 0;
    bool moriio_released[PDL_TOPO_MAX_TP] = {false};
    pdl_read_plan_t rp;
    for (int d = 0; d < D; d++) {
        if (pdl_topo_read_plan(P, D, c->heads, c->mla, d, &rp, err) != PDL_OK)
            goto fail;
        moriio_released[rp.group_first] = true; /* MoRIIO releases only the mapped (first) rank */
        json_t *reads = json_array();
        size_t per_block = 0, per_sample = 0;
        uint64_t bytes_block = 0;
        for (int i = 0; i < rp.num_pieces; i++) {
            const pdl_plan_piece_t *pc = &rp.pieces[i];
            json_t *r = piece_json(pc), *ranges = json_array();
            json_array_append_new(reads, r);
            json_object_set_new(r, "ranges", ranges);
            size_t nb = 0, ns = 0;
            uint64_t bb = 0, bs = 0;
            if (piece_ranges_json(&cg1, &pg1, pc, ranges, err) != PDL_OK ||
                count_descs(&cg, &pg, pc, 1, &nb, &bb, err) != PDL_OK ||
                count_descs(&cg, &pg, pc, c->sample_blocks, &ns, &bs, err) != PDL_OK) {
                json_decref(reads);
                goto fail;
            }
            json_object_set_new(r, "descs_per_block", json_integer((json_int_t)nb));
            json_object_set_new(r, "bytes_per_block", json_integer((json_int_t)bb));
            json_object_set_new(r, "descs_sample", json_integer((json_int_t)ns));
            per_block += nb;
            per_sample += ns;
            bytes_block += bb;
        }
        total_block += (json_int_t)per_block;
        total_sample += (json_int_t)per_sample;
        json_t *cj = json_pack("{s:i, s:o, s:o, s:o, s:I, s:I, s:I, s:I}", "rank", d, "heads",
                               heads_obj(rp.local_first_head, rp.local_num_heads), "group",
                               int_range_array(rp.group_first, rp.group_count), "reads", reads, "descs_per_block",
                               (json_int_t)per_block, "bytes_per_block", (json_int_t)bytes_block, "descs_sample",
                               (json_int_t)per_sample, "descs_sample_all_layers",
                               (json_int_t)per_sample * c->layers);
        if (c->write_mode) {
            json_object_set_new(cj, "remote_blocks_to", int_range_array(rp.group_first, rp.group_count));
            json_object_set_new(cj, "expected_write_done", json_integer(wdone));
            json_object_set_new(cj, "releases_to", json_array());
        } else {
            json_object_set_new(cj, "releases_to", int_range_array(rp.group_first, rp.group_count));
        }
        json_array_append_new(consumers, cj);
    }

    json_t *producers = json_array();
    json_object_set_new(pair, "producers", producers);
    json_t *unreleased = json_array();
    pdl_write_plan_t wp;
    for (int p = 0; p < P; p++) {
        int hf, hc;
        if (pdl_topo_heads(P, c->heads, c->mla, p, &hf, &hc, err) != PDL_OK ||
            pdl_topo_write_plan(P, D, c->heads, c->mla, p, &wp, err) != PDL_OK) {
            json_decref(unreleased);
            goto fail;
        }
        json_t *read_by = json_array(), *writes = json_array();
        for (int t = 0; t < wp.num_targets; t++) {
            json_array_append_new(read_by, json_integer(wp.targets[t].consumer_rank));
            json_t *w = piece_json(&wp.targets[t].piece);
            json_object_set_new(w, "consumer_rank", json_integer(wp.targets[t].consumer_rank));
            json_array_append_new(writes, w);
        }
        json_t *pj = json_pack("{s:i, s:o, s:o, s:o, s:b}", "rank", p, "heads", heads_obj(hf, hc), "in_groups_of",
                               int_range_array(wp.notify_first, wp.notify_count), "read_by", read_by,
                               "moriio_released", moriio_released[p]);
        if (c->write_mode) {
            json_object_set_new(pj, "expected_acks", json_integer(0));
            json_object_set_new(pj, "writes", writes);
            json_object_set_new(pj, "write_done_to", int_range_array(wp.notify_first, wp.notify_count));
        } else {
            json_decref(writes);
            json_object_set_new(pj, "expected_acks", json_integer(acks));
            json_object_set_new(pj, "release_from", int_range_array(wp.notify_first, wp.notify_count));
        }
        json_array_append_new(producers, pj);
        if (!moriio_released[p])
            json_array_append_new(unreleased, json_integer(p));
    }
    json_object_set_new(pair, "descs_per_block_all_ranks", json_integer(total_block));
    json_object_set_new(pair, "descs_sample_all_ranks", json_integer(total_sample));

    /* How upstream MoRIIO would treat this pair (docs/protocol.md#where-upstream-moriio-differs). */
    char summary[512];
    bool supported;
    if (P == D) {
        supported = true;
        snprintf(summary, sizeof(summary), "MoRIIO: supported (same TP on both sides)");
        json_array_clear(unreleased);
    } else if (c->write_mode) {
        supported = false;
        snprintf(summary, sizeof(summary),
                 "MoRIIO: not supported (heterogeneous TP works in READ mode only; WRITE fans out by the local TP "
                 "size)");
        json_array_clear(unreleased);
    } else if (!c->mla && (P < c->heads || D < c->heads)) {
        supported = false;
        snprintf(summary, sizeof(summary), "MoRIIO: rejected (heads must be split: min(P, D) = %d < %d KV heads)",
                 P < D ? P : D, c->heads);
        json_array_clear(unreleased);
    } else if (json_array_size(unreleased) > 0) {
        supported = true;
        size_t o = (size_t)snprintf(summary, sizeof(summary), "MoRIIO: supported; P%d/D%d leaves producer ranks ", P, D);
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
        supported = true;
        snprintf(summary, sizeof(summary), "MoRIIO: supported (replicated heads)");
    }
    json_object_set_new(pair, "moriio", json_pack("{s:b, s:o, s:s}", "supported", supported,
                                                  "unreleased_producer_ranks", unreleased, "summary", summary));
    char pd[200];
    if (c->write_mode)
        snprintf(pd, sizeof(pd), "pdlink: every decode rank receives exactly %d write_done(s), from every prefill "
                                 "rank of its group",
                 wdone);
    else
        snprintf(pd, sizeof(pd), "pdlink: every prefill rank receives exactly %d release(s)", acks);
    json_object_set_new(pair, "pdlink_summary", json_string(pd));
    return pair;
fail:
    json_decref(pair);
    return NULL;
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
