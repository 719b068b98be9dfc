/*
 * backends.c -- the one table of transfer backends: kind → operations, and through ops->name the
 * spelling used in configuration ("backend": "tcp") and in engine descriptors.
 *
 * It sits below both engine.c (which picks a backend's ops when an engine is created) and desc.c
 * (which writes and reads backend names on the wire), so neither of those has to call the other for
 * names, and adding a backend means adding one row here.
 */
#include <string.h>

#include "engine/backend.h"

static const pdl_backend_ops_t *const backends[] = {
    [PDL_BACKEND_SHM] = &pdl__shm_ops,
    [PDL_BACKEND_TCP] = &pdl__tcp_ops,
    [PDL_BACKEND_UCX] = &pdl__ucx_ops,
    [PDL_BACKEND_CUDA] = &pdl__cuda_ops,
};

#define NBACKENDS (sizeof(backends) / sizeof(backends[0]))

const pdl_backend_ops_t *pdl__backend_ops(pdl_backend_kind_t kind)
{
    /* Kinds come from callers' configs: anything outside the table is unknown, not an index. */
    if ((unsigned)kind >= NBACKENDS)
        return NULL;
    return backends[kind];
}

const char *pdl_backend_name(pdl_backend_kind_t kind)
{
    const pdl_backend_ops_t *ops = pdl__backend_ops(kind);
    return ops != NULL ? ops->name : "unknown";
}

int pdl_backend_parse(const char *s)
{
    if (s == NULL)
        return -1;
    for (size_t k = 0; k < NBACKENDS; k++)
        if (backends[k] != NULL && strcmp(backends[k]->name, s) == 0)
            return (int)k;
    return -1;
}

/* The entries a backend without that hook points to (backend.h): every entry of an ops table is
 * filled, so engine.c and desc.c call them without checking for NULL. */
void pdl__backend_nop_mem_kick(pdl_engine_t *e, pdl_mem_t *m)
{
    (void)e;
    (void)m;
}

pdl_status_t pdl__backend_nop_mem_init(pdl_engine_t *e, pdl_mem_t *m, pdl_error_t *err)
{
    (void)e;
    (void)m;
    (void)err;
    return PDL_OK;
}

void pdl__backend_nop_mem_fini(pdl_engine_t *e, pdl_mem_t *m)
{
    (void)e;
    (void)m;
}

void pdl__backend_nop_engine_desc_fill(const pdl_engine_t *e, pdl_remote_t *r)
{
    (void)e;
    (void)r;
}

void pdl__backend_nop_mem_desc_fill(const pdl_mem_t *m, pdl_rmem_t *rm)
{
    (void)m;
    (void)rm;
}
