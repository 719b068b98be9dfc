/*
 * fuzz_digest.c -- libFuzzer target for the KV digest codecs a handshake port and a consumer decode from
 * the network: pdl_wire_decode_digest_request (a producer's service thread, any peer) and
 * pdl_wire_decode_digest_reply (a consumer rank, its producer's answer). Properties: a decoded reply's
 * digest bytes match its counts, and a decoded request or reply re-encodes and decodes to the same
 * fields.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdlink/wire.h"

static void request(const uint8_t *data, size_t size)
{
    char tid[PDL_WIRE_ID_MAX + 1], again[PDL_WIRE_ID_MAX + 1];
    pdl_error_t err;
    (void)pdl_wire_is_digest_request(data, size);
    if (pdl_wire_decode_digest_request(data, size, tid, sizeof(tid), &err) != PDL_OK)
        return;
    pdl_bytes_t b = {0};
    if (pdl_wire_encode_digest_request(tid, &b, &err) != PDL_OK)
        abort();
    if (pdl_wire_decode_digest_request(b.data, b.len, again, sizeof(again), &err) != PDL_OK || strcmp(tid, again) != 0)
        abort();
    pdl_bytes_free(&b);
}

static void reply(const uint8_t *data, size_t size)
{
    pdl_digest_reply_t r, q;
    memset(&r, 0, sizeof(r));
    memset(&q, 0, sizeof(q));
    pdl_error_t err;
    if (pdl_wire_decode_digest_reply(data, size, &r, &err) != PDL_OK)
        return;
    if (r.status == PDL_DIGEST_OK &&
        r.digests.len != (uint64_t)r.num_layers * r.num_blocks * r.num_heads * 8)
        abort();
    pdl_bytes_t b = {0};
    if (pdl_wire_encode_digest_reply(&r, &b, &err) != PDL_OK)
        abort();
    if (pdl_wire_decode_digest_reply(b.data, b.len, &q, &err) != PDL_OK || q.status != r.status ||
        q.stride != r.stride || q.num_layers != r.num_layers || q.num_heads != r.num_heads ||
        q.num_blocks != r.num_blocks || strcmp(q.transfer_id, r.transfer_id) != 0 ||
        q.digests.len != r.digests.len || (r.digests.len && memcmp(q.digests.data, r.digests.data, r.digests.len)))
        abort();
    pdl_bytes_free(&b);
    pdl_digest_reply_clear(&q);
    pdl_digest_reply_clear(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    request(data, size);
    reply(data, size);
    return 0;
}
