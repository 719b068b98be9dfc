/*
 * kvstore.c -- the node's paged KV cache over a connector instance or local memory (see kvstore.h).
 *
 * The local backing keeps one heap region per rank holding all its layers back to back, and a stack of
 * free block ids under a mutex; a waiting allocation sleeps on a condition variable that every free
 * signals. The connector backing allocates from the connector's allocator; a waiting allocation sleeps
 * on the same condition variable, signalled by the node's own frees and by the connector's FREED event
 * (producer blocks come back on a connector thread when the release fan-in completes), so it wakes the
 * moment blocks return instead of polling. The allocation attempt and the wait happen under the mutex
 * and every signal takes it, so a free between the attempt and the wait is never missed.
 */
#include "node/kvstore.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "pdlink/topo.h"
#include "common/clock.h"

typedef struct node_rank {
    pdl_kv_geometry_t geom;
    int first_head, num_heads;
    uint8_t *mem;          /* local backing: all layers of this rank */
} node_rank_t;

struct pdl_node_kv {
    pdl_model_geometry_t model;
    int tp_size;
    uint32_t num_blocks;
    uint64_t layer_bytes;  /* region of one layer on one rank */
    node_rank_t *ranks;
    pdl_instance_t *inst;  /* NULL: local backing */
    /* local allocator */
    pthread_mutex_t mu;
    pthread_cond_t freed;
    uint32_t *free_ids;
    size_t num_free;
};

static void geometry_of(const pdl_model_geometry_t *m, int heads, uint64_t blocks, pdl_kv_geometry_t *g)
{
    memset(g, 0, sizeof(*g));
    g->num_blocks = blocks;
    g->block_size = (uint32_t)m->block_size;
    g->num_heads = (uint32_t)heads;
    g->head_dim = (uint32_t)m->head_dim;
    g->elem_size = (uint32_t)m->elem_size;
    g->kv_separate = m->kv_separate;
    g->order = m->order;
    g->is_mla = m->is_mla;
}

uint64_t pdl_node_kv_block_bytes(const pdl_model_geometry_t *model, int tp_size, pdl_error_t *err)
{
    int first = 0, count = 0;
    if (pdl_topo_heads(tp_size, model->total_kv_heads, model->is_mla, 0, &first, &count, err) != PDL_OK)
        return 0;
    pdl_kv_geometry_t g;
    geometry_of(model, count, 1, &g);
    if (pdl_layout_validate(&g, err) != PDL_OK)
        return 0;
    return pdl_layout_region_len(&g) * (uint64_t)model->num_layers;
}

static void blocks_returned(pdl_node_kv_t *kv)
{
    pthread_mutex_lock(&kv->mu);
    pthread_cond_broadcast(&kv->freed);
    pthread_mutex_unlock(&kv->mu);
}

/* Connector event callback (a connector thread, no connector lock held): freed producer blocks. */
static void on_instance_event(void *arg, pdl_instance_event_t ev, const char *transfer_id, int tp_rank)
{
    (void)transfer_id;
    (void)tp_rank;
    if (ev == PDL_EVENT_FREED)
        blocks_returned(arg);
}

