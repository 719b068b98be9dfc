/*
 * ucx_none.c -- the ucx backend of a pdlink built without UCX (PDL_WITH_UCX=OFF, or AUTO on a machine
 * without UCX's development files); CMake compiles it instead of ucx.c.
 *
 * The name "ucx" stays known (configurations and descriptors that say it parse as before), but creating
 * an engine with it fails at once with PDL_ERR_UNSUPPORTED and a message that says what to install and
 * how to rebuild (the table's `unavailable`, which pdl__backend_check reports); backend "rdma" resolves
 * to tcp and says why. The table has no operations: no engine is ever made of it.
 */
#include <stdio.h>

#include "engine/backend.h"

#define PDL_UCX_ABSENT                                                                                    \
    "this libpdlink was built without UCX: use backend tcp or shm, or rebuild with UCX's development "    \
    "files (Debian: libucx-dev) and -DPDL_WITH_UCX=ON (pip: PDLINK_WITH_UCX=ON)"

const pdl_backend_ops_t pdl__ucx_ops = {
    .name = "ucx",
    .unavailable = PDL_UCX_ABSENT,
};

pdl_backend_kind_t pdl_backend_pick_rdma(char *why, size_t why_cap)
{
    if (why != NULL && why_cap > 0)
        snprintf(why, why_cap, "using pdlink's tcp engine: %s", PDL_UCX_ABSENT);
    return PDL_BACKEND_TCP;
}
