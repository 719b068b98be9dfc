/*
 * test_wire_interop.c -- a re-encoding filter over the C codecs, for tests/python/test_wire_python.py,
 * plus a cmocka self-test of that filter when run without arguments (as CTest does).
 *
 *   unit_test_wire_interop --reencode KIND IN OUT
 * KIND is msg, meta, lmap or reg. IN holds frames as [u32 little-endian length][bytes]; for each frame
 * OUT gets [i32 status][u32 length][bytes]: the pdl_status_t of decoding and, on success, the frame
 * re-encoded by pdlink. The Python test produces frames with msgpack-python and checks that pdlink's
 * bytes equal msgpack.dumps of the same dict and that hostile frames are refused.
 */
#include "wire_testutil.h"

static pdl_status_t reencode(const char *kind, const uint8_t *buf, size_t len, pdl_bytes_t *out)
{
    pdl_error_t err = {0};
    pdl_status_t st;
    out->data = NULL;
    out->len = 0;
    if (strcmp(kind, "msg") == 0) {
        pdl_msg_t m;
        st = pdl_wire_decode_msg(buf, len, &m, &err);
        if (st == PDL_OK)
            st = pdl_wire_encode_msg(&m, out, &err);
        pdl_msg_clear(&m);
    } else if (strcmp(kind, "meta") == 0) {
        pdl_agent_meta_t m;
        st = pdl_wire_decode_agent_meta(buf, len, &m, &err);
        if (st == PDL_OK)
            st = pdl_wire_encode_agent_meta(&m, out, &err);
        pdl_agent_meta_clear(&m);
    } else if (strcmp(kind, "lmap") == 0) {
        pdl_layer_map_t m;
        st = pdl_wire_decode_layer_map(buf, len, &m, &err);
        if (st == PDL_OK)
            st = pdl_wire_encode_layer_map(&m, out, &err);
        pdl_layer_map_clear(&m);
    } else if (strcmp(kind, "reg") == 0) {
        pdl_registration_t r;
        st = pdl_wire_decode_registration(buf, len, &r, &err);
        if (st == PDL_OK)
            st = pdl_wire_encode_registration(&r, out, &err);
    } else {
        st = PDL_ERR_INVALID;
    }
    return st;
}

static int filter(const char *kind, const char *in_path, const char *out_path)
{
    FILE *in = fopen(in_path, "rb"), *out = fopen(out_path, "wb");
    if (in == NULL || out == NULL) {
        perror("open");
        return 2;
    }
    uint32_t len;
    while (fread(&len, sizeof(len), 1, in) == 1) {
        if (len > PDL_WIRE_MAX_FRAME + 1u)
            return 2;
        uint8_t *buf = malloc(len ? len : 1);
        if (buf == NULL || fread(buf, 1, len, in) != len)
            return 2;
        pdl_bytes_t b;
        int32_t st = reencode(kind, buf, len, &b);
        uint32_t olen = (uint32_t)b.len;
        fwrite(&st, sizeof(st), 1, out);
        fwrite(&olen, sizeof(olen), 1, out);
        if (olen)
            fwrite(b.data, 1, olen, out);
        pdl_bytes_free(&b);
        free(buf);
    }
    fclose(in);
    return fclose(out) == 0 ? 0 : 2;
}

static void filter_reencodes_golden_release(void **state)
{
    (void)state;
    uint8_t buf[128];
    size_t n = unhex("83a474797065a772656c65617365ab7472616e736665725f6964a474782d31b0636f6e73756d65725f74705f73697a6508",
                     buf, sizeof(buf));
    pdl_bytes_t b;
    assert_int_equal(reencode("msg", buf, n, &b), PDL_OK);
    assert_int_equal(b.len, n);
    assert_memory_equal(b.data, buf, n);
    pdl_bytes_free(&b);
    assert_int_equal(reencode("msg", (const uint8_t *)"\xff", 1, &b), PDL_ERR_PARSE);
    assert_int_equal(reencode("nope", buf, n, &b), PDL_ERR_INVALID);
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--reencode") == 0)
        return filter(argv[2], argv[3], argv[4]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(filter_reencodes_golden_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
