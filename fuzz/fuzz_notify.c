/*
 * fuzz_notify.c -- libFuzzer target for pdl_wire_decode_msg (notify frames). Any input must decode or
 * fail cleanly; a successful decode must re-encode, decode to an equal message, and re-encode to the
 * same bytes (the encoder's output is canonical).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdlink/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pdl_msg_t m;
    pdl_error_t err;
    if (pdl_wire_decode_msg(data, size, &m, &err) != PDL_OK)
        return 0;
    pdl_bytes_t b1, b2;
    if (pdl_wire_encode_msg(&m, &b1, &err) != PDL_OK)
        abort(); /* everything the decoder accepts must be encodable */
    pdl_msg_t d;
    if (pdl_wire_decode_msg(b1.data, b1.len, &d, &err) != PDL_OK || !pdl_msg_equal(&m, &d))
        abort();
    if (pdl_wire_encode_msg(&d, &b2, &err) != PDL_OK || b1.len != b2.len || memcmp(b1.data, b2.data, b1.len) != 0)
        abort();
    pdl_bytes_free(&b1);
    pdl_bytes_free(&b2);
    pdl_msg_clear(&d);
    pdl_msg_clear(&m);
    return 0;
}
