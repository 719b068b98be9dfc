/*
 * fuzz_engine_desc.c -- libFuzzer target for the engine descriptor decoder (pdl__engine_desc_unpack,
 * src/engine/desc.c), the bytes a peer hands to pdl_engine_add_remote. Round-trip property: a decoded
 * descriptor re-encodes, decodes to equal fields, and re-encodes to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"

static int remote_equal(const pdl_remote_t *a, const pdl_remote_t *b)
{
    return strcmp(a->key, b->key) == 0 && strcmp(a->host, b->host) == 0 && strcmp(a->hostname, b->hostname) == 0 &&
           strcmp(a->boot_id, b->boot_id) == 0 && a->backend == b->backend && a->port == b->port &&
           a->pid == b->pid && a->ctl_fd == b->ctl_fd && a->ctl_addr == b->ctl_addr &&
           a->ucx_addr_len == b->ucx_addr_len && memcmp(a->ucx_addr, b->ucx_addr, a->ucx_addr_len) == 0 &&
           a->ctl_rkey_len == b->ctl_rkey_len && memcmp(a->ctl_rkey, b->ctl_rkey, a->ctl_rkey_len) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* pdl_remote_t holds four 256-byte strings and the ucx blobs: off the stack, like the engine does. */
    pdl_remote_t *r = malloc(sizeof(*r)), *d = malloc(sizeof(*d));
    if (r == NULL || d == NULL)
        abort();
    pdl_error_t err;
    if (pdl__engine_desc_unpack(data, size, r, &err) == PDL_OK) {
        pdl_bytes_t b1, b2;
        if (pdl__engine_desc_encode(r, &b1, &err) != PDL_OK)
            abort();
        if (pdl__engine_desc_unpack(b1.data, b1.len, d, &err) != PDL_OK || !remote_equal(r, d))
            abort();
        if (pdl__engine_desc_encode(d, &b2, &err) != PDL_OK || b1.len != b2.len ||
            memcmp(b1.data, b2.data, b1.len) != 0)
            abort();
        pdl_bytes_free(&b1);
        pdl_bytes_free(&b2);
    }
    free(r);
    free(d);
    return 0;
}
