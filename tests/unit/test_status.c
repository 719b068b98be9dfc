/* test_status.c -- status names/messages and the error record. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "common/log.h"
#include "pdlink/status.h"

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(pdl_status_name(PDL_ERR_PEER_GONE), "PDL_ERR_PEER_GONE");
    assert_string_equal(pdl_status_string(PDL_ERR_TIMEOUT), "timeout");
    assert_string_equal(pdl_status_name((pdl_status_t)12345), "PDL_UNKNOWN");
}

static void test_error_set_and_prefix(void **state)
{
    (void)state;
    pdl_error_t e;
    pdl_error_clear(&e);
    assert_int_equal(pdl_error_set(&e, PDL_ERR_INVALID, "decode TP %d is not a multiple of prefill TP %d", 6, 4),
                     PDL_ERR_INVALID);
    assert_int_equal(e.status, PDL_ERR_INVALID);
    assert_int_equal(pdl_error_prefix(&e, PDL_ERR_INVALID, "peer %s", "10.0.0.1:6301"), PDL_ERR_INVALID);
    assert_string_equal(e.msg, "peer 10.0.0.1:6301: decode TP 6 is not a multiple of prefill TP 4");
    /* The failure reaches a caller that passed no err (it used to come back as PDL_OK). */
    assert_int_equal(pdl_error_prefix(NULL, PDL_ERR_PEER_GONE, "peer %s", "x"), PDL_ERR_PEER_GONE);
    assert_int_equal(pdl_error_set(NULL, PDL_ERR_TIMEOUT, "x"), PDL_ERR_TIMEOUT);
}

static void test_ratelimit(void **state)
{
    (void)state;
    pdl_ratelimit_t rl;
    pdl_ratelimit_init(&rl, 60000, 3);
    uint64_t sup = 99;
    int allowed = 0;
    for (int i = 0; i < 10; i++)
        allowed += pdl_ratelimit_allow(&rl, &sup);
    assert_int_equal(allowed, 3);
    assert_int_equal(atomic_load(&rl.suppressed), 7);
    assert_int_equal(pdl_log_level_parse("WARNING"), PDL_LOG_WARN);
    assert_int_equal(pdl_log_level_parse("bogus"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_error_set_and_prefix),
        cmocka_unit_test(test_ratelimit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
