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

/* The first required entry of o that is NULL, or NULL when the table is complete (backend.h lists
 * them). Each answer is a sentence's end, so that the message says what to fill. */
static const char *missing_entry(const pdl_backend_ops_t *o)
{
    if (o->remote_add == NULL)
        return "required entry remote_add is NULL";
    if (o->session_open == NULL)
        return "required entry session_open is NULL";
    if (o->session_close == NULL)
        return "required entry session_close is NULL";
    if (o->session_check == NULL)
        return "required entry session_check is NULL";
    if (o->run_chunk == NULL && o->submit == NULL)
        return "required entry run_chunk is NULL (or fill submit and drive_chunk)";
    if (o->run_chunk != NULL && o->submit != NULL)
        return "run_chunk and submit are both set (the engine never calls run_chunk beside submit)";
    if (o->submit != NULL && o->drive_chunk == NULL)
        return "required entry drive_chunk is NULL (submit hands chunks to the pool, which runs drive_chunk)";
    if ((o->caps & PDL_BACKEND_CAP_ABORT_BREAKS) && o->session_kill == NULL)
        return "required entry session_kill is NULL (caps has PDL_BACKEND_CAP_ABORT_BREAKS)";
    if ((o->caps & PDL_BACKEND_CAP_ALLOC) && o->mem_init == NULL)
        return "required entry mem_init is NULL (caps has PDL_BACKEND_CAP_ALLOC)";
    return NULL;
}

pdl_status_t pdl__backend_check(const pdl_backend_ops_t *ops, pdl_error_t *err)
{
    if (ops == NULL || ops->name == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "backend table without a name");
    if (ops->unavailable != NULL)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED, "backend %s: %s", ops->name, ops->unavailable);
    const char *why = missing_entry(ops);
    if (why != NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "backend %s: %s", ops->name, why);
    return PDL_OK;
}
