/*
 * ucx_none.c -- the ucx backend of a pdlink built without UCX (PDL_WITH_UCX=OFF, or AUTO on a machine
 * without UCX's development files); CMake compiles it instead of ucx.c.
 *
 * The name "ucx" stays known (configurations and descriptors that say it parse as before), but creating
 * an engine with it fails at once with PDL_ERR_UNSUPPORTED and a message that says what to install and
 * how to rebuild; backend "rdma" resolves to tcp and says why. Every other entry is unreachable: an
 * engine whose engine_init failed is never used.
 */
#include <stdio.h>

#include "engine/backend.h"

#define PDL_UCX_ABSENT                                                                                    \
    "this libpdlink was built without UCX: use backend tcp or shm, or rebuild with UCX's development "    \
    "files (Debian: libucx-dev) and -DPDL_WITH_UCX=ON (pip: PDLINK_WITH_UCX=ON)"

static pdl_status_t none_engine_init(pdl_engine_t *e, pdl_error_t *err)
{
    return pdl_error_set(err, PDL_ERR_UNSUPPORTED, "engine %s: backend ucx: " PDL_UCX_ABSENT, e->key);
}

static void none_engine_fini(pdl_engine_t *e)
{
    (void)e;
}

static pdl_status_t none_remote_add(pdl_engine_t *e, pdl_remote_t *r, pdl_error_t *err)
{
    (void)r;
    return pdl_error_set(err, PDL_ERR_UNSUPPORTED, "engine %s: backend ucx: " PDL_UCX_ABSENT, e->key);
}

static void none_remote_free(pdl_engine_t *e, pdl_remote_t *r)
{
    (void)e;
    (void)r;
}

static pdl_status_t none_session_open(pdl_session_t *s, pdl_error_t *err)
{
    (void)s;
    return pdl_error_set(err, PDL_ERR_UNSUPPORTED, "backend ucx: " PDL_UCX_ABSENT);
}

static void none_session(pdl_session_t *s)
{
    (void)s;
}

static int none_plan(pdl_session_t *s, pdl_op_t op, uint64_t bytes, size_t n)
{
    (void)s;
    (void)op;
    (void)bytes;
    (void)n;
    return 1;
}

static pdl_status_t none_run_chunk(pdl_session_t *s, pdl_batch_t *b, int idx, pdl_error_t *err)
{
    (void)b;
    (void)idx;
    return none_session_open(s, err);
}

const pdl_backend_ops_t pdl__ucx_ops = {
    .name = "ucx",
    .engine_init = none_engine_init,
    .engine_fini = none_engine_fini,
    .remote_add = none_remote_add,
    .remote_free = none_remote_free,
    .mem_kick = pdl__backend_nop_mem_kick,
    .mem_init = pdl__backend_nop_mem_init,
    .mem_fini = pdl__backend_nop_mem_fini,
    .engine_desc_fill = pdl__backend_nop_engine_desc_fill,
    .mem_desc_fill = pdl__backend_nop_mem_desc_fill,
    .session_open = none_session_open,
    .session_close = none_session,
    .session_kill = none_session,
    .session_check = none_session_open,
    .plan = none_plan,
    .run_chunk = none_run_chunk,
};

pdl_backend_kind_t pdl_backend_pick_rdma(char *why, size_t why_cap)
{
    if (why != NULL && why_cap > 0)
        snprintf(why, why_cap, "using pdlink's tcp engine: %s", PDL_UCX_ABSENT);
    return PDL_BACKEND_TCP;
}