pdl_status_t pdl_node_kv_create(const pdl_node_kv_config_t *cfg, pdl_node_kv_t **kv_out, pdl_error_t *err)
{
    if (cfg->tp_size < 1 || cfg->tp_size > PDL_TOPO_MAX_TP)
        return pdl_error_set(err, PDL_ERR_INVALID, "--tensor-parallel-size %d: must be in [1, %d]", cfg->tp_size,
                             PDL_TOPO_MAX_TP);
    if (cfg->num_blocks == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "--num-gpu-blocks: must be at least 1");
    pdl_node_kv_t *kv = calloc(1, sizeof(*kv));
    if (kv == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "kv cache: out of memory");
    kv->model = cfg->model;
    kv->tp_size = cfg->tp_size;
    kv->num_blocks = cfg->num_blocks;
    pthread_mutex_init(&kv->mu, NULL);
    pdl__clock_cond_init(&kv->freed);
    kv->ranks = calloc((size_t)cfg->tp_size, sizeof(*kv->ranks));
    if (kv->ranks == NULL) {
        pdl_node_kv_destroy(kv);
        return pdl_error_set(err, PDL_ERR_NOMEM, "kv cache: out of memory");
    }
    for (int r = 0; r < cfg->tp_size; r++) {
        node_rank_t *rk = &kv->ranks[r];
        pdl_status_t st = pdl_topo_heads(cfg->tp_size, cfg->model.total_kv_heads, cfg->model.is_mla, r,
                                         &rk->first_head, &rk->num_heads, err);
        if (st != PDL_OK) {
            pdl_error_prefix(err, st, "--tensor-parallel-size %d with %d KV heads", cfg->tp_size,
                             cfg->model.total_kv_heads);
            pdl_node_kv_destroy(kv);
            return st;
        }
    }

    if (cfg->conn != NULL) {
        pdl_instance_config_t ic;
        pdl_instance_config_defaults(&ic);
        ic.conn = *cfg->conn;
        ic.model = cfg->model;
        ic.tp_size = cfg->tp_size;
        ic.dp_rank = cfg->dp_rank;
        ic.dp_size = cfg->dp_size;
        ic.num_blocks = cfg->num_blocks;
        ic.attn_backend_name = "PDLINK_SYNTHETIC";
        ic.allow_write_mode = true; /* request.c serves both WRITE-mode legs */
        pdl_status_t st = pdl_instance_create(&ic, &kv->inst, err);
        if (st != PDL_OK) {
            pdl_node_kv_destroy(kv);
            return st;
        }
        for (int r = 0; r < cfg->tp_size; r++) {
            const pdl_kv_geometry_t *g = pdl_instance_geometry(kv->inst, r);
            if (g == NULL || (int)g->num_heads != kv->ranks[r].num_heads) {
                pdl_node_kv_destroy(kv);
                return pdl_error_set(err, PDL_ERR_BAD_STATE,
                                     "connector rank %d geometry disagrees with the node (heads %d vs %u)", r,
                                     kv->ranks[r].num_heads, g ? g->num_heads : 0);
            }
            kv->ranks[r].geom = *g;
        }
        kv->layer_bytes = pdl_layout_region_len(&kv->ranks[0].geom);
        pdl_instance_set_event_fn(kv->inst, on_instance_event, kv);
        *kv_out = kv;
        return PDL_OK;
    }

    for (int r = 0; r < cfg->tp_size; r++) {
        node_rank_t *rk = &kv->ranks[r];
        geometry_of(&cfg->model, rk->num_heads, cfg->num_blocks, &rk->geom);
        pdl_status_t st = pdl_layout_validate(&rk->geom, err);
        if (st != PDL_OK) {
            pdl_node_kv_destroy(kv);
            return st;
        }
        uint64_t layer = pdl_layout_region_len(&rk->geom);
        uint64_t total = layer * (uint64_t)cfg->model.num_layers;
        if (layer == 0 || total / layer != (uint64_t)cfg->model.num_layers || total > SIZE_MAX) {
            pdl_node_kv_destroy(kv);
            return pdl_error_set(err, PDL_ERR_INVALID, "kv cache of %u blocks does not fit in memory",
                                 cfg->num_blocks);
        }
        kv->layer_bytes = layer;
        rk->mem = calloc(1, (size_t)total);
        if (rk->mem == NULL) {
            pdl_node_kv_destroy(kv);
            return pdl_error_set(err, PDL_ERR_NOMEM,
                                 "kv cache: cannot allocate %llu bytes for rank %d; lower --num-gpu-blocks",
                                 (unsigned long long)total, r);
        }
    }
    kv->free_ids = malloc(sizeof(uint32_t) * cfg->num_blocks);
    if (kv->free_ids == NULL) {
        pdl_node_kv_destroy(kv);
        return pdl_error_set(err, PDL_ERR_NOMEM, "kv cache: out of memory");
    }
    /* Stack with block 0 on top, so allocation order is 0, 1, 2, ... like a fresh vLLM pool. */
    for (uint32_t i = 0; i < cfg->num_blocks; i++)
        kv->free_ids[i] = cfg->num_blocks - 1 - i;
    kv->num_free = cfg->num_blocks;
    *kv_out = kv;
    return PDL_OK;
}

void pdl_node_kv_destroy(pdl_node_kv_t *kv)
{
    if (kv == NULL)
        return;
    if (kv->inst != NULL) {
        pdl_instance_set_event_fn(kv->inst, NULL, NULL);
        pdl_instance_destroy(kv->inst);
    }
    if (kv->ranks != NULL)
        for (int r = 0; r < kv->tp_size; r++)
            free(kv->ranks[r].mem);
    free(kv->ranks);
    free(kv->free_ids);
    pthread_cond_destroy(&kv->freed);
    pthread_mutex_destroy(&kv->mu);
    free(kv);
}

