/*
 * plan_print.c -- the human output of `pdlink plan` (plan.h), rendered from the plan's JSON document only,
 * so that the text and --json always say the same thing.
 */
#include <jansson.h>
#include <stdio.h>

#include "cli/plan.h"

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

void pdl_plan_print(const plan_cfg_t *c, const json_t *doc)
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
