/*
 * test_wire_addr.c -- zmq_address parsing/formatting and request ids carrying both peers' addresses
 * (IPv6, vLLM wrappers, greedy/non-greedy capture edges, refusals naming the segment).
 */
#include "wire_testutil.h"

static void zmq_basic_and_ipv6(void **state)
{
    (void)state;
    pdl_zmq_addr_t a;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_parse_zmq_address("host:10.0.0.1,handshake:6301,notify:61005", &a, &err), PDL_OK);
    assert_string_equal(a.host, "10.0.0.1");
    assert_int_equal(a.handshake_port, 6301);
    assert_int_equal(a.notify_port, 61005);
    /* IPv6: split on the FIRST ':' */
    assert_int_equal(pdl_wire_parse_zmq_address("host:::1,handshake:1,notify:65535", &a, &err), PDL_OK);
    assert_string_equal(a.host, "::1");
    assert_int_equal(pdl_wire_parse_zmq_address("notify:2,kv:99,host:fe80::1%eth0,handshake:1", &a, &err), PDL_OK);
    assert_string_equal(a.host, "fe80::1%eth0");
    assert_int_equal(a.notify_port, 2);
    char buf[128];
    int n = pdl_wire_format_zmq_address(&a, buf, sizeof(buf));
    assert_int_equal(n, (int)strlen("host:fe80::1%eth0,handshake:1,notify:2"));
    assert_string_equal(buf, "host:fe80::1%eth0,handshake:1,notify:2");
    assert_int_equal(pdl_wire_format_zmq_address(&a, buf, 10), -1);
    pdl_zmq_addr_t bad = a;
    bad.notify_port = 0;
    assert_int_equal(pdl_wire_format_zmq_address(&bad, buf, sizeof(buf)), -1);
}

static void zmq_refusals_name_segment(void **state)
{
    (void)state;
    struct {
        const char *s;
        const char *needle;
    } cases[] = {
        {"", "empty"},
        {"host:h,handshake:1", "no notify segment"},
        {"handshake:1,notify:2", "no host segment"},
        {"host:h,notify:2", "no handshake segment"},
        {"host:h,handshake:0,notify:2", "\"handshake:0\""},
        {"host:h,handshake:65536,notify:2", "\"handshake:65536\""},
        {"host:h,handshake:-1,notify:2", "\"handshake:-1\""},
        {"host:h,handshake: 1,notify:2", "\"handshake: 1\""},
        {"host:h,handshake:1,notify:2,", "segment \"\" has no ':'"},
        {"host:h,handshake,notify:2", "segment \"handshake\" has no ':'"},
        {"host:,handshake:1,notify:2", "\"host:\""},
        {"host:a/b,handshake:1,notify:2", "\"host:a/b\""},
        {"host:a___decode_addr_b,handshake:1,notify:2", "\"host:a___decode_addr_b\""},
        {"host:h,host:g,handshake:1,notify:2", "host twice"},
        {"host:h,handshake:1,handshake:1,notify:2", "handshake twice"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        pdl_zmq_addr_t a;
        pdl_error_t err = {0};
        assert_int_equal(pdl_wire_parse_zmq_address(cases[i].s, &a, &err), PDL_ERR_PARSE);
        if (strstr(err.msg, cases[i].needle) == NULL) {
            print_error("case %zu (%s): %s\n", i, cases[i].s, err.msg);
            fail();
        }
    }
    char longhost[700] = "host:";
    memset(longhost + 5, 'a', 600);
    pdl_zmq_addr_t a;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_parse_zmq_address(longhost, &a, &err), PDL_ERR_PARSE);
}

#define PZ "host:10.0.0.1,handshake:6301,notify:61005"
#define DZ "host:10.0.0.2,handshake:7301,notify:62005"
#define HEX "0123456789abcdef0123456789abcdef"

static void rid_plain_and_wrapped(void **state)
{
    (void)state;
    const char *ids[] = {
        "___prefill_addr_" PZ "___decode_addr_" DZ "_" HEX,
        "cmpl-___prefill_addr_" PZ "___decode_addr_" DZ "_" HEX "-0-1a2b3c4d",
        "chatcmpl-___prefill_addr_" PZ "___decode_addr_" DZ "_" HEX "-0",
    };
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        pdl_zmq_addr_t p, d;
        pdl_error_t err = {0};
        assert_int_equal(pdl_wire_parse_request_id(ids[i], &p, &d, &err), PDL_OK);
        assert_string_equal(p.host, "10.0.0.1");
        assert_int_equal(p.handshake_port, 6301);
        assert_string_equal(d.host, "10.0.0.2");
        assert_int_equal(d.notify_port, 62005);
        /* either side alone */
        memset(&p, 0, sizeof(p));
        assert_int_equal(pdl_wire_parse_request_id(ids[i], &p, NULL, &err), PDL_OK);
        assert_int_equal(p.notify_port, 61005);
        assert_int_equal(pdl_wire_parse_request_id(ids[i], NULL, &d, &err), PDL_OK);
        assert_int_equal(d.handshake_port, 7301);
    }
}

