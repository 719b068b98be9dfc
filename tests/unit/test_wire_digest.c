/*
 * test_wire_digest.c -- the KV digest request and reply (src/wire/digest.c): round trips, the counts a
 * reply's digest bytes must match, and what a producer or consumer refuses from the network.
 */
#include "wire_testutil.h"

static pdl_digest_reply_t ok_reply(uint8_t *d, size_t len)
{
    pdl_digest_reply_t r;
    memset(&r, 0, sizeof(r));
    snprintf(r.transfer_id, sizeof(r.transfer_id), "tx-digest");
    r.status = PDL_DIGEST_OK;
    r.stride = 16;
    r.num_layers = 2;
    r.num_heads = 2;
    r.num_blocks = 1;
    for (size_t i = 0; i < len; i++)
        d[i] = (uint8_t)(i * 7);
    r.digests.data = d;
    r.digests.len = len;
    return r;
}

static void request_round_trip_and_refusals(void **state)
{
    (void)state;
    pdl_bytes_t b = {0};
    pdl_error_t err;
    assert_int_equal(pdl_wire_encode_digest_request("tx-digest", &b, &err), PDL_OK);
    assert_true(pdl_wire_is_digest_request(b.data, b.len));
    char tid[PDL_WIRE_ID_MAX + 1];
    assert_int_equal(pdl_wire_decode_digest_request(b.data, b.len, tid, sizeof(tid), &err), PDL_OK);
    assert_string_equal(tid, "tx-digest");
    assert_int_not_equal(pdl_wire_decode_digest_request(b.data, b.len - 1, tid, sizeof(tid), &err), PDL_OK);
    pdl_bytes_free(&b);
    assert_int_equal(pdl_wire_encode_digest_request("", &b, &err), PDL_ERR_INVALID);
    assert_false(pdl_wire_is_digest_request("get_meta_msg", 12));
    assert_int_equal(pdl_wire_decode_digest_request("\x80", 1, tid, sizeof(tid), &err), PDL_ERR_PARSE);
}

static void reply_round_trip(void **state)
{
    (void)state;
    uint8_t d[32];
    pdl_digest_reply_t r = ok_reply(d, sizeof(d)), q;
    pdl_bytes_t b = {0};
    pdl_error_t err;
    assert_int_equal(pdl_wire_encode_digest_reply(&r, &b, &err), PDL_OK);
    memset(&q, 0, sizeof(q));
    assert_int_equal(pdl_wire_decode_digest_reply(b.data, b.len, &q, &err), PDL_OK);
    assert_string_equal(q.transfer_id, "tx-digest");
    assert_int_equal(q.status, PDL_DIGEST_OK);
    assert_int_equal(q.stride, 16);
    assert_int_equal(q.num_layers, 2);
    assert_int_equal(q.num_heads, 2);
    assert_int_equal(q.num_blocks, 1);
    assert_int_equal(q.digests.len, 32);
    assert_memory_equal(q.digests.data, d, 32);
    pdl_digest_reply_clear(&q);
    /* Every truncation of a valid reply is refused, never read past. */
    for (size_t n = 0; n < b.len; n++) {
        memset(&q, 0, sizeof(q));
        assert_int_not_equal(pdl_wire_decode_digest_reply(b.data, n, &q, &err), PDL_OK);
        pdl_digest_reply_clear(&q);
    }
    pdl_bytes_free(&b);
}

static void reply_counts_must_match_the_bytes(void **state)
{
    (void)state;
    uint8_t d[32];
    pdl_digest_reply_t r = ok_reply(d, 24); /* 2 layers x 1 block x 2 heads need 32 bytes */
    pdl_bytes_t b = {0};
    pdl_error_t err;
    assert_int_equal(pdl_wire_encode_digest_reply(&r, &b, &err), PDL_ERR_INVALID);
    r = ok_reply(d, 32);
    r.status = PDL_DIGEST_UNKNOWN; /* an answer without digests carries no bytes */
    assert_int_equal(pdl_wire_encode_digest_reply(&r, &b, &err), PDL_ERR_INVALID);
    r.digests.len = 0;
    r.num_layers = r.num_heads = 0;
    r.num_blocks = 0;
    assert_int_equal(pdl_wire_encode_digest_reply(&r, &b, &err), PDL_OK);
    pdl_digest_reply_t q;
    memset(&q, 0, sizeof(q));
    assert_int_equal(pdl_wire_decode_digest_reply(b.data, b.len, &q, &err), PDL_OK);
    assert_int_equal(q.status, PDL_DIGEST_UNKNOWN);
    assert_string_equal(pdl_digest_status_name(q.status), "unknown");
    pdl_digest_reply_clear(&q);
    pdl_bytes_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(request_round_trip_and_refusals),
        cmocka_unit_test(reply_round_trip),
        cmocka_unit_test(reply_counts_must_match_the_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
