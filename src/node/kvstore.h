/*
 * kvstore.h -- the paged KV cache of a pdlink-node instance: every TP rank's per-layer regions and the
 * block allocator shared by all ranks (block ids are the same on every rank, as in vLLM).
 *
 * Two backings behind one interface:
 *   - connector: a pdl_instance_t (include/pdlink/connector.h) owns the memory, the allocator and the
 *     transfer services; used by kv_producer and kv_consumer nodes.
 *   - local: plain heap memory and a free-block stack; used by a node that serves alone (no
 *     --kv-transfer-config, or kv_role kv_both), so a reference node binds no transfer ports.
 * The synthetic model (synth.h) only sees geometry, layer pointers and head ranges, so it cannot tell
 * the two apart; that is what makes a P/D answer comparable with a single node's.
 */
#ifndef PDL_NODE_KVSTORE_H
#define PDL_NODE_KVSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/connector.h"
#include "pdlink/layout.h"
#include "pdlink/status.h"

typedef struct pdl_node_kv pdl_node_kv_t;

typedef struct pdl_node_kv_config {
    pdl_model_geometry_t model;
    int tp_size;
    int dp_rank;
    int dp_size;
    uint32_t num_blocks;                 /* per rank */
    const pdl_connector_config_t *conn;  /* NULL: local backing (serve alone) */
} pdl_node_kv_config_t;

/* Bytes of one block on one rank, all layers, K and V (what --kv-cache-memory is divided by). */
uint64_t pdl_node_kv_block_bytes(const pdl_model_geometry_t *model, int tp_size, pdl_error_t *err);

pdl_status_t pdl_node_kv_create(const pdl_node_kv_config_t *cfg, pdl_node_kv_t **kv_out, pdl_error_t *err);
void pdl_node_kv_destroy(pdl_node_kv_t *kv);

/* NULL for the local backing. */
pdl_instance_t *pdl_node_kv_instance(pdl_node_kv_t *kv);

int pdl_node_kv_tp_size(const pdl_node_kv_t *kv);
int pdl_node_kv_num_layers(const pdl_node_kv_t *kv);
int pdl_node_kv_total_heads(const pdl_node_kv_t *kv);
bool pdl_node_kv_is_mla(const pdl_node_kv_t *kv);
const pdl_kv_geometry_t *pdl_node_kv_geometry(const pdl_node_kv_t *kv, int tp_rank);
uint8_t *pdl_node_kv_layer(pdl_node_kv_t *kv, int tp_rank, int layer);
/* Global heads held by a rank: [*first, *first + *count). */
void pdl_node_kv_heads(const pdl_node_kv_t *kv, int tp_rank, int *first, int *count);
/* Bytes of KV memory per rank (all layers). */
uint64_t pdl_node_kv_rank_bytes(const pdl_node_kv_t *kv);

/*
 * Allocate n blocks, waiting up to wait_ms for blocks to be freed (by other requests finishing or by
 * producer releases). PDL_ERR_NOMEM naming the free and needed counts when they do not come; asking for
 * more than the cache holds fails at once.
 */
pdl_status_t pdl_node_kv_alloc(pdl_node_kv_t *kv, size_t n, uint32_t *ids_out, int wait_ms, pdl_error_t *err);
void pdl_node_kv_free(pdl_node_kv_t *kv, const uint32_t *ids, size_t n);
size_t pdl_node_kv_free_count(pdl_node_kv_t *kv);
uint32_t pdl_node_kv_total_blocks(const pdl_node_kv_t *kv);

#endif /* PDL_NODE_KVSTORE_H */
