/*
 * fuzz_agent_meta.c -- libFuzzer target for pdl_wire_decode_agent_meta (first handshake reply).
 * Round-trip property: decode → encode → decode gives an equal struct and the same bytes again.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdlink/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pdl_agent_meta_t m;
    pdl_error_t err;
    if (pdl_wire_decode_agent_meta(data, size, &m, &err) != PDL_OK)
        return 0;
    pdl_bytes_t b1, b2;
    if (pdl_wire_encode_agent_meta(&m, &b1, &err) != PDL_OK)
        abort();
    pdl_agent_meta_t d;
    if (pdl_wire_decode_agent_meta(b1.data, b1.len, &d, &err) != PDL_OK || !pdl_agent_meta_equal(&m, &d))
        abort();
    if (pdl_wire_encode_agent_meta(&d, &b2, &err) != PDL_OK || b1.len != b2.len ||
        memcmp(b1.data, b2.data, b1.len) != 0)
        abort();
    pdl_bytes_free(&b1);
    pdl_bytes_free(&b2);
    pdl_agent_meta_clear(&d);
    pdl_agent_meta_clear(&m);
    return 0;
}
