/*
 * test_version.c -- the running library's version (pdl_version_string, pdl_version_number) is the one
 * pdlink/version.h was generated with, and the macros agree with each other.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "pdlink/pdlink.h"

static void library_matches_headers(void **state)
{
    (void)state;
    assert_string_equal(pdl_version_string(), PDL_VERSION_STRING);
    assert_int_equal(pdl_version_number(), PDL_VERSION_NUMBER);
    char parts[32];
    snprintf(parts, sizeof(parts), "%d.%d.%d", PDL_VERSION_MAJOR, PDL_VERSION_MINOR, PDL_VERSION_PATCH);
    assert_string_equal(parts, PDL_VERSION_STRING);
    assert_int_equal(PDL_VERSION_NUMBER, PDL_VERSION_MAJOR * 10000 + PDL_VERSION_MINOR * 100 + PDL_VERSION_PATCH);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(library_matches_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
