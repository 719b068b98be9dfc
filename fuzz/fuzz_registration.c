/*
 * fuzz_registration.c -- libFuzzer target for pdl_wire_decode_registration (G2 and G1 discovery
 * messages). Round-trip property: a decoded registration (G1 included) encodes as G2 and decodes to an
 * equal one, and re-encodes to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdlink/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pdl_registration_t r;
    pdl_error_t err;
    if (pdl_wire_decode_registration(data, size, &r, &err) != PDL_OK)
        return 0;
    pdl_bytes_t b1, b2;
    if (pdl_wire_encode_registration(&r, &b1, &err) != PDL_OK)
        abort();
    pdl_registration_t d;
    if (pdl_wire_decode_registration(b1.data, b1.len, &d, &err) != PDL_OK || !pdl_registration_equal(&r, &d) ||
        d.is_g1)
        abort();
    if (pdl_wire_encode_registration(&d, &b2, &err) != PDL_OK || b1.len != b2.len ||
        memcmp(b1.data, b2.data, b1.len) != 0)
        abort();
    pdl_bytes_free(&b1);
    pdl_bytes_free(&b2);
    return 0;
}
