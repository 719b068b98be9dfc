/*
 * fuzz_mem_desc.c -- libFuzzer target for the memory descriptor decoder (pdl__mem_desc_unpack,
 * src/engine/desc.c), the bytes a peer hands to pdl_session_open. Round-trip property: a decoded
 * descriptor re-encodes, decodes to equal fields, and re-encodes to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"

static int rmem_equal(const pdl_rmem_t *a, const pdl_rmem_t *b)
{
    return strcmp(a->engine_key, b->engine_key) == 0 && a->id == b->id && a->size == b->size &&
           a->kind == b->kind && a->addr == b->addr && a->fd == b->fd && a->pid == b->pid && a->slot == b->slot &&
           a->rkey_len == b->rkey_len && memcmp(a->rkey, b->rkey, a->rkey_len) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static pdl_rmem_t r, d; /* 1 KiB rkey buffer each: kept off the stack */
    pdl_error_t err;
    if (pdl__mem_desc_unpack(data, size, &r, &err) != PDL_OK)
        return 0;
    pdl_bytes_t b1, b2;
    if (pdl__mem_desc_encode(&r, &b1, &err) != PDL_OK)
        abort();
    if (pdl__mem_desc_unpack(b1.data, b1.len, &d, &err) != PDL_OK || !rmem_equal(&r, &d))
        abort();
    if (pdl__mem_desc_encode(&d, &b2, &err) != PDL_OK || b1.len != b2.len || memcmp(b1.data, b2.data, b1.len) != 0)
        abort();
    pdl_bytes_free(&b1);
    pdl_bytes_free(&b2);
    return 0;
}
