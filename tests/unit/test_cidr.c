/*
 * test_cidr.c -- address lists of trusted_hosts (src/common/cidr.c): parsing, prefixes of every length
 * that matters, IPv4 rules against IPv4-mapped IPv6 peers, and what is refused.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "common/cidr.h"

static bool match(const char *list, const char *addr)
{
    pdl_cidrs_t l;
    assert_int_equal(pdl__cidrs_parse(list, &l, NULL), PDL_OK);
    bool m = pdl__cidrs_match_text(&l, addr);
    pdl__cidrs_free(&l);
    return m;
}

static void cidr_matches(void **state)
{
    (void)state;
    assert_true(match("127.0.0.1", "127.0.0.1"));
    assert_false(match("127.0.0.1", "127.0.0.2"));
    assert_true(match("10.0.0.0/8", "10.255.1.2"));
    assert_false(match("10.0.0.0/8", "11.0.0.1"));
    assert_true(match("192.168.1.128/25", "192.168.1.200"));
    assert_false(match("192.168.1.128/25", "192.168.1.127"));
    assert_true(match("0.0.0.0/0", "8.8.8.8"));
    assert_false(match("0.0.0.0/0", "::1")); /* an IPv4 rule is not an IPv6 one */
    assert_true(match("10.0.0.0/8", "::ffff:10.1.2.3"));
    assert_true(match("fd00::/8", "fd12::1"));
    assert_false(match("fd00::/8", "fe80::1"));
    assert_true(match("::1, 127.0.0.0/8", "127.9.9.9"));
    assert_true(match("1.2.3.4 5.6.7.8", "5.6.7.8"));
    assert_false(match("", "127.0.0.1")); /* an empty list matches nothing */
    assert_false(match("127.0.0.1", "localhost")); /* text must be numeric */
    pdl_cidrs_t l;
    assert_int_equal(pdl__cidrs_parse("127.0.0.0/8", &l, NULL), PDL_OK);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.5", &a.sin_addr);
    assert_true(pdl__cidrs_match(&l, (struct sockaddr *)&a));
    assert_true(pdl__cidrs_match_host(&l, "127.0.0.1"));
    assert_false(pdl__cidrs_match_host(&l, "10.0.0.1"));
    pdl__cidrs_free(&l);
}

static void cidr_refused(void **state)
{
    (void)state;
    const char *bad[] = {"host.example", "10.0.0.0/", "10.0.0.0/x", "10.0.0.0/33", "::/129", "/8", "1.2.3.4/-1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        pdl_cidrs_t l;
        pdl_error_t e;
        assert_int_equal(pdl__cidrs_parse(bad[i], &l, &e), PDL_ERR_INVALID);
        assert_non_null(strstr(e.msg, "trusted_hosts: "));
        assert_null(l.v);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cidr_matches),
        cmocka_unit_test(cidr_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
