/*
 * test_wire_registration.c -- the discovery registration: G2 golden bytes and round trip, G1 decoding,
 * HELLO, and refusal of everything malformed.
 */
#include "wire_testutil.h"

/* {"type":"P","http_address":"10.0.0.1:8100","zmq_address":"host:10.0.0.1,handshake:6301,notify:61005",
 *  "dp_size":1,"tp_size":4,"transfer_mode":"READ"} (the current registration format, docs/protocol.md#discovery-pings) */
#define GOLD_REG                                                                                       \
    "86a474797065a150ac687474705f61646472657373ad31302e302e302e313a38313030ab7a6d715f61646472657373d929" \
    "686f73743a31302e302e302e312c68616e647368616b653a363330312c6e6f746966793a3631303035a764705f73697a65" \
    "01a774705f73697a6504ad7472616e736665725f6d6f6465a452454144"

static pdl_status_t try_reg(const void *buf, size_t len, pdl_error_t *err)
{
    pdl_registration_t r;
    return pdl_wire_decode_registration(buf, len, &r, err);
}

static void g2_golden_round_trip(void **state)
{
    (void)state;
    pdl_registration_t r = {.type = 'P', .dp_size = 1, .tp_size = 4, .write_mode = false};
    strcpy(r.http_address, "10.0.0.1:8100");
    strcpy(r.zmq_address, "host:10.0.0.1,handshake:6301,notify:61005");
    pdl_bytes_t b;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_encode_registration(&r, &b, &err), PDL_OK);
    assert_bytes_hex(&b, GOLD_REG);
    pdl_registration_t d;
    assert_int_equal(pdl_wire_decode_registration(b.data, b.len, &d, &err), PDL_OK);
    assert_true(pdl_registration_equal(&r, &d));
    assert_false(d.is_g1);
    check_prefixes_and_trailing(b.data, b.len, try_reg);
    pdl_bytes_free(&b);

    r.type = 'D';
    r.write_mode = true;
    strcpy(r.http_address, "[::1]:8200");
    strcpy(r.zmq_address, "host:::1,handshake:7301,notify:62005");
    assert_int_equal(pdl_wire_encode_registration(&r, &b, &err), PDL_OK);
    assert_int_equal(pdl_wire_decode_registration(b.data, b.len, &d, &err), PDL_OK);
    assert_true(pdl_registration_equal(&r, &d));
    assert_true(d.write_mode);
    pdl_bytes_free(&b);
}