static void rid_ipv6_and_greedy_edges(void **state)
{
    (void)state;
    pdl_zmq_addr_t p, d;
    pdl_error_t err = {0};
    const char *v6 = "cmpl-___prefill_addr_host:::1,handshake:6301,notify:61005___decode_addr_host:fd00::2,"
                     "handshake:7301,notify:62005_" HEX "-0";
    assert_int_equal(pdl_wire_parse_request_id(v6, &p, &d, &err), PDL_OK);
    assert_string_equal(p.host, "::1");
    assert_string_equal(d.host, "fd00::2");
    /* Two hex suffixes: the greedy decode capture ends at the LAST one, so the first one stays inside
     * the address, here as an unknown "x" segment that the zmq_address parser ignores. */
    const char *two = "___prefill_addr_" PZ "___decode_addr_" DZ ",x:_" HEX "_" HEX;
    assert_int_equal(pdl_wire_parse_request_id(two, &p, &d, &err), PDL_OK);
    assert_int_equal(d.notify_port, 62005);
    /* Uppercase hex does not count; neither does a suffix not followed by end or '-' */
    const char *upper = "___prefill_addr_" PZ "___decode_addr_" DZ "_0123456789ABCDEF0123456789ABCDEF";
    assert_int_equal(pdl_wire_parse_request_id(upper, NULL, &d, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "32 lowercase hex"));
    const char *glued = "___prefill_addr_" PZ "___decode_addr_" DZ "_" HEX "x";
    assert_int_equal(pdl_wire_parse_request_id(glued, NULL, &d, &err), PDL_ERR_PARSE);
    /* Empty captures are not matches */
    assert_int_equal(pdl_wire_parse_request_id("___prefill_addr____decode_addr__" HEX, &p, NULL, &err), PDL_ERR_PARSE);
    assert_int_equal(pdl_wire_parse_request_id("___decode_addr__" HEX, NULL, &d, &err), PDL_ERR_PARSE);
    /* A plain uuid (G1 routers) has no addresses */
    assert_int_equal(pdl_wire_parse_request_id("cmpl-" HEX "-0", &p, &d, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "___prefill_addr_"));
    /* Bad address inside names the side */
    const char *badp = "___prefill_addr_host:h,handshake:1___decode_addr_" DZ "_" HEX;
    assert_int_equal(pdl_wire_parse_request_id(badp, &p, &d, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "prefill"));
    assert_non_null(strstr(err.msg, "notify"));
    assert_int_equal(pdl_wire_parse_request_id(badp, NULL, &d, &err), PDL_OK); /* decode side is fine */
    /* control characters and over-long ids */
    assert_int_equal(pdl_wire_parse_request_id("___prefill_addr_" PZ "\n___decode_addr_" DZ "_" HEX, &p, &d, &err),
                     PDL_ERR_PARSE);
    char *huge = malloc(PDL_WIRE_RID_MAX + 10);
    memset(huge, 'a', PDL_WIRE_RID_MAX + 9);
    huge[PDL_WIRE_RID_MAX + 9] = '\0';
    assert_int_equal(pdl_wire_parse_request_id(huge, &p, &d, &err), PDL_ERR_PARSE);
    free(huge);
}

static void rid_format(void **state)
{
    (void)state;
    uint8_t uuid[16];
    for (int i = 0; i < 16; i++)
        uuid[i] = (uint8_t)(i * 17);
    char buf[512];
    int n = pdl_wire_format_request_id(PZ, DZ, uuid, buf, sizeof(buf));
    assert_true(n > 0);
    assert_string_equal(buf, "___prefill_addr_" PZ "___decode_addr_" DZ "_00112233445566778899aabbccddeeff");
    pdl_zmq_addr_t p, d;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_parse_request_id(buf, &p, &d, &err), PDL_OK);
    assert_string_equal(p.host, "10.0.0.1");
    assert_string_equal(d.host, "10.0.0.2");
    assert_int_equal(pdl_wire_format_request_id(PZ, DZ, uuid, buf, 20), -1);
    assert_int_equal(pdl_wire_format_request_id("host:h", DZ, uuid, buf, sizeof(buf)), -1);
    assert_int_equal(pdl_wire_format_request_id(PZ ",x:___decode_addr_", DZ, uuid, buf, sizeof(buf)), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(zmq_basic_and_ipv6),
        cmocka_unit_test(zmq_refusals_name_segment),
        cmocka_unit_test(rid_plain_and_wrapped),
        cmocka_unit_test(rid_ipv6_and_greedy_edges),
        cmocka_unit_test(rid_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