pdl_instance_t *pdl_node_kv_instance(pdl_node_kv_t *kv) { return kv->inst; }
int pdl_node_kv_tp_size(const pdl_node_kv_t *kv) { return kv->tp_size; }
int pdl_node_kv_num_layers(const pdl_node_kv_t *kv) { return kv->model.num_layers; }
int pdl_node_kv_total_heads(const pdl_node_kv_t *kv) { return kv->model.is_mla ? 1 : kv->model.total_kv_heads; }
bool pdl_node_kv_is_mla(const pdl_node_kv_t *kv) { return kv->model.is_mla; }
uint32_t pdl_node_kv_total_blocks(const pdl_node_kv_t *kv) { return kv->num_blocks; }
uint64_t pdl_node_kv_rank_bytes(const pdl_node_kv_t *kv) { return kv->layer_bytes * (uint64_t)kv->model.num_layers; }

const pdl_kv_geometry_t *pdl_node_kv_geometry(const pdl_node_kv_t *kv, int tp_rank)
{
    return &kv->ranks[tp_rank].geom;
}

uint8_t *pdl_node_kv_layer(pdl_node_kv_t *kv, int tp_rank, int layer)
{
    if (kv->inst != NULL)
        return pdl_instance_kv_layer(kv->inst, tp_rank, layer);
    return kv->ranks[tp_rank].mem + kv->layer_bytes * (uint64_t)layer;
}

void pdl_node_kv_heads(const pdl_node_kv_t *kv, int tp_rank, int *first, int *count)
{
    *first = kv->ranks[tp_rank].first_head;
    *count = kv->ranks[tp_rank].num_heads;
}

static pdl_status_t alloc_local(pdl_node_kv_t *kv, size_t n, uint32_t *ids_out, int wait_ms, pdl_error_t *err)
{
    uint64_t deadline = pdl__clock_deadline_ms(wait_ms > 0 ? wait_ms : 0);
    pthread_mutex_lock(&kv->mu);
    while (kv->num_free < n && pdl__clock_cond_wait(&kv->freed, &kv->mu, deadline))
        ;
    if (kv->num_free < n) {
        size_t free_now = kv->num_free;
        pthread_mutex_unlock(&kv->mu);
        return pdl_error_set(err, PDL_ERR_NOMEM, "no free KV blocks: %zu needed, %zu free of %u after %d ms", n,
                             free_now, kv->num_blocks, wait_ms);
    }
    for (size_t i = 0; i < n; i++)
        ids_out[i] = kv->free_ids[--kv->num_free];
    pthread_mutex_unlock(&kv->mu);
    return PDL_OK;
}

pdl_status_t pdl_node_kv_alloc(pdl_node_kv_t *kv, size_t n, uint32_t *ids_out, int wait_ms, pdl_error_t *err)
{
    if (n > kv->num_blocks)
        return pdl_error_set(err, PDL_ERR_NOMEM, "prompt needs %zu KV blocks but the cache holds only %u", n,
                             kv->num_blocks);
    if (n == 0)
        return PDL_OK;
    if (kv->inst == NULL)
        return alloc_local(kv, n, ids_out, wait_ms, err);
    uint64_t deadline = pdl__clock_deadline_ms(wait_ms > 0 ? wait_ms : 0);
    pthread_mutex_lock(&kv->mu);
    pdl_status_t st;
    for (;;) {
        st = pdl_instance_alloc_blocks(kv->inst, n, ids_out, err);
        if (st != PDL_ERR_NOMEM || wait_ms <= 0)
            break;
        if (!pdl__clock_cond_wait(&kv->freed, &kv->mu, deadline))
            break; /* err holds the last attempt's message (needed / free counts) */
    }
    pthread_mutex_unlock(&kv->mu);
    return st;
}

void pdl_node_kv_free(pdl_node_kv_t *kv, const uint32_t *ids, size_t n)
{
    if (n == 0)
        return;
    if (kv->inst != NULL) {
        pdl_instance_free_blocks(kv->inst, ids, n);
        blocks_returned(kv);
        return;
    }
    pthread_mutex_lock(&kv->mu);
    for (size_t i = 0; i < n && kv->num_free < kv->num_blocks; i++)
        kv->free_ids[kv->num_free++] = ids[i];
    pthread_cond_broadcast(&kv->freed);
    pthread_mutex_unlock(&kv->mu);
}

size_t pdl_node_kv_free_count(pdl_node_kv_t *kv)
{
    if (kv->inst != NULL)
        return pdl_instance_free_block_count(kv->inst);
    pthread_mutex_lock(&kv->mu);
    size_t n = kv->num_free;
    pthread_mutex_unlock(&kv->mu);
    return n;
}