static void g2_wrong_types_missing_values(void **state)
{
    (void)state;
    tfield_t f[] = {{.key = "type", .kind = V_STR, .s = "D"},
                    {.key = "http_address", .kind = V_STR, .s = "10.0.0.2:8200"},
                    {.key = "zmq_address", .kind = V_STR, .s = "host:10.0.0.2,handshake:7301,notify:62005"},
                    {.key = "dp_size", .kind = V_INT, .i = 2},
                    {.key = "tp_size", .kind = V_INT, .i = 8},
                    {.key = "transfer_mode", .kind = V_STR, .s = "WRITE"},
                    {.key = "extra", .kind = V_MAP}};
    size_t n = sizeof(f) / sizeof(f[0]);
    const char *skip[] = {"extra", NULL};
    assert_true(check_wrong_types(f, n, try_reg, skip) > 40);
    const char *req[] = {"type", "http_address", "zmq_address", "dp_size", "tp_size", "transfer_mode", NULL};
    check_missing(f, n, req, try_reg);

    struct {
        int field;
        const char *value;
        int64_t i;
        const char *needle;
    } bad[] = {
        {0, "X", 0, "unknown type"},
        {1, "10.0.0.2", 0, "http_address"},
        {1, "10.0.0.2:0", 0, "http_address"},
        {1, "10.0.0.2:99999", 0, "http_address"},
        {1, "a b:80", 0, "http_address"},
        {2, "host:10.0.0.2,handshake:7301", 0, "no notify segment"},
        {2, "host:10.0.0.2,handshake:x,notify:1", 0, "handshake:x"},
        {3, NULL, 0, "dp_size must be >= 1, got 0"},
        {4, NULL, 65537, "tp_size must be <= 65536"},
        {5, "read", 0, "transfer_mode"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tfield_t g[7];
        memcpy(g, f, sizeof(g));
        if (bad[i].value)
            g[bad[i].field].s = bad[i].value;
        else
            g[bad[i].field].i = bad[i].i;
        msgpack_sbuffer sb;
        pack_fields(g, n, -1, V_NIL, &sb);
        pdl_error_t err = {0};
        assert_int_equal(try_reg(sb.data, sb.size, &err), PDL_ERR_PARSE);
        if (strstr(err.msg, bad[i].needle) == NULL) {
            print_error("case %zu: %s\n", i, err.msg);
            fail();
        }
        msgpack_sbuffer_destroy(&sb);
    }
}

static void g1_and_hello(void **state)
{
    (void)state;
    tfield_t f[] = {{.key = "type", .kind = V_STR, .s = "register"},
                    {.key = "role", .kind = V_STR, .s = "P"},
                    {.key = "index", .kind = V_STR, .s = "0"},
                    {.key = "request_address", .kind = V_STR, .s = "http://10.0.0.1:8100/v1/completions"},
                    {.key = "handshake_port", .kind = V_INT, .i = 6301},
                    {.key = "notify_port", .kind = V_INT, .i = 61005},
                    {.key = "dp_size", .kind = V_INT, .i = 1},
                    {.key = "tp_size", .kind = V_INT, .i = 4},
                    {.key = "transfer_mode", .kind = V_STR, .s = "READ"}};
    size_t n = sizeof(f) / sizeof(f[0]);
    msgpack_sbuffer sb;
    pack_fields(f, n, -1, V_NIL, &sb);
    pdl_registration_t r;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_decode_registration(sb.data, sb.size, &r, &err), PDL_OK);
    assert_true(r.is_g1);
    assert_int_equal(r.type, 'P');
    assert_string_equal(r.http_address, "10.0.0.1:8100");
    assert_string_equal(r.zmq_address, "host:10.0.0.1,handshake:6301,notify:61005");
    assert_int_equal(r.tp_size, 4);
    msgpack_sbuffer_destroy(&sb);
    /* re-encoded as G2, it decodes to the same registration */
    pdl_bytes_t b;
    assert_int_equal(pdl_wire_encode_registration(&r, &b, &err), PDL_OK);
    pdl_registration_t d;
    assert_int_equal(pdl_wire_decode_registration(b.data, b.len, &d, &err), PDL_OK);
    assert_true(pdl_registration_equal(&r, &d));
    pdl_bytes_free(&b);
    /* IPv6 request address */
    f[3].s = "http://[fd00::1]:8100/v1/completions";
    pack_fields(f, n, -1, V_NIL, &sb);
    assert_int_equal(pdl_wire_decode_registration(sb.data, sb.size, &r, &err), PDL_OK);
    assert_string_equal(r.zmq_address, "host:fd00::1,handshake:6301,notify:61005");
    msgpack_sbuffer_destroy(&sb);
    const char *skip[] = {"type", "index", NULL};
    f[3].s = "http://10.0.0.1:8100/v1/completions";
    assert_true(check_wrong_types(f, n, try_reg, skip) > 40);
    const char *req[] = {"role", "request_address", "handshake_port", "notify_port", "transfer_mode", NULL};
    check_missing(f, n, req, try_reg);

    tfield_t hello[] = {{.key = "type", .kind = V_STR, .s = "HELLO"}};
    pack_fields(hello, 1, -1, V_NIL, &sb);
    assert_int_equal(pdl_wire_decode_registration(sb.data, sb.size, &r, &err), PDL_ERR_UNSUPPORTED);
    msgpack_sbuffer_destroy(&sb);
}

static void encoder_validates(void **state)
{
    (void)state;
    pdl_registration_t r = {.type = 'X', .dp_size = 1, .tp_size = 1};
    strcpy(r.http_address, "h:1");
    strcpy(r.zmq_address, "host:h,handshake:1,notify:2");
    pdl_bytes_t b;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_encode_registration(&r, &b, &err), PDL_ERR_INVALID);
    r.type = 'P';
    r.tp_size = 0;
    assert_int_equal(pdl_wire_encode_registration(&r, &b, &err), PDL_ERR_INVALID);
    r.tp_size = 1;
    strcpy(r.zmq_address, "host:h,notify:2");
    assert_int_equal(pdl_wire_encode_registration(&r, &b, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "handshake"));
    strcpy(r.zmq_address, "host:h,handshake:1,notify:2");
    strcpy(r.http_address, "nohostport");
    assert_int_equal(pdl_wire_encode_registration(&r, &b, &err), PDL_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(g2_golden_round_trip),
        cmocka_unit_test(g2_wrong_types_missing_values),
        cmocka_unit_test(g1_and_hello),
        cmocka_unit_test(encoder_validates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
