/*
 * blockalloc.h -- the instance-wide paged KV-cache block allocator (internal).
 *
 * Block ids are the same on every TP rank (vLLM allocates one block table per request and every rank
 * indexes its own KV region with it), so one allocator serves the whole instance. A LIFO free stack
 * (recently freed blocks are warm) plus an "allocated" bitmap that catches double frees and foreign ids.
 * Thread-safe (one mutex).
 */
#ifndef PDL_CONNECTOR_BLOCKALLOC_H
#define PDL_CONNECTOR_BLOCKALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"

typedef struct pdl_blockalloc pdl_blockalloc_t;

pdl_status_t pdl__blockalloc_create(uint32_t num_blocks, pdl_blockalloc_t **out, pdl_error_t *err);
void pdl__blockalloc_destroy(pdl_blockalloc_t *a);
/* All-or-nothing: PDL_ERR_NOMEM naming the free and needed counts. */
pdl_status_t pdl__blockalloc_alloc(pdl_blockalloc_t *a, size_t n, uint32_t *ids_out, pdl_error_t *err);
/* Frees ids; ids out of range or not allocated are skipped and counted (return value). */
size_t pdl__blockalloc_free(pdl_blockalloc_t *a, const uint32_t *ids, size_t n);
/* PDL_OK when every id is in range and currently allocated (a hold must own its blocks). */
pdl_status_t pdl__blockalloc_check_owned(pdl_blockalloc_t *a, const uint32_t *ids, size_t n, pdl_error_t *err);
/* May a transfer name these blocks? With an allocator, as check_owned; without one (a == NULL: the
 * instance's external_blocks, the caller owns the ids) every id below num_blocks. PDL_ERR_INVALID
 * naming the first id that is not. */
pdl_status_t pdl__blockalloc_check_ids(pdl_blockalloc_t *a, uint32_t num_blocks, const uint32_t *ids, size_t n,
                                       pdl_error_t *err);
size_t pdl__blockalloc_free_count(pdl_blockalloc_t *a);
uint32_t pdl__blockalloc_total(const pdl_blockalloc_t *a);

#endif /* PDL_CONNECTOR_BLOCKALLOC_H */
