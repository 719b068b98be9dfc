/*
 * blockalloc.c -- paged KV block allocator shared by all ranks of an instance (see blockalloc.h).
 */
#include "connector/blockalloc.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/log.h"

struct pdl_blockalloc {
    pthread_mutex_t mu;
    uint32_t total;
    uint32_t *stack; /* free ids; stack[0..nfree) */
    uint32_t nfree;
    uint64_t *allocated; /* bitmap */
};

pdl_status_t pdl__blockalloc_create(uint32_t num_blocks, pdl_blockalloc_t **out, pdl_error_t *err)
{
    if (num_blocks == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "block allocator: num_blocks must be > 0");
    pdl_blockalloc_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "block allocator: out of memory");
    a->stack = malloc(sizeof(uint32_t) * num_blocks);
    a->allocated = calloc((num_blocks + 63) / 64, sizeof(uint64_t));
    if (a->stack == NULL || a->allocated == NULL) {
        free(a->stack);
        free(a->allocated);
        free(a);
        return pdl_error_set(err, PDL_ERR_NOMEM, "block allocator: out of memory for %u blocks", num_blocks);
    }
    pthread_mutex_init(&a->mu, NULL);
    a->total = num_blocks;
    /* Pushed in reverse so the first allocation hands out 0, 1, 2, ... (readable test output). */
    for (uint32_t i = 0; i < num_blocks; i++)
        a->stack[i] = num_blocks - 1 - i;
    a->nfree = num_blocks;
    *out = a;
    return PDL_OK;
}

void pdl__blockalloc_destroy(pdl_blockalloc_t *a)
{
    if (a == NULL)
        return;
    pthread_mutex_destroy(&a->mu);
    free(a->stack);
    free(a->allocated);
    free(a);
}

static bool is_alloc(const pdl_blockalloc_t *a, uint32_t id) { return (a->allocated[id / 64] >> (id % 64)) & 1u; }

pdl_status_t pdl__blockalloc_alloc(pdl_blockalloc_t *a, size_t n, uint32_t *ids_out, pdl_error_t *err)
{
    pthread_mutex_lock(&a->mu);
    if (n > a->nfree) {
        uint32_t nfree = a->nfree;
        pthread_mutex_unlock(&a->mu);
        return pdl_error_set(err, PDL_ERR_NOMEM, "KV cache: %zu blocks needed, %u free of %u", n, nfree, a->total);
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t id = a->stack[--a->nfree];
        a->allocated[id / 64] |= 1ull << (id % 64);
        ids_out[i] = id;
    }
    pthread_mutex_unlock(&a->mu);
    return PDL_OK;
}

size_t pdl__blockalloc_free(pdl_blockalloc_t *a, const uint32_t *ids, size_t n)
{
    size_t bad = 0;
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (id >= a->total || !is_alloc(a, id)) {
            bad++;
            continue;
        }
        a->allocated[id / 64] &= ~(1ull << (id % 64));
        a->stack[a->nfree++] = id;
    }
    pthread_mutex_unlock(&a->mu);
    if (bad)
        pdl_warn("KV cache: %zu of %zu freed block ids were not allocated (double free or foreign id)", bad, n);
    return bad;
}

pdl_status_t pdl__blockalloc_check_owned(pdl_blockalloc_t *a, const uint32_t *ids, size_t n, pdl_error_t *err)
{
    pdl_status_t st = PDL_OK;
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < n && st == PDL_OK; i++) {
        if (ids[i] >= a->total)
            st = pdl_error_set(err, PDL_ERR_INVALID, "block id %u outside [0, %u)", ids[i], a->total);
        else if (!is_alloc(a, ids[i]))
            st = pdl_error_set(err, PDL_ERR_INVALID, "block id %u is not allocated", ids[i]);
    }
    pthread_mutex_unlock(&a->mu);
    return st;
}

pdl_status_t pdl__blockalloc_check_ids(pdl_blockalloc_t *a, uint32_t num_blocks, const uint32_t *ids, size_t n,
                                       pdl_error_t *err)
{
    if (a != NULL)
        return pdl__blockalloc_check_owned(a, ids, n, err);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= num_blocks)
            return pdl_error_set(err, PDL_ERR_INVALID, "block id %u at index %zu is not below num_blocks %u", ids[i], i,
                                 num_blocks);
    return PDL_OK;
}

size_t pdl__blockalloc_free_count(pdl_blockalloc_t *a)
{
    pthread_mutex_lock(&a->mu);
    size_t n = a->nfree;
    pthread_mutex_unlock(&a->mu);
    return n;
}

uint32_t pdl__blockalloc_total(const pdl_blockalloc_t *a) { return a->total; }
