/*
 * types.c -- the descriptor vector and owned byte buffers of types.h.
 */
#include "pdlink/types.h"

#include <stdlib.h>

int pdl_descv_push(pdl_descv_t *dv, uint64_t local_off, uint64_t remote_off, uint64_t len)
{
    if (dv->n == dv->cap) {
        size_t cap = dv->cap ? dv->cap * 2 : 64;
        pdl_desc_t *v = realloc(dv->v, cap * sizeof(*v));
        if (v == NULL)
            return -1;
        dv->v = v;
        dv->cap = cap;
    }
    dv->v[dv->n++] = (pdl_desc_t){local_off, remote_off, len};
    return 0;
}

void pdl_descv_reset(pdl_descv_t *dv) { dv->n = 0; }

void pdl_descv_free(pdl_descv_t *dv)
{
    free(dv->v);
    dv->v = NULL;
    dv->n = dv->cap = 0;
}

void pdl_bytes_free(pdl_bytes_t *b)
{
    if (b == NULL)
        return;
    free(b->data);
    b->data = NULL;
    b->len = 0;
}
