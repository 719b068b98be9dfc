/*
 * test_run_http.c -- how `pdlink run` describes a failed request: the HTTP status, the body's error
 * message (also inside the router's "Prefill server error 500: {...}" text) and, when the router named
 * it, the failed leg and its worker. A body that is not JSON is shown as a flattened excerpt.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cli/run_http.h"

static void describe(char *out, size_t cap, long status, const char *leg, const char *body)
{
    pdl_run_failure_describe(out, cap, status, leg, body, strlen(body));
}

static void test_prefill_leg_named_with_its_message(void **state)
{
    (void)state;
    char out[400];
    describe(out, sizeof(out), 500, "prefill 127.0.0.1:18100",
             "Request processing failed: Prefill server error 500: {\"error\":{\"message\":\"cannot hold "
             "transfer tx-1: no free blocks\",\"type\":\"server_error\"}}");
    assert_string_equal(out, "HTTP 500 from the prefill leg (127.0.0.1:18100): Request processing failed: Prefill "
                             "server error 500: cannot hold transfer tx-1: no free blocks");
}

static void test_decode_leg_passed_through(void **state)
{
    (void)state;
    char out[400];
    describe(out, sizeof(out), 500, "decode 127.0.0.1:18200",
             "{\"error\":{\"message\":\"KV pull of tx-2 failed: rank 3 handshake timed out\"}}");
    assert_string_equal(out, "HTTP 500 from the decode leg (127.0.0.1:18200): KV pull of tx-2 failed: rank 3 "
                             "handshake timed out");
}

static void test_no_leg_and_plain_text(void **state)
{
    (void)state;
    char out[400];
    describe(out, sizeof(out), 503, NULL, "No workers available via service discovery: 0 prefill,\n1 decode");
    assert_string_equal(out, "HTTP 503: body: No workers available via service discovery: 0 prefill, 1 decode");
    describe(out, sizeof(out), 400, "", "{\"message\":\"field 'prompt' is required\"}");
    assert_string_equal(out, "HTTP 400: field 'prompt' is required");
    describe(out, sizeof(out), 502, NULL, "");
    assert_string_equal(out, "HTTP 502: body: ");
}

static void test_long_body_is_cut(void **state)
{
    (void)state;
    char body[2000], out[400];
    memset(body, 'x', sizeof(body) - 1);
    body[sizeof(body) - 1] = '\0';
    describe(out, sizeof(out), 500, "decode 127.0.0.1:1", body);
    assert_true(strlen(out) < sizeof(out));
    assert_non_null(strstr(out, "HTTP 500 from the decode leg (127.0.0.1:1): body: xxx"));
    assert_non_null(strstr(out, "..."));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_leg_named_with_its_message),
        cmocka_unit_test(test_decode_leg_passed_through),
        cmocka_unit_test(test_no_leg_and_plain_text),
        cmocka_unit_test(test_long_body_is_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
