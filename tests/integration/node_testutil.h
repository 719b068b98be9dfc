/*
 * node_testutil.h -- the pdlink-node tests' small KV store: 2 KV heads of 8 two-byte elements, blocks of
 * 4 tokens, HND with K and V apart, over TP2 (header-only, static).
 */
#ifndef PDL_TEST_NODE_TESTUTIL_H
#define PDL_TEST_NODE_TESTUTIL_H

#include <string.h>

#include "node/kvstore.h"

static inline void tn_small_kv_config(pdl_node_kv_config_t *c, int layers, uint32_t num_blocks)
{
    memset(c, 0, sizeof(*c));
    c->model.num_layers = layers;
    c->model.total_kv_heads = 2;
    c->model.head_dim = 8;
    c->model.elem_size = 2;
    c->model.block_size = 4;
    c->model.order = PDL_KV_HND;
    c->model.kv_separate = true;
    c->tp_size = 2;
    c->dp_size = 1;
    c->num_blocks = num_blocks;
}

#endif /* PDL_TEST_NODE_TESTUTIL_H */
